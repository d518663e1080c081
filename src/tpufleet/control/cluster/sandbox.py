"""``SandboxCluster``: a wall-clock, in-memory :class:`~tpufleet.control.cluster.protocol.ClusterClient`.

``tpufleet serve --sandbox v4-16:64,v4-32:16`` runs the whole control plane (store, loop, policy,
API, CLI) over it instead of Ray, so platform engineers can try quotas and priorities, and load
tests can push the loop, before touching real slices. Nothing is executed: every host of a launched
attempt "runs" for ``job_seconds`` of wall time and exits 0, unless the job's env sets
``TPUFLEET_SANDBOX_SECONDS`` (seconds, >= 0) or ``TPUFLEET_SANDBOX_EXIT`` (an exit code). Each host
gets the same host contract as on Ray (``tpufleet.contract``) and writes a line when it starts and
one when it ends. Slices are built as ``FakeCluster.of`` builds them (``fake.make_slice``).

It behaves as the Ray executor does where the two could differ: a launched attempt holds its slices
until ``stop`` (as a placement group does), a second ``launch`` of a live attempt returns, ``stop``
ends live hosts with SIGTERM's exit code and is idempotent. Unlike ``FakeCluster`` (time counted in
polls, driven by tests), time here is the injected ``clock`` (``time.monotonic`` by default).
Every call is O(hosts of the attempt), so a fleet of thousands of slices and 100,000 finished
attempts stays fast. Thread-safe. Imports no Ray.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tpufleet import catalog, contract
from tpufleet.control.cluster.fake import SIGTERM_EXIT, make_slice
from tpufleet.control.cluster.protocol import (
    AttemptSpec,
    AttemptStatus,
    FilesRemoved,
    HostState,
    HostStatus,
    LogChunk,
    SliceInfo,
)
from tpufleet.errors import ClusterError, NotFoundError, SpecError

SECONDS_VAR = "TPUFLEET_SANDBOX_SECONDS"  # in a job's env: how long its hosts run
EXIT_VAR = "TPUFLEET_SANDBOX_EXIT"  # in a job's env: the exit code of its hosts
MAX_HOSTS = 100_000  # a sandbox fleet's hosts, all slices together
BAD_SETTING_EXIT = 2  # what a host exits with when the job's sandbox variables are malformed


def sandbox_slices(spec: str) -> list[SliceInfo]:
    """Intact slices from ``"v4-16:64,v4-32:16"``, named ``tpu-v4-16-0``, ``tpu-v4-16-1``, ...
    (a type given twice continues its numbering). SpecError for an unknown type or a bad count."""
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


@dataclass
class _Host:
    slice: str
    worker_id: int
    env: dict[str, str]  # what the process would get: the user's env and the host contract
    log: str
    exit_code: int | None = None  # None while it runs
    lost: bool = False  # its slice went away under it (a provider removed it)


@dataclass
class _Attempt:
    spec: AttemptSpec
    hosts: list[_Host]
    ends_at: float
    exit_code: int
    stopped: bool = False

    @property
    def running(self) -> bool:
        return any(h.exit_code is None for h in self.hosts)


class SandboxCluster:
    def __init__(
        self,
        slices: list[SliceInfo],
        *,
        job_seconds: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (math.isfinite(job_seconds) and job_seconds >= 0):
            raise SpecError(f"must be a number of seconds >= 0, got {job_seconds!r}", field="--job-seconds")
        self._slices = {s.name: s for s in slices}
        self.job_seconds = job_seconds
        self.clock = clock
        self._attempts: dict[tuple[str, int], _Attempt] = {}
        self._holder: dict[str, tuple[str, int]] = {}  # slice -> the live attempt holding it
        self._lock = threading.Lock()

    @classmethod
    def of(
        cls, spec: str, *, job_seconds: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> SandboxCluster:
        """A sandbox fleet from ``"v4-16:64,v4-32:16"`` (see :func:`sandbox_slices`)."""
        return cls(sandbox_slices(spec), job_seconds=job_seconds, clock=clock)

    # -- ClusterClient -------------------------------------------------------------------------
    def inventory(self) -> list[SliceInfo]:
        with self._lock:
            return list(self._slices.values())

    def launch(self, spec: AttemptSpec) -> None:
        key = (spec.job_id, spec.attempt)
        with self._lock:
            if key in self._attempts and not self._attempts[key].stopped:
                return  # already launched: as the Ray executor, a second launch changes nothing
            infos = [self._usable(name, key) for name in spec.slices]
            seconds, code, problem = self._settings(spec.env)
            layout = [(info.name, info.slice_type, [h.address or "" for h in info.hosts]) for info in infos]
            envs = iter(contract.attempt_envs(spec.job_id, spec.attempt, spec.checkpoint_dir, layout))
            hosts = []
            for info in infos:
                for host in info.hosts:
                    env = contract.process_env({}, dict(spec.env), *next(envs))
                    started = f"sandbox: {info.name}/{host.worker_id} running {seconds:g} s\n"
                    hosts.append(_Host(info.name, host.worker_id, env, problem or started))
            self._attempts[key] = _Attempt(spec, hosts, self.clock() + seconds, code)
            for name in spec.slices:
                self._holder[name] = key

    def _usable(self, name: str, key: tuple[str, int]) -> SliceInfo:
        info = self._slices.get(name)
        if info is None:
            raise ClusterError(f"slice {name} is not in the sandbox fleet")
        if not info.intact:
            raise ClusterError(f"slice {name} is broken: {'; '.join(info.problems)}")
        holder = self._holder.get(name)
        if holder is not None and holder[0] != key[0]:
            raise ClusterError(f"slice {name} is held by job {holder[0]}")
        return info

    def _settings(self, env: dict[str, str]) -> tuple[float, int, str]:
        """(seconds, exit code, problem): the job's own settings, or the sandbox's defaults; a
        malformed setting makes every host exit at once with code 2 and say why."""
        seconds, code = self.job_seconds, 0
        try:
            if SECONDS_VAR in env:
                seconds = float(env[SECONDS_VAR])
                if not (math.isfinite(seconds) and seconds >= 0):
                    raise ValueError(env[SECONDS_VAR])
            if EXIT_VAR in env:
                code = int(env[EXIT_VAR])
        except ValueError:
            why = f"sandbox: {SECONDS_VAR} must be seconds >= 0 and {EXIT_VAR} a whole number\n"
            return 0.0, BAD_SETTING_EXIT, why
        return seconds, code, ""

    def poll(self, job_id: str, attempt: int) -> AttemptStatus:
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None:
                raise NotFoundError(f"attempt {attempt} of job {job_id} was never launched here")
            if att.running and self.clock() >= att.ends_at:
                self._end(att, att.exit_code, f"sandbox: exit {att.exit_code}\n")
            hosts = tuple(
                HostStatus(h.slice, h.worker_id, HostState.LOST, detail="its slice was removed")
                if h.lost
                else HostStatus(h.slice, h.worker_id, HostState.RUNNING)
                if h.exit_code is None
                else HostStatus(h.slice, h.worker_id, HostState.EXITED, h.exit_code)
                for h in att.hosts
            )
            return AttemptStatus(job_id, attempt, hosts)

    @staticmethod
    def _end(att: _Attempt, code: int, line: str) -> None:
        for h in att.hosts:
            if h.exit_code is None:
                h.exit_code = code
                h.log += line

    def stop(self, job_id: str, attempt: int, grace_s: float = 10.0) -> None:
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None or att.stopped:
                return
            if att.running and self.clock() >= att.ends_at:  # it ended on its own before the stop
                self._end(att, att.exit_code, f"sandbox: exit {att.exit_code}\n")
            self._end(att, SIGTERM_EXIT, "sandbox: stopped (SIGTERM)\n")
            att.stopped = True
            for name in att.spec.slices:
                if self._holder.get(name) == (job_id, attempt):
                    del self._holder[name]

    def read_logs(self, job_id: str, attempt: int, slice_name: str, worker_id: int, offset: int) -> LogChunk:
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            hosts = att.hosts if att else []
            host = next((h for h in hosts if (h.slice, h.worker_id) == (slice_name, worker_id)), None)
            if host is None:
                return LogChunk("", offset, complete=True)
            data = host.log[offset:]
            end = offset + len(data)
            return LogChunk(data, end, complete=host.exit_code is not None and end >= len(host.log))

    def running_attempts(self) -> list[tuple[str, int]]:
        with self._lock:
            return [key for key, att in self._attempts.items() if not att.stopped]

    def adopt(self) -> list[tuple[str, int]]:
        return self.running_attempts()  # in memory: nothing outlives this process to take over

    def remove_job_files(self, job_root: str, tenant: str, job_ids: Sequence[str]) -> FilesRemoved:
        """A sandbox executes nothing, so no job has files: each is removed with 0 bytes."""
        return FilesRemoved(dict.fromkeys(job_ids, 0))

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
                for h in att.hosts if att else ():
                    if h.slice == name and h.exit_code is None:
                        h.lost = True
                        h.exit_code = SIGTERM_EXIT
                        h.log += "sandbox: host lost (its slice was removed)\n"

    # -- what tests read -----------------------------------------------------------------------
    def host_envs(self, job_id: str, attempt: int) -> list[dict[str, str]]:
        """The environment each host of an attempt got, in slice then worker order."""
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            return [dict(h.env) for h in att.hosts] if att else []
