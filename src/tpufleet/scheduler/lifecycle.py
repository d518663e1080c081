"""The job lifecycle: states, stop kinds and the legal transitions, as pure functions.

One home for what a job may do next, shared by the store (which applies the results with a
compare-and-set on the state), the service (which only routes events), the API and CLI (which
validate and show states) and the simulator (which drives the same functions on a fake clock)::

    QUEUED ─admit─▶ ADMITTED ─launched─▶ STARTING ─running─▶ RUNNING
       │                  └──────────────┴──── request_stop(kind) ──┘   (the decision is written)
       │                                           │
       │                                     end_attempt (after every process ended)
       │                                           ▼
       │         success ▶ SUCCEEDED   cancel ▶ CANCELLED   fail ▶ QUEUED (attempt + 1) or FAILED
       │         permanent (it cannot succeed by running again) ▶ FAILED, no retry
       │         preempt / spot / interrupted ▶ QUEUED (attempt + 1, no retry used)
       └─request_cancel─▶ CANCELLED

A :class:`Life` is the part of a job the lifecycle reads and writes; every function returns the
next ``Life`` (and what an ended attempt is recorded as) or raises :class:`IllegalTransition`.
Nothing here reads a clock, does I/O or imports Ray.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

__all__ = [
    "ACTIVE_STATES",
    "TERMINAL_STATES",
    "AttemptState",
    "IllegalTransition",
    "JobKind",
    "JobState",
    "Life",
    "ReasonCode",
    "SliceState",
    "StopKind",
    "admit",
    "end_attempt",
    "launched",
    "request_cancel",
    "request_stop",
    "running",
]


class JobKind(StrEnum):
    """How a job runs on its slices: the stored and JSON value is the string."""

    SPMD = "spmd"  # the command on every host of every slice
    RAY = "ray"  # one Ray driver through Ray's job submission, steered onto the slices (docs/ray-jobs.md)


class JobState(StrEnum):
    QUEUED = "QUEUED"
    ADMITTED = "ADMITTED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


#: States in which a job holds slices and counts towards its tenant's usage.
ACTIVE_STATES = frozenset({JobState.ADMITTED, JobState.STARTING, JobState.RUNNING})
TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


class SliceState(StrEnum):
    FREE = "FREE"
    HELD = "HELD"
    BROKEN = "BROKEN"
    DRAINING = "DRAINING"


class StopKind(StrEnum):
    """Why the current attempt is being ended; decides what happens once it has."""

    SUCCESS = "success"  # every host exited 0
    PREEMPT = "preempt"  # the policy reclaims borrowed slices: requeued, no retry used
    PRIORITY = "priority"  # a higher-priority job of its own tenant needs its slices: requeued, no retry used
    # tpufleet cut it short, not the job (a control-plane restart during its launch; a Ray job's
    # trainer placed on a slice that came back during its window): requeued, no retry used
    INTERRUPTED = "interrupted"
    SPOT = "spot"  # the provider takes the slice back (a spot preemption notice): requeued, no retry used
    CANCEL = "cancel"  # a user asked
    FAIL = "fail"  # a host failed or was lost, the launch failed or timed out: a retry, if any is left
    # the job cannot succeed by running again (its command was not found or not executable on any
    # host: exit 127 or 126 on every host; attempts.after_poll): FAILED at once, no retry
    PERMANENT = "permanent"


class AttemptState(StrEnum):
    """An attempt while it runs, then how it ended (the ``attempts`` table's ``state``)."""

    ADMITTED = "ADMITTED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    PREEMPTED = "PREEMPTED"
    REQUEUED = "REQUEUED"  # ended by tpufleet itself (StopKind.INTERRUPTED), not by the job
    CANCELLED = "CANCELLED"


class ReasonCode(StrEnum):
    """Reason codes the lifecycle puts on a job (the policy's wait reasons are ``NotFitCode``)."""

    PREEMPTED = "PREEMPTED"
    REQUEUED = "REQUEUED"
    CANCELLING = "CANCELLING"
    ATTEMPT_FAILED = "ATTEMPT_FAILED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    RETRYING = "RETRYING"
    PREEMPTED_BY_PRIORITY = "PREEMPTED_BY_PRIORITY"  # for a higher-priority job of its tenant; no retry used
    PREEMPTED_BY_PROVIDER = "PREEMPTED_BY_PROVIDER"  # a spot slice was taken back; requeued, no retry used


class IllegalTransition(Exception):
    """The event does not apply to a job in this state (the caller decides what that means)."""


@dataclass(frozen=True)
class Life:
    """The part of a job the lifecycle reads and writes."""

    state: JobState
    attempt: int = 1
    failures: int = 0  # failed attempts, counted against max_retries
    max_retries: int = 2
    stop_kind: StopKind | None = None  # set while the current attempt is being ended
    stop_message: str | None = None
    cancel_requested: bool = False
    preempting: bool = False
    reason_code: str | None = None
    reason_message: str | None = None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


def _need(life: Life, *states: JobState, event: str) -> None:
    if life.state not in states:
        raise IllegalTransition(f"{event} does not apply to a {life.state} job")


def admit(life: Life) -> Life:
    """QUEUED -> ADMITTED: the policy placed the current attempt; any old reason is cleared."""
    _need(life, JobState.QUEUED, event="admit")
    if life.cancel_requested:
        raise IllegalTransition("admit does not apply to a job whose cancel was requested")
    return replace(
        life,
        state=JobState.ADMITTED,
        stop_kind=None,
        stop_message=None,
        reason_code=None,
        reason_message=None,
    )


def launched(life: Life) -> Life:
    """ADMITTED -> STARTING: every host was asked to start."""
    _need(life, JobState.ADMITTED, event="launched")
    return replace(life, state=JobState.STARTING)


def running(life: Life) -> Life:
    """STARTING -> RUNNING: every host runs."""
    _need(life, JobState.STARTING, event="running")
    return replace(life, state=JobState.RUNNING)


_STOP_REASONS = {
    StopKind.PREEMPT: ReasonCode.PREEMPTED,
    StopKind.PRIORITY: ReasonCode.PREEMPTED_BY_PRIORITY,
    StopKind.INTERRUPTED: ReasonCode.REQUEUED,
    StopKind.CANCEL: ReasonCode.CANCELLING,
    StopKind.FAIL: ReasonCode.ATTEMPT_FAILED,
    StopKind.PERMANENT: ReasonCode.ATTEMPT_FAILED,
    StopKind.SPOT: ReasonCode.PREEMPTED_BY_PROVIDER,
}
_OVERRIDDEN_BY_CANCEL = (
    StopKind.PREEMPT,
    StopKind.PRIORITY,
    StopKind.FAIL,
    StopKind.PERMANENT,
    StopKind.SPOT,
)
_POLICY_PREEMPTIONS = (StopKind.PREEMPT, StopKind.PRIORITY)  # the slices are promised to another job
_REQUEUED = {  # not the job's fault: requeued without using a retry, recorded as
    StopKind.PREEMPT: AttemptState.PREEMPTED,
    StopKind.PRIORITY: AttemptState.PREEMPTED,
    StopKind.SPOT: AttemptState.PREEMPTED,
    StopKind.INTERRUPTED: AttemptState.REQUEUED,
}


def request_stop(life: Life, kind: StopKind, message: str) -> Life | None:
    """Decide to end the current attempt. The first decision stands, except that a cancel
    overrides a preemption (the policy's or the provider's) or a failure under way; returns None
    when this one does not change it."""
    _need(life, *ACTIVE_STATES, event=f"stop ({kind})")
    overrides = kind is StopKind.CANCEL and life.stop_kind in _OVERRIDDEN_BY_CANCEL
    if life.stop_kind is not None and not overrides:
        return None
    reason = _STOP_REASONS.get(kind)
    shown = _failing(life, kind, message) if kind in (StopKind.FAIL, StopKind.PERMANENT) else message
    return replace(
        life,
        stop_kind=kind,
        stop_message=message,
        preempting=life.preempting or kind in _POLICY_PREEMPTIONS,
        reason_code=str(reason) if reason else life.reason_code,
        reason_message=shown if reason else life.reason_message,
    )


def _failing(life: Life, kind: StopKind, message: str) -> str:
    """The reason a job shows while its failed attempt is being stopped (it is still in its active
    state until every process has ended, which takes up to the failure's grace period): what
    failed, that the rest of the attempt is being stopped, and what comes next."""
    if kind is StopKind.PERMANENT:
        then = "then the job fails (not retried: running it again cannot help)"
    elif life.failures + 1 > life.max_retries:
        then = f"then the job fails (no retries left, max_retries={life.max_retries})"
    else:
        then = f"then the job is requeued (retry {life.failures + 1} of {life.max_retries})"
    return f"attempt {life.attempt} failed ({message}); stopping its processes on every host, {then}"


def request_cancel(life: Life) -> Life:
    """A user's cancel: a queued job ends at once; an active one is marked (the loop stops it)."""
    if life.state in (JobState.SUCCEEDED, JobState.FAILED):
        raise IllegalTransition(f"the job already ended ({life.state}); nothing to cancel")
    if life.state is JobState.CANCELLED or life.cancel_requested:
        return life
    if life.state is JobState.QUEUED:
        return replace(
            life,
            state=JobState.CANCELLED,
            cancel_requested=True,
            reason_code=str(ReasonCode.CANCELLED),
            reason_message="cancelled by request",
        )
    return replace(life, cancel_requested=True)


def end_attempt(life: Life) -> tuple[Life, AttemptState]:
    """After every process of the current attempt ended: the job's next state, and how the
    attempt is recorded. No stop kind means the attempt succeeded."""
    _need(life, *ACTIVE_STATES, event="end_attempt")
    kind, message = life.stop_kind, life.stop_message
    done = replace(life, stop_kind=None, stop_message=None, preempting=False)
    if kind in (None, StopKind.SUCCESS):
        return replace(
            done, state=JobState.SUCCEEDED, reason_code=None, reason_message=None
        ), AttemptState.SUCCEEDED
    if kind is StopKind.CANCEL:
        cancelled = replace(
            done,
            state=JobState.CANCELLED,
            reason_code=str(ReasonCode.CANCELLED),
            reason_message="cancelled by request",
        )
        return cancelled, AttemptState.CANCELLED
    requeued_as = _REQUEUED.get(kind) if kind is not None else None
    if kind is not None and requeued_as is not None:  # not the job's fault: no retry used
        code = _STOP_REASONS[kind]
        requeued = replace(
            done,
            state=JobState.QUEUED,
            attempt=life.attempt + 1,
            reason_code=str(code),
            reason_message=f"requeued after attempt {life.attempt}: {message}",
        )
        return requeued, requeued_as
    failures = life.failures + 1
    if kind is StopKind.PERMANENT:  # running it again cannot help: no retry, whatever is left
        failed = replace(
            done,
            state=JobState.FAILED,
            failures=failures,
            reason_code=str(ReasonCode.FAILED),
            reason_message=f"attempt {life.attempt} failed: {message}; not retried",
        )
        return failed, AttemptState.FAILED
    if failures > life.max_retries:
        failed = replace(
            done,
            state=JobState.FAILED,
            failures=failures,
            reason_code=str(ReasonCode.FAILED),
            reason_message=f"attempt {life.attempt} failed ({message}); "
            f"no retries left (max_retries={life.max_retries})",
        )
        return failed, AttemptState.FAILED
    retry = replace(
        done,
        state=JobState.QUEUED,
        attempt=life.attempt + 1,
        failures=failures,
        reason_code=str(ReasonCode.RETRYING),
        reason_message=f"attempt {life.attempt} failed ({message}); retry {failures} of {life.max_retries}",
    )
    return retry, AttemptState.FAILED
