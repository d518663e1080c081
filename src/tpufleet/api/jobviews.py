"""Job views as the API answers them: a job's JSON with its ``goodput`` (``observe/goodput.py``).

``GET /api/v1/jobs/{id}``, the listing ``GET /api/v1/jobs`` and the fleet view's running and
recent jobs all carry it; a listing reads the attempts of the whole page in one query.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from tpufleet.control.store.facade import Store
from tpufleet.control.store.usage import Usage
from tpufleet.control.store.values import JobRecord
from tpufleet.observe import goodput

__all__ = ["job_with_goodput", "jobs_with_goodput"]


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
