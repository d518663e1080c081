"""End-to-end job throughput (issue 30): jobs/s from submit to SUCCEEDED through the whole control
plane of ``serve --sandbox`` (store, loop, policy, API in process, ``MemoryCluster.sandbox``),
on a fleet with room (more slices than jobs in flight), on SQLite and PostgreSQL.

Each run: a fresh database, one tenant whose quota covers the fleet, ``--jobs`` one-slice jobs
(``--job-seconds`` each, 0 by default, so the figure is the control plane's own pace) submitted in
one batch through ``POST /api/v1/jobs/batch``; the clock starts at the submit and stops when the
last job has ended; every job must be SUCCEEDED on its first attempt. ``--runs`` runs per database;
the median and the spread are printed. PostgreSQL: a throwaway server (``bench/_pg.py``, a
fresh database per run) when PostgreSQL is installed; ``--no-pg`` to skip it.

    .venv/bin/python bench/throughput.py [--jobs 3000] [--fleet v4-16:512] [--job-seconds 0]
                                         [--runs 3] [--no-pg]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from _pg import postgres_server
from fastapi.testclient import TestClient

from tpufleet.api.server import ControlPlane
from tpufleet.control.cluster.memory import MemoryCluster
from tpufleet.control.loop.service import ServiceConfig


def one_run(url: str | None, args: argparse.Namespace) -> float:
    """Jobs per second from the batch submit to the last job's end (None: SQLite in a temp dir)."""
    with tempfile.TemporaryDirectory() as tmp:
        cluster = MemoryCluster.sandbox(args.fleet, job_seconds=args.job_seconds)
        config = ServiceConfig(interval_s=0.05, busy_interval_s=0.01)
        cp = ControlPlane(cluster, state_dir=tmp, db_url=url, config=config)
        http = TestClient(cp.app)
        admin = {"Authorization": f"Bearer {cp.admin_token}"}
        tenant = {"name": "bench", "quota": {"v4": 1_000_000}, "preemption": "never"}
        http.post("/api/v1/tenants", json=tenant, headers=admin).raise_for_status()
        body = {"command": ["python", "train.py"], "accelerator_type": "v4-16", "tenant": "bench"}
        cp.start()
        while not cp.service.cycles:  # the slices are discovered before the clock starts
            time.sleep(0.01)
        started = time.perf_counter()
        resp = http.post("/api/v1/jobs/batch", json={"jobs": [body] * args.jobs}, headers=admin)
        resp.raise_for_status()
        cp.service.wake()
        while True:
            counts = cp.store.counts()
            if not counts["queued"] and not counts["running"]:
                break
            if time.perf_counter() - started > args.timeout:
                cp.close()
                raise SystemExit(f"TIMEOUT after {args.timeout:g} s: {counts}")
            time.sleep(0.05)  # the poll runs in the measured process: kept light (<1 % of a run)
        elapsed = time.perf_counter() - started
        cp.close()
        jobs = cp.store.jobs.all()
        bad = [j.id for j in jobs if (j.state, j.attempt, j.failures) != ("SUCCEEDED", 1, 0)]
        if bad or len(jobs) != args.jobs:
            raise SystemExit(f"not every job SUCCEEDED on attempt 1: {len(bad)} did not, {len(jobs)} jobs")
        cp.store.close()
        return args.jobs / elapsed


@contextlib.contextmanager
def postgres(args: argparse.Namespace) -> Iterator[Any | None]:
    if args.no_pg:
        yield None
        return
    with postgres_server() as server:
        yield server


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--fleet", default="v4-16:512")
    parser.add_argument("--job-seconds", type=float, default=0.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--no-pg", action="store_true")
    args = parser.parse_args()
    print(f"{args.jobs:,} one-slice jobs of {args.job_seconds:g} s, fleet {args.fleet}, {args.runs} runs")
    with postgres(args) as pg:
        for name in ("sqlite", "postgresql"):
            if name == "postgresql" and pg is None:
                continue
            rates = []
            for _ in range(args.runs):
                url = None if name == "sqlite" else pg.new_database()
                rates.append(one_run(url, args))
                print(f"  {name}: {rates[-1]:,.0f} jobs/s", flush=True)
            print(
                f"{name}: median {statistics.median(rates):,.0f} jobs/s "
                f"(min {min(rates):,.0f}, max {max(rates):,.0f}) submit -> SUCCEEDED",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
