"""Kueue's own scheduler performance workload (issue 30), replayed on ``tpufleet serve --sandbox``.

Kueue's ``test/performance/scheduler/configs/{baseline,large-scale}/generator.yaml`` (its numbers
are facts; nothing of its code is used): cohorts x ClusterQueues with a nominal quota of 20 cpu, a
borrowing limit of 100, ``reclaimWithinCohort: Any`` and ``withinClusterQueue: LowerPriority``; each
ClusterQueue gets three workload sets generated concurrently, each workload created after a delay of
``creationIntervalMs``. Kueue's runner marks a workload finished ``runtimeMs`` after its admission and
records, per workload class, the mean time from creation to admission, and per ClusterQueue class the
usage: the quota held by admitted workloads integrated over time, over the class's nominal quota
times the monitoring time. ``rangespec.yaml`` publishes the baseline's averages over 5 trials.

**How it maps** (``plan``):

- a ClusterQueue is a tenant (``cq-<i>-cohort-<k>``), ``withinClusterQueue: LowerPriority`` its
  ``preemption: lower_priority``, weight 1; a priority is the job's ``priority`` (50 / 100 / 200);
  ``runtimeMs`` is the job's ``TPUFLEET_SANDBOX_SECONDS`` (every host runs that long, exits 0; an
  attempt ended early runs its whole time again, as an evicted Kueue workload does).
- cpu are chips of one family, v5e (the family with 1-chip slices). Two mappings (``--mapping``):

  * ``slices`` (default): a request is ONE whole slice, the v5e slice nearest (by ratio) to
    ``request x 1.6`` chips: 1 -> ``v5litepod-1`` (1 chip), 5 -> ``v5litepod-8``, 20 ->
    ``v5litepod-32``; the quota is ``20 x 1.6 = 32`` chips of v5e, so a large workload fills its
    tenant's quota and a medium one takes a quarter of it, as in Kueue (a small one takes 1/32
    instead of 1/20: there is no 1.6-chip slice). Kueue's capacity is fungible cpu; slices are not,
    so the fleet (the tenants' quotas summed, as Kueue's cohort capacity is its queues' quotas
    summed) is split between the three slice types by each class's share of the chip-seconds asked.
  * ``chips``: a request of r cpu is a multi-slice job of r ``v5litepod-1`` slices; the quota is 20
    chips and the fleet is ``v5litepod-1`` x the quotas summed: capacity as fungible as Kueue's and
    every ratio exact, at the price of gang-admitting 5 and 20 slices at a time.

**What cannot map**:

- cohorts: tpufleet lends idle capacity across the whole fleet (one cohort per generation), so the
  5 (20) cohorts are one pool of 30 (2,000) tenants; a tenant may borrow from every other tenant,
  not only from the 5 (99) of its cohort. The loads are the same in every cohort, so this changes
  whom a tenant borrows from more than how much.
- ``borrowingLimit: 100``: tpufleet has no per-tenant borrowing limit. In both configs it does not
  bind inside Kueue's cohort (the 5 other queues' quotas sum to 100 in the baseline) but in one pool
  a tenant may borrow past it.
- ``reclaimWithinCohort: Any``: tpufleet always reclaims borrowed slices for an in-quota job of
  another tenant, whatever the priorities: that is ``Any``. A preempted attempt gets SIGTERM; the
  sandbox ends its hosts at once (no grace is waited), as Kueue's runner finishes an eviction.
- fair sharing: tpufleet orders tenants by their dominant share over their weight at equal
  priority; the baseline runs Kueue without fair sharing (BestEffortFIFO per ClusterQueue).
- time to admission starts at the job's ``submitted_at`` and ends at its first attempt's
  ``admitted_at`` (the store's clock), as Kueue's recorder takes creation to the first Admitted.
  Wall: from the first creation delay to the last job's end (Kueue's is minimalkueue's process
  wall time, which also counts its start). Usage: chips held by attempts from admission to their
  end, from the attempts the API returns after the run, over the quotas summed times the wall.

Driven like Kueue's generator: one asyncio task per workload set per tenant, each sleeping its
creation interval then ``POST /api/v1/jobs`` (admin token, ``tenant`` in the body) to a real
``tpufleet serve --sandbox`` subprocess on 127.0.0.1 (its own process, as minimalkueue is Kueue's,
so the control plane and the generator have a core each on 2 cores). The generators' client is
aiohttp (a dependency of Ray's): about 0.25 ms of CPU a request, where httpx's AsyncClient took
about 4.9 ms on the same cores the control plane needs (Kueue's generator is Go), and its pool's
hand-out is linear in the requests waiting, so 6,000 generators at once (the large-scale shape)
kept a core busy without sending a request.

    .venv/bin/python bench/kueue.py [--config baseline|large-scale] [--db sqlite|postgresql]
                                    [--mapping slices|chips] [--scale 0.1] [--jobs-json FILE]
                                    [--policy-only [--tick-ms MS] [--cadence-ms MS] [--cost-ms MS]
                                                   [--drift-ms MS] [--seed N]]

``--policy-only`` replays the same plan through the policy alone (``scheduler.simulate``: the
real ``decide`` on a fake clock, no store, no API, no loop), in ticks of the greatest common
divisor of the sets' intervals and runtimes (100 ms for the baseline). A job holds its slices
exactly its runtime, a preempted one gives them back one tick after the signal and runs its whole
runtime again, and submits arrive exactly on their intervals (a generation of 60 s for the
baseline). So it prints what the policy would give with no cost per job at all.

Its timing can be made a control plane's (``Timing``; 2026-12-07 in docs/benchmarks.md shows why it
matters): ``--tick-ms`` a finer clock; ``--cadence-ms`` the policy decides only every so often (a
loop's cycle), what ends in between waiting for the next decision; ``--cost-ms`` more hold per job
(a launch and an end seen late); ``--drift-ms`` each creation comes after its interval plus an
exponential delay of that mean (the real generators wait for each submit's answer; ``--seed``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from tpufleet import catalog
from tpufleet.scheduler.model import TenantName, TenantView
from tpufleet.scheduler.simulate import SimJob, SimRecord, Simulation, make_fleet

GENERATION = "v5e"
V5E_SLICES = ("v5litepod-1", "v5litepod-4", "v5litepod-8", "v5litepod-16", "v5litepod-32", "v5litepod-64")
CHIPS_PER_CPU = 1.6  # --mapping slices: 20 cpu -> 32 chips (a large workload fills the quota)
API = "/api/v1"


@dataclass(frozen=True)
class WorkloadSet:
    """One of Kueue's ``workloadsSets`` (one workload template each)."""

    name: str  # its className: small, medium, large
    count: int
    interval_ms: int
    runtime_ms: int
    priority: int
    request: int  # cpu


@dataclass(frozen=True)
class KueueConfig:
    cohorts: int
    queues: int  # per cohort
    nominal_quota: int  # cpu
    borrowing_limit: int  # cpu; not mapped (see the module docstring)
    sets: tuple[WorkloadSet, ...]


CONFIGS = {
    "baseline": KueueConfig(
        5,
        6,
        20,
        100,
        (
            WorkloadSet("small", 350, 100, 200, 50, 1),
            WorkloadSet("medium", 100, 500, 500, 100, 5),
            WorkloadSet("large", 50, 1200, 1000, 200, 20),
        ),
    ),
    "large-scale": KueueConfig(
        20,
        100,
        20,
        100,
        (
            WorkloadSet("small", 20, 20, 50, 50, 1),
            WorkloadSet("medium", 7, 50, 100, 100, 5),
            WorkloadSet("large", 3, 200, 200, 200, 20),
        ),
    ),
}
# rangespec.yaml: averages of 5 trials (baseline); large-scale has uncalibrated placeholders only
PUBLISHED: dict[str, dict[str, float]] = {
    "baseline": {"wall": 351.1, "small": 215.5, "medium": 76.8, "large": 6.7, "usage": 58.7},
}


@dataclass(frozen=True)
class Shape:
    accelerator_type: str
    num_slices: int

    @property
    def chips(self) -> int:
        return catalog.slice_type(self.accelerator_type).chips * self.num_slices


@dataclass(frozen=True)
class Plan:
    tenants: tuple[str, ...]
    quota: int  # chips of GENERATION per tenant
    fleet: str  # serve --sandbox
    shapes: dict[str, Shape]  # per workload class
    sets: tuple[WorkloadSet, ...]  # per tenant, counts scaled

    @property
    def workloads(self) -> int:
        return len(self.tenants) * sum(s.count for s in self.sets)


def nearest_slice(chips: float) -> str:
    """The v5e slice whose chips are nearest to ``chips`` by ratio (1.6 -> 1 chip, 8 -> 8, 32 -> 32)."""
    return min(V5E_SLICES, key=lambda name: abs(math.log(catalog.slice_type(name).chips / chips)))


def plan(config: KueueConfig, mapping: str = "slices", scale: float = 1.0) -> Plan:
    """Tenants, quota, sandbox fleet and job shapes for ``config`` (see the module docstring);
    ``scale`` keeps that fraction of each set's workloads (at least one)."""
    tenants = tuple(f"cq-{q}-cohort-{c}" for c in range(config.cohorts) for q in range(config.queues))
    sets = tuple(replace(s, count=max(1, round(s.count * scale))) for s in config.sets)
    if mapping == "chips":
        shapes = {s.name: Shape("v5litepod-1", s.request) for s in sets}
        quota = config.nominal_quota
        return Plan(tenants, quota, f"v5litepod-1:{quota * len(tenants)}", shapes, sets)
    if mapping != "slices":
        raise ValueError(f"mapping must be slices or chips, got {mapping!r}")
    shapes = {s.name: Shape(nearest_slice(s.request * CHIPS_PER_CPU), 1) for s in sets}
    quota = math.ceil(config.nominal_quota * CHIPS_PER_CPU)
    return Plan(tenants, quota, split_fleet(quota * len(tenants), sets, shapes), shapes, sets)


def split_fleet(chips: int, sets: tuple[WorkloadSet, ...], shapes: dict[str, Shape]) -> str:
    """``chips`` as slices of the classes' types, each type's share the class's share of the
    chip-seconds asked (rounded; the smallest type takes what is left, so the chips add up)."""
    asked = {s.name: s.count * shapes[s.name].chips * s.runtime_ms for s in sets}
    total = sum(asked.values())
    by_size = sorted(sets, key=lambda s: shapes[s.name].chips, reverse=True)
    counts: dict[str, int] = {}
    left = chips
    for s in by_size[:-1]:
        size = shapes[s.name].chips
        n = min(left // size, max(1, round(chips * asked[s.name] / total / size)))
        counts[shapes[s.name].accelerator_type] = counts.get(shapes[s.name].accelerator_type, 0) + n
        left -= n * size
    last = shapes[by_size[-1].name]
    counts[last.accelerator_type] = counts.get(last.accelerator_type, 0) + left // last.chips
    return ",".join(f"{t}:{n}" for t, n in counts.items() if n)


def job_body(plan: Plan, tenant: str, s: WorkloadSet, index: int) -> dict[str, Any]:
    shape = plan.shapes[s.name]
    return {
        "command": ["true"],
        "name": f"{s.name}-{index}",
        "tenant": tenant,
        "accelerator_type": shape.accelerator_type,
        "num_slices": shape.num_slices,
        "priority": s.priority,
        "env": {"TPUFLEET_SANDBOX_SECONDS": f"{s.runtime_ms / 1000:g}"},
    }


# -- the run ---------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def served(fleet: str, db_url: str | None, tmp: str, api_processes: int = 0) -> Iterator[tuple[str, str]]:
    """A ``tpufleet serve --sandbox FLEET`` subprocess: (its URL, the admin token); stopped by PID
    (with ``api_processes``, serve stops its API processes itself)."""
    port = free_port()
    cmd = [sys.executable, "-m", "tpufleet", "serve", "--sandbox", fleet, "--job-seconds", "0"]
    cmd += ["--api-processes", str(api_processes)] if api_processes else []
    cmd += ["--state-dir", f"{tmp}/state", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--db", db_url] if db_url else []
    env = {**os.environ, "TPUFLEET_CONFIG": f"{tmp}/config.toml"}
    log = open(f"{tmp}/serve.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz", timeout=2).json().get("cycles", 0) > 0:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"serve did not come up: {Path(tmp, 'serve.log').read_text()[-2000:]}")
            time.sleep(0.2)
        yield url, Path(tmp, "state", "admin-token").read_text().strip()
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


async def generate(
    http: aiohttp.ClientSession, plan: Plan, tenant: str, s: WorkloadSet, errors: list[str]
) -> None:
    """One workload set of one tenant: wait the creation interval, create, again (Kueue's order)."""
    for i in range(s.count):
        await asyncio.sleep(s.interval_ms / 1000)
        async with http.post(f"{API}/jobs", json=job_body(plan, tenant, s, i)) as resp:
            if resp.status != 201:
                errors.append(f"{tenant} {s.name}-{i}: {resp.status} {(await resp.text())[:200]}")


async def drive(url: str, token: str, plan: Plan, timeout_s: float) -> tuple[float, float]:
    """Every generator at once, then wait until no job is queued or active: (start, generation end)
    as wall-clock times."""
    # idle connections are dropped before uvicorn's 5 s keep-alive ends, so a request never goes out
    # on a connection the server is closing (a ServerDisconnectedError)
    connector = aiohttp.TCPConnector(limit=64, keepalive_timeout=2)
    auth = {"Authorization": f"Bearer {token}"}
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(url, headers=auth, connector=connector, timeout=timeout) as http:
        errors: list[str] = []
        started = time.time()
        await asyncio.gather(*(generate(http, plan, t, s, errors) for t in plan.tenants for s in plan.sets))
        generated = time.time()
        if errors:
            raise SystemExit(f"{len(errors)} submits failed, e.g. {errors[:3]}")
        while True:
            async with http.get(f"{API}/status") as resp:
                counts = await resp.json()
            if not counts["queued"] and not counts["running"]:
                return started, generated
            if time.time() - started > timeout_s:
                raise SystemExit(f"TIMEOUT after {timeout_s:g} s: {counts}")
            await asyncio.sleep(0.25)


def collect(url: str, token: str) -> list[dict[str, Any]]:
    """Every job, with ``attempts`` for those that ran more than once (listings leave them out)."""
    jobs: list[dict[str, Any]] = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as http:
        after = None
        while True:
            params: dict[str, Any] = {"limit": 1000} | ({"after": after} if after else {})
            page = http.get(f"{API}/jobs", params=params).raise_for_status().json()
            jobs += page["items"]
            after = page["next"]
            if after is None:
                break
        for job in jobs:
            if job["attempt"] > 1:
                job["attempts"] = http.get(f"{API}/jobs/{job['id']}").raise_for_status().json()["attempts"]
    return jobs


@dataclass(frozen=True)
class Figures:
    wall: float
    generation: float
    admission: dict[str, float]  # class -> mean seconds to first admission
    usage: float  # Kueue's: chip-seconds held / (quotas summed x wall), percent
    min_tenant_usage: float  # the lowest tenant's own, percent of its quota
    succeeded: int
    jobs: int
    preempted: int
    lost: dict[str, float]  # class ("all" too) -> percent of its chip-seconds held by preempted attempts


def figures(plan: Plan, jobs: list[dict[str, Any]], started: float, generated: float) -> Figures:
    chips = {(sh.accelerator_type, sh.num_slices): sh.chips for sh in plan.shapes.values()}
    waits: dict[str, list[float]] = defaultdict(list)
    held: dict[str, float] = defaultdict(float)
    by_class: dict[str, float] = defaultdict(float)
    lost: dict[str, float] = defaultdict(float)
    end = max(j["finished_at"] or started for j in jobs)
    for j in jobs:
        klass = j["name"].split("-")[0]
        attempts = j.get("attempts") or [{"admitted_at": j["admitted_at"], "ended_at": j["finished_at"]}]
        first = attempts[0]["admitted_at"]
        waits[klass].append((first if first is not None else end) - j["submitted_at"])
        size = chips[(j["accelerator_type"], j["num_slices"])]
        for a in attempts:
            if a["admitted_at"] is not None:
                chip_s = size * ((a["ended_at"] or end) - a["admitted_at"])
                held[j["tenant"]] += chip_s
                by_class[klass] += chip_s
                lost[klass] += chip_s if a.get("state") == "PREEMPTED" else 0.0
    wall = end - started
    total = sum(held.values()) / (plan.quota * len(plan.tenants) * wall) * 100
    lowest = min(held.get(t, 0.0) for t in plan.tenants) / (plan.quota * wall) * 100
    return Figures(
        wall,
        generated - started,
        {k: sum(v) / len(v) for k, v in waits.items()},
        total,
        lowest,
        sum(j["state"] == "SUCCEEDED" for j in jobs),
        len(jobs),
        sum(j["attempt"] > 1 for j in jobs),
        {k: lost[k] / v * 100 for k, v in by_class.items() if v}
        | {"all": sum(lost.values()) / max(sum(by_class.values()), 1e-9) * 100},
    )


@dataclass(frozen=True)
class Timing:
    """How ``simulate`` times the policy (the module docstring); the defaults are Kueue's ideal:
    ticks of the sets' common divisor, a decision at every event, no cost, no drift."""

    tick_ms: int | None = None  # None: the gcd of the sets' intervals and runtimes
    cadence_ms: int | None = None  # None: every tick something happens at
    cost_ms: int = 0
    drift_ms: int = 0
    seed: int = 1

    def ticks(self, plan: Plan) -> tuple[int, int]:
        """(tick in ms, decision cadence in ticks); ValueError for a value out of range."""
        gcd = math.gcd(*(ms for s in plan.sets for ms in (s.interval_ms, s.runtime_ms)))
        tick = gcd if self.tick_ms is None else self.tick_ms
        if tick < 1:
            raise ValueError(f"--tick-ms must be >= 1, got {tick}")
        cadence = tick if self.cadence_ms is None else self.cadence_ms
        if cadence < tick or cadence % tick:
            raise ValueError(f"--cadence-ms must be a multiple of the tick ({tick} ms), got {cadence}")
        if self.cost_ms < 0 or self.drift_ms < 0:
            raise ValueError("--cost-ms and --drift-ms must be >= 0")
        return tick, cadence // tick


def _sim_lost(records: dict[str, SimRecord], klass: dict[str, str]) -> dict[str, float]:
    """As ``figures``' ``lost``: per class (and "all"), the percent of its chip-time held by the
    attempts a preemption ended."""
    held: dict[str, int] = defaultdict(int)
    lost: dict[str, int] = defaultdict(int)
    for job_id, rec in records.items():
        held[klass[job_id]] += rec.held
        lost[klass[job_id]] += rec.lost
    out = {k: lost[k] / v * 100 for k, v in held.items() if v}
    return out | {"all": sum(lost.values()) / max(sum(held.values()), 1) * 100}


def simulate(plan: Plan, timing: Timing = Timing()) -> Figures:
    """The figures of ``plan`` with the policy alone (``--policy-only``, the module docstring)."""
    tick_ms, every = timing.ticks(plan)
    rnd = random.Random(timing.seed)
    tenants = [TenantView(TenantName(t), {GENERATION: plan.quota}) for t in plan.tenants]
    jobs: list[SimJob] = []
    klass: dict[str, str] = {}
    for t in plan.tenants:
        for s in plan.sets:
            shape = plan.shapes[s.name]
            at = 0.0  # ms: each creation its interval after the one before, plus the drift
            for i in range(s.count):
                at += s.interval_ms + (rnd.expovariate(1 / timing.drift_ms) if timing.drift_ms else 0.0)
                job_id = f"{t}/{s.name}-{i}"
                klass[job_id] = s.name
                hold = max(1, round((s.runtime_ms + timing.cost_ms) / tick_ms))
                jobs.append(
                    SimJob(job_id, t, shape.accelerator_type, shape.num_slices, s.priority,
                           arrival=round(at / tick_ms), duration=hold)
                )  # fmt: skip
    fleet = make_fleet(plan.fleet)
    result = Simulation(tenants, fleet, grace=1, resume=False, every=every).run(jobs)
    waits: dict[str, list[int]] = defaultdict(list)
    for job_id, rec in result.records.items():
        admitted = rec.first_admitted if rec.first_admitted is not None else result.now
        waits[klass[job_id]].append(admitted - rec.job.arrival)
    sec, ticks = tick_ms / 1000, max(result.now, 1)
    return Figures(
        wall=ticks * sec,
        generation=max(j.arrival for j in jobs) * sec,
        admission={k: sum(v) / len(v) * sec for k, v in waits.items()},
        usage=sum(result.chip_ticks.values()) / (plan.quota * len(plan.tenants) * ticks) * 100,
        min_tenant_usage=min(result.chip_ticks.get(t, 0) for t in plan.tenants) / (plan.quota * ticks) * 100,
        succeeded=len(jobs) - len(result.unfinished()),
        jobs=len(jobs),
        preempted=sum(rec.preemptions > 0 for rec in result.records.values()),
        lost=_sim_lost(result.records, klass),
    )


def report(name: str, args: argparse.Namespace, plan: Plan, f: Figures) -> None:
    kueue = PUBLISHED.get(name, {}) if args.scale == 1 else {}

    def row(label: str, ours: float, theirs: float | None, unit: str) -> None:
        other = f"{theirs:10.1f}{unit}" if theirs is not None else f"{'-':>10} "
        ratio = f"{ours / theirs:6.2f}x" if theirs else ""
        print(f"  {label:<32}{ours:10.1f}{unit}  {other}  {ratio}")

    where = args.db
    if args.policy_only:
        knobs = [
            ("tick", args.tick_ms),
            ("cadence", args.cadence_ms),
            ("cost", args.cost_ms),
            ("drift", args.drift_ms),
        ]
        timing = "".join(f", {k} {v} ms" for k, v in knobs if v)
        where = f"the policy alone (simulated{timing}{f', seed {args.seed}' if args.drift_ms else ''})"
    api = f", API in {args.api_processes} processes" if args.api_processes else ""
    print(f"\n{name} on {where}, mapping {args.mapping}{api}, scale {args.scale:g}: {plan.workloads:,} jobs")
    print(f"  {'':<32}{'tpufleet':>11}  {'Kueue':>11}")
    row("wall", f.wall, kueue.get("wall"), " s")
    for s in plan.sets:
        row(f"mean time to admission {s.name}", f.admission.get(s.name, math.nan), kueue.get(s.name), " s")
    row("usage (all tenants, Kueue's)", f.usage, kueue.get("usage"), " %")
    row("lowest tenant's usage", f.min_tenant_usage, None, " %")
    print(f"  generation took {f.generation:.1f} s; {f.preempted:,} jobs were preempted at least once")
    if f.lost:
        classes = ", ".join(f"{s.name} {f.lost.get(s.name, 0.0):.1f} %" for s in plan.sets)
        print(f"  runs lost to preemption: {f.lost['all']:.1f} % of the chip-seconds held ({classes})")
    ok = f.succeeded == f.jobs == plan.workloads
    done = "ended" if args.policy_only else "SUCCEEDED"
    print(f"  {'every job ' + done if ok else 'NOT every job ' + done}: {f.succeeded:,} of {f.jobs:,}")


def run(args: argparse.Namespace, db_url: str | None) -> Figures:
    p = plan(CONFIGS[args.config], args.mapping, args.scale)
    shapes = ", ".join(f"{k} {v.num_slices} x {v.accelerator_type}" for k, v in p.shapes.items())
    print(f"{len(p.tenants)} tenants of {p.quota} {GENERATION} chips; fleet {p.fleet}; {shapes}", flush=True)
    with (
        tempfile.TemporaryDirectory() as tmp,
        served(p.fleet, db_url, tmp, args.api_processes) as (url, token),
    ):
        admin = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=url, headers=admin, timeout=60) as http:
            for t in p.tenants:
                body = {"name": t, "quota": {GENERATION: p.quota}, "preemption": "lower_priority"}
                http.post(f"{API}/tenants", json=body).raise_for_status()
        started, generated = asyncio.run(drive(url, token, p, args.timeout))
        jobs = collect(url, token)
        f = figures(p, jobs, started, generated)
    if args.jobs_json:
        Path(args.jobs_json).write_text(
            json.dumps({"started": started, "generated": generated, "jobs": jobs})
        )
    report(args.config, args, p, f)
    return f


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="baseline")
    parser.add_argument("--db", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--mapping", choices=("slices", "chips"), default="slices")
    parser.add_argument("--scale", type=float, default=1.0, help="the fraction of each set's workloads")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument(
        "--api-processes",
        type=int,
        default=0,
        metavar="N",
        help="serve --api-processes N: the API in N processes of its own (0: in the loop's)",
    )
    parser.add_argument(
        "--jobs-json", metavar="FILE", help="write every job (with its attempts) here, for analysis"
    )
    parser.add_argument(
        "--policy-only",
        action="store_true",
        help="replay through the policy alone on a fake clock (no control plane; see the docstring)",
    )
    sim = parser.add_argument_group("--policy-only's timing (the docstring)")
    sim.add_argument("--tick-ms", type=int, default=None, help="the clock's step (default: the sets' gcd)")
    sim.add_argument("--cadence-ms", type=int, default=None, help="the policy decides every MS only")
    sim.add_argument("--cost-ms", type=int, default=0, help="added to every job's hold")
    sim.add_argument("--drift-ms", type=int, default=0, help="mean extra delay before each creation")
    sim.add_argument("--seed", type=int, default=1, help="of the drift")
    args = parser.parse_args()
    if args.policy_only:
        p = plan(CONFIGS[args.config], args.mapping, args.scale)
        timing = Timing(args.tick_ms, args.cadence_ms, args.cost_ms, args.drift_ms, args.seed)
        try:
            timing.ticks(p)
        except ValueError as err:
            parser.error(str(err))
        report(args.config, args, p, simulate(p, timing))
        return 0
    # SIGTERM (a `timeout`) unwinds like Ctrl-C, so the serve subprocess is stopped, not orphaned
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.db == "sqlite":
        run(args, None)
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _pg import postgres_server

    with postgres_server() as server:
        if server is None:
            return 1
        run(args, server.new_database())
    return 0


if __name__ == "__main__":
    sys.exit(main())
