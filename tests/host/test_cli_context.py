"""The remembered CLI context: what `emulate up` and `serve` record, and who wins over it.

Flags beat ``TPUFLEET_*`` variables, which beat the context, which beats the built-in defaults.
The context holds paths, never a token. Client commands run in-process against a real control
plane (uvicorn on a free port, MemoryCluster), the way tests/unit/test_cli_control_server.py does.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import planes
import pytest
import yaml
from cli_inproc import tpufleet
from guards import HANG_GUARD_S

from tpufleet.api.server import ControlPlane
from tpufleet.cli import context
from tpufleet.control.cluster.memory import MemoryCluster
from tpufleet.emulator import procs


@pytest.fixture(autouse=True)
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cfg" / "config.yaml"
    monkeypatch.setenv("TPUFLEET_CONFIG", str(path))
    for var in ("TPUFLEET_EMULATOR_DIR", "TPUFLEET_SERVER", "TPUFLEET_TOKEN", "RAY_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TPUFLEET_STATE_DIR", str(tmp_path / "nowhere"))  # no ~/.tpufleet token
    return path


def test_the_context_file_is_private_holds_paths_only_and_is_shown(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = tmp_path / "admin-token"
    token.write_text("s3cret-token\n")
    context.remember(server="http://127.0.0.1:1", admin_token_path=str(token))
    context.remember(emulator_state_dir="/tmp/emu", ray_address="10.0.0.1:6379")
    assert stat.S_IMODE(os.stat(config).st_mode) == 0o600
    assert "s3cret" not in config.read_text()
    assert yaml.safe_load(config.read_text())["server"] == "http://127.0.0.1:1"  # merged, not replaced
    code, out, _ = tpufleet(capsys, "context", "--json")
    assert code == 0
    assert json.loads(out) == {
        "config": str(config),
        "emulator_state_dir": "/tmp/emu",
        "ray_address": "10.0.0.1:6379",
        "server": "http://127.0.0.1:1",
        "server_state_dir": None,
        "admin_token_path": str(token),
    }
    code, out, _ = tpufleet(capsys, "context")
    assert code == 0 and "10.0.0.1:6379" in out and str(config) in out


def test_an_unreadable_context_is_one_line_exit_2(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config.parent.mkdir(parents=True)
    config.write_text("- just\n- a list\n")
    code, _, err = tpufleet(capsys, "context")
    assert code == 2 and "not a mapping" in err and len(err.strip().splitlines()) == 1


def test_emulator_commands_use_the_remembered_state_dir_unless_told_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    context.remember(emulator_state_dir=str(tmp_path / "remembered"))
    for args in (("emulate", "status"), ("emulate", "restore", "tpu-v4-16-0"), ("doctor",)):
        code, _, err = tpufleet(capsys, *args)
        assert code == 2 and str(tmp_path / "remembered") in err, (args, err)
    monkeypatch.setenv("TPUFLEET_EMULATOR_DIR", str(tmp_path / "from-env"))
    assert str(tmp_path / "from-env") in tpufleet(capsys, "emulate", "status")[2]
    flag = tpufleet(capsys, "emulate", "status", "--state-dir", str(tmp_path / "flag"))[2]
    assert str(tmp_path / "flag") in flag


def test_emulate_down_forgets_the_ray_address_but_keeps_the_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    where = tmp_path / "emu"
    where.mkdir()
    context.remember(emulator_state_dir=str(where.resolve()), ray_address="10.0.0.1:6379")
    assert tpufleet(capsys, "emulate", "down")[0] == 0
    assert context.load() == context.Context(emulator_state_dir=str(where.resolve()))


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    with planes.running(MemoryCluster.of("v4-16"), tmp_path / "serve", http=True) as cp:
        yield cp


def test_client_commands_use_the_remembered_server_and_admin_token_path(
    plane: ControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    context.remember(server=plane.url, admin_token_path=str(plane.admin_token_path))
    code, out, err = tpufleet(capsys, "tenant", "create", "team-a", "--quota", "v4=16", "--json")
    assert code == 0, err
    tenant_token = json.loads(out)["token"]
    code, out, err = tpufleet(capsys, "tenants", "--json")
    assert code == 0 and [t["name"] for t in json.loads(out)] == ["team-a"], err
    # --token wins over the remembered admin token: a tenant may not list tenants
    code, _, err = tpufleet(capsys, "tenants", "--token", tenant_token)
    assert code == 2 and "admin" in err.lower()


def test_the_remembered_admin_token_never_goes_to_another_server(
    plane: ControlPlane, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = ControlPlane(MemoryCluster.of("v4-16"), state_dir=tmp_path / "other")
    try:
        url = other.start_http()
        context.remember(server=plane.url, admin_token_path=str(plane.admin_token_path))
        code, _, err = tpufleet(capsys, "tenants", "--server", url)
        assert code == 2 and "token" in err.lower()  # sent no token at all, not plane's
    finally:
        other.close()


def _closed_port() -> int:
    return procs.free_port()  # below the ephemeral range: nobody takes it meanwhile


def _serve(*args: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "tpufleet", "serve", *args],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        env=env,
    )
    return out, time.monotonic() - started


def test_serve_fails_within_seconds_naming_the_address_it_tried(tmp_path: Path) -> None:
    address = f"127.0.0.1:{_closed_port()}"
    env = {**os.environ, "TPUFLEET_STATE_DIR": str(tmp_path / "state")}
    out, took = _serve("--ray-address", address, env=env)
    assert out.returncode == 1, out.stderr
    assert f"no Ray cluster at {address}" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert took < 30  # 5 s of probing plus Python's start; Ray's own retries would never end


def test_serve_without_an_address_looks_for_the_local_emulated_fleet(tmp_path: Path) -> None:
    env = {**os.environ, "TPUFLEET_EMULATOR_DIR": str(tmp_path / "emu")}
    env.pop("RAY_ADDRESS", None)
    for args in ((), ("--emulator",)):
        out, _ = _serve(*args, env=env)
        assert out.returncode == 2, out.stderr
        assert f"no emulated fleet runs from {tmp_path / 'emu'}" in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
    both, _ = _serve("--emulator", "--ray-address", "127.0.0.1:1", env=env)
    assert both.returncode == 2 and "not both" in both.stderr


# -- one serve per state dir, its port bound before anything is recorded ----------------------------


def _context_file(serve: planes.ServeProcess) -> str | None:
    path = Path(serve.env["TPUFLEET_CONFIG"])
    return path.read_text() if path.exists() else None


def test_a_second_serve_on_the_same_state_dir_is_refused_naming_the_first(tmp_path: Path) -> None:
    first = planes.ServeProcess(tmp_path, "--sandbox", "v4-16")
    try:
        remembered = _context_file(first)
        assert remembered is not None and first.url in remembered
        port = first.url.rsplit(":", 1)[1]
        for again in (port, str(procs.free_port())):  # on its port (the README's `serve` twice), or another
            out = subprocess.run(
                [sys.executable, "-m", "tpufleet", "serve", "--sandbox", "v4-16", "--port", again],
                capture_output=True,
                text=True,
                timeout=HANG_GUARD_S,
                env=first.env,
            )
            assert out.returncode == 2, out.stderr
            assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr
            assert f"PID {first.proc.pid}" in out.stderr and first.url in out.stderr, out.stderr
            assert "--state-dir" in out.stderr
            assert _context_file(first) == remembered  # nothing recorded
        assert httpx.get(f"{first.url}/healthz", timeout=5).status_code == 200  # the first one unharmed
    finally:
        first.stop()


def test_a_taken_port_is_one_line_exit_2_and_nothing_is_recorded_or_started(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "TPUFLEET_CONFIG": str(tmp_path / "config.yaml"),
        "TPUFLEET_STATE_DIR": str(tmp_path / "home"),
    }
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", procs.free_port()))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "tpufleet", "serve", "--sandbox", "v4-16", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
            env=env,
        )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"port {port}" in lines[0] and "--port" in lines[0], out.stderr
    assert not (tmp_path / "config.yaml").exists()  # the context names no server that never ran
    state = tmp_path / "home" / "sandbox"
    assert sorted(p.name for p in state.iterdir()) == ["serve.lock"]  # no database, no admin token


def test_context_use_switches_back_to_the_serve_that_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    serve = planes.ServeProcess(tmp_path, "--sandbox", "v4-16")
    try:
        monkeypatch.setenv("TPUFLEET_CONFIG", serve.env["TPUFLEET_CONFIG"])
        context.remember(server=f"http://127.0.0.1:{_closed_port()}", admin_token_path=None)  # a dead one
        assert tpufleet(capsys, "slices")[0] == 1
        code, _, err = tpufleet(capsys, "context", "--use", serve.env["TPUFLEET_STATE_DIR"])
        assert code == 0, err
        assert context.load().server == serve.url
        code, out, err = tpufleet(capsys, "slices", "--json")  # with the admin token it named
        assert code == 0 and [s["name"] for s in json.loads(out)] == ["tpu-v4-16-0"], err
    finally:
        serve.stop()
