"""Long-polled job reads: ``GET /api/v1/jobs/{id}?while_state=QUEUED&wait_s=10``.

A client that waits for a job to move (``submit`` then "is it running yet?") asks once and gets
its answer when the move is written, instead of asking again every few milliseconds: each poll is
a request the server answers, beside the scheduling loop, in the same interpreter. The request
waits while the job is in one of the ``while_state`` given (one or more), for at most ``wait_s``
seconds (``MAX_WAIT_S``), and answers the job as it then is, whichever state (the caller compares).

:class:`JobChanges` is what wakes the waiting requests: the loop calls :meth:`JobChanges.changed`
with the jobs of every group it has just written (``Service.write_observers``), the API with a
job it cancelled. A change this process did not write (another replica's loop, a tenant deleted
with ``--force``) is seen at the next look, every ``RECHECK_S`` at most (``recheck_s``).

A waiting request holds one of the API's worker threads, so waits are capped: ``per_tenant`` at
once for each tenant, ``total`` in all (the admin's count as a tenant of their own); a wait over
a cap is a 409 that says so, at once.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from tpufleet.errors import ConflictError

__all__ = ["MAX_WAIT_S", "RECHECK_S", "JobChanges"]

MAX_WAIT_S = 30.0  # the longest a request waits
RECHECK_S = 0.5  # between two looks at the store while nothing here said the job changed
J = TypeVar("J")
PER_TENANT = 8  # waits at once per tenant
TOTAL = 16  # waits at once in all: the API's worker threads are 40


class JobChanges:
    """Which waiting requests to wake when jobs change. Thread-safe: :meth:`changed` is called
    from the loop's thread, the waits run on the API's worker threads."""

    def __init__(
        self, *, per_tenant: int = PER_TENANT, total: int = TOTAL, recheck_s: float = RECHECK_S
    ) -> None:
        self.per_tenant, self.total, self.recheck_s = per_tenant, total, recheck_s
        self._lock = threading.Lock()
        self._waiting: dict[str, set[threading.Event]] = {}
        self._by_tenant: Counter[str] = Counter()

    def changed(self, job_ids: Iterable[str]) -> None:
        """Wake the requests waiting on any of ``job_ids``."""
        with self._lock:
            if not self._waiting:
                return
            events = [e for job_id in job_ids for e in self._waiting.get(job_id, ())]
        for event in events:
            event.set()

    @property
    def waiting(self) -> int:
        with self._lock:
            return sum(self._by_tenant.values())

    @contextmanager
    def _watching(self, tenant: str, job_id: str) -> Iterator[threading.Event]:
        event = threading.Event()
        with self._lock:
            if self._by_tenant[tenant] >= self.per_tenant or sum(self._by_tenant.values()) >= self.total:
                raise ConflictError(
                    f"too many waiting reads at once ({self.per_tenant} per tenant, {self.total} in all): "
                    "read the job without wait_s, or wait for one of yours to answer"
                )
            self._by_tenant[tenant] += 1
            self._waiting.setdefault(job_id, set()).add(event)
        try:
            yield event
        finally:
            with self._lock:
                self._by_tenant[tenant] -= 1
                if not self._by_tenant[tenant]:
                    del self._by_tenant[tenant]
                events = self._waiting[job_id]
                events.discard(event)
                if not events:
                    del self._waiting[job_id]

    def wait(
        self, tenant: str, job_id: str, read: Callable[[], J], waits: Callable[[J], bool], wait_s: float
    ) -> J:
        """``read()`` the job; while ``waits(job)`` (it is in a state to wait out), wait for a change
        (at most ``wait_s`` in all, ``MAX_WAIT_S`` at most) and read it again. The last read is the
        answer."""
        job = read()
        if not waits(job) or wait_s <= 0:
            return job
        deadline = time.monotonic() + min(wait_s, MAX_WAIT_S)
        with self._watching(tenant, job_id) as event:
            job = read()  # again, now that a change wakes this request: one written meanwhile is seen
            while waits(job) and (left := deadline - time.monotonic()) > 0:
                event.wait(min(left, self.recheck_s))
                event.clear()  # before the read: a change written after it wakes the next wait
                job = read()
        return job
