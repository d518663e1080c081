"""The jobs as the policy walks them: active ones apart, queued ones per tenant in queue order, with
the runs of jobs alike marked.

``split(jobs)`` builds this from any sequence of jobs; it is what ``decide`` does with a plain
snapshot. The control plane keeps it instead (``KeptQueues``): between cycles it puts only the jobs
that changed, which moves a few entries of a sorted list, and hands the policy a ``JobSet``, a
sequence of every job (what a snapshot's ``jobs`` always is) that carries its split along. The
policy uses a ``JobSet``'s split as it is, so a cycle over 100,000 queued jobs does no work per
job to find its queues or its runs. ``tests/unit/test_queues.py`` checks the kept split against
``split`` of the same jobs after every change of a random workload.

A *run* is a stretch of one tenant's queue whose jobs are alike (``ALIKE``: type, size, priority
and head of line; the tenant is the queue's). The policy decides the jobs of a run together. A
queue's runs are given by their ends (``Split.ends``: where each run stops, the last one at the
queue's length); a queue with very many short runs has none kept, and the policy finds its runs
itself.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, groupby
from operator import attrgetter, itemgetter
from typing import overload

from tpufleet.scheduler.model import ACTIVE_STATES, JobState, JobView, TenantName

__all__ = ["ALIKE", "JobSet", "KeptQueues", "Split", "queue_key", "split"]

ALIKE = attrgetter("accelerator_type", "num_slices", "priority", "head_of_line")  # and the tenant
MAX_KEPT_RUNS = 256  # a queue with more runs than this has its run ends found by the policy
_QUEUED = JobState.QUEUED  # looking a member up on its enum class is slow in a loop over every job


def queue_key(job: JobView) -> tuple[int, bool, int, str]:
    """Queue order: priority (higher first), last cycle's head of line first, then seq, then id."""
    return (-job.priority, not job.head_of_line, job.seq, job.id)


def _active_key(job: JobView) -> tuple[int, str]:
    return (job.seq, job.id)


@dataclass(frozen=True)
class Split:
    """The active jobs by (seq, id); each tenant's queued jobs by ``queue_key``, tenants by their
    first job; and, for the queues that have them, where each run of jobs alike ends."""

    active: list[JobView]
    queues: list[tuple[TenantName, list[JobView]]]
    ends: dict[TenantName, list[int]]


def split(jobs: Iterable[JobView]) -> Split:
    """Split ``jobs`` (any order) as the policy walks them; no run ends are given.

    A pass over 100,000 jobs costs about as much as a sort of them, so the pass that splits them
    also notes which sorts can be skipped: the ones by id and seq when the queued jobs come in
    strictly rising seq, else the one by id when no two queued jobs share a seq; the one by head of
    line when no job held it.
    """
    active: list[JobView] = []
    queues: dict[TenantName, list[JobView]] = {}
    heads = unordered = False
    last = -1
    for j in jobs:
        if j.state == _QUEUED:
            queues.setdefault(j.tenant, []).append(j)
            if j.seq > last:
                last = j.seq
            else:
                unordered = True
            heads = heads or j.head_of_line
        elif j.state in ACTIVE_STATES:
            active.append(j)
    queued = sum(len(q) for q in queues.values())
    ties = unordered and len({j.seq for q in queues.values() for j in q}) < queued
    for queue in queues.values():
        _sort_queue(queue, ties=ties, heads=heads, ordered=not unordered)
    active.sort(key=_active_key)
    return Split(active, sorted(queues.items(), key=lambda tq: queue_key(tq[1][0])), {})


def _sort_queue(jobs: list[JobView], *, ties: bool, heads: bool, ordered: bool = False) -> None:
    """Sort ``jobs`` in place by ``queue_key``: stable sorts on one plain key each, least significant first.

    Ints, bools and strings are not tracked by the cyclic garbage collector; 100,000 tuple keys
    alive at once set off more than a hundred collections, which cost more than the sorting itself.
    """
    if not ordered:  # ``ordered``: already by seq, no two alike
        if ties:
            jobs.sort(key=attrgetter("id"))
        jobs.sort(key=attrgetter("seq"))
    if heads:
        jobs.sort(key=attrgetter("head_of_line"), reverse=True)  # reverse keeps ties in order (stable)
    jobs.sort(key=attrgetter("priority"), reverse=True)


def run_ends(queue: Sequence[JobView]) -> list[int]:
    """Where each run of jobs alike of ``queue`` ends, in C (runs are often thousands long)."""
    runs: Iterator[Iterator[JobView]] = map(itemgetter(1), groupby(queue, ALIKE))
    return list(accumulate(map(len, map(list, runs))))


class JobSet(Sequence[JobView]):
    """Every job of a snapshot, in submission order, with the policy's split of them.

    Made by ``KeptQueues.jobs``; the lists are the set's own (nothing changes them afterwards).
    """

    __slots__ = ("_jobs", "split")

    def __init__(self, jobs: list[JobView], split: Split) -> None:
        self._jobs = jobs
        self.split = split

    @overload
    def __getitem__(self, index: int) -> JobView: ...
    @overload
    def __getitem__(self, index: slice) -> list[JobView]: ...
    def __getitem__(self, index: int | slice) -> JobView | list[JobView]:
        return self._jobs[index]

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[JobView]:
        return iter(self._jobs)

    def __repr__(self) -> str:
        return f"JobSet({len(self._jobs)} jobs, {len(self.split.queues)} tenant queues)"


class KeptQueues:
    """The split of a changing set of jobs, kept up to date one job at a time.

    ``put`` a job's current view (new or changed), ``drop`` a job that ended; ``jobs()`` hands out
    a ``JobSet`` of everything as it stands. Putting a queued job is a binary search and an insert
    in its tenant's queue, and a shift of the run boundaries after it (kept for queues of up to
    ``MAX_KEPT_RUNS`` runs).
    """

    def __init__(self, jobs: Iterable[JobView] = ()) -> None:
        self._all: dict[str, JobView] = {}  # every job, in submission order
        self._queues: dict[TenantName, list[JobView]] = {}
        self._starts: dict[TenantName, list[int] | None] = {}  # where each run but the first starts
        self._active: dict[str, JobView] = {}
        self._sorted = True
        self._untracked: set[TenantName] = set()  # queues without run boundaries that changed since
        first = split(jobs)
        for view in first.active:
            self._all[view.id] = view
            self._active[view.id] = view
        for tenant, queue in first.queues:
            self._queues[tenant] = queue
            self._starts[tenant] = _starts_of(queue)
            self._all.update((view.id, view) for view in queue)
        self._all = dict(sorted(self._all.items(), key=lambda kv: _active_key(kv[1])))

    def __len__(self) -> int:
        return len(self._all)

    def get(self, job_id: str) -> JobView | None:
        return self._all.get(job_id)

    def put(self, view: JobView) -> None:
        """Add a job, or replace the view of one already kept."""
        old = self._all.get(view.id)
        if old is not None:
            self._unplace(old)
        elif self._all and view.seq < next(reversed(self._all.values())).seq:
            self._sorted = False
        self._all[view.id] = view
        if view.state == _QUEUED:
            self._insert(view)
        elif view.state in ACTIVE_STATES:
            self._active[view.id] = view

    def drop(self, job_id: str) -> None:
        """Forget a job (it ended, or is no longer there); nothing when it is not kept."""
        old = self._all.pop(job_id, None)
        if old is not None:
            self._unplace(old)

    def jobs(self) -> JobSet:
        """Every job as it stands now, and the split (copies: later changes do not reach them)."""
        if not self._sorted:
            self._all = dict(sorted(self._all.items(), key=lambda kv: _active_key(kv[1])))
            self._sorted = True
        for tenant in self._untracked & self._queues.keys():  # maybe fewer runs by now
            self._starts[tenant] = _starts_of(self._queues[tenant])
        self._untracked.clear()
        queues = sorted(((t, list(q)) for t, q in self._queues.items()), key=lambda tq: queue_key(tq[1][0]))
        ends = {
            t: [*starts, len(self._queues[t])] for t, starts in self._starts.items() if starts is not None
        }
        active = sorted(self._active.values(), key=_active_key)
        return JobSet(list(self._all.values()), Split(active, queues, ends))

    # -- one job in or out of its queue --------------------------------------------------------------
    def _unplace(self, old: JobView) -> None:
        if old.state != _QUEUED:
            self._active.pop(old.id, None)
            return
        queue = self._queues[old.tenant]
        index = bisect_left(queue, queue_key(old), key=queue_key)
        assert queue[index] is old, f"job {old.id} is not where its queue key puts it"
        del queue[index]
        if not queue:
            del self._queues[old.tenant], self._starts[old.tenant]
            return
        starts = self._starts[old.tenant]
        if starts is None:
            self._untracked.add(old.tenant)
        else:
            # The boundaries before and after the job are gone; those after them move one back.
            at = bisect_left(starts, index)
            starts[at:] = [p - 1 for p in starts[at:] if p > index + 1]
            _mark(starts, index, 0 < index < len(queue) and ALIKE(queue[index - 1]) != ALIKE(queue[index]))

    def _insert(self, view: JobView) -> None:
        queue = self._queues.get(view.tenant)
        if queue is None:
            self._queues[view.tenant] = [view]
            self._starts[view.tenant] = []
            return
        index = bisect_left(queue, queue_key(view), key=queue_key)
        queue.insert(index, view)
        starts = self._starts[view.tenant]
        if starts is None:
            self._untracked.add(view.tenant)
            return
        at = bisect_left(starts, index)
        starts[at:] = [p + 1 for p in starts[at:]]  # everything from the job on moved one along
        _mark(starts, index, index > 0 and ALIKE(queue[index - 1]) != ALIKE(view))
        after = index + 1
        _mark(starts, after, after < len(queue) and ALIKE(view) != ALIKE(queue[after]))
        if len(starts) >= MAX_KEPT_RUNS:
            self._starts[view.tenant] = None


def _starts_of(queue: list[JobView]) -> list[int] | None:
    ends = run_ends(queue)
    return ends[:-1] if len(ends) <= MAX_KEPT_RUNS else None


def _mark(starts: list[int], position: int, boundary: bool) -> None:
    """Make ``position`` a run boundary of the sorted ``starts``, or not."""
    at = bisect_left(starts, position)
    present = at < len(starts) and starts[at] == position
    if boundary and not present:
        starts.insert(at, position)
    elif not boundary and present:
        del starts[at]
