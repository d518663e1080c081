"""Dispatch latency: submit-to-all-hosts-running for a free 2-host v4-16 slice, tpufleet vs raw Ray.

One emulated fleet (``v4-16:2``), one run, interleaved: each round measures

- **tpufleet**: ``RayCluster.launch`` of an attempt on a free slice held by the warm pool, then
  ``poll`` until every host reports ``RUNNING`` (its process has started). This is what the
  service does after admission; ``--via service`` is the hook for timing the full service
  (submit through the store and the scheduling loop) once it can be driven from here.
- **raw Ray**: ``ray.util.tpu.slice_placement_group`` (its head-reservation round trip, then the
  worker group) and ``run_on_slice`` of a task that records when it started on each host; the
  figure is the last host's start time minus the submit time.

The pool holds the first slice for tpufleet; the second is given back to Ray for the raw path, so
both always start on a free slice. Figures: p50 and p95 (nearest rank) over ``--runs`` rounds.

    .venv/bin/python bench/dispatch.py [--runs 20] [--ray-address ADDR] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import ray
from ray.util.tpu import get_num_ready_tpu_slices, run_on_slice, slice_placement_group

from tpufleet.control.cluster import AttemptSpec
from tpufleet.control.executor import RayCluster

TARGET_P50_S = 0.3


@contextlib.contextmanager
def fleet_address(address: str | None, slices: str) -> Iterator[str]:
    """An existing cluster's address, or a fresh emulated fleet torn down afterwards."""
    if address:
        yield address
        return
    from tpufleet.emulator import EmulatedFleet

    with EmulatedFleet(slices) as fleet:
        yield fleet.ray_address


class ExecutorPath:
    """tpufleet's dispatch: the admitted job is handed a slice the warm pool already holds."""

    def __init__(self, cluster: RayCluster, slice_name: str) -> None:
        self.cluster = cluster
        self.slice_name = slice_name
        self.n = 0

    def once(self) -> float:
        self.n += 1
        spec = AttemptSpec(f"bench-{self.n}", 1, (self.slice_name,), "v4-16", ("sleep", "60"))
        t0 = time.perf_counter()
        self.cluster.launch(spec)
        while not self.cluster.poll(spec.job_id, 1).all_running:
            time.sleep(0.002)
        elapsed = time.perf_counter() - t0
        self.cluster.stop(spec.job_id, 1, grace_s=5)
        return elapsed


@ray.remote
def _host_started() -> float:
    return time.time()


class RawRayPath:
    """Ray's own helpers: reserve a slice, then run one task per host on it."""

    def once(self) -> float:
        _wait_for_free_slice()
        t0 = time.time()
        handle = slice_placement_group(topology="2x2x2", accelerator_version="v4")
        try:
            started = ray.get(run_on_slice(_host_started, tpu_slice=handle))
        finally:
            handle.shutdown()
        return max(started) - t0


def _wait_for_free_slice(timeout_s: float = 60.0) -> None:
    """The previous round's reservation is removed asynchronously; do not time that."""
    deadline = time.monotonic() + timeout_s
    while get_num_ready_tpu_slices("2x2x2", "TPU-V4") < 1:
        if time.monotonic() > deadline:
            raise RuntimeError("no free v4-16 slice for the raw Ray path")
        time.sleep(0.05)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50_s": percentile(values, 0.50),
        "p95_s": percentile(values, 0.95),
        "mean_s": statistics.fmean(values),
        "min_s": min(values),
        "max_s": max(values),
    }


def run(address: str, runs: int, warmup: int) -> dict[str, Any]:
    ray.init(address=address, namespace="tpufleet-bench", log_to_driver=False, logging_level="WARNING")
    cluster = RayCluster()
    try:
        v4 = sorted(s.name for s in cluster.inventory() if s.accelerator_type == "v4-16" and s.intact)
        if len(v4) < 2:
            raise SystemExit(f"need two intact v4-16 slices, found {v4}")
        cluster.release([v4[1]])  # the raw path's slice: out of the pool, back to Ray
        cluster.wait_warm([v4[0]])
        paths: dict[str, Callable[[], float]] = {
            "tpufleet": ExecutorPath(cluster, v4[0]).once,
            "raw_ray": RawRayPath().once,
        }
        for _ in range(warmup):
            for once in paths.values():
                once()
        times: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(runs):
            for name, once in paths.items():
                times[name].append(once())
    finally:
        cluster.release_all()
        ray.shutdown()
    result: dict[str, Any] = {name: summary(v) for name, v in times.items()}
    result["runs"] = runs
    result["ratio_p50_raw_over_tpufleet"] = result["raw_ray"]["p50_s"] / result["tpufleet"]["p50_s"]
    result["target_p50_s"] = TARGET_P50_S
    result["target_met"] = result["tpufleet"]["p50_s"] <= TARGET_P50_S
    return result


def report(result: dict[str, Any]) -> str:
    lines = [f"submit-to-all-hosts-running, free 2-host v4-16 slice, {result['runs']} interleaved runs each"]
    for name in ("tpufleet", "raw_ray"):
        r = result[name]
        lines.append(
            f"  {name:9s} p50 {r['p50_s'] * 1000:8.1f} ms   p95 {r['p95_s'] * 1000:8.1f} ms   "
            f"mean {r['mean_s'] * 1000:8.1f} ms   min {r['min_s'] * 1000:7.1f} ms   "
            f"max {r['max_s'] * 1000:8.1f} ms"
        )
    lines.append(f"  raw Ray p50 / tpufleet p50 = {result['ratio_p50_raw_over_tpufleet']:.1f}x")
    met = "met" if result["target_met"] else "NOT met"
    lines.append(f"  target: tpufleet p50 <= {result['target_p50_s']} s: {met}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--ray-address", default=None, help="use this cluster instead of a fresh emulated fleet")
    p.add_argument("--slices", default="v4-16:2")
    p.add_argument("--via", choices=["executor"], default="executor", help="hook: 'service' when it lands")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    with fleet_address(args.ray_address, args.slices) as address:
        result = run(address, args.runs, args.warmup)
    print(json.dumps(result, indent=2) if args.json else report(result))
    return 0 if result["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
