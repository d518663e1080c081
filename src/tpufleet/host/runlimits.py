"""What one run may use of its host: processes, open files, and the runner's own copy of its output.

The operator sets the limits (``tpufleet serve --job-process-limit``, ``--job-open-files-limit``,
``--max-log-mb``); they reach each host's runner in the attempt's ``RunRequest`` as :class:`RunLimits`.
On real hardware a host runs one run at a time, so a run's limit is its host's limit; on the
emulator every host of the fleet is the same machine.

- **Processes** (:class:`RunGuard`). ``pids.max`` counts tasks: every process *and thread*. The run
  gets a ``pids`` cgroup where the host has one: the run's own cgroup v2 (``contain.Box``) when the
  ``pids`` controller is enabled for the ``tpufleet`` subtree (``+pids`` is written to
  ``cgroup.subtree_control`` where the kernel allows it), else its own directory
  ``<mount>/tpufleet/<run>`` of the cgroup v1 ``pids`` hierarchy, joined between fork and exec like
  the v2 one and removed when the run ends. A fork past the limit fails (``EAGAIN``); the runner,
  which reads ``pids.events`` five times a second, then ends the whole run at once (SIGKILL, no grace:
  a run that hit its limit must not keep the host's PIDs) with the reason on the job and its log.
  The ``tpufleet`` directory itself gets a ceiling for all runs together (three quarters of the
  kernel's ``pid_max``, unless the operator set one), so runs of many emulated hosts on one machine
  never take the last PIDs from the runner, Ray or ``serve``. Where no ``pids`` hierarchy is
  writable, the runner's scan counts the run's tasks instead and ends the run past the limit; a fast
  fork loop can overshoot between two scans (0.2 s), so use cgroups.
- **Open files.** ``RLIMIT_NOFILE`` per process stays as the host has it, lowered to the per-run
  limit where that is smaller; the per-run total (entries of ``/proc/<pid>/fd`` over the run's
  processes) is counted by the runner's scan about once a second, and past it the run ends the same
  way.
- **The runner's copy of the output** (:class:`LogPump`). A job's stdout and stderr are a pipe the
  runner copies into the host's log file up to the stored cap, then one line saying it was
  truncated; it goes on reading and discarding, so the job never blocks on its output.

Plain Linux (``/proc``, cgroupfs, ``setrlimit``); nothing imports Ray.
"""

from __future__ import annotations

import contextlib
import os
import resource
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tpufleet.host.contain import CGROUP_DIR, join_cgroup, mounts

# 8192 tasks per host: a JAX process on a large TPU host starts some hundreds of threads (XLA's and
# Eigen's pools sized to its ~200 cores, gRPC, the TPU runtime), data loaders add tens of processes
# with their own threads: a few thousand at most, so twice that is head-room; and a quarter of this
# machine's pid_max (32,768), so a few runs at their limit still leave the host PIDs to spare.
DEFAULT_PROCESSES = 8192
# 65,536 open files per host: a training job holds some thousands (devices, sockets, shards); the
# per-process limit here is 20,000.
DEFAULT_OPEN_FILES = 65536
DEFAULT_LOG_BYTES = 64 << 20  # ServiceConfig.max_log_bytes: what the control plane stores per host
PIDS_ENV = "TPUFLEET_PIDS_CGROUP_ROOT"  # a pids hierarchy's tpufleet directory; "": none (the scan)
SCAN_FILES_S = 1.0
_READ = 1 << 16

PROCESS_REASON = (
    "the job exceeded its process limit ({n} processes and threads per host; serve --job-process-limit)"
)
FILES_REASON = "the job exceeded its open-files limit ({n} open files per host; serve --job-open-files-limit)"


def truncation_marker(cap: int) -> str:
    """The line the runner writes where it stops keeping a host's output; worded as the control
    plane's own marker (``logs.append``), which counts characters where the runner counts bytes."""
    return f"\n[tpufleet: output truncated at {cap} bytes (the per-host log cap)]\n"


@dataclass(frozen=True)
class RunLimits:
    """What one run may use of its host (crosses the actor boundary in ``RunRequest``)."""

    processes: int = DEFAULT_PROCESSES  # tasks (processes and threads) at once
    open_files: int = DEFAULT_OPEN_FILES  # open file descriptors over all of the run's processes
    log_bytes: int = DEFAULT_LOG_BYTES  # the runner's copy of the run's output


@dataclass(frozen=True)
class PidsBase:
    """The ``tpufleet`` directory of a hierarchy with the ``pids`` controller."""

    path: Path
    shared: bool  # cgroup v2: the runs' own cgroups (``contain.Box``) live here and hold pids.max


def pids_base(cgroup_root: Path | None) -> PidsBase | None:
    """Where runs' process limits go on this host (see the module docstring), or None (the scan).
    ``cgroup_root`` is the runs' cgroup v2 directory (``contain.cgroup_root``)."""
    override = os.environ.get(PIDS_ENV)
    if override is not None:
        if not override:
            return None
        path = Path(override)
        return _ready(PidsBase(path, cgroup_root is not None and path == cgroup_root))
    if cgroup_root is not None and _v2_pids(cgroup_root):
        return _ready(PidsBase(cgroup_root, True))
    for mount in _v1_pids_mounts():
        base = mount / CGROUP_DIR
        with contextlib.suppress(OSError):
            base.mkdir(exist_ok=True)
            if (base / "pids.max").exists() and os.access(base / "cgroup.procs", os.W_OK):
                return _ready(PidsBase(base, False))
    return None


def _v2_pids(root: Path) -> bool:
    """Whether the runs' cgroups under ``root`` get ``pids.max``, enabling it where possible."""

    def enabled(p: Path) -> bool:
        return "pids" in (p / "cgroup.subtree_control").read_text().split()

    try:
        if not enabled(root):
            if not enabled(root.parent):  # the kernel refuses where the parent holds processes
                (root.parent / "cgroup.subtree_control").write_text("+pids")
            (root / "cgroup.subtree_control").write_text("+pids")
        return enabled(root)
    except OSError:
        return False


def _v1_pids_mounts() -> list[Path]:
    return [path for path, options in mounts("cgroup") if "pids" in options]


def _ready(base: PidsBase) -> PidsBase | None:
    """The ceiling for all runs together: 3/4 of pid_max, unless one is set already."""
    try:
        base.path.mkdir(exist_ok=True)
        limit = base.path / "pids.max"
        if limit.read_text().strip() == "max":
            pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
            limit.write_text(str(pid_max * 3 // 4))
    except (OSError, ValueError):
        return None
    return base


def open_files_limit(files: int) -> tuple[int, int] | None:
    """The RLIMIT_NOFILE (soft, hard) a run gets under a limit of ``files``: this process's, which a
    child inherits, lowered; None when it is no higher already."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= files:
        return None
    return (soft if soft != resource.RLIM_INFINITY and soft < files else files, files)


class RunGuard:
    """The limits of one run on its host: made before the run starts, checked by the runner's scan."""

    def __init__(self, name: str, limits: RunLimits, base: PidsBase | None, cgroup: Path | None) -> None:
        self.limits = limits
        self.reason: str | None = None
        self.pids_dir: Path | None = None
        self._own = False  # a v1 directory of our own, joined in preexec and removed in close
        self._files_due = 0.0
        if base is not None:
            shared = base.shared and cgroup is not None and cgroup.parent == base.path
            path = cgroup if shared and cgroup is not None else base.path / name
            try:
                path.mkdir(exist_ok=True)
                (path / "pids.max").write_text(str(limits.processes))
                self.pids_dir, self._own = path, not shared
            except OSError:  # a hierarchy we cannot write after all: the scan holds the limit
                if not shared:
                    with contextlib.suppress(OSError):
                        path.rmdir()
        self._failures0 = self._fork_failures()

    def preexec(self, limit_files: bool = True) -> Callable[[], None]:
        """Between fork and exec: join the v1 pids cgroup, lower RLIMIT_NOFILE to the run's limit
        (``limit_files``; a spare lowers it itself once it knows the run, ``spare.py``). Only system
        calls: it runs in a forked child of a threaded process."""
        procs = str(self.pids_dir / "cgroup.procs") if self._own and self.pids_dir else None
        nofile = open_files_limit(self.limits.open_files) if limit_files else None

        def child() -> None:
            if procs is not None:
                join_cgroup(procs)
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, nofile)

        return child

    def relimit(self, limits: RunLimits) -> None:
        """Give a guard made before its run was known (a spare's, ``spare.py``) the run's limits;
        ``OSError`` when its process limit cannot be written (the run then starts the plain way)."""
        if self.pids_dir is not None:
            (self.pids_dir / "pids.max").write_text(str(limits.processes))
        self.limits = limits

    def check(self, members: Callable[[], list[int]], now: float) -> str | None:
        """Why the run must end now (a limit it went past), or None; ``members`` lists its live
        processes. Cheap: one small read with a pids cgroup, the run's fds about once a second."""
        if self.reason is None:
            if self.pids_dir is not None:
                self._check_pids()
            elif _tasks(members()) > self.limits.processes:
                self.reason = PROCESS_REASON.format(n=self.limits.processes)
        if self.reason is None and now >= self._files_due:
            self._files_due = now + SCAN_FILES_S
            if _open_files(members()) > self.limits.open_files:
                self.reason = FILES_REASON.format(n=self.limits.open_files)
        return self.reason

    def final(self) -> str | None:
        """Once the run has ended: whether it hit its process limit after the last scan."""
        if self.reason is None and self.pids_dir is not None:
            self._check_pids()
        return self.reason

    def _check_pids(self) -> None:
        """A refused fork counts in ``pids.events``; it is the run's own limit (and not the ceiling
        of all runs together, which the run did not cause) when the run reached it (``pids.peak``)."""
        if self._fork_failures() <= self._failures0:
            return
        peak = _read_int(self.pids_dir / "pids.peak") if self.pids_dir else None
        if peak is None or peak >= self.limits.processes:
            self.reason = PROCESS_REASON.format(n=self.limits.processes)

    def _fork_failures(self) -> int:
        if self.pids_dir is None:
            return 0
        try:
            for line in (self.pids_dir / "pids.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "max":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def close(self) -> None:
        """Remove the run's own v1 directory once its processes are gone."""
        if not self._own or self.pids_dir is None:
            return
        for _ in range(50):
            try:
                self.pids_dir.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.02)  # zombies not yet reaped still count as members


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _tasks(pids: list[int]) -> int:
    """Processes and threads (``num_threads`` of /proc/<pid>/stat) of ``pids``."""
    total = 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[17])
        except (OSError, IndexError, ValueError):
            continue
    return total


def _open_files(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += len(os.listdir(f"/proc/{pid}/fd"))
    return total


class LogPump:
    """Copies a run's output from its pipe into the host's log file, up to ``cap`` bytes of the
    file, then one truncation line; past it, reads and discards, so the job never blocks."""

    def __init__(self, source: IO[bytes], log: Path, cap: int) -> None:
        self._source = source
        self._out = open(log, "ab", buffering=0)  # noqa: SIM115 (closed by the pump's thread)
        self._written = os.fstat(self._out.fileno()).st_size  # the runner's notes count too
        self.cap = cap
        self.truncated = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tpufleet-log", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        fd = self._source.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP)
        try:
            while not self._stop.is_set():
                if not poller.poll(200):
                    continue
                chunk = os.read(fd, _READ)
                if not chunk:
                    return  # every writer is gone
                self._keep(chunk)
        except OSError:
            return
        finally:
            with contextlib.suppress(OSError):
                self._source.close()
            with contextlib.suppress(OSError):
                self._out.close()

    def _keep(self, chunk: bytes) -> None:
        room = self.cap - self._written
        if room > 0:
            self._out.write(chunk[:room])
            self._written += min(room, len(chunk))
        if len(chunk) > room and not self.truncated:
            self.truncated = True
            self._out.write(truncation_marker(self.cap).encode())

    def finish(self, timeout_s: float = 5.0) -> None:
        """Wait until the pipe is drained (every writer ended); a writer that escaped the run and
        keeps it open is no reason to wait longer than ``timeout_s``."""
        self._thread.join(timeout_s)
        self._stop.set()
        self._thread.join(1.0)
