"""`tpufleet demo --chaos` kills a host only once the multi-slice job has a checkpoint to resume
from: a checkpoint file on disk (not the step its copied output shows, which lags under load),
before its last step, while the job runs its first attempt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tpufleet.cli.demo import Progress_, _chaos_every, _maybe_kill


class Fleet:
    """The one fleet call the demo's chaos makes, recorded."""

    def __init__(self) -> None:
        self.killed: list[tuple[str, int]] = []

    def kill_host(self, slice_name: str, worker: int, *, wait: bool = True) -> None:
        self.killed.append((slice_name, worker))


def job(state: str = "RUNNING", attempt: int = 1) -> Progress_:
    record: dict[str, Any] = {"id": "j1", "state": state, "attempt": attempt}
    record["slices"] = ["tpu-v4-16-0", "tpu-v4-16-1"]
    return Progress_(job=record)


def test_no_kill_before_the_first_checkpoint_then_host_1_of_the_last_slice(tmp_path: Path) -> None:
    fleet, ckpt = Fleet(), tmp_path / "ckpt"
    assert _maybe_kill(fleet, job(), ckpt, steps=12) is None  # no directory yet
    ckpt.mkdir()
    (ckpt / "step-2.tmp").write_bytes(b"half")  # being written: not a checkpoint
    assert _maybe_kill(fleet, job(), ckpt, steps=12) is None and fleet.killed == []
    (ckpt / "step-2.pkl").write_bytes(b"whole")
    assert _maybe_kill(fleet, job(), ckpt, steps=12) == "tpu-v4-16-1"
    assert fleet.killed == [("tpu-v4-16-1", 1)]


@pytest.mark.parametrize(("state", "attempt"), [("QUEUED", 1), ("SUCCEEDED", 1), ("RUNNING", 2)])
def test_no_kill_unless_the_first_attempt_runs(tmp_path: Path, state: str, attempt: int) -> None:
    fleet = Fleet()
    (tmp_path / "step-2.pkl").write_bytes(b"whole")
    assert _maybe_kill(fleet, job(state, attempt), tmp_path, steps=12) is None and fleet.killed == []


def test_the_last_steps_checkpoint_leaves_nothing_to_recover(tmp_path: Path) -> None:
    fleet = Fleet()
    (tmp_path / "step-12.pkl").write_bytes(b"whole")
    assert _maybe_kill(fleet, job(), tmp_path, steps=12) is None and fleet.killed == []


def test_a_two_step_run_checkpoints_at_step_1() -> None:
    assert _chaos_every(2) == 1 and _chaos_every(12) == 2
