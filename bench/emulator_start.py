"""Start time and memory of the emulated fleet (not part of the tests; prints figures).

Measures, on this machine:
1. ``EmulatedFleet("v4-16:2").up()``: head + 4 hosts until every host has joined Ray, then until a
   task has run on every host (usable), and the resident memory of the head and of each host;
2. ``add("v5litepod-1")``: the start time of one more host while the fleet runs;
3. ``kill_host`` -> Ray declares the node dead, and ``restore`` -> it has joined again.

    .venv/bin/python bench/emulator_start.py [--slices v4-16:2] [--no-log-monitor]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import ray

from tpufleet.emulator import EmulatedFleet, procs
from tpufleet.emulator import state as store


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def memory(fleet: EmulatedFleet) -> tuple[int, list[int]]:
    st = store.load(fleet.state_dir)
    assert st is not None and st.head is not None
    head = procs.rss_bytes(procs.members(st.head))
    hosts = [procs.rss_bytes(procs.members(h.session)) for s in st.slices for h in s.hosts if h.session]
    return head, hosts


def usable(fleet: EmulatedFleet) -> None:
    """One task on every host, pinned by its slice-name resource and worker-id label."""

    @ray.remote(num_cpus=0)
    def hello() -> str:
        import os

        return os.environ["TPU_NAME"]

    refs = []
    for s in fleet.status()["slices"]:
        for h in s["hosts"]:
            strategy = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(h["node_id"], soft=False)
            refs.append(hello.options(scheduling_strategy=strategy).remote())
    ray.get(refs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slices", default="v4-16:2")
    parser.add_argument("--no-log-monitor", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tpufleet-bench-") as state_dir:
        fleet = EmulatedFleet(args.slices, state_dir=state_dir, log_monitor=not args.no_log_monitor)
        t0 = time.monotonic()
        fleet.up()
        joined = time.monotonic() - t0
        try:
            ray.init(address=fleet.ray_address, logging_level="ERROR", log_to_driver=False)
            usable(fleet)
            ready = time.monotonic() - t0
            head, hosts = memory(fleet)
            t1 = time.monotonic()
            fleet.add("v5litepod-1")
            one_host = time.monotonic() - t1
            t2 = time.monotonic()
            fleet.kill_host(fleet.slice_names[0], 0)
            dead = time.monotonic() - t2
            t3 = time.monotonic()
            fleet.restore(fleet.slice_names[0])
            back = time.monotonic() - t3
        finally:
            ray.shutdown()
            fleet.down()
    print(f"fleet {args.slices} ({len(hosts)} hosts, log monitor {'off' if args.no_log_monitor else 'on'})")
    print(f"  up (every host joined)        {joined:6.1f} s")
    print(f"  usable (a task on every host) {ready:6.1f} s")
    print(f"  add one host (v5litepod-1)    {one_host:6.1f} s")
    print(f"  kill_host -> Ray sees it dead {dead:6.1f} s")
    print(f"  restore -> joined again       {back:6.1f} s")
    print(f"  RSS head                      {mib(head):>10}")
    print(f"  RSS per host (median)         {mib(int(statistics.median(hosts))):>10}")
    print(f"  RSS fleet total               {mib(head + sum(hosts)):>10}")


if __name__ == "__main__":
    main()
