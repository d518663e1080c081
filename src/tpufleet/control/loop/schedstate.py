"""The scheduling state the loop keeps in memory between cycles, instead of re-reading every job.

The first cycle (after a start or a restart: the store is the source of truth) reads every queued
and active job. After that a cycle reads only the jobs that changed: every change to a job in the
store writes an event in the same transaction (submit, batch submit, cancel, admit, launch, run,
stop, end), so the events since the last cycle name them, and those rows are read again. Wait
reasons and head-of-line flags, which the loop writes itself without an event, are applied to the
memory directly (:meth:`SchedState.reasons_written`).

PostgreSQL may commit event ids out of order (a transaction that drew id 7 can commit after one
that drew id 8), so an id skipped by a read ("a hole") is looked for again for ``hole_cycles``
cycles; SQLite commits one writer at a time and leaves none. The policy sees the jobs in
submission order, exactly as a whole read gives them; ``tests/unit/test_schedstate.py`` checks
that the two views are equal after every cycle of a randomized workload.

The jobs are kept split as the policy walks them (``scheduler.queues.KeptQueues``: each tenant's
queue in order, its runs of jobs alike marked), so a changed job moves one entry of a sorted list
and the policy does no work per queued job to find its queues.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tpufleet.control.store import values as r
from tpufleet.control.store.loopwrites import Stored, Transitions
from tpufleet.scheduler.model import Snapshot
from tpufleet.scheduler.queues import KeptQueues


class SchedState:
    def __init__(self, tr: Transitions, *, hole_cycles: int = 200) -> None:
        self.tr = tr
        self.hole_cycles = hole_cycles
        self._jobs: KeptQueues | None = None
        self._reasons: dict[str, Stored] = {}
        self._cursor = 0
        self._holes: dict[int, int] = {}  # event id not seen yet -> cycles it has been missing
        self.loads = 0  # whole reads so far (1 unless reset)
        self.reread = 0  # jobs read again in the last cycle

    def reset(self) -> None:
        """Forget everything: the next snapshot reads the store whole."""
        self._jobs = None

    def snapshot(self, slices: Sequence[r.SliceRecord] | None = None) -> tuple[Snapshot, dict[str, Stored]]:
        """The policy's view, and each queued job's stored wait reason and head-of-line flag;
        ``slices``: the slices as the inventory just left them (else read)."""
        if self._jobs is None:
            self._load()
        else:
            self._catch_up()
        assert self._jobs is not None
        snapshot = Snapshot(self.tr.tenant_views(), self.tr.slice_views(slices), self._jobs.jobs())
        return snapshot, self._reasons

    def reasons_written(self, changes: list[tuple[str, Stored]]) -> None:
        """The loop stored these wait reasons (code, message, head of line) for queued jobs."""
        if self._jobs is None:
            return
        for job_id, stored in changes:
            if job_id in self._reasons:
                self._reasons[job_id] = stored
                view = self._jobs.get(job_id)
                if view is not None and view.head_of_line != stored[2]:
                    self._jobs.put(replace(view, head_of_line=stored[2]))

    def _load(self) -> None:
        self._cursor = self.tr.last_event()  # first, so a change made during the read is read again
        views, self._reasons = self.tr.job_views()
        self._jobs = KeptQueues(views)
        self._holes = {}
        self.loads += 1
        self.reread = len(views)

    def _catch_up(self) -> None:
        assert self._jobs is not None
        events = self.tr.events_since(self._cursor, self._holes)
        seen = {event for event, _ in events}
        changed = {job for _, job in events if job}
        top = max(seen, default=self._cursor)
        for event in range(self._cursor + 1, top):
            if event not in seen:
                self._holes.setdefault(event, 0)
        for event in list(self._holes):
            self._holes[event] += 1
            if event in seen or self._holes[event] > self.hole_cycles:
                del self._holes[event]  # arrived, or a transaction that rolled back
        self._cursor = max(self._cursor, top)
        self.reread = len(changed)
        if not changed:
            return
        views, reasons = self.tr.job_views(changed)
        found = {v.id for v in views}
        for job_id in changed - found:  # ended (or never queued): the policy no longer sees it
            self._jobs.drop(job_id)
            self._reasons.pop(job_id, None)
        for view in views:
            self._jobs.put(view)
            if view.id in reasons:
                self._reasons[view.id] = reasons[view.id]
            else:
                self._reasons.pop(view.id, None)
