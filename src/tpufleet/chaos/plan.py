"""The soak's seeded plan: its configuration, the job stream and the fault times, and the
command each planned job runs. Pure: the same seed gives the same plan."""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from tpufleet import catalog
from tpufleet.errors import SpecError
from tpufleet.scheduler.lifecycle import JobKind

FAULT_KINDS = ("kill_host", "preempt", "preempt_notice", "control_plane_kill")
HOST_FAULTS = FAULT_KINDS[:3]
HEAD_KILL = "ray_head_kill"  # once a run: the Ray cluster is lost and the fleet brought back
# With --replicas: the leader SIGKILLed, SIGSTOPped past its lease, SIGTERMed; every replica killed
LEADER_FAULTS = ("leader_kill", "leader_stop", "leader_term", "replicas_kill_all")
DAMAGE = (*FAULT_KINDS, HEAD_KILL, *LEADER_FAULTS)  # what stops with the window
TENANTS = {"chaos-a": 8, "chaos-b": 8}  # tenant -> quota in chips per generation present
HOSTJOB = Path(__file__).resolve().with_name("hostjob.py")  # what an SPMD job runs on each host
RAYDRIVER = Path(__file__).resolve().with_name("raydriver.py")  # what a Ray job runs as its driver


@dataclass(frozen=True)
class ChaosConfig:
    seed: int = 0
    jobs: int = 20
    minutes: float = 5.0
    slices: str = "v4-8:2,v4-16:1"
    cpus_per_host: int = 1
    ray_jobs: float = 0.25  # the share of the jobs that are Ray jobs (drawn per job, seeded)
    drain_timeout_s: float = 300.0  # after the fault window: how long every job has to end
    state_dir: Path | None = None  # default: a temporary directory, removed at the end
    # Someone else's: an emulated fleet already running from this directory (its slices are what
    # jobs ask for; it is broken and repaired, never stopped) ...
    fleet_dir: Path | None = None
    # ... and a control plane already serving it on this machine: its URL, admin token and state
    # directory (its store, its jobs' checkpoint directories). It is SIGKILLed and started again
    # with its own command line, environment and working directory, and left running.
    server: str | None = None
    token: str | None = None
    server_state_dir: Path | None = None
    # --replicas N: N `serve` replicas of the soak's own on this PostgreSQL database, and leader
    # faults (LEADER_FAULTS) instead of the control-plane kill; the lease they run with (seconds)
    replicas: int = 0
    db: str | None = None
    lease_s: float = 3.0
    # --sandbox: the replicas serve this in-memory fleet (`serve --sandbox`), no Ray: no host
    # faults, nothing executed (each job "runs" its seconds), only the leader faults
    sandbox: str | None = None

    def fault_kinds(self) -> tuple[str, ...]:
        """The kinds of damage the window is made of (the Ray head's loss aside)."""
        if not self.replicas:
            return FAULT_KINDS
        return LEADER_FAULTS if self.sandbox else (*HOST_FAULTS, *LEADER_FAULTS)


@dataclass(frozen=True)
class PlannedJob:
    index: int
    at: float  # seconds after the start of the fault window
    accelerator_type: str
    num_slices: int
    tenant: str
    priority: int
    seconds: float
    kind: JobKind = JobKind.SPMD

    @property
    def name(self) -> str:
        return f"chaos-{self.index}"

    def command(self, token: str) -> list[str]:
        """What the job runs: the host program on each host (SPMD), or the Ray driver that runs it
        on each admitted host (Ray), by path; ``token`` marks its processes in ``/proc``."""
        program = RAYDRIVER if self.kind == JobKind.RAY else HOSTJOB
        return [sys.executable, str(program), token, str(self.seconds)]


@dataclass(order=True)
class Event:
    at: float
    seq: int
    kind: str = field(compare=False)
    target: str | None = field(default=None, compare=False)


def parse_slices(text: str) -> list[tuple[str, int]]:
    """``[(accelerator_type, count)]`` of a fleet spec such as ``v4-8:2,v4-16:1``; SpecError if bad."""
    parsed = catalog.parse_slice_list(text)
    if not parsed:
        raise SpecError(f"--slices {text!r} names no slices; give e.g. v4-8:2,v4-16:1")
    out: dict[str, int] = {}
    for stype, count in parsed:
        out[stype.accelerator_type] = out.get(stype.accelerator_type, 0) + count
    return sorted(out.items())


def plan_jobs(cfg: ChaosConfig, rng: random.Random) -> list[PlannedJob]:
    """The seeded job stream: mixed shapes (every type, 1 to 2 slices where the fleet has them),
    tenants and priorities, submitted over the first half of the window, 2 to 8 s long each."""
    shapes = [(t, n) for t, count in parse_slices(cfg.slices) for n in range(1, min(count, 2) + 1)]
    window = cfg.minutes * 60
    jobs = []
    for i in range(cfg.jobs):
        t, n = rng.choice(shapes)
        jobs.append(
            PlannedJob(
                index=i,
                at=round(rng.uniform(0, window * 0.5), 3),
                accelerator_type=t,
                num_slices=n,
                tenant=rng.choice(sorted(TENANTS)),
                priority=rng.choice((0, 0, 1, 2)),
                seconds=round(rng.uniform(2.0, 8.0), 2),
            )
        )
    # Which are Ray jobs: their own stream, so the rest of the plan is what it was without them.
    kinds = random.Random(cfg.seed + 3)
    jobs = [replace(j, kind=JobKind.RAY) if kinds.random() < cfg.ray_jobs else j for j in jobs]
    return sorted(jobs, key=lambda j: (j.at, j.index))


def plan_faults(cfg: ChaosConfig, rng: random.Random) -> list[Event]:
    """Seeded fault times in [10 %, 85 %] of the window: one every ~15 s, at least one of each kind
    (``cfg.fault_kinds()``); the Ray head's loss once, unless the fleet is a sandbox."""
    window = cfg.minutes * 60
    each = cfg.fault_kinds()
    count = max(len(each), round(window / 15))
    kinds = list(each)
    rng.shuffle(kinds)
    kinds += [rng.choice(each) for _ in range(count - len(kinds))]
    times = sorted(rng.uniform(0.1 * window, 0.85 * window) for _ in range(count))
    events = [Event(round(at, 3), i, kind) for i, (at, kind) in enumerate(zip(times, kinds, strict=True))]
    if cfg.sandbox:
        return events
    # Once, in the middle of the window (its own stream, so the other faults stay as they were).
    head_at = random.Random(cfg.seed + 2).uniform(0.3 * window, 0.6 * window)
    return sorted([*events, Event(round(head_at, 3), count, HEAD_KILL)])
