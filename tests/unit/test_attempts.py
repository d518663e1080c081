"""What happens next to one attempt (scheduler/attempts.py): every branch, as a table."""

from __future__ import annotations

import pytest

from tpufleet.scheduler.attempts import (
    GONE,
    SUCCEEDED_WHY,
    BeginStop,
    Launch,
    MarkLaunched,
    MarkRunning,
    Observed,
    Poll,
    Step,
    Stopping,
    Wait,
    after_launch,
    after_poll,
    next_step,
)
from tpufleet.scheduler.lifecycle import JobState, StopKind

A, S, R = JobState.ADMITTED, JobState.STARTING, JobState.RUNNING
TIMEOUT = 600.0
LATE = 100.0 + TIMEOUT + 1  # a clock past the start timeout of an attempt admitted at 100


@pytest.mark.parametrize(
    ("state", "stop", "admitted_at", "now", "starting", "step"),
    [
        # a stop on record goes on, whatever else holds (even past the timeout, even RUNNING)
        (A, StopKind.CANCEL, 100.0, LATE, (), Stopping(StopKind.CANCEL)),
        (R, StopKind.PREEMPT, 100.0, 200.0, (), Stopping(StopKind.PREEMPT)),
        # not started on every host in time: failed, naming the hosts the last poll saw starting
        (
            S,
            None,
            100.0,
            LATE,
            ("s/1",),
            BeginStop(StopKind.FAIL, "did not start on every host within 600 s (still starting: s/1)"),
        ),
        (A, None, 100.0, LATE, (), BeginStop(StopKind.FAIL, "did not start on every host within 600 s")),
        # a RUNNING attempt has no start timeout; neither has one with no admission time on record
        (R, None, 100.0, LATE, (), Poll()),
        (S, None, None, LATE, (), Poll()),
        # exactly at the timeout is still in time
        (A, None, 100.0, 100.0 + TIMEOUT, (), Launch()),
        (A, None, 100.0, 200.0, (), Launch()),
        (S, None, 100.0, 200.0, (), Poll()),
    ],
)
def test_next_step(
    state: JobState,
    stop: StopKind | None,
    admitted_at: float | None,
    now: float,
    starting: tuple[str, ...],
    step: Step,
) -> None:
    assert next_step(state, stop, admitted_at, now, TIMEOUT, starting) == step


def test_after_launch() -> None:
    assert after_launch(None) == MarkLaunched()
    assert after_launch("no such package") == BeginStop(StopKind.FAIL, "launch failed: no such package")
    long = after_launch("x" * 5000)
    assert isinstance(long, BeginStop) and len(long.why) == 2000


@pytest.mark.parametrize(
    ("state", "seen", "step"),
    [
        # no process known: failed; an interruption reported anyway still wins (a restart mid-launch)
        (S, Observed(present=False), BeginStop(StopKind.FAIL, GONE)),
        (S, Observed(present=False, interrupted="restarted"), BeginStop(StopKind.INTERRUPTED, "restarted")),
        # an interruption before a failure before success
        (R, Observed(True, "window", "host lost", True, True), BeginStop(StopKind.INTERRUPTED, "window")),
        (
            R,
            Observed(True, None, "host s/1 exited with code 3", True),
            BeginStop(StopKind.FAIL, "host s/1 exited with code 3"),
        ),
        (R, Observed(True, succeeded=True), BeginStop(StopKind.SUCCESS, SUCCEEDED_WHY)),
        # every host running: STARTING turns RUNNING, once
        (S, Observed(True, all_running=True), MarkRunning()),
        (R, Observed(True, all_running=True), Wait()),
        (S, Observed(True), Wait()),
    ],
)
def test_after_poll(state: JobState, seen: Observed, step: Step) -> None:
    assert after_poll(state, seen) == step


def test_the_loop_gets_the_same_answer_for_a_state_read_back_as_a_string() -> None:
    """The store hands the loop states as strings (SQL); the decisions compare equal to the enum."""
    assert next_step("ADMITTED", None, 100.0, 200.0, TIMEOUT) == Launch()  # type: ignore[arg-type]
    assert after_poll("STARTING", Observed(True, all_running=True)) == MarkRunning()  # type: ignore[arg-type]
