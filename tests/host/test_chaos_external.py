"""`tpufleet chaos` on a fleet and a control plane someone else started: finding, killing and starting
again a server it did not start, and the one-line refusals of what it cannot soak (no fleet needed)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tpufleet.chaos import ExternalServer
from tpufleet.emulator import procs
from tpufleet.errors import TpufleetError

SERVER = textwrap.dedent(
    """
    import os, socket, subprocess, sys, time
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", int(sys.argv[1])))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.environ["STARTS"], "a") as f:
        f.write(f"{os.getpid()} {child.pid} {os.getcwd()} {os.environ['MARK']}\\n")
    sock.listen()  # last: once the test can connect, the line above is in the file
    time.sleep(600)
    """
)


def _port() -> int:
    return procs.free_port()  # below the ephemeral range: nobody takes it meanwhile


def _listening(port: int, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].startswith("Z")  # a zombie its parent has not reaped
    except FileNotFoundError:
        return True


def test_a_server_it_did_not_start_is_killed_with_its_children_and_started_again_as_it_ran(
    tmp_path: Path,
) -> None:
    port, starts = _port(), tmp_path / "starts"
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    env = {**os.environ, "STARTS": str(starts), "MARK": "as-started", "TPUFLEET_AWAIT_RAY": "10.0.0.1:1"}
    first = subprocess.Popen([sys.executable, str(script), str(port)], env=env, cwd=tmp_path)
    again = None
    try:
        assert _listening(port)
        found = ExternalServer.find(f"http://127.0.0.1:{port}")
        pid, child, cwd, mark = starts.read_text().split()
        assert found.pids[0] == first.pid == int(pid) and int(child) in found.pids
        assert found.argv == [sys.executable, str(script), str(port)] and found.cwd == cwd == str(tmp_path)
        assert found.env["MARK"] == mark == "as-started"
        assert "TPUFLEET_AWAIT_RAY" not in found.env  # set by a restart after a lost head, not by its owner
        found.kill()
        assert _gone(first.pid) and _gone(int(child))
        again = subprocess.Popen(found.argv, env=found.env, cwd=found.cwd)
        assert _listening(port)
        second = starts.read_text().splitlines()[1].split()
        assert int(second[0]) == again.pid and second[2:] == [str(tmp_path), "as-started"]
    finally:
        for proc in (first, again):
            if proc is not None:
                proc.kill()
                proc.wait(timeout=30)
        for line in starts.read_text().splitlines() if starts.exists() else []:  # their children
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(line.split()[1]), 9)


def test_a_server_on_another_machine_or_nobody_listening_is_refused() -> None:
    with pytest.raises(TpufleetError, match="must run on this machine"):
        ExternalServer.find("http://10.1.2.3:8600")
    with pytest.raises(TpufleetError, match="no process of this user listens"):
        ExternalServer.find(f"http://127.0.0.1:{_port()}")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--server", "http://127.0.0.1:1"], "--server: give --ray-address (or --emulator-dir)"),
        (["--emulator-dir", "{tmp}/none"], "no emulated fleet runs from"),
        (["--emulator-dir", "{tmp}/none", "--slices", "v4-8:1"], "--slices starts a fleet of the soak's own"),
    ],
)
def test_what_the_soak_cannot_use_is_one_line_and_exit_2(tmp_path: Path, args: list[str], says: str) -> None:
    env = {**os.environ, "TPUFLEET_CONFIG": str(tmp_path / "context.yaml")}
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    proc = subprocess.run(
        [sys.executable, "-m", "tpufleet", "chaos", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_server_whose_remembered_token_file_is_gone_asks_for_the_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpufleet.cli import context
    from tpufleet.cli.chaos import _server_access
    from tpufleet.errors import SpecError

    monkeypatch.setenv("TPUFLEET_CONFIG", str(tmp_path / "context.yaml"))
    url = "http://127.0.0.1:8600"
    context.remember(server=url, admin_token_path=str(tmp_path / "gone"), server_state_dir=str(tmp_path))
    with pytest.raises(SpecError, match="give its admin token with --token"):
        _server_access(url, None, None)
    (tmp_path / "token").write_text("s3cret\n")
    context.remember(admin_token_path=str(tmp_path / "token"))
    assert _server_access(url + "/", None, None) == ("s3cret", tmp_path)
    assert _server_access(url, "given", tmp_path / "cp") == ("given", tmp_path / "cp")
