"""Fluent builders for scheduler fixtures: a fleet, tenants, running and queued jobs on a fake sequence.

    snap = (
        Fleet()
        .slices("v4-16", 4)
        .tenant("prod", v4=16)
        .running("r1", "research", "v4-16", borrowing=True)
        .queued("q1", "prod", "v4-16", num_slices=2)
        .build()
    )

Slices are named ``<type>-<index>``; a running job takes the lowest-named free slices of its type.
``seq`` and ``admit_seq`` come from counters in call order, so a later call is a later submission
(or admission): the fake clock of the policy is this sequence.
"""

from __future__ import annotations

from dataclasses import replace

from tpufleet.scheduler.model import (
    Admit,
    Decision,
    JobId,
    JobState,
    JobView,
    NotFitCode,
    Preempt,
    SliceName,
    SliceState,
    SliceView,
    Snapshot,
    TenantName,
    TenantView,
    Wait,
)
from tpufleet.scheduler.state import natural_key


class Fleet:
    def __init__(self) -> None:
        self._slices: dict[str, SliceView] = {}
        self._tenants: dict[str, TenantView] = {}
        self._jobs: dict[str, JobView] = {}
        self._seq = 0
        self._admissions = 0

    def slices(self, accelerator_type: str, count: int) -> Fleet:
        first = sum(1 for s in self._slices.values() if s.accelerator_type == accelerator_type)
        for i in range(first, first + count):
            name = f"{accelerator_type}-{i}"
            self._slices[name] = SliceView(SliceName(name), accelerator_type, SliceState.FREE)
        return self

    def broken(self, *names: str) -> Fleet:
        return self._set_state(names, SliceState.BROKEN)

    def draining(self, *names: str) -> Fleet:
        return self._set_state(names, SliceState.DRAINING)

    def _set_state(self, names: tuple[str, ...], state: SliceState) -> Fleet:
        for name in names:
            self._slices[name] = replace(self._slices[name], state=state)
        return self

    def tenant(
        self, name: str, *, weight: float = 1.0, preemption: str = "lower_priority", **quota: int
    ) -> Fleet:
        self._tenants[name] = TenantView(TenantName(name), dict(quota), weight, preemption)
        return self

    def queued(
        self,
        job_id: str,
        tenant: str,
        accelerator_type: str = "v4-16",
        *,
        num_slices: int = 1,
        priority: int = 0,
        head_of_line: bool = False,
    ) -> Fleet:
        self._seq += 1
        self._jobs[job_id] = JobView(
            JobId(job_id),
            TenantName(tenant),
            accelerator_type,
            num_slices,
            priority,
            self._seq,
            JobState.QUEUED,
            head_of_line=head_of_line,
        )
        return self

    def running(
        self,
        job_id: str,
        tenant: str,
        accelerator_type: str = "v4-16",
        *,
        num_slices: int = 1,
        priority: int = 0,
        borrowing: bool = False,
        preempting: bool = False,
        yielding: bool = False,
        state: JobState = JobState.RUNNING,
    ) -> Fleet:
        free = sorted(
            (
                s
                for s in self._slices.values()
                if s.accelerator_type == accelerator_type and s.state == "FREE"
            ),
            key=lambda s: natural_key(s.name),
        )[:num_slices]
        assert len(free) == num_slices, f"fixture: not enough free {accelerator_type} slices for {job_id}"
        for s in free:
            self._slices[s.name] = replace(s, state=SliceState.HELD, holder=JobId(job_id))
        self._seq += 1
        self._admissions += 1
        self._jobs[job_id] = JobView(
            JobId(job_id),
            TenantName(tenant),
            accelerator_type,
            num_slices,
            priority,
            self._seq,
            state,
            tuple(s.name for s in free),
            borrowing=borrowing,
            preempting=preempting or yielding,
            admit_seq=self._admissions,
            yielding=yielding,
        )
        return self

    def build(self) -> Snapshot:
        return Snapshot(
            tuple(self._tenants.values()), tuple(self._slices.values()), tuple(self._jobs.values())
        )


# -- reading decisions -----------------------------------------------------------------------------


def admitted(decisions: list[Decision]) -> dict[str, tuple[str, ...]]:
    return {d.job: d.slices for d in decisions if isinstance(d, Admit)}


def borrowed(decisions: list[Decision]) -> set[str]:
    return {d.job for d in decisions if isinstance(d, Admit) and d.borrowing}


def waiting(decisions: list[Decision]) -> dict[str, NotFitCode]:
    return {d.job: d.reason.code for d in decisions if isinstance(d, Wait)}


def preempted(decisions: list[Decision]) -> dict[str, str]:
    """victim -> the job it makes room for."""
    return {d.job: d.for_job for d in decisions if isinstance(d, Preempt)}


def outcome(decisions: list[Decision]) -> dict[str, str]:
    """Each job's fate: ``"admit"``, ``"borrow"`` or its wait code; victims ``"preempt"``."""
    table: dict[str, str] = {job: "preempt" for job in preempted(decisions)}
    table |= {job: code.value for job, code in waiting(decisions).items()}
    table |= {d.job: "borrow" if d.borrowing else "admit" for d in decisions if isinstance(d, Admit)}
    return table
