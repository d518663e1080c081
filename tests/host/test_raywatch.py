"""The control plane notices a lost Ray head, starts afresh in place and waits for Ray to come back."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from guards import HANG_GUARD_S

from tpufleet.control.ray import headwatch as raywatch
from tpufleet.errors import ClusterError


def _listener() -> tuple[socket.socket, str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock, f"127.0.0.1:{sock.getsockname()[1]}"


def test_a_head_that_stops_answering_is_reported_once_after_the_misses() -> None:
    sock, address = _listener()
    probes = threading.Semaphore(0)
    lost: list[str] = []
    done = threading.Event()

    def probe(addr: str) -> bool:
        up = raywatch.answers(addr, timeout_s=0.5)
        probes.release()
        return up

    def on_lost(addr: str) -> None:
        lost.append(addr)
        done.set()

    watch = raywatch.HeadWatch(address, every_s=0.02, misses=3, probe=probe, on_lost=on_lost).start()
    try:
        for _ in range(10):  # ten checks while the GCS answers: nothing is reported
            assert probes.acquire(timeout=10)
        assert lost == []
        sock.close()
        assert done.wait(timeout=20)
        assert lost == [address]
    finally:
        watch.stop()
        sock.close()


def test_an_address_ray_resolves_itself_is_not_watched() -> None:
    called: list[str] = []
    watch = raywatch.HeadWatch("auto", every_s=0.01, probe=lambda a: called.append(a) or False).start()
    assert watch._thread is None
    assert called == []


def test_after_a_lost_head_the_start_waits_for_the_gcs_however_long() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{sock.getsockname()[1]}"  # bound, not listening: connections are refused
    with pytest.raises(ClusterError, match="no Ray cluster at"):
        raywatch.wait_for_gcs(address, raywatch.await_seconds(0.3, {}))
    restarted = {raywatch.AWAIT_ENV: address}  # the environment of a fresh start after a lost head
    assert raywatch.await_seconds(0.3, restarted) == float("inf")
    threading.Timer(1.0, sock.listen).start()  # Ray comes back a second later
    try:
        raywatch.wait_for_gcs(address, raywatch.await_seconds(0.3, restarted))
        assert raywatch.answers(address)
    finally:
        sock.close()


def test_the_fresh_start_is_the_same_process_and_command_waiting_for_ray(tmp_path: Path) -> None:
    """``restart_process`` re-executes the interpreter with the same arguments in the same PID."""
    script = tmp_path / "serve.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, os, sys
            from tpufleet.control.ray import headwatch as raywatch
            out = sys.argv[1]
            with open(out, "a") as f:
                f.write(json.dumps({"pid": os.getpid(), "argv": sys.argv[1:],
                                    "await": os.environ.get(raywatch.AWAIT_ENV)}) + "\\n")
            if not os.environ.get(raywatch.AWAIT_ENV):
                raywatch.restart_process("10.0.0.1:6379")
            """
        )
    )
    out = tmp_path / "starts.jsonl"
    proc = subprocess.run(
        [sys.executable, "-u", str(script), str(out), "--flag", "x y"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True,
        timeout=HANG_GUARD_S,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    first, second = (json.loads(line) for line in out.read_text().splitlines())
    assert first["pid"] == second["pid"]
    assert first["argv"] == second["argv"] == [str(out), "--flag", "x y"]
    assert (first["await"], second["await"]) == (None, "10.0.0.1:6379")


class _ComingBack:
    """An emulated fleet whose head runs again after a few looks (what ``running_fleet_address`` reads)."""

    ray_address = "127.0.0.1:6379"

    def __init__(self, looks: list[bool]) -> None:
        self.looks = iter(looks)

    def head_alive(self) -> bool:
        return next(self.looks)

    def authenticate(self) -> _ComingBack:
        return self


def test_after_a_lost_head_serve_waits_for_the_emulated_fleet_to_run_again(tmp_path: Path) -> None:
    """``serve --emulator-dir`` looks the address up in the fleet's state: a fresh start after a lost
    head waits for the fleet's head instead of refusing a fleet whose head is still coming back."""
    from tpufleet.cli import emulate
    from tpufleet.errors import NotFoundError

    fleet = _ComingBack([False, False, False, True, True])
    assert emulate.running_fleet_address(tmp_path, wait=True, fleet=fleet) == (tmp_path, "127.0.0.1:6379")
    with pytest.raises(NotFoundError, match="no emulated fleet runs from"):
        emulate.running_fleet_address(tmp_path)  # nothing runs from this directory


def test_a_fresh_start_that_cannot_be_made_ends_the_process_saying_why(tmp_path: Path) -> None:
    """Better gone (a supervisor starts it again) than serving on without a cluster."""
    script = tmp_path / "serve.py"
    script.write_text(
        "import sys\n"
        "from tpufleet.control.ray import headwatch as raywatch\n"
        "sys.executable = '/nonexistent/python'\n"
        "raywatch.restart_process('10.0.0.1:6379')\n"
        "print('still serving')\n"
    )
    proc = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert proc.returncode == 1
    assert "still serving" not in proc.stdout
    assert "could not start afresh after losing Ray's head" in proc.stderr and "Traceback" not in proc.stderr
