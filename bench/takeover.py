"""Takeover time of replicas (docs/replicas.md): two ``tpufleet serve --sandbox`` replicas on one
PostgreSQL database; the leader is killed (SIGKILL) ``--kills`` times, and each time the seconds
until the standby's ``/healthz`` says it leads are measured; the killed replica is started again
as the next standby. Prints p50 and max against the documented bound (lease + a fifth of it).

    .venv/bin/python bench/takeover.py                 # 20 kills, the default 5 s lease
    .venv/bin/python bench/takeover.py --kills 5 --lease-seconds 2
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _pg import postgres_server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Replica:
    def __init__(self, tmp: Path, name: str, db: str, lease_s: float) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = os.environ | {"TPUFLEET_CONFIG": str(tmp / "config.yaml"), "NO_GCE_CHECK": "true"}
        cmd = [
            sys.executable, "-m", "tpufleet", "serve", "--sandbox", "v4-16", "--db", db,
            "--state-dir", str(tmp / name), "--port", str(port), "--lease-seconds", f"{lease_s:g}",
        ]  # fmt: skip
        self.log = (tmp / f"{name}.log").open("a")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while self.health() is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"replica {name} did not start: see {tmp / name}.log")
            time.sleep(0.1)

    def health(self) -> dict[str, object] | None:
        try:
            got: dict[str, object] = httpx.get(f"{self.url}/healthz", timeout=2).json()
            return got
        except httpx.HTTPError:
            return None

    def leads(self) -> bool:
        got = self.health()
        return bool(got and got.get("leader"))

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.log.close()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()


def measure(db: str, kills: int, lease_s: float, tmp: Path) -> list[float]:
    replicas = [Replica(tmp, "r0", db, lease_s), Replica(tmp, "r1", db, lease_s)]
    took: list[float] = []
    try:
        for n in range(kills):
            while not any(r.leads() for r in replicas):
                time.sleep(0.05)
            leader = next(r for r in replicas if r.leads())
            standby = next(r for r in replicas if r is not leader)
            leader.kill()
            killed = time.monotonic()
            while not standby.leads():
                time.sleep(0.02)
            took.append(time.monotonic() - killed)
            print(f"kill {n + 1}: the standby led after {took[-1]:.2f} s", flush=True)
            replicas = [standby, Replica(tmp, f"r{n + 2}", db, lease_s)]
    finally:
        for r in replicas:
            r.stop()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--lease-seconds", type=float, default=5.0)
    args = parser.parse_args()
    with postgres_server() as server, tempfile.TemporaryDirectory(prefix="tpufleet-takeover-") as tmp:
        if server is None:
            return
        took = measure(server.new_database(migrated=True), args.kills, args.lease_seconds, Path(tmp))
    bound = args.lease_seconds * 1.2
    print(
        f"takeover after SIGKILL of the leader, {len(took)} kills, lease {args.lease_seconds:g} s: "
        f"p50 {statistics.median(took):.2f} s, max {max(took):.2f} s (bound {bound:.2f} s)"
    )


if __name__ == "__main__":
    main()
