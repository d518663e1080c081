"""`tpufleet emulate ...` and `tpufleet doctor` as separate processes, as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpufleet.emulator import EmulatedFleet

pytestmark = pytest.mark.integration


def tpufleet(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it: without this process's Ray auth variables, so every command
    proves it finds the fleet's token from --state-dir alone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    return subprocess.run(
        [sys.executable, "-m", "tpufleet", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


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


def test_a_preempted_slice_shows_in_status_and_doctor_and_bad_names_are_one_line(
    fleet: EmulatedFleet, tmp_path: Path
) -> None:
    """On the shared fleet (healed after the test): what the CLI says of a preempted slice, of a
    slice that does not exist and of a state dir without a fleet. `up`, `add` and `down` as a
    user types them are the tour's (docs/emulator.md); that `down` leaves no process behind is
    test_emulator.py's, on the code `emulate down` runs."""
    state = str(fleet.state_dir)
    run = tpufleet("emulate", "kill-host", "tpu-v6e-4-7", "0", "--state-dir", state)
    assert run.returncode == 2 and "tpu-v6e-4-0" in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr

    assert tpufleet("emulate", "preempt", "tpu-v6e-4-0", "--state-dir", state).returncode == 0
    status = json.loads(tpufleet("emulate", "status", "--json", "--state-dir", state).stdout)
    alive = {(s["name"], h["worker_id"]): h["alive"] for s in status["slices"] for h in s["hosts"]}
    assert [k for k, up in alive.items() if not up] == [("tpu-v6e-4-0", 0)], alive

    run = tpufleet("doctor", "--no-probe", "--state-dir", state)
    assert run.returncode == 1 and "tpu-v6e-4-0" in run.stdout, run.stdout

    run = tpufleet("emulate", "status", "--state-dir", str(tmp_path / "none"))
    assert run.returncode == 2 and "no emulated fleet" in run.stderr, run.stderr
