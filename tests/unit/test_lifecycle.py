"""Every legal and illegal transition of the job lifecycle, as a table."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tpufleet.scheduler import lifecycle as lc
from tpufleet.scheduler.lifecycle import (
    TERMINAL_STATES,
    AttemptState,
    IllegalTransition,
    JobState,
    Life,
    StopKind,
)

Q, A, S, R = JobState.QUEUED, JobState.ADMITTED, JobState.STARTING, JobState.RUNNING
OK, FAILED, CANCELLED = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED
ALL = list(JobState)

# (event, states it applies to, the state it leads to)
MOVES = [
    ("admit", {Q}, A),
    ("launched", {A}, S),
    ("running", {S}, R),
]


@pytest.mark.parametrize(("event", "legal", "target"), MOVES, ids=[m[0] for m in MOVES])
@pytest.mark.parametrize("state", ALL, ids=str)
def test_each_move_applies_only_to_its_state(
    event: str, legal: set[JobState], target: JobState, state: JobState
) -> None:
    move = getattr(lc, event)
    life = Life(state, attempt=2, reason_code="X", reason_message="old")
    if state in legal:
        assert move(life).state is target
    else:
        with pytest.raises(IllegalTransition, match=f"{event} does not apply to a {state} job"):
            move(life)


def test_admit_clears_the_old_reason_and_refuses_a_job_being_cancelled() -> None:
    life = lc.admit(Life(Q, attempt=2, reason_code="RETRYING", reason_message="attempt 1 failed"))
    assert (life.state, life.attempt, life.reason_code, life.reason_message) == (A, 2, None, None)
    with pytest.raises(IllegalTransition, match="cancel was requested"):
        lc.admit(Life(Q, cancel_requested=True))


@pytest.mark.parametrize("state", ALL, ids=str)
@pytest.mark.parametrize("kind", list(StopKind), ids=str)
def test_a_stop_applies_only_to_an_active_attempt(state: JobState, kind: StopKind) -> None:
    if state in lc.ACTIVE_STATES:
        life = lc.request_stop(Life(state), kind, "why")
        assert life is not None and (life.stop_kind, life.stop_message) == (kind, "why")
        assert life.preempting is (kind in (StopKind.PREEMPT, StopKind.PRIORITY))
        assert (
            life.reason_code
            == {
                StopKind.SUCCESS: None,
                StopKind.PREEMPT: "PREEMPTED",
                StopKind.PRIORITY: "PREEMPTED_BY_PRIORITY",
                StopKind.INTERRUPTED: "REQUEUED",
                StopKind.CANCEL: "CANCELLING",
                StopKind.FAIL: "ATTEMPT_FAILED",
                StopKind.PERMANENT: "ATTEMPT_FAILED",
                StopKind.SPOT: "PREEMPTED_BY_PROVIDER",
            }[kind]
        )
    else:
        with pytest.raises(IllegalTransition):
            lc.request_stop(Life(state), kind, "why")


# (the decision under way, a later one, which stands)
STOPS = [
    (
        first,
        later,
        later
        if later is StopKind.CANCEL
        and first in (StopKind.PREEMPT, StopKind.PRIORITY, StopKind.FAIL, StopKind.PERMANENT, StopKind.SPOT)
        else first,
    )
    for first in StopKind
    for later in StopKind
]


@pytest.mark.parametrize(("first", "later", "stands"), STOPS, ids=[f"{a}-then-{b}" for a, b, _ in STOPS])
def test_the_first_stop_decision_stands_unless_a_cancel_overrides_it(
    first: StopKind, later: StopKind, stands: StopKind
) -> None:
    life = lc.request_stop(Life(R), first, "first")
    assert life is not None
    after = lc.request_stop(life, later, "later")
    assert (after or life).stop_kind is stands
    assert (after is None) is (stands is first)


# (stop kind, failures so far, max retries) -> (next state, attempt, failures, attempt recorded as, reason)
ENDINGS = [
    (None, 0, 2, (OK, 1, 0, AttemptState.SUCCEEDED, None)),
    (StopKind.SUCCESS, 0, 2, (OK, 1, 0, AttemptState.SUCCEEDED, None)),
    (StopKind.CANCEL, 0, 2, (CANCELLED, 1, 0, AttemptState.CANCELLED, "CANCELLED")),
    (StopKind.PREEMPT, 2, 2, (Q, 2, 2, AttemptState.PREEMPTED, "PREEMPTED")),  # no retry used
    (StopKind.PRIORITY, 2, 2, (Q, 2, 2, AttemptState.PREEMPTED, "PREEMPTED_BY_PRIORITY")),  # no retry used
    (StopKind.INTERRUPTED, 2, 2, (Q, 2, 2, AttemptState.REQUEUED, "REQUEUED")),
    (StopKind.SPOT, 2, 2, (Q, 2, 2, AttemptState.PREEMPTED, "PREEMPTED_BY_PROVIDER")),  # no retry used
    (StopKind.FAIL, 0, 2, (Q, 2, 1, AttemptState.FAILED, "RETRYING")),
    (StopKind.FAIL, 1, 2, (Q, 2, 2, AttemptState.FAILED, "RETRYING")),
    (StopKind.FAIL, 2, 2, (FAILED, 1, 3, AttemptState.FAILED, "FAILED")),
    (StopKind.FAIL, 0, 0, (FAILED, 1, 1, AttemptState.FAILED, "FAILED")),
    (StopKind.PERMANENT, 0, 2, (FAILED, 1, 1, AttemptState.FAILED, "FAILED")),  # retries left, none used
]


@pytest.mark.parametrize(("kind", "failures", "retries", "expected"), ENDINGS)
def test_how_an_ended_attempt_moves_the_job_on(
    kind: StopKind | None, failures: int, retries: int, expected: tuple[object, ...]
) -> None:
    life = Life(R, attempt=1, failures=failures, max_retries=retries, stop_kind=kind, stop_message="m")
    after, recorded = lc.end_attempt(life)
    assert (after.state, after.attempt, after.failures, recorded, after.reason_code) == expected
    assert (after.stop_kind, after.stop_message, after.preempting) == (None, None, False)


@pytest.mark.parametrize(
    ("kind", "failures", "then"),
    [
        (StopKind.FAIL, 0, "then the job is requeued (retry 1 of 2)"),
        (StopKind.FAIL, 1, "then the job is requeued (retry 2 of 2)"),
        (StopKind.FAIL, 2, "then the job fails (no retries left, max_retries=2)"),
        (StopKind.PERMANENT, 0, "then the job fails (not retried: running it again cannot help)"),
    ],
)
def test_a_failed_attempt_being_stopped_says_so_and_what_comes_next(
    kind: StopKind, failures: int, then: str
) -> None:
    life = lc.request_stop(Life(R, attempt=3, failures=failures, max_retries=2), kind, "host 1 lost")
    assert life is not None and (life.state, life.stop_message) == (R, "host 1 lost")
    stopping = "attempt 3 failed (host 1 lost); stopping its processes on every host"
    assert life.reason_message == f"{stopping}, {then}"
    after, _ = lc.end_attempt(life)  # once ended, the reason is the ending's own
    assert after.reason_message is not None and "stopping" not in after.reason_message


def test_a_permanent_failure_says_it_was_not_retried() -> None:
    life = Life(R, attempt=1, stop_kind=StopKind.PERMANENT, stop_message="pyhton: command not found")
    after, _ = lc.end_attempt(life)
    assert after.reason_message == "attempt 1 failed: pyhton: command not found; not retried"


@pytest.mark.parametrize("state", [Q, OK, FAILED, CANCELLED], ids=str)
def test_only_an_active_attempt_can_end(state: JobState) -> None:
    with pytest.raises(IllegalTransition):
        lc.end_attempt(Life(state, stop_kind=StopKind.FAIL))


# state -> what a cancel does: the next state and whether cancel_requested is set, or an error
CANCELS = {
    Q: (CANCELLED, True),
    A: (A, True),
    S: (S, True),
    R: (R, True),
    CANCELLED: (CANCELLED, False),
    OK: None,
    FAILED: None,
}


@pytest.mark.parametrize("state", ALL, ids=str)
def test_a_cancel_ends_a_queued_job_marks_an_active_one_and_refuses_a_finished_one(state: JobState) -> None:
    expected = CANCELS[state]
    if expected is None:
        with pytest.raises(IllegalTransition, match="already ended"):
            lc.request_cancel(Life(state))
        return
    after = lc.request_cancel(Life(state))
    assert (after.state, after.cancel_requested) == expected
    assert lc.request_cancel(after) == after  # asking twice changes nothing


def test_a_whole_life_preempted_then_failed_then_succeeded() -> None:
    life = lc.running(lc.launched(lc.admit(Life(Q, max_retries=1))))
    life, rec = lc.end_attempt(lc.request_stop(life, StopKind.PREEMPT, "for job b") or life)
    assert (life.state, life.attempt, life.failures, rec) == (Q, 2, 0, AttemptState.PREEMPTED)
    life = lc.running(lc.launched(lc.admit(life)))
    life, rec = lc.end_attempt(lc.request_stop(life, StopKind.FAIL, "host lost") or life)
    assert (life.state, life.attempt, life.failures) == (Q, 3, 1)
    life = lc.running(lc.launched(lc.admit(life)))
    life, rec = lc.end_attempt(replace(life))
    assert (life.state, rec, life.reason_code) == (OK, AttemptState.SUCCEEDED, None)


def test_job_kinds_and_terminal_states_are_defined_once_and_keep_their_stored_spelling() -> None:
    """The store, the API and the CLI compare these with strings read back from SQL and JSON: the
    enum's values are those strings, and every derived tuple keeps the lifecycle's order (the API's
    'use one of ...' messages list them so)."""
    import json

    from tpufleet.chaos.verdict import TERMINAL as CHAOS_TERMINAL
    from tpufleet.control.store import values
    from tpufleet.scheduler.lifecycle import JobKind

    assert json.dumps([JobKind.SPMD, JobKind.RAY]) == '["spmd", "ray"]'
    assert values.JOB_KINDS == ("spmd", "ray") and JobKind("ray") is JobKind.RAY
    assert values.TERMINAL == CHAOS_TERMINAL == ("SUCCEEDED", "FAILED", "CANCELLED")
    assert set(values.TERMINAL) == TERMINAL_STATES
