"""Trace-driven comparison of scheduling policies on a simulated TPU fleet (no Ray, no clock).

    .venv/bin/python bench/simulate.py [--hosts 1000] [--jobs 5000] [--seed 1] [--tenants 4] [--json]
        [--explain-shortfall]

**The trace.** Job sizes, durations and arrivals follow the Philly-derived generator of Gavel
(Narayanan et al., "Heterogeneity-Aware Cluster Scheduling Policies for Deep Learning Workloads",
OSDI 2020; ``scheduler/utils.py`` of github.com/stanford-futuredata/gavel, ``_generate_scale_factor``
and ``_generate_duration``, with exponential inter-arrival times): a job asks for 1, 2, 4 or 8 units
with probability 0.70 / 0.10 / 0.15 / 0.05; its duration is ``60 * 10**U(1.5, 3)`` seconds (31.6 min
to 16.7 h) with probability 0.8 and ``60 * 10**U(3, 4)`` seconds (16.7 h to 6.9 days) otherwise, i.e.
log-uniform in each range; arrivals are a Poisson process. The arrival rate is not Gavel's: the gaps
are scaled so the trace offers ``--load`` of the fleet's chips over its arrival window.

**Units to TPU slices.** One unit is 8 v4 chips (2 hosts): 1 unit = one ``v4-16`` slice, 2 units =
one ``v4-32``, 4 units = one ``v4-64``, 8 units = two ``v4-64`` slices (a multislice job,
``num_slices=2``). The fleet's ``--hosts`` are split between the three slice types in proportion to
the chips the trace asks of each (37 % / 11 % / 53 %), so no type is starved by construction.

**Tenants.** ``--tenants`` tenants with equal quotas (the fleet's v4 chips split evenly: each is
entitled to 1/T of the fleet) but skewed demand: tenant ``i`` submits a share of the jobs
proportional to ``1/(i+1)``, so the first tenant wants more than its entitlement and the last less.

**Faults** (drawn once from the seed, replayed identically for every policy): each host fails at
``--host-failures`` per host per day; its slice is broken for ``--repair-h`` hours and the job on it
restarts from its last checkpoint (every ``--checkpoint-min`` minutes of progress). A
``--spot-fraction`` of the slices are spot and are preempted at ``--spot-preemptions`` per slice per
day, with notice (the job checkpoints and loses nothing but its restart), and come back after
``--spot-return-h`` hours; a spot slice that is away is not paid for. Every start of an attempt costs
``--restart-min`` minutes of held but unproductive chips.

**Policies**, replaying the same trace and faults:

- ``fifo``: one queue, first come first served, no quotas: the oldest queued job is placed when its
  slices are free and blocks every job behind it until then (a plain Ray cluster that places
  placement groups in submission order).
- ``static_quota``: each tenant owns a fixed 1/T of the slices of each type (a static partition) and
  runs its own first-come-first-served queue per slice type on them; no borrowing.
- ``tpufleet``: the real policy, ``tpufleet.scheduler.policy.decide`` (quotas, borrowing of idle
  slices, reclaim by preempting borrowers, per-type head-of-line reservations). A ``Preempt``
  checkpoints the victim, which releases its slices ``--grace-s`` later and is requeued.
- ``tpufleet_autoscaled``: the same ``decide``, then ``tpufleet.scheduler.autoscale.plan`` each
  cycle, on a fleet that starts empty and may grow to the fixed fleet (its peak): a slice is ready
  ``--provision-min`` after it is asked for and deleted once idle for ``--idle-timeout-min``. Its
  utilization and offered load are still measured against the fixed fleet's chips.

**Cycles.** The simulator is event driven, but scheduling is batched: events (arrivals, finishes,
faults, repairs, releases) are applied at their exact times, and the scheduler runs once at the end
of every ``--cycle-s`` window (default one simulated minute) in which something happened, as the
control plane's loop does. Calling ``decide`` at every single event would cost ~3 calls per job.
A ``decide`` call costs ~7 ms at 10,000 hosts (it rebuilds its pools from the whole snapshot),
so the 10,000-host, 100,000-job run uses ``--cycle-s 300`` to finish in minutes.

**Metrics** (per policy). The *window* is ``[0, last arrival]``.

- ``offered_load``: chip-seconds the jobs could run inside the window had each started on arrival,
  over the fleet's chip-seconds in the window. ``utilization``: chip-seconds held by jobs inside the
  window over the same denominator. ``utilization_of_offered`` is their ratio.
- ``wait_p50_s`` / ``wait_p99_s`` (and ``wait_by_units``): arrival to first start, over jobs started.
- ``tenants``: each tenant's ``share`` of the window's chip-seconds against its ``entitlement``
  (quota / fleet), and ``entitlement_met``: the time integral of ``min(held, quota)`` over that of
  ``min(held + queued, quota)`` -- 1.0 means the tenant never had less than its entitlement while it
  had the demand for it. ``jain_fairness`` is Jain's index over ``entitlement_met``;
  ``min_entitlement_met`` the lowest. Each tenant's ``wait_p50_s`` / ``wait_p99_s`` too. With
  ``--explain-shortfall``, each tenant of the tpufleet policies also has ``shortfall``: the
  chip-seconds it missed (``min(held + queued, quota) - min(held, quota)``, integrated) split by
  what its first job in the policy's order waited for at the last cycle (``CAUSES``), as fractions
  that add up to 1.
- ``goodput``: chip-seconds of progress kept over chip-seconds held, over the whole run (restarts
  and work lost to host failures are badput).
- ``chip_hours_paid``: chips present in the fleet (spot slices that are away excluded) over the
  window; ``chip_hours_used``: chips held by jobs over the window.
- ``finished``, ``unfinished`` (jobs that can never be placed under the policy, e.g. a two-slice job
  of a tenant whose static partition has one slice of the type), ``sim_seconds`` (wall time).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from tpufleet.catalog import slice_type
from tpufleet.scheduler.autoscale import Create, Delete, Managed, Phase, PoolView, ScaleSnapshot, plan
from tpufleet.scheduler.model import (
    Admit,
    Decision,
    JobId,
    JobState,
    JobView,
    Preempt,
    SliceName,
    SliceState,
    SliceView,
    Snapshot,
    TenantName,
    TenantView,
    Wait,
)
from tpufleet.scheduler.policy import decide

SIZE_MIX = ((1, 0.70), (2, 0.10), (4, 0.15), (8, 0.05))  # Gavel's Philly scale factors
UNIT_SHAPES = {1: ("v4-16", 1), 2: ("v4-32", 1), 4: ("v4-64", 1), 8: ("v4-64", 2)}
TYPES = ("v4-16", "v4-32", "v4-64")
GEN = "v4"
POLICIES = ("fifo", "static_quota", "tpufleet", "tpufleet_autoscaled")
DAY = 86400.0


@dataclass
class Config:
    hosts: int = 1000
    jobs: int = 5000
    seed: int = 1
    tenants: int = 4
    load: float = 0.9
    host_failures: float = 0.001  # per host per day
    repair_h: float = 4.0
    spot_fraction: float = 0.2
    spot_preemptions: float = 0.2  # per spot slice per day
    spot_return_h: float = 2.0
    checkpoint_min: float = 30.0
    restart_min: float = 2.0
    cycle_s: float = 60.0
    grace_s: float = 30.0
    provision_min: float = 5.0
    idle_timeout_min: float = 10.0
    spare_slices: int = 0  # autoscaled: slices of each type kept free beyond the queue's demand
    explain_shortfall: bool = False  # tpufleet policies: why each tenant was below its entitlement


@dataclass(slots=True)
class Job:
    idx: int
    tenant: str
    units: int
    acc: str
    num_slices: int
    chips: int
    arrival: float
    duration: float

    @property
    def id(self) -> str:
        return f"j{self.idx}"


@dataclass(frozen=True, slots=True)
class Fault:
    time: float
    slice: str
    kind: str  # "host" (broken, lose progress since the last checkpoint) or "spot" (away, with notice)
    down_s: float


@dataclass
class Trace:
    jobs: list[Job]
    slices: list[tuple[str, str, bool]]  # name, accelerator type, spot
    tenants: list[str]
    quota: dict[str, int]  # chips of v4 per tenant
    owner: dict[str, str]  # slice -> tenant, for the static partition
    faults: list[Fault]
    horizon: float  # the last arrival: the end of the measuring window
    capacity_chips: int


def jain(xs: list[float]) -> float:
    """Jain's fairness index: (sum x)^2 / (n sum x^2), in (0, 1]; 1.0 for an empty or all-zero list."""
    sq = sum(x * x for x in xs)
    return 1.0 if not xs or sq == 0 else sum(xs) ** 2 / (len(xs) * sq)


def _pick(rng: random.Random, mix: tuple[tuple[int, float], ...]) -> int:
    r, acc = rng.random(), 0.0
    for value, p in mix:
        acc += p
        if r < acc:
            return value
    return mix[-1][0]


def gavel_duration(rng: random.Random) -> float:
    """Seconds: log-uniform in [10^1.5, 10^3] minutes with p=0.8, else in [10^3, 10^4] minutes."""
    if rng.random() >= 0.8:
        return 60.0 * 10 ** rng.uniform(3, 4)
    return 60.0 * 10 ** rng.uniform(1.5, 3)


def build_fleet(hosts: int, spot_fraction: float, rng: random.Random) -> list[tuple[str, str, bool]]:
    """Slices of the three types, hosts split by the chips the size mix asks of each type."""
    demand = {t: 0.0 for t in TYPES}
    for units, p in SIZE_MIX:
        demand[UNIT_SHAPES[units][0]] += units * p
    total = sum(demand.values())
    out: list[tuple[str, str, bool]] = []
    for t in TYPES:
        st = slice_type(t)
        count = max(2 if t == "v4-64" else 1, round(hosts * demand[t] / total / st.hosts))
        out += [(f"{t}-{i}", t, rng.random() < spot_fraction) for i in range(count)]
    return out


def build_trace(cfg: Config, jobs: list[Job] | None = None) -> Trace:
    """The seeded trace: fleet, tenants, jobs (unless given) and faults."""
    rng = random.Random(cfg.seed)
    slices = build_fleet(cfg.hosts, cfg.spot_fraction, rng)
    tenants = [f"t{i}" for i in range(cfg.tenants)]
    chips = {t: slice_type(t).chips for t in TYPES}
    capacity = sum(chips[acc] for _, acc, _ in slices)
    quota = {t: capacity // cfg.tenants for t in tenants}
    owner: dict[str, str] = {}
    for t in TYPES:  # the static partition: slices of each type dealt out in turn
        names = [n for n, acc, _ in slices if acc == t]
        for i, name in enumerate(names):
            owner[name] = tenants[i % len(tenants)]
    if jobs is None:
        weights = [1.0 / (i + 1) for i in range(cfg.tenants)]
        jobs = []
        gaps = []
        for i in range(cfg.jobs):
            units = _pick(rng, SIZE_MIX)
            acc, n = UNIT_SHAPES[units]
            tenant = rng.choices(tenants, weights)[0]
            jobs.append(Job(i, tenant, units, acc, n, n * chips[acc], 0.0, gavel_duration(rng)))
            gaps.append(rng.expovariate(1.0))
        # Scale the Poisson gaps so the trace offers ``load`` of the fleet over its arrival window.
        work = sum(j.chips * j.duration for j in jobs)
        span = work / (cfg.load * capacity)
        scale = span / max(sum(gaps[:-1]), 1e-9)
        t_now = 0.0
        for j, gap in zip(jobs, gaps, strict=True):
            j.arrival = t_now if j.idx else 0.0
            t_now += gap * scale
    horizon = max((j.arrival for j in jobs), default=0.0)
    faults: list[Fault] = []
    end = horizon + 30 * DAY  # faults keep coming while the backlog drains
    for name, acc, spot in slices:
        rate = cfg.host_failures * slice_type(acc).hosts / DAY
        t_f = 0.0
        while rate > 0:
            t_f += rng.expovariate(rate)
            if t_f > end:
                break
            faults.append(Fault(t_f, name, "host", cfg.repair_h * 3600))
        if spot and cfg.spot_preemptions > 0:
            t_f = 0.0
            while True:
                t_f += rng.expovariate(cfg.spot_preemptions / DAY)
                if t_f > end:
                    break
                faults.append(Fault(t_f, name, "spot", cfg.spot_return_h * 3600))
    faults.sort(key=lambda f: (f.time, f.slice))
    return Trace(jobs, slices, tenants, quota, owner, faults, horizon, capacity)


# -- the replay engine ---------------------------------------------------------------------------

NEW, QUEUED, RUNNING, STOPPING, DONE = range(5)
# Event kinds, in the order they apply at one instant: releases and finishes free slices first.
EV_RELEASE, EV_FINISH, EV_RECOVER, EV_READY, EV_WAKE, EV_FAULT, EV_ARRIVE = range(7)


@dataclass(slots=True)
class Run:
    """One job's progress through a replay."""

    job: Job
    state: int = NEW
    remaining: float = 0.0
    attempt: int = 0
    start: float = 0.0
    slices: tuple[int, ...] = ()
    first_start: float | None = None
    finished: float | None = None


@dataclass(slots=True)
class Slice:
    idx: int
    name: str
    acc: str
    chips: int
    owner: str
    up: bool = True  # not broken
    present: bool = True  # not taken away (spot)
    holder: int | None = None
    since: float = 0.0  # when ``present`` last changed (for chip-hours paid)


class Engine:
    """Replays a trace under a scheduler; the scheduler admits and preempts through it.

    Slices and jobs are ints (indexes) so that set iteration, and so every result, is the same in
    every process whatever ``PYTHONHASHSEED`` is.
    """

    def __init__(self, trace: Trace, cfg: Config, *, autoscaled: bool = False) -> None:
        self.trace, self.cfg = trace, cfg
        # Autoscaled: every slice of the fleet is a slot that starts away (not made, not paid) and
        # is made and deleted by the scheduler; a spot preemption takes it away until made again.
        self.autoscaled = autoscaled
        self.runs = [Run(j, remaining=j.duration) for j in trace.jobs]
        self.slices = [
            Slice(i, n, acc, slice_type(acc).chips, trace.owner[n], present=not autoscaled)
            for i, (n, acc, _) in enumerate(trace.slices)
        ]
        self.by_name = {s.name: s.idx for s in self.slices}
        self.free: dict[str, set[int]] = {t: set() for t in TYPES}
        self.free_owned: dict[tuple[str, str], set[int]] = {
            (t, acc): set() for t in trace.tenants for acc in TYPES
        }
        for s in self.slices:
            if s.present:
                self._set_free(s, True)
        self.making = 0  # slices being made (autoscaled)
        self.on_gone: Callable[[int], None] = lambda idx: None  # an autoscaled slice was taken away
        self.events: list[tuple[float, int, int, int, object]] = []
        self._n = 0
        for run in self.runs:
            self._push(run.job.arrival, EV_ARRIVE, run.job.idx)
        for fault in trace.faults:
            self._push(fault.time, EV_FAULT, self.by_name[fault.slice], fault)
        self.now = 0.0
        self.restart_s = cfg.restart_min * 60
        self.ckpt_s = cfg.checkpoint_min * 60
        self.changed = False
        self.fresh: list[int] = []  # arrived or requeued since the last cycle, in that order
        self.queued = 0
        self.active = 0  # running or stopping
        self.arrived = 0
        self.done = 0
        self.down = 0  # slices broken or away
        # Accounting.
        self.used_window = 0.0
        self.used_total = 0.0
        self.useful = 0.0
        self.paid_window = 0.0
        self.tenant_used = dict.fromkeys(trace.tenants, 0.0)
        self.held = dict.fromkeys(trace.tenants, 0)
        self.waiting = dict.fromkeys(trace.tenants, 0)
        self.got = dict.fromkeys(trace.tenants, 0.0)
        self.entitled = dict.fromkeys(trace.tenants, 0.0)
        # With ``explain_shortfall``: chip-seconds below entitlement, per tenant, by the cause the
        # scheduler gave at its last cycle (``cause``); they add up to ``entitled - got``.
        self.cause: dict[str, str] = {}
        self.shortfall: dict[str, dict[str, float]] = {t: {} for t in trace.tenants}
        self._t_acc = 0.0
        self.preemptions = 0
        self.failures = 0
        self.cycles = 0
        self.on_slice: Callable[[int], None] = lambda idx: None  # a slice changed (for snapshots)
        self.on_job: Callable[[int], None] = lambda idx: None  # a job changed state

    def _push(self, t: float, kind: int, key: int, payload: object = None) -> None:
        self._n += 1
        heapq.heappush(self.events, (t, kind, self._n, key, payload))

    def _set_free(self, s: Slice, free: bool) -> None:
        if free:
            self.free[s.acc].add(s.idx)
            self.free_owned[s.owner, s.acc].add(s.idx)
        else:
            self.free[s.acc].discard(s.idx)
            self.free_owned[s.owner, s.acc].discard(s.idx)

    # -- accounting ------------------------------------------------------------------------------

    def _advance(self, t: float) -> None:
        """Integrate each tenant's held and wanted chips (capped at quota) from the last event to ``t``."""
        lo, hi = self._t_acc, min(t, self.trace.horizon)
        if hi > lo:
            dt = hi - lo
            for tenant, q in self.trace.quota.items():
                h = self.held[tenant]
                got, wanted = min(h, q), min(h + self.waiting[tenant], q)
                self.got[tenant] += got * dt
                self.entitled[tenant] += wanted * dt
                if wanted > got and self.cfg.explain_shortfall:
                    cause = self.cause.get(tenant, CAUSE_UNDECIDED)
                    missed = self.shortfall[tenant]
                    missed[cause] = missed.get(cause, 0.0) + (wanted - got) * dt
        self._t_acc = max(self._t_acc, t)
        self.now = max(self.now, t)

    def _held_for(self, run: Run, end: float) -> None:
        chips, h = run.job.chips, self.trace.horizon
        self.used_total += (end - run.start) * chips
        inside = (min(end, h) - min(run.start, h)) * chips
        self.used_window += inside
        self.tenant_used[run.job.tenant] += inside

    def _present(self, s: Slice, present: bool, t: float) -> None:
        if s.present:
            h = self.trace.horizon
            self.paid_window += (min(t, h) - min(s.since, h)) * s.chips
        s.present, s.since = present, t

    # -- what schedulers call --------------------------------------------------------------------

    def make(self, idx: int, after_s: float) -> None:
        """Start making the (away) slice ``idx``: it is present and free ``after_s`` from now."""
        assert self.autoscaled and not self.slices[idx].present
        self.making += 1
        self._push(self.now + after_s, EV_READY, idx)

    def remove(self, idx: int) -> None:
        """Delete the free autoscaled slice ``idx`` now (no longer paid)."""
        s = self.slices[idx]
        assert self.autoscaled and s.present and s.holder is None, s
        self._set_free(s, False)
        self._present(s, False, self.now)
        self.on_slice(idx)

    def wake(self, t: float) -> None:
        self._push(t, EV_WAKE, 0)

    def admit(self, idx: int, slices: tuple[int, ...]) -> None:
        run = self.runs[idx]
        assert run.state == QUEUED, f"{run.job.id} admitted while not queued"
        assert len(slices) == run.job.num_slices, f"{run.job.id} given {len(slices)} slices"
        for i in slices:
            s = self.slices[i]
            assert s.holder is None and s.up and s.present and s.acc == run.job.acc, s
            s.holder = idx
            self._set_free(s, False)
            self.on_slice(i)
        run.state, run.slices, run.start = RUNNING, slices, self.now
        run.attempt += 1
        if run.first_start is None:
            run.first_start = self.now
        self.queued -= 1
        self.active += 1
        self.held[run.job.tenant] += run.job.chips
        self.waiting[run.job.tenant] -= run.job.chips
        self._push(self.now + self.restart_s + run.remaining, EV_FINISH, idx, run.attempt)
        self.on_job(idx)

    def preempt(self, idx: int) -> None:
        """The job checkpoints now and releases its slices ``grace_s`` later (then it is requeued)."""
        run = self.runs[idx]
        assert run.state == RUNNING, f"{run.job.id} preempted while not running"
        self._keep(run, self.now, lose_since_checkpoint=False)
        run.state = STOPPING
        run.attempt += 1  # its finish event no longer applies
        self.preemptions += 1
        self._push(self.now + self.cfg.grace_s, EV_RELEASE, idx, run.attempt)
        self.on_job(idx)

    # -- events ----------------------------------------------------------------------------------

    def _keep(self, run: Run, t: float, *, lose_since_checkpoint: bool) -> None:
        """Credit the progress the attempt keeps at ``t``; the attempt's start moves so it counts once."""
        progress = max(0.0, t - run.start - self.restart_s)
        if lose_since_checkpoint:
            progress = math.floor(progress / self.ckpt_s) * self.ckpt_s if self.ckpt_s > 0 else 0.0
        progress = min(progress, run.remaining)
        run.remaining -= progress
        self.useful += progress * run.job.chips

    def _end_attempt(self, run: Run, t: float, state: int) -> None:
        self._held_for(run, t)
        for i in run.slices:
            s = self.slices[i]
            s.holder = None
            if s.up and s.present:
                self._set_free(s, True)
            self.on_slice(i)
        run.slices = ()
        self.active -= 1
        self.held[run.job.tenant] -= run.job.chips
        run.state = state
        if state == QUEUED:
            self.queued += 1
            self.fresh.append(run.job.idx)
            self.waiting[run.job.tenant] += run.job.chips
        else:
            self.done += 1
        self.on_job(run.job.idx)

    def _apply(self, t: float, kind: int, key: int, payload: object) -> None:
        self._advance(t)
        if kind == EV_ARRIVE:
            run = self.runs[key]
            run.state = QUEUED
            self.queued += 1
            self.arrived += 1
            self.fresh.append(key)
            self.waiting[run.job.tenant] += run.job.chips
            self.on_job(key)
        elif kind == EV_FINISH:
            run = self.runs[key]
            if run.state != RUNNING or payload != run.attempt:
                return  # a stale finish of an attempt that was stopped
            self.useful += run.remaining * run.job.chips
            run.remaining = 0.0
            run.finished = t
            self._end_attempt(run, t, DONE)
        elif kind == EV_RELEASE:
            run = self.runs[key]
            if run.state != STOPPING or payload != run.attempt:
                return  # the slice failed under it meanwhile, and it was requeued then
            self._end_attempt(run, t, QUEUED)
        elif kind == EV_FAULT:
            assert isinstance(payload, Fault)
            s = self.slices[key]
            if not s.up or not s.present:
                return  # already down: the fault changes nothing
            if s.holder is not None:
                run = self.runs[s.holder]
                if run.state == RUNNING:
                    self._keep(run, t, lose_since_checkpoint=payload.kind == "host")
                run.attempt += 1
                self.failures += 1
                self._end_attempt(run, t, QUEUED)
            self._set_free(s, False)
            if payload.kind == "spot" and self.autoscaled:
                self._present(s, False, t)  # gone for good: the autoscaler makes another on demand
                self.on_slice(key)
                self.on_gone(key)
                self.changed = True
                return
            if payload.kind == "host":
                s.up = False
            else:
                self._present(s, False, t)
            self.down += 1
            self.on_slice(key)
            self._push(t + payload.down_s, EV_RECOVER, key)
        elif kind == EV_READY:  # a slice the autoscaler asked for is made
            s = self.slices[key]
            self.making -= 1
            self._present(s, True, t)
            self._set_free(s, True)
            self.on_slice(key)
        elif kind == EV_WAKE:
            pass  # a timer of the scheduler's (an idle timeout): just run a cycle
        else:  # EV_RECOVER
            s = self.slices[key]
            if not s.present:
                self._present(s, True, t)
            s.up = True
            self.down -= 1
            if s.holder is None:
                self._set_free(s, True)
            self.on_slice(key)
        self.changed = True

    def run(self, schedule: Callable[[Engine], None]) -> None:
        """Apply events; once per ``cycle_s`` window in which something happened, run ``schedule``."""
        cycle = self.cfg.cycle_s
        total = len(self.runs)
        while self.events and self.done < total:
            t_next = self.events[0][0]
            tick = math.ceil(t_next / cycle) * cycle if cycle > 0 else t_next
            self.changed = False
            while self.events and self.events[0][0] <= tick:
                t, kind, _, key, payload = heapq.heappop(self.events)
                self._apply(t, kind, key, payload)
            self._advance(tick)
            if self.changed and (self.queued or self.autoscaled):
                self.cycles += 1
                schedule(self)
                self.fresh.clear()
            if self.active == 0 and self.arrived == total and self.down == self.making == 0 and self.queued:
                break  # everything is up and idle, and what is queued can never be placed
        end = max(self.now, self.trace.horizon)
        for s in self.slices:
            self._present(s, s.present, end)


# -- the policies ---------------------------------------------------------------------------------


def _lowest(free: set[int], n: int) -> tuple[int, ...]:
    return tuple(heapq.nsmallest(n, free))


class Fifo:
    """One queue in submission order; the oldest job blocks every later one until it fits."""

    def __init__(self) -> None:
        self.queue: list[tuple[float, int]] = []

    def __call__(self, eng: Engine) -> None:
        for idx in eng.fresh:
            heapq.heappush(self.queue, (eng.runs[idx].job.arrival, idx))
        while self.queue:
            job = eng.runs[self.queue[0][1]].job
            free = eng.free[job.acc]
            if len(free) < job.num_slices:
                return
            heapq.heappop(self.queue)
            eng.admit(job.idx, _lowest(free, job.num_slices))


class StaticQuota:
    """Each tenant's own slices of each type (a static partition), first come first served on them."""

    def __init__(self) -> None:
        self.queues: dict[tuple[str, str], list[tuple[float, int]]] = {}

    def __call__(self, eng: Engine) -> None:
        for idx in eng.fresh:
            job = eng.runs[idx].job
            heapq.heappush(self.queues.setdefault((job.tenant, job.acc), []), (job.arrival, idx))
        for key in sorted(self.queues):
            queue = self.queues[key]
            free = eng.free_owned[key]
            while queue:
                job = eng.runs[queue[0][1]].job
                if len(free) < job.num_slices:
                    break
                heapq.heappop(queue)
                eng.admit(job.idx, _lowest(free, job.num_slices))


class Tpufleet:
    """``tpufleet.scheduler.policy.decide`` on a snapshot of the engine's state each cycle."""

    def __init__(self, eng: Engine) -> None:
        self.eng = eng
        self.tenants = tuple(TenantView(TenantName(t), {GEN: q}) for t, q in sorted(eng.trace.quota.items()))
        self.slice_views: list[SliceView | None] = [None] * len(eng.slices)
        for s in eng.slices:
            self._slice(s.idx)
        self.jobs: dict[int, JobView] = {}
        self.admissions = 0
        eng.on_slice = self._slice
        eng.on_job = self._job
        self.calls = 0
        self.seconds = 0.0

    def _slice(self, idx: int) -> None:
        s = self.eng.slices[idx]
        if not s.present:
            self.slice_views[idx] = None  # taken away: not in the fleet
            return
        if not s.up:
            state, holder = SliceState.BROKEN, None
        elif s.holder is not None:
            state, holder = SliceState.HELD, JobId(f"j{s.holder}")
        else:
            state, holder = SliceState.FREE, None
        self.slice_views[idx] = SliceView(SliceName(s.name), s.acc, state, holder)

    def _job(self, idx: int) -> None:
        run = self.eng.runs[idx]
        job = run.job
        if run.state == QUEUED:
            self.jobs[idx] = JobView(
                JobId(job.id), TenantName(job.tenant), job.acc, job.num_slices, 0, idx + 1, JobState.QUEUED
            )
        elif run.state in (DONE, NEW):
            self.jobs.pop(idx, None)
        # RUNNING and STOPPING views are written by ``__call__``, which knows borrowing and admit_seq.

    def snapshot(self) -> Snapshot:
        return Snapshot(
            self.tenants,
            tuple(v for v in self.slice_views if v is not None),
            list(self.jobs.values()),
        )

    def __call__(self, eng: Engine) -> None:
        if not eng.queued:
            return
        snapshot = self.snapshot()
        started = time.perf_counter()
        decisions = decide(snapshot)
        self.seconds += time.perf_counter() - started
        self.calls += 1
        self._apply(eng, decisions)
        if eng.cfg.explain_shortfall:
            eng.cause = shortfall_causes(eng, self.jobs, decisions)

    def _apply(self, eng: Engine, decisions: list[Decision]) -> None:
        for d in decisions:
            idx = int(d.job[1:])
            if isinstance(d, Admit):
                eng.admit(idx, tuple(eng.by_name[n] for n in d.slices))
                self.admissions += 1
                view = self.jobs[idx]
                self.jobs[idx] = replace(
                    view,
                    state=JobState.RUNNING,
                    slices=d.slices,
                    borrowing=d.borrowing,
                    admit_seq=self.admissions,
                    head_of_line=False,
                )
            elif isinstance(d, Preempt):
                eng.preempt(idx)
                self.jobs[idx] = replace(self.jobs[idx], preempting=True, yielding=d.within_tenant)
            elif isinstance(d, Wait) and d.head_of_line != self.jobs[idx].head_of_line:
                self.jobs[idx] = replace(self.jobs[idx], head_of_line=d.head_of_line)


class TpufleetAutoscaled(Tpufleet):
    """``decide``, then ``tpufleet.scheduler.autoscale.plan`` each cycle, on a fleet that starts empty.

    One pool per slice type, on demand, ``min_slices`` 0 and ``max_slices`` the fixed fleet's count
    of the type (so it can reach the peak fleet, never more). A created slice is ready
    ``--provision-min`` later; a free one idle for ``--idle-timeout-min`` is deleted when the plan
    says so. A spot preemption of a made slice takes it away (``GONE``: deleted, made again on
    demand).
    """

    def __init__(self, eng: Engine) -> None:
        self.making: dict[int, tuple[float, str | None]] = {}  # slice -> (asked at, for job)
        self.ready_at: dict[int, float] = {}
        self.idle_since: dict[int, float] = {}
        self.for_job: dict[int, str | None] = {}
        self.provision_s = eng.cfg.provision_min * 60
        self.idle_timeout_s = eng.cfg.idle_timeout_min * 60
        super().__init__(eng)
        self.pools = tuple(
            PoolView(f"pool-{t}", t, 0, sum(s.acc == t for s in eng.slices), False, eng.cfg.spare_slices)
            for t in TYPES
        )
        eng.on_gone = self._gone

    def _slice(self, idx: int) -> None:
        super()._slice(idx)
        s = self.eng.slices[idx]
        if s.present and idx in self.making:
            del self.making[idx]
            self.ready_at[idx] = self.eng.now
        if s.present and s.holder is None and s.up:
            if idx not in self.idle_since:
                self.idle_since[idx] = self.eng.now
                self.eng.wake(self.eng.now + self.idle_timeout_s)
        else:
            self.idle_since.pop(idx, None)
        if not s.present and idx not in self.making:
            self.ready_at.pop(idx, None)

    def _gone(self, idx: int) -> None:
        self.ready_at.pop(idx, None)
        self.for_job.pop(idx, None)

    def __call__(self, eng: Engine) -> None:
        super().__call__(eng)
        now = eng.now
        managed = [
            Managed(s.name, f"pool-{s.acc}", Phase.PENDING, None, False, now - asked, None, _jid(job))
            for idx, (asked, job) in sorted(self.making.items())
            for s in (eng.slices[idx],)
        ] + [
            Managed(
                s.name,
                f"pool-{s.acc}",
                Phase.READY,
                SliceName(s.name),
                False,
                now - ready,
                now - self.idle_since[idx] if idx in self.idle_since else None,
                _jid(self.for_job.get(idx)),
            )
            for idx, ready in sorted(self.ready_at.items())
            for s in (eng.slices[idx],)
        ]
        started = time.perf_counter()
        scale = ScaleSnapshot(self.snapshot(), self.pools, managed, idle_timeout_s=self.idle_timeout_s)
        actions = plan(scale).actions
        self.seconds += time.perf_counter() - started
        away = {
            t: [s.idx for s in eng.slices if s.acc == t and not s.present and s.idx not in self.making]
            for t in {a.accelerator_type for a in actions if isinstance(a, Create)}
        }
        for a in actions:
            if isinstance(a, Create):
                idx = away[a.accelerator_type].pop(0)
                self.making[idx] = (now, a.for_job)
                self.for_job[idx] = a.for_job
                eng.make(idx, self.provision_s)
            elif isinstance(a, Delete):
                idx = eng.by_name[a.group]
                if idx in self.making or not eng.slices[idx].present:
                    continue  # pending, failed or already gone: nothing is paid for it
                eng.remove(idx)
                self.for_job.pop(idx, None)


def _jid(job: str | None) -> JobId | None:
    return None if job is None else JobId(job)


# -- one replay and its report -------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


CAUSE_UNDECIDED = "not_decided_yet"  # arrived or requeued since the last cycle
CAUSES = {
    "type_saturated": "its next job's slice type is all held within quotas (or by itself)",
    "reclaim_in_progress": "a borrower of an over-quota tenant holds the type: preempted or about to be",
    "headroom_below_job": "its next job is larger than what is left of its quota (whole slices)",
    "admitted": "admitted this cycle, not yet counted as held",
    CAUSE_UNDECIDED: "arrived or requeued since the last cycle",
}
_WAITS_FOR_THE_TYPE = ("WAITING_FOR_FREE_SLICES", "RESERVED_FOR_HEAD_OF_LINE", "WAITING_FOR_PREEMPTION")


def shortfall_causes(eng: Engine, jobs: dict[int, JobView], decisions: list[Decision]) -> dict[str, str]:
    """For each tenant below its entitlement with demand, what its first job in the policy's order
    (its next chance) is waiting for, as one of ``CAUSES`` (or ``other:<NotFit code>``)."""
    quota = eng.trace.quota
    below = {t for t, q in quota.items() if min(eng.held[t], q) < min(eng.held[t] + eng.waiting[t], q)}
    first: dict[str, Decision] = {}
    for d in decisions:
        view = jobs.get(int(d.job[1:]))
        if view is not None and view.tenant in below and not isinstance(d, Preempt):
            first.setdefault(view.tenant, d)
    causes: dict[str, str] = {}
    for tenant, d in first.items():
        view = jobs[int(d.job[1:])]
        if isinstance(d, Admit):
            causes[tenant] = "admitted"
            continue
        assert isinstance(d, Wait)
        code = d.reason.code.value
        chips = slice_type(view.accelerator_type).chips * view.num_slices
        if code == "QUOTA_EXCEEDED_NO_BORROWING" and chips > quota[tenant] - eng.held[tenant]:
            causes[tenant] = "headroom_below_job"
        elif code in _WAITS_FOR_THE_TYPE:
            causes[tenant] = "reclaim_in_progress" if _reclaimable(eng, jobs, view) else "type_saturated"
        else:
            causes[tenant] = f"other:{code}"
    return causes


def _reclaimable(eng: Engine, jobs: dict[int, JobView], waiting: JobView) -> bool:
    """Whether a borrower of another tenant that is beyond its quota holds a slice of the type."""
    for s in eng.slices:
        holder = jobs.get(s.holder) if s.holder is not None else None
        if holder is None or s.acc != waiting.accelerator_type or holder.tenant == waiting.tenant:
            continue
        if holder.borrowing and eng.held[holder.tenant] > eng.trace.quota[holder.tenant]:
            return True
    return False


def replay(trace: Trace, cfg: Config, policy: str) -> dict[str, object]:
    """Replay ``trace`` under ``policy`` and return its metrics (see the module docstring)."""
    started = time.perf_counter()
    eng = Engine(trace, cfg)
    schedule: Callable[[Engine], None]
    extra: dict[str, object] = {}
    tpf: Tpufleet | None = None
    if policy == "fifo":
        schedule = Fifo()
    elif policy == "static_quota":
        schedule = StaticQuota()
    elif policy == "tpufleet":
        schedule = tpf = Tpufleet(eng)
    elif policy == "tpufleet_autoscaled":
        eng = Engine(trace, cfg, autoscaled=True)
        schedule = tpf = TpufleetAutoscaled(eng)
    else:
        raise ValueError(f"unknown policy {policy!r}")
    eng.run(schedule)
    if tpf is not None:
        extra = {"decide_calls": tpf.calls, "decide_seconds": round(tpf.seconds, 2)}
    h = trace.horizon
    fleet = trace.capacity_chips * h
    offered = sum(j.chips * min(j.duration + cfg.restart_min * 60, h - j.arrival) for j in trace.jobs)
    waits: dict[int, list[float]] = {u: [] for u, _ in SIZE_MIX}
    tenant_waits: dict[str, list[float]] = {t: [] for t in trace.tenants}
    for r in eng.runs:
        if r.first_start is not None:
            waits[r.job.units].append(r.first_start - r.job.arrival)
            tenant_waits[r.job.tenant].append(r.first_start - r.job.arrival)
    every = [w for ws in waits.values() for w in ws]
    tenants: dict[str, dict[str, float]] = {}
    met: list[float] = []
    for t in trace.tenants:
        m = eng.got[t] / eng.entitled[t] if eng.entitled[t] > 0 else 1.0
        met.append(m)
        tenants[t] = {
            "share": round(eng.tenant_used[t] / fleet, 4) if fleet else 0.0,
            "entitlement": round(trace.quota[t] / trace.capacity_chips, 4),
            "entitlement_met": round(m, 4),
            "wait_p50_s": round(_pct(tenant_waits[t], 0.50), 1),
            "wait_p99_s": round(_pct(tenant_waits[t], 0.99), 1),
        }
        missed = eng.entitled[t] - eng.got[t]
        if cfg.explain_shortfall and tpf is not None:  # fractions of the chip-seconds below entitlement
            tenants[t]["shortfall"] = (
                {  # type: ignore[assignment]
                    c: round(v / missed, 4)
                    for c, v in sorted(eng.shortfall[t].items(), key=lambda kv: -kv[1])
                }
                if missed > 0
                else {}
            )
    util = eng.used_window / fleet if fleet else 0.0
    load = offered / fleet if fleet else 0.0
    return {
        "utilization": round(util, 4),
        "offered_load": round(load, 4),
        "utilization_of_offered": round(util / load, 4) if load else 0.0,
        "wait_p50_s": round(_pct(every, 0.50), 1),
        "wait_p99_s": round(_pct(every, 0.99), 1),
        "wait_by_units": {
            str(u): {"p50_s": round(_pct(ws, 0.5), 1), "p99_s": round(_pct(ws, 0.99), 1), "jobs": len(ws)}
            for u, ws in waits.items()
        },
        "tenants": tenants,
        "jain_fairness": round(jain(met), 4),
        "min_entitlement_met": round(min(met, default=1.0), 4),
        "goodput": round(eng.useful / eng.used_total, 4) if eng.used_total else 1.0,
        "chip_hours_paid": round(eng.paid_window / 3600, 1),
        "chip_hours_used": round(eng.used_window / 3600, 1),
        "jobs": len(eng.runs),
        "finished": eng.done,
        "unfinished": len(eng.runs) - eng.done,
        "preemptions": eng.preemptions,
        "failures": eng.failures,
        "cycles": eng.cycles,
        "sim_seconds": round(time.perf_counter() - started, 2),
        **extra,
    }


def compare(
    cfg: Config, policies: tuple[str, ...] = POLICIES, trace: Trace | None = None
) -> dict[str, object]:
    trace = trace or build_trace(cfg)
    return {
        "trace": {
            "hosts": sum(slice_type(acc).hosts for _, acc, _ in trace.slices),
            "slices": {t: sum(1 for _, acc, _ in trace.slices if acc == t) for t in TYPES},
            "chips": trace.capacity_chips,
            "jobs": len(trace.jobs),
            "tenants": len(trace.tenants),
            "days": round(trace.horizon / DAY, 2),
            "faults": {k: sum(1 for f in trace.faults if f.kind == k) for k in ("host", "spot")},
            "seed": cfg.seed,
            "cycle_s": cfg.cycle_s,
        },
        "policies": {p: replay(trace, cfg, p) for p in policies},
    }


def _table(result: dict[str, object]) -> str:
    trace = result["trace"]
    assert isinstance(trace, dict)
    lines = [
        f"trace: {trace['jobs']} jobs over {trace['days']} days, {trace['hosts']} hosts "
        f"({trace['chips']} chips; slices {trace['slices']}), {trace['tenants']} tenants, "
        f"faults {trace['faults']}, seed {trace['seed']}, one cycle per {trace['cycle_s']:g} s",
        "",
        f"{'policy':<20}{'util':>7}{'offered':>9}{'u/off':>7}{'p50 wait':>10}{'p99 wait':>10}"
        f"{'jain':>7}{'min met':>9}{'goodput':>9}{'paid ch':>10}{'used ch':>10}{'unfin':>7}{'wall s':>8}",
    ]
    policies = result["policies"]
    assert isinstance(policies, dict)
    for name, m in policies.items():
        lines.append(
            f"{name:<20}{m['utilization']:>7.3f}{m['offered_load']:>9.3f}{m['utilization_of_offered']:>7.3f}"
            f"{_hours(m['wait_p50_s']):>10}{_hours(m['wait_p99_s']):>10}{m['jain_fairness']:>7.3f}"
            f"{m['min_entitlement_met']:>9.3f}{m['goodput']:>9.3f}{m['chip_hours_paid']:>10.0f}"
            f"{m['chip_hours_used']:>10.0f}{m['unfinished']:>7}{m['sim_seconds']:>8.1f}"
        )
    lines += ["", "p50 / p99 wait by job size (units):"]
    for name, m in policies.items():
        parts = [f"{u}: {_hours(w['p50_s'])} / {_hours(w['p99_s'])}" for u, w in m["wait_by_units"].items()]
        lines.append(f"  {name:<20}" + "   ".join(parts))
    lines += ["", "share of the fleet / entitlement (entitlement met while it had demand):"]
    for name, m in policies.items():
        parts = [
            f"{t}: {v['share']:.3f}/{v['entitlement']:.3f} ({v['entitlement_met']:.3f})"
            for t, v in m["tenants"].items()
        ]
        lines.append(f"  {name:<20}" + "   ".join(parts))
    explained = [(n, m) for n, m in policies.items() if any("shortfall" in v for v in m["tenants"].values())]
    if explained:
        lines += ["", "time below entitlement while it had demand, by cause (share of chip-seconds missed):"]
        lines += [f"  {c}: {what}" for c, what in CAUSES.items()]
    for name, m in explained:
        for t, v in m["tenants"].items():
            causes = "   ".join(f"{c} {f:.1%}" for c, f in v["shortfall"].items()) or "never below"
            lines.append(f"  {name:<20}{t} (met {v['entitlement_met']:.3f}): {causes}")
    return "\n".join(lines)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} m"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--hosts", type=int, default=1000, help="hosts in the fleet (default 1000)")
    parser.add_argument("--jobs", type=int, default=5000, help="jobs in the trace (default 5000)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tenants", type=int, default=4, help="tenants with equal quotas (default 4)")
    parser.add_argument("--load", type=float, default=0.9, help="offered load, fraction of the fleet")
    parser.add_argument("--host-failures", type=float, default=0.001, help="per host per day")
    parser.add_argument("--repair-h", type=float, default=4.0)
    parser.add_argument("--spot-fraction", type=float, default=0.2)
    parser.add_argument("--spot-preemptions", type=float, default=0.2, help="per spot slice per day")
    parser.add_argument("--spot-return-h", type=float, default=2.0)
    parser.add_argument("--checkpoint-min", type=float, default=30.0)
    parser.add_argument("--restart-min", type=float, default=2.0)
    parser.add_argument("--cycle-s", type=float, default=60.0, help="one scheduling cycle per this window")
    parser.add_argument("--grace-s", type=float, default=30.0, help="a preempted job's time to stop")
    parser.add_argument("--provision-min", type=float, default=5.0, help="autoscaled: time to make a slice")
    parser.add_argument("--idle-timeout-min", type=float, default=10.0, help="autoscaled: idle before delete")
    parser.add_argument(
        "--spare-slices", type=int, default=0, help="autoscaled: slices of each type kept free (spare_slices)"
    )
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated subset")
    parser.add_argument(
        "--explain-shortfall",
        action="store_true",
        help="tpufleet policies: split each tenant's time below its entitlement by cause",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    policies = tuple(p for p in args.policies.split(",") if p)
    problems = [
        *(f"unknown policy {p!r} (known: {', '.join(POLICIES)})" for p in policies if p not in POLICIES),
        *(
            f"--{name.replace('_', '-')} must be at least {low}, not {getattr(args, name)}"
            for name, low in (("hosts", 8), ("jobs", 1), ("tenants", 1), ("cycle_s", 1))
            if getattr(args, name) < low
        ),
    ]
    if not 0 < args.load <= 10:
        problems.append(f"--load must be in (0, 10], not {args.load}")
    if problems:
        print(f"error: {problems[0]}", file=sys.stderr)
        return 2
    cfg = Config(
        hosts=args.hosts,
        jobs=args.jobs,
        seed=args.seed,
        tenants=args.tenants,
        load=args.load,
        host_failures=args.host_failures,
        repair_h=args.repair_h,
        spot_fraction=args.spot_fraction,
        spot_preemptions=args.spot_preemptions,
        spot_return_h=args.spot_return_h,
        checkpoint_min=args.checkpoint_min,
        restart_min=args.restart_min,
        cycle_s=args.cycle_s,
        grace_s=args.grace_s,
        provision_min=args.provision_min,
        idle_timeout_min=args.idle_timeout_min,
        spare_slices=args.spare_slices,
        explain_shortfall=args.explain_shortfall,
    )
    result = compare(cfg, policies)
    print(json.dumps(result, indent=1) if args.json else _table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
