"""Start time and memory of the emulated fleet, before and after the lean hosts (prints figures;
not part of the tests).

For each mode (``before``: every host a plain ``ray start`` with Ray's full dashboard agent and
prestarted workers, all hosts at once, as the emulator did up to commit ac900c9; ``after``: lean
hosts started in waves, see docs/emulator.md) it measures on this machine:

1. ``up``: ``EmulatedFleet(SLICES).up()`` until every host has joined Ray;
2. ``usable``: until a task pinned to each host has run there (``--usable-batch`` hosts at a time);
3. CPU seconds the start took (every process it started, those that exited included): wall time
   on a shared machine depends on what else runs, CPU seconds much less;
4. memory (PSS and RSS, psutil) of the head and of each host, after ``usable`` (so each host
   holds the idle worker its task left), and by component for one host.

With ``--grow`` it then starts ever larger lean fleets (``--grow-fleets``), each measured the
same way, and stops at the first that fails to come up, leaves less than ``--reserve-gib`` of the
machine's memory available, or would take the run past ``--budget-s``; the largest that came up
is reported, with how many hosts of that size fit in the machine's memory.

    flock /tmp/tpufleet-ray.lock .venv/bin/python bench/emulator_start.py [--slices v4-16:2]
        [--modes before,after] [--grow] [--json]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any

import psutil
import ray

from tpufleet.emulator import EmulatedFleet, procs
from tpufleet.emulator import state as store

MIB = 2**20
GROW_FLEETS = "v4-64:2,v5p-128:2,v5p-128:2+v4-16:8,v5p-128:2+v4-64:4"


def _usable(fleet: EmulatedFleet, batch: int) -> int:
    """One task on every host, pinned to its node, ``batch`` hosts at a time; returns how many ran.

    Each task starts a Python worker on its host (~0.5 s of CPU): 128 of them starting at once on
    two cores starved the raylets past Ray's health check (nodes marked dead, 2026-12-05), which
    a real pod, a machine per host, never sees."""

    @ray.remote(num_cpus=0)
    def hello() -> str:
        import os

        return os.environ["TPU_NAME"]

    strategy = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy
    nodes = [h["node_id"] for s in fleet.status()["slices"] for h in s["hosts"]]
    ran = 0
    for i in range(0, len(nodes), batch):
        refs = [
            hello.options(scheduling_strategy=strategy(n, soft=False)).remote() for n in nodes[i : i + batch]
        ]
        ran += len(ray.get(refs, timeout=600))
    return ran


def _memory(fleet: EmulatedFleet) -> dict[str, Any]:
    st = store.load(fleet.state_dir)
    assert st is not None and st.head is not None
    head = procs.memory(procs.members(st.head))
    hosts = [procs.memory(procs.members(h.session)) for s in st.slices for h in s.hosts if h.session]
    parts: dict[str, int] = defaultdict(int)
    for mem in hosts[0] if hosts else []:
        parts[mem.component] += mem.pss
    host_pss = [sum(m.pss for m in host) for host in hosts]
    host_rss = [sum(m.rss for m in host) for host in hosts]
    return {
        "head_pss_mib": round(sum(m.pss for m in head) / MIB, 1),
        "head_rss_mib": round(sum(m.rss for m in head) / MIB, 1),
        "host_pss_mib_median": round(statistics.median(host_pss) / MIB, 1) if hosts else None,
        "host_pss_mib_max": round(max(host_pss) / MIB, 1) if hosts else None,
        "host_rss_mib_median": round(statistics.median(host_rss) / MIB, 1) if hosts else None,
        "fleet_pss_mib": round((sum(m.pss for m in head) + sum(host_pss)) / MIB, 1),
        "host_components_pss_mib": {
            k: round(v / MIB, 1) for k, v in sorted(parts.items(), key=lambda kv: -kv[1])
        },
        "worker": "worker" in parts,  # the host measured still held its task's idle worker
    }


def _cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def _first_and_last(err: Exception) -> str:
    """An error's first line and, for a failed start, the last line of the log it quotes."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
    return lines[0][:200] + (f" ... {lines[-1][:200]}" if len(lines) > 1 else "")


def measure(slices: str, lean: bool, timeout_s: float, batch: int = 16) -> dict[str, Any]:
    """Start one fleet, measure it, stop it. ``error`` is set when it did not come up."""
    out: dict[str, Any] = {
        "slices": slices,
        "mode": "after" if lean else "before",
        "load_1m": psutil.getloadavg()[0],
    }
    with tempfile.TemporaryDirectory(prefix="tpufleet-bench-") as state_dir:
        kwargs: dict[str, Any] = {"lean": True} if lean else {"lean": False, "wave_size": 10**6}
        fleet = EmulatedFleet(slices.replace("+", ","), state_dir=state_dir, timeout_s=timeout_s, **kwargs)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        try:
            fleet.up()
        except Exception as err:
            out["error"] = _first_and_last(err)
            return out
        try:
            out["hosts"] = sum(len(s["hosts"]) for s in fleet.status()["slices"])
            out["up_s"] = round(time.monotonic() - t0, 1)
            ray.init(address=fleet.ray_address, logging_level="ERROR", log_to_driver=False)
            _usable(fleet, batch)
            out["usable_s"] = round(time.monotonic() - t0, 1)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            launched = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
            out["start_cpu_s"] = round(launched + _cpu_seconds(fleet.pids()), 1)
            out |= _memory(fleet)
            out["available_gib_while_up"] = round(psutil.virtual_memory().available / 2**30, 1)
        except Exception as err:
            out["error"] = _first_and_last(err)
        finally:
            ray.shutdown()
            fleet.down()
    return out


def _row(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"{r['mode']:<7} {r['slices']:<24} failed: {r['error']}"
    return (
        f"{r['mode']:<7} {r['slices']:<24} {r['hosts']:>5} {r['up_s']:>6.1f} {r['usable_s']:>7.1f} "
        f"{r['start_cpu_s']:>7.1f} {r['host_pss_mib_median']:>9.0f} {r['host_rss_mib_median']:>9.0f} "
        f"{r['head_pss_mib']:>8.0f} {r['fleet_pss_mib']:>9.0f} {r['load_1m']:>5.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--slices", default="v4-16:2", help="the fleet for the before/after comparison")
    parser.add_argument("--modes", default="before,after", help="before, after, or both (comma-separated)")
    parser.add_argument("--grow", action="store_true", help="then try ever larger lean fleets")
    parser.add_argument("--grow-fleets", default=GROW_FLEETS, help="comma-separated; '+' joins slices")
    parser.add_argument("--reserve-gib", type=float, default=4.0, help="stop growing below this available")
    parser.add_argument("--budget-s", type=float, default=900.0, help="stop growing past this many seconds")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="per wave of hosts")
    parser.add_argument("--usable-batch", type=int, default=16, help="hosts given their first task at once")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = parser.parse_args()

    started = time.monotonic()
    runs = [
        measure(args.slices, mode == "after", args.timeout_s, args.usable_batch)
        for mode in args.modes.split(",")
        if mode
    ]
    grown: list[dict[str, Any]] = []
    stop = None
    if args.grow:
        for slices in args.grow_fleets.split(","):
            if time.monotonic() - started > args.budget_s:
                stop = f"time budget of {args.budget_s:.0f}s spent"
                break
            r = measure(slices, True, args.timeout_s, args.usable_batch)
            grown.append(r)
            if "error" in r:
                stop = f"{slices} did not come up"
                break
            if r["available_gib_while_up"] < args.reserve_gib:
                stop = f"{slices} left {r['available_gib_while_up']} GiB available (< {args.reserve_gib})"
                break
    largest = max((r for r in grown if "error" not in r), key=lambda r: r["hosts"], default=None)
    total_gib = psutil.virtual_memory().total / 2**30
    fits = per_host = None
    if largest:
        # A host of a big fleet is measured once its task's worker has idled out (30 s); count one
        # worker a host anyway, as measured on a fleet whose workers were still there.
        worker = next((r["host_components_pss_mib"]["worker"] for r in runs + grown if r.get("worker")), 0.0)
        per_host = largest["host_pss_mib_median"] + (0.0 if largest.get("worker") else worker)
        fits = int((total_gib * 1024 - largest["head_pss_mib"]) // per_host)
    report = {
        "machine": {"cpus": psutil.cpu_count(), "memory_gib": round(total_gib, 1)},
        "runs": runs,
        "grow": grown,
        "grow_stopped": stop,
        "largest_fleet": {"slices": largest["slices"], "hosts": largest["hosts"]} if largest else None,
        "hosts_that_fit_in_memory": fits,
        "host_pss_mib_with_a_worker": per_host,
    }
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
        return
    print(f"machine: {report['machine']['cpus']} CPUs, {report['machine']['memory_gib']} GiB")
    header = (
        f"{'mode':<7} {'fleet':<24} {'hosts':>5} {'up_s':>6} {'usable':>7} {'cpu_s':>7} "
        f"{'host_pss':>9} {'host_rss':>9} {'head_pss':>8} {'fleet_pss':>9} {'load':>5}"
    )
    print(header)
    print("-" * len(header))
    for r in runs + grown:
        print(_row(r))
    print("(seconds; memory in MiB, per host the median; load: 1-minute load average at the start)")
    for r in runs + grown:
        if "host_components_pss_mib" in r:
            parts = ", ".join(f"{k} {v:.0f}" for k, v in r["host_components_pss_mib"].items())
            print(f"one {r['mode']} host of {r['slices']}: {parts}")
    if args.grow:
        big = report["largest_fleet"]
        print(
            f"largest fleet that came up: {big['slices']} ({big['hosts']} hosts)" if big else "none came up"
        )
        if stop:
            print(f"stopped growing: {stop}")
        if fits:
            print(f"at {per_host:.0f} MiB PSS a host (a worker included), {fits} hosts fit in the machine")


if __name__ == "__main__":
    main()
