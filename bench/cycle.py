"""One scheduling cycle of the whole loop (store + SchedState + policy + writes) with many queued jobs.

For each database (SQLite in a temp dir; PostgreSQL on a throwaway server, started as
tests/unit/conftest.py starts one; ``--no-pg`` to skip) and each queue size (``--queued``, default
10,000 and 100,000):

- submits the jobs with ``Store.submit_many`` (the batch API's path) and prints jobs/s;
- runs one cycle of a ``Service`` over an in-memory cluster (``MemoryCluster``; the policy and the
  store are the real ones; it admits what fits and stores every job's wait reason), then times
  the first cycle of a second ``Service`` on the same store: a restarted control plane's whole read;
- runs ``--cycles`` steady cycles during which five jobs arrive and a few running ones end (and
  as many are admitted and launched) per cycle, and prints their p50 and p95;
- does the same with ``ServiceConfig(incremental=False)``, which reads every job from the store
  each cycle, as the loop did before this change: the figures to compare with;
- prints the policy's own share (``decide`` alone, p50 of the steady cycles), and the steady
  cycles' CPU time (p50), which a busy or shared machine disturbs less than their wall time,
  and the process's resident memory after them (``rss``: the control plane's, in process).

Goals (issue 9): with 100,000 queued jobs a steady cycle p50 <= 300 ms and the first cycle after
a restart <= 5 s. Figures are printed, never asserted.

    .venv/bin/python bench/cycle.py [--queued 10000,100000] [--cycles 30] [--no-pg] [--no-baseline]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import tempfile
import time
from collections.abc import Iterator

from _pg import postgres_server

from tpufleet.control.cluster.memory import MemoryCluster, Script
from tpufleet.control.loop.service import Service, ServiceConfig
from tpufleet.control.store.facade import Store
from tpufleet.control.store.values import JobRequest, Limits
from tpufleet.scheduler.model import RunDecision, Snapshot
from tpufleet.scheduler.policy import decide_runs

FLEET = "v4-16:48,v4-32:16,v6e-16:32"  # 96 slices, 320 hosts
SHAPES = [("v4-16", 1), ("v4-32", 1), ("v4-16", 2), ("v6e-16", 1)]
TENANTS = {f"team-{i}": {"v4": 128, "v6e": 64} for i in range(8)}


def requests(n: int, offset: int = 0) -> list[JobRequest]:
    return [
        JobRequest.build(
            command=["python", "train.py", f"--run={offset + i}"],
            accelerator_type=SHAPES[(offset + i) % len(SHAPES)][0],
            num_slices=SHAPES[(offset + i) % len(SHAPES)][1],
            priority=(offset + i) % 3,
        )
        for i in range(n)
    ]


def fill(url: str, queued: int) -> tuple[Store, float]:
    """A fresh store with the tenants and ``queued`` jobs; returns it and the jobs/s of the inserts."""
    store = Store.open(url, limits=Limits(max_queued_per_tenant=10**6))
    for name, quota in TENANTS.items():
        store.tenants.create(name, quota)
    names = list(TENANTS)
    started = time.perf_counter()
    for first in range(0, queued, 10_000):
        batch = requests(min(10_000, queued - first), first)
        store.jobs.submit_many([names[(first + i) % len(names)] for i in range(len(batch))], batch)
    return store, queued / (time.perf_counter() - started)


def measure(store: Store, tmp: str, cycles: int, incremental: bool) -> dict[str, float]:
    """First cycle of a fresh service, then steady cycles with arrivals and endings."""
    cluster = MemoryCluster.of(FLEET, script=lambda spec: Script(run_after=1, exit_after=None))
    config = ServiceConfig(stop_threads=0, incremental=incremental)
    Service(store, cluster, state_dir=tmp, config=config).run_once()  # admits, writes every reason
    policy_s: list[float] = []

    def timed(snapshot: Snapshot) -> list[RunDecision]:
        started = time.perf_counter()
        out = decide_runs(snapshot)
        policy_s.append(time.perf_counter() - started)
        return out

    service = Service(store, cluster, state_dir=tmp, decide=timed, config=config)  # a restart
    gc.collect()
    started = time.perf_counter()
    service.run_once()
    first = time.perf_counter() - started
    service.run_once()  # the admitted attempts start running
    names, times, cpu_s, arrivals = list(TENANTS), [], [], 0
    for cycle in range(cycles):
        batch = requests(5, 10**7 + arrivals)
        store.jobs.submit_many([names[(arrivals + i) % len(names)] for i in range(len(batch))], batch)
        arrivals += len(batch)
        running = sorted(cluster.running_attempts())
        for job_id, _ in running[cycle % 7 :: 40]:  # a few attempts end every cycle
            cluster.exit(job_id, 0)
        gc.collect()
        started, cpu = time.perf_counter(), time.process_time()
        service.run_once()
        times.append(time.perf_counter() - started)
        cpu_s.append(time.process_time() - cpu)
    times.sort()
    gc.collect()
    return {
        "rss_mib": _rss_mib(),
        "first_s": first,
        "p50_s": statistics.median(times),
        "p95_s": times[min(len(times) - 1, round(0.95 * (len(times) - 1)))],
        "cpu_p50_s": statistics.median(cpu_s),
        "policy_p50_s": statistics.median(policy_s[1:]),  # decide() alone, steady cycles
    }


def _rss_mib() -> float:
    """This process's resident memory now (it is the control plane: store client, kept state and
    policy; the PostgreSQL server's own is apart), from /proc/self/status."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


@contextlib.contextmanager
def postgres(args: argparse.Namespace) -> Iterator[object | None]:
    """A throwaway PostgreSQL server (a fresh database per run), or None with ``--no-pg``."""
    if args.no_pg:
        yield None
        return
    with postgres_server() as server:
        yield server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queued", default="10000,100000", help="comma list of queue sizes")
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--no-pg", action="store_true")
    parser.add_argument("--no-baseline", action="store_true", help="skip the whole-read comparison")
    args = parser.parse_args()
    sizes = [int(x) for x in args.queued.split(",")]
    print(f"fleet {FLEET}; {len(TENANTS)} tenants; {args.cycles} steady cycles after the first")
    print(
        f"{'db':<11} {'queued':>8} {'submit/s':>9} {'mode':<12} {'restart':>8} {'p50':>8} {'p95':>8} "
        f"{'cpu p50':>8} {'policy p50':>10} {'rss':>8}"
    )
    with tempfile.TemporaryDirectory() as tmp, postgres(args) as pg:
        dbs: list[tuple[str, object]] = [("sqlite", None)] + ([("postgresql", pg)] if pg else [])
        for db, server in dbs:
            for n in sizes:
                modes = [True] if args.no_baseline else [True, False]
                for incremental in modes:
                    url = _fresh_url(db, server, tmp, n, incremental)
                    store, rate = fill(url, n)
                    try:
                        figures = measure(store, tmp, args.cycles, incremental)
                    finally:
                        store.close()
                    mode = "incremental" if incremental else "whole-read"
                    print(
                        f"{db:<11} {n:>8} {rate:>9.0f} {mode:<12} {figures['first_s'] * 1000:>7.0f}ms "
                        f"{figures['p50_s'] * 1000:>6.0f}ms {figures['p95_s'] * 1000:>6.0f}ms "
                        f"{figures['cpu_p50_s'] * 1000:>6.0f}ms {figures['policy_p50_s'] * 1000:>8.0f}ms "
                        f"{figures['rss_mib']:>5.0f}MiB",
                        flush=True,
                    )


def _fresh_url(db: str, server: object, tmp: str, n: int, incremental: bool) -> str:
    if db == "sqlite":
        return f"sqlite:///{tmp}/cycle-{n}-{int(incremental)}.db"
    url: str = server.new_database()  # type: ignore[attr-defined]
    return url


if __name__ == "__main__":
    main()
