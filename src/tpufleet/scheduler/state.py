"""Bookkeeping for one scheduling cycle: the slice pool of each type and each tenant's usage.

``decide`` builds these from a ``Snapshot`` and mutates them while it simulates the cycle, so jobs
admitted (or slices reserved) early in the cycle are seen by the jobs after them. Private to the
scheduler package; the public vocabulary is ``model``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache

from tpufleet.catalog import SliceType, generation
from tpufleet.errors import SpecError
from tpufleet.scheduler.model import JobId, JobView, SliceName, TenantName, TenantView, lookup_type

__all__ = ["Ledger", "TypeFacts", "TypePool", "gen_key", "held_count", "natural_key", "type_facts"]

_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders ``s-2`` before ``s-10`` (numbers compare as numbers)."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in _DIGITS.split(name) if p)


def gen_key(name: str) -> str:
    """A quota key normalised to the catalog's generation name (``v5litepod`` -> ``v5e``)."""
    try:
        return generation(name).name
    except SpecError:
        return name


@dataclass(frozen=True)
class TypeFacts:
    """What the policy needs of a slice type, computed once per spelling (``v4-16``, ``TPU-V4-16``)."""

    key: str  # canonical accelerator type: the pool it belongs to
    gen: str  # catalog generation name: the quota it counts against
    chips: int
    slice_type: SliceType


@cache
def type_facts(accelerator_type: str) -> TypeFacts | None:
    st = lookup_type(accelerator_type)
    return None if st is None else TypeFacts(st.accelerator_type, st.gen_name, st.chips, st)


def held_count(job: JobView) -> int:
    """Slices an active job holds (its list when known, else what it asked for)."""
    return len(job.slices) or job.num_slices


@dataclass
class TypePool:
    """The slices of one accelerator type and what this cycle has done with them so far.

    ``free`` is sorted by name; admissions take from the front (``taken``). ``reserved`` of the
    remaining free slices are promised to waiting jobs (the head of line, or in-quota jobs whose
    preemptions are in flight); ``pending`` slices are held by jobs being preempted and will come
    free, ``claimed`` of them are already promised.
    """

    key: str
    slice_type: SliceType
    total: int = 0
    broken: int = 0
    draining: int = 0
    free: list[SliceName] = field(default_factory=list)
    taken: int = 0
    reserved: int = 0
    reserver: JobView | None = None
    head: JobView | None = None
    pending: int = 0
    claimed: int = 0
    yielding: int = 0  # of ``pending``: held by jobs preempted for a higher-priority job of their tenant
    holders: dict[JobId, tuple[TenantName, int]] = field(default_factory=dict)
    victims: list[JobView] = field(default_factory=list)
    failed: dict[TenantName, int] = field(default_factory=dict)
    version: int = 0
    _holders_text: tuple[int, str] = (-1, "")

    @property
    def intact(self) -> int:
        return self.total - self.broken - self.draining

    @property
    def free_left(self) -> int:
        return len(self.free) - self.taken

    @property
    def avail(self) -> int:
        """Free slices nobody has a claim on."""
        return len(self.free) - self.taken - self.reserved

    @property
    def spare_pending(self) -> int:
        return self.pending - self.claimed

    def take(self, job: JobView) -> tuple[SliceName, ...]:
        chosen = tuple(self.free[self.taken : self.taken + job.num_slices])
        self.taken += job.num_slices
        self.holders[job.id] = (job.tenant, job.num_slices)
        self.version += 1
        return chosen

    def reserve(self, count: int, job: JobView) -> None:
        if count > 0:
            self.reserved += count
            self.reserver = self.reserver or job
            self.version += 1

    def claim(self, count: int) -> None:
        if count > 0:
            self.claimed += count
            self.version += 1

    def holders_text(self) -> str:
        """``1 held by job abc (tenant research), ...`` (cached until the pool changes)."""
        if self._holders_text[0] != self.version:
            holders = list(self.holders.items())
            parts = [f"{n} held by job {j} (tenant {t})" for j, (t, n) in holders[:3]]
            if len(holders) > 3:
                rest = sum(n for _, (_, n) in holders[3:])
                parts.append(
                    f"{rest} more held by {len(holders) - 3} more job{'s' if len(holders) > 4 else ''}"
                )
            if self.broken or self.draining:
                parts.append(f"{self.broken} broken, {self.draining} draining")
            self._holders_text = (self.version, "; ".join(parts))
        return self._holders_text[1]


class Ledger:
    """Each tenant's quota, weight and usage (chips per generation) during the cycle.

    Fair share, the tenant-order key (smaller = further below its fair share, goes first), is the
    pair compared lexicographically::

        borrowed(t) = max_g max(0, usage_g(t) - quota_g(t)) / capacity_g / weight(t)
        quota_fraction(t) = max_{g: quota_g(t) > 0} min(usage_g(t), quota_g(t)) / quota_g(t) / weight(t)

    ``capacity_g`` is the chips of every slice of generation ``g`` in the fleet. The first term is
    Kueue's dominant resource share (only borrowing counts, relative to the shared pool); the second
    orders tenants that borrow nothing by how much of their own entitlement they already use. A
    weight of 2 lets a tenant use twice as much before it ranks behind another.
    """

    def __init__(self, tenants: dict[TenantName, TenantView], capacity: dict[str, int]) -> None:
        self.quota = {name: {gen_key(g): q for g, q in t.quota.items()} for name, t in tenants.items()}
        self.weight = {name: t.weight if t.weight > 0 else 1e-9 for name, t in tenants.items()}
        self.usage: dict[TenantName, dict[str, int]] = {name: {} for name in tenants}
        self.leaving: dict[TenantName, dict[str, int]] = {name: {} for name in tenants}
        self.capacity = capacity
        self._share: dict[TenantName, tuple[float, float]] = {}

    def quota_of(self, tenant: TenantName, gen: str) -> int:
        return self.quota[tenant].get(gen, 0)

    def used(self, tenant: TenantName, gen: str) -> int:
        return self.usage[tenant].get(gen, 0)

    def add(self, tenant: TenantName, gen: str, chips: int, *, leaving: bool = False) -> None:
        if tenant not in self.usage:
            return
        self.usage[tenant][gen] = self.used(tenant, gen) + chips
        if leaving:
            self.mark_leaving(tenant, gen, chips)
        self._share.pop(tenant, None)

    def mark_leaving(self, tenant: TenantName, gen: str, chips: int) -> None:
        if tenant in self.leaving:
            self.leaving[tenant][gen] = self.leaving[tenant].get(gen, 0) + chips

    def over(self, tenant: TenantName, gen: str) -> int:
        """Chips beyond quota, not counting jobs already being preempted."""
        staying = self.used(tenant, gen) - self.leaving.get(tenant, {}).get(gen, 0)
        return staying - self.quota_of(tenant, gen) if tenant in self.quota else 0

    def share(self, tenant: TenantName) -> tuple[float, float]:
        cached = self._share.get(tenant)
        if cached is None:
            usage, quota, w = self.usage[tenant], self.quota[tenant], self.weight[tenant]
            borrowed = max(
                (max(0, u - quota.get(g, 0)) / max(1, self.capacity.get(g, 0)) for g, u in usage.items()),
                default=0.0,
            )
            fraction = max((min(usage.get(g, 0), q) / q for g, q in quota.items() if q > 0), default=0.0)
            cached = self._share[tenant] = (borrowed / w, fraction / w)
        return cached
