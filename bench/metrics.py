"""What a Prometheus scrape and a cost report cost with many finished jobs in the store.

Fills a SQLite store (temp dir) with ``--jobs`` finished jobs of 8 tenants (one attempt each, half
of them with reported steps) and ``--running`` running ones, then times:

- the first ``GET /metrics`` collection of a fresh collector (a restarted control plane: it reads
  every attempt once to rebuild the counters);
- steady collections (``--scrapes``), during which a few jobs end and are admitted between scrapes
  (only those are read again);
- a cost report (every tenant, all time; and the last hour), what ``tpufleet cost`` and the fleet
  page read; and ``cost.AllTime``, which ``GET /api/v1/cost`` keeps for all-time reports: its
  first report reads everything, the next ones only what changed.

Goal (issue 11): a steady scrape reads no table whole, so it stays in the tens of milliseconds at
100,000 jobs. Figures are printed, never asserted.

    .venv/bin/python bench/metrics.py [--jobs 100000] [--running 200] [--scrapes 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy import insert, update

from tpufleet import pricing
from tpufleet.control.cluster.memory import FakeClock
from tpufleet.control.store.facade import Store
from tpufleet.control.store.tables import AttemptRow, JobRow
from tpufleet.control.store.usage import Usage
from tpufleet.control.store.values import JobRequest
from tpufleet.observe import cost
from tpufleet.observe.metrics import FleetCollector

TENANTS = [f"team-{i}" for i in range(8)]


def fill(store: Store, clock: FakeClock, jobs: int, running: int) -> list[str]:
    for t in TENANTS:
        store.tenants.create(t, {"v4": 64})
    request = JobRequest.build(command=("python", "t.py"), accelerator_type="v4-16")
    owners = [TENANTS[i % len(TENANTS)] for i in range(jobs + running)]
    ids = store.jobs.submit_many(owners, [request] * len(owners))
    now = clock.now
    rows: list[dict[str, Any]] = []
    for i, job_id in enumerate(ids):
        start = now - 86400 + i * 0.5
        done = i < jobs
        steps = {"first_step": 1, "first_step_at": start + 20, "last_step": 100, "last_step_at": start + 200}
        rows.append(
            {
                "job_id": job_id, "attempt": 1, "slices": [f"tpu-v4-16-{i % 64}"],
                "state": "SUCCEEDED" if done else "RUNNING", "message": None, "exit_codes": [],
                "admitted_at": start, "started_at": start + 5, "ended_at": start + 210 if done else None,
                **(steps if i % 2 else {}),
            }
        )  # fmt: skip
    with store.tx() as s:
        s.execute(insert(AttemptRow), rows)
        s.execute(update(JobRow).where(JobRow.id.in_(ids[:jobs])).values(state="SUCCEEDED"))
        s.execute(update(JobRow).where(JobRow.id.in_(ids[jobs:])).values(state="RUNNING"))
    return ids[jobs:]


def churn(store: Store, clock: FakeClock, running: list[str], n: int) -> None:
    """``n`` running jobs end now (their attempts get an end); as many new ones were admitted."""
    now = clock.advance(15)
    ending, running[:] = running[:n], running[n:]
    with store.tx() as s:
        s.execute(
            update(AttemptRow).where(AttemptRow.job_id.in_(ending)).values(ended_at=now, state="SUCCEEDED")
        )
        s.execute(update(JobRow).where(JobRow.id.in_(ending)).values(state="SUCCEEDED"))


def scrape(registry: CollectorRegistry) -> float:
    t0 = time.perf_counter()
    generate_latest(registry)
    return (time.perf_counter() - t0) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--running", type=int, default=200)
    ap.add_argument("--scrapes", type=int, default=20)
    args = ap.parse_args()
    clock = FakeClock()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(f"sqlite:///{tmp}/tpufleet.db", clock=clock)
        t0 = time.perf_counter()
        running = fill(store, clock, args.jobs, args.running)
        print(
            f"filled {args.jobs:,} finished + {args.running} running jobs in {time.perf_counter() - t0:.1f} s"
        )
        registry = CollectorRegistry(auto_describe=False)
        registry.register(FleetCollector(Usage(store)))
        print(f"first scrape (a restarted control plane): {scrape(registry):,.0f} ms")
        steady = []
        for _ in range(args.scrapes):
            churn(store, clock, running, max(1, args.running // args.scrapes // 2))
            steady.append(scrape(registry))
        q = statistics.quantiles(steady, n=20)
        print(f"steady scrapes: p50 {statistics.median(steady):,.1f} ms, p95 {q[-1]:,.1f} ms")
        usage = Usage(store)
        for since in (None, 3600.0):
            t0 = time.perf_counter()
            report = cost.report(
                usage.attempts(since=None if since is None else clock.now - since, lean=True),
                pricing.shipped(),
                usage.slice_pricing(),
                now=clock.now,
                since=None if since is None else clock.now - since,
            )
            what = "all time" if since is None else "last hour"
            ms = (time.perf_counter() - t0) * 1000
            print(f"cost report, {what}: {ms:,.0f} ms ({len(report.jobs):,} jobs)")
        kept = cost.AllTime(usage, pricing.shipped())
        for what in ("first", "next"):
            churn(store, clock, running, 2)
            t0 = time.perf_counter()
            kept.report()
            print(f"all-time report kept between calls ({what}): {(time.perf_counter() - t0) * 1000:,.0f} ms")
        store.close()


if __name__ == "__main__":
    main()
