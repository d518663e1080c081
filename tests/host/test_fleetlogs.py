"""The fleet's one log monitor (emulator/fleetlogs.py): Ray's LogMonitor for the head and for every
host found under the fleet's temp dir, publishing what each host's own would have, and dropping a
host only once the GCS says its node, alive before, is gone."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tpufleet.emulator import fleetlogs

pytest.importorskip("ray._private.log_monitor")

JOB = "01000000"


class FakeGcs:
    """The two calls of Ray's GcsClient the monitors make: publish_logs and get_all_node_info."""

    def __init__(self) -> None:
        self.published: list[dict[str, Any]] = []
        self.sockets: list[str] | None = []  # None: the GCS does not answer

    def publish_logs(self, data: dict[str, Any]) -> None:
        self.published.append(data)

    def get_all_node_info(self, timeout: float | None = None) -> dict[str, Any]:
        if self.sockets is None:
            raise ConnectionError("GCS unavailable")
        return {i: SimpleNamespace(raylet_socket_name=s, state=0) for i, s in enumerate(self.sockets)}


def _node(root: Path, name: str) -> tuple[Path, str]:
    """A node's Ray temp dir as Ray lays it out: session_<x>/logs, session_latest, the raylet socket."""
    session = root / name / "session_2026-12-05_00-00-00_000000_1" if name else root / "session_2026_1"
    (session / "logs").mkdir(parents=True)
    (session / "sockets").mkdir()
    (session.parent / "session_latest").symlink_to(session)
    return session / "logs", str(session / "sockets" / "raylet")


def _say(logs: Path, pid: int, line: str) -> None:
    with open(logs / f"worker-{'ab' * 14}-{JOB}-{pid}.out", "a") as f:
        f.write(line + "\n")


def _lines(gcs: FakeGcs) -> list[tuple[Any, str]]:
    return [(d["pid"], line) for d in gcs.published for line in d["lines"]]


def test_the_heads_monitor_forwards_every_hosts_worker_output_as_the_host_would(tmp_path: Path) -> None:
    head_logs, _ = _node(tmp_path, "")
    h0, _ = _node(tmp_path, "h0")
    gcs = FakeGcs()
    fleet = fleetlogs.FleetLogs("10.0.0.7", str(head_logs), str(tmp_path), gcs, None)
    me = os.getpid()  # a live pid: Ray's monitor reads the files of live workers
    _say(head_logs, me, "from the head")
    _say(h0, me, "from host zero")
    assert fleet.step(0.0)
    assert sorted(_lines(gcs)) == [(me, "from host zero"), (me, "from the head")]
    assert {d["ip"] for d in gcs.published} == {"10.0.0.7"}  # every node of a fleet has the machine's

    h1, _ = _node(tmp_path, "h1")  # a host started later is found on a later round
    _say(h1, me, "from host one")
    gcs.published.clear()
    fleet.step(fleetlogs.FIND_EVERY_S)
    assert _lines(gcs) == [(me, "from host one")]
    assert sorted(fleet.watched) == sorted(str(p.resolve()) for p in (head_logs, h0, h1))


def test_a_host_is_dropped_once_its_node_was_alive_and_is_not_and_never_on_a_silent_gcs(
    tmp_path: Path,
) -> None:
    head_logs, _ = _node(tmp_path, "")
    h0, socket0 = _node(tmp_path, "h0")
    h1, socket1 = _node(tmp_path, "h1")
    gcs = FakeGcs()
    fleet = fleetlogs.FleetLogs("10.0.0.7", str(head_logs), str(tmp_path), gcs, None)
    fleet.find_hosts()
    hosts = {str(h0.resolve()), str(h1.resolve())}

    fleet.retire_dead_hosts([])  # not registered yet (a host still starting): kept
    assert hosts <= set(fleet.watched)
    fleet.retire_dead_hosts([socket0, socket1])
    fleet.retire_dead_hosts(None)  # the GCS did not answer: nothing known, nothing dropped
    assert hosts <= set(fleet.watched)
    fleet.retire_dead_hosts([socket0])  # h1 killed
    assert str(h1.resolve()) not in fleet.watched and str(h0.resolve()) in fleet.watched
    fleet.find_hosts()  # and not found again: a host brought back gets a new temp dir
    assert str(h1.resolve()) not in fleet.watched
    assert str(head_logs.resolve()) in fleet.watched  # the head's is never dropped

    gcs.sockets = None  # through step, a GCS that fails keeps every host
    fleet.step(100.0)
    assert str(h0.resolve()) in fleet.watched


def test_only_raylet_sockets_under_the_fleets_host_dirs_name_a_host(tmp_path: Path) -> None:
    root = str(tmp_path)
    assert fleetlogs.host_dir_of_socket(root, f"{root}/h12/session_x/sockets/raylet") == f"{root}/h12"
    assert fleetlogs.host_dir_of_socket(root, f"{root}/session_x/sockets/raylet") is None  # the head
    assert fleetlogs.host_dir_of_socket(root, "/tmp/other-fleet/h1/session_x/sockets/raylet") is None
