"""``tpufleet top`` in-process (the CLI over the API through FastAPI's TestClient, a MemoryCluster
driven cycle by cycle): one frame's content, user text printed literally, and costs shown as a
dash where the server has none (a real server process is in tests/e2e/test_fleet_page.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import planes
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from tpufleet.api.server import ControlPlane
from tpufleet.cli import command
from tpufleet.cli.top import money
from tpufleet.control.cluster.memory import MemoryCluster, Script
from tpufleet.control.loop.service import ServiceConfig
from tpufleet.control.store.values import JobRequest

MARKUP = "[red]boom[/red] [link=x]y[/]"  # 27 characters: shown whole in the 30-wide name column


@pytest.fixture
def plane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ControlPlane]:
    monkeypatch.setenv("TPUFLEET_STATE_DIR", str(tmp_path / "nowhere"))  # no local admin-token fallback
    cluster = MemoryCluster.of("v4-16:2,v6e-8", script=lambda spec: Script(run_after=1, exit_after=None))
    with planes.running(cluster, tmp_path / "state", config=ServiceConfig(stop_threads=0)) as cp:
        yield cp


def _top(cp: ControlPlane, token: str) -> str:
    http = TestClient(cp.app)
    args = ["top", "--once", "--token", token, "--server", "http://testserver"]
    result = CliRunner().invoke(command(), args, obj=http)
    assert result.exit_code == 0, (result.output, result.exception)
    return result.stdout


def test_one_frame_shows_chips_holders_quota_queue_and_running_jobs_with_literal_names(
    plane: ControlPlane,
) -> None:
    plane.store.tenants.create("research", {"v4": 8}, 1.0)
    _, prod = plane.store.tenants.create("prod", {"v6e": 8}, 1.0)
    run = plane.store.jobs.submit(
        "research", JobRequest.build(command=["x"], accelerator_type="v4-16", name=MARKUP)
    )
    plane.store.jobs.submit(
        "research", JobRequest.build(command=["x"], accelerator_type="v4-16", num_slices=3, name="second")
    )
    for _ in range(3):
        plane.service.run_once()
    frame = _top(plane, plane.admin_token)
    rows = {line.split()[0]: line for line in frame.splitlines() if line.strip().startswith("tpu-")}
    assert sorted(rows) == ["tpu-v4-16-0", "tpu-v4-16-1", "tpu-v6e-8-0"]
    held = next(name for name, line in rows.items() if run.id in line)
    assert "HELD" in rows[held] and "■■■■ ■■■■" in rows[held] and "research" in rows[held]
    assert "■■■■■■■■" in rows["tpu-v6e-8-0"] and "FREE" in rows["tpu-v6e-8-0"]
    assert MARKUP in frame  # printed as typed: no markup applied, nothing dropped
    assert re.search(r"research\s+v4 8/8\s", frame) and re.search(r"prod\s+v6e 0/8\s", frame)
    assert "queue: 1 waiting" in frame and "NO_SUCH_SLICES_IN_FLEET" in frame
    theirs = _top(plane, prod)
    assert (
        "tenant prod" in theirs and run.id not in theirs and MARKUP not in theirs and "second" not in theirs
    )
    assert "another tenant" in theirs


@pytest.mark.parametrize(
    ("dollars", "shown"), [(None, "—"), (0.0123456, "$0.0123"), (12.345, "$12.35"), (12345.6, "$12,346")]
)
def test_money_is_a_dash_when_unknown_never_zero(dollars: float | None, shown: str) -> None:
    assert money(dollars) == shown


class _Frames(TestClient):
    """The API in-process, counting fleet reads; a second one is a Ctrl-C (a live view ends there)."""

    reads = 0

    def request(self, method: str, url: Any, *args: Any, **kwargs: Any) -> Any:
        if str(url).endswith("/api/v1/fleet"):
            self.reads += 1
            if self.reads > 1:
                raise KeyboardInterrupt
        return super().request(method, url, *args, **kwargs)


def test_top_without_a_terminal_prints_one_frame_and_says_so(plane: ControlPlane) -> None:
    plane.service.run_once()  # the inventory: the slices the frame shows
    http = _Frames(plane.app)
    args = ["top", "--token", plane.admin_token, "--server", "http://testserver", "--interval", "0.2"]
    result = CliRunner().invoke(command(), args, obj=http)  # CliRunner's stdout is not a terminal
    assert result.exit_code == 0, (result.output, result.exception)
    assert http.reads == 1 and "tpu-v4-16-0" in result.stdout
    assert result.stderr.strip().splitlines() == [
        "tpufleet top: stdout is not a terminal, so one frame was printed (as --once)"
    ]
