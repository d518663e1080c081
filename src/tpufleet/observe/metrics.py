"""The control plane's Prometheus metrics, read from the store when Prometheus scrapes.

``FleetCollector`` is a custom collector (prometheus_client's ``Collector``): nothing is counted in
the loop's hot path; each scrape reads what it needs (DESIGN.md, Metrics):

| name | type | labels |
| --- | --- | --- |
| ``tpufleet_jobs`` | gauge | tenant, state |
| ``tpufleet_admission_wait_seconds`` | histogram | tenant |
| ``tpufleet_attempts_ended_total`` | counter | tenant, reason |
| ``tpufleet_slices`` | gauge | accelerator_type, state |
| ``tpufleet_tenant_chips_held`` / ``tpufleet_tenant_chips_quota`` | gauge | tenant, generation |
| ``tpufleet_chip_seconds_total`` / ``tpufleet_cost_dollars_total`` | counter | tenant, generation, pricing |
| ``tpufleet_job_goodput_ratio`` | gauge | tenant, job (jobs holding slices that report steps) |

``tpufleet_scheduling_cycle_seconds`` (histogram) is the loop's own: :func:`cycle_histogram`; a
standby replica cycles nothing, so it adds nothing to it. ``tpufleet_leader`` (gauge, label
``replica``) is each replica's own: 1 where it leads, 0 on a standby (:func:`leader_gauge`). The
gauges and counters above are read from the one database: every replica answers them alike, so a
query over several replicas takes ``max`` of them (docs/replicas.md).

**Counters survive a restart.** They are sums over the store's attempt records, not in-process
counts: a restarted control plane's first scrape reads every attempt once and carries on from the
same totals. After that a scrape reads only the attempts admitted or ended since the previous one
(indexed, with a margin of ``SLACK_S`` for transactions that commit late; an attempt already counted
is not counted again) plus the jobs holding slices now, whose chip-seconds grow until they end. A
counter never goes down between two scrapes of one process (a late commit cannot make it shrink);
changing the price table makes ``tpufleet_cost_dollars_total`` jump, which ``rate()`` treats as a
reset. Label cardinality is bounded: ``job`` appears only on the goodput gauge, and a finished job
leaves it.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from tpufleet import pricing
from tpufleet.control.store.usage import Usage, UsageAttempt
from tpufleet.observe import goodput
from tpufleet.observe.cost import attempt_chip_seconds, chips_per_slice, generation_of

__all__ = ["CYCLE_BUCKETS", "WAIT_BUCKETS", "FleetCollector", "cycle_histogram", "ended_reason"]

WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
CYCLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
SLACK_S = 300.0
Key = tuple[str, int]


def ended_reason(a: UsageAttempt) -> str:
    """How an attempt ended, as ``tpufleet_attempts_ended_total``'s ``reason``: succeeded, failed,
    host_lost (a host or its slice was lost), preempted, requeued (a control-plane restart cut its
    launch short), cancelled."""
    if a.state == "FAILED":
        lost = any(str(h.get("state")) == "LOST" for h in a.exit_codes)
        words = a.message or ""
        if lost or " was lost" in words or " is broken" in words:
            return "host_lost"
        return "failed"
    return a.state.lower()


class _Ledger:
    """Counter totals over ended attempts, and admission waits, kept between scrapes."""

    def __init__(self) -> None:
        self.loaded = False
        self.mark = 0.0  # the clock at the last read
        self.ended: dict[tuple[str, str], float] = defaultdict(float)  # (tenant, reason) -> attempts
        self.chip_s: dict[tuple[str, str, str], float] = defaultdict(float)  # (tenant, gen, pricing)
        self.waits: dict[str, list[float]] = {}  # tenant -> bucket counts (+Inf last), then sum
        self.seen_ended: dict[Key, float] = {}  # counted ended attempts near the mark -> ended_at
        self.seen_admitted: dict[Key, float] = {}

    def add_ended(self, a: UsageAttempt, pricing_of: dict[str, str]) -> None:
        assert a.ended_at is not None
        self.seen_ended[(a.job_id, a.attempt)] = a.ended_at
        self.ended[(a.tenant, ended_reason(a))] += 1
        held = max(0.0, a.ended_at - a.admitted_at)
        gen = generation_of(a.accelerator_type)
        for kind, chip_s in attempt_chip_seconds(a, held, pricing_of).items():
            self.chip_s[(a.tenant, gen, kind)] += chip_s

    def add_admitted(self, a: UsageAttempt) -> None:
        self.seen_admitted[(a.job_id, a.attempt)] = a.admitted_at
        if a.waited_from is None:
            return
        wait = max(0.0, a.admitted_at - a.waited_from)
        counts = self.waits.setdefault(a.tenant, [0.0] * (len(WAIT_BUCKETS) + 2))
        counts[bisect.bisect_left(WAIT_BUCKETS, wait)] += 1
        counts[-1] += wait

    def advance(self, usage: Usage, now: float, pricing_of: dict[str, str]) -> None:
        if not self.loaded:
            for a in usage.every_attempt():
                self.add_admitted(a)
                if a.ended_at is not None:
                    self.add_ended(a, pricing_of)
            self.loaded = True
        else:
            since = self.mark - SLACK_S
            for a in usage.admitted_since(since):
                if (a.job_id, a.attempt) not in self.seen_admitted:
                    self.add_admitted(a)
            for a in usage.ended_since(since):
                if a.ended_at is not None and (a.job_id, a.attempt) not in self.seen_ended:
                    self.add_ended(a, pricing_of)
        self.mark = max(self.mark, now)
        horizon = self.mark - 2 * SLACK_S
        self.seen_ended = {k: t for k, t in self.seen_ended.items() if t >= horizon}
        self.seen_admitted = {k: t for k, t in self.seen_admitted.items() if t >= horizon}


class FleetCollector(Collector):
    """Every store-derived tpufleet metric (see the module docstring), computed at scrape time."""

    def __init__(self, usage: Usage, prices: pricing.PriceTable | None = None) -> None:
        self.usage = usage
        self.prices = prices or pricing.shipped()
        self._ledger = _Ledger()
        self._lock = threading.Lock()
        self._counted: dict[tuple[str, tuple[str, ...]], float] = {}  # last value of every counter

    def describe(self) -> Iterable[Any]:
        return []  # families are only known at scrape time (no registration-time reads)

    def collect(self) -> Iterator[Any]:
        with self._lock:
            now = self.usage.clock()
            pricing_of = self.usage.slice_pricing()
            self._ledger.advance(self.usage, now, pricing_of)
            open_attempts = self.usage.open_attempts()
            yield self._jobs()
            yield self._waits()
            yield self._counter(
                "tpufleet_attempts_ended",
                "Attempts that ended, by how they ended (succeeded, failed, host_lost, preempted, requeued, "
                "cancelled)",
                ("tenant", "reason"),
                dict(self._ledger.ended),
            )
            yield self._slices()
            yield from self._chips(open_attempts)
            yield from self._cost(open_attempts, now, pricing_of)
            yield self._goodput(now)

    def _jobs(self) -> GaugeMetricFamily:
        g = GaugeMetricFamily("tpufleet_jobs", "Jobs by tenant and state", labels=("tenant", "state"))
        for tenant, state, n in sorted(self.usage.job_counts()):
            g.add_metric((tenant, state), n)
        return g

    def _waits(self) -> HistogramMetricFamily:
        h = HistogramMetricFamily(
            "tpufleet_admission_wait_seconds",
            "Seconds from submission (or the previous attempt's end) to admission, per admitted attempt",
            labels=("tenant",),
        )
        for tenant, counts in sorted(self._ledger.waits.items()):
            buckets, running = [], 0.0
            for bound, count in zip((*WAIT_BUCKETS, float("inf")), counts[:-1], strict=True):
                running += count
                buckets.append(("+Inf" if bound == float("inf") else f"{float(bound):g}", running))
            h.add_metric((tenant,), buckets, counts[-1])
        return h

    def _slices(self) -> GaugeMetricFamily:
        g = GaugeMetricFamily(
            "tpufleet_slices", "Slices by type and state", labels=("accelerator_type", "state")
        )
        for accel, state, n in sorted(self.usage.slice_counts()):
            g.add_metric((accel, state), n)
        return g

    def _chips(self, open_attempts: list[UsageAttempt]) -> Iterator[GaugeMetricFamily]:
        held: dict[tuple[str, str], float] = defaultdict(float)
        quota = {(t, g): float(c) for t, q in self.usage.quotas().items() for g, c in q.items()}
        for a in open_attempts:
            held[(a.tenant, generation_of(a.accelerator_type))] += (
                chips_per_slice(a.accelerator_type) * a.num_slices
            )
        labels = ("tenant", "generation")
        g = GaugeMetricFamily("tpufleet_tenant_chips_held", "Chips a tenant's jobs hold now", labels=labels)
        for key in sorted(set(held) | set(quota)):
            g.add_metric(key, held.get(key, 0.0))
        yield g
        q = GaugeMetricFamily(
            "tpufleet_tenant_chips_quota", "A tenant's nominal quota in chips", labels=labels
        )
        for key, chips in sorted(quota.items()):
            q.add_metric(key, chips)
        yield q

    def _cost(
        self, open_attempts: list[UsageAttempt], now: float, pricing_of: dict[str, str]
    ) -> Iterator[CounterMetricFamily]:
        chip_s = dict(self._ledger.chip_s)
        counted = {(a.job_id, a.attempt) for a in open_attempts} & set(self._ledger.seen_ended)
        for a in open_attempts:
            if (a.job_id, a.attempt) in counted:
                continue  # it ended between the two reads: counted once, as ended
            gen = generation_of(a.accelerator_type)
            for kind, value in attempt_chip_seconds(a, max(0.0, now - a.admitted_at), pricing_of).items():
                chip_s[(a.tenant, gen, kind)] = chip_s.get((a.tenant, gen, kind), 0.0) + value
        labels = ("tenant", "generation", "pricing")
        yield self._counter(
            "tpufleet_chip_seconds", "Chip-seconds held by a tenant's jobs (admission to end)", labels, chip_s
        )
        dollars = {}
        for (tenant, gen, kind), value in chip_s.items():
            cost = pricing.dollars(value, self.prices.price(gen, kind))
            if cost is not None:  # an unknown price has no series, never a zero one
                dollars[(tenant, gen, kind)] = cost
        yield self._counter(
            "tpufleet_cost_dollars",
            "US dollars of the chip-seconds held, at the price table's prices",
            labels,
            dollars,
        )

    def _goodput(self, now: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(
            "tpufleet_job_goodput_ratio",
            "Productive over held time of each job that holds slices and reports steps",
            labels=("tenant", "job"),
        )
        by_job: dict[str, list[UsageAttempt]] = defaultdict(list)
        for a in self.usage.holding_attempts():
            by_job[a.job_id].append(a)
        for job_id, attempts in sorted(by_job.items()):
            ratio = goodput.job_goodput(attempts, now).ratio
            if ratio is not None:
                g.add_metric((attempts[0].tenant, job_id), ratio)
        return g

    def _counter(
        self, name: str, doc: str, labels: tuple[str, ...], values: dict[Any, float]
    ) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=labels)
        for key, value in sorted(values.items()):
            k = (name, tuple(key))
            value = max(value, self._counted.get(k, 0.0))  # never down between scrapes of one process
            self._counted[k] = value
            c.add_metric(tuple(key), value)
        return c


def cycle_histogram(registry: CollectorRegistry) -> Callable[[float], None]:
    """``tpufleet_scheduling_cycle_seconds`` in ``registry``; returns what observes one cycle
    (``Service.cycle_observers``). In-process by nature: it starts again with the process."""
    h = Histogram(
        "tpufleet_scheduling_cycle_seconds",
        "Seconds one scheduling cycle took (inventory, policy, writes, acting, logs)",
        buckets=CYCLE_BUCKETS,
        registry=registry,
    )
    return h.observe


class _LeaderGauge(Collector):
    def __init__(self, replica: str, leads: Callable[[], bool]) -> None:
        self.replica, self.leads = replica, leads

    def collect(self) -> Iterator[GaugeMetricFamily]:
        what = "1 on the replica that leads (runs the loop), 0 on a standby"
        g = GaugeMetricFamily("tpufleet_leader", what, labels=["replica"])
        g.add_metric([self.replica], 1.0 if self.leads() else 0.0)
        yield g


def leader_gauge(registry: CollectorRegistry, replica: str, leads: Callable[[], bool]) -> None:
    """``tpufleet_leader{replica}`` in ``registry``: this process's own answer, per replica (the
    one series a replica's ``/metrics`` has that no other replica's has; scraping every replica,
    ``max`` over the store's gauges counts each once)."""
    registry.register(_LeaderGauge(replica, leads))
