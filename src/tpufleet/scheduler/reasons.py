"""The words of "does not fit": ``NotFit`` values built from a type pool's state.

Messages name what the job needs, what is free, who holds or reserved the rest, so ``tpufleet job
ID`` answers "why does it wait" without a second query. Kept apart from the policy's decisions so
the policy reads as rules and this module as wording.
"""

from __future__ import annotations

from tpufleet.catalog import slice_type
from tpufleet.errors import SpecError
from tpufleet.scheduler.model import JobView, NotFit, NotFitCode
from tpufleet.scheduler.state import TypePool

__all__ = [
    "blocked",
    "count",
    "head_note",
    "intact",
    "preempt_reason",
    "reclaiming",
    "too_many",
    "unknown_type",
    "yield_reason",
    "yielding",
]

_C = NotFitCode


def count(n: int, key: str) -> str:
    """``1 v4-16 slice``, ``2 v4-16 slices``."""
    return f"{n} {key} slice{'s' if n != 1 else ''}"


def unknown_type(accelerator_type: str) -> NotFit:
    try:
        slice_type(accelerator_type)
    except SpecError as exc:
        return NotFit(_C.UNKNOWN_SLICE_TYPE, f"{accelerator_type} is not a TPU slice type: {exc}")
    return NotFit(_C.UNKNOWN_SLICE_TYPE, f"{accelerator_type!r} is not a slice type the scheduler knows")


def too_many(num_slices: int, key: str, pool: TypePool | None, pools: list[TypePool]) -> NotFit:
    have = pool.total if pool else 0
    fleet = ", ".join(f"{p.key} x{p.total}" for p in sorted(pools, key=lambda p: p.key)) or "empty"
    return NotFit(
        _C.NO_SUCH_SLICES_IN_FLEET, f"needs {count(num_slices, key)}; the fleet has {have} (fleet: {fleet})"
    )


def intact(num_slices: int, pool: TypePool) -> NotFit:
    return NotFit(
        _C.NOT_ENOUGH_INTACT_SLICES,
        f"needs {count(num_slices, pool.key)}; the fleet has {pool.total}, {pool.intact} intact "
        f"({pool.broken} broken, {pool.draining} draining)",
    )


def blocked(job: JobView, pool: TypePool, gen: str, chips: int, quota: int | None) -> NotFit:
    """Why ``job`` cannot be placed now; ``quota`` is its tenant's quota when the job would borrow."""
    need = count(job.num_slices, pool.key)
    if job.num_slices <= pool.free_left and pool.reserver is not None:
        holder = pool.reserver
        role = "head-of-line job" if holder is pool.head else "job"
        return NotFit(
            _C.RESERVED_FOR_HEAD_OF_LINE,
            f"needs {need}, {pool.free_left} free but {pool.reserved} reserved for {role} "
            f"{holder.id} (tenant {holder.tenant})",
        )
    held = pool.holders_text()
    detail = f"needs {need}, {pool.avail} free{'; ' + held if held else ''}"
    head = pool.head
    if head is not None and head.priority > job.priority:
        return NotFit(
            _C.LOWER_PRIORITY_THAN_HEAD,
            f"{detail}; job {head.id} (tenant {head.tenant}, priority {head.priority}) is first in line",
        )
    if quota is not None:
        return NotFit(
            _C.QUOTA_EXCEEDED_NO_BORROWING,
            f"its {chips} {gen} chips would take tenant {job.tenant} beyond its quota of {quota} "
            f"and there is not enough idle capacity to borrow: {detail}",
        )
    return NotFit(_C.WAITING_FOR_FREE_SLICES, detail)


def head_note(reason: NotFit, pool: TypePool) -> NotFit:
    return NotFit(reason.code, f"{reason.message}; holds the head-of-line reservation of {pool.key}")


def reclaiming(job: JobView, pool: TypePool, avail: int, victims: list[JobView]) -> NotFit:
    coming = ", ".join(f"job {v.id} (tenant {v.tenant})" for v in victims)
    whom = "borrowers" if victims or pool.yielding < pool.pending else "lower-priority jobs"
    return NotFit(
        _C.WAITING_FOR_PREEMPTION,
        f"needs {count(job.num_slices, pool.key)}, {avail} free; {job.num_slices - avail} being freed "
        f"by preempting {whom}{': ' + coming if coming else ''}",
    )


def yielding(job: JobView, pool: TypePool, avail: int, victims: list[JobView]) -> NotFit:
    """Why a job waits while its tenant's lower-priority jobs are preempted for it."""
    coming = ", ".join(f"job {v.id} (priority {v.priority})" for v in victims)
    return NotFit(
        _C.WAITING_FOR_PREEMPTION,
        f"needs {count(job.num_slices, pool.key)}, {avail} free; preempting lower-priority jobs of "
        f"tenant {job.tenant} to make room within its quota: {coming}",
    )


def held_for(job: JobView, holder: JobView, chips: int, gen: str, quota: int) -> NotFit:
    """Why a job waits for a higher-priority job of its tenant that is preempting for its quota."""
    return NotFit(
        _C.LOWER_PRIORITY_THAN_HEAD,
        f"job {holder.id} (priority {holder.priority}) of tenant {job.tenant} is first in line for "
        f"{chips} chips of its {gen} quota of {quota}; admitted now, this job (priority "
        f"{job.priority}) would be preempted for it",
    )


def yield_reason(victim: JobView, job: JobView, pool: TypePool, gen: str) -> str:
    return (
        f"priority: job {job.id} (priority {job.priority}) of the same tenant {job.tenant} needs "
        f"{count(job.num_slices, pool.key)} within its {gen} quota; this job has priority {victim.priority}"
    )


def preempt_reason(victim: JobView, job: JobView, pool: TypePool, gen: str) -> str:
    return (
        f"reclaim: tenant {victim.tenant} borrows {gen} chips beyond its quota and in-quota job "
        f"{job.id} of tenant {job.tenant} needs {count(job.num_slices, pool.key)}"
    )
