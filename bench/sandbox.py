"""Sandbox mode at scale (issue 9's proof): 10,000 jobs of mixed shapes from two tenants, submitted
in ONE batch through the API, all reach SUCCEEDED exactly once (one attempt each) over the
in-memory ``SandboxCluster``, with the whole control plane (store, loop, policy, API) in process.

Each tenant's quota covers the whole fleet (quotas may sum to more than it) and preemption is never, so
nobody borrows and no attempt is preempted: every job needs exactly one attempt (checked row by row). Prints
the submit time, the time until the last job ended, the loop's cycles and cycle p50/p95 (timed here
around every ``Service.run_once``), and ``GET /api/v1/status`` as ``tpufleet status --json`` shows
it. SQLite in a temp dir by default, or ``--db URL``.

    .venv/bin/python bench/sandbox.py [--jobs 10000] [--fleet v4-16:64,v4-32:16,v6e-16:16]
                                      [--job-seconds 0.2] [--db URL] [--timeout 1800]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select

from tpufleet.api.server import ControlPlane
from tpufleet.control.cluster.memory import MemoryCluster
from tpufleet.control.loop.service import ServiceConfig
from tpufleet.control.store.tables import AttemptRow

SHAPES = [("v4-16", 1), ("v4-32", 1), ("v4-16", 2), ("v6e-16", 1), ("v4-16", 1), ("v4-32", 2)]


def jobs(n: int) -> list[dict[str, Any]]:
    return [
        {
            "command": ["python", "train.py", str(i)],
            "accelerator_type": SHAPES[i % len(SHAPES)][0],
            "num_slices": SHAPES[i % len(SHAPES)][1],
            "priority": i % 3,
            "tenant": "team-a" if (i // len(SHAPES)) % 2 else "team-b",
        }
        for i in range(n)
    ]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--fleet", default="v4-16:64,v4-32:16,v6e-16:16")
    parser.add_argument("--job-seconds", type=float, default=0.2)
    parser.add_argument("--db", default=None)
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args()

    tmp = tempfile.TemporaryDirectory()
    cluster = MemoryCluster.sandbox(args.fleet, job_seconds=args.job_seconds)
    config = ServiceConfig(interval_s=0.05, busy_interval_s=0.01)
    cp = ControlPlane(cluster, state_dir=tmp.name, db_url=args.db, config=config)
    cycle_ms: list[float] = []
    run_once = cp.service.run_once

    def timed() -> Any:
        started = time.perf_counter()
        try:
            return run_once()
        finally:
            cycle_ms.append((time.perf_counter() - started) * 1000)

    cp.service.run_once = timed  # type: ignore[method-assign]
    http = TestClient(cp.app)
    admin = {"Authorization": f"Bearer {cp.admin_token}"}
    for name, weight in (("team-a", 2.0), ("team-b", 1.0)):
        body = {
            "name": name,
            "quota": {"v4": 1_000_000, "v6e": 1_000_000},
            "weight": weight,
            "preemption": "never",
        }
        http.post("/api/v1/tenants", json=body, headers=admin).raise_for_status()

    print(f"{args.jobs:,} jobs, fleet {args.fleet}, every host runs {args.job_seconds:g} s")
    started = time.perf_counter()
    resp = http.post("/api/v1/jobs/batch", json={"jobs": jobs(args.jobs)}, headers=admin)
    resp.raise_for_status()
    ids = resp.json()["ids"]
    submit_s = time.perf_counter() - started
    print(f"submitted in one batch: {submit_s:.2f} s ({args.jobs / submit_s:,.0f} jobs/s)")

    started = time.perf_counter()
    cp.start()
    while True:
        counts = cp.store.counts()
        if not counts["queued"] and not counts["running"]:
            break
        if time.perf_counter() - started > args.timeout:
            print(f"TIMEOUT after {args.timeout:g} s: {counts}")
            return 1
        time.sleep(0.5)
    elapsed = time.perf_counter() - started
    status = http.get("/api/v1/status", headers=admin).json()
    cp.close()

    ok = verify(cp, ids)
    print(f"all ended in {elapsed:.1f} s ({args.jobs / elapsed:,.0f} jobs/s through the fleet)")
    p50, p95 = statistics.median(cycle_ms), pct(cycle_ms, 0.95)
    print(f"cycles {len(cycle_ms)}: p50 {p50:.1f} ms, p95 {p95:.1f} ms, max {max(cycle_ms):.1f} ms")
    print("GET /api/v1/status:", json.dumps({k: status.get(k) for k in sorted(status)}))
    print("every job SUCCEEDED exactly once, one attempt each:", "yes" if ok else "NO")
    tmp.cleanup()
    return 0 if ok else 1


def verify(cp: ControlPlane, ids: list[str]) -> bool:
    """Every job SUCCEEDED on attempt 1 with no failure, and it has exactly one attempt row, SUCCEEDED."""
    store = type(cp.store).open(cp.db_url)
    jobs = {j.id: j for j in store.jobs.all()}
    bad = [j for j in jobs.values() if (j.state, j.attempt, j.failures) != ("SUCCEEDED", 1, 0)]
    with store.tx() as s:
        attempts = sorted((a.job_id, a.attempt, a.state) for a in s.scalars(select(AttemptRow)))
    store.close()
    if bad or sorted(jobs) != sorted(ids) or attempts != sorted((i, 1, "SUCCEEDED") for i in ids):
        print(f"not as expected: {len(bad)} jobs not SUCCEEDED on attempt 1; {len(attempts)} attempt rows")
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
