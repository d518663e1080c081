"""Queue-driven autoscaling in whole slices: ``autoscale(snapshot) -> [Create | Delete]``, pure.

The control plane builds a :class:`ScaleSnapshot` each cycle: the policy's own ``Snapshot`` (tenants,
slices, jobs), the pools of the fleet spec (``min_slices``, ``max_slices``, ``spot``), every slice the
autoscaler made and where it stands (:class:`Managed`), and the idle timeout. ``plan`` returns what
to create and delete, and which queued jobs wait on slices being made (``Plan.waiting``), so those
jobs can say ``PROVISIONING``. Nothing here reads a clock, does I/O or imports Ray; ages come in as
seconds measured by the caller.

The rules, in order:

1. **Clean up.** A slice that was preempted or suspended (``GONE``) is deleted; a ``FAILED`` one is
   deleted once ``retry_after_s`` passed, so its message stays on the waiting jobs a while and the
   demand below asks for a fresh one (the retry).
2. **Demand.** Queued jobs are taken per accelerator type in priority, then submission order,
   first every job its tenant's quota allows (usage: the chips of the tenant's active jobs of the
   generation, plus the jobs counted before it this cycle), then the jobs that would borrow. A job
   first takes free slices of its type (a tenant's private slices before shared ones), then slices
   still being made; what is missing is created, whole slices only, if the pools of the type have
   room under ``max_slices`` (pools that allow spot first: spot is preferred). A job that no room can
   ever serve makes nothing. A borrower (``borrowing``, on by default) makes slices only out of quota
   the other tenants leave unused: the chips of the generation held and asked for by every tenant,
   itself included, stay within the sum of their quotas, as Kueue lends a cohort's unused nominal
   quota. So an autoscaled fleet lends what a fixed fleet of its quotas' size would have standing
   idle, and pays for it only while it is used; the policy preempts borrowers first when a job
   within its quota needs their slices back. With ``borrowing`` off a borrower never makes a slice
   (it runs only on slices left free).
3. **Floor and spares.** A pool below ``min_slices`` gets slices up to it. A type whose pools ask
   for ``spare_slices`` keeps that many slices free beyond the demand above (free ones no queued
   job takes, and ones being made that no job waits on), so a job that arrives finds one ready
   instead of waiting the minutes a slice takes to make: the price of a short wait, paid in idle
   slices.
4. **Idle.** A ready slice that is free, was idle for ``idle_timeout_s``, and is not needed by the
   demand above nor kept as a spare is deleted, longest idle first, never below its pool's
   ``min_slices``, never while held, and never while the job it was made for is still queued (no
   flapping: that job has not had its chance yet).

Slices the autoscaler did not make (named slice groups, a fleet's fixed slices) are used as supply
but never created or deleted here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeAlias

from tpufleet.scheduler.model import (
    ACTIVE_STATES,
    JobId,
    JobState,
    JobView,
    SliceName,
    SliceState,
    Snapshot,
    TenantName,
)
from tpufleet.scheduler.state import gen_key, held_count, type_facts

__all__ = [
    "Action",
    "Create",
    "Delete",
    "Managed",
    "Phase",
    "Plan",
    "PoolView",
    "ScaleSnapshot",
    "autoscale",
    "plan",
]


class Phase(StrEnum):
    """Where a slice the autoscaler made stands (from its provider group's state)."""

    PENDING = "PENDING"  # WAITING_FOR_RESOURCES or PROVISIONING
    READY = "READY"  # ACTIVE: the slice is (or is about to be) in the inventory
    FAILED = "FAILED"  # the provider gave up; retried after retry_after_s
    GONE = "GONE"  # preempted, noticed for preemption or SUSPENDED: replace it
    DELETING = "DELETING"  # asked to go; counts for nothing


@dataclass(frozen=True)
class PoolView:
    name: str
    accelerator_type: str  # GCE naming, e.g. "v4-8"
    min_slices: int = 0
    max_slices: int = 1
    spot: bool = False  # the pool may use spot slices (and then prefers them)
    spare_slices: int = 0  # slices of the type kept free beyond the demand (ready for arrivals)


@dataclass(frozen=True)
class Managed:
    """One slice the autoscaler made (each is a provider group of one slice)."""

    group: str
    pool: str
    phase: Phase
    slice: SliceName | None = None  # the physical slice once the provider named it
    spot: bool = False
    age_s: float = 0.0  # seconds in this phase
    idle_s: float | None = None  # READY and free: seconds since it was last held (or became ready)
    for_job: JobId | None = None  # the queued job it was made for


@dataclass(frozen=True)
class ScaleSnapshot:
    fleet: Snapshot
    pools: Sequence[PoolView] = ()
    managed: Sequence[Managed] = ()
    idle_timeout_s: float = 60.0
    retry_after_s: float = 10.0
    private: Mapping[SliceName, TenantName] = field(default_factory=dict)  # slice -> its only tenant
    borrowing: bool = True  # a borrower may make slices out of quota other tenants leave unused


@dataclass(frozen=True)
class Create:
    pool: str
    accelerator_type: str
    spot: bool
    for_job: JobId | None = None  # None: to keep the pool at min_slices


@dataclass(frozen=True)
class Delete:
    group: str
    reason: str


Action: TypeAlias = Create | Delete


@dataclass(frozen=True)
class Plan:
    actions: list[Action]
    # queued job -> the groups (existing, pending or failed) it waits on; a job that asked for a
    # slice this cycle waits on its Create too (``creating``).
    waiting: dict[JobId, tuple[str, ...]]
    creating: dict[JobId, int]  # queued job -> slices created for it this cycle


def autoscale(snapshot: ScaleSnapshot) -> list[Action]:
    """What to create and delete this cycle (see the module docstring for the rules)."""
    return plan(snapshot).actions


def plan(snapshot: ScaleSnapshot) -> Plan:
    return _Planner(snapshot).run()


_LIVE = (Phase.PENDING, Phase.READY, Phase.FAILED)


class _Planner:
    def __init__(self, s: ScaleSnapshot) -> None:
        self.s = s
        self.actions: list[Action] = []
        self.waiting: dict[JobId, tuple[str, ...]] = {}
        self.creating: dict[JobId, int] = {}
        self.pools = {p.name: p for p in s.pools}
        self.by_type: dict[str, list[PoolView]] = defaultdict(list)
        for p in s.pools:
            facts = type_facts(p.accelerator_type)
            self.by_type[facts.key if facts else p.accelerator_type].append(p)
        for pools in self.by_type.values():
            pools.sort(key=lambda p: (not p.spot, p.name))  # spot first: preferred where allowed
        self.deleting: set[str] = set()
        self.live: dict[str, int] = defaultdict(int)  # pool -> slices that count against max/min
        self.visible = {v.name: v for v in s.fleet.slices}

    def run(self) -> Plan:
        self._clean_up()
        for m in self.s.managed:
            if m.phase in _LIVE and m.group not in self.deleting:
                self.live[m.pool] += 1
        leftover, unclaimed = self._demand()
        floor = self._floor()
        self._spares(leftover, unclaimed, floor)
        self._idle(leftover)
        return Plan(self.actions, self.waiting, self.creating)

    def _delete(self, m: Managed, reason: str) -> None:
        self.deleting.add(m.group)
        self.actions.append(Delete(m.group, reason))

    # -- 1. clean up --------------------------------------------------------------------------
    def _clean_up(self) -> None:
        for m in self.s.managed:
            if m.phase is Phase.GONE and not self._held(m):
                self._delete(m, "preempted or suspended by the provider; replaced on demand")
            elif m.phase is Phase.FAILED and m.age_s >= self.s.retry_after_s:
                self._delete(m, "provisioning failed; a new request replaces it")

    def _held(self, m: Managed) -> bool:
        view = self.visible.get(m.slice) if m.slice else None
        return view is not None and (view.holder is not None or view.state is SliceState.HELD)

    # -- 2. demand ----------------------------------------------------------------------------
    def _supply(self) -> tuple[dict[str, list[str]], dict[tuple[str, str], int], dict[str, int]]:
        """Per type: groups being made (or failed, not yet retried) that no job took yet; per
        (tenant, type): free private slices; per type: free shared slices."""
        pending: dict[str, list[str]] = defaultdict(list)
        for m in self.s.managed:
            if m.group in self.deleting or m.phase not in _LIVE:
                continue
            pool = self.pools.get(m.pool)
            facts = type_facts(pool.accelerator_type) if pool else None
            shown = m.slice is not None and m.slice in self.visible
            if facts and (m.phase is not Phase.READY or not shown):
                pending[facts.key].append(m.group)
        private: dict[tuple[str, str], int] = defaultdict(int)
        shared: dict[str, int] = defaultdict(int)
        for v in self.s.fleet.slices:
            facts = type_facts(v.accelerator_type)
            if facts is None or v.state is not SliceState.FREE or v.holder is not None:
                continue
            owner = self.s.private.get(v.name)
            if owner is not None:
                private[(owner, facts.key)] += 1
            else:
                shared[facts.key] += 1
        return pending, private, shared

    def _demand(self) -> tuple[dict[str, int], dict[str, list[str]]]:
        """Walk the queue; returns the free shared slices per type no queued job needs, and the
        groups being made that no queued job waits on."""
        pending, private, shared = self._supply()
        quota = {t.name: {gen_key(g): c for g, c in t.quota.items()} for t in self.s.fleet.tenants}
        used: dict[tuple[str, str], int] = defaultdict(int)
        queued: list[JobView] = []
        for j in self.s.fleet.jobs:
            facts = type_facts(j.accelerator_type)
            if j.state in ACTIVE_STATES and facts is not None:
                used[(j.tenant, facts.gen)] += facts.chips * held_count(j)
            elif j.state is JobState.QUEUED:
                queued.append(j)
        queued.sort(key=lambda j: (-j.priority, j.seq, j.id))
        borrowers: list[tuple[JobView, str, str, int]] = []  # job, type key, generation, chips
        for job in queued:
            facts = type_facts(job.accelerator_type)
            if facts is None or job.num_slices < 1 or job.tenant not in quota:
                continue
            chips = facts.chips * job.num_slices
            if used[(job.tenant, facts.gen)] + chips > quota[job.tenant].get(facts.gen, 0):
                borrowers.append((job, facts.key, facts.gen, chips))  # after the jobs within quota
            elif self._place(job, facts.key, pending, private, shared):
                used[(job.tenant, facts.gen)] += chips
        if not self.s.borrowing:
            return shared, pending
        # The cohort's quota (every tenant's) bounds what borrowers make: the generation's chips
        # held and asked for, borrowers included, stay within it.
        cohort: dict[str, int] = defaultdict(int)
        for limits in quota.values():
            for gen, chips in limits.items():
                cohort[gen] += chips
        total: dict[str, int] = defaultdict(int)
        for (_tenant, gen), chips in used.items():
            total[gen] += chips
        for job, key, gen, chips in borrowers:
            if total[gen] + chips > cohort[gen]:
                continue  # no unused quota left to lend: it waits for slices left free
            if self._place(job, key, pending, private, shared):
                total[gen] += chips
        return shared, pending

    def _place(
        self,
        job: JobView,
        key: str,
        pending: dict[str, list[str]],
        private: dict[tuple[str, str], int],
        shared: dict[str, int],
    ) -> bool:
        """Give the job free slices, then slices being made, then new ones; False when no room."""
        own = private[(job.tenant, key)]
        need = job.num_slices
        room = sum(self._room(p) for p in self.by_type.get(key, ()))
        if need > own + shared[key] + len(pending[key]) + room:
            return False  # the pools can never hold it now: leave the supply to others
        take = min(own, need)
        private[(job.tenant, key)] -= take
        need -= take
        take = min(shared[key], need)
        shared[key] -= take
        need -= take
        waits = pending[key][:need]
        del pending[key][: len(waits)]
        need -= len(waits)
        made = 0
        for pool in self.by_type.get(key, ()):
            while need > 0 and self._room(pool) > 0:
                self._create(pool, job.id)
                need -= 1
                made += 1
        if waits or made:
            self.waiting[job.id] = tuple(waits)
        if made:
            self.creating[job.id] = made
        return True

    def _create(self, pool: PoolView, for_job: JobId | None = None) -> None:
        """Ask for one slice of ``pool`` (counted against its max at once)."""
        self.actions.append(Create(pool.name, pool.accelerator_type, pool.spot, for_job))
        self.live[pool.name] += 1

    def _room(self, pool: PoolView) -> int:
        return max(0, pool.max_slices - self.live[pool.name])

    # -- 3. floor -----------------------------------------------------------------------------
    def _floor(self) -> dict[str, int]:
        """Fill pools up to ``min_slices``; returns the slices made per type (free when ready)."""
        made: dict[str, int] = defaultdict(int)
        for key, pools in self.by_type.items():
            for pool in pools:
                for _ in range(max(0, pool.min_slices - self.live[pool.name])):
                    self._create(pool)
                    made[key] += 1
        return made

    def _spares(
        self, leftover: dict[str, int], unclaimed: dict[str, list[str]], floor: dict[str, int]
    ) -> None:
        """Make what each type lacks of its pools' ``spare_slices``; take the spares out of
        ``leftover``, so the idle rule keeps them."""
        for key, pools in self.by_type.items():
            want = sum(p.spare_slices for p in pools)
            if want <= 0:
                continue
            kept = min(want, leftover.get(key, 0))
            leftover[key] = leftover.get(key, 0) - kept
            missing = want - kept - len(unclaimed.get(key, ())) - floor.get(key, 0)
            for pool in pools:
                while missing > 0 and self._room(pool) > 0:
                    self._create(pool)
                    missing -= 1

    # -- 4. idle ------------------------------------------------------------------------------
    def _idle(self, leftover: dict[str, int]) -> None:
        queued = {j.id for j in self.s.fleet.jobs if j.state is JobState.QUEUED}
        candidates = [
            m
            for m in self.s.managed
            if m.phase is Phase.READY
            and m.group not in self.deleting
            and m.slice in self.visible
            and self.visible[m.slice].state is SliceState.FREE
            and self.visible[m.slice].holder is None
            and m.slice not in self.s.private
            and m.idle_s is not None
            and m.idle_s >= self.s.idle_timeout_s
            and (m.for_job is None or m.for_job not in queued)
        ]
        candidates.sort(key=lambda m: (-(m.idle_s or 0.0), m.group))
        for m in candidates:
            pool = self.pools.get(m.pool)
            facts = type_facts(pool.accelerator_type) if pool else None
            if pool is None or facts is None:
                continue
            if leftover.get(facts.key, 0) <= 0 or self.live[pool.name] <= pool.min_slices:
                continue
            leftover[facts.key] -= 1
            self.live[pool.name] -= 1
            self._delete(m, f"idle for {m.idle_s:.0f} s (idle timeout {self.s.idle_timeout_s:g} s)")
