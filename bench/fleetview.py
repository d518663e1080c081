"""What one read of the fleet page costs: ``GET /api/v1/fleet`` with many queued jobs.

The page and ``tpufleet top`` poll it every second per viewer, so it must not grow with the queue.
For each queue size (``--queued``, default 10,000 and 100,000) on SQLite in a temp dir: submits the
jobs (eight tenants, mixed shapes and priorities), runs one scheduling cycle over an in-memory
cluster (``MemoryCluster``: the fleet's slices are stored and the jobs that fit are admitted), then
times ``--reads`` reads through the API in-process (FastAPI's TestClient: routing, auth, JSON) for
the admin and for one tenant, and prints p50/p95 and the answer's size. Goal: well inside the
page's one-second poll at 100,000 queued (the admin's read is a top-N query plus per-tenant counts;
a tenant's adds one windowed query over the queued jobs of its head's slice types). Figures are
printed, never asserted.

    .venv/bin/python bench/fleetview.py [--queued 10000,100000] [--reads 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from cycle import FLEET, TENANTS, fill
from fastapi.testclient import TestClient

from tpufleet.api.app import create_app
from tpufleet.control.cluster.memory import MemoryCluster, Script
from tpufleet.control.loop.service import Service, ServiceConfig


def timed_reads(http: TestClient, token: str, reads: int) -> tuple[float, float, int]:
    headers = {"Authorization": f"Bearer {token}"}
    times, size = [], 0
    for _ in range(reads):
        started = time.perf_counter()
        resp = http.get("/api/v1/fleet", headers=headers)
        times.append(time.perf_counter() - started)
        assert resp.status_code == 200, resp.text
        size = len(resp.content)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, round(0.95 * (len(times) - 1)))], size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queued", default="10000,100000", help="comma list of queue sizes")
    parser.add_argument("--reads", type=int, default=20)
    args = parser.parse_args()
    print(f"fleet {FLEET}; {len(TENANTS)} tenants; {args.reads} reads each")
    for queued in (int(x) for x in args.queued.split(",")):
        with tempfile.TemporaryDirectory(prefix="tpufleet-bench-") as tmp:
            store, _ = fill(f"sqlite:///{tmp}/db.sqlite", queued)
            cluster = MemoryCluster.of(FLEET, script=lambda spec: Script(run_after=1, exit_after=None))
            Service(store, cluster, state_dir=tmp, config=ServiceConfig(stop_threads=0)).run_once()
            http = TestClient(create_app(store))
            tenant = next(iter(TENANTS))
            who = {"admin": store.tokens.issue(None), f"tenant {tenant}": store.tokens.issue(tenant)}
            for name, token in who.items():
                p50, p95, size = timed_reads(http, token, args.reads)
                print(
                    f"sqlite {queued:>7,} queued  {name:<13} p50 {p50 * 1000:7.1f} ms  "
                    f"p95 {p95 * 1000:7.1f} ms  answer {size / 1024:6.1f} KiB"
                )
            store.close()


if __name__ == "__main__":
    main()
