"""A small discrete-event simulator that drives the policy on a fake clock.

Time is an integer number of ticks; nothing here reads a real clock. Jobs arrive at their
``arrival`` tick, run for ``duration`` ticks once admitted and then succeed. At every tick where
something happens (an arrival, a finish, a preempted job releasing its slices) the simulator builds
a ``Snapshot``, calls the policy once and applies its decisions; with ``every=n`` only at ticks that
are multiples of ``n`` (a control plane that decides once a cycle: what happened in between waits
for the next one, a finished job holding its slices until then):

- ``Admit``: the job runs from now on the chosen slices (``admit_seq`` = the next admission number);
- ``Preempt``: the victim gets the checkpoint signal now, keeps its slices for ``grace`` ticks, then
  releases them and is requeued with its original ``seq``; work done before the signal is kept
  (it resumes from its checkpoint), so it needs ``duration`` minus what it ran; with
  ``resume=False`` it needs its whole ``duration`` again (an evicted Kueue workload's rerun);
- ``Wait``: the reason is recorded on the job, and ``head_of_line`` is kept for the next snapshot.

A job's state moves only through ``lifecycle``'s functions (admit, request_stop, end_attempt), the
same ones the control plane's store applies.

Used by the unit tests (starvation, fair share over time), by ``bench/policy.py`` and by
``bench/kueue.py --policy-only``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from tpufleet.catalog import parse_slice_list
from tpufleet.scheduler import lifecycle
from tpufleet.scheduler.lifecycle import Life
from tpufleet.scheduler.model import (
    Admit,
    Decision,
    JobId,
    JobState,
    JobView,
    NotFit,
    Preempt,
    SliceName,
    SliceState,
    SliceView,
    Snapshot,
    TenantName,
    TenantView,
    Wait,
    lookup_type,
)
from tpufleet.scheduler.policy import decide

__all__ = ["SimJob", "SimRecord", "SimResult", "Simulation", "make_fleet"]


def make_fleet(spec: str) -> tuple[SliceView, ...]:
    """Free slices from ``"v4-16:2,v6e-16"``, named ``<type>-<index>`` (``v4-16-0``, ``v4-16-1``, ...)."""
    out: list[SliceView] = []
    for st, count in parse_slice_list(spec):
        first = sum(1 for s in out if s.accelerator_type == st.accelerator_type)
        out += [
            SliceView(SliceName(f"{st.accelerator_type}-{i}"), st.accelerator_type, SliceState.FREE)
            for i in range(first, first + count)
        ]
    return tuple(out)


@dataclass(frozen=True)
class SimJob:
    id: str
    tenant: str
    accelerator_type: str
    num_slices: int = 1
    priority: int = 0
    arrival: int = 0
    duration: int = 1


@dataclass
class SimRecord:
    """What happened to one job; ``view`` is its current state as the policy sees it."""

    job: SimJob
    view: JobView
    remaining: int
    started: int | None = None  # tick of the current admission
    admitted: list[int] = field(default_factory=list)
    finished: int | None = None
    preemptions: int = 0
    release_at: int | None = None
    attempt_at: int | None = None  # tick the current attempt was admitted at
    held: int = 0  # chips x ticks its attempts held, admission to release
    lost: int = 0  # of them, held by attempts that a preemption ended
    reasons: list[NotFit] = field(default_factory=list)  # the reason of every Wait, in order
    life: Life = field(default_factory=lambda: Life(JobState.QUEUED))  # moved by the lifecycle's functions

    @property
    def first_admitted(self) -> int | None:
        return self.admitted[0] if self.admitted else None


@dataclass
class SimResult:
    now: int
    cycles: int
    records: dict[str, SimRecord]
    chip_ticks: dict[str, int]  # tenant -> chips x ticks held over the whole run

    def record(self, job_id: str) -> SimRecord:
        return self.records[job_id]

    def unfinished(self) -> list[str]:
        return [j for j, r in self.records.items() if r.finished is None]


class Simulation:
    """Drive ``decide`` (or another policy with its signature) over a job stream on a fake clock."""

    def __init__(
        self,
        tenants: Sequence[TenantView],
        slices: Sequence[SliceView],
        *,
        grace: int = 1,
        policy: Callable[[Snapshot], list[Decision]] = decide,
        resume: bool = True,
        every: int = 1,
        max_cycles: int = 1_000_000,
    ) -> None:
        if grace < 1:
            raise ValueError("grace must be at least one tick")
        if every < 1:
            raise ValueError("every must be at least one tick")
        self.every = every
        self.tenants = tuple(tenants)
        self.slices = {s.name: s for s in slices}
        self.grace = grace
        self.policy = policy
        self.resume = resume
        self.max_cycles = max_cycles
        self.records: dict[str, SimRecord] = {}
        self.chip_ticks: dict[str, int] = {t.name: 0 for t in tenants}
        self.now = 0
        self.cycles = 0
        self._admissions = 0
        self._live: dict[str, SimRecord] = {}
        self._future: list[SimRecord] = []
        self._next_arrival = 0

    def run(self, jobs: Iterable[SimJob], *, until: int | None = None) -> SimResult:
        """Run until nothing is left to happen (or until tick ``until``) and return what happened."""
        arrivals = sorted(jobs, key=lambda j: (j.arrival, j.id))
        for job in arrivals:
            view = JobView(
                id=JobId(job.id),
                tenant=TenantName(job.tenant),
                accelerator_type=job.accelerator_type,
                num_slices=job.num_slices,
                priority=job.priority,
                seq=len(self.records) + 1,
                state=JobState.QUEUED,
            )
            self.records[job.id] = SimRecord(job, view, job.duration)
        later = self._future[self._next_arrival :] + [self.records[j.id] for j in arrivals]
        self._future = sorted(later, key=lambda r: (r.job.arrival, r.view.seq))
        self._next_arrival = 0
        while True:
            self._events()
            self._cycle()
            step = self._next_event()
            if step is None or (until is not None and step > until):
                self._account(until if until is not None and step is not None else self.now)
                break
            self._account(step)
        return SimResult(self.now, self.cycles, self.records, dict(self.chip_ticks))

    def _events(self) -> None:
        while (
            self._next_arrival < len(self._future)
            and self._future[self._next_arrival].job.arrival <= self.now
        ):
            rec = self._future[self._next_arrival]
            self._live[rec.job.id] = rec
            self._next_arrival += 1
        for rec in list(self._live.values()):
            view = rec.view
            if view.state == JobState.RUNNING and rec.release_at is not None and rec.release_at <= self.now:
                self._release(rec)  # the preempted attempt ended: requeued, no retry used
            elif view.state == JobState.RUNNING and self._done(rec):
                rec.finished = self.now
                self._release(rec)  # every host exited 0: succeeded
                del self._live[rec.job.id]

    def _done(self, rec: SimRecord) -> bool:
        return not rec.view.preempting and rec.started is not None and rec.started + rec.remaining <= self.now

    def _release(self, rec: SimRecord) -> None:
        if rec.attempt_at is not None:
            chip_ticks = _chips(rec.view) * (self.now - rec.attempt_at)
            rec.held += chip_ticks
            rec.lost += chip_ticks if rec.release_at is not None else 0  # a preemption ended it
        for name in rec.view.slices:
            self.slices[name] = replace(self.slices[name], state=SliceState.FREE, holder=None)
        rec.life, _ = lifecycle.end_attempt(rec.life)
        rec.view = replace(
            rec.view,
            state=rec.life.state,
            slices=(),
            borrowing=False,
            preempting=False,
            yielding=False,
            admit_seq=None,
        )
        rec.started = rec.release_at = None

    def _cycle(self) -> None:
        self.cycles += 1
        if self.cycles > self.max_cycles:
            raise RuntimeError(f"simulation did not settle within {self.max_cycles} cycles")
        live = [r.view for r in self._live.values()]
        snapshot = Snapshot(self.tenants, tuple(self.slices.values()), live)
        for decision in self.policy(snapshot):
            if isinstance(decision, Admit):
                self._admit(self.records[decision.job], decision)
            elif isinstance(decision, Preempt):
                self._preempt(self.records[decision.job], decision)
            elif isinstance(decision, Wait):
                rec = self.records[decision.job]
                rec.reasons.append(decision.reason)
                rec.view = replace(rec.view, head_of_line=decision.head_of_line)

    def _admit(self, rec: SimRecord, decision: Admit) -> None:
        self._admissions += 1
        for name in decision.slices:
            self.slices[name] = replace(self.slices[name], state=SliceState.HELD, holder=rec.view.id)
        rec.life = lifecycle.running(lifecycle.launched(lifecycle.admit(rec.life)))
        rec.view = replace(
            rec.view,
            state=rec.life.state,
            slices=decision.slices,
            borrowing=decision.borrowing,
            admit_seq=self._admissions,
            head_of_line=False,
        )
        rec.started = rec.attempt_at = self.now
        rec.admitted.append(self.now)

    def _preempt(self, rec: SimRecord, decision: Preempt) -> None:
        assert rec.started is not None, f"{rec.view.id} is preempted but not running"
        rec.remaining = rec.remaining - (self.now - rec.started) if self.resume else rec.job.duration
        rec.started = self.now  # not counted as progress: the job checkpointed at the signal
        rec.preemptions += 1
        rec.release_at = self.now + self.grace
        kind = lifecycle.StopKind.PRIORITY if decision.within_tenant else lifecycle.StopKind.PREEMPT
        rec.life = lifecycle.request_stop(rec.life, kind, f"preempted for job {decision.for_job}") or rec.life
        rec.view = replace(
            rec.view,
            preempting=rec.life.preempting,
            yielding=rec.life.stop_kind is lifecycle.StopKind.PRIORITY,
        )

    def _next_event(self) -> int | None:
        times: list[int] = []
        if self._next_arrival < len(self._future):
            times.append(self._future[self._next_arrival].job.arrival)
        for rec in self._live.values():
            if rec.release_at is not None:
                times.append(rec.release_at)
            elif rec.view.state == JobState.RUNNING and rec.started is not None:
                times.append(rec.started + rec.remaining)
        if not times:
            return None
        return -(-min(times) // self.every) * self.every  # the next tick the policy decides at

    def _account(self, until: int) -> None:
        """Add chips x ticks held by each tenant from ``now`` to ``until`` and move the clock."""
        for rec in self._live.values():
            if rec.view.state == JobState.RUNNING and rec.view.tenant in self.chip_ticks:
                self.chip_ticks[rec.view.tenant] += _chips(rec.view) * (until - self.now)
        self.now = max(self.now, until)


def _chips(view: JobView) -> int:
    """The chips ``view``'s slices have (0 for a type the catalog does not know)."""
    st = lookup_type(view.accelerator_type)
    return len(view.slices) * st.chips if st is not None else 0
