"""``RayExecutor``: the ``ClusterClient`` on a live Ray cluster (an emulated fleet or real TPU slices).

Placement: every slice an attempt uses is reserved by ``slices.SlicePool`` (one detached, named
``SlicePlacementGroup`` per slice, pinned by label). Runners (``runner.HostRunner``) start the
command on every host. With the warm pool on (the default), ``inventory()`` keeps a reservation and
idle runners on every free intact slice, releases broken ones and re-reserves restored ones, so
``launch`` on a pooled slice is one actor call per host and returns in milliseconds. The service
may take a slice out of the pool (``release``, e.g. for ``DRAINING``) and put it back (``warm``).
A job whose code is an uploaded package gets it through Ray's object store (``ray.put`` once per
attempt; every host's runner unpacks it in the job's jail). A job whose ``working_dir`` is an
operator-allowed URL gets its own runners (``runtime_env``), which costs an actor start.

Hosts heal: the runners of every free slice are pinged now and then, and a runner that died (a
job may kill its own runner) is replaced before the slice is offered again; until the new one
answers, ``inventory`` reports the slice as not intact, so it is ``BROKEN`` with the reason.

Per-attempt ports: on real hardware every host has its own address and ``MEGASCALE_PORT`` is 8081.
When the attempt's hosts share an address (the emulator: every host is this machine) a free port is
picked here per attempt, for ``MEGASCALE_PORT`` and for ``TPUFLEET_JAX_COORDINATOR_PORT`` (read by
``tpufleet.runtime.initialize_jax()`` on the emulator), so concurrent jobs do not collide.

``stop`` blocks until every process of the attempt is gone (at most ``grace_s`` plus the SIGKILL):
the service may hand the slices to the next job as soon as it returns.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import ray
from ray.exceptions import (
    ActorUnschedulableError,
    GetTimeoutError,
    RayActorError,
    RayError,
    RuntimeEnvSetupError,
)

from tpufleet import contract
from tpufleet.control.cluster.protocol import (
    AttemptSpec,
    AttemptStatus,
    DiskUsage,
    FilesRemoved,
    HostState,
    HostStatus,
    LogChunk,
    SliceInfo,
)
from tpufleet.control.ray.jobs import RayJobs
from tpufleet.control.ray.warmpool import SlicePool, kill_actor
from tpufleet.emulator import procs
from tpufleet.errors import ClusterError, ConflictError, NotFoundError
from tpufleet.host.runner import (
    NAMESPACE,
    RunRequest,
    job_runner_name,
    pool_runner_name,
    read_log_task,
    remove_files_task,
)
from tpufleet.inventory import slices_from_nodes
from tpufleet.runtime import StepProgress
from tpufleet.scheduler.lifecycle import JobKind

log = logging.getLogger(__name__)

JAX_PORT_VAR = "TPUFLEET_JAX_COORDINATOR_PORT"
_POLL_WAIT_S = 0.5
_FIRST_LOOK_S = 0.1  # the first poll of a launch waits this long for the hosts' start calls
_CALL_TIMEOUT_S = 10.0
_REUSE_NODES_S = 0.5  # inventory() right after maintain() uses its read of the node table
_START_WATCH_S = 120.0  # a launch watcher waits this long for the hosts' start calls, then wakes the loop


def _nodes() -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    return nodes


@dataclass
class _Host:
    slice: str
    worker_id: int
    runner: Any
    node_id: str | None
    started: Any = None  # ObjectRef of runner.start; None for an adopted attempt
    last: HostStatus | None = None
    disk: DiskUsage | None = None  # the tenant directory as this host last measured it
    asked: Any = None  # a report call the last poll made that has not answered yet (asked once)
    asked_after_start: bool = False  # whether the start call had returned when ``asked`` was made


@dataclass
class _Attempt:
    job_id: str
    attempt: int
    slices: tuple[str, ...]
    hosts: list[_Host]
    job_runners: bool = False
    ended: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class RayExecutor:
    """The ``ClusterClient`` on Ray. See the module docstring for the warm pool and ports."""

    def __init__(self, *, warm_pool: bool = True, log_root: str | None = None):
        """No I/O: use :meth:`connect` (or call ``ray.init`` yourself first)."""
        self.warm_pool = warm_pool
        self._pool = SlicePool(log_root)
        self._lock = threading.RLock()
        self._slices: dict[str, SliceInfo] = {}
        self._attempts: dict[tuple[str, int], _Attempt] = {}
        self._held: dict[str, tuple[str, int]] = {}
        self._cold: set[str] = set()
        self._recovered = False
        self._ray = RayJobs(self._pool)  # Ray jobs (docs/ray-jobs.md): drivers, steering windows
        self._wake: Callable[[], None] | None = None  # notify(): the loop, woken when a launch started
        # maintain()'s read of the node table (and when), for the inventory() that follows it
        self._maintained: tuple[float, list[SliceInfo]] | None = None

    @classmethod
    def connect(
        cls, address: str | None = None, *, warm_pool: bool = True, log_root: str | None = None
    ) -> RayExecutor:
        """Connect this process to the Ray cluster at ``address`` (once) and return an executor."""
        if not ray.is_initialized():
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING)
        return cls(warm_pool=warm_pool, log_root=log_root)

    # -- inventory and the pool -------------------------------------------------------------
    def inventory(self) -> list[SliceInfo]:
        """Every slice; a free one whose runner died (and is being replaced) is not intact.
        Reads Ray's node table (the read ``maintain`` just made, when it did: the loop calls the
        two back to back each cycle) and what ``maintain`` found; changes nothing."""
        with self._lock:
            kept, self._maintained = self._maintained, None
        fresh = kept is not None and time.monotonic() - kept[0] < _REUSE_NODES_S
        slices = kept[1] if kept is not None and fresh else slices_from_nodes(_nodes())
        with self._lock:
            self._slices = {s.name: s for s in slices}
            out = []
            for s in slices:
                res = self._pool.get(s.name) if s.name not in self._held else None
                problem = res.problem if res is not None else None
                out.append(replace(s, problems=(*s.problems, problem)) if problem else s)
        return out

    def maintain(self) -> None:
        """Keep the warm pool (see the module docstring): reserve free intact slices, release
        broken, cold or vanished ones, and ping (and replace) the runners of free slices."""
        slices = slices_from_nodes(_nodes())
        with self._lock:
            self._maintained = (time.monotonic(), slices)
            self._slices = {s.name: s for s in slices}
            if not self._recovered:
                self._adopt_all()
            if self.warm_pool:
                now = time.monotonic()
                for s in slices:
                    if s.name in self._held:
                        continue
                    if s.intact and s.name not in self._cold:
                        self._pool.reserve(s)
                        self._pool.check(s.name, now)
                    elif self._pool.get(s.name) is not None:
                        self._pool.release(s.name)
            self._ray.advance(self._slices)  # open and close Ray jobs' steering windows

    def warm(self, names: list[str]) -> None:
        """Put slices (back) into the warm pool; they are reserved on the next ``maintain()``."""
        with self._lock:
            self._cold.difference_update(names)
        self.maintain()

    def release(self, names: list[str]) -> None:
        """Take free slices out of the pool and give their chips back to Ray (``DRAINING``); held
        ones go when their attempt ends. A name neither pooled nor listed by Ray (a slice deleted
        long ago) is only kept out of the pool: nothing of it is looked up."""
        with self._lock:
            self._cold.update(names)
            for name in names:
                if name not in self._held and (self._pool.get(name) is not None or name in self._slices):
                    self._pool.release(name)

    def release_all(self) -> None:
        """Drop every reservation and pool runner this control plane holds (teardown)."""
        with self._lock:
            self._cold.update(self._slices)
            self._pool.release_all()
            self._ray.release_fences()

    def wait_warm(self, names: list[str], timeout_s: float = 60.0) -> None:
        """Block until the pooled reservations of ``names`` are placed and their runners answer."""
        with self._lock:
            for name in names:
                if self._pool.get(name) is None:
                    self._pool.reserve(self._slice(name))
        self._pool.wait_ready(names, timeout_s)

    def _slice(self, name: str) -> SliceInfo:
        if name not in self._slices:
            self.inventory()
        if name not in self._slices:
            raise NotFoundError(f"slice {name!r} is not in the Ray cluster; known: {sorted(self._slices)}")
        return self._slices[name]

    # -- launch -------------------------------------------------------------------------------
    def notify(self, wake: Callable[[], None]) -> None:
        """``Notifying``: ``wake`` is called once every host of a launch has answered its start
        (started, or failed to), so the loop polls then rather than at its next cycle."""
        self._wake = wake

    def _wake_when_started(self, starts: list[Any]) -> None:
        """A daemon thread waits for the start calls (Ray futures) and wakes the loop once."""
        wake = self._wake
        if wake is None or not starts:
            return

        def watch() -> None:
            try:
                ray.wait(starts, num_returns=len(starts), timeout=_START_WATCH_S)
            except Exception:  # a cluster going away: the loop's own poll finds out
                log.debug("watching a launch's start calls failed", exc_info=True)
            wake()

        threading.Thread(target=watch, name="tpufleet-launch-watch", daemon=True).start()

    def launch(self, spec: AttemptSpec) -> None:
        key = (spec.job_id, spec.attempt)
        if spec.kind == JobKind.RAY:
            self._launch_ray(spec)
            return
        with self._lock:
            if key in self._attempts and not self._attempts[key].ended:
                return  # idempotent
            infos = [self._claimable(name, spec) for name in spec.slices]
            url = spec.working_dir_url
            rec = _Attempt(spec.job_id, spec.attempt, spec.slices, [], job_runners=bool(url))
            for name, info in zip(spec.slices, infos, strict=True):
                res = self._pool.get(name) or self._pool.reserve(info)
                runners = self._pool.job_runners(name, spec.job_id, spec.attempt, url) if url else res.runners
                rec.hosts += [_Host(name, w, r, info.hosts[w].node_id) for w, r in enumerate(runners)]
                self._held[name] = key
            self._attempts[key] = rec
        layout = [(h.slice, h.worker_id) for h in rec.hosts]
        package = ray.put(spec.package) if spec.package is not None else None
        rec.extra["package"] = package  # kept until the attempt ends: the hosts fetch it from here
        for host, request in zip(rec.hosts, _requests(spec, infos, layout), strict=True):
            host.started = host.runner.start.remote(replace(request, package=package))
        self._wake_when_started([h.started for h in rec.hosts])

    def launches_at_once(self, names: Sequence[str]) -> bool:
        """``WarmPool``: each slice is reserved, so a launch sends the start calls and returns."""
        with self._lock:
            return all(self._pool.get(name) is not None for name in names)

    def _launch_ray(self, spec: AttemptSpec) -> None:
        """Hold the slices and queue the driver for its type's steering window (``rayjob``)."""
        key = (spec.job_id, spec.attempt)
        with self._lock:
            have = self._ray.get(key)
            if have is not None and have.state != "ENDED":
                return  # idempotent
            infos = [self._claimable(name, spec) for name in spec.slices]
            for name in spec.slices:
                self._held[name] = key
            self._ray.launch(spec, infos)
            self._ray.advance(self._slices)  # submitted now when its type's window is free

    def _claimable(self, name: str, spec: AttemptSpec) -> SliceInfo:
        info = self._slice(name)
        if info.accelerator_type != spec.accelerator_type:
            raise ConflictError(
                f"slice {name} is {info.accelerator_type}, the job needs {spec.accelerator_type}"
            )
        if not info.intact:
            raise ConflictError(f"slice {name} is not intact: {'; '.join(info.problems)}")
        holder = self._held.get(name)
        if holder is not None and holder != (spec.job_id, spec.attempt):
            raise ConflictError(f"slice {name} is held by {holder[0]} attempt {holder[1]}")
        return info

    # -- observe ------------------------------------------------------------------------------
    def poll(self, job_id: str, attempt: int) -> AttemptStatus:
        if self._ray.knows((job_id, attempt)):
            dead = {n["NodeID"] for n in _nodes() if not n.get("Alive")}
            with self._lock:
                return self._ray.status((job_id, attempt), dead)
        rec = self._record(job_id, attempt)
        if rec.ended:  # what each host's stop answered: its exit code, or LOST
            gone = HostStatus("", 0, HostState.LOST)
            return AttemptStatus(
                job_id,
                attempt,
                tuple(h.last or replace(gone, slice=h.slice, worker_id=h.worker_id) for h in rec.hosts),
                rec.extra.get("progress"),
            )
        # Runners are threaded actors, so a status call may run before the start call it follows.
        # Only a host whose start had returned before we asked can answer "never heard of it".
        starts = [h.started for h in rec.hosts if h.started is not None]
        # The first look at a launch waits for the start calls themselves (a runner answers its
        # start once the process runs), so that every host is seen RUNNING in one look rather
        # than some of them in this one and the rest a turn later.
        # Briefly: a start slower than that (a loaded machine) is left to the launch's watch, which
        # wakes the loop once every start answered, instead of holding the loop's turn.
        unseen = len(starts) == len(rec.hosts) and all(h.last is None and h.asked is None for h in rec.hosts)
        wait_s = _FIRST_LOOK_S if unseen else 0
        returned = set(ray.wait(starts, num_returns=len(starts), timeout=wait_s)[0]) if starts else set()
        if (answered := self._started_running(rec, returned)) is not None:
            return AttemptStatus(job_id, attempt, answered, rec.extra.get("progress"))
        started = [h.started is None or h.started in returned for h in rec.hosts]
        # A host adopted after a restart without a runner (its node died meanwhile) has nobody to ask.
        # A call a runner has not answered yet is waited for again, not made again: on a loaded
        # machine answers can take longer than a poll waits, and a poll every 50 ms asking anew
        # piled calls up on the runners faster than they answered, so the hosts never read RUNNING.
        refs = [
            self._asked(h, job_id, attempt, was) if h.runner is not None else None
            for h, was in zip(rec.hosts, started, strict=True)
        ]
        started = [
            h.asked_after_start if h.asked is not None else was
            for h, was in zip(rec.hosts, started, strict=True)
        ]
        first = rec.hosts[0].runner if rec.hosts else None
        progress_ref = rec.extra.get("asked_progress")
        if progress_ref is None and first is not None:
            progress_ref = rec.extra["asked_progress"] = first.progress.remote(job_id, attempt)
        asked = [r for r in refs if r is not None] + ([progress_ref] if progress_ref is not None else [])
        ready, _ = ray.wait(asked, num_returns=len(asked), timeout=_POLL_WAIT_S)
        done = set(ready)
        for host, ref in zip(rec.hosts, refs, strict=True):
            if ref is not None and ref in done:
                host.asked = None  # answered: the next poll asks again
        if progress_ref is not None and progress_ref in done:
            rec.extra.pop("asked_progress", None)
            self._keep_progress(rec, progress_ref)
        dead_nodes: set[str] | None = None
        statuses = []
        for host, ref, was_started in zip(rec.hosts, refs, started, strict=True):
            if ref is None:
                host.last = HostStatus(host.slice, host.worker_id, HostState.LOST)
                statuses.append(host.last)
                continue
            status = self._host_status(host, ref if ref in done else None, was_started)
            if status is None:  # no answer in time: a dead node, or the runner is still busy
                if dead_nodes is None:
                    dead_nodes = {n["NodeID"] for n in _nodes() if not n.get("Alive")}
                lost = host.node_id in dead_nodes
                status = HostStatus(host.slice, host.worker_id, HostState.LOST) if lost else host.last
                status = status or HostStatus(host.slice, host.worker_id, HostState.STARTING)
            host.last = status
            statuses.append(status)
        disks = [h.disk for h in rec.hosts if h.disk is not None]
        disk = max(disks, key=lambda d: (d.bytes, d.at)) if disks else None
        return AttemptStatus(job_id, attempt, tuple(statuses), rec.extra.get("progress"), disk=disk)

    @staticmethod
    def _started_running(rec: _Attempt, returned: set[Any]) -> tuple[HostStatus, ...] | None:
        """The first poll after a launch, once every host's start call answered ``RUNNING``: each
        host is RUNNING, as its report would say a moment later, without a call to every runner
        on the dispatch path (later polls ask the runners). None otherwise: a host still
        starting, one that answered anything else (it ended at once: its report has the code and
        the reason), one already reported on, or an adopted attempt (no start call)."""
        if not rec.hosts:
            return None
        for h in rec.hosts:
            if h.last is not None or h.asked is not None or h.started is None or h.started not in returned:
                return None
        try:
            answers = ray.get([h.started for h in rec.hosts], timeout=_CALL_TIMEOUT_S)
        except (RayError, GetTimeoutError):
            return None
        if any(answer != "RUNNING" for answer in answers):
            return None
        statuses = tuple(HostStatus(h.slice, h.worker_id, HostState.RUNNING) for h in rec.hosts)
        for h, status in zip(rec.hosts, statuses, strict=True):
            h.last = status
        return statuses

    @staticmethod
    def _asked(host: _Host, job_id: str, attempt: int, started: bool) -> Any:
        """The host's report call: the one still unanswered from the last poll (with whether its
        start had returned when it was asked), else a new one."""
        if host.asked is None:
            host.asked, host.asked_after_start = _ask_report(host.runner, job_id, attempt), started
        return host.asked

    @staticmethod
    def _keep_progress(rec: _Attempt, ref: Any) -> None:
        """Process 0's report (``runtime.report_step``), checked again here: the job wrote it."""
        try:
            found = StepProgress.from_dict(ray.get(ref, timeout=_CALL_TIMEOUT_S))
        except (RayError, GetTimeoutError):
            return
        if found is not None:
            rec.extra["progress"] = found

    @staticmethod
    def _host_status(host: _Host, ref: Any, was_started: bool) -> HostStatus | None:
        """A host's state from its runner's ``report`` (with why the runner ended the run, and the
        tenant directory's size, which are kept on the host's record)."""
        reason: str | None = None

        def make(state: HostState, code: int | None = None) -> HostStatus:
            return HostStatus(host.slice, host.worker_id, state, code, reason)

        if ref is None:
            return None
        try:
            answer = ray.get(ref)
            if isinstance(answer, dict):
                state, code = answer["state"], answer["code"]
                reason = str(answer["reason"])[:2000] if answer.get("reason") else None
                host.disk = DiskUsage.from_dict(answer.get("disk")) or host.disk
            else:  # a runner started by an older tpufleet: (state, code) from ``status``
                state, code = answer
        except RayActorError:
            return make(HostState.LOST)
        except (RuntimeEnvSetupError, ActorUnschedulableError) as err:
            why = (
                "its working_dir could not be set up"
                if isinstance(err, RuntimeEnvSetupError)
                else "no runner"
            )
            detail = f"{why}: {' '.join(str(err).split())[-300:]}"
            return HostStatus(host.slice, host.worker_id, HostState.LOST, None, detail)
        except RayError:
            log.warning("status of %s/%s failed", host.slice, host.worker_id, exc_info=True)
            return None
        if state == "RUNNING":
            return make(HostState.RUNNING)
        if state == "EXITED":
            return make(HostState.EXITED, code)
        if not was_started:
            return make(HostState.STARTING)
        return make(HostState.LOST)  # the runner never heard of it after starting it: it was replaced

    def _record(self, job_id: str, attempt: int) -> _Attempt:
        with self._lock:
            rec = self._attempts.get((job_id, attempt))
        if rec is None:
            raise NotFoundError(f"attempt {attempt} of job {job_id} has no runners in the Ray cluster")
        return rec

    def read_logs(self, job_id: str, attempt: int, slice_name: str, worker_id: int, offset: int) -> LogChunk:
        if self._ray.knows((job_id, attempt)):
            return self._ray.read_log((job_id, attempt), slice_name, worker_id, offset)
        host = self._find_host(job_id, attempt, slice_name, worker_id)
        try:
            out = None
            if host is not None:
                try:
                    out = ray.get(
                        host.runner.read_log.remote(job_id, attempt, offset), timeout=_CALL_TIMEOUT_S
                    )
                except RayActorError:  # its runner is gone (a released slice): the log is still on disk
                    out = None
            if out is None:
                out = self._read_log_elsewhere(job_id, attempt, slice_name, worker_id, offset)
        except (RayError, GetTimeoutError) as exc:
            raise ClusterError(
                f"cannot read the log of {slice_name}/{worker_id}: {exc}", retry_after=5
            ) from exc
        return LogChunk(out["data"], out["next_offset"], out["complete"])

    def _find_host(self, job_id: str, attempt: int, slice_name: str, worker_id: int) -> _Host | None:
        rec = self._attempts.get((job_id, attempt))
        for h in rec.hosts if rec and not (rec.ended and rec.job_runners) else []:
            if (h.slice, h.worker_id) == (slice_name, worker_id):
                return h
        return None

    def _read_log_elsewhere(
        self, job_id: str, attempt: int, slice_name: str, worker_id: int, offset: int
    ) -> Any:
        """Through the host's pool runner, or a one-off task on the host's node."""
        try:
            runner = ray.get_actor(pool_runner_name(slice_name, worker_id), namespace=NAMESPACE)
            return ray.get(runner.read_log.remote(job_id, attempt, offset), timeout=_CALL_TIMEOUT_S)
        except (ValueError, RayActorError):
            pass
        node = self._slice(slice_name).hosts[worker_id].node_id
        if node is None:
            raise NotFoundError(f"host {slice_name}/{worker_id} is gone, and its log with it")
        task = read_log_task(node, self._pool.log_root)
        return ray.get(task.remote(job_id, attempt, slice_name, worker_id, offset), timeout=60)

    # -- files ------------------------------------------------------------------------------------
    def remove_job_files(self, job_root: str, tenant: str, job_ids: Sequence[str]) -> FilesRemoved:
        """Through a pool runner of any slice (every host sees the same job root on real clusters
        and on the emulator), else a one-off task on a live host."""
        with self._lock:
            reservations = [self._pool.get(name) for name in self._pool.names()]
            runners = [r for res in reservations if res is not None for r in res.runners]
            nodes = [h.node_id for s in self._slices.values() for h in s.hosts if h.alive and h.node_id]
        args = (job_root, tenant, list(job_ids))
        for target in [*runners[:3], *nodes[:1]]:
            try:
                if isinstance(target, str):
                    ref = remove_files_task(target).remote(*args)
                else:
                    ref = target.remove_job_files.remote(*args)
                out: dict[str, Any] = ray.get(ref, timeout=120)
            except (RayActorError, AttributeError):  # a dead runner, or one of an older tpufleet
                continue
            except (RayError, GetTimeoutError) as exc:
                why = f"cannot remove job files of tenant {tenant}: {exc}"
                raise ClusterError(why, retry_after=60) from exc
            removed = {str(k): int(v) for k, v in dict(out["removed"]).items()}
            return FilesRemoved(removed, DiskUsage.from_dict(out.get("disk")))
        raise ClusterError("no host can remove job files now (no live runner or host)", retry_after=60)

    # -- stop and recovery --------------------------------------------------------------------
    def stop(self, job_id: str, attempt: int, grace_s: float = 10.0) -> None:
        if self._ray.knows((job_id, attempt)):
            self._stop_ray((job_id, attempt), grace_s)
            return
        try:
            rec = self._record(job_id, attempt)
        except NotFoundError:
            return
        # A host without a runner (adopted after its node died) is LOST; the others are asked to stop.
        refs = [
            h.runner.stop.remote(job_id, attempt, grace_s) if h.runner is not None else None
            for h in rec.hosts
        ]
        asked = [r for r in refs if r is not None]
        wait_s = grace_s + _CALL_TIMEOUT_S
        ready = ray.wait(asked, num_returns=len(asked), timeout=wait_s)[0] if asked else []
        dead: dict[str, list[int]] = {}
        for host, ref in zip(rec.hosts, refs, strict=True):
            if ref is None or (ref in ready and _died(ref)):
                dead.setdefault(host.slice, []).append(host.worker_id)
            host.last = _stopped(host, ref if ref in ready else None)
        if rec.hosts and rec.hosts[0].runner is not None:  # the last steps, before a job runner goes
            final = rec.hosts[0].runner.progress.remote(job_id, attempt)
            if ray.wait([final], timeout=_CALL_TIMEOUT_S)[0]:
                self._keep_progress(rec, final)
        if rec.job_runners:
            for h in rec.hosts:
                if h.runner is not None:
                    kill_actor(h.runner)
        live = {n["NodeID"] for n in _nodes() if n.get("Alive")}
        with self._lock:
            rec.ended = True
            rec.extra.pop("package", None)
            for name in rec.slices:
                if self._held.get(name) == (job_id, attempt):
                    del self._held[name]
                self._return_to_pool(name, live)
                if not rec.job_runners and dead.get(name) and self._pool.get(name) is not None:
                    self._pool.replace_runners(name, dead[name], "died during the last job")

    def _stop_ray(self, key: tuple[str, int], grace_s: float) -> None:
        """The driver and every Train worker gone, the job's placement groups removed: the slices
        go back to the warm pool (their fences stay while another window of the type is open)."""
        self._ray.stop(key, grace_s)
        live = {n["NodeID"] for n in _nodes() if n.get("Alive")}
        with self._lock:
            for name in self._ray.finished(key):
                if self._held.get(name) == key:
                    del self._held[name]
                self._return_to_pool(name, live)

    def _return_to_pool(self, name: str, live: set[str]) -> None:
        """Keep an intact slice's reservation (and pool runners) for the next job, or release it.

        An attempt adopted after a restart never went through the pool, so its slice has no
        ``Reservation`` here yet: adopt the detached one (``reserve`` finds the group and the live
        runners by name) instead of killing runners whose logs the service is about to read."""
        res = self._pool.get(name)
        info = self._slices.get(name)
        nodes = res.nodes if res is not None else tuple(h.node_id for h in info.hosts) if info else ()
        intact = bool(nodes) and all(node in live for node in nodes)
        if not (self.warm_pool and intact and name not in self._cold):
            self._pool.release(name)
        elif res is None and info is not None:
            self._pool.reserve(info)

    def running_attempts(self) -> list[tuple[str, int]]:
        """Attempts whose runners exist: job runners by name, pool runners by their current run;
        and Ray jobs whose driver Ray still runs."""
        return sorted(set(self._scan()[0]) | {key for key, _ in self._ray_running()})

    def _ray_running(self) -> list[tuple[tuple[str, int], list[str]]]:
        try:
            return self._ray.running()
        except Exception as err:  # no job API (no dashboard): there are no Ray jobs to find
            log.debug("cannot list Ray jobs: %s", err)
            return []

    def adopt(self) -> list[tuple[str, int]]:
        """Take over the attempts this cluster's runners still run: after a control-plane restart,
        or when this replica leads again after another's term. What this client remembers from
        before is stale then (the other leader ended attempts, freed their slices, reserved and
        drained slices), so it is all forgotten first and read from Ray again, as a process that
        just started reads it: attempts, the slices they hold, Ray jobs, the pool's reservations
        (adopted again by name) and which slices the loop had given back (it tells again)."""
        with self._lock:
            self._pool = SlicePool(self._pool.log_root)
            self._attempts.clear()
            self._held.clear()
            self._cold.clear()
            self._ray = RayJobs(self._pool)
            return self._adopt_all()

    def _adopt_all(self) -> list[tuple[str, int]]:
        found, handles = self._scan()
        if found and not self._slices:  # a fresh control plane: know the hosts' nodes for poll
            self._slices = {s.name: s for s in slices_from_nodes(_nodes())}
        for key, layout in found.items():
            if key not in self._attempts or self._attempts[key].ended:
                self._adopt(key, layout, handles)
        adopted = set(found)
        ray_jobs = self._ray_running()
        if ray_jobs and not self._slices:
            self._slices = {s.name: s for s in slices_from_nodes(_nodes())}
        self._ray.take_over_fences()
        for key, names in ray_jobs:
            infos = [self._slices[n] for n in names if n in self._slices]
            if infos and not self._ray.knows(key):
                self._ray.adopt(key, infos, infos[0].accelerator_type)
                self._held.update(dict.fromkeys(names, key))
            adopted.add(key)
        self._ray.drop_stray_fences()
        self._recovered = True
        return sorted(adopted)

    def _scan(self) -> tuple[dict[tuple[str, int], list[tuple[str, int]]], dict[str, Any]]:
        """What every tpufleet runner says it runs now: {(job, attempt): layout}, and the handles."""
        names = [
            r["name"]
            for r in ray.util.list_named_actors(all_namespaces=True)
            if r["namespace"] == NAMESPACE and r["name"].startswith("tpufleet:")
        ]
        handles = {n: ray.get_actor(n, namespace=NAMESPACE) for n in names}
        refs: dict[str, Any] = {n: h.assignments.remote() for n, h in handles.items()}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=_CALL_TIMEOUT_S)
        found: dict[tuple[str, int], list[tuple[str, int]]] = {}
        for ref in refs.values():
            if ref not in ready:
                continue
            try:
                rows: list[dict[str, Any]] = ray.get(ref)
            except RayError:
                continue
            for row in rows:
                if row["current"]:
                    found[(row["job_id"], row["attempt"])] = [tuple(x) for x in row["layout"]]
        return found, handles

    def _adopt(self, key: tuple[str, int], layout: list[tuple[str, int]], handles: dict[str, Any]) -> None:
        hosts, job_runners = [], False
        for slice_name, worker in layout:
            jname = job_runner_name(key[0], key[1], slice_name, worker)
            job_runners = job_runners or jname in handles
            runner = handles.get(jname) or handles.get(pool_runner_name(slice_name, worker))
            node = self._slices[slice_name].hosts[worker].node_id if slice_name in self._slices else None
            hosts.append(_Host(slice_name, worker, runner, node))
        slices = tuple(dict.fromkeys(s for s, _ in layout))
        self._attempts[key] = _Attempt(key[0], key[1], slices, hosts, job_runners=job_runners)
        for name in slices:
            self._held[name] = key


def _ask_report(runner: Any, job_id: str, attempt: int) -> Any:
    """``runner.report``; ``status`` of a runner an older tpufleet started (adopted after an upgrade)."""
    try:
        method = runner.report
    except AttributeError:
        method = runner.status
    return method.remote(job_id, attempt)


def _stopped(host: _Host, ref: Any) -> HostStatus:
    """A host's final state from the answer to its stop (the exit code), or LOST without one."""
    lost = HostStatus(host.slice, host.worker_id, HostState.LOST)
    if ref is None:
        return lost
    try:
        code = ray.get(ref, timeout=0)
    except (RayError, GetTimeoutError):
        return lost
    if code is None:
        return host.last if host.last and host.last.state is HostState.EXITED else lost
    return HostStatus(host.slice, host.worker_id, HostState.EXITED, int(code))


def _died(ref: Any) -> bool:
    """Whether the call behind ``ref`` failed because its runner actor is dead."""
    try:
        ray.get(ref, timeout=0)
    except RayActorError:
        return True
    except (RayError, GetTimeoutError):
        return False
    return False


def _requests(spec: AttemptSpec, infos: list[SliceInfo], layout: list[tuple[str, int]]) -> list[RunRequest]:
    """The start request of every host, in layout order (``contract.attempt_envs``)."""
    addresses = [h.address or "" for info in infos for h in info.hosts]
    shared = len(set(addresses)) < len(addresses)  # the emulator: every host is this machine
    # Ports picked now and listened on later, on the hosts (host 0's JAX coordinator, the megascale
    # port): from below the ephemeral range, where no connection or bind(0) takes them meanwhile.
    mport = procs.free_port() if shared else contract.MEGASCALE_PORT
    slices = [(info.name, info.slice_type, [h.address or "" for h in info.hosts]) for info in infos]
    envs = contract.attempt_envs(
        spec.job_id,
        spec.attempt,
        spec.checkpoint_dir,
        slices,
        megascale_port=mport,
        extra={JAX_PORT_VAR: str(procs.free_port())},
    )
    return [
        RunRequest(
            job_id=spec.job_id,
            attempt=spec.attempt,
            tenant=spec.tenant,
            job_root=spec.job_root,
            layout=tuple(layout),
            command=tuple(spec.command),
            user_env=dict(spec.env),
            contract=host_contract,
            env=attempt_env,
            hide=tuple(spec.hide),
            limits=spec.limits,
            checkpoint_quota=spec.checkpoint_quota,
            checkpoint_check_s=spec.checkpoint_check_s,
        )
        for host_contract, attempt_env in envs
    ]
