"""A real Prometheus server for tests: its own config and data in a temp dir, 127.0.0.1 only, a
bearer token from a file (``authorization: credentials_file``), ``honor_labels: true`` (as the docs
say), a 1 s scrape interval; stopped by
PID. Debian's ``prometheus`` package (``scripts/ensure-test-services.sh``); without it the tests
skip with the reason, except under ``make test`` (``TPUFLEET_REQUIRE_PROMETHEUS=1``)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tpufleet.emulator import procs

HINT = "run scripts/ensure-test-services.sh as root (apt-get install prometheus)"


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        if os.environ.get("TPUFLEET_REQUIRE_PROMETHEUS"):
            pytest.fail(f"prometheus required (TPUFLEET_REQUIRE_PROMETHEUS is set, as in make test); {HINT}")
        pytest.skip(f"prometheus not installed; {HINT}")
    return path


def free_port() -> int:
    return procs.free_port()  # below the ephemeral range: nobody takes it meanwhile


@dataclass
class Prometheus:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def query(self, expr: str) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=5)
        r.raise_for_status()
        body = r.json()
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def wait_for(self, expr: str, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """Poll an instant query until it returns something; fail with Prometheus' log and targets."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                result = self.query(expr)
            except httpx.TransportError:
                result = []
            if result:
                return result
            time.sleep(0.5)
        targets = httpx.get(f"{self.url}/api/v1/targets", timeout=5).json()
        raise AssertionError(f"no result for {expr!r} in {timeout_s:.0f}s; targets: {targets}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_prometheus(work: Path, jobs: dict[str, tuple[str, Path]]) -> Prometheus:
    """Scrape each ``name: (host:port, token file)`` every second."""
    binary = prometheus_binary()
    work.mkdir(parents=True, exist_ok=True)
    config = {
        "global": {"scrape_interval": "2s", "scrape_timeout": "2s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": name,
                "metrics_path": "/metrics",
                # tpufleet's job gauges carry the tpufleet job id as ``job``: keep it (else Prometheus
                # renames it exported_job); ``up`` keeps the scrape job's name. docs/observability.md.
                "honor_labels": True,
                "authorization": {"type": "Bearer", "credentials_file": str(token)},
                "static_configs": [{"targets": [target]}],
            }
            for name, (target, token) in jobs.items()
        ],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = work / "prometheus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    prom = Prometheus(proc, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{prom.url}/-/ready", timeout=1).status_code == 200:
                return prom
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            prom.stop()
            raise AssertionError(f"prometheus did not start: {log.read_text()[-3000:]}")
        time.sleep(0.2)
