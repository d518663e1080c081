"""The runner: one named, detached Ray actor per TPU host that runs a job's command as a subprocess.

A runner is placed in its host's bundle of the slice's placement group and asks for nothing itself
(``num_cpus=0``, no ``TPU``): the bundle holds ``TPU: chips_per_host`` in Ray's accounting and the
user's process, started outside Ray's worker pool, owns every chip of the host. Ray would otherwise
set ``TPU_VISIBLE_CHIPS`` for the actor (and, on the emulator, a partial mask), and an idle runner
that claimed the chips would hide them from anything else scheduled into the bundle.

Every run is contained (``contain.py``): its own cgroup, so ``stop`` ends every process the job
started, however it detached; a jail (bubblewrap) where the host has one, so the job sees its own
tenant's files and nothing of the control plane, the emulator or other tenants; and
``PR_SET_PDEATHSIG``, so it dies with the runner as processes die with a crashed TPU VM. The
command is started through ``jobstart`` (inside the jail), which makes the run's directories,
unpacks the uploaded package and ``exec``s the command. Nothing the job sends can stop the runner
from answering: a start that cannot happen (a NUL byte, a missing program, an unsafe package) is
an exit code 127 with the reason in the log, never an exception left in ``STARTING``.
A runner made with ``spare=True`` (the warm pool's) keeps the next run's first process started
ahead, already contained, and a start hands it the run (``spare.py``): a start is then a write to
a pipe rather than a fork and two cgroup moves. Without one, or when it is gone, the run starts
the plain way.

Output (stdout and stderr interleaved, through a pipe the runner copies up to the stored cap) goes
to ``<log_root>/<job>/<attempt>/<slice>-<worker>.log`` (0600, in 0700 directories, hidden from
jailed jobs); the exit code is written next to it (``.exit``), and why tpufleet ended the run, if
it did (a process or open-files limit, ``runlimits.py``), as ``.reason``, so logs and results
outlive the attempt and can be read through any later runner of the same host. A dead runner is
replaced by the executor before its slice is offered again.

The runner also carries its host's device page for the control plane (``host/devicepage.py``), as
a daemon thread: on an emulated host the function its environment names (the emulator's device
plugin, never imported here), or on a GCE TPU VM the relay of libtpu's metrics
(``host/devicerelay.py``); on GKE it publishes the plugin's address. On a GCE TPU VM it also
watches the metadata server's preemption and maintenance notices and relays them to the control
plane (``host/gcemetadata.py``, ``host/notices.py``).

Files: the runner measures the run's tenant directory (``jobfiles.measure``) when the run starts
and every ``checkpoint_check_s`` while it runs, and hands the last measurement out with the run's
state (``report``). Over the tenant's checkpoint quota, a run does not start (exit 127) or is
ended (SIGTERM, ``QUOTA_GRACE_S``, SIGKILL), and ``report`` says why. When a run ends its scratch
and its empty ``.runs/<job>/<attempt>`` directories go; ``remove_job_files`` removes finished
jobs' checkpoint directories for the control plane's retention rule.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from tpufleet import contract
from tpufleet.host import contain, devicepage, gcemetadata, jobfiles, notices, runlimits
from tpufleet.host.spare import Spare
from tpufleet.runtime import PROGRESS_VAR, read_progress

log = logging.getLogger(__name__)

NAMESPACE = "tpufleet"
MAX_LOG_CHUNK = 1 << 20
_HISTORY = 256
# Ray sets these for a worker that holds part of a host's chips; the user process owns the whole host.
_RAY_TPU_MASKS = ("TPU_VISIBLE_CHIPS", "TPU_CHIPS_PER_HOST_BOUNDS", "TPU_HOST_BOUNDS")
# Never handed to a job from the runner's own environment: Ray's credentials and anything secret.
_SECRET_ENV = re.compile(r"^RAY_AUTH|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)
CANNOT_START = 127
SPARE_ENV = "TPUFLEET_SPARE"  # "off": a runner made with spare=True starts every run the plain way
PROGRESS_FILE = "progress.json"  # in the run's scratch: what report_step writes
QUOTA_GRACE_S = 5.0  # a run over its tenant's checkpoint quota: SIGTERM to SIGKILL


def pool_runner_name(slice_name: str, worker_id: int) -> str:
    """Runner kept warm on a free slice and reused by every attempt placed there."""
    return f"tpufleet:runner:{slice_name}:{worker_id}"


def job_runner_name(job_id: str, attempt: int, slice_name: str, worker_id: int) -> str:
    """Runner made for one attempt (a job with a ``working_dir`` needs its own ``runtime_env``)."""
    return f"tpufleet:{job_id}:{attempt}:{slice_name}:{worker_id}"


def _safe(part: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", part)


def log_path(root: str, job_id: str, attempt: int, slice_name: str, worker_id: int) -> Path:
    return Path(root) / _safe(job_id) / str(attempt) / f"{_safe(slice_name)}-{worker_id}.log"


def _default_log_root() -> str:
    try:
        node: Any = ray._private.worker.global_worker.node
        session = node.get_session_dir_path()
    except Exception:
        session = tempfile.gettempdir()
    return os.path.join(session, "tpufleet", "logs")


def _decode(data: bytes) -> tuple[str, int]:
    """Decode as much of ``data`` as forms whole UTF-8 characters; returns (text, bytes used)."""
    for cut in range(4):
        try:
            end = len(data) - cut
            return data[:end].decode("utf-8"), end
        except UnicodeDecodeError:
            continue
    return data.decode("utf-8", errors="replace"), len(data)


@dataclass
class _Run:
    job_id: str
    attempt: int
    layout: list[tuple[str, int]]  # every (slice, worker) of the attempt, so any survivor knows it
    log: Path
    proc: subprocess.Popen[bytes] | None
    exit_code: int | None = None
    box: contain.Box | None = None
    scratch: Path | None = None  # removed when the run has ended
    notes: list[str] = field(default_factory=list)
    jailed: bool = False
    ended: threading.Event = field(default_factory=threading.Event)
    progress_file: Path | None = None  # where process 0's report_step writes (in the scratch)
    guard: runlimits.RunGuard | None = None  # its process and open-files limits
    pump: runlimits.LogPump | None = None  # copies its output into ``log``, up to the cap
    paths: jobfiles.RunPaths | None = None
    disk: jobfiles.DiskUsage | None = None  # the tenant directory's last measurement
    reason: str | None = None  # why the runner itself ended the run (a limit, the checkpoint quota)

    def state(self) -> tuple[str, int | None]:
        """RUNNING until the main process ended and nothing of the run is left, then EXITED."""
        return ("EXITED", self.exit_code) if self.ended.is_set() else ("RUNNING", None)

    def collect(self) -> None:
        """Take the main process's exit status (called once it has ended)."""
        assert self.proc is not None
        code = self.proc.wait()
        # bubblewrap reports a command killed by signal N as 128 + N; say -N, as subprocess does
        self.exit_code = -(code - 128) if self.jailed and 128 < code <= 128 + 64 else code


@dataclass(frozen=True)
class RunRequest:
    """What a host's runner needs to start one attempt there (crosses the actor boundary)."""

    job_id: str
    attempt: int
    tenant: str
    job_root: str  # <job_root>/<tenant>/<job> is TPUFLEET_CHECKPOINT_DIR (``jobfiles.run_paths``)
    layout: tuple[tuple[str, int], ...]  # every (slice, worker) of the attempt, so any survivor knows it
    command: tuple[str, ...]
    user_env: dict[str, str] = field(default_factory=dict)
    contract: dict[str, str] = field(default_factory=dict)  # the host contract, from the node's labels
    env: dict[str, str] = field(default_factory=dict)  # the attempt's variables (job, MEGASCALE_*, ports)
    hide: tuple[str, ...] = ()  # paths a jailed job must not see
    package: Any = None  # the uploaded zip: bytes, or an ObjectRef to them
    package_error: str | None = None
    max_unpacked: int | None = None
    limits: runlimits.RunLimits = field(default_factory=runlimits.RunLimits)
    checkpoint_quota: int | None = None  # bytes <job_root>/<tenant> may hold (serve --checkpoint-quota-gib)
    checkpoint_check_s: float = 5.0  # how often a running run measures its tenant directory


class HostRunner:
    """The actor body; see the module docstring. Use :func:`runner_class` to get the Ray actor."""

    def __init__(
        self, slice_name: str, worker_id: int, log_root: str | None = None, spare: bool = False
    ) -> None:
        self.slice_name = slice_name
        self.worker_id = worker_id
        self.log_root = log_root or _default_log_root()
        self._lock = threading.Lock()
        self._runs: OrderedDict[tuple[str, int], _Run] = OrderedDict()
        self._current: _Run | None = None
        self._cancelled: set[tuple[str, int]] = set()  # stopped before their start arrived
        self._cgroups = contain.cgroup_root()
        self._pids = runlimits.pids_base(self._cgroups)  # where runs' process limits go (or the scan)
        self._node = _node_id()
        self._jail_off = contain.jail_available()
        # ``spare``: a run's first process started ahead, so a start is a write to it (``spare.py``)
        self._spare: Spare | None = None
        self._spare_names: set[str] = set()  # the cgroups of the spare made or being made: kept by sweep
        self._spare_seq = itertools.count()
        self._want_spare: threading.Event | None = None
        if spare and os.environ.get(SPARE_ENV, "") != "off":
            self._want_spare = threading.Event()
            self._want_spare.set()
            # its own thread, for the runner's life: PR_SET_PDEATHSIG ends a spare with its forking thread
            threading.Thread(
                target=self._keep_spare, args=(self._want_spare,), name="tpufleet-spare", daemon=True
            ).start()
        devicepage.serve_from_env()  # the host's device page for the control plane: a thread in this process
        # A GCE VM's preemption and maintenance notices, relayed to the control plane through Ray's KV.
        self._notices = gcemetadata.watch_from_env(notices.publish)

    def ping(self) -> dict[str, Any]:
        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    def start(self, request: RunRequest) -> str:
        """Start the attempt's command on this host (see :class:`RunRequest`)."""
        key = (request.job_id, int(request.attempt))
        if request.package is not None and not isinstance(request.package, bytes):
            try:  # an ObjectRef the executor put in the object store; fetched before taking the lock
                request = replace(request, package=ray.get(request.package, timeout=300))
            except Exception as exc:
                request = replace(request, package=None, package_error=f"{type(exc).__name__}: {exc}")
        first = _measure_first(request)  # before the lock: a large tenant directory takes a while
        with self._lock:
            if key in self._runs:
                return self._runs[key].state()[0]  # idempotent: a retried launch
            if key in self._cancelled:
                return "EXITED"
            if self._current is not None and self._current.state()[0] == "RUNNING":
                raise RuntimeError(
                    f"host {self.slice_name}/{self.worker_id} still runs {self._current.job_id}"
                    f"/{self._current.attempt}; stop it before launching {key[0]}/{key[1]}"
                )
            run = _Run(key[0], key[1], [(str(a), int(b)) for a, b in request.layout], self._log(*key), None)
            run.disk = first
            self._remember(key, run)
            self._current = run
            try:
                self._launch(run, request)
            except Exception as exc:  # whatever the request holds, the run ends with a reason
                self._cannot_start(run, f"{type(exc).__name__}: {exc}")
            return run.state()[0]

    def sweep(self) -> int:
        """Kill and remove what runs of this host left behind when their runner died (cgroups of
        runs this runner does not know). The executor calls it on each runner of a slice it
        reserves, and a launch on a slice it had not reserved sends its start calls right after.

        Under the lock throughout: the calls of this threaded actor run side by side, and a start
        that registered its run and made the run's cgroups between the sweep's reading of what to
        keep and its listing of the cgroups had its new process killed as a dead runner's."""
        with self._lock:
            keep = {r.box.cgroup.name for r in self._runs.values() if r.box and r.box.cgroup}
            keep |= {r.guard.pids_dir.name for r in self._runs.values() if r.guard and r.guard.pids_dir}
            keep |= self._spare_names
            return self._remove_unknown(keep)

    def _remove_unknown(self, keep: set[str]) -> int:
        """Kill and remove this host's run cgroups (v2, and the v1 pids directories) not in ``keep``;
        the caller holds the lock."""
        removed = contain.sweep(self._cgroups, self._cgroup_prefix(), keep)
        if self._pids is not None and not self._pids.shared:
            contain.sweep(self._pids.path, self._cgroup_prefix(), keep)
        return removed

    def _cgroup_prefix(self) -> str:
        """This host's runs: its Ray node (slice names repeat across fleets on one machine), slice
        and worker."""
        return contain.cgroup_name(self._node, self.slice_name, self.worker_id) + "."

    def _launch(self, run: _Run, request: RunRequest) -> None:
        if not os.path.isabs(request.job_root or ""):
            raise ValueError(f"the attempt names no absolute job root (got {request.job_root!r})")
        env = self._env(request)
        host = f"{self.slice_name}-{self.worker_id}"
        paths = jobfiles.run_paths(request.job_root, request.tenant, run.job_id, run.attempt, host)
        jobfiles.prepare_tenant_dir(paths)
        run.scratch, run.paths = paths.run, paths
        run.disk = run.disk or jobfiles.measure(paths.tenant)
        run.reason = jobfiles.quota_problem(request.tenant, run.disk, request.checkpoint_quota)
        if run.reason is not None:
            raise jobfiles.JobFilesError(run.reason)
        env.update(HOME=str(paths.home), TMPDIR="/tmp", TPUFLEET_CHECKPOINT_DIR=str(paths.checkpoint))
        run.progress_file = paths.run / PROGRESS_FILE  # the job's report_step writes it (scratch)
        env[PROGRESS_VAR] = str(run.progress_file)
        if request.package_error:
            raise RuntimeError(f"the package could not be fetched: {request.package_error}")
        package = request.package
        spec = {
            "tenant": str(paths.tenant),
            "checkpoint": str(paths.checkpoint),
            "run": str(paths.run),
            "workdir": str(paths.workdir),
            "home": str(paths.home),
            "package": package is not None,
            "max_unpacked": request.max_unpacked,
        }
        argv = [sys.executable, "-m", "tpufleet.host.jobstart", json.dumps(spec), "--"]
        argv += [str(c) for c in request.command]
        if self._jail_off is None:
            paths.run.mkdir(mode=0o700, parents=True, exist_ok=True)
            hide = [*request.hide, str(Path(self.log_root).parent), *_secret_files()]
            argv = (
                contain.jail(
                    run=str(paths.run),
                    workdir=str(paths.tenant),
                    tenant_dir=str(paths.tenant),
                    job_root=str(paths.tenant.parent),
                    hide=hide,
                    expose=_python_dirs(),
                )
                + argv
            )
            run.jailed = True
        else:
            run.notes.append(f"tpufleet: this job is not isolated from other tenants: {self._jail_off}")
        with open(run.log, "ab") as out:
            for note in run.notes:
                out.write(f"{note}\n".encode())
        if not self._from_spare(run, argv, env, request.limits, package is not None):
            name = contain.cgroup_name(self._node, self.slice_name, self.worker_id, run.job_id, run.attempt)
            run.box = contain.Box(name, self._cgroups)
            run.guard = runlimits.RunGuard(name, request.limits, self._pids, run.box.cgroup)
            run.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if package is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,  # copied into the log up to the cap (``runlimits.LogPump``)
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_both(run.guard.preexec(), run.box.preexec()),
            )
        assert run.box is not None and run.proc is not None
        run.box.started(run.proc.pid)
        assert run.proc.stdout is not None
        run.pump = runlimits.LogPump(run.proc.stdout, run.log, request.limits.log_bytes)
        if package is not None:
            threading.Thread(target=_feed, args=(run.proc, package), daemon=True).start()
        threading.Thread(target=self._reap, args=(run,), daemon=True).start()
        threading.Thread(target=self._watch_files, args=(run, request), daemon=True).start()

    # -- the spare (``spare.py``) ----------------------------------------------------------------
    def _from_spare(
        self, run: _Run, argv: list[str], env: dict[str, str], limits: runlimits.RunLimits, stdin: bool
    ) -> bool:
        """Start ``run`` in the spare (the caller holds the lock); False when there is none to
        take, or it is gone (the caller starts the run the plain way)."""
        if self._want_spare is None or self._spare is None:
            return False
        taken, self._spare = self._spare, None  # the next is made once this run ended (:meth:`_finished`)
        try:
            taken.guard.relimit(limits)
            taken.become(argv, env, runlimits.open_files_limit(limits.open_files), stdin)
        except ValueError:  # what no process can be started with: the spare is still unused
            self._spare = taken
            raise
        except OSError as exc:  # swept or killed meanwhile
            self._want_spare.set()
            log.warning(
                "the spare of %s/%s is gone (%s); starting the plain way",
                self.slice_name,
                self.worker_id,
                exc,
            )
            threading.Thread(target=self._retire, args=(taken,), daemon=True).start()
            return False
        self._spare_names.discard(taken.name)  # the run's cgroups now: kept as the run's
        run.box, run.guard, run.proc = taken.box, taken.guard, taken.proc
        return True

    def _keep_spare(self, want: threading.Event) -> None:
        """Make a spare whenever there is none (the thread of :meth:`__init__`, until :meth:`close`)."""
        while True:
            want.wait()
            want.clear()
            with self._lock:
                if self._want_spare is None:
                    return
                if self._spare is not None and self._spare.alive():
                    continue
                dead, self._spare = self._spare, None
                name = contain.cgroup_name(
                    self._node, self.slice_name, self.worker_id, "spare", os.getpid(), next(self._spare_seq)
                )
                self._spare_names.add(name)
            if dead is not None:
                self._retire(dead)
            try:
                made = self._make_spare(name)
            except Exception:  # the plain way still starts every run; the next start asks again
                log.exception("could not start a spare on %s/%s", self.slice_name, self.worker_id)
                with self._lock:
                    self._spare_names.discard(name)
                continue
            with self._lock:
                closed = self._want_spare is None
                if not closed:
                    self._spare = made
            if closed:
                self._retire(made)
                return

    def _make_spare(self, name: str) -> Spare:
        box = contain.Box(name, self._cgroups)
        guard = runlimits.RunGuard(name, runlimits.RunLimits(), self._pids, box.cgroup)
        try:
            return Spare(name, box, guard, _both(guard.preexec(limit_files=False), box.preexec()))
        except BaseException:
            box.close()
            guard.close()
            raise

    def _retire(self, unused: Spare) -> None:
        unused.retire()
        with self._lock:
            self._spare_names.discard(unused.name)

    def close(self) -> None:
        """End the spare (a runner that is going away; its runs are left as they are)."""
        with self._lock:
            unused, self._spare = self._spare, None
            want, self._want_spare = self._want_spare, None
        if want is not None:
            want.set()
        if unused is not None:
            self._retire(unused)

    @staticmethod
    def _check_files(run: _Run, request: RunRequest) -> None:
        """Measure the run's tenant directory; over the quota, say why in ``run.reason``."""
        assert run.paths is not None
        run.disk = jobfiles.measure(run.paths.tenant)
        run.reason = run.reason or jobfiles.quota_problem(request.tenant, run.disk, request.checkpoint_quota)

    def _watch_files(self, run: _Run, request: RunRequest) -> None:
        """Measure every ``checkpoint_check_s`` while the run goes on; end it once over its quota."""
        while not run.ended.wait(max(request.checkpoint_check_s, 0.05)):
            self._check_files(run, request)
            if run.reason is not None and run.box is not None and not run.ended.is_set():
                with contextlib.suppress(OSError), open(run.log, "ab") as out:
                    out.write(f"tpufleet: ending this job: {run.reason}\n".encode())
                # SIGTERM, then SIGKILL unless the run ended meanwhile (``_reap`` then killed and
                # closed its cgroup: nothing of it is touched again, whatever takes its name next)
                run.box.signal(signal.SIGTERM)
                if not run.ended.wait(QUOTA_GRACE_S):
                    run.box.kill()
                return

    def _cannot_start(self, run: _Run, why: str) -> None:
        with contextlib.suppress(OSError), open(run.log, "ab") as out:
            out.write(f"tpufleet: cannot start this job: {why}\n".encode())
        if run.proc is not None:
            if run.box is not None:
                run.box.kill()
            run.proc.wait()
        run.exit_code = CANNOT_START
        self._finished(run)

    def _log(self, job_id: str, attempt: int) -> Path:
        path = log_path(self.log_root, job_id, attempt, self.slice_name, self.worker_id)
        for parent in (path.parent.parent.parent, path.parent.parent, path.parent):
            parent.mkdir(mode=0o700, exist_ok=True, parents=True)
        if not path.exists():
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        return path

    def _remember(self, key: tuple[str, int], run: _Run) -> None:
        self._runs[key] = run
        while len(self._runs) > _HISTORY:
            self._runs.popitem(last=False)

    @staticmethod
    def _env(request: RunRequest) -> dict[str, str]:
        """``contract.process_env`` over the raylet's environment, less secrets and Ray's chip masks."""
        base = {k: v for k, v in os.environ.items() if not _SECRET_ENV.search(k) and k not in _RAY_TPU_MASKS}
        base.setdefault("PYTHONUNBUFFERED", "1")  # so logs can be read while the job runs
        return contract.process_env(base, dict(request.user_env), dict(request.contract), dict(request.env))

    def _reap(self, run: _Run) -> None:
        """Wait for the main process; then nothing of the run may outlive it (stragglers are killed).
        A run past one of its limits is ended at once, with the reason on its log."""
        assert run.proc is not None and run.box is not None and run.guard is not None
        while run.proc.poll() is None:
            run.box.track()
            if run.guard.check(run.box.pids, time.monotonic()) is not None:
                break
            try:
                run.proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                continue
        run.box.kill()
        if run.pump is not None:
            run.pump.finish()
        if (why := run.guard.final()) is not None:
            run.reason = run.reason or why
            with contextlib.suppress(OSError), open(run.log, "ab") as out:
                out.write(f"tpufleet: {why}: the run was ended\n".encode())
        with self._lock:
            run.collect()
            self._finished(run)

    def _finished(self, run: _Run) -> None:
        if run.box is not None:
            run.box.close()
        if run.guard is not None:
            run.guard.close()
        last = read_progress(run.progress_file) if run.progress_file is not None else None
        if last is not None:  # kept beside the log: the scratch (and the job's file) goes next
            run.log.with_suffix(".progress").write_text(json.dumps(last.to_dict()))
        if run.scratch is not None:
            shutil.rmtree(run.scratch, ignore_errors=True)
        if run.paths is not None:
            jobfiles.remove_run_dirs(run.paths)
        if run.reason is not None:  # before .exit: whoever sees the exit code finds the reason
            with contextlib.suppress(OSError):  # a reason that cannot be kept never leaves it RUNNING
                run.log.with_suffix(".reason").write_text(run.reason)
        run.log.with_suffix(".exit").write_text(str(run.exit_code))
        run.ended.set()
        if self._want_spare is not None:  # the next run's, made now: a start is no time to fork
            self._want_spare.set()

    def status(self, job_id: str, attempt: int) -> tuple[str, int | None]:
        """("RUNNING" | "EXITED", exit code) of the attempt here, or ("UNKNOWN", None)."""
        with self._lock:
            run = self._runs.get((job_id, attempt))
            if run is None:
                return self._status_from_disk(job_id, attempt)
            return run.state()

    def report(self, job_id: str, attempt: int) -> dict[str, Any]:
        """``status`` with what else the control plane needs of the run: why the runner ended it
        (``reason``, or None) and the tenant directory's last measurement (``disk``, or None)."""
        with self._lock:
            run = self._runs.get((job_id, attempt))
            state, code = run.state() if run is not None else self._status_from_disk(job_id, attempt)
        reason = run.reason if run is not None else None
        if run is None and state == "EXITED":
            with contextlib.suppress(OSError):
                reason = self._log(job_id, attempt).with_suffix(".reason").read_text()[:2000] or None
        disk = run.disk.to_dict() if run is not None and run.disk is not None else None
        return {"state": state, "code": code, "reason": reason, "disk": disk}

    def remove_job_files(self, job_root: str, tenant: str, job_ids: list[str]) -> dict[str, Any]:
        """Remove finished jobs' checkpoint directories (``<job_root>/<tenant>/<job>``) for the
        control plane's retention rule, never the one of a job this host runs; returns the bytes
        each held (``removed``) and the tenant directory's size after (``disk``)."""
        if not os.path.isabs(job_root or ""):
            raise ValueError(f"no absolute job root (got {job_root!r})")
        with self._lock:
            busy = [r.job_id for r in self._runs.values() if not r.ended.is_set()]
        removed = jobfiles.remove_jobs(job_root, tenant, job_ids, busy)
        disk = jobfiles.measure(jobfiles.run_paths(job_root, tenant, "-", 0, "-").tenant)
        return {"removed": removed, "disk": disk.to_dict()}

    def _status_from_disk(self, job_id: str, attempt: int) -> tuple[str, int | None]:
        exit_file = self._log(job_id, attempt).with_suffix(".exit")
        if exit_file.exists():
            return "EXITED", int(exit_file.read_text() or 1)
        return "UNKNOWN", None

    def progress(self, job_id: str, attempt: int) -> dict[str, Any] | None:
        """The steps the attempt's process 0 reported here (``runtime.report_step``), or None."""
        with self._lock:
            run = self._runs.get((job_id, attempt))
            live = run is not None and not run.ended.is_set() and run.progress_file is not None
            path = run.progress_file if live and run is not None else None
        if path is None:  # ended (or another runner's): what was kept beside its log
            path = self._log(job_id, attempt).with_suffix(".progress")
        found = read_progress(path)
        return found.to_dict() if found is not None else None

    def assignments(self) -> list[dict[str, Any]]:
        """Every attempt this runner knows, with its layout and state (for a restarted control plane)."""
        with self._lock:
            rows = []
            for (job_id, attempt), run in self._runs.items():
                state, code = run.state()
                row = {"job_id": job_id, "attempt": attempt, "layout": run.layout, "state": state}
                rows.append({**row, "code": code, "current": run is self._current})
            return rows

    def stop(self, job_id: str, attempt: int, grace_s: float) -> int | None:
        """SIGTERM every process of the run, wait up to ``grace_s``, then SIGKILL what is left;
        returns the exit code. Reaches processes that left the job's process group or session."""
        with self._lock:
            run = self._runs.get((job_id, attempt))
            if run is None:
                self._cancelled.add((job_id, attempt))
                return None
            if run is self._current:
                self._current = None
        if run.proc is None or run.box is None:
            return run.exit_code
        run.box.end(grace_s)
        run.ended.wait(timeout=30)
        with self._lock:
            return run.state()[1]

    def read_log(self, job_id: str, attempt: int, offset: int, limit: int = MAX_LOG_CHUNK) -> dict[str, Any]:
        path = self._log(job_id, attempt)
        done = path.with_suffix(".exit").exists()
        if not path.exists():
            return {"data": "", "next_offset": offset, "complete": done}
        with open(path, "rb") as f:
            f.seek(offset)
            raw = f.read(limit)
            size = os.fstat(f.fileno()).st_size
        text, used = _decode(raw)
        nxt = offset + used
        return {"data": text, "next_offset": nxt, "complete": done and nxt >= size}


def read_log_task(node_id: str, log_root: str | None) -> Any:
    """A one-off task on ``node_id`` that reads a log when no runner is left on that host."""

    def read(job_id: str, attempt: int, slice_name: str, worker_id: int, offset: int) -> dict[str, Any]:
        return HostRunner(slice_name, worker_id, log_root).read_log(job_id, attempt, offset)

    strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
    return ray.remote(read).options(num_cpus=0, scheduling_strategy=strategy)


def _measure_first(request: RunRequest) -> jobfiles.DiskUsage | None:
    """The run's tenant directory measured at its start; None when the request names no usable
    one (``_launch`` then says why)."""
    if not os.path.isabs(request.job_root or ""):
        return None
    try:
        return jobfiles.measure(Path(request.job_root) / jobfiles.check_name(request.tenant))
    except jobfiles.JobFilesError:
        return None


def remove_files_task(node_id: str) -> Any:
    """A one-off task on ``node_id`` that removes finished jobs' files when no runner answers."""

    def remove(job_root: str, tenant: str, job_ids: list[str]) -> dict[str, Any]:
        return HostRunner("files", 0, None).remove_job_files(job_root, tenant, job_ids)

    strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
    return ray.remote(remove).options(num_cpus=0, scheduling_strategy=strategy)


def _node_id() -> str:
    """A short id of the Ray node this runner lives on ("local" outside Ray, as in unit tests)."""
    try:
        return str(ray.get_runtime_context().get_node_id())[:12] if ray.is_initialized() else "local"
    except Exception:
        return "local"


def _both(first: Callable[[], None], then: Callable[[], None]) -> Callable[[], None]:
    def child() -> None:
        first()
        then()

    return child


def _feed(proc: subprocess.Popen[bytes], data: bytes) -> None:
    """Hand the package to ``jobstart`` on its standard input."""
    assert proc.stdin is not None
    with contextlib.suppress(OSError), proc.stdin:
        proc.stdin.write(data)


@functools.cache
def _python_dirs() -> list[str]:
    """What every job runs on: this Python (its prefix, the interpreter's own directories, its
    packages) and tpufleet itself (``jobstart``). Shown read-only in a jail that would hide them
    (a checkout or virtual environment under ``/tmp``, say); never anything a job names."""
    import sysconfig

    import tpufleet

    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    dirs |= {
        v for k, v in sysconfig.get_paths().items() if k in ("stdlib", "platstdlib", "purelib", "platlib")
    }
    dirs.add(str(Path(tpufleet.__file__).resolve().parent.parent))
    return sorted(d for d in dirs if d and os.path.isabs(d))


def _secret_files() -> list[str]:
    """Files named by the runner's environment that hold credentials (hidden from jailed jobs)."""
    return [v for k, v in os.environ.items() if _SECRET_ENV.search(k) and os.path.isabs(v)]


_remote: Any = ray.remote
RemoteRunner: Any = _remote(num_cpus=0, max_restarts=0, max_concurrency=8)(HostRunner)
