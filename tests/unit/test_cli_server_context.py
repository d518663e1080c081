"""``--server`` as a user types it (no scheme, or the API's path pasted in) and ``tpufleet context``
clearing or switching what is remembered. In-process: the CLI over the API through FastAPI's
TestClient, no socket (tests/host/test_cli_context.py switches to a real ``serve`` process)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import planes
import pytest
from click.testing import CliRunner, Result
from fastapi.testclient import TestClient

from tpufleet.api.server import ControlPlane
from tpufleet.api.serving import lock_state_dir
from tpufleet.cli import command, context
from tpufleet.client.http import server_url
from tpufleet.control.cluster.memory import MemoryCluster
from tpufleet.errors import InputError, SpecError


@pytest.fixture(autouse=True)
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cfg" / "config.yaml"
    monkeypatch.setenv("TPUFLEET_CONFIG", str(path))
    monkeypatch.delenv("TPUFLEET_SERVER", raising=False)
    monkeypatch.delenv("TPUFLEET_TOKEN", raising=False)
    monkeypatch.setenv("TPUFLEET_STATE_DIR", str(tmp_path / "nowhere"))  # no ~/.tpufleet token
    return path


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    with planes.running(MemoryCluster.of("v4-16"), tmp_path / "state") as cp:
        yield cp


def _cli(plane: ControlPlane, *args: str) -> Result:
    return CliRunner().invoke(command(), list(args), obj=TestClient(plane.app))


@pytest.mark.parametrize(
    ("given", "url"),
    [
        ("127.0.0.1:8600", "http://127.0.0.1:8600"),
        ("localhost:8600", "http://localhost:8600"),
        ("http://127.0.0.1:8600/", "http://127.0.0.1:8600"),
        ("https://fleet.example.com", "https://fleet.example.com"),
        ("http://[::1]:8600", "http://[::1]:8600"),
    ],
)
def test_a_server_without_a_scheme_is_http(given: str, url: str) -> None:
    assert server_url(given) == url


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("http://127.0.0.1:8600/api/v1", "give http://127.0.0.1:8600 (scheme://host:port, no path)"),
        ("127.0.0.1:8600/api/v1/jobs", "give http://127.0.0.1:8600 (scheme://host:port, no path)"),
        ("ftp://127.0.0.1:8600", "give http(s)://host:port, e.g. http://127.0.0.1:8600"),
        ("127.0.0.1:99999", "give http(s)://host:port, e.g. http://127.0.0.1:8600"),
        ("http://", "give http(s)://host:port, e.g. http://127.0.0.1:8600"),
        ("http://[::1", "give http(s)://host:port, e.g. http://127.0.0.1:8600"),  # was a ValueError
        ("[::1]:8600]", "give http(s)://host:port, e.g. http://127.0.0.1:8600"),
    ],
)
def test_a_server_url_that_is_not_a_base_url_is_refused_with_the_expected_form(given: str, says: str) -> None:
    with pytest.raises(SpecError) as err:
        server_url(given)
    assert str(err.value) == f"--server: {given!r} is not a control plane URL: {says}"


def test_client_commands_take_a_server_without_a_scheme(plane: ControlPlane) -> None:
    result = _cli(plane, "jobs", "--json", "--server", "testserver", "--token", plane.admin_token)
    assert result.exit_code == 0, (result.output, result.exception)
    assert json.loads(result.stdout) == []


def test_the_remembered_admin_token_goes_to_the_same_server_typed_without_a_scheme(
    plane: ControlPlane,
) -> None:
    context.remember(server="http://testserver", admin_token_path=str(plane.admin_token_path))
    result = _cli(plane, "tenants", "--json", "--server", "testserver")
    assert result.exit_code == 0, (result.output, result.exception)


def test_a_server_url_with_the_api_path_is_refused_naming_where_it_came_from(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _cli(plane, "jobs", "--server", "http://testserver/api/v1", "--token", plane.admin_token)
    assert isinstance(result.exception, SpecError) and result.exception.exit_code == 2
    said = str(result.exception)
    assert said.startswith("--server: ") and "give http://testserver " in said
    monkeypatch.setenv("TPUFLEET_SERVER", "http://testserver/api/v1")
    result = _cli(plane, "jobs", "--token", plane.admin_token)
    assert isinstance(result.exception, SpecError) and str(result.exception).startswith("TPUFLEET_SERVER: ")


def _remember_everything(tmp_path: Path) -> None:
    context.remember(
        emulator_state_dir="/tmp/emu",
        ray_address="10.0.0.1:6379",
        server="http://127.0.0.1:1",
        server_state_dir=str(tmp_path / "old"),
        admin_token_path=str(tmp_path / "old" / "admin-token"),
    )


def test_context_clear_forgets_everything(tmp_path: Path) -> None:
    _remember_everything(tmp_path)
    result = CliRunner().invoke(command(), ["context", "--clear", "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown.pop("config") and set(shown.values()) == {None}
    assert context.load() == context.Context()


def test_context_server_switches_and_forgets_the_other_servers_token_file(tmp_path: Path) -> None:
    _remember_everything(tmp_path)
    result = CliRunner().invoke(command(), ["context", "--server", "127.0.0.1:8601"])
    assert result.exit_code == 0, result.output
    assert context.load() == context.Context(
        emulator_state_dir="/tmp/emu", ray_address="10.0.0.1:6379", server="http://127.0.0.1:8601"
    )
    before = context.load()
    result = CliRunner().invoke(command(), ["context", "--server", "http://127.0.0.1:8601/api/v1"])
    assert isinstance(result.exception, SpecError) and "no path" in str(result.exception)
    assert context.load() == before


def test_context_use_takes_the_url_from_the_serve_holding_the_state_dir(tmp_path: Path) -> None:
    _remember_everything(tmp_path)
    where = tmp_path / "home" / "sandbox"  # `serve --sandbox` with TPUFLEET_STATE_DIR=home
    lock = lock_state_dir(where)
    try:
        lock.note("http://127.0.0.1:8602")
        (where / "admin-token").write_text("t\n")
        result = CliRunner().invoke(command(), ["context", "--use", str(tmp_path / "home")])
        assert result.exit_code == 0, (result.output, result.exception)
    finally:
        lock.release()
    ctx = context.load()
    assert (ctx.server, ctx.server_state_dir, ctx.admin_token_path) == (
        "http://127.0.0.1:8602",
        str(where.resolve()),
        str((where / "admin-token").resolve()),
    )
    assert ctx.emulator_state_dir == "/tmp/emu"


def test_context_use_of_a_state_dir_no_serve_runs_from_is_one_line(tmp_path: Path) -> None:
    _remember_everything(tmp_path)
    before = context.load()
    result = CliRunner().invoke(command(), ["context", "--use", str(tmp_path / "idle")])
    assert isinstance(result.exception, InputError) and result.exception.exit_code == 2
    assert "no tpufleet serve runs from" in str(result.exception) and "\n" not in str(result.exception)
    assert context.load() == before


def test_context_takes_one_change_at_a_time() -> None:
    result = CliRunner().invoke(command(), ["context", "--clear", "--server", "127.0.0.1:1"])
    assert isinstance(result.exception, InputError) and "one of" in str(result.exception)


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_a_context_file_that_never_ends_is_read_only_up_to_the_yaml_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """TPUFLEET_CONFIG may name anything; /dev/zero was read until memory ran out."""
    monkeypatch.setenv("TPUFLEET_CONFIG", "/dev/zero")
    result = CliRunner().invoke(command(), ["context"])
    assert isinstance(result.exception, InputError) and result.exception.exit_code == 2
    assert str(result.exception).startswith("/dev/zero: over ") and "\n" not in str(result.exception)
