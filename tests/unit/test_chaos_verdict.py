"""The chaos soak's plan and its judgement of markers (tpufleet.chaos), without a fleet."""

from __future__ import annotations

import json
import random
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tpufleet.chaos import (
    FAULT_KINDS,
    HEAD_KILL,
    HOSTJOB,
    RAYDRIVER,
    ChaosConfig,
    PlannedJob,
    double_runs,
    overlaps,
    plan_faults,
    plan_jobs,
    read_markers,
)
from tpufleet.errors import SpecError


def _m(attempt: int, start: float, beat: float, end: float | None = None) -> dict[str, object]:
    return {"attempt": attempt, "slice": "s", "worker": "0", "start": start, "beat": beat, "end": end}


def test_the_plan_is_the_seeds() -> None:
    cfg = ChaosConfig(seed=7, jobs=30, minutes=2, slices="v4-8:2,v4-16:1")
    a = (plan_jobs(cfg, random.Random(7)), plan_faults(cfg, random.Random(7)))
    b = (plan_jobs(cfg, random.Random(7)), plan_faults(cfg, random.Random(7)))
    c = plan_jobs(cfg, random.Random(8))
    assert a == b and a[0] != c
    jobs, faults = a
    assert len(jobs) == 30 and all(0 <= j.at <= 60 for j in jobs)
    assert {(j.accelerator_type, j.num_slices) for j in jobs} <= {("v4-8", 1), ("v4-8", 2), ("v4-16", 1)}
    assert len({j.tenant for j in jobs}) == 2 and len({j.priority for j in jobs}) > 1
    assert {f.kind for f in faults} == {*FAULT_KINDS, HEAD_KILL}
    (head,) = [f for f in faults if f.kind == HEAD_KILL]  # once, in the middle of the window
    assert 36 <= head.at <= 72
    assert len(faults) == 120 // 15 + 1  # one fault every ~15 s, and the head's loss
    assert all(12 <= f.at <= 102 for f in faults) and [f.at for f in faults] == sorted(f.at for f in faults)


def test_a_share_of_the_jobs_are_ray_jobs_drawn_apart_from_the_rest_of_the_plan() -> None:
    base = ChaosConfig(seed=7, jobs=40, minutes=2, slices="v4-8:2,v4-16:1")
    plans = {share: plan_jobs(replace(base, ray_jobs=share), random.Random(7)) for share in (0.0, 0.25, 1.0)}
    assert {j.kind for j in plans[0.0]} == {"spmd"} and {j.kind for j in plans[1.0]} == {"ray"}
    assert 0 < sum(j.kind == "ray" for j in plans[0.25]) < 40
    # the kinds have their own stream: times, shapes, tenants and lengths stay as they were
    strip = [[replace(j, kind="spmd") for j in plan] for plan in plans.values()]
    assert strip[0] == strip[1] == strip[2]


def test_a_job_runs_the_host_program_or_the_ray_driver_that_runs_it_by_path() -> None:
    spmd = PlannedJob(0, 0.0, "v4-8", 1, "chaos-a", 0, 2.5)
    assert spmd.command("chaos-tok")[1:] == [
        str(HOSTJOB),
        "chaos-tok",
        "2.5",
    ]  # the token marks its processes
    assert replace(spmd, kind="ray").command("chaos-tok")[1:] == [str(RAYDRIVER), "chaos-tok", "2.5"]
    driver = RAYDRIVER.read_text()
    assert (
        "SlicePlacementGroup(" in driver and HOSTJOB.name in driver
    )  # one task per host runs the host program
    compile(driver, str(RAYDRIVER), "exec")
    compile(HOSTJOB.read_text(), str(HOSTJOB), "exec")


def test_the_host_program_marks_its_start_beats_and_end_and_sees_a_running_earlier_attempt(
    tmp_path: Path,
) -> None:
    from tpufleet.chaos import hostjob

    beat = time.time() + 60  # attempt 1's host 0 beats on: this one starts before its last sign of life
    (tmp_path / "chaos-1-s-0.json").write_text(json.dumps(_m(1, 0.0, beat)))
    (tmp_path / "chaos-1-s-1.json").write_text(json.dumps(_m(1, 0.0, 1.0, end=1.0)))  # ended
    env = {"TPUFLEET_CHECKPOINT_DIR": str(tmp_path), "TPUFLEET_ATTEMPT": "2", "TPU_NAME": "s"}
    assert hostjob.main(["chaos-tok", "0.5"], env | {"TPU_WORKER_ID": "1"}) == 0
    (mine,) = read_markers(tmp_path)[2]
    assert (mine["slice"], mine["worker"]) == ("s", "1")
    assert mine["end"] == mine["beat"] and mine["end"] - mine["start"] >= 0.5
    assert mine["seen"] == [{"marker": "chaos-1-s-0.json", "beat": beat}]
    assert overlaps(read_markers(tmp_path)) == [(1, 2)]  # a double run, as the verdict sees it


def test_attempts_overlap_only_when_a_later_one_starts_before_the_earlier_ones_last_sign_of_life() -> None:
    apart = {1: [_m(1, 0.0, 4.0), _m(1, 0.1, 4.2)], 2: [_m(2, 4.5, 9.0, 9.0)]}
    assert overlaps(apart) == []
    together = {1: [_m(1, 0.0, 4.0), _m(1, 0.1, 6.0)], 2: [_m(2, 5.0, 9.0, 9.0)], 3: [_m(3, 10.0, 11.0)]}
    assert overlaps(together) == [(1, 2)]


def test_a_second_successful_attempt_is_a_double_run() -> None:
    job = {"attempts": [{"attempt": 1, "state": "SUCCEEDED"}, {"attempt": 2, "state": "SUCCEEDED"}]}
    assert double_runs(job, {}) == ["attempts 1, 2 all succeeded"]
    once = {"attempts": [{"attempt": 1, "state": "PREEMPTED"}, {"attempt": 2, "state": "SUCCEEDED"}]}
    assert double_runs(once, {}) == []


def test_markers_are_read_per_attempt_and_a_torn_one_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "chaos-1-s-0.json").write_text(json.dumps(_m(1, 0.0, 1.0)))
    (tmp_path / "chaos-2-s-0.json").write_text(json.dumps(_m(2, 2.0, 3.0)))
    (tmp_path / "chaos-2-s-1.json").write_text("{")
    got = read_markers(tmp_path)
    assert sorted(got) == [1, 2] and [len(v) for v in got.values()] == [1, 1]


def test_bad_input_is_refused_before_anything_starts() -> None:
    from tpufleet.chaos import Soak

    with pytest.raises(SpecError, match="v9"):
        Soak(ChaosConfig(slices="v9-8:1"))
    with pytest.raises(SpecError, match="--jobs"):
        Soak(ChaosConfig(jobs=0))


def _result(**over: object) -> dict[str, object]:
    base: dict[str, object] = {
        "seed": 1,
        "slices": "v4-8:2",
        "jobs": 2,
        "succeeded": 1,
        "failed": [{"name": "chaos-1", "id": "ab", "reason": "attempt 3 failed (exit 1)"}],
        "lost": [],
        "double_runs": [],
        "leaked_placement_groups": [],
        "leaked_processes": [],
        "faults": {"kill_host": 1, "skipped": 2},
        "seconds": 61.0,
    }
    return base | over


@pytest.mark.parametrize(
    ("over", "ok"),
    [
        ({}, True),
        ({"lost": [{"name": "chaos-0", "id": "cd", "why": "never ended (still QUEUED)"}]}, False),
        (
            {
                "double_runs": [
                    {"name": "chaos-0", "id": "cd", "why": ["attempts 1 and 2 ran at the same time"]}
                ]
            },
            False,
        ),
        ({"leaked_placement_groups": [{"id": "ff", "name": "", "state": "CREATED"}]}, False),
        ({"leaked_processes": [4242]}, False),
    ],
)
def test_the_verdict_fails_on_any_loss_double_run_or_leak_but_not_on_a_failed_job(
    over: dict[str, object], ok: bool
) -> None:
    from tpufleet.chaos import passed

    assert passed(_result(**over)) is ok


def test_the_table_names_each_failure_and_counts_faults_without_the_skipped() -> None:
    from rich.console import Console

    from tpufleet.cli.chaos import result_table

    console = Console(width=200, record=True)
    console.print(result_table(_result(leaked_processes=[4242])))
    text = console.export_text()
    assert "chaos-1: attempt 3 failed (exit 1)" in text
    assert "4242" in text
    faults_row = next(line for line in text.splitlines() if line.strip().startswith("faults"))
    assert faults_row.split()[1] == "1" and "skipped 2" in faults_row
