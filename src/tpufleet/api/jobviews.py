"""Job views as the API answers them: a job's JSON with its ``goodput`` (``observe/goodput.py``).

``GET /api/v1/jobs/{id}``, the listing ``GET /api/v1/jobs`` and the fleet view's running and
recent jobs all carry it; a listing reads the attempts of the whole page in one query.

:func:`fleet_warnings`: what ``POST /api/v1/jobs`` and ``GET /api/v1/jobs/{id}`` (of a queued job)
say under ``warnings`` when the fleet has too few slices of the job's type and nothing would make
more (no autoscaler pool of the type, no slice group of it being made): the job waits
``NO_SUCH_SLICES_IN_FLEET`` until an operator adds some, and the warning names the types the fleet
has and the fix.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from typing import Any

from tpufleet.control.store.facade import Store
from tpufleet.control.store.slicegroups import SliceGroups
from tpufleet.control.store.usage import Usage
from tpufleet.control.store.values import JobRecord
from tpufleet.observe import goodput

__all__ = ["fleet_warnings", "job_with_goodput", "jobs_with_goodput"]


def job_with_goodput(job: JobRecord, now: float) -> dict[str, Any]:
    """A job's JSON with its ``goodput`` (``observe/goodput.py``; ``ratio`` null when it reports no
    steps)."""
    return {**job.to_dict(), "goodput": goodput.job_goodput(job.attempts, now).to_dict()}


def jobs_with_goodput(store: Store, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Listed jobs (``to_dict``s) with their ``goodput``: one query for the attempts of the page."""
    if not items:
        return items
    by_job: dict[str, list[Any]] = defaultdict(list)
    for a in Usage(store).attempts(job_ids=[j["id"] for j in items], lean=True):
        by_job[a.job_id].append(a)
    now = store.clock()
    return [{**j, "goodput": goodput.job_goodput(by_job.get(j["id"], []), now).to_dict()} for j in items]


def fleet_warnings(
    store: Store,
    accelerator_type: str,
    num_slices: int,
    pool_types: Collection[str] = (),
    *,
    fleet_seen: bool = True,
) -> list[str]:
    """A warning when the fleet has fewer than ``num_slices`` slices of ``accelerator_type`` (in any
    state) and nothing would make more: no autoscaler pool of the type (``pool_types``) and no slice
    group of it that is not being deleted. Empty otherwise, and while the store knows no slice at
    all and the loop has not looked at the fleet yet (``fleet_seen`` False: before its first cycle)."""
    usage = Usage(store)
    if accelerator_type in pool_types or usage.has_slices(accelerator_type, num_slices):
        return []  # the usual answer, from at most num_slices rows; the counts only to say what is short
    have: dict[str, int] = defaultdict(int)
    for key, _state, n in usage.slice_counts():
        have[key] += n
    if have.get(accelerator_type, 0) >= num_slices or (not have and not fleet_seen):
        return []
    groups = SliceGroups(store).all()
    if any(g.accelerator_type == accelerator_type and g.delete_requested_at is None for g in groups):
        return []
    n = have.get(accelerator_type, 0)
    short = (
        f"the fleet has no {accelerator_type} slice"
        if n == 0
        else f"the fleet has {n} {accelerator_type} slice{'s' if n != 1 else ''}, the job needs {num_slices}"
    )
    types = ", ".join(f"{k} x{v}" for k, v in sorted(have.items()) if v) or "none"
    return [
        f"{short} and no pool makes them: the job waits (NO_SUCH_SLICES_IN_FLEET) until an operator "
        f"adds some; the fleet has: {types}. Submit with one of those types, or ask the operator for "
        f"a pool of {accelerator_type} slices"
    ]
