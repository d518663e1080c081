"""What happens next to one attempt: decided here, purely; the loop writes it, then acts.

The lifecycle (``lifecycle.py``) says which transitions are legal; this says which one an attempt
takes, from what the loop knows of it: its job's state, the stop already on record, when it was
admitted, the clock (an argument), what its hosts said (:class:`Observed`) and how its stop went.
Each question the loop asks is one function answering with one :data:`Step`:

- :func:`on_restart`: once, after a (re)start, for each attempt the store says is active: one the
  cluster no longer runs is failed; a launch begun but never recorded is adopted
  (:class:`Adopt`, then :func:`after_adopt`).
- :func:`on_inventory`: at the start of every cycle, before the policy runs: a cancel asked for,
  or a broken slice under the attempt, begins a stop.
- :func:`next_step`: at the job's turn. A recorded stop goes on (:class:`Stopping`); an attempt
  that did not start on every host within the start timeout is failed (:class:`BeginStop`); an
  admitted one is launched (:class:`Launch`); any other is polled (:class:`Poll`).
- :func:`after_launch`: once a launch returned: the job turns STARTING (:class:`MarkLaunched`), or a
  launch that failed fails the attempt.
- :func:`after_poll`: from the hosts' status: requeue without a retry (``INTERRUPTED``), fail,
  fail for good (``PERMANENT``: the command was not found or not executable on any host, exit
  127 or 126 on every host, see :data:`CANNOT_START`), succeed, mark RUNNING when every host runs
  (:class:`MarkRunning`), or :class:`Wait`.
- :func:`after_stop`: once a stop returned: :class:`Finish` (the attempt ends as its stop kind
  says), or, for a stop that failed fewer than ``MAX_STOP_TRIES`` times, :class:`Wait` (it is
  issued again next turn).
- :func:`after_error`: anything the loop could not handle for this attempt fails it.

A :class:`BeginStop` is written first (``Transitions.begin_stop``, a compare-and-set that loses to
a cancel or preemption already on record) and only then is the stop issued: a control plane killed
between the two finds the stop on record and issues it after its restart. How long a stopped
attempt's processes get between SIGTERM and SIGKILL is :meth:`Graces.of` its stop kind. Nothing
here reads a clock, does I/O or imports Ray.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tpufleet.scheduler.lifecycle import JobState, StopKind

__all__ = [
    "CANCELLED_WHY",
    "CANNOT_START",
    "CANNOT_START_SETTLE_S",
    "GONE",
    "GONE_AT_RESTART",
    "INTERRUPTED_AT_RESTART",
    "MAX_STOP_TRIES",
    "SUCCEEDED_WHY",
    "Adopt",
    "BeginStop",
    "Finish",
    "Graces",
    "Launch",
    "MarkLaunched",
    "MarkRunning",
    "Observed",
    "Poll",
    "Step",
    "Stopping",
    "Wait",
    "after_adopt",
    "after_error",
    "after_launch",
    "after_poll",
    "after_stop",
    "next_step",
    "on_inventory",
    "on_restart",
]

GONE = "its processes are gone (no runners found)"
GONE_AT_RESTART = "its processes were gone when the control plane restarted"
INTERRUPTED_AT_RESTART = "the control plane restarted while launching this attempt; requeued"
CANCELLED_WHY = "cancelled by request"
SUCCEEDED_WHY = "every host exited with code 0"
MAX_WHY = 2000  # characters of a reason kept on the job
MAX_STOP_TRIES = 3  # a stop that keeps failing ends the attempt anyway: the job must not hold its slices
# Exit codes that say the command could not be run at all (the shell's, and ``host/jobstart.py``'s):
# on every host of an attempt, running it again cannot help, so the job fails without a retry.
CANNOT_START = {126: "not executable", 127: "command not found or could not start"}
# A host exited with one of them while others still start or run: how long (seconds since a poll
# first saw it) the others get to exit the same way before it counts as an ordinary failure.
CANNOT_START_SETTLE_S = 10.0


@dataclass(frozen=True)
class Launch:
    """Start the attempt on its hosts (off the loop); the job stays ADMITTED until it returned."""


@dataclass(frozen=True)
class Poll:
    """Ask the cluster how the attempt's hosts are doing, then :func:`after_poll`."""


@dataclass(frozen=True)
class Stopping:
    """A stop is on record (``kind``): issue it once, finish the attempt when it returned."""

    kind: StopKind


@dataclass(frozen=True)
class BeginStop:
    """Write a stop of ``kind`` with ``why`` (if no other stop won the race), then as :class:`Stopping`."""

    kind: StopKind
    why: str


@dataclass(frozen=True)
class MarkLaunched:
    """The launch returned: ADMITTED -> STARTING."""


@dataclass(frozen=True)
class MarkRunning:
    """Every host runs: STARTING -> RUNNING."""


@dataclass(frozen=True)
class Adopt:
    """After a restart: the previous control plane began this launch but never recorded it; ask
    the hosts whether every one got it (then :func:`after_adopt`)."""


@dataclass(frozen=True)
class Finish:
    """The stop returned: end the attempt with each host's final state and free its slices
    (``Transitions.finish``). The outcome is the stop ``kind``'s (``lifecycle.end_attempt``):
    SUCCESS -> SUCCEEDED, CANCEL -> CANCELLED, PREEMPT, PRIORITY, SPOT and INTERRUPTED -> QUEUED
    without using a retry, FAIL -> QUEUED with a retry, or FAILED when none is left.
    ``stop_error``: the stop itself failed ``MAX_STOP_TRIES`` times and the attempt ends anyway."""

    kind: StopKind
    stop_error: str | None = None


@dataclass(frozen=True)
class Wait:
    """Nothing to do this cycle."""


Step = Launch | Poll | Stopping | BeginStop | MarkLaunched | MarkRunning | Adopt | Finish | Wait


@dataclass(frozen=True)
class Graces:
    """Seconds from SIGTERM (the checkpoint signal) to SIGKILL for a stopped attempt's processes."""

    preempt_s: float  # reclaimed by the policy, or the provider's spot notice (the slice dies anyway)
    cancel_s: float
    fail_s: float  # the surviving hosts of a failed attempt; also a success's or an interruption's

    def of(self, kind: StopKind) -> float:
        if kind in (StopKind.PREEMPT, StopKind.PRIORITY, StopKind.SPOT):
            return self.preempt_s
        if kind is StopKind.CANCEL:
            return self.cancel_s
        return self.fail_s


@dataclass(frozen=True)
class Observed:
    """What the hosts of an attempt said when polled (``AttemptStatus``, as far as the decision goes).
    ``present`` is False when the cluster knows no process of it (no runner, no host); an
    ``interrupted`` it reports anyway still wins."""

    present: bool
    interrupted: str | None = None  # tpufleet cut it short (e.g. a restart mid-launch): requeue
    failure: str | None = None  # why a host failed or was lost
    succeeded: bool = False  # every host exited 0
    all_running: bool = False
    hosts: int = 0  # hosts of the attempt
    exited: tuple[int, ...] = ()  # exit codes of the hosts that ended by themselves (not lost, not
    # ended by their host for a reason of its own such as a limit)
    unfinished: int = 0  # hosts still starting or running
    failing_s: float = 0.0  # seconds since a poll first saw ``failure``


def on_restart(state: JobState, stop: StopKind | None, found: bool) -> Step:
    """After a (re)start, for an attempt the store says is active; ``found``: the cluster still
    runs it (``ClusterClient.adopt``). Only :class:`Adopt` and :class:`BeginStop` are answers to
    act on now; a stop on record, a launch never begun and a found attempt go on at their turn."""
    if stop is not None:
        return Wait()  # issued again at its turn (next_step: Stopping)
    if state == JobState.ADMITTED:
        return Adopt() if found else Wait()  # not found: launched at its turn
    if not found:
        return BeginStop(StopKind.FAIL, GONE_AT_RESTART)
    return Wait()


def after_adopt(lost: bool) -> Step:
    """A launch begun before the restart: adopted when every host got it; cut short (a host
    missing, ``lost``) it is ended and requeued without using a retry, since the job did nothing
    wrong."""
    return BeginStop(StopKind.INTERRUPTED, INTERRUPTED_AT_RESTART) if lost else MarkLaunched()


def on_inventory(cancel_requested: bool, slices: Sequence[str], broken: Mapping[str, Sequence[str]]) -> Step:
    """At the start of a cycle, before the policy runs: a cancel asked for, else the first of the
    attempt's slices that is broken (``broken``: each broken slice's problems) begins a stop. Only
    written then (the policy sees it); the stop is issued at the job's turn."""
    if cancel_requested:
        return BeginStop(StopKind.CANCEL, CANCELLED_WHY)
    for name in slices:
        if name in broken:
            return BeginStop(StopKind.FAIL, f"slice {name} is broken ({'; '.join(broken[name])})")
    return Wait()


def next_step(
    state: JobState,
    stop: StopKind | None,
    admitted_at: float | None,
    now: float,
    start_timeout_s: float,
    starting: tuple[str, ...] = (),
) -> Step:
    """The attempt's step at the start of its turn. ``starting``: the hosts (``slice/worker``) the
    last poll saw still starting, named in a timeout's reason."""
    if stop is not None:
        return Stopping(stop)
    if state != JobState.RUNNING and admitted_at is not None and now - admitted_at > start_timeout_s:
        still = f" (still starting: {', '.join(starting)})" if starting else ""
        return BeginStop(StopKind.FAIL, f"did not start on every host within {start_timeout_s:g} s{still}")
    if state == JobState.ADMITTED:
        return Launch()
    return Poll()


def after_launch(error: str | None) -> Step:
    """A launch returned: ``error`` is its one-line failure, None when every host was started."""
    if error is None:
        return MarkLaunched()
    return BeginStop(StopKind.FAIL, f"launch failed: {error}"[:MAX_WHY])


def after_poll(state: JobState, seen: Observed, program: str = "") -> Step:
    """What the hosts said decides: an interruption before a failure (hosts gone included) before
    success. ``program``: the job's command word, named when it could not be run (:func:`_failed`)."""
    if seen.interrupted is not None:
        return BeginStop(StopKind.INTERRUPTED, seen.interrupted)
    if not seen.present:
        return BeginStop(StopKind.FAIL, GONE)
    if seen.failure is not None:
        return _failed(seen, program)
    if seen.succeeded:
        return BeginStop(StopKind.SUCCESS, SUCCEEDED_WHY)
    if seen.all_running and state == JobState.STARTING:
        return MarkRunning()
    return Wait()


def _failed(seen: Observed, program: str) -> Step:
    """A host failed. Every host exited 126 or 127 (:data:`CANNOT_START`): the command cannot be run,
    and a retry would fail the same way: a ``PERMANENT`` stop naming ``program``. Some did while the
    others still start or run: :class:`Wait` for them, up to :data:`CANNOT_START_SETTLE_S` (they
    are usually a moment behind). Anything else (a host lost, another code) is an ordinary failure."""
    assert seen.failure is not None
    codes = set(seen.exited)
    if not codes or not codes <= CANNOT_START.keys() or len(seen.exited) + seen.unfinished != seen.hosts:
        return BeginStop(StopKind.FAIL, seen.failure)
    if seen.unfinished:
        return Wait() if seen.failing_s < CANNOT_START_SETTLE_S else BeginStop(StopKind.FAIL, seen.failure)
    what = " or ".join(CANNOT_START[c] for c in sorted(codes))
    exits = "/".join(str(c) for c in sorted(codes))
    name = " ".join((program or "the command").split())[:200]
    return BeginStop(StopKind.PERMANENT, f"{name}: {what} (exit {exits} on every host)")


def after_stop(kind: StopKind, error: str | None, failures: int) -> Step:
    """A stop of ``kind`` returned; ``error``: how it failed (None when every process ended),
    ``failures``: how many times it failed so far, this one included."""
    if error is None:
        return Finish(kind)
    if failures < MAX_STOP_TRIES:
        return Wait()  # issued again at the job's next turn
    return Finish(kind, error)


def after_error(error: str) -> Step:
    """Anything the loop could not handle for this attempt (``error``: the exception, one line):
    one job's fault ends that job's attempt, never the cycle."""
    return BeginStop(StopKind.FAIL, f"the control plane could not handle this attempt ({error})"[:MAX_WHY])
