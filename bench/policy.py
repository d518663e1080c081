"""How fast is one scheduling cycle? And how does the policy behave over a simulated day?

    .venv/bin/python bench/policy.py [--runs 5] [--hosts 10000] [--queued 100000] [--sim-jobs 3000]

Part 1 builds one snapshot of a fleet of about ``--hosts`` hosts (v4-16, v4-32, v5p-8, v6e-4 and
v6e-16 slices, 2% broken, 1% draining, ~85% held by running jobs, a third of them borrowers) with
50 tenants and ``--queued`` queued jobs, and times ``decide()`` over ``--runs`` runs (p50, max),
then ``decide_runs()`` on the same jobs kept as the control plane keeps them (a ``JobSet`` from
``KeptQueues``: what the loop runs each cycle). Jobs here are of random shapes, so runs of jobs
alike are short: the policy's worst case.
Each run starts after a ``gc.collect()``: a cycle allocates a ``Wait`` per queued job, and whether
the collector then runs one or two full collections inside it depends on what the process
allocated before (building an ``ArgumentParser`` first was enough to move the p50 by 0.1 s).
Part 2 drives the policy with ``scheduler.simulate`` over a stream of jobs on a smaller fleet and
prints the wall time, cycles, waits and each tenant's share of the chip-ticks against its weight.
Everything is seeded, so the figures change only with the code and the machine.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import replace

from tpufleet.catalog import slice_type
from tpufleet.scheduler.model import (
    JobId,
    JobState,
    JobView,
    SliceName,
    SliceState,
    SliceView,
    Snapshot,
    TenantName,
    TenantView,
    Wait,
)
from tpufleet.scheduler.policy import decide, decide_runs
from tpufleet.scheduler.queues import KeptQueues
from tpufleet.scheduler.simulate import SimJob, Simulation, make_fleet

QUEUED = JobState.QUEUED
MIX = {"v4-16": 0.30, "v4-32": 0.20, "v5p-8": 0.20, "v6e-4": 0.10, "v6e-16": 0.20}  # share of hosts


def build_fleet(hosts: int, rng: random.Random) -> list[SliceView]:
    slices: list[SliceView] = []
    for acc, share in MIX.items():
        for i in range(int(hosts * share) // slice_type(acc).hosts):
            roll = rng.random()
            state = (
                SliceState.BROKEN if roll < 0.02 else SliceState.DRAINING if roll < 0.03 else SliceState.FREE
            )
            slices.append(SliceView(SliceName(f"{acc}-{i}"), acc, state))
    return slices


def build_snapshot(hosts: int, queued: int, seed: int = 1) -> Snapshot:
    rng = random.Random(seed)
    slices = build_fleet(hosts, rng)
    tenants = [
        TenantView(
            TenantName(f"t{i:02d}"),
            {g: rng.choice([0, 64, 256, 1024]) for g in ("v4", "v5p", "v6e")},
            rng.choice([1.0, 1.0, 2.0, 4.0]),
        )
        for i in range(50)
    ]
    jobs: list[JobView] = []
    seq = 0
    for i, s in enumerate(slices):
        if s.state == SliceState.FREE and rng.random() < 0.85:
            seq += 1
            job = JobView(
                JobId(f"r{i}"),
                rng.choice(tenants).name,
                s.accelerator_type,
                num_slices=1,
                priority=rng.randint(0, 3),
                seq=seq,
                state=JobState.RUNNING,
                slices=(s.name,),
                borrowing=rng.random() < 0.33,
                admit_seq=seq,
            )
            jobs.append(job)
            slices[i] = SliceView(s.name, s.accelerator_type, SliceState.HELD, job.id)
    types = list(MIX)
    for i in range(queued):
        seq += 1
        size = rng.choice([1, 1, 1, 1, 2, 2, 4, 8])
        job = JobView(
            JobId(f"q{i}"), rng.choice(tenants).name, rng.choice(types), size, rng.randint(0, 3), seq, QUEUED
        )
        jobs.append(job)
    return Snapshot(tenants, slices, jobs)


def time_decide(snapshot: Snapshot, runs: int) -> None:
    hosts = sum(slice_type(s.accelerator_type).hosts for s in snapshot.slices)
    queued = sum(1 for j in snapshot.jobs if j.state == JobState.QUEUED)
    times, decisions = [], []
    for _ in range(runs):
        gc.collect()  # each run starts from the same collector state (see the docstring)
        start = time.perf_counter()
        decisions = decide(snapshot)
        times.append(time.perf_counter() - start)
    kinds = Counter(type(d).__name__ for d in decisions)
    codes = Counter(d.reason.code.value for d in decisions if isinstance(d, Wait))
    print(
        f"decide(): {hosts} hosts, {len(snapshot.slices)} slices, {len(snapshot.tenants)} tenants, "
        f"{len(snapshot.jobs) - queued} running, {queued} queued"
    )
    print(f"  runs={runs}  p50={statistics.median(times) * 1000:.0f} ms  max={max(times) * 1000:.0f} ms")
    print(f"  decisions: {dict(kinds)}")
    print(f"  wait reasons: {dict(codes.most_common())}")
    assert kinds["Admit"] + kinds["Wait"] == queued
    kept = replace(snapshot, jobs=KeptQueues(snapshot.jobs).jobs())
    times = []
    for _ in range(runs):
        gc.collect()
        start = time.perf_counter()
        runs_out = decide_runs(kept)
        times.append(time.perf_counter() - start)
    waits = sum(1 for d in runs_out if type(d).__name__ == "Waits")
    print(
        f"decide_runs() on the kept split: p50={statistics.median(times) * 1000:.0f} ms  "
        f"max={max(times) * 1000:.0f} ms  ({len(runs_out)} decisions, {waits} of them runs)"
    )


def simulate(jobs: int, seed: int = 2) -> None:
    rng = random.Random(seed)
    tenants = [
        TenantView(TenantName("prod"), {"v4": 128}, 1.0),
        TenantView(TenantName("research"), {"v4": 64}, 2.0),
        TenantView(TenantName("batch"), {}, 1.0),
    ]
    fleet = make_fleet("v4-16:24,v4-32:8")
    stream = [
        SimJob(
            f"j{i}",
            rng.choice(["prod", "research", "batch"]),
            rng.choice(["v4-16", "v4-16", "v4-32"]),
            num_slices=rng.choice([1, 1, 1, 2, 4]),
            priority=rng.choice([0, 0, 1]),
            arrival=i * 3 // 2,  # about 90% of the fleet's capacity on average
            duration=rng.randint(2, 40),
        )
        for i in range(jobs)
    ]
    start = time.perf_counter()
    result = Simulation(tenants, fleet, grace=2).run(stream)
    took = time.perf_counter() - start
    print(f"simulate(): {jobs} jobs on v4-16 x24 + v4-32 x8, 3 tenants, until tick {result.now}")
    print(
        f"  wall={took:.2f} s  cycles={result.cycles}  per cycle={took / max(1, result.cycles) * 1000:.2f} ms"
    )
    total = sum(result.chip_ticks.values()) or 1
    for t in tenants:
        recs = [r for r in result.records.values() if r.job.tenant == t.name]
        waits = [r.admitted[0] - r.job.arrival for r in recs if r.admitted]
        share = result.chip_ticks[t.name] / total
        print(
            f"  {t.name:9s} quota={dict(t.quota)} weight={t.weight}: chip-ticks {share:.0%}, "
            f"jobs {len(recs)}, wait p50={statistics.median(waits):.0f} max={max(waits)} ticks, "
            f"preempted {sum(r.preemptions for r in recs)}"
        )
    big = [r for r in result.records.values() if r.job.num_slices == 4]
    worst = max(r.admitted[0] - r.job.arrival for r in big)
    print(f"  4-slice jobs: {len(big)}, max wait {worst} ticks; unfinished {len(result.unfinished())}")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--hosts", type=int, default=10_000)
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--sim-jobs", type=int, default=3000)
    args = parser.parse_args(argv)
    time_decide(build_snapshot(args.hosts, args.queued), args.runs)
    simulate(args.sim_jobs)


if __name__ == "__main__":
    main(sys.argv[1:])
