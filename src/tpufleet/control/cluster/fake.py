"""``FakeCluster``: an in-memory :class:`~tpufleet.control.cluster.protocol.ClusterClient`, scripted.

A real module, not a mock: the service, the store, the API and the CLI are tested against it, and
it can stand in for Ray in an in-process demo. It gives every host of an attempt the same host
contract as the Ray executor (``tpufleet.contract``), so tests check the environment each host got.

Time is counted in polls, never in seconds: a launched attempt's hosts follow its :class:`Script`
(RUNNING after ``run_after`` polls, EXITED after ``exit_after``), or, without a script, stay where
they are until a test moves them (``start``, ``exit``, ``write``, ``kill_host``). ``fault`` makes
the next calls of one operation fail or block, as a broken cluster does. Logs are handed out in
chunks of at most ``log_chunk`` characters, as the runner does. Thread-safe.

Job files are sizes in memory (``write_files``): every poll of an SPMD attempt reports its
tenant's total as the hosts' measurement, and an attempt whose tenant is over the spec's checkpoint
quota is ended on every host with the runner's reason, as on real hosts; ``remove_job_files``
forgets them (``removals`` lists the calls).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
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
from tpufleet.errors import ClusterError, NotFoundError
from tpufleet.host.jobfiles import quota_problem
from tpufleet.runtime import StepProgress
from tpufleet.scheduler.lifecycle import JobKind

SIGTERM_EXIT = -15  # what a process ended by stop() reports, as subprocess does for SIGTERM


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


@dataclass
class FakeProcess:
    slice: str
    slice_index: int
    worker_id: int
    env: dict[str, str]
    state: HostState = HostState.STARTING
    exit_code: int | None = None
    log: str = ""
    detail: str | None = None  # why the host ended the process itself (its tenant's checkpoint quota)
    writes_log: bool = True  # a Ray job's driver output is the first host's log; the others stay empty

    @property
    def alive(self) -> bool:
        return self.state in (HostState.STARTING, HostState.RUNNING)


@dataclass
class FakeAttempt:
    spec: AttemptSpec
    processes: list[FakeProcess]
    script: Script | None
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


class FakeCluster:
    def __init__(
        self,
        slices: list[SliceInfo] | None = None,
        script: Callable[[AttemptSpec], Script | None] | None = None,
    ) -> None:
        self._slices: dict[str, SliceInfo] = {s.name: s for s in slices or ()}
        self._script = script
        self._attempts: dict[tuple[str, int], FakeAttempt] = {}
        self._lock = threading.RLock()
        self.launches: list[AttemptSpec] = []
        self.stops: list[tuple[str, int, float]] = []
        self.log_chunk = 1 << 20
        self.cold: set[str] = set()  # slices given back by release() (the service's DRAINING)
        self._faults: dict[tuple[str, str | None], BaseException | Callable[[], object]] = {}
        self.files: dict[tuple[str, str], int] = {}  # (tenant, job) -> bytes of its checkpoint dir
        self.removals: list[tuple[str, str, tuple[str, ...]]] = []
        self.clock: Callable[[], float] = time.time  # when the hosts measure (the host's clock)
        # attempts this cluster reports as cut short by tpufleet (``AttemptStatus.interrupted``), as
        # the Ray client does for a trainer placed on a slice that came back during its window
        self.interruptions: dict[tuple[str, int], str] = {}

    def fault(
        self, op: str, what: BaseException | Callable[[], object] | None, job_id: str | None = None
    ) -> None:
        """From now on ``op`` ("inventory", "maintain", "launch", "poll", "stop", "read_logs") raises ``what``
        (an exception) or calls it first (e.g. ``event.wait``, to hang); only for ``job_id`` when
        given. ``None`` clears the fault."""
        if what is None:
            self._faults.pop((op, job_id), None)
        else:
            self._faults[(op, job_id)] = what

    def _check(self, op: str, job_id: str | None = None) -> None:
        what = self._faults.get((op, job_id)) or self._faults.get((op, None))
        if isinstance(what, BaseException):
            raise what
        if what is not None:
            what()

    @classmethod
    def of(cls, spec: str, script: Callable[[AttemptSpec], Script | None] | None = None) -> FakeCluster:
        """A fleet from ``"v4-16:2,v6e-16"``: slices named ``tpu-v4-16-0``, ``tpu-v4-16-1``, ..."""
        fleet: list[SliceInfo] = []
        for st, count in catalog.parse_slice_list(spec):
            for i in range(count):
                fleet.append(make_slice(f"tpu-{st.accelerator_type}-{i}", st, subnet=len(fleet)))
        return cls(fleet, script)

    # -- ClusterClient -------------------------------------------------------------------------
    def inventory(self) -> list[SliceInfo]:
        self._check("inventory")
        with self._lock:
            return list(self._slices.values())

    def maintain(self) -> None:
        """Nothing to keep: an in-memory cluster has no warm pool (``cold`` says what was released)."""
        self._check("maintain")

    def release(self, names: list[str]) -> None:
        with self._lock:
            self.cold.update(names)

    def warm(self, names: list[str]) -> None:
        with self._lock:
            self.cold.difference_update(names)

    def adopt(self) -> list[tuple[str, int]]:
        return self.running_attempts()

    def launch(self, spec: AttemptSpec) -> None:
        self._check("launch", spec.job_id)
        with self._lock:
            key = (spec.job_id, spec.attempt)
            if key in self._attempts and not self._attempts[key].stopped:
                return  # launching a running attempt again does nothing, as on Ray
            infos = [self._usable(name, spec.job_id) for name in spec.slices]
            layout = [(info.name, info.slice_type, [h.address or "" for h in info.hosts]) for info in infos]
            envs = iter(contract.attempt_envs(spec.job_id, spec.attempt, spec.checkpoint_dir, layout))
            procs: list[FakeProcess] = []
            driver = contract.ray_driver_env(
                spec.job_id, spec.attempt, spec.checkpoint_dir, [(i.name, i.slice_type) for i in infos]
            )
            for index, info in enumerate(infos):
                for host in info.hosts:
                    contract_env, attempt_env = next(envs)
                    env = contract.process_env({}, dict(spec.env), contract_env, attempt_env)
                    if spec.kind == JobKind.RAY:  # one driver, shown as every host of the slices it holds
                        env = contract.process_env({}, dict(spec.env), {}, driver)
                    writes = not procs or spec.kind != JobKind.RAY
                    procs.append(FakeProcess(info.name, index, host.worker_id, env, writes_log=writes))
            self._attempts[key] = FakeAttempt(spec, procs, self._script(spec) if self._script else None)
            self.launches.append(spec)

    def _usable(self, name: str, job_id: str) -> SliceInfo:
        info = self._slices.get(name)
        if info is None:
            raise ClusterError(f"slice {name} is not in the cluster")
        if not info.intact:
            raise ClusterError(f"slice {name} is broken: {'; '.join(info.problems)}")
        for other in self._attempts.values():
            if not other.stopped and name in other.spec.slices and other.spec.job_id != job_id:
                raise ClusterError(f"slice {name} is held by job {other.spec.job_id}")
        return info

    def poll(self, job_id: str, attempt: int) -> AttemptStatus:
        self._check("poll", job_id)
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None:
                raise NotFoundError(f"attempt {attempt} of job {job_id} was never launched here")
            att.polls += 1
            if att.script is not None and not att.stopped:
                self._advance(att, att.script)
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

    def _measure(self, att: FakeAttempt) -> DiskUsage | None:
        """What the hosts of an SPMD attempt measure; over the quota they end their processes."""
        if att.spec.kind != "spmd":
            return None
        tenant = att.spec.tenant
        sizes = [n for (t, _job), n in self.files.items() if t == tenant]
        disk = DiskUsage(sum(sizes), len(sizes), True, self.clock())
        why = quota_problem(tenant, disk, att.spec.checkpoint_quota)
        for p in att.processes if why is not None and not att.stopped else ():
            if p.alive:
                p.state, p.exit_code, p.detail = HostState.EXITED, SIGTERM_EXIT, why
        return disk

    def _advance(self, att: FakeAttempt, script: Script) -> None:
        if att.polls >= script.run_after:
            for p in att.processes:
                if p.state is HostState.STARTING:
                    p.state = HostState.RUNNING
                    p.log += script.output.format_map(p.env) if p.writes_log else ""
        if script.exit_after is not None and att.polls >= script.exit_after:
            for p in att.processes:
                if p.state is HostState.RUNNING:
                    code = script.exit_codes.get((p.slice_index, p.worker_id), script.exit_code)
                    p.state, p.exit_code = HostState.EXITED, code

    def stop(self, job_id: str, attempt: int, grace_s: float = 10.0) -> None:
        self._check("stop", job_id)
        with self._lock:
            self.stops.append((job_id, attempt, grace_s))
            att = self._attempts.get((job_id, attempt))
            if att is None:
                return
            for p in att.processes:
                if p.alive:
                    p.state, p.exit_code = HostState.EXITED, SIGTERM_EXIT
            att.stopped = True

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
            removed = {job: self.files.pop((tenant, job), 0) for job in job_ids}
            sizes = [n for (t, _job), n in self.files.items() if t == tenant]
            return FilesRemoved(removed, DiskUsage(sum(sizes), len(sizes), True, self.clock()))

    # -- what tests drive ----------------------------------------------------------------------
    def processes(self, job_id: str, attempt: int | None = None) -> list[FakeProcess]:
        """The hosts' processes of an attempt (default: the job's latest), in slice/worker order."""
        with self._lock:
            att = self._latest(job_id, attempt)
            return list(att.processes) if att else []

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

        def match(p: FakeProcess) -> bool:
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
            for att in self._attempts.values():
                for p in att.processes:
                    if p.slice == slice_name and p.worker_id == worker_id and p.alive:
                        p.state = HostState.LOST

    def repair(self, slice_name: str) -> None:
        with self._lock:
            info = self._slices[slice_name]
            hosts = tuple(replace(h, alive=True) for h in info.hosts)
            self._slices[slice_name] = replace(info, hosts=hosts, problems=())

    def _latest(self, job_id: str, attempt: int | None) -> FakeAttempt | None:
        keys = [k for k in self._attempts if k[0] == job_id and attempt in (None, k[1])]
        return self._attempts[max(keys)] if keys else None

    def _process(self, job_id: str, attempt: int, slice_name: str, worker_id: int) -> FakeProcess | None:
        att = self._attempts.get((job_id, attempt))
        for p in att.processes if att else ():
            if p.slice == slice_name and p.worker_id == worker_id:
                return p
        return None

    def _each(
        self, job_id: str, attempt: int | None, match: Callable[[FakeProcess], bool], **values: object
    ) -> None:
        with self._lock:
            for p in self.processes(job_id, attempt):
                if match(p):
                    for key, value in values.items():
                        setattr(p, key, value)


def make_slice(name: str, st: SliceType, subnet: int = 0) -> SliceInfo:
    """An intact slice of type ``st`` whose hosts are 10.0.<subnet>.<worker+1>."""
    hosts = tuple(HostInfo(w, f"node-{name}-{w}", f"10.0.{subnet}.{w + 1}", True) for w in range(st.hosts))
    return SliceInfo(name, st.accelerator_type, str(st.topology), st.hosts, hosts)
