"""The chaos soak behind ``tpufleet chaos``: a seeded stream of jobs on an emulated fleet while hosts die,
slices are preempted (with and without notice) and come back, and the control plane is SIGKILLed
and restarted on the same store; then what the system promised is checked (docs/reliability.md).

What it starts, it stops by PID: an :class:`~tpufleet.emulator.EmulatedFleet` of its own and
``tpufleet serve`` as a subprocess (its own process group, so a SIGKILL takes the whole server, as
a crashed VM would). Faults run in one background thread, in seeded order at seeded times; the main
thread submits jobs (through the REST client, retrying while the server is down, never twice: a job
is named ``chaos-<i>`` and looked up before a retry) and follows them.

A share of the jobs (``ray_jobs``) are Ray jobs: their driver (:data:`RAY_JOB_CODE`, run by Ray's job
submission on the head) reserves its admitted slices with ``ray.util.tpu.SlicePlacementGroup``, as
Ray Train does, and runs one task per host on them; the server is started with
``--allow-ray-jobs``. Each task runs the same host code as an SPMD job's host.

Every job runs :data:`JOB_CODE` on each host: each host of each attempt writes a marker
``chaos-<attempt>-<slice>-<worker>.json`` in the job's ``TPUFLEET_CHECKPOINT_DIR`` when it starts
(after reading the markers of the job's other attempts that are still running), refreshes its
heartbeat while it runs and records its end. Two attempts of one job ran at the same time when a
later attempt started before an earlier one's last heartbeat: a double run. A second SUCCEEDED
attempt of one job (from the store) is a double run too.
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tpufleet import catalog
from tpufleet.control.ray.headwatch import AWAIT_ENV
from tpufleet.errors import SpecError, TpufleetError

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
FAULT_KINDS = ("kill_host", "preempt", "preempt_notice", "control_plane_kill")
SUBMIT_GRACE_S = 300.0  # after the window, how long a submit is retried while the server is down (then: lost)
HEAD_KILL = "ray_head_kill"  # once a run: the Ray cluster is lost and the fleet brought back
DAMAGE = (*FAULT_KINDS, HEAD_KILL)  # what stops with the window
TENANTS = {"chaos-a": 8, "chaos-b": 8}  # tenant -> quota in chips per generation present
NO_CLOUD = {"NO_GCE_CHECK": "True", "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9"}

# argv: TOKEN SECONDS. The token is only there so the soak finds the job's processes in /proc.
JOB_CODE = """\
import json, os, sys, time
d = os.environ['TPUFLEET_CHECKPOINT_DIR']
a = os.environ['TPUFLEET_ATTEMPT']
s, w = os.environ.get('TPU_NAME', '-'), os.environ.get('TPU_WORKER_ID', '0')
os.makedirs(d, exist_ok=True)
me = os.path.join(d, 'chaos-%s-%s-%s.json' % (a, s, w))
now = time.time()
seen = []
for f in sorted(os.listdir(d)):
    if f.startswith('chaos-') and f.endswith('.json') and not f.startswith('chaos-%s-' % a):
        try:
            m = json.load(open(os.path.join(d, f)))
        except (OSError, ValueError):
            continue
        if m.get('end') is None:
            seen.append({'marker': f, 'beat': m.get('beat')})
rec = {'attempt': int(a), 'slice': s, 'worker': w, 'start': now, 'beat': now, 'end': None, 'seen': seen}
def write():
    tmp = me + '.tmp'
    with open(tmp, 'w') as fh:
        fh.write(json.dumps(rec))
    os.replace(tmp, me)
write()
until = now + float(sys.argv[2])
while time.time() < until:
    time.sleep(0.2)
    rec['beat'] = time.time()
    write()
rec['end'] = rec['beat'] = time.time()
write()
"""


# argv: TOKEN SECONDS, as JOB_CODE's. A Ray driver: one task per host of the admitted slices, each
# running JOB_CODE in the Ray worker on that host (the host contract's TPU_NAME and TPU_WORKER_ID are
# the host's; TPUFLEET_CHECKPOINT_DIR and TPUFLEET_ATTEMPT come with the job's environment).
RAY_JOB_CODE = """\
import os, sys
import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from ray.util.tpu import SlicePlacementGroup
HOST_CODE = __HOST_CODE__
ray.init()
group = SlicePlacementGroup(
    topology=os.environ['TPUFLEET_TOPOLOGY'],
    accelerator_version=os.environ['TPUFLEET_ACCELERATOR_TYPE'].rsplit('-', 1)[0],
    num_slices=len(os.environ['TPUFLEET_SLICES'].split(',')),
)
ray.get(group.placement_group.ready())
@ray.remote(num_cpus=0)
def host(argv):
    sys.argv = ['chaos-host', *argv]
    exec(compile(HOST_CODE, 'chaos-host', 'exec'), {'__name__': '__main__'})
    return os.environ.get('TPU_NAME', '-') + '/' + os.environ.get('TPU_WORKER_ID', '-')
ran = ray.get([
    host.options(
        resources={'TPU': group.devices_per_host},
        scheduling_strategy=PlacementGroupSchedulingStrategy(
            group.placement_group, placement_group_bundle_index=i
        ),
    ).remote(sys.argv[1:])
    for i in range(group.num_bundles)
])
print('chaos: ran on', ' '.join(sorted(ran)), flush=True)
""".replace("__HOST_CODE__", repr(JOB_CODE))


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


@dataclass(frozen=True)
class PlannedJob:
    index: int
    at: float  # seconds after the start of the fault window
    accelerator_type: str
    num_slices: int
    tenant: str
    priority: int
    seconds: float
    kind: str = "spmd"  # or "ray"

    @property
    def name(self) -> str:
        return f"chaos-{self.index}"


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
    jobs = [replace(j, kind="ray") if kinds.random() < cfg.ray_jobs else j for j in jobs]
    return sorted(jobs, key=lambda j: (j.at, j.index))


def plan_faults(cfg: ChaosConfig, rng: random.Random) -> list[Event]:
    """Seeded fault times in [10 %, 85 %] of the window: one every ~15 s, at least one of each kind."""
    window = cfg.minutes * 60
    count = max(len(FAULT_KINDS), round(window / 15))
    kinds = list(FAULT_KINDS)
    rng.shuffle(kinds)
    kinds += [rng.choice(FAULT_KINDS) for _ in range(count - len(kinds))]
    times = sorted(rng.uniform(0.1 * window, 0.85 * window) for _ in range(count))
    events = [Event(round(at, 3), i, kind) for i, (at, kind) in enumerate(zip(times, kinds, strict=True))]
    # Once, in the middle of the window (its own stream, so the other faults stay as they were).
    head_at = random.Random(cfg.seed + 2).uniform(0.3 * window, 0.6 * window)
    return sorted([*events, Event(round(head_at, 3), count, HEAD_KILL)])


# -- what the markers say -----------------------------------------------------------------------


def read_markers(job_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """Each attempt's host markers in ``job_dir`` (a marker being rewritten is skipped)."""
    by_attempt: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(job_dir.glob("chaos-*.json")):
        try:
            m = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        by_attempt.setdefault(int(m["attempt"]), []).append(m)
    return by_attempt


def overlaps(by_attempt: dict[int, list[dict[str, Any]]]) -> list[tuple[int, int]]:
    """Pairs ``(earlier, later)`` of attempts that ran at the same time: the later one's first host
    started before the earlier one's last sign of life (its last heartbeat or its end)."""
    spans = {
        a: (
            min(float(m["start"]) for m in ms),
            max(float(m.get("end") or m.get("beat") or m["start"]) for m in ms),
        )
        for a, ms in by_attempt.items()
        if ms
    }
    found = []
    for a in sorted(spans):
        for b in sorted(spans):
            if a < b and spans[b][0] < spans[a][1]:
                found.append((a, b))
    return found


def double_runs(job: dict[str, Any], by_attempt: dict[int, list[dict[str, Any]]]) -> list[str]:
    """Why ``job`` ran twice: overlapping attempts (markers) or a second successful attempt (store)."""
    why = [f"attempts {a} and {b} ran at the same time" for a, b in overlaps(by_attempt)]
    ok = [a["attempt"] for a in job.get("attempts") or () if a.get("state") == "SUCCEEDED"]
    if len(ok) > 1:
        why.append(f"attempts {', '.join(map(str, ok))} all succeeded")
    return why


def procs_with(token: str) -> list[int]:
    """Host pids of live processes whose command line holds ``token`` (not bubblewrap's own: a
    jailed job has its own pid namespace, so it is found from this host's /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if token.encode() not in (entry / "cmdline").read_bytes():
                continue
            if os.path.basename(os.readlink(entry / "exe")) == "bwrap":
                continue
            stat = (entry / "stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":  # a zombie is dead
                continue
        except OSError:
            continue
        found.append(int(entry.name))
    return found


def _free_port() -> int:
    """The soak's own control plane listens here across every restart it makes, for minutes: a
    port below the ephemeral range, which nothing else on the machine is given meanwhile (with a
    ``bind(0)`` port, another control plane took it once, and the soak talked to that one)."""
    from tpufleet.emulator import procs

    return procs.free_port()


# -- the soak -------------------------------------------------------------------------------------


class Soak:
    """One run; :meth:`run` returns the result object ``tpufleet chaos --json`` prints."""

    def __init__(self, cfg: ChaosConfig, say: Callable[[str], None] = lambda _m: None) -> None:
        if cfg.jobs < 1:
            raise SpecError(f"--jobs must be >= 1, got {cfg.jobs}")
        if cfg.minutes <= 0:
            raise SpecError(f"--minutes must be > 0, got {cfg.minutes:g}")
        self.cfg = cfg
        self.say = say
        self.slices = parse_slices(cfg.slices)  # a bad spec fails here, before anything starts
        rng = random.Random(cfg.seed)
        self.jobs = plan_jobs(cfg, rng)
        self.fault_plan = plan_faults(cfg, rng)
        self.rng = random.Random(cfg.seed + 1)  # targets and delays, drawn as faults happen
        self.token = f"chaos-{uuid.uuid4().hex[:12]}"
        self._tmp = cfg.state_dir is None
        self.dir = Path(cfg.state_dir or tempfile.mkdtemp(prefix="tpufleet-chaos-"))
        self.cp_dir = cfg.server_state_dir or self.dir / "cp"
        self.port = _free_port()
        self.url = (cfg.server or f"http://127.0.0.1:{self.port}").rstrip("/")
        self.fleet: Any = None
        self.server: subprocess.Popen[bytes] | None = None
        self._external: ExternalServer | None = None  # cfg.server: how to start it again once killed
        self._external_up = True  # cfg.server: not killed by us, or started again since
        self._server_lock = threading.Lock()
        self._server_starts = 0
        self.faults: Counter[str] = Counter()
        self.fault_log: list[dict[str, Any]] = []
        self.fault_errors: list[str] = []
        self._events: list[Event] = []
        self._seq = len(self.fault_plan)
        # planned damage not yet done or skipped: the window lasts until it is through (a fault
        # that came due while the fault thread was busy, e.g. restarting the fleet, is done late)
        self._damage_left = sum(1 for e in self.fault_plan if e.kind in DAMAGE)
        self._noticed: set[str] = set()  # slices under a preemption notice, not yet reaped
        self._head_down = False  # between a Ray head kill and the fleet's restart
        self._stop_faults = threading.Event()
        self._t0 = 0.0

    # -- processes ------------------------------------------------------------------------------

    def _start_fleet(self) -> None:
        from tpufleet.emulator import EmulatedFleet

        if self.cfg.fleet_dir is not None:
            self.fleet = EmulatedFleet.attach(self.cfg.fleet_dir)
            self.say(f"soaking the emulated fleet in {self.cfg.fleet_dir} (Ray at {self.fleet.ray_address})")
            return
        self.say(f"starting an emulated fleet {self.cfg.slices} in {self.dir / 'fleet'}")
        self.fleet = EmulatedFleet(
            self.cfg.slices, cpus_per_host=self.cfg.cpus_per_host, state_dir=self.dir / "fleet"
        ).up()

    def _start_server(self) -> None:
        if self.cfg.server is not None:
            self._restart_external()
            return
        with self._server_lock:
            self._server_starts += 1
            env = {
                **os.environ,
                **NO_CLOUD,
                **self.fleet.client_env(),
                "TPUFLEET_CONFIG": str(self.dir / "cli-context.yaml"),  # never the user's context
            }
            cmd = [sys.executable, "-m", "tpufleet", "serve", "--ray-address", self.fleet.ray_address]
            cmd += ["--state-dir", str(self.cp_dir), "--port", str(self.port), "--start-timeout", "120"]
            if any(j.kind == "ray" for j in self.jobs):
                cmd.append("--allow-ray-jobs")
            with open(self.dir / f"serve-{self._server_starts}.log", "wb") as log:
                self.server = subprocess.Popen(
                    cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
        self._await_server(self.server)

    def _await_server(self, proc: subprocess.Popen[bytes] | None, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc is not None and proc.poll() is not None:
                raise TpufleetError(
                    f"tpufleet serve exited {proc.returncode}; see {self.dir}/serve-{self._server_starts}.log"
                )
            if self._answers(timeout_s=1.0):
                return
            if time.monotonic() > deadline:
                raise TpufleetError(f"tpufleet serve did not answer within {timeout_s:.0f}s")
            time.sleep(0.2)

    def _restart_external(self) -> None:
        """Start the control plane someone else ran again, as it ran, unless it answers: after
        ``_kill_server`` ended it, or when it died on its own since (a fresh start that failed)."""
        ext = self._external
        if ext is None or self._answers(timeout_s=2.0):  # never killed by us, or up
            self._external_up = True
            return
        with self._server_lock:
            self._server_starts += 1
            with open(self.dir / f"serve-{self._server_starts}.log", "wb") as log:
                self.server = subprocess.Popen(
                    ext.argv,
                    env=ext.env,
                    cwd=ext.cwd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        self._await_server(self.server)
        self._external_up = True

    def _answers(self, timeout_s: float) -> bool:
        """Whether the control plane's /healthz says 200 within ``timeout_s``."""
        import httpx

        try:
            return httpx.get(f"{self.url}/healthz", timeout=timeout_s).status_code == 200
        except httpx.TransportError:
            return False

    def _kill_server(self, sig: int) -> None:
        if self.cfg.server is not None:
            self._kill_external(sig)
            return
        with self._server_lock:
            proc, self.server = self.server, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)  # its own group (start_new_session): the server and its children
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def _kill_external(self, sig: int) -> None:
        """SIGKILL the control plane someone else started (found by the port it listens on) and
        every process under it, keeping what it takes to start it again."""
        if sig != signal.SIGKILL:
            return  # the end of the soak: someone else's control plane stays up
        with self._server_lock:
            self.server = None
            ext = self._external = ExternalServer.find(self.url)  # as it runs now (a restart runs the same)
            self._external_up = False
            ext.kill()

    # -- faults ---------------------------------------------------------------------------------

    def _now(self) -> float:
        return time.monotonic() - self._t0

    def _push(self, delay: float, kind: str, target: str | None = None) -> None:
        self._seq += 1
        heapq.heappush(self._events, Event(round(self._now() + delay, 3), self._seq, kind, target))

    def _whole_slices(self) -> list[str]:
        down = self.fleet.down_hosts()
        return sorted(n for n in self.fleet.slice_names if n not in down and n not in self._noticed)

    def _fault(self, ev: Event) -> None:
        """Do one event; new events (restores, a restart) go on the heap."""
        from tpufleet.emulator import spot

        what: str | None = ev.target
        if self._head_down and ev.kind in (*DAMAGE, "control_plane_restart", "restore", "reap"):
            if ev.kind in DAMAGE:  # nothing left to break until the fleet is back
                self.faults["skipped"] += 1
            else:  # a server or hosts can only come back with the cluster
                self._push(5.0, ev.kind, ev.target)
            return
        if ev.kind in ("kill_host", "preempt", "preempt_notice"):
            whole = self._whole_slices()
            if not whole:
                self.faults["skipped"] += 1
                return
            what = self.rng.choice(whole)
            if ev.kind == "kill_host":
                hosts = catalog.slice_type(self._type_of(what)).hosts
                worker = self.rng.randrange(hosts)
                self.fleet.kill_host(what, worker, wait=False)
                what = f"{what}/{worker}"
                self._push(self.rng.uniform(3, 10), "restore", what.split("/")[0])
            elif ev.kind == "preempt":
                self.fleet.preempt(what, wait=False)
                self._push(self.rng.uniform(3, 10), "restore", what)
            else:
                notice = round(self.rng.uniform(3, 8), 1)
                spot.announce(self.fleet.state_dir, what, notice)
                self._noticed.add(what)
                self._push(notice, "reap", what)
                what = f"{what} (notice {notice:g}s)"
        elif ev.kind == "reap":
            assert ev.target is not None
            spot.reap(self.fleet.state_dir, only=ev.target)
            self._noticed.discard(ev.target)
            self._push(self.rng.uniform(3, 10), "restore", ev.target)
        elif ev.kind == "restore":
            assert ev.target is not None
            if ev.target not in self.fleet.down_hosts():
                return
            self.fleet.restore(ev.target)
        elif ev.kind == "control_plane_kill":
            if (self.server is None and self.cfg.server is None) or not self._external_up:
                self.faults["skipped"] += 1
                return
            self._kill_server(signal.SIGKILL)
            self._push(self.rng.uniform(1, 5), "control_plane_restart")
        elif ev.kind == "control_plane_restart":
            self._start_server()
        elif ev.kind == HEAD_KILL:
            # The control plane notices on its own (raywatch) and starts afresh once Ray answers.
            self.fleet.kill_head()
            self._head_down = True
            self._push(self.rng.uniform(3, 8), "ray_head_restart")
        elif ev.kind == "ray_head_restart":
            try:
                self.fleet.restart()
            except Exception:
                self._push(5.0, "ray_head_restart")  # the fleet must come back: try again
                raise
            self._head_down = False
            self._noticed.clear()  # every host is new: earlier notices died with the old ones
        self.faults[ev.kind] += 1
        self.fault_log.append({"at": round(self._now(), 1), "kind": ev.kind, "target": what})
        self.say(f"[{self._now():6.1f}s] {ev.kind} {what or ''}".rstrip())

    def _type_of(self, slice_name: str) -> str:
        for t, _ in self.slices:
            if slice_name.startswith(f"tpu-{t}-"):
                return t
        raise KeyError(slice_name)

    def _fault_loop(self) -> None:
        while True:
            if not self._events:
                return
            ev = self._events[0]
            if self._stop_faults.is_set() and ev.kind in DAMAGE:
                heapq.heappop(self._events)  # no new damage once the soak stopped waiting for it
                self._damage_left -= 1
                continue
            wait = ev.at - self._now()
            if wait > 0:
                time.sleep(min(wait, 0.2))
                continue
            heapq.heappop(self._events)
            try:
                self._fault(ev)
            except Exception as err:  # a fault that could not be done is reported
                self.fault_errors.append(f"{ev.kind} {ev.target or ''}: {type(err).__name__}: {err}")
                self.say(f"[{self._now():6.1f}s] {ev.kind} failed: {err}")
            finally:
                if ev.kind in DAMAGE:
                    self._damage_left -= 1

    # -- jobs -----------------------------------------------------------------------------------

    def _admin(self) -> Any:
        from tpufleet.api.auth import ADMIN_TOKEN_FILE
        from tpufleet.client.http import Client

        token = self.cfg.token or (self.cp_dir / ADMIN_TOKEN_FILE).read_text().strip()
        return Client(self.url, token, timeout_s=10)

    def _submit(self, admin: Any, job: PlannedJob, uncertain: bool) -> str | None:
        """The job's id once submitted (or found, after a submit whose answer was lost)."""
        if uncertain:
            for j in admin.jobs():
                if j["name"] == job.name:
                    return str(j["id"])
        code = RAY_JOB_CODE if job.kind == "ray" else JOB_CODE
        body = admin.submit(
            [sys.executable, "-c", code, self.token, str(job.seconds)],
            job.accelerator_type,
            kind=job.kind,
            num_slices=job.num_slices,
            priority=job.priority,
            max_retries=20,
            name=job.name,
            tenant=job.tenant,
        )
        return str(body["id"])

    def run(self) -> dict[str, Any]:
        started = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_fleet()
            if self.cfg.server is None:
                self._start_server()
            else:
                self._await_server(None)
            return self._soak(started)
        finally:
            self._stop_faults.set()
            if self.cfg.server is not None:
                self._restart_external()  # leave it as it was found: running
            self._kill_server(signal.SIGTERM)
            if self.fleet is not None and self.cfg.fleet_dir is None:
                self.fleet.down()
            if self._tmp:
                import shutil

                shutil.rmtree(self.dir, ignore_errors=True)

    def _soak(self, started: float) -> dict[str, Any]:
        from tpufleet.errors import ClusterError, ConflictError

        admin = self._admin()
        generations = sorted({t.rsplit("-", 1)[0] for t, _ in self.slices})
        for tenant, chips in TENANTS.items():
            try:
                admin.create_tenant(tenant, {g: chips for g in generations})
            except ConflictError:  # a control plane soaked before: its tenants are still there
                admin.update_tenant(tenant, quota={g: chips for g in generations})
        self._t0 = time.monotonic()
        self._events = list(self.fault_plan)
        heapq.heapify(self._events)
        faults = threading.Thread(target=self._fault_loop, name="chaos-faults", daemon=True)
        faults.start()
        window = self.cfg.minutes * 60
        ids: dict[int, str] = {}
        rejected: dict[int, str] = {}
        uncertain: set[int] = set()
        pending = list(self.jobs)

        def more() -> bool:
            """Within the window; after it, while jobs wait to be submitted or planned damage to be
            done (a soak slowed down by its machine does all it planned), for SUBMIT_GRACE_S."""
            now = self._now()
            return now < window or (
                now < window + SUBMIT_GRACE_S and (bool(pending) or self._damage_left > 0)
            )

        while more():
            while pending and pending[0].at <= self._now():
                job = pending[0]
                try:
                    got = self._submit(admin, job, job.index in uncertain)
                except ClusterError:  # the server is down (or died mid-request): try again later
                    uncertain.add(job.index)
                    break
                except TpufleetError as err:
                    rejected[job.index] = f"rejected: {err}"
                    got = None
                if got is not None:
                    ids[job.index] = got
                    self.say(
                        f"[{self._now():6.1f}s] submitted {job.name} {job.num_slices}x{job.accelerator_type}"
                        + (" (Ray job)" if job.kind == "ray" else "")
                    )
                pending.pop(0)
            time.sleep(0.2)
        # the window is over: no new faults; bring every host and the control plane back
        self._stop_faults.set()
        faults.join(timeout=300)
        for name in sorted(self.fleet.down_hosts()):
            try:
                self.fleet.restore(name)
            except TpufleetError as err:
                self.fault_errors.append(f"final restore {name}: {err}")
        if self.server is None or self.server.poll() is not None:
            self._start_server()
        self.say(f"[{self._now():6.1f}s] fault window over; waiting for every job to end")
        views = self._await_end(admin, ids)
        result = self._judge(admin, ids, rejected, views)
        result["seconds"] = round(time.monotonic() - started, 1)
        admin.close()
        return result

    def _await_end(self, admin: Any, ids: dict[int, str]) -> dict[str, dict[str, Any]]:
        from tpufleet.errors import ClusterError

        deadline = time.monotonic() + self.cfg.drain_timeout_s
        views: dict[str, dict[str, Any]] = {}
        while True:
            try:
                views = {str(j["id"]): j for j in admin.jobs()}
            except ClusterError:
                views = views or {}
            if all(views.get(i, {}).get("state") in TERMINAL for i in ids.values()):
                break
            if time.monotonic() > deadline:
                break
            time.sleep(1.0)
        return views

    def _judge(
        self, admin: Any, ids: dict[int, str], rejected: dict[int, str], views: dict[str, dict[str, Any]]
    ) -> dict[str, Any]:
        from tpufleet.errors import NotFoundError

        succeeded, failed, lost, doubles = [], [], [], []
        ray_succeeded = 0
        for job in self.jobs:
            if job.index in rejected:
                failed.append({"name": job.name, "id": None, "reason": rejected[job.index]})
                continue
            jid = ids.get(job.index)
            if jid is None:
                lost.append({"name": job.name, "id": None, "why": "never submitted (server unreachable)"})
                continue
            try:
                full = admin.job(jid)
            except NotFoundError:
                lost.append({"name": job.name, "id": jid, "why": "the store no longer knows it"})
                continue
            state = full["state"]
            if state not in TERMINAL:
                lost.append({"name": job.name, "id": jid, "why": f"never ended (still {state})"})
            elif state == "SUCCEEDED":
                succeeded.append(jid)
                ray_succeeded += job.kind == "ray"
            else:
                reason = full.get("reason") or full.get("reason_code") or state
                failed.append(
                    {"name": job.name, "id": jid, "state": state, "reason": reason, "kind": job.kind}
                )
            markers = read_markers(self.cp_dir / "checkpoints" / job.tenant / jid)
            why = double_runs(full, markers)
            if why:
                doubles.append({"name": job.name, "id": jid, "why": why})
        pgs = self._leaked_placement_groups(admin)
        procs = self._leaked_processes()
        return {
            "seed": self.cfg.seed,
            "slices": self.cfg.slices,
            "minutes": self.cfg.minutes,
            "jobs": len(self.jobs),
            "succeeded": len(succeeded),
            "ray_jobs": sum(j.kind == "ray" for j in self.jobs),
            "ray_succeeded": ray_succeeded,
            "failed": failed,
            "lost": lost,
            "double_runs": doubles,
            "leaked_placement_groups": pgs,
            "leaked_processes": procs,
            "faults": dict(sorted(self.faults.items())),
            "fault_errors": self.fault_errors,
            "fault_log": self.fault_log,
            "control_plane_starts": self._server_starts,
            "ray_reconnects": self._reconnects(),
        }

    def _reconnects(self) -> int:
        """How often the control plane started afresh on its own after losing the Ray head (its logs)."""
        return sum(
            log.read_text(errors="replace").count("was lost: waiting for Ray to answer again")
            for log in sorted(self.dir.glob("serve-*.log"))
        )

    def _leaked_placement_groups(self, admin: Any, settle_s: float = 60.0) -> list[dict[str, Any]]:
        """Placement groups Ray holds that are not the warm pool's of a FREE slice (slice and head
        groups, one each), once the pool settled (or ``settle_s`` passed)."""
        import ray
        from ray.util.placement_group import placement_group_table

        from tpufleet.control.ray.warmpool import head_pg_name, pg_name

        self.fleet.authenticate()
        ray.init(address=self.fleet.ray_address, logging_level=logging.ERROR, log_to_driver=False)
        try:
            deadline = time.monotonic() + settle_s
            while True:
                free = [s["name"] for s in admin.slices() if s["state"] == "FREE"]
                allowed = Counter({pg_name(n): 1 for n in free} | {head_pg_name(n): 1 for n in free})
                leaked = []
                for pg_id, row in sorted(placement_group_table().items()):
                    if row.get("state") == "REMOVED":
                        continue
                    name = row.get("name") or ""
                    if allowed[name] > 0:
                        allowed[name] -= 1
                        continue
                    leaked.append({"id": pg_id, "name": name, "state": row.get("state")})
                if not leaked or time.monotonic() > deadline:
                    return leaked
                time.sleep(2.0)
        finally:
            ray.shutdown()

    def _leaked_processes(self, settle_s: float = 15.0) -> list[int]:
        """Job processes still alive after every job ended (given ``settle_s`` to go)."""
        deadline = time.monotonic() + settle_s
        while True:
            left = procs_with(self.token)
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.5)


@dataclass
class ExternalServer:
    """A control plane this soak did not start: its process tree and how to start it again."""

    pids: list[int]
    argv: list[str]
    env: dict[str, str]
    cwd: str

    @classmethod
    def find(cls, url: str) -> ExternalServer:
        """The process listening on ``url``'s port on this machine (a TpufleetError if there is none)."""
        from urllib.parse import urlsplit

        import psutil

        parts = urlsplit(url)
        if parts.hostname not in ("127.0.0.1", "localhost", "::1") or parts.port is None:
            raise TpufleetError(f"--server {url}: the soak kills and restarts the control plane, so it "
                                "must run on this machine (http://127.0.0.1:PORT)")  # fmt: skip
        for conn in psutil.net_connections("tcp"):
            if (
                conn.status == psutil.CONN_LISTEN
                and conn.laddr
                and conn.laddr.port == parts.port
                and conn.pid
            ):
                proc = psutil.Process(conn.pid)
                tree = [proc.pid, *(c.pid for c in proc.children(recursive=True))]
                env = {
                    k: v for k, v in proc.environ().items() if k != AWAIT_ENV
                }  # set by an exec, not by its owner
                return cls(tree, proc.cmdline(), env, proc.cwd())
        raise TpufleetError(f"no process of this user listens on port {parts.port} ({url})")

    def kill(self, timeout_s: float = 30.0) -> None:
        """SIGKILL every process of the tree; return once each is gone (or a zombie its parent reaps)."""
        import psutil

        procs = []
        for pid in self.pids:
            try:
                procs.append(psutil.Process(pid))
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, psutil.NoSuchProcess):
                continue
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            while time.monotonic() < deadline:
                try:
                    if proc.status() == psutil.STATUS_ZOMBIE:
                        break
                except psutil.NoSuchProcess:
                    break
                time.sleep(0.05)


def passed(result: dict[str, Any]) -> bool:
    """The soak's verdict: nothing lost, nothing ran twice, nothing leaked."""
    return not (
        result["lost"]
        or result["double_runs"]
        or result["leaked_placement_groups"]
        or result["leaked_processes"]
    )
