"""`tpufleet emulate ...` and `tpufleet doctor` as separate processes, as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpufleet.emulator import EmulatedFleet
from tpufleet.emulator.procs import _stat

pytestmark = pytest.mark.integration


def tpufleet(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it: without this process's Ray auth variables, so every command
    proves it finds the fleet's token from --state-dir alone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    return subprocess.run(
        [sys.executable, "-m", "tpufleet", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def _running_with(text: str) -> list[int]:
    """Live processes whose command line mentions ``text`` (found without the fleet's own records)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, ValueError):
            continue
        info = _stat(int(entry.name)) if entry.name.isdigit() else None
        if text in cmdline and info is not None and info.state != "Z":
            found.append(info.pid)
    return found


def test_status_and_doctor_read_the_shared_fleet_from_its_state_dir(fleet: EmulatedFleet) -> None:
    run = tpufleet("emulate", "status", "--json", "--state-dir", str(fleet.state_dir))
    assert run.returncode == 0, run.stderr
    status = json.loads(run.stdout)
    assert status["ray_address"] == fleet.ray_address
    assert [s["name"] for s in status["slices"]] == ["tpu-v4-16-0", "tpu-v4-16-1", "tpu-v6e-4-0"]
    assert all(h["alive"] and h["node_id"] for s in status["slices"] for h in s["hosts"])

    run = tpufleet("doctor", "--json", "--state-dir", str(fleet.state_dir))
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["healthy"] and report["types"] == {
        "v4-16": {"slices": 2, "intact": 2},
        "v6e-4": {"slices": 1, "intact": 1},
    }
    assert sorted((p["slice"], p["worker_id"], p["devices"]) for p in report["probes"]) == [
        ("tpu-v4-16-0", 0, 4),
        ("tpu-v4-16-0", 1, 4),
        ("tpu-v4-16-1", 0, 4),
        ("tpu-v4-16-1", 1, 4),
        ("tpu-v6e-4-0", 0, 4),
    ]


def test_a_tiny_fleet_goes_up_grows_is_preempted_and_leaves_no_process(tmp_path: Path) -> None:
    state = str(tmp_path / "tiny")
    run = tpufleet("emulate", "up", "--slices", "v5litepod-1", "--state-dir", state, "--json")
    assert run.returncode == 0, run.stderr
    try:
        up = json.loads(run.stdout)
        assert [(s["name"], s["topology"], len(s["hosts"])) for s in up["slices"]] == [
            ("tpu-v5litepod-1-0", "1x1", 1)
        ]
        run = tpufleet("emulate", "add", "v5litepod-1", "--state-dir", state)
        assert (run.returncode, run.stdout.strip()) == (0, "tpu-v5litepod-1-1"), run.stderr

        run = tpufleet("emulate", "kill-host", "tpu-v5litepod-1-7", "0", "--state-dir", state)
        assert run.returncode == 2 and "tpu-v5litepod-1-" in run.stderr and "Traceback" not in run.stderr

        assert tpufleet("emulate", "preempt", "tpu-v5litepod-1-1", "--state-dir", state).returncode == 0
        status = json.loads(tpufleet("emulate", "status", "--json", "--state-dir", state).stdout)
        assert [h["alive"] for s in status["slices"] for h in s["hosts"]] == [True, False]

        run = tpufleet("doctor", "--no-probe", "--state-dir", state)
        assert run.returncode == 1 and "tpu-v5litepod-1-1" in run.stdout, run.stdout
        pids = EmulatedFleet.attach(state).pids()
        assert pids
        temp_dir = json.loads((tmp_path / "tiny" / "fleet.json").read_text())["temp_dir"]
        assert _running_with(temp_dir)  # GCS, raylets, agents name the fleet's Ray temp dir
    finally:
        down = tpufleet("emulate", "down", "--state-dir", state)
    assert down.returncode == 0, down.stderr
    survivors = [p for p in pids if (info := _stat(p)) is not None and info.state != "Z"]
    assert survivors == []
    assert _running_with(temp_dir) == []  # also none the fleet failed to record
    run = tpufleet("emulate", "status", "--state-dir", state)
    assert run.returncode == 2 and "no emulated fleet" in run.stderr
