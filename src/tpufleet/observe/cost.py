"""Cost: chip-seconds held times the price, per tenant and per job, and the dollars lost to badput.

Cost = chip-seconds x price: an attempt holds ``num_slices`` slices of its type from admission to
its end (or now), each slice's chips at that slice's price (on-demand or spot: ``Usage.slice_pricing``)
for the job's generation (``pricing.PriceTable``). Dollars lost to badput are the same arithmetic
over the held time goodput does not count as productive (start-up, wasted progress, idle; see
``goodput.py``), so only for jobs that report steps. An unknown price leaves dollars unknown
(None, "unknown"), never zero; a tenant's total over some priced and some unpriced chip time says
how many chip-hours had no price. Pure arithmetic over ``control.usage`` rows.
"""

from __future__ import annotations

import re
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache

from tpufleet import catalog, pricing
from tpufleet.control.store.usage import ON_DEMAND, Usage, UsageAttempt
from tpufleet.errors import SpecError
from tpufleet.observe import goodput
from tpufleet.scheduler.lifecycle import TERMINAL_STATES

__all__ = [
    "AllTime",
    "CostReport",
    "JobCost",
    "TenantCost",
    "assemble",
    "attempt_chip_seconds",
    "parse_duration",
    "report",
]

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw]?)")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str, field_name: str = "since") -> float:
    """``7d``, ``12h``, ``30m``, ``90s`` or plain seconds, as seconds; SpecError otherwise."""
    found = _DURATION.fullmatch(str(text).strip().lower())
    if found is None or float(found.group(1)) <= 0:
        raise SpecError(
            f"{str(text)[:40]!r} is not a duration; give e.g. 7d, 12h, 30m or 3600 (seconds)",
            field=field_name,
        )
    return float(found.group(1)) * _UNIT[found.group(2)]


@cache
def chips_per_slice(accelerator_type: str) -> int:
    try:
        return catalog.slice_type(accelerator_type).chips
    except SpecError:
        return 0


@cache
def generation_of(accelerator_type: str) -> str:
    try:
        return catalog.slice_type(accelerator_type).generation.name
    except SpecError:
        return accelerator_type.rsplit("-", 1)[0]


def attempt_chip_seconds(a: UsageAttempt, seconds: float, pricing_of: Mapping[str, str]) -> dict[str, float]:
    """Chip-seconds of ``seconds`` of an attempt's hold, by pricing (its slices may differ)."""
    chips = chips_per_slice(a.accelerator_type)
    out: dict[str, float] = defaultdict(float)
    names = a.slices or tuple("" for _ in range(a.num_slices))
    for name in names:
        out[pricing_of.get(name, ON_DEMAND)] += chips * seconds
    return dict(out)


@dataclass
class JobCost:
    job_id: str
    name: str
    tenant: str
    state: str
    accelerator_type: str
    generation: str
    chip_seconds: float = 0.0
    dollars: float | None = None  # None: no price known for any of it
    unpriced_chip_seconds: float = 0.0
    badput_chip_seconds: float | None = None  # None: the job reports no steps
    badput_dollars: float | None = None
    goodput: float | None = None

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = dict(vars(self))  # flat values: no deep copy (asdict) of 100,000 rows
        out["chip_hours"] = round(self.chip_seconds / 3600, 6)
        out["unpriced_chip_hours"] = round(self.unpriced_chip_seconds / 3600, 6)
        return out


@dataclass
class TenantCost:
    tenant: str
    jobs: int = 0
    chip_seconds: float = 0.0
    dollars: float | None = None
    unpriced_chip_seconds: float = 0.0
    badput_dollars: float | None = None  # over the jobs that report steps (see ``unreported_jobs``)
    unreported_jobs: int = 0  # jobs that report no steps: their badput is unknown
    by_generation: dict[str, float] = field(default_factory=dict)  # chip-seconds

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = dict(vars(self))  # flat values: no deep copy (asdict) of 100,000 rows
        out["chip_hours"] = round(self.chip_seconds / 3600, 6)
        out["unpriced_chip_hours"] = round(self.unpriced_chip_seconds / 3600, 6)
        return out


@dataclass(frozen=True)
class CostReport:
    since: float | None
    until: float
    tenants: list[TenantCost]
    jobs: list[JobCost]
    prices: list[dict[str, object]]

    def to_dict(self) -> dict[str, object]:
        return {
            "since": self.since,
            "until": self.until,
            "currency": "USD",
            "tenants": [t.to_dict() for t in self.tenants],
            "jobs": [j.to_dict() for j in self.jobs],
            "prices": self.prices,
        }


def report(
    attempts: Sequence[UsageAttempt],
    prices: pricing.PriceTable,
    pricing_of: Mapping[str, str],
    *,
    now: float,
    since: float | None = None,
) -> CostReport:
    """Cost per job and per tenant of ``attempts`` (grouped by job), within [since, now]."""
    by_job: dict[str, list[UsageAttempt]] = defaultdict(list)
    for a in attempts:
        by_job[a.job_id].append(a)
    jobs = [job_cost(rows, prices, pricing_of, now=now, since=since) for rows in by_job.values()]
    return assemble(jobs, prices, now=now, since=since)


def assemble(
    jobs: Iterable[JobCost], prices: pricing.PriceTable, *, now: float, since: float | None = None
) -> CostReport:
    """The report of these jobs' costs: the jobs that held chips, most expensive first per tenant,
    and each tenant's sums."""
    held = sorted(
        (j for j in jobs if j.chip_seconds > 0),
        key=lambda j: (j.tenant, -(j.dollars or 0.0), -j.chip_seconds, j.job_id),
    )
    tenants: dict[str, TenantCost] = {}
    for j in held:
        t = tenants.setdefault(j.tenant, TenantCost(j.tenant))
        t.jobs += 1
        t.chip_seconds += j.chip_seconds
        t.unpriced_chip_seconds += j.unpriced_chip_seconds
        t.dollars = _add(t.dollars, j.dollars)
        t.badput_dollars = _add(t.badput_dollars, j.badput_dollars)
        t.unreported_jobs += j.badput_chip_seconds is None
        t.by_generation[j.generation] = t.by_generation.get(j.generation, 0.0) + j.chip_seconds
    return CostReport(since, now, sorted(tenants.values(), key=lambda t: t.tenant), held, prices.to_list())


class AllTime:
    """Every job's all-time cost, kept between reports (``GET /api/v1/cost`` without ``since``).

    The first report reads every attempt; later ones read again only the jobs that hold slices now
    (their cost grows), the jobs with an attempt admitted or ended since the last report (with
    ``slack_s`` for transactions that commit late) and the unfinished jobs kept from before. A job
    that finished, with every attempt ended, no longer changes and is not read again. The same
    numbers as :func:`report` over every attempt (a test compares them)."""

    def __init__(self, usage: Usage, prices: pricing.PriceTable, slack_s: float = 300.0) -> None:
        self.usage, self.prices, self.slack_s = usage, prices, slack_s
        self.jobs: dict[str, JobCost] = {}
        self.open: set[str] = set()  # kept jobs that may still change
        self.mark: float | None = None
        self._lock = threading.Lock()

    def report(self, tenant: str | None = None) -> CostReport:
        with self._lock:  # API requests run on a thread pool
            return self._report(tenant)

    def _report(self, tenant: str | None) -> CostReport:
        now = self.usage.clock()
        pricing_of = self.usage.slice_pricing()
        if self.mark is None:
            rows = self.usage.attempts(lean=True)
        else:
            since = self.mark - self.slack_s
            touched = {a.job_id for a in self.usage.admitted_since(since)}
            touched |= {a.job_id for a in self.usage.ended_since(since)}
            touched |= {a.job_id for a in self.usage.open_attempts()} | self.open
            rows = self.usage.attempts(job_ids=touched, lean=True) if touched else []
        by_job: dict[str, list[UsageAttempt]] = defaultdict(list)
        for a in rows:
            by_job[a.job_id].append(a)
        for job_id, attempts in by_job.items():
            self.jobs[job_id] = job_cost(attempts, self.prices, pricing_of, now=now)
            finished = attempts[0].job_state in TERMINAL_STATES and all(
                a.ended_at is not None for a in attempts
            )
            (self.open.discard if finished else self.open.add)(job_id)
        self.mark = now
        mine = self.jobs.values() if tenant is None else (j for j in self.jobs.values() if j.tenant == tenant)
        return assemble(mine, self.prices, now=now)


def job_cost(
    attempts: Sequence[UsageAttempt],
    prices: pricing.PriceTable,
    pricing_of: Mapping[str, str],
    *,
    now: float,
    since: float | None = None,
) -> JobCost:
    """One job's chip time, dollars and badput dollars within [since, now]."""
    first = attempts[0]
    gen = generation_of(first.accelerator_type)
    out = JobCost(first.job_id, first.job_name, first.tenant, first.job_state, first.accelerator_type, gen)
    parts = [s.clipped(since, now) for s in goodput.segments(attempts, now)]
    reported = any(a.first_step is not None for a in attempts)
    by_attempt = {a.attempt: a for a in attempts}
    for seg in parts:
        a = by_attempt[seg.attempt]
        for kind, chip_s in attempt_chip_seconds(a, seg.seconds, pricing_of).items():
            price = prices.price(gen, kind)
            cost = pricing.dollars(chip_s, price)
            out.chip_seconds += chip_s
            if cost is None:
                out.unpriced_chip_seconds += chip_s
            out.dollars = _add(out.dollars, cost)
            if reported and seg.kind != "productive":
                out.badput_chip_seconds = (out.badput_chip_seconds or 0.0) + chip_s
                out.badput_dollars = _add(out.badput_dollars, cost)
    if reported:
        out.badput_chip_seconds = out.badput_chip_seconds or 0.0
        if out.dollars is not None:
            out.badput_dollars = out.badput_dollars or 0.0
        out.goodput = goodput.job_goodput(attempts, now, since=since).ratio
    return out


def _add(total: float | None, value: float | None) -> float | None:
    if value is None:
        return total
    return value if total is None else total + value
