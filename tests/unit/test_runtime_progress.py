"""report_step writes process 0's progress where the runner reads it; read_progress trusts nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tpufleet import runtime
from tpufleet.runtime import StepProgress, read_progress, report_step


def env(path: Path, **more: str) -> dict[str, str]:
    return {runtime.PROGRESS_VAR: str(path), **more}


def test_process_zero_writes_its_first_and_newest_step(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    report_step(3, environ=env(path, TPU_WORKER_ID="0"))
    first = read_progress(path)
    assert first is not None and (first.first_step, first.step) == (3, 3)
    report_step(4, environ=env(path, TPU_WORKER_ID="0"))  # within a second: kept for later
    assert read_progress(path) == first
    runtime._flush()  # what exit does
    last = read_progress(path)
    assert last is not None and (last.first_step, last.step) == (3, 4) and last.at >= first.at


@pytest.mark.parametrize("where", [{"TPU_WORKER_ID": "1"}, {"TPU_WORKER_ID": "0", "MEGASCALE_SLICE_ID": "1"}])
def test_other_processes_and_jobs_outside_tpufleet_write_nothing(
    tmp_path: Path, where: dict[str, str]
) -> None:
    path = tmp_path / "progress.json"
    report_step(1, environ=env(path, **where))
    report_step(1, environ={})
    assert not path.exists()


def test_a_bad_step_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="whole number"):
        report_step(-1, environ=env(tmp_path / "p.json"))


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b"[1, 2]",
        json.dumps({"first_step": 5, "first_at": 1.0, "step": 4, "at": 2.0}).encode(),  # goes backwards
        json.dumps({"first_step": 1, "first_at": 2.0, "step": 4, "at": 1.0}).encode(),
        json.dumps({"first_step": True, "first_at": 1.0, "step": 4, "at": 2.0}).encode(),
        json.dumps({"first_step": 1, "first_at": "x", "step": 4, "at": 2.0}).encode(),
        json.dumps({"first_step": 1, "first_at": 1.0, "step": 2**40, "at": 2.0}).encode(),
        b'{"first_step": 1, "first_at": NaN, "step": 2, "at": 3}',
        b" " * 5000,  # over the size cap
    ],
)
def test_read_progress_refuses_what_a_job_could_write(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "progress.json"
    path.write_bytes(content)
    assert read_progress(path) is None


def test_read_progress_follows_no_link_and_reads_no_fifo(tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps(StepProgress(1, 1.0, 2, 2.0).to_dict()))
    link = tmp_path / "progress.json"
    link.symlink_to(secret)
    assert read_progress(secret) is not None and read_progress(link) is None
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert read_progress(fifo) is None  # returns at once, never blocks
    assert read_progress(tmp_path / "missing") is None
