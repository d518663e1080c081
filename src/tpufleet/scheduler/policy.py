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
``DRAINING`` slices are never assigned. The cost is O(J log J) for J queued jobs (sorting each
tenant's queue; the walk is O(log T) per job that can still change something, for T tenants, and
O(1) per job whose type has nothing left to give, see ``order``) plus O(S log S) for S slices.
A run of a tenant's jobs alike that are set aside for the borrowing pass takes the heap once, as
one ``order.Idle`` run, cut short when a placement comes before its later jobs' turn.

The control plane keeps the split of the queue between cycles (``queues.KeptQueues``) and hands it
over as the snapshot's ``jobs`` (a ``queues.JobSet``): then neither the split nor the runs cost
anything per queued job, and ``decide_runs``, which hands out the waits of a run as one ``Waits``,
costs O(R log T) for R runs of jobs alike, whatever the length of the queue.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tpufleet.scheduler import reasons
from tpufleet.scheduler.model import (
    Admit,
    Decision,
    JobView,
    NotFit,
    NotFitCode,
    Preempt,
    RunDecision,
    SliceName,
    SliceState,
    Snapshot,
    TenantName,
    Wait,
    Waits,
    expand,
)
from tpufleet.scheduler.order import Idle, in_order, walk
from tpufleet.scheduler.preemption import choose_victims, victim_order
from tpufleet.scheduler.queues import ALIKE, JobSet, run_ends
from tpufleet.scheduler.queues import split as split_jobs
from tpufleet.scheduler.state import Ledger, TypePool, held_count, natural_key, type_facts

__all__ = ["decide", "decide_runs"]

_Key = tuple[int, tuple[float, float], int, str]
_Static = tuple[TypePool, str, int, NotFit | None]  # pool, generation, chips, not enough intact
_STICKY = (-1.0, -1.0)  # ahead of every fair share: last cycle's head of line keeps its place


def decide(snapshot: Snapshot) -> list[Decision]:
    """One scheduling cycle: an ``Admit`` or a ``Wait`` for every QUEUED job, and ``Preempt`` decisions.

    Deterministic (the result does not depend on the order of the snapshot's sequences), reads no
    clock and does no I/O. Decisions come in the order they were made: a ``Preempt`` is followed by
    the ``Wait`` of the job it makes room for.
    """
    return expand(_Cycle(snapshot).run())


def decide_runs(snapshot: Snapshot) -> list[RunDecision]:
    """``decide``, with the jobs alike that wait for one reason as one ``Waits`` per run.

    The same decisions in the same order (``model.expand`` gives ``decide``'s list); the control
    plane uses this form, which costs nothing per waiting job.
    """
    return _Cycle(snapshot).run()


@dataclass(slots=True)
class _Entry:
    job: JobView
    pool: TypePool
    gen: str
    chips: int  # chips of all the slices the job asks for
    in_quota: bool = False
    yields: bool = False  # beyond quota, but its tenant's lower-priority jobs could make room


@dataclass(frozen=True, slots=True)
class _Deferred:
    """What ``_fate`` made of a job that is not in quota and may still borrow: its alike jobs get the same."""

    pool: TypePool
    gen: str
    chips: int


_ALIKE = ALIKE


class _Cycle:
    """The simulated state of one cycle; ``run`` walks the queue once and returns the decisions."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.tenants = {t.name: t for t in sorted(snapshot.tenants, key=lambda t: t.name)}
        jobs = snapshot.jobs
        split = jobs.split if isinstance(jobs, JobSet) else split_jobs(jobs)  # kept, or made now
        active, self.queues = split.active, split.queues
        self.pools: dict[str, TypePool] = {}
        # Priority preemption inside a tenant: each tenant's running jobs per generation that could
        # make room (in victim order), and the chips its jobs already being preempted will give back.
        self.own: dict[tuple[TenantName, str], list[JobView]] = {}
        self.own_leaving: dict[tuple[TenantName, str], int] = {}
        capacity = self._load_slices(snapshot, {name for j in active for name in j.slices})
        self.ledger = Ledger(self.tenants, capacity)
        self._load_active(active)
        self.blocked: set[tuple[TenantName, str]] = set()
        # The entry of a job that yielded (preempted its tenant's lower-priority jobs), per tenant
        # and generation: the tenant's lower-priority jobs that would take its chips wait.
        self.held: dict[tuple[TenantName, str], _Entry] = {}
        self.out: list[RunDecision] = []
        self._static: dict[tuple[str, int], _Static | NotFit] = {}
        self._reasons: dict[tuple[object, ...], NotFit] = {}
        self._settled: dict[tuple[TenantName, str, int, int], NotFit | _Deferred] = {}
        # id(queue) -> where each of its runs of jobs alike ends (kept ones, else found when needed)
        self._blocks: dict[int, list[int]] = {id(q): split.ends[t] for t, q in self.queues if t in split.ends}
        # The borrowing pass: each tenant's deferred jobs in order, and where each run of them ends.
        self.deferred: dict[TenantName, list[JobView]] = {}
        self._deferred_ends: dict[TenantName, list[int]] = {}
        self._first_deferred: dict[TenantName, _Key] = {}  # the key its first deferred job had

    def _load_slices(self, snapshot: Snapshot, held: set[SliceName]) -> dict[str, int]:
        capacity: dict[str, int] = {}
        for s in snapshot.slices:
            facts = type_facts(s.accelerator_type)
            if facts is None:
                continue
            pool = self.pools.get(facts.key)
            if pool is None:
                pool = self.pools[facts.key] = TypePool(facts.key, facts.slice_type)
            pool.total += 1
            pool.broken += s.state == SliceState.BROKEN
            pool.draining += s.state == SliceState.DRAINING
            if s.state == SliceState.FREE and s.holder is None and s.name not in held:
                pool.free.append(s.name)
            capacity[facts.gen] = capacity.get(facts.gen, 0) + facts.chips
        for pool in self.pools.values():
            pool.free.sort(key=natural_key)  # stable: ties keep the snapshot's order, as before
        return capacity

    def _load_active(self, active: list[JobView]) -> None:
        for job in active:
            facts = type_facts(job.accelerator_type)
            if facts is None:
                continue
            count = held_count(job)
            self.ledger.add(job.tenant, facts.gen, count * facts.chips, leaving=job.preempting)
            own = (job.tenant, facts.gen)
            if job.yielding:
                self.own_leaving[own] = self.own_leaving.get(own, 0) + count * facts.chips
            elif not job.preempting:
                self.own.setdefault(own, []).append(job)
            pool = self.pools.get(facts.key)
            if pool is None:
                continue
            pool.holders[job.id] = (job.tenant, count)
            if job.preempting:
                pool.pending += count
                pool.yielding += count if job.yielding else 0
            elif job.borrowing:
                pool.victims.append(job)
        for pool in self.pools.values():
            pool.victims.sort(key=victim_order)
        for jobs in self.own.values():
            jobs.sort(key=victim_order)

    def run(self) -> list[RunDecision]:
        walk(
            (queue for _, queue in self.queues),
            self._key,
            self._job_key,
            self._settle_in_quota_pass,
            self._take_in_quota,
            self._defer_run,
        )
        # Tenants in the order their first deferred job had its turn (the walk's turns come in
        # rising key order), as if each job had been deferred at its own turn.
        queues = sorted(self.deferred.items(), key=lambda tq: self._first_deferred[tq[0]])
        for entry in in_order(queues, self._key, self._settle_borrowing_pass):
            self._place_borrower(entry)
        return self.out

    def _take_in_quota(self, entry: _Entry) -> bool:
        if not entry.in_quota:
            self._defer(entry)  # changes nothing another job's fate reads
            return False
        self._settled.clear()  # placing a job changes the state that settled them
        self._place_in_quota(entry)
        return True

    def _defer_run(self, queue: list[JobView], start: int, end: int) -> None:
        """Keep jobs alike that are not in quota for the borrowing pass (nothing else changes)."""
        self._keep_deferred(queue[start], queue[start:end])

    def _defer(self, entry: _Entry) -> None:
        """Keep a job that is not in quota for the borrowing pass (nothing else changes)."""
        self._keep_deferred(entry.job, (entry.job,))

    def _keep_deferred(self, first: JobView, alike: Sequence[JobView]) -> None:
        """Append jobs alike (``first`` is the first of them) to their tenant's deferred jobs, as one
        run with the run before when that one is alike too (same type, size and priority)."""
        tenant = first.tenant
        jobs = self.deferred.get(tenant)
        if jobs is None:
            jobs = self.deferred[tenant] = []
            self._deferred_ends[tenant] = []
            self._first_deferred[tenant] = self._order(first)
        ends = self._deferred_ends[tenant]
        joins = bool(jobs) and (  # mostly settled by the first field
            jobs[-1].accelerator_type == first.accelerator_type
            and jobs[-1].num_slices == first.num_slices
            and jobs[-1].priority == first.priority
        )
        jobs.extend(alike)
        if joins:
            ends[-1] = len(jobs)
        else:
            ends.append(len(jobs))

    def _block_end(self, queue: list[JobView], index: int) -> int:
        """Where the run of jobs alike (``_ALIKE``; one tenant per queue) that holds ``index`` ends."""
        ends = self._blocks.get(id(queue))
        if ends is None:
            alike, end, stop = _ALIKE(queue[index]), index + 1, min(len(queue), index + 8)
            while end < stop and _ALIKE(queue[end]) == alike:
                end += 1
            if end < stop or end == len(queue):
                return end  # a short run: looked at one by one
            ends = self._blocks[id(queue)] = run_ends(queue)  # a long one: every run of the queue
        return ends[bisect_right(ends, index)]

    # -- 1. checks ---------------------------------------------------------------------------------

    def _misfit(self, job: JobView, static: _Static | NotFit) -> NotFit:
        """The most important of the reasons that do not depend on the queue."""
        if isinstance(static, NotFit):
            return static
        if job.tenant not in self.tenants:
            return NotFit(NotFitCode.UNKNOWN_TENANT, f"tenant {job.tenant!r} does not exist")
        assert static[3] is not None
        return static[3]

    def _check_shape(self, job: JobView) -> _Static | NotFit:
        """Pool, generation, chips and "too few intact" of a type and size, or why it never fits."""
        facts = type_facts(job.accelerator_type)
        if facts is None:
            return reasons.unknown_type(job.accelerator_type)
        if job.num_slices < 1:
            return NotFit(
                NotFitCode.INVALID_NUM_SLICES, f"num_slices must be 1 or more, not {job.num_slices}"
            )
        pool = self.pools.get(facts.key)
        if pool is None or job.num_slices > pool.total:
            return reasons.too_many(job.num_slices, facts.key, pool, list(self.pools.values()))
        not_intact = reasons.intact(job.num_slices, pool) if job.num_slices > pool.intact else None
        return pool, facts.gen, job.num_slices * facts.chips, not_intact

    # -- 2. in-quota pass --------------------------------------------------------------------------

    def _in_quota(self, tenant: TenantName, gen: str, chips: int, beyond: bool, quota: int) -> bool:
        """Whether the job counts as in quota; remembers a tenant's job that waits for headroom."""
        key = (tenant, gen)
        if key in self.blocked:
            return False
        if not beyond:
            return True
        if chips <= quota:
            self.blocked.add(key)
            self._settled.clear()
        return False

    def _settle_in_quota_pass(
        self, queue: list[JobView], start: int, bound: _Key | None
    ) -> tuple[int, _Entry] | Idle | None:
        """Decide the jobs from ``start`` on whose fate nothing can change; the first job that needs the walk.

        Jobs alike (same tenant, type, size and priority: all ``_fate`` reads of a job but its id)
        share the reason, or the deferral to the borrowing pass, while the state stays as it was:
        between two placements only ``blocked`` changes, and both clear ``_settled`` (a deferral
        changes nothing ``_fate`` reads). Most queued jobs of a large queue end here, a run of them
        at a time: the waiting ones get their reason at once, the deferred ones go back to the walk
        as one ``Idle`` run, which it cuts short when a placement comes before their turn.
        """
        settled, out = self._settled, self.out
        index, size, last = start, len(queue), None
        while index < size:
            job = queue[index]
            shape = (job.tenant, job.accelerator_type, job.num_slices, job.priority)
            known = settled.get(shape)
            if known is None:
                fate = self._fate(job)
                if isinstance(fate, _Entry):
                    if fate.in_quota:
                        return index, fate
                    known = settled[shape] = _Deferred(fate.pool, fate.gen, fate.chips)
                else:
                    known = settled[shape] = fate
            if type(known) is _Deferred:
                entry = _Entry(job, known.pool, known.gen, known.chips)
                after = index + 1
                alike = after < size and _ALIKE(queue[after]) == _ALIKE(job)
                if bound is not None and self._key(entry) < bound:
                    # It comes next anyway: deferred on the spot, with the jobs alike after it that
                    # come before ``bound`` too (keys rise along a run: only seq and id differ).
                    if alike:
                        end = self._block_end(queue, index)
                        after = bisect_left(range(end), bound, after, end, key=self._job_key_at(queue))
                    self._keep_deferred(job, queue[index:after])
                    index = after
                    continue
                if alike:
                    return Idle(index, self._block_end(queue, index))  # with the jobs alike after it
                return index, entry
            if shape == last:  # the second of a run of jobs alike that wait: the rest of it at once
                end = self._block_end(queue, index)
                out.append(Waits(tuple(queue[index:end]), known))  # type: ignore[arg-type]
                index = end
                continue
            out.append(Wait(job.id, known))  # type: ignore[arg-type]
            last = shape
            index += 1
        return None

    def _fate(self, job: JobView) -> _Entry | NotFit:
        """An entry for the walk, or why ``job`` waits whatever other tenants do first.

        That is when its type is closed to it: nothing free is left unreserved, the type has its
        head of line, and the job borrows or cannot reclaim enough. None of these can change back
        later in the cycle, and the tenant's usage cannot change before the job's turn (only the
        tenant's own admissions move it), so deciding now is deciding in order.
        """
        static = self._static.get((job.accelerator_type, job.num_slices))
        if static is None:
            static = self._static[job.accelerator_type, job.num_slices] = self._check_shape(job)
        if isinstance(static, NotFit) or job.tenant not in self.tenants or static[3] is not None:
            return self._misfit(job, static)
        pool, gen, chips, _ = static
        quota = self.ledger.quota[job.tenant].get(gen, 0)
        used = self.ledger.usage[job.tenant].get(gen, 0)
        if self.own_leaving:
            used -= self.own_leaving.get((job.tenant, gen), 0)
        held = self.held.get((job.tenant, gen)) if self.held else None
        if held is not None and job.priority < held.job.priority and used + chips + held.chips > quota:
            return reasons.held_for(job, held.job, held.chips, gen, quota)
        beyond = used + chips > quota
        in_quota = self._in_quota(job.tenant, gen, chips, beyond, quota)
        if not in_quota and beyond and chips <= quota and self._may_yield(job, gen):
            return _Entry(job, pool, gen, chips, True, yields=True)
        if pool.head is None or len(pool.free) - pool.taken - pool.reserved > 0:
            return _Entry(job, pool, gen, chips, in_quota)
        if in_quota and not self._reclaim_futile(job, pool):
            return _Entry(job, pool, gen, chips, in_quota)
        return self._blocked(job, pool, gen, chips, quota if beyond else None)

    def _settle_borrowing_pass(
        self, queue: list[JobView], start: int, bound: _Key | None
    ) -> tuple[int, _Entry] | None:
        """Place the jobs from ``start`` on that cannot take anything (their type is closed) or that
        come next anyway (key below ``bound``); the first other one goes through the walk.

        A job whose type is closed only waits, which changes nothing, so jobs alike (same tenant,
        type, size and priority) that follow it in this run wait for the same reason."""
        out, ends = self.out, self._deferred_ends[queue[0].tenant]
        alike: dict[tuple[str, int, int], NotFit] = {}
        index = start
        while index < len(queue):
            job = queue[index]
            pool, gen, chips, _ = self._static[job.accelerator_type, job.num_slices]  # type: ignore[misc]
            if pool.head is None or pool.avail > 0:
                entry = _Entry(job, pool, gen, chips)
                if bound is None or not self._key(entry) < bound:
                    return index, entry
                alike.clear()
                self._place_borrower(entry)
                index += 1
                continue
            shape = (job.accelerator_type, job.num_slices, job.priority)  # one tenant per queue
            reason = alike.get(shape)
            if reason is None:
                quota = self._quota_if_beyond(job, gen, chips)
                reason = alike[shape] = self._blocked(job, pool, gen, chips, quota)
            end = ends[bisect_right(ends, index)]  # the jobs up to there are alike
            if end == index + 1:
                out.append(Wait(job.id, reason))
            else:
                out.append(Waits(tuple(queue[index:end]), reason))
            index = end
        return None

    def _reclaim_futile(self, job: JobView, pool: TypePool) -> bool:
        shortfall = job.num_slices - pool.avail - pool.spare_pending
        return shortfall > 0 and (not pool.victims or shortfall >= pool.failed.get(job.tenant, shortfall + 1))

    def _place_in_quota(self, entry: _Entry) -> None:
        if entry.yields:  # beyond quota: only its tenant's lower-priority jobs can make room
            if not self._yield_for(entry):
                self._defer(entry)
        elif entry.job.num_slices <= entry.pool.avail:
            self._admit(entry, borrowing=False)
        elif not self._reclaim(entry) and not self._yield_for(entry):
            self._wait_blocked(entry, quota=None)

    def _reclaim(self, entry: _Entry) -> bool:
        """Preempt borrowers so the in-quota ``entry`` fits; False (nothing changed) when it cannot."""
        job, pool = entry.job, entry.pool
        avail, spare = pool.avail, pool.spare_pending
        shortfall = job.num_slices - avail - spare
        victims: list[JobView] | None = []
        if shortfall > 0:
            if self._reclaim_futile(job, pool):
                return False
            chips = pool.slice_type.chips
            victims = choose_victims(
                pool.victims, job, shortfall, lambda t: self.ledger.over(t, entry.gen), chips
            )
            if victims is None:
                pool.failed[job.tenant] = shortfall
                return False
        pool.reserve(avail, job)
        pool.claim(min(spare, job.num_slices - avail))
        for victim in victims or ():
            own = self.own.get((victim.tenant, entry.gen))
            if own and victim in own:
                own.remove(victim)  # preempted once: no longer a candidate for its tenant's own jobs
            # All of a victim's slices are promised to this job for the cycle, even beyond its need,
            # so spare pending slices never grow and "reclaim is futile" stays true once true.
            pool.pending += held_count(victim)
            pool.claim(held_count(victim))
            self.ledger.mark_leaving(victim.tenant, entry.gen, held_count(victim) * pool.slice_type.chips)
            self.out.append(Preempt(victim.id, job.id, reasons.preempt_reason(victim, job, pool, entry.gen)))
        self.out.append(Wait(job.id, reasons.reclaiming(job, pool, avail, victims or [])))
        return True

    # -- 2b. priority preemption inside a tenant -------------------------------------------------

    def _may_yield(self, job: JobView, gen: str) -> bool:
        """Whether ``job``'s tenant lets it preempt its own jobs and has one of lower priority in ``gen``."""
        own = self.own.get((job.tenant, gen), ())
        return len(own) > 0 and own[0].priority < job.priority and self._preempts_own(job.tenant)

    def _preempts_own(self, tenant: TenantName) -> bool:
        return self.tenants[tenant].preemption != "never"

    def _yield_for(self, entry: _Entry) -> bool:
        """Preempt the tenant's own lower-priority jobs so ``entry`` fits its quota and its slices.

        Candidates are the tenant's running jobs of the generation with a lower priority, in victim
        order (lowest priority, then most recently admitted, then id), taken while they help: while
        chips are still needed to bring the job within quota, or slices of its type are still
        missing. Then every chosen job that is not needed is put back (last chosen first), as
        Kueue does, so no victim can be spared. Nothing changes when they cannot free enough: a
        preemption always lets the preemptor run (by quota and by slices, with what is free now).
        """
        job, pool, gen = entry.job, entry.pool, entry.gen
        own = self.own.get((job.tenant, gen))
        if not own or own[0].priority >= job.priority or not self._preempts_own(job.tenant):
            return False
        if pool.head is not None and pool.head is not job:
            return False  # the slices it would yield for go to the type's head first
        used = self.ledger.used(job.tenant, gen) - self.own_leaving.get((job.tenant, gen), 0)
        need_chips = used + entry.chips - self.ledger.quota_of(job.tenant, gen)
        avail, spare = pool.avail, pool.spare_pending
        need_slices = job.num_slices - avail - spare
        chosen: list[tuple[JobView, int, int]] = []  # victim, chips, slices of the job's type
        chips = slices = 0
        for victim in own:
            if victim.priority >= job.priority or (chips >= need_chips and slices >= need_slices):
                break
            facts = type_facts(victim.accelerator_type)
            assert facts is not None  # only jobs of known types are candidates
            same = held_count(victim) if facts.key == pool.key else 0
            if chips < need_chips or (same and slices < need_slices):
                chosen.append((victim, held_count(victim) * facts.chips, same))
                chips, slices = chips + chosen[-1][1], slices + same
        if chips < need_chips or slices < need_slices:
            return False
        for pick in reversed(list(chosen)):
            if chips - pick[1] >= need_chips and slices - pick[2] >= need_slices:
                chosen.remove(pick)
                chips, slices = chips - pick[1], slices - pick[2]
        taken = min(avail, job.num_slices)
        pool.reserve(taken, job)
        pool.claim(min(spare, job.num_slices - taken))
        key = (job.tenant, gen)
        for victim, victim_chips, same in chosen:
            own.remove(victim)
            self.own_leaving[key] = self.own_leaving.get(key, 0) + victim_chips
            self.ledger.mark_leaving(job.tenant, gen, victim_chips)
            facts = type_facts(victim.accelerator_type)
            victim_pool = self.pools.get(facts.key) if facts is not None else None
            if victim_pool is not None:
                victim_pool.pending += held_count(victim)
                victim_pool.yielding += held_count(victim)
                if victim in victim_pool.victims:
                    victim_pool.victims.remove(victim)
            if same:
                pool.claim(same)
            self.out.append(
                Preempt(victim.id, job.id, reasons.yield_reason(victim, job, pool, gen), within_tenant=True)
            )
        self._hold(entry, pool)
        victims = [v for v, _, _ in chosen]
        self.out.append(Wait(job.id, reasons.yielding(job, pool, taken, victims), head_of_line=True))
        return True

    def _hold(self, entry: _Entry, pool: TypePool) -> None:
        """After ``entry``'s job yielded: it heads its type, so the slices it yielded for are
        still its own next cycle (the head's reservation sticks), and its tenant's lower-priority
        jobs of the generation that would take the quota it needs wait this cycle (admitted now,
        they would be the next ones it preempts)."""
        if pool.head is None:
            self._become_head(pool, entry.job)
        key = (entry.job.tenant, entry.gen)
        held = self.held.get(key)
        if held is None or held.job.priority < entry.job.priority:
            self.held[key] = entry
        self._settled.clear()  # the fates settled so far read neither

    # -- 3. borrowing pass -------------------------------------------------------------------------

    def _quota_if_beyond(self, job: JobView, gen: str, chips: int) -> int | None:
        """The tenant's quota when this job would take it beyond it, else None."""
        quota = self.ledger.quota[job.tenant].get(gen, 0)
        return quota if self.ledger.usage[job.tenant].get(gen, 0) + chips > quota else None

    def _place_borrower(self, entry: _Entry) -> None:
        beyond = self._quota_if_beyond(entry.job, entry.gen, entry.chips)
        if entry.job.num_slices <= entry.pool.avail:
            self._admit(entry, borrowing=beyond is not None)
        else:
            self._wait_blocked(entry, quota=beyond)

    def _admit(self, entry: _Entry, *, borrowing: bool) -> None:
        slices = entry.pool.take(entry.job)
        self.ledger.add(entry.job.tenant, entry.gen, entry.chips)
        self.out.append(Admit(entry.job.id, slices, borrowing))

    # -- 4. waiting and the head of line -----------------------------------------------------------

    def _wait_blocked(self, entry: _Entry, *, quota: int | None) -> None:
        job, pool = entry.job, entry.pool
        reason = self._blocked(job, pool, entry.gen, entry.chips, quota)
        if pool.head is None:
            self._become_head(pool, job)
            avail = pool.avail
            pool.reserve(avail, job)
            pool.claim(min(pool.spare_pending, job.num_slices - avail))
            reason = reasons.head_note(reason, pool)
        self.out.append(Wait(job.id, reason, head_of_line=pool.head is job))

    @staticmethod
    def _become_head(pool: TypePool, job: JobView) -> None:
        """``job`` holds ``pool``'s head-of-line reservation; the reasons built for the type go stale."""
        pool.head = job
        pool.version += 1

    def _blocked(self, job: JobView, pool: TypePool, gen: str, chips: int, quota: int | None) -> NotFit:
        """``reasons.blocked``, shared between the jobs that wait for the same thing."""
        lower = pool.head is not None and pool.head.priority > job.priority
        key = (pool.key, pool.version, job.num_slices, lower, quota is not None and (job.tenant, chips))
        reason = self._reasons.get(key)
        if reason is None:
            reason = self._reasons[key] = reasons.blocked(job, pool, gen, chips, quota)
        return reason

    # -- order -------------------------------------------------------------------------------------

    def _order(self, job: JobView) -> _Key:
        """Priority, then fair share (last cycle's head of line first), then seq; live as usage moves."""
        share = _STICKY if job.head_of_line else self.ledger.share(job.tenant)
        return (-job.priority, share, job.seq, job.id)

    def _key(self, entry: _Entry) -> _Key:
        return self._order(entry.job)

    def _job_key(self, queue: list[JobView], index: int) -> _Key:
        return self._order(queue[index])

    def _job_key_at(self, queue: list[JobView]) -> Callable[[int], _Key]:
        """``_job_key`` of ``queue`` by index alone (a key for ``bisect`` over a range)."""
        return lambda index: self._order(queue[index])
