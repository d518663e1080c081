"""The runner: one named, detached Ray actor per TPU host that runs a job's command as a subprocess.

A runner is placed in its host's bundle of the slice's placement group and asks for nothing itself
(``num_cpus=0``, no ``TPU``): the bundle holds ``TPU: chips_per_host`` in Ray's accounting and the
user's process, started outside Ray's worker pool, owns every chip of the host. Ray would otherwise
set ``TPU_VISIBLE_CHIPS`` for the actor (and, on the emulator, a partial mask), and an idle runner
that claimed the chips would hide them from anything else scheduled into the bundle.

The process runs in its own session (process group) so ``stop`` reaches every child it forks, with
``PR_SET_PDEATHSIG`` so it dies with the runner, as processes die with a crashed TPU VM. Output
(stdout and stderr interleaved) goes to ``<log_root>/<job>/<attempt>/<slice>-<worker>.log`` on the
host's disk; the exit code is written next to it (``.exit``), so logs and results outlive the
attempt and can be read through any later runner of the same host.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from tpufleet.contract import HOST_VARS

NAMESPACE = "tpufleet"
MAX_LOG_CHUNK = 1 << 20
_HISTORY = 256
# Ray sets these for a worker that holds part of a host's chips; the user process owns the whole host.
_RAY_TPU_MASKS = ("TPU_VISIBLE_CHIPS", "TPU_CHIPS_PER_HOST_BOUNDS", "TPU_HOST_BOUNDS")
_PR_SET_PDEATHSIG = 1


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


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


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

    def state(self) -> tuple[str, int | None]:
        if self.proc is not None and self.exit_code is None:
            code = self.proc.poll()
            if code is None:
                return "RUNNING", None
            self.exit_code = code
        return "EXITED", self.exit_code


class HostRunner:
    """The actor body; see the module docstring. Use :func:`runner_class` to get the Ray actor."""

    def __init__(self, slice_name: str, worker_id: int, log_root: str | None = None) -> None:
        self.slice_name = slice_name
        self.worker_id = worker_id
        self.log_root = log_root or _default_log_root()
        self._lock = threading.Lock()
        self._runs: OrderedDict[tuple[str, int], _Run] = OrderedDict()
        self._current: _Run | None = None
        self._cancelled: set[tuple[str, int]] = set()  # stopped before their start arrived

    def ping(self) -> dict[str, Any]:
        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    def start(self, payload: dict[str, Any]) -> str:
        """Start the attempt's command; ``payload`` has job_id, attempt, layout, command, env, defaults."""
        key = (payload["job_id"], int(payload["attempt"]))
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
            run = _Run(key[0], key[1], [tuple(x) for x in payload["layout"]], self._log(*key), None)
            self._remember(key, run)
            run.proc, run.exit_code = self._spawn(run.log, list(payload["command"]), self._env(payload))
            if run.exit_code is not None:
                self._write_exit(run)
            else:
                threading.Thread(target=self._reap, args=(run,), daemon=True).start()
            self._current = run
            return run.state()[0]

    def _log(self, job_id: str, attempt: int) -> Path:
        path = log_path(self.log_root, job_id, attempt, self.slice_name, self.worker_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def _remember(self, key: tuple[str, int], run: _Run) -> None:
        self._runs[key] = run
        while len(self._runs) > _HISTORY:
            self._runs.popitem(last=False)

    @staticmethod
    def _env(payload: dict[str, Any]) -> dict[str, str]:
        env = dict(os.environ)  # the raylet's: the host's own TPU_* variables (and the emulator's)
        for var in _RAY_TPU_MASKS:
            env.pop(var, None)
        host = {**payload.get("defaults", {}), **{k: env[k] for k in HOST_VARS if env.get(k)}}
        env.setdefault("PYTHONUNBUFFERED", "1")  # so logs can be read while the job runs
        env.update(payload.get("user_env", {}))
        env.update(host)  # the host's contract (from node labels where the host lacks it) ...
        env.update(payload.get("env", {}))  # ... and the attempt's win over the user's env
        return env

    @staticmethod
    def _spawn(
        log: Path, command: list[str], env: dict[str, str]
    ) -> tuple[subprocess.Popen[bytes] | None, int | None]:
        with open(log, "ab") as out:
            try:
                proc = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
            except OSError as exc:
                out.write(f"tpufleet: cannot start {command[:1]}: {exc}\n".encode())
                return None, 127
        return proc, None

    def _reap(self, run: _Run) -> None:
        assert run.proc is not None
        run.proc.wait()
        with self._lock:
            run.state()
            self._write_exit(run)

    @staticmethod
    def _write_exit(run: _Run) -> None:
        run.log.with_suffix(".exit").write_text(str(run.exit_code))

    def status(self, job_id: str, attempt: int) -> tuple[str, int | None]:
        """("RUNNING" | "EXITED", exit code) of the attempt here, or ("UNKNOWN", None)."""
        with self._lock:
            run = self._runs.get((job_id, attempt))
            if run is None:
                return self._status_from_disk(job_id, attempt)
            return run.state()

    def _status_from_disk(self, job_id: str, attempt: int) -> tuple[str, int | None]:
        exit_file = self._log(job_id, attempt).with_suffix(".exit")
        if exit_file.exists():
            return "EXITED", int(exit_file.read_text() or 1)
        return "UNKNOWN", None

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
        """SIGTERM the process group, wait up to ``grace_s``, then SIGKILL it; returns the exit code."""
        with self._lock:
            run = self._runs.get((job_id, attempt))
            if run is None:
                self._cancelled.add((job_id, attempt))
                return None
            if run is self._current:
                self._current = None
        if run.proc is None:
            return run.exit_code
        pgid = run.proc.pid  # start_new_session: the group id is the child's pid
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + max(grace_s, 0.0)
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
        _signal_group(pgid, signal.SIGKILL)
        while _group_alive(pgid):
            time.sleep(0.01)
        with self._lock:
            run.proc.wait()
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


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _has_live_member(pgid)


def _has_live_member(pgid: int) -> bool:
    """killpg(0) also succeeds for zombies; a group whose members are all zombies has ended."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


_remote: Any = ray.remote
RemoteRunner: Any = _remote(num_cpus=0, max_restarts=0, max_concurrency=8)(HostRunner)
