"""``MemoryCluster``: the in-memory :class:`~tpufleet.control.cluster.protocol.ClusterClient`.

One cluster for two users: the tests of the service, the store, the API and the CLI drive it, and
``tpufleet serve --sandbox v4-16:64,v4-32:16`` runs the whole control plane over it instead of Ray
(:meth:`MemoryCluster.sandbox`), so platform engineers can try quotas and priorities, and load tests
can push the loop, before touching real slices. A real module, not a mock: nothing is executed, but
it behaves as the Ray client does where the two could differ. Every host of an attempt gets the same
host contract (``tpufleet.contract``); a Ray job is one driver, shown as every host of the slices it
holds; a launched attempt holds its slices until ``stop`` (as a placement group does); a second
``launch`` of a live attempt changes nothing; ``stop`` ends live hosts with SIGTERM's exit code and is
idempotent; slices come and go as a provider makes and deletes them (``add_slices``,
``remove_slices``: hosts still running on a removed slice are LOST).

What an attempt's hosts do is chosen per attempt by ``script`` (``AttemptSpec -> plan or None``):

- a :class:`Script`, counted in polls of the attempt (RUNNING after ``run_after`` polls, EXITED after
  ``exit_after``): tests, which never wait on a clock;
- a :class:`Timed` run on the cluster's ``clock``: every host runs for its seconds, then exits with
  its code, writing a line when it starts and one when it ends (the sandbox: each job runs for
  ``--job-seconds``, or what ``TPUFLEET_SANDBOX_SECONDS`` / ``TPUFLEET_SANDBOX_EXIT`` in its env say);
- nothing: the hosts stay where they are until a test moves them (``start``, ``exit``, ``write``,
  ``kill_host``).

For tests, ``fault`` makes the next calls of one operation fail or block, as a broken cluster does,
and ``launches``, ``stops`` and ``removals`` record what was asked. Job files are sizes in memory
(``write_files``): every poll of an SPMD attempt reports its tenant's total as the hosts'
measurement, and an attempt whose tenant is over the spec's checkpoint quota is ended on every host
with the runner's reason, as on real hosts; a sandbox keeps no files (``keeps_files=False``: nothing
ran, so it measures nothing). Logs are handed out in chunks of at most ``log_chunk`` characters, as
the runner does.

It is :class:`~tpufleet.control.cluster.protocol.Notifying`: the loop it serves is woken when a
Timed attempt's hosts exit (``_Alarm``), so a sandbox job's end is acted on at once, not at the
loop's next cycle.

Every call is O(hosts of the attempt) (each slice's holder is kept), so a sandbox of thousands of
slices and 100,000 finished attempts stays fast. Thread-safe. Imports no Ray. It keeps no warm pool
(it is not a :class:`~tpufleet.control.cluster.protocol.WarmPool`).
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, MutableSequence, Sequence
from dataclasses import dataclass, field, replace

from tpufleet import catalog, contract
from tpufleet.catalog import SliceType
from tpufleet.control.cluster.protocol import (
    AttemptSpec,
    AttemptStatus,
    DiskUsage,
    FilesRemoved,
    HostInfo,
    HostState,
    HostStatus,
    LogChunk,
    SliceInfo,
)
from tpufleet.errors import ClusterError, NotFoundError, SpecError
from tpufleet.host.jobfiles import quota_problem
from tpufleet.runtime import StepProgress
from tpufleet.scheduler.lifecycle import JobKind

SIGTERM_EXIT = -15  # what a process ended by stop() reports, as subprocess does for SIGTERM
SECONDS_VAR = "TPUFLEET_SANDBOX_SECONDS"  # in a job's env: how long its hosts run in a sandbox
EXIT_VAR = "TPUFLEET_SANDBOX_EXIT"  # in a job's env: the exit code of its hosts in a sandbox
MAX_HOSTS = 100_000  # a fleet's hosts, all slices together
SANDBOX_HISTORY = 10_000  # stopped attempts a sandbox keeps (MemoryCluster.history)
BAD_SETTING_EXIT = 2  # what a sandbox host exits with when the job's sandbox variables are malformed


@dataclass(frozen=True)
class Script:
    """What every host of an attempt does, counted in polls of that attempt.

    ``output`` is written to each host's log when it starts running, formatted with the host's
    environment (``"step 1 on {TPU_NAME}/{TPU_WORKER_ID}\\n"``). ``exit_codes`` overrides
    ``exit_code`` per (slice index, worker id). ``exit_after=None`` runs until stopped.
    """

    run_after: int = 1
    exit_after: int | None = 2
    exit_code: int = 0
    exit_codes: Mapping[tuple[int, int], int] = field(default_factory=dict)
    output: str = ""


@dataclass(frozen=True)
class Timed:
    """Every host of an attempt runs from its launch for ``seconds`` of the cluster's clock, then
    exits with ``exit_code``. ``problem``, when given, is what each host writes instead of starting:
    it exits at once (a job whose sandbox settings are malformed)."""

    seconds: float
    exit_code: int = 0
    problem: str = ""


Plan = Script | Timed


class _Alarm:
    """Calls ``ring`` once each time some of the delays it was given (:meth:`after`) have passed
    (times due together ring once; a delay of 0 rings at once, in the caller's thread), from a
    daemon thread that runs while one is pending and ``LINGER_S`` after, not for ever and not one
    per delay (a sandbox ends thousands of jobs a second)."""

    LINGER_S = 1.0

    def __init__(self, ring: Callable[[], None]) -> None:
        self._ring = ring
        self._due: list[float] = []  # a heap of time.monotonic() deadlines
        self._cond = threading.Condition()
        self._running = False

    @property
    def pending(self) -> bool:
        """Whether its thread is still there (something is due, or was within ``LINGER_S``)."""
        with self._cond:
            return self._running

    def after(self, delay_s: float) -> None:
        if delay_s <= 0:
            self._ring()
            return
        with self._cond:
            heapq.heappush(self._due, time.monotonic() + delay_s)
            if self._running:
                self._cond.notify()
                return
            self._running = True
        threading.Thread(target=self._run, name="tpufleet-sandbox-alarm", daemon=True).start()

    def _run(self) -> None:
        idle_since: float | None = None
        while True:
            with self._cond:
                now = time.monotonic()
                if not self._due:
                    idle_since = now if idle_since is None else idle_since
                    if now - idle_since >= self.LINGER_S:
                        self._running = False
                        return
                    self._cond.wait(self.LINGER_S - (now - idle_since))
                    continue
                idle_since = None
                if self._due[0] > now:
                    self._cond.wait(self._due[0] - now)
                    continue
                while self._due and self._due[0] <= now:
                    heapq.heappop(self._due)
            self._ring()


def sandbox_plan(job_seconds: float) -> Callable[[AttemptSpec], Timed]:
    """The sandbox's hosts: each attempt runs for ``job_seconds`` and exits 0, unless the job's env
    says otherwise (``TPUFLEET_SANDBOX_SECONDS``, seconds >= 0; ``TPUFLEET_SANDBOX_EXIT``, an exit
    code); a malformed setting makes every host exit at once with code 2 and say why."""
    if not (math.isfinite(job_seconds) and job_seconds >= 0):
        raise SpecError(f"must be a number of seconds >= 0, got {job_seconds!r}", field="--job-seconds")

    def plan(spec: AttemptSpec) -> Timed:
        seconds, code = job_seconds, 0
        try:
            if SECONDS_VAR in spec.env:
                seconds = float(spec.env[SECONDS_VAR])
                if not (math.isfinite(seconds) and seconds >= 0):
                    raise ValueError(spec.env[SECONDS_VAR])
            if EXIT_VAR in spec.env:
                code = int(spec.env[EXIT_VAR])
        except ValueError:
            why = f"sandbox: {SECONDS_VAR} must be seconds >= 0 and {EXIT_VAR} a whole number\n"
            return Timed(0.0, BAD_SETTING_EXIT, why)
        return Timed(seconds, code)

    return plan


def fleet_slices(spec: str) -> list[SliceInfo]:
    """Intact slices from ``"v4-16:64,v4-32:16"``, named ``tpu-v4-16-0``, ``tpu-v4-16-1``, ...
    (a type given twice continues its numbering). SpecError for an unknown type, a bad count or
    more than ``MAX_HOSTS`` hosts."""
    fleet: list[SliceInfo] = []
    numbered: dict[str, int] = {}
    hosts = 0
    for st, count in catalog.parse_slice_list(spec):
        hosts += st.hosts * count
        if hosts > MAX_HOSTS:
            raise SpecError(f"{spec!r} has over {MAX_HOSTS:,} hosts; give fewer slices", field="--sandbox")
        for _ in range(count):
            index = numbered.get(st.accelerator_type, 0)
            numbered[st.accelerator_type] = index + 1
            fleet.append(make_slice(f"tpu-{st.accelerator_type}-{index}", st, subnet=len(fleet)))
    return fleet


def make_slice(name: str, st: SliceType, subnet: int = 0) -> SliceInfo:
    """An intact slice of type ``st`` whose hosts are 10.0.<subnet>.<worker+1>."""
    hosts = tuple(HostInfo(w, f"node-{name}-{w}", f"10.0.{subnet}.{w + 1}", True) for w in range(st.hosts))
    return SliceInfo(name, st.accelerator_type, str(st.topology), st.hosts, hosts)


@dataclass
class MemoryProcess:
    slice: str
    slice_index: int
    worker_id: int
    env: dict[str, str]
    state: HostState = HostState.STARTING
    exit_code: int | None = None
    log: str = ""
    detail: str | None = None  # why it ended without exiting (its tenant's quota, its slice removed)
    writes_log: bool = True  # a Ray job's driver output is the first host's log; the others stay empty

    @property
    def alive(self) -> bool:
        return self.state in (HostState.STARTING, HostState.RUNNING)


@dataclass
class MemoryAttempt:
    spec: AttemptSpec
    processes: list[MemoryProcess]
    plan: Plan | None
    ends_at: float = math.inf  # a Timed plan: when its hosts exit, on the cluster's clock
    polls: int = 0
    stopped: bool = False
    progress: StepProgress | None = None  # what process 0 reported (``report_step``)


class FakeClock:
    """A clock for tests: ``clock()`` returns ``now``; ``advance`` moves it."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


class MemoryCluster:
    def __init__(
        self,
        slices: list[SliceInfo] | None = None,
        script: Callable[[AttemptSpec], Plan | None] | None = None,
        *,
        clock: Callable[[], float] = time.time,
        keeps_files: bool = True,
        history: int | None = None,
    ) -> None:
        self._slices: dict[str, SliceInfo] = {s.name: s for s in slices or ()}
        self._script = script
        self._attempts: dict[tuple[str, int], MemoryAttempt] = {}
        self._holder: dict[str, tuple[str, int]] = {}  # slice -> the live attempt holding it
        self._lock = threading.RLock()
        # ``history``: how many stopped attempts (and records of launches, stops and removals) are
        # kept; None keeps all (tests read them). A long-running sandbox must not grow for ever.
        self.history = history
        self._stopped: deque[tuple[str, int]] = deque()
        self.launches: MutableSequence[AttemptSpec] = deque(maxlen=history) if history else []
        self.stops: MutableSequence[tuple[str, int, float]] = deque(maxlen=history) if history else []
        self.log_chunk = 1 << 20
        self._faults: dict[tuple[str, str | None], BaseException | Callable[[], object]] = {}
        self.keeps_files = keeps_files
        self.files: dict[tuple[str, str], int] = {}  # (tenant, job) -> bytes of its checkpoint dir
        self.removals: MutableSequence[tuple[str, str, tuple[str, ...]]] = (
            deque(maxlen=history) if history else []
        )
        self.clock = clock  # the hosts' clock: when a Timed run ends, when the hosts measure
        # attempts this cluster reports as cut short by tpufleet (``AttemptStatus.interrupted``), as
        # the Ray client does for a trainer placed on a slice that came back during its window
        self.interruptions: dict[tuple[str, int], str] = {}
        self._alarm: _Alarm | None = None  # notify(): the loop, woken when Timed hosts exit

    @classmethod
    def of(cls, spec: str, script: Callable[[AttemptSpec], Plan | None] | None = None) -> MemoryCluster:
        """A fleet from ``"v4-16:2,v6e-16"`` (see :func:`fleet_slices`), for tests."""
        return cls(fleet_slices(spec), script)

    @classmethod
    def sandbox(
        cls,
        slices: str | list[SliceInfo],
        *,
        job_seconds: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        history: int = SANDBOX_HISTORY,
    ) -> MemoryCluster:
        """What ``serve --sandbox`` runs: a fleet (``"v4-16:64,v4-32:16"`` or slices) whose jobs
        each run for ``job_seconds`` of ``clock`` (:func:`sandbox_plan`), with no job files,
        keeping the last ``history`` stopped attempts (their output is stored by then)."""
        fleet = fleet_slices(slices) if isinstance(slices, str) else slices
        return cls(fleet, sandbox_plan(job_seconds), clock=clock, keeps_files=False, history=history)

    def fault(
        self, op: str, what: BaseException | Callable[[], object] | None, job_id: str | None = None
    ) -> None:
        """From now on ``op`` ("inventory", "launch", "poll", "stop", "read_logs", "remove_job_files")
        raises ``what`` (an exception) or calls it first (e.g. ``event.wait``, to hang); only for
        ``job_id`` when given. ``None`` clears the fault."""
        if what is None:
            self._faults.pop((op, job_id), None)
        else:
            self._faults[(op, job_id)] = what

    def _check(self, op: str, job_id: str | None = None) -> None:
        if not self._faults:
            return
        what = self._faults.get((op, job_id)) or self._faults.get((op, None))
        if isinstance(what, BaseException):
            raise what
        if what is not None:
            what()

    # -- ClusterClient -------------------------------------------------------------------------
    def inventory(self) -> list[SliceInfo]:
        self._check("inventory")
        with self._lock:
            return list(self._slices.values())

    def adopt(self) -> list[tuple[str, int]]:
        return self.running_attempts()  # in memory: nothing outlives this process to take over

    def launch(self, spec: AttemptSpec) -> None:
        self._check("launch", spec.job_id)
        with self._lock:
            key = (spec.job_id, spec.attempt)
            if key in self._attempts and not self._attempts[key].stopped:
                return  # launching a running attempt again does nothing, as on Ray
            infos = [self._usable(name, spec.job_id) for name in spec.slices]
            layout = [(info.name, info.slice_type, [h.address or "" for h in info.hosts]) for info in infos]
            envs = iter(contract.attempt_envs(spec.job_id, spec.attempt, spec.checkpoint_dir, layout))
            procs: list[MemoryProcess] = []
            ray = spec.kind == JobKind.RAY
            driver = (
                contract.ray_driver_env(
                    spec.job_id, spec.attempt, spec.checkpoint_dir, [(i.name, i.slice_type) for i in infos]
                )
                if ray
                else {}
            )
            for index, info in enumerate(infos):
                for host in info.hosts:
                    contract_env, attempt_env = next(envs)
                    env = contract.process_env({}, dict(spec.env), contract_env, attempt_env)
                    if ray:  # one driver, shown as every host of the slices it holds
                        env = contract.process_env({}, dict(spec.env), {}, driver)
                    writes = not procs or not ray
                    procs.append(MemoryProcess(info.name, index, host.worker_id, env, writes_log=writes))
            plan = self._script(spec) if self._script else None
            att = MemoryAttempt(spec, procs, plan)
            if isinstance(plan, Timed):
                att.ends_at = self.clock() + plan.seconds
                if self._alarm is not None:
                    self._alarm.after(plan.seconds)
                for p in procs:
                    p.state = HostState.RUNNING
                    start = plan.problem or f"sandbox: {p.slice}/{p.worker_id} running {plan.seconds:g} s\n"
                    p.log += start if p.writes_log else ""
            self._attempts[key] = att
            for name in spec.slices:
                self._holder[name] = key
            self.launches.append(spec)

    def notify(self, wake: Callable[[], None]) -> None:
        """``Notifying``: ``wake`` is called when a Timed attempt's hosts have run their seconds
        (a clock other than the real one, a test's, gets an extra wake at worst: its poll decides).
        A launched attempt's hosts start at once here, so nothing wakes for a start."""
        self._alarm = _Alarm(wake)

    @property
    def alarm_pending(self) -> bool:
        """Whether this cluster keeps a thread to wake the loop at a Timed end still to come."""
        return self._alarm is not None and self._alarm.pending

    def _usable(self, name: str, job_id: str) -> SliceInfo:
        info = self._slices.get(name)
        if info is None:
            raise ClusterError(f"slice {name} is not in the cluster")
        if not info.intact:
            raise ClusterError(f"slice {name} is broken: {'; '.join(info.problems)}")
        holder = self._holder.get(name)
        if holder is not None and holder[0] != job_id:
            raise ClusterError(f"slice {name} is held by job {holder[0]}")
        return info

    def poll(self, job_id: str, attempt: int) -> AttemptStatus:
        self._check("poll", job_id)
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None:
                raise NotFoundError(f"attempt {attempt} of job {job_id} was never launched here")
            att.polls += 1
            if not att.stopped:
                self._advance(att)
            disk = self._measure(att)
            hosts = tuple(
                HostStatus(p.slice, p.worker_id, p.state, p.exit_code, p.detail) for p in att.processes
            )
            ray_running = att.spec.kind == JobKind.RAY and any(
                p.state is HostState.RUNNING for p in att.processes
            )
            placed = att.spec.slices if ray_running else ()
            why = self.interruptions.get((job_id, attempt))
            return AttemptStatus(
                job_id, attempt, hosts, progress=att.progress, placed=placed, disk=disk, interrupted=why
            )

    def _measure(self, att: MemoryAttempt) -> DiskUsage | None:
        """What the hosts of an SPMD attempt measure; over the quota they end their processes."""
        if att.spec.kind != JobKind.SPMD or not self.keeps_files:
            return None
        tenant = att.spec.tenant
        sizes = [n for (t, _job), n in self.files.items() if t == tenant]
        disk = DiskUsage(sum(sizes), len(sizes), True, self.clock())
        why = quota_problem(tenant, disk, att.spec.checkpoint_quota)
        for p in att.processes if why is not None and not att.stopped else ():
            if p.alive:
                p.state, p.exit_code, p.detail = HostState.EXITED, SIGTERM_EXIT, why
        return disk

    def _advance(self, att: MemoryAttempt) -> None:
        plan = att.plan
        if isinstance(plan, Timed):
            if self.clock() >= att.ends_at:
                self._end(att, plan.exit_code, f"sandbox: exit {plan.exit_code}\n")
            return
        if plan is None:
            return
        if att.polls >= plan.run_after:
            for p in att.processes:
                if p.state is HostState.STARTING:
                    p.state = HostState.RUNNING
                    p.log += plan.output.format_map(p.env) if p.writes_log else ""
        if plan.exit_after is not None and att.polls >= plan.exit_after:
            for p in att.processes:
                if p.state is HostState.RUNNING:
                    code = plan.exit_codes.get((p.slice_index, p.worker_id), plan.exit_code)
                    p.state, p.exit_code = HostState.EXITED, code

    @staticmethod
    def _end(att: MemoryAttempt, code: int, line: str) -> None:
        for p in att.processes:
            if p.alive:
                p.state, p.exit_code = HostState.EXITED, code
                p.log += line if p.writes_log else ""

    def stop(self, job_id: str, attempt: int, grace_s: float = 10.0) -> None:
        self._check("stop", job_id)
        with self._lock:
            self.stops.append((job_id, attempt, grace_s))
            att = self._attempts.get((job_id, attempt))
            if att is None or att.stopped:
                return
            if isinstance(att.plan, Timed):
                self._advance(att)  # it may have ended on its own before the stop
                self._end(att, SIGTERM_EXIT, "sandbox: stopped (SIGTERM)\n")
            else:
                self._end(att, SIGTERM_EXIT, "")
            att.stopped = True
            for name in att.spec.slices:
                if self._holder.get(name) == (job_id, attempt):
                    del self._holder[name]
            self._forget_beyond_history((job_id, attempt))

    def _forget_beyond_history(self, stopped: tuple[str, int]) -> None:
        """Keep the last ``history`` stopped attempts: the loop has read their last output and
        final state right after their stops, long before they are forgotten."""
        if self.history is None:
            return
        self._stopped.append(stopped)
        while len(self._stopped) > self.history:
            key = self._stopped.popleft()
            att = self._attempts.get(key)
            if att is not None and att.stopped:
                del self._attempts[key]
                self.interruptions.pop(key, None)

    def read_logs(self, job_id: str, attempt: int, slice_name: str, worker_id: int, offset: int) -> LogChunk:
        self._check("read_logs", job_id)
        with self._lock:
            proc = self._process(job_id, attempt, slice_name, worker_id)
            if proc is None:
                return LogChunk("", offset, complete=True)
            data = proc.log[offset : offset + self.log_chunk]
            end = offset + len(data)
            return LogChunk(data, end, complete=not proc.alive and end >= len(proc.log))

    def running_attempts(self) -> list[tuple[str, int]]:
        with self._lock:
            return [key for key, att in self._attempts.items() if not att.stopped]

    def remove_job_files(self, job_root: str, tenant: str, job_ids: Sequence[str]) -> FilesRemoved:
        self._check("remove_job_files")
        with self._lock:
            self.removals.append((job_root, tenant, tuple(job_ids)))
            if not self.keeps_files:  # nothing ran, so no job has files: each is removed with 0 bytes
                return FilesRemoved(dict.fromkeys(job_ids, 0))
            removed = {job: self.files.pop((tenant, job), 0) for job in job_ids}
            sizes = [n for (t, _job), n in self.files.items() if t == tenant]
            return FilesRemoved(removed, DiskUsage(sum(sizes), len(sizes), True, self.clock()))

    # -- slices coming and going (a provider: provision/memory.py) ------------------------------
    def add_slices(self, slices: list[SliceInfo]) -> None:
        """New slices join the fleet (a provider made them)."""
        with self._lock:
            for info in slices:
                self._slices[info.name] = info

    def remove_slices(self, names: list[str]) -> None:
        """Slices leave the fleet (deleted or preempted): hosts still running on them are lost."""
        with self._lock:
            for name in names:
                self._slices.pop(name, None)
                key = self._holder.get(name)
                att = self._attempts.get(key) if key else None
                for p in att.processes if att else ():
                    if p.slice == name and p.alive:
                        p.state, p.detail = HostState.LOST, "its slice was removed"
                        p.log += "sandbox: host lost (its slice was removed)\n" if p.writes_log else ""

    # -- what tests drive ----------------------------------------------------------------------
    def processes(self, job_id: str, attempt: int | None = None) -> list[MemoryProcess]:
        """The hosts' processes of an attempt (default: the job's latest), in slice/worker order."""
        with self._lock:
            att = self._latest(job_id, attempt)
            return list(att.processes) if att else []

    def host_envs(self, job_id: str, attempt: int) -> list[dict[str, str]]:
        """The environment each host of an attempt got, in slice then worker order."""
        return [dict(p.env) for p in self.processes(job_id, attempt)]

    def start(self, job_id: str, attempt: int | None = None) -> None:
        self._each(job_id, attempt, lambda p: p.state is HostState.STARTING, state=HostState.RUNNING)

    def exit(
        self,
        job_id: str,
        code: int = 0,
        *,
        slice: str | None = None,
        worker: int | None = None,
        attempt: int | None = None,
    ) -> None:
        """End the matching live processes with ``code`` (every host when no slice/worker given)."""

        def match(p: MemoryProcess) -> bool:
            return p.alive and slice in (None, p.slice) and worker in (None, p.worker_id)

        self._each(job_id, attempt, match, state=HostState.EXITED, exit_code=code)

    def write(self, job_id: str, text: str, *, slice: str | None = None, worker: int | None = None) -> None:
        with self._lock:
            for p in self.processes(job_id):
                if slice in (None, p.slice) and worker in (None, p.worker_id) and p.writes_log:
                    p.log += text.format_map(p.env)

    def write_files(self, job_id: str, nbytes: int) -> None:
        """The job (its latest attempt) adds ``nbytes`` to its checkpoint directory."""
        with self._lock:
            att = self._latest(job_id, None)
            if att is None:
                raise NotFoundError(f"job {job_id} has no attempt here")
            key = (att.spec.tenant, job_id)
            self.files[key] = self.files.get(key, 0) + nbytes

    def report_step(self, job_id: str, step: int, at: float, *, attempt: int | None = None) -> None:
        """Process 0 of the attempt (default: the job's latest) reports ``step`` done at ``at``, as
        ``tpufleet.runtime.report_step`` does on a real host; ``poll`` hands it out from now on."""
        with self._lock:
            att = self._latest(job_id, attempt)
            if att is None:
                raise NotFoundError(f"job {job_id} has no attempt here")
            before = att.progress
            att.progress = StepProgress(step, at, step, at) if before is None else before.advance(step, at)

    def kill_host(self, slice_name: str, worker_id: int) -> None:
        """The host dies: its slice is no longer intact and any process on it is LOST."""
        with self._lock:
            info = self._slices[slice_name]
            hosts = tuple(replace(h, alive=False) if h.worker_id == worker_id else h for h in info.hosts)
            problem = f"host {worker_id} is dead"
            self._slices[slice_name] = replace(info, hosts=hosts, problems=(*info.problems, problem))
            key = self._holder.get(slice_name)
            att = self._attempts.get(key) if key else None
            for p in att.processes if att else ():
                if p.slice == slice_name and p.worker_id == worker_id and p.alive:
                    p.state = HostState.LOST

    def end_slice(self, slice_name: str, why: str) -> None:
        """Every host of the slice ends on purpose (``SliceInfo.gone``: an autoscaler's scale-in, a
        drain for a preemption, a stop), as Ray reports such a slice: dead hosts, kept listed."""
        for host in self._slices[slice_name].hosts:
            self.kill_host(slice_name, host.worker_id)
        with self._lock:
            self._slices[slice_name] = replace(self._slices[slice_name], gone=why)

    def repair(self, slice_name: str) -> None:
        with self._lock:
            info = self._slices[slice_name]
            hosts = tuple(replace(h, alive=True) for h in info.hosts)
            self._slices[slice_name] = replace(info, hosts=hosts, problems=(), gone="")

    def _latest(self, job_id: str, attempt: int | None) -> MemoryAttempt | None:
        if attempt is not None:
            return self._attempts.get((job_id, attempt))
        keys = [k for k in self._attempts if k[0] == job_id]
        return self._attempts[max(keys)] if keys else None

    def _process(self, job_id: str, attempt: int, slice_name: str, worker_id: int) -> MemoryProcess | None:
        att = self._attempts.get((job_id, attempt))
        for p in att.processes if att else ():
            if p.slice == slice_name and p.worker_id == worker_id:
                return p
        return None

    def _each(
        self, job_id: str, attempt: int | None, match: Callable[[MemoryProcess], bool], **values: object
    ) -> None:
        with self._lock:
            for p in self.processes(job_id, attempt):
                if match(p):
                    for key, value in values.items():
                        setattr(p, key, value)
