"""What a job looked like in the store as its attempt's end was written.

A cycle acts on the attempts that ended before the policy looks, so a job requeued in a cycle may be
admitted again, or given a new wait reason, in that same cycle: the reason its requeue wrote
(``RETRYING``, ``REQUEUED``, ``PREEMPTED``, ``PREEMPTED_BY_PROVIDER``) is what the job says until
the policy next speaks, and a test that runs whole cycles does not see it. This records it at the
loop's own injection point (``Service.after_write``: called once a group is committed, before any
of it is acted on), without changing what the loop does.
"""

from __future__ import annotations

from collections.abc import Sequence

from tpufleet.control.loop.service import Service
from tpufleet.control.store.facade import Store
from tpufleet.control.store.values import JobRecord


class Ends:
    """Install on a service (``Ends.on(service, store)``); ``at_end(job)`` is the job as its last
    attempt's end was written."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.seen: dict[str, list[JobRecord]] = {}

    @classmethod
    def on(cls, service: Service, store: Store) -> Ends:
        ends = cls(store)
        service.after_write = ends
        return ends

    def __call__(self, kind: str, job_ids: Sequence[str]) -> None:
        if kind == "finish":
            for job_id in job_ids:
                self.seen.setdefault(job_id, []).append(self.store.jobs.get(job_id))

    def at_end(self, job_id: str) -> JobRecord:
        assert job_id in self.seen, f"no end of job {job_id} was written"
        return self.seen[job_id][-1]
