"""What happens next to one attempt: decided here, purely; the loop writes it, then acts.

The lifecycle (``lifecycle.py``) says which transitions are legal; this says which one an attempt
takes this cycle, from what the loop knows of it: its job's state, the stop already on record, when
it was admitted, the clock, and what its hosts said (:class:`Observed`). Three questions, three
functions, each answering with one :data:`Step`:

- :func:`next_step`: at the start of the cycle's turn for the job. A recorded stop goes on
  (:class:`Stopping`); an attempt that did not start on every host within the start timeout is
  failed (:class:`BeginStop`); an admitted one is launched (:class:`Launch`); any other is polled
  (:class:`Poll`).
- :func:`after_launch`: once a launch returned: the job turns STARTING (:class:`MarkLaunched`), or a
  launch that failed fails the attempt.
- :func:`after_poll`: from the hosts' status: requeue without a retry (``INTERRUPTED``), fail,
  succeed, mark RUNNING when every host runs (:class:`MarkRunning`), or :class:`Wait`.

A :class:`BeginStop` is written first (``Transitions.begin_stop``, a compare-and-set that loses to
a cancel or preemption already on record) and only then is the stop issued: a control plane killed
between the two finds the stop on record and issues it after its restart. Nothing here reads a
clock, does I/O or imports Ray.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpufleet.scheduler.lifecycle import JobState, StopKind

__all__ = [
    "GONE",
    "SUCCEEDED_WHY",
    "BeginStop",
    "Launch",
    "MarkLaunched",
    "MarkRunning",
    "Observed",
    "Poll",
    "Step",
    "Stopping",
    "Wait",
    "after_launch",
    "after_poll",
    "next_step",
]

GONE = "its processes are gone (no runners found)"
SUCCEEDED_WHY = "every host exited with code 0"
MAX_WHY = 2000  # characters of a reason kept on the job


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
class Wait:
    """Nothing to do this cycle."""


Step = Launch | Poll | Stopping | BeginStop | MarkLaunched | MarkRunning | Wait


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


def after_poll(state: JobState, seen: Observed) -> Step:
    """What the hosts said decides: an interruption before a failure (hosts gone included) before
    success."""
    if seen.interrupted is not None:
        return BeginStop(StopKind.INTERRUPTED, seen.interrupted)
    if not seen.present:
        return BeginStop(StopKind.FAIL, GONE)
    if seen.failure is not None:
        return BeginStop(StopKind.FAIL, seen.failure)
    if seen.succeeded:
        return BeginStop(StopKind.SUCCESS, SUCCEEDED_WHY)
    if seen.all_running and state == JobState.STARTING:
        return MarkRunning()
    return Wait()
