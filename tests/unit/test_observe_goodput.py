"""Goodput arithmetic, table-driven: restarts, redone steps, gaps between attempts, jobs that never
report, a running attempt and a time window."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from tpufleet.observe import goodput


@dataclass(frozen=True)
class A:
    """An attempt as goodput reads it: admitted..ended, first step f at tf, last step l at tl."""

    attempt: int
    admitted_at: float
    ended_at: float | None
    first_step: int | None = None
    first_step_at: float | None = None
    last_step: int | None = None
    last_step_at: float | None = None


def reported(n: int, admitted: float, ended: float | None, f: int, tf: float, last: int, tl: float) -> A:
    return A(n, admitted, ended, f, tf, last, tl)


CASES = [
    # name, attempts, now, expected (held, productive, startup, wasted, idle, recovery, ratio)
    (
        "one attempt: 10 s start-up, 80 s of steps, 10 s checkpoint and exit",
        [reported(1, 0, 100, 1, 10, 80, 90)],
        100,
        (100, 80, 10, 0, 10, 0, 0.8),
    ),
    (
        "restart resumes from the checkpoint at step 50: steps 51..80 of attempt 1 were redone",
        # attempt 1: step 1 at t=10 .. step 80 at t=89 (1 step/s); ends at 90; back at 100,
        # first step 51 at 110, last step 100 at 159, ends at 160
        [reported(1, 0, 90, 1, 10, 80, 89), reported(2, 100, 160, 51, 110, 100, 159)],
        200,
        # attempt 1: startup 10, kept steps to 50 (t=59): productive 49, wasted 30 (59..89), idle 1
        # attempt 2: startup 10, productive 49, idle 1; recovery 10 (90..100)
        (150, 98, 20, 30, 2, 10, 98 / 150),
    ),
    (
        "restart from scratch (first step 1 again): the whole first attempt's progress was wasted",
        [reported(1, 0, 50, 1, 10, 41, 50), reported(2, 60, 110, 1, 70, 41, 110)],
        200,
        (100, 40, 20, 40, 0, 10, 0.4),
    ),
    (
        "a later attempt further ahead wastes nothing of the earlier one",
        [reported(1, 0, 50, 1, 10, 41, 50), reported(2, 50, 100, 42, 60, 82, 100)],
        200,
        (100, 80, 20, 0, 0, 0, 0.8),
    ),
    (
        "an attempt that never reached its first step was all start-up; the job's ratio still counts it",
        [A(1, 0, 30), reported(2, 40, 100, 1, 50, 51, 100)],
        200,
        (90, 50, 40, 0, 0, 10, 50 / 90),
    ),
    (
        "a job that reports no steps has held time but an unknown ratio",
        [A(1, 0, 30), A(2, 30, 60)],
        200,
        (60, 0, 60, 0, 0, 0, None),
    ),
    (
        "a running attempt counts to now; after its newest report it is idle",
        [reported(1, 0, None, 1, 20, 61, 80)],
        100,
        (100, 60, 20, 0, 20, 0, 0.6),
    ),
    (
        "reported times outside the attempt (a skewed host clock) are clamped to it",
        [reported(1, 100, 200, 1, 50, 11, 300)],
        300,
        (100, 100, 0, 0, 0, 0, 1.0),
    ),
]


@pytest.mark.parametrize(("name", "attempts", "now", "expected"), CASES, ids=[c[0] for c in CASES])
def test_goodput_table(name: str, attempts: list[A], now: float, expected: tuple[float, ...]) -> None:
    got = goodput.job_goodput(attempts, now)
    held, productive, startup, wasted, idle, recovery, ratio = expected
    assert got.held_s == pytest.approx(held)
    assert got.productive_s == pytest.approx(productive)
    assert got.startup_s == pytest.approx(startup)
    assert got.wasted_s == pytest.approx(wasted)
    assert got.idle_s == pytest.approx(idle)
    assert got.recovery_s == pytest.approx(recovery)
    assert got.ratio == (None if ratio is None else pytest.approx(ratio))
    assert got.productive_s + got.badput_s == pytest.approx(got.held_s)  # the parts add up


def test_a_window_counts_only_the_held_time_inside_it() -> None:
    attempts = [reported(1, 0, 100, 1, 10, 80, 90)]
    got = goodput.job_goodput(attempts, 100, since=50)
    assert (got.held_s, got.productive_s, got.startup_s, got.idle_s) == pytest.approx((50, 40, 0, 10))
    none = goodput.job_goodput(attempts, 300, since=200)
    assert none.held_s == 0 and none.ratio is None


def test_segments_are_in_order_and_cover_each_attempt() -> None:
    attempts = [reported(1, 0, 90, 1, 10, 80, 89), reported(2, 100, 160, 51, 110, 100, 159)]
    parts = goodput.segments(attempts, 200)
    assert [(s.attempt, s.kind) for s in parts] == [
        (1, "startup"), (1, "productive"), (1, "wasted"), (1, "idle"),
        (2, "startup"), (2, "productive"), (2, "idle"),
    ]  # fmt: skip
    for a in attempts:
        mine = [s for s in parts if s.attempt == a.attempt]
        assert mine[0].start == a.admitted_at and mine[-1].end == a.ended_at
        assert all(x.end == y.start for x, y in itertools.pairwise(mine))
    as_dict = goodput.job_goodput(attempts, 200).to_dict()
    assert as_dict["ratio"] == round(98 / 150, 4) and as_dict["badput_s"] == 52
