"""Choosing which borrowers to preempt so that an in-quota job fits (Kueue's reclaim within a cohort).

Only jobs that were admitted as borrowers, of a tenant other than the preemptor's, holding slices
of the type the preemptor needs, whose tenant is still beyond its quota in that generation, are
candidates. In-quota jobs are never preempted, and there is no priority preemption (neither within
a tenant nor across tenants): a tenant that wants a high-priority job to run sooner gets it through
the admission order, not by evicting its own or another tenant's in-quota work.

Victims are chosen like Kueue does: candidates in order (lowest priority first, then the most
recently admitted first, then id), taken greedily until enough slices are freed, then every chosen
victim whose slices turn out not to be needed is put back (last chosen first), so the set is
minimal: no victim can be dropped and still free enough.
"""

from __future__ import annotations

from collections.abc import Callable

from tpufleet.scheduler.model import JobView, TenantName
from tpufleet.scheduler.state import held_count

__all__ = ["choose_victims", "victim_order"]


def victim_order(job: JobView) -> tuple[int, int, str]:
    """Sort key: lowest priority first, then most recently admitted first, then id."""
    admitted = job.admit_seq if job.admit_seq is not None else job.seq
    return (job.priority, -admitted, job.id)


def choose_victims(
    candidates: list[JobView],
    preemptor: JobView,
    shortfall: int,
    over_quota: Callable[[TenantName], int],
    chips_per_slice: int,
) -> list[JobView] | None:
    """A minimal set of ``candidates`` freeing at least ``shortfall`` slices, or None when none exists.

    ``candidates`` must be in ``victim_order``; ``over_quota(tenant)`` gives how many chips the tenant
    holds beyond its quota now: a tenant's jobs are taken only while it is still beyond it.
    Candidates that can never be chosen again in this cycle are dropped from the list in place.
    """
    real: dict[TenantName, int] = {}
    over: dict[TenantName, int] = {}
    chosen: list[JobView] = []
    freed = 0
    keep: list[JobView] = []
    for job in candidates:
        if job.tenant not in real:
            real[job.tenant] = over[job.tenant] = over_quota(job.tenant)
        if real[job.tenant] <= 0:
            continue  # its tenant is within quota: never a candidate again in this cycle
        keep.append(job)
        if freed >= shortfall or job.tenant == preemptor.tenant or over[job.tenant] <= 0:
            continue
        chosen.append(job)
        freed += held_count(job)
        over[job.tenant] -= held_count(job) * chips_per_slice
    if freed < shortfall:
        candidates[:] = keep
        return None
    for job in reversed(list(chosen)):
        if freed - held_count(job) >= shortfall:
            chosen.remove(job)
            freed -= held_count(job)
    gone = {job.id for job in chosen}
    candidates[:] = [job for job in keep if job.id not in gone]
    return chosen
