"""Goodput: how much of the time a job held its slices became training progress it kept.

Pure: attempt records in (``AttemptRecord`` or anything with the same fields), numbers out; no I/O,
no clock (``now`` is given). The definitions follow Google's ML Goodput Measurement library
(``ml-goodput-measurement``: ``goodput_time``, ``badput_time`` by ``BadputType``) where they apply
to what tpufleet sees, the slice hold times it records and the steps process 0 reports
(``runtime.report_step``: "step N is done", first and newest report of each attempt with times):

- **held**: an attempt holds its slices from admission to its end (or ``now``); a job's held time
  is the sum over its attempts. Goodput ratio = productive / held.
- **start-up** (the library's TPU initialization, training preparation and program start-up):
  admission to the attempt's first reported step. An attempt that reported no step spent all its
  held time starting up.
- **productive**: from the first to the newest reported step of each attempt, less wasted progress.
- **wasted progress** (``WASTED_PROGRESS_FROM_DISRUPTION``): time an attempt spent on steps a later
  attempt did again, because it resumed from an earlier checkpoint. A later attempt whose first
  report is step ``s`` kept steps up to ``s - 1``; the time of the earlier attempt's steps after
  that is found by linear interpolation between its first and newest report.
- **idle**: the rest of the held time: after the newest report to the end of the attempt
  (checkpointing, shutdown, a hang), or to ``now`` while it runs.
- **recovery** (``INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION``): the gaps between an attempt's end and
  the next one's admission, when the job held nothing. Wall-clock badput, not in the held time
  (no chip was paid for), so reported beside the ratio, not inside it.

start-up + productive + wasted + idle = held, per attempt and per job. A job that never reported a
step has held time but no goodput (``ratio`` None: unknown, not zero). Host clocks are trusted only
within the attempt: reported times are clamped to [admission, end].
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

__all__ = ["KINDS", "AttemptLike", "Goodput", "Segment", "job_goodput", "segments"]

KINDS = ("startup", "productive", "wasted", "idle")


class AttemptLike(Protocol):
    @property
    def attempt(self) -> int: ...
    @property
    def admitted_at(self) -> float: ...
    @property
    def ended_at(self) -> float | None: ...
    @property
    def first_step(self) -> int | None: ...
    @property
    def first_step_at(self) -> float | None: ...
    @property
    def last_step(self) -> int | None: ...
    @property
    def last_step_at(self) -> float | None: ...


@dataclass(frozen=True)
class Segment:
    """A stretch of one attempt's held time and what it was: one of :data:`KINDS`."""

    attempt: int
    kind: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)

    def clipped(self, since: float | None, until: float) -> Segment:
        start = self.start if since is None else max(self.start, since)
        return Segment(self.attempt, self.kind, start, max(start, min(self.end, until)))


@dataclass(frozen=True)
class Goodput:
    """A job's (or a window's) held time and how it was spent, in seconds."""

    held_s: float
    productive_s: float
    startup_s: float
    wasted_s: float
    idle_s: float
    recovery_s: float
    reported: bool  # some attempt reported a step (else the ratio is unknown)

    @property
    def ratio(self) -> float | None:
        return self.productive_s / self.held_s if self.reported and self.held_s > 0 else None

    @property
    def badput_s(self) -> float:
        return self.startup_s + self.wasted_s + self.idle_s

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()
        }
        ratio = self.ratio
        out["ratio"] = None if ratio is None else round(ratio, 4)
        out["badput_s"] = round(self.badput_s, 3)
        return out


def segments(attempts: Sequence[AttemptLike], now: float) -> list[Segment]:
    """Every attempt's held time cut into start-up, productive, wasted and idle stretches, in order."""
    ordered = sorted(attempts, key=lambda a: a.attempt)
    out: list[Segment] = []
    for i, a in enumerate(ordered):
        start = a.admitted_at
        end = max(start, a.ended_at if a.ended_at is not None else now)
        reported = _reported(a)
        if reported is None:
            out.append(Segment(a.attempt, "startup", start, end))
            continue
        first, first_at, last, last_at = reported
        first_at = min(max(first_at, start), end)
        last_at = min(max(last_at, first_at), end)
        kept = _kept_step(ordered[i + 1 :])
        wasted_from = last_at
        if kept is not None and kept < last:
            wasted_from = _time_of(max(kept, first), first, first_at, last, last_at)
        out += [
            Segment(a.attempt, "startup", start, first_at),
            Segment(a.attempt, "productive", first_at, wasted_from),
            Segment(a.attempt, "wasted", wasted_from, last_at),
            Segment(a.attempt, "idle", last_at, end),
        ]
    return [s for s in out if s.seconds > 0]


def job_goodput(
    attempts: Sequence[AttemptLike], now: float, *, since: float | None = None, until: float | None = None
) -> Goodput:
    """A job's goodput from its attempts; with ``since``/``until``, only the held time in that window."""
    end = now if until is None else until
    parts = [s.clipped(since, end) for s in segments(attempts, now)]
    total = {k: float(sum(s.seconds for s in parts if s.kind == k)) for k in KINDS}
    return Goodput(
        held_s=sum(total.values()),
        productive_s=total["productive"],
        startup_s=total["startup"],
        wasted_s=total["wasted"],
        idle_s=total["idle"],
        recovery_s=_recovery(attempts, since, end),
        reported=any(_reported(a) is not None for a in attempts),
    )


def _reported(a: AttemptLike) -> tuple[int, float, int, float] | None:
    if None in (a.first_step, a.first_step_at, a.last_step, a.last_step_at):
        return None
    first, last = int(a.first_step or 0), int(a.last_step or 0)
    return first, float(a.first_step_at or 0.0), max(first, last), float(a.last_step_at or 0.0)


def _kept_step(later: Iterable[AttemptLike]) -> int | None:
    """The newest step the later attempts kept of this one: the smallest first report, minus one."""
    firsts = [r[0] for r in (_reported(a) for a in later) if r is not None]
    return min(firsts) - 1 if firsts else None


def _time_of(step: int, first: int, first_at: float, last: int, last_at: float) -> float:
    """When ``step`` was done, between the attempt's first and newest report (linear)."""
    if last <= first:
        return last_at
    return first_at + (last_at - first_at) * (step - first) / (last - first)


def _recovery(attempts: Sequence[AttemptLike], since: float | None, until: float) -> float:
    ordered = sorted(attempts, key=lambda a: a.attempt)
    gap = 0.0
    for before, after in itertools.pairwise(ordered):
        if before.ended_at is None:
            continue
        lo = before.ended_at if since is None else max(before.ended_at, since)
        gap += max(0.0, min(after.admitted_at, until) - lo)
    return gap
