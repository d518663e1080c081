"""The scheduling policy: ``decide(snapshot) -> list[Decision]``, pure, deterministic, near-linear.

Modelled on Kueue's ClusterQueue / Cohort semantics, applied to whole TPU slices. One cycle:

1. **Checks that need no ordering.** A job whose type is unknown, whose ``num_slices`` < 1, that
   asks for more slices of its type than the fleet has in any state, whose tenant is unknown, or
   that asks for more than the fleet's intact slices of its type waits with that reason.
2. **In-quota pass.** Queued jobs are taken in admission order: priority (higher first), then the
   tenant furthest below its fair share (``Ledger.share``: dominant borrowed share, then dominant
   fraction of quota used, each divided by the tenant's weight; recomputed after every admission),
   then ``seq`` (submission order), then id. A job is *in quota* when its tenant's usage of the
   generation plus the job's chips stays within the tenant's nominal quota. Once a tenant has a
   job in a generation that does not fit its remaining quota but would fit the quota itself, the
   tenant's later jobs in that generation are deferred too, so small jobs of a tenant cannot eat
   the headroom a larger job of the same tenant is waiting for. In-quota jobs that fit in the
   unreserved free slices of their type are admitted; one that does not fit reclaims borrowed
   slices (``preemption``): when enough borrowers of other tenants can be preempted it gets
   ``Preempt`` decisions and waits (``WAITING_FOR_PREEMPTION``) with the free slices reserved.
3. **Borrowing pass.** The deferred jobs, in the same order, may use idle slices: free slices of
   their type that no in-quota job reserved. They are admitted with ``borrowing`` set when they
   take their tenant beyond its quota. Borrowers never preempt.
4. **Head of line.** In either pass, the first job of a type that cannot be placed becomes that
   type's head of line and reserves the free slices of the type (and slices still being freed by
   preemptions), so later, smaller jobs cannot starve it; they wait with
   ``RESERVED_FOR_HEAD_OF_LINE``. Jobs of other types are unaffected. The head's ``Wait`` says
   ``head_of_line=True``; fed back as ``JobView.head_of_line`` it puts the job first among the jobs
   of its priority in the next cycle, so the reservation sticks while the fair-share order moves
   (without it, the moment the last slice comes free an older job of a tenant whose usage the
   reservation drained to zero would win the tie and take it).

Slices are handed out whole, lowest name first (numbers compared as numbers). ``BROKEN`` and
``DRAINING`` slices are never assigned. The cost is O(J log T) for J queued jobs and T tenants plus
O(S log S) for S slices.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from tpufleet.catalog import SliceType, slice_type
from tpufleet.errors import SpecError
from tpufleet.scheduler.model import (
    ACTIVE_STATES,
    Admit,
    Decision,
    JobState,
    JobView,
    NotFit,
    NotFitCode,
    Preempt,
    SliceName,
    SliceState,
    Snapshot,
    TenantName,
    Wait,
    lookup_type,
)
from tpufleet.scheduler.preemption import choose_victims, victim_order
from tpufleet.scheduler.state import Ledger, TypePool, held_count, natural_key

__all__ = ["decide"]

_C = NotFitCode
_Key = tuple[int, tuple[float, float], int, str, TenantName, int]
_STICKY = (-1.0, -1.0)  # ahead of every fair share: last cycle's head of line keeps its place


def decide(snapshot: Snapshot) -> list[Decision]:
    """One scheduling cycle: an ``Admit`` or a ``Wait`` for every QUEUED job, and ``Preempt`` decisions.

    Deterministic (the result does not depend on the order of the snapshot's sequences), reads no
    clock and does no I/O. Decisions come in the order they were made: a ``Preempt`` is followed by
    the ``Wait`` of the job it makes room for.
    """
    return _Cycle(snapshot).run()


@dataclass(frozen=True)
class _Entry:
    job: JobView
    pool: TypePool
    gen: str
    chips: int  # chips of all the slices the job asks for


class _Cycle:
    """The simulated state of one cycle; ``run`` walks the queue once and returns the decisions."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.tenants = {t.name: t for t in sorted(snapshot.tenants, key=lambda t: t.name)}
        jobs = sorted(snapshot.jobs, key=lambda j: (j.seq, j.id))
        active = [j for j in jobs if j.state in ACTIVE_STATES]
        self.pools: dict[str, TypePool] = {}
        capacity = self._load_slices(snapshot, {name for j in active for name in j.slices})
        self.ledger = Ledger(self.tenants, capacity)
        self._load_active(active)
        self.queued = [j for j in jobs if j.state == JobState.QUEUED]
        self.blocked: set[tuple[TenantName, str]] = set()
        self.out: list[Decision] = []

    def _load_slices(self, snapshot: Snapshot, held: set[SliceName]) -> dict[str, int]:
        capacity: dict[str, int] = {}
        for s in sorted(snapshot.slices, key=lambda s: natural_key(s.name)):
            st = lookup_type(s.accelerator_type)
            if st is None:
                continue
            pool = self.pools.get(st.accelerator_type)
            if pool is None:
                pool = self.pools[st.accelerator_type] = TypePool(st.accelerator_type, st)
            pool.total += 1
            pool.broken += s.state == SliceState.BROKEN
            pool.draining += s.state == SliceState.DRAINING
            if s.state == SliceState.FREE and s.holder is None and s.name not in held:
                pool.free.append(s.name)
            capacity[st.gen_name] = capacity.get(st.gen_name, 0) + st.chips
        return capacity

    def _load_active(self, active: list[JobView]) -> None:
        for job in active:
            st = lookup_type(job.accelerator_type)
            if st is None:
                continue
            count = held_count(job)
            self.ledger.add(job.tenant, st.gen_name, count * st.chips, leaving=job.preempting)
            pool = self.pools.get(st.accelerator_type)
            if pool is None:
                continue
            pool.holders[job.id] = (job.tenant, count)
            if job.preempting:
                pool.pending += count
            elif job.borrowing:
                pool.victims.append(job)
        for pool in self.pools.values():
            pool.victims.sort(key=victim_order)

    def run(self) -> list[Decision]:
        entries: list[_Entry] = []
        for job in self.queued:
            checked = self._check(job)
            if isinstance(checked, NotFit):
                self.out.append(Wait(job.id, checked))
            else:
                entries.append(checked)
        deferred: list[_Entry] = []
        for entry in self._in_order(entries):
            if self._in_quota(entry):
                self._place_in_quota(entry)
            else:
                deferred.append(entry)
        for entry in self._in_order(deferred):
            self._place_borrower(entry)
        return self.out

    # -- 1. checks ---------------------------------------------------------------------------------

    def _check(self, job: JobView) -> _Entry | NotFit:
        st = lookup_type(job.accelerator_type)
        if st is None:
            return NotFit(_C.UNKNOWN_SLICE_TYPE, _type_error(job.accelerator_type))
        if job.num_slices < 1:
            return NotFit(_C.INVALID_NUM_SLICES, f"num_slices must be 1 or more, not {job.num_slices}")
        pool = self.pools.get(st.accelerator_type)
        if pool is None or job.num_slices > pool.total:
            return NotFit(_C.NO_SUCH_SLICES_IN_FLEET, self._too_many(job, st, pool))
        if job.tenant not in self.tenants:
            return NotFit(_C.UNKNOWN_TENANT, f"tenant {job.tenant!r} does not exist")
        if job.num_slices > pool.intact:
            return NotFit(
                _C.NOT_ENOUGH_INTACT_SLICES,
                f"needs {_n(job.num_slices, pool.key)}; the fleet has {pool.total}, {pool.intact} intact "
                f"({pool.broken} broken, {pool.draining} draining)",
            )
        return _Entry(job, pool, st.gen_name, job.num_slices * st.chips)

    def _too_many(self, job: JobView, st: SliceType, pool: TypePool | None) -> str:
        have = pool.total if pool else 0
        types = ", ".join(f"{p.key} x{p.total}" for p in sorted(self.pools.values(), key=lambda p: p.key))
        need = _n(job.num_slices, st.accelerator_type)
        return f"needs {need}; the fleet has {have} (fleet: {types or 'empty'})"

    # -- 2. in-quota pass --------------------------------------------------------------------------

    def _in_quota(self, entry: _Entry) -> bool:
        key = (entry.job.tenant, entry.gen)
        if key in self.blocked:
            return False
        quota = self.ledger.quota_of(*key)
        if self.ledger.used(*key) + entry.chips <= quota:
            return True
        if entry.chips <= quota:
            self.blocked.add(key)
        return False

    def _place_in_quota(self, entry: _Entry) -> None:
        if entry.job.num_slices <= entry.pool.avail:
            self._admit(entry, borrowing=False)
        elif not self._reclaim(entry):
            self._wait_blocked(entry, borrowing=False)

    def _reclaim(self, entry: _Entry) -> bool:
        """Preempt borrowers so the in-quota ``entry`` fits; False (nothing changed) when it cannot."""
        job, pool = entry.job, entry.pool
        avail, spare = pool.avail, pool.spare_pending
        shortfall = job.num_slices - avail - spare
        victims: list[JobView] | None = []
        if shortfall > 0:
            if shortfall >= pool.failed.get(job.tenant, shortfall + 1):
                return False
            chips = pool.slice_type.chips
            victims = choose_victims(
                pool.victims, job, shortfall, lambda t: self.ledger.over(t, entry.gen), chips
            )
            if victims is None:
                pool.failed[job.tenant] = shortfall
                return False
        pool.reserve(avail, job)
        for victim in victims or ():
            pool.pending += held_count(victim)
            self.ledger.mark_leaving(victim.tenant, entry.gen, held_count(victim) * pool.slice_type.chips)
            self.out.append(Preempt(victim.id, job.id, _preempt_reason(victim, entry)))
        pool.claim(job.num_slices - avail)
        coming = ", ".join(f"job {v.id} (tenant {v.tenant})" for v in victims or ())
        message = (
            f"needs {_n(job.num_slices, pool.key)}, {avail} free; "
            f"{job.num_slices - avail} being freed by preempting borrowers{': ' + coming if coming else ''}"
        )
        self.out.append(Wait(job.id, NotFit(_C.WAITING_FOR_PREEMPTION, message)))
        return True

    # -- 3. borrowing pass -------------------------------------------------------------------------

    def _place_borrower(self, entry: _Entry) -> None:
        job = entry.job
        beyond = self.ledger.used(job.tenant, entry.gen) + entry.chips > self.ledger.quota_of(
            job.tenant, entry.gen
        )
        if job.num_slices <= entry.pool.avail:
            self._admit(entry, borrowing=beyond)
        else:
            self._wait_blocked(entry, borrowing=beyond)

    def _admit(self, entry: _Entry, *, borrowing: bool) -> None:
        slices = entry.pool.take(entry.job)
        self.ledger.add(entry.job.tenant, entry.gen, entry.chips)
        self.out.append(Admit(entry.job.id, slices, borrowing))

    # -- 4. waiting and the head of line -----------------------------------------------------------

    def _wait_blocked(self, entry: _Entry, *, borrowing: bool) -> None:
        job, pool = entry.job, entry.pool
        reason = self._blocked_reason(entry, borrowing)
        if pool.head is None:
            pool.head = job
            avail = pool.avail
            pool.reserve(avail, job)
            pool.claim(min(pool.spare_pending, job.num_slices - avail))
            reason = NotFit(
                reason.code, f"{reason.message}; holds the head-of-line reservation of {pool.key}"
            )
        self.out.append(Wait(job.id, reason, head_of_line=pool.head is job))

    def _blocked_reason(self, entry: _Entry, borrowing: bool) -> NotFit:
        job, pool = entry.job, entry.pool
        need = _n(job.num_slices, pool.key)
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
        if borrowing:
            used, quota = self.ledger.used(job.tenant, entry.gen), self.ledger.quota_of(job.tenant, entry.gen)
            return NotFit(
                _C.QUOTA_EXCEEDED_NO_BORROWING,
                f"tenant {job.tenant} would use {used + entry.chips} of its {quota} {entry.gen} chips "
                f"and there is not enough idle capacity to borrow: {detail}",
            )
        return NotFit(_C.WAITING_FOR_FREE_SLICES, detail)

    # -- order -------------------------------------------------------------------------------------

    def _in_order(self, entries: Iterable[_Entry]) -> Iterator[_Entry]:
        """Entries by priority, then tenant fair share (live: updated as jobs are admitted), then seq.

        A heap holds each tenant's next entry; a tenant's key is recomputed only when it is pushed
        back, which is after its previous entry was processed.
        """
        queues: dict[TenantName, list[_Entry]] = {}
        for entry in entries:
            queues.setdefault(entry.job.tenant, []).append(entry)
        heap: list[_Key] = []
        for tenant, queue in queues.items():
            queue.sort(key=lambda e: (-e.job.priority, not e.job.head_of_line, e.job.seq, e.job.id))
            heap.append(self._key(tenant, queue[0], 0))
        heapq.heapify(heap)
        while heap:
            *_, tenant, index = heapq.heappop(heap)
            queue = queues[tenant]
            yield queue[index]
            if index + 1 < len(queue):
                heapq.heappush(heap, self._key(tenant, queue[index + 1], index + 1))

    def _key(self, tenant: TenantName, entry: _Entry, index: int) -> _Key:
        job = entry.job
        share = _STICKY if job.head_of_line else self.ledger.share(tenant)
        return (-job.priority, share, job.seq, job.id, tenant, index)


def _n(count: int, key: str) -> str:
    return f"{count} {key} slice{'s' if count != 1 else ''}"


def _type_error(accelerator_type: str) -> str:
    try:
        slice_type(accelerator_type)
    except SpecError as exc:
        return f"{accelerator_type} is not a TPU slice type: {exc}"
    return f"{accelerator_type!r} is not a slice type the scheduler knows"


def _preempt_reason(victim: JobView, entry: _Entry) -> str:
    return (
        f"reclaim: tenant {victim.tenant} borrows {entry.gen} chips beyond its quota and in-quota job "
        f"{entry.job.id} of tenant {entry.job.tenant} needs {_n(entry.job.num_slices, entry.pool.key)}"
    )
