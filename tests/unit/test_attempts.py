"""What happens next to one attempt (scheduler/attempts.py): every branch, as a table."""

from __future__ import annotations

import pytest

from tpufleet.scheduler.attempts import (
    CANCELLED_WHY,
    CANNOT_START_SETTLE_S,
    GONE,
    GONE_AT_RESTART,
    INTERRUPTED_AT_RESTART,
    MAX_STOP_TRIES,
    SUCCEEDED_WHY,
    Adopt,
    BeginStop,
    Finish,
    Graces,
    Launch,
    MarkLaunched,
    MarkRunning,
    Observed,
    Poll,
    Step,
    Stopping,
    Wait,
    after_adopt,
    after_error,
    after_launch,
    after_poll,
    after_stop,
    next_step,
    on_inventory,
    on_restart,
)
from tpufleet.scheduler.lifecycle import JobState, StopKind

A, S, R = JobState.ADMITTED, JobState.STARTING, JobState.RUNNING
K = StopKind
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


F127 = "host s/0 exited with code 127"
NOT_FOUND = "pyhton: command not found or could not start (exit 127 on every host)"


@pytest.mark.parametrize(
    ("seen", "step"),
    [
        # every host exited 127 (or 126): the command cannot run anywhere; failed for good, no retry
        (Observed(True, failure=F127, hosts=2, exited=(127, 127)), BeginStop(K.PERMANENT, NOT_FOUND)),
        (
            Observed(True, failure="host s/0 exited with code 126", hosts=1, exited=(126,)),
            BeginStop(K.PERMANENT, "pyhton: not executable (exit 126 on every host)"),
        ),
        (
            Observed(True, failure=F127, hosts=2, exited=(127, 126)),
            BeginStop(
                K.PERMANENT,
                "pyhton: not executable or command not found or could not start (exit 126/127 on every host)",
            ),
        ),
        # one host 127, the others a moment behind: wait for them, up to the settle time
        (Observed(True, failure=F127, hosts=3, exited=(127,), unfinished=2), Wait()),
        (
            Observed(
                True, failure=F127, hosts=3, exited=(127,), unfinished=2, failing_s=CANNOT_START_SETTLE_S
            ),
            BeginStop(K.FAIL, F127),
        ),
        # not on every host: an ordinary failure, retried
        (Observed(True, failure=F127, hosts=2, exited=(127, 0)), BeginStop(K.FAIL, F127)),
        (Observed(True, failure=F127, hosts=2, exited=(127, 1)), BeginStop(K.FAIL, F127)),
        # a host lost, or one its host ended for a reason of its own: not in ``exited``
        (Observed(True, failure=F127, hosts=2, exited=(127,)), BeginStop(K.FAIL, F127)),
        (
            Observed(True, failure="host s/0 exited with code 3", hosts=1, exited=(3,)),
            BeginStop(K.FAIL, "host s/0 exited with code 3"),
        ),
    ],
)
def test_a_command_that_cannot_run_on_any_host_is_not_retried(seen: Observed, step: Step) -> None:
    assert after_poll(R, seen, "pyhton") == step


@pytest.mark.parametrize(
    ("state", "stop", "found", "step"),
    [
        # a stop on record is issued again at the job's turn, found or not
        (R, K.PREEMPT, True, Wait()),
        (S, K.FAIL, False, Wait()),
        (A, K.CANCEL, True, Wait()),
        # a launch begun but never recorded: ask its hosts; one never begun is launched at its turn
        (A, None, True, Adopt()),
        (A, None, False, Wait()),
        # launched (or running) before the restart and gone since: failed
        (S, None, False, BeginStop(K.FAIL, GONE_AT_RESTART)),
        (R, None, False, BeginStop(K.FAIL, GONE_AT_RESTART)),
        # still there: adopted, polled at its turn
        (S, None, True, Wait()),
        (R, None, True, Wait()),
    ],
)
def test_on_restart(state: JobState, stop: StopKind | None, found: bool, step: Step) -> None:
    assert on_restart(state, stop, found) == step


def test_after_adopt() -> None:
    """A launch cut short by the restart is not the job's doing: requeued without using a retry."""
    assert after_adopt(lost=False) == MarkLaunched()
    assert after_adopt(lost=True) == BeginStop(K.INTERRUPTED, INTERRUPTED_AT_RESTART)


@pytest.mark.parametrize(
    ("cancel", "slices", "broken", "step"),
    [
        (False, ("s0",), {}, Wait()),
        (False, ("s0", "s1"), {"s9": ["gone"]}, Wait()),  # someone else's slice
        # a cancel before a broken slice (a cancel overrides a failure under way anyway)
        (True, ("s0",), {"s0": ["host 1 down"]}, BeginStop(K.CANCEL, CANCELLED_WHY)),
        (True, (), {}, BeginStop(K.CANCEL, CANCELLED_WHY)),
        # the first broken slice in the job's order, with every problem it has
        (
            False,
            ("s0", "s1", "s2"),
            {"s2": ["x"], "s1": ["host 0 down", "host 3 down"]},
            BeginStop(K.FAIL, "slice s1 is broken (host 0 down; host 3 down)"),
        ),
    ],
)
def test_on_inventory(
    cancel: bool, slices: tuple[str, ...], broken: dict[str, list[str]], step: Step
) -> None:
    assert on_inventory(cancel, slices, broken) == step


@pytest.mark.parametrize(
    ("kind", "error", "failures", "step"),
    [
        # every process ended: the attempt ends as its stop kind says, whatever failed before
        (K.SUCCESS, None, 0, Finish(K.SUCCESS)),
        (K.CANCEL, None, MAX_STOP_TRIES - 1, Finish(K.CANCEL)),
        # a stop that failed is issued again, up to MAX_STOP_TRIES; then the attempt ends anyway
        (K.FAIL, "runner gone", 1, Wait()),
        (K.PREEMPT, "timeout", MAX_STOP_TRIES - 1, Wait()),
        (K.PREEMPT, "timeout", MAX_STOP_TRIES, Finish(K.PREEMPT, "timeout")),
    ],
)
def test_after_stop(kind: StopKind, error: str | None, failures: int, step: Step) -> None:
    assert after_stop(kind, error, failures) == step


def test_after_error() -> None:
    assert after_error("KeyError: 'x'") == BeginStop(
        K.FAIL, "the control plane could not handle this attempt (KeyError: 'x')"
    )
    long = after_error("x" * 5000)
    assert isinstance(long, BeginStop) and len(long.why) == 2000


@pytest.mark.parametrize(
    ("kind", "grace"),
    [
        # reclaimed (by the policy or the provider): the long grace, to checkpoint
        (K.PREEMPT, 30.0),
        (K.PRIORITY, 30.0),
        (K.SPOT, 30.0),
        (K.CANCEL, 10.0),
        # the rest get the failure's
        (K.FAIL, 5.0),
        (K.PERMANENT, 5.0),
        (K.SUCCESS, 5.0),
        (K.INTERRUPTED, 5.0),
    ],
)
def test_each_stop_kind_has_its_grace(kind: StopKind, grace: float) -> None:
    assert Graces(preempt_s=30.0, cancel_s=10.0, fail_s=5.0).of(kind) == grace


def test_the_loop_gets_the_same_answer_for_a_state_read_back_as_a_string() -> None:
    """The store hands the loop states as strings (SQL); the decisions compare equal to the enum."""
    assert next_step("ADMITTED", None, 100.0, 200.0, TIMEOUT) == Launch()  # type: ignore[arg-type]
    assert after_poll("STARTING", Observed(True, all_running=True)) == MarkRunning()  # type: ignore[arg-type]
    assert on_restart("ADMITTED", None, True) == Adopt()  # type: ignore[arg-type]
