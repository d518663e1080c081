"""Containment of one job's processes on one host: what they can see, and how they all end.

Everything a job does on a host is untrusted (DESIGN.md, trust boundary). The runner starts the
job's command through :class:`Box` and, where the host has bubblewrap, inside a :func:`jail`:

- **Containment.** Each run gets its own cgroup (v2, ``<mount>/tpufleet/<run>``), joined between
  fork and exec, so every process the job starts stays in it whatever it does (``setsid``, double
  forks, leaving its process group): ending the run signals every member and finally writes
  ``cgroup.kill``. Where no writable cgroup v2 hierarchy exists, the runner falls back to tracking
  descendants: the main process's session and every process seen descending from it (scanned
  while it runs) are signalled; a process that leaves both between two scans can escape (the
  docs say so). Inside a jail the job is also in its own PID namespace, which dies with it.
- **Isolation.** A jail (``bwrap``) gives the job a read-only view of the host's filesystem with
  its own ``/tmp`` (on disk, in the run's scratch), its own ``/proc`` and ``/dev``, no Linux
  capabilities, and only its own tenant's directory of the job root: other tenants' checkpoints,
  the control plane's and the emulator's state directories, Ray's session directories (other
  jobs' logs, Ray's sockets) and any path the control plane names are hidden behind empty mounts.
  Without bubblewrap (or when the runner is not root) the job runs unjailed and its log says so.
- **Death with the runner.** ``PR_SET_PDEATHSIG`` ends the main process (and with it a jail's
  whole PID namespace) when its runner dies, as processes die with a crashed TPU VM; a new runner
  on the host kills and removes cgroups left by runs it does not know (``sweep``).

Why not a uid per tenant: the runner's Python (the one jobs use too) may live where other users
cannot reach it (on this project's machines it sits under ``/root``, mode 0700), so a job switched
to another uid could not start at all; a jail hides what the job must not see whoever it runs as.

Everything here is plain Linux (``/proc``, cgroupfs, ``prctl``, bubblewrap); nothing imports Ray.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1
CGROUP_DIR = "tpufleet"


def cgroup_root() -> Path | None:
    """The writable ``tpufleet`` directory of a cgroup v2 hierarchy, or None when there is none."""
    override = os.environ.get("TPUFLEET_CGROUP_ROOT")
    if override is not None:
        return Path(override) if override else None
    for mount in _cgroup2_mounts():
        base = mount / CGROUP_DIR
        try:
            base.mkdir(exist_ok=True)
        except OSError:
            continue
        if os.access(base / "cgroup.procs", os.W_OK):
            return base
    return None


def _cgroup2_mounts() -> list[Path]:
    return [path for path, _options in mounts("cgroup2")]


def mounts(fstype: str) -> list[tuple[Path, list[str]]]:
    """Where filesystems of ``fstype`` are mounted (``/proc/self/mountinfo``), each with its super
    options (for cgroup v1, the controllers: ``["rw", "pids"]``)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        left, _, right = line.partition(" - ")
        kind, _, rest = right.partition(" ")
        if kind == fstype:
            found.append((Path(left.split()[4]), rest.split(" ")[-1].split(",")))
    return found


def cgroup_name(*parts: str | int) -> str:
    return ".".join(re.sub(r"[^A-Za-z0-9_-]", "_", str(p)) for p in parts)


class Box:
    """The processes of one run: the main process and everything it starts."""

    def __init__(self, name: str, root: Path | None) -> None:
        self.cgroup: Path | None = None
        if root is not None:
            path = root / name
            with contextlib.suppress(FileExistsError):
                path.mkdir()
            self.cgroup = path
        self.main_pid: int | None = None
        self._seen: dict[int, float] = {}  # fallback tracking: pid -> start time

    def preexec(self) -> Callable[[], None]:
        """What the child does between fork and exec: join the cgroup, then ask to die with the
        runner. Only system calls: it runs in a forked child of a threaded process."""
        procs = str(self.cgroup / "cgroup.procs") if self.cgroup is not None else None

        def child() -> None:
            if procs is not None:
                join_cgroup(procs)
            os.umask(0o077)
            with contextlib.suppress(Exception):
                ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

        return child

    def started(self, pid: int) -> None:
        self.main_pid = pid
        self.track()

    # -- members -----------------------------------------------------------------------------
    def pids(self) -> list[int]:
        """Every live (non-zombie) process of the run."""
        if self.cgroup is not None:
            try:
                listed = [int(p) for p in (self.cgroup / "cgroup.procs").read_text().split()]
            except OSError:
                listed = []
            return [p for p in listed if _state(p) not in (None, "Z")]
        self.track()
        return [p for p, start in self._seen.items() if _start_time(p) == start and _state(p) != "Z"]

    def track(self) -> None:
        """Fallback only: remember the main process's session and descendants as they appear."""
        if self.cgroup is not None or self.main_pid is None:
            return
        for pid, (ppid, sid) in _process_table().items():
            if pid in self._seen:
                continue
            if sid == self.main_pid or pid == self.main_pid or ppid in self._seen:
                start = _start_time(pid)
                if start is not None:
                    self._seen[pid] = start
        # a second pass catches children listed before their parents
        for pid, (ppid, _sid) in _process_table().items():
            if pid not in self._seen and ppid in self._seen:
                start = _start_time(pid)
                if start is not None:
                    self._seen[pid] = start

    def alive(self) -> bool:
        return bool(self.pids())

    def signal(self, sig: int) -> None:
        """Signal every process of the run. SIGTERM skips bubblewrap's own processes: the job gets
        the checkpoint signal and its jail ends when it does (a jail ended first would SIGKILL it)."""
        for pid in self.pids():
            if sig != signal.SIGKILL and _exe_name(pid) == "bwrap":
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def kill(self, timeout_s: float = 10.0) -> None:
        """SIGKILL every process of the run and wait until none is left (zombies excepted).

        A killed process leaves ``cgroup.procs`` a moment before it becomes a zombie, so an empty
        cgroup alone does not mean it is gone: every process seen here is waited for by its pid
        (and start time, against reuse) as well."""
        deadline = time.monotonic() + timeout_s
        members: dict[int, float | None] = {}
        while True:
            for pid in self.pids():
                members.setdefault(pid, _start_time(pid))
            if self.cgroup is not None and (self.cgroup / "cgroup.kill").exists():
                with contextlib.suppress(OSError):
                    (self.cgroup / "cgroup.kill").write_text("1")
            self.signal(signal.SIGKILL)
            if time.monotonic() > deadline:
                return
            if not self.alive() and not any(_running(p, t) for p, t in members.items()):
                return
            time.sleep(0.02)

    def end(self, grace_s: float) -> None:
        """SIGTERM every process (the checkpoint signal), wait up to ``grace_s``, then SIGKILL."""
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + max(grace_s, 0.0)
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.kill()

    def close(self) -> None:
        """Remove the run's cgroup once its processes are gone."""
        if self.cgroup is not None:
            for _ in range(50):
                try:
                    self.cgroup.rmdir()
                    return
                except FileNotFoundError:
                    return
                except OSError:
                    time.sleep(0.02)  # zombies not yet reaped still count as members


def join_cgroup(procs: str) -> None:
    """Move the calling process into the cgroup whose ``cgroup.procs`` file is ``procs`` (v1 or v2).
    Only system calls: callers run it between fork and exec."""
    fd = os.open(procs, os.O_WRONLY)
    try:
        os.write(fd, b"0")
    finally:
        os.close(fd)


def jail_available() -> str | None:
    """Why jobs on this host cannot be jailed, or None when they can."""
    if os.environ.get("TPUFLEET_JAIL", "") == "off":
        return "TPUFLEET_JAIL=off"
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    if os.geteuid() != 0:
        return "the runner is not root"
    return None


def jail(
    *,
    run: str,
    workdir: str,
    tenant_dir: str,
    job_root: str,
    hide: Sequence[str],
    expose: Sequence[str] = (),
) -> list[str]:
    """The bubblewrap command line that runs what follows it in a jail (see the module docstring).

    ``tenant_dir`` (under ``job_root``) is the only part of the job root the job sees, read-write;
    ``run`` is the run's scratch (its ``tmp`` becomes ``/tmp``); ``hide`` lists paths replaced by
    empty directories; ``expose`` lists directories shown again, read-only, where a hidden path
    covers them (the host's Python and tpufleet itself, which every job runs on)."""
    tmp = os.path.join(run, "tmp")
    os.makedirs(tmp, mode=0o700, exist_ok=True)
    argv = ["bwrap", "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc"]
    argv += ["--unshare-uts", "--unshare-cgroup-try", "--cap-drop", "ALL"]
    argv += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--bind", tmp, "/tmp"]
    for path in sorted({os.path.realpath(p) for p in (*hide, job_root)} - {"/", "/tmp"}):
        if path.startswith("/tmp/") and path != os.path.realpath(job_root):
            continue  # the job's /tmp is its own already
        if os.path.isdir(path):
            argv += ["--tmpfs", path]
        elif os.path.isfile(path):
            argv += ["--ro-bind", "/dev/null", path]
    hidden = ["/tmp", *(os.path.realpath(p) for p in (*hide, job_root))]
    for path in sorted({os.path.realpath(p) for p in expose if p and os.path.isdir(p)}):
        if any(path == h or path.startswith(h.rstrip("/") + "/") for h in hidden):
            argv += ["--ro-bind", path, path]
    argv += ["--bind", tenant_dir, tenant_dir, "--chdir", workdir, "--"]
    return argv


def sweep(root: Path | None, prefix: str, keep: set[str], empty_after_s: float = 300.0) -> int:
    """Kill and remove cgroups named ``prefix*`` that are not in ``keep`` (left by a dead runner of
    this host), and remove any other run's cgroup that has been empty for ``empty_after_s`` (left
    by a host that died with its runs: nobody else will). Returns how many were removed."""
    if root is None or not root.is_dir():
        return 0
    removed = 0
    now = time.time()
    for path in root.iterdir():
        if not path.is_dir() or path.name in keep:
            continue
        if path.name.startswith(prefix):
            box = Box(path.name, root)
            box.kill(timeout_s=5)
            box.close()
            removed += 1
        elif _empty(path) and now - path.stat().st_mtime > empty_after_s:
            with contextlib.suppress(OSError):
                path.rmdir()
                removed += 1
    return removed


def _empty(cgroup: Path) -> bool:
    try:
        return not (cgroup / "cgroup.procs").read_text().split()
    except OSError:
        return False


def _process_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, session id) of every process, from /proc."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if fields is not None:
            table[int(entry.name)] = (int(fields[1]), int(fields[3]))
    return table


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state is [0], ppid [1], sid [3])."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _exe_name(pid: int) -> str:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return ""


def _state(pid: int) -> str | None:
    fields = _stat(pid)
    return fields[0] if fields else None


def _running(pid: int, start: float | None) -> bool:
    """Whether ``pid`` is still the process that started at ``start`` and is not a zombie."""
    fields = _stat(pid)
    if not fields or fields[0] == "Z":
        return False
    return start is None or (len(fields) > 19 and float(fields[19]) == start)


def _start_time(pid: int) -> float | None:
    fields = _stat(pid)
    return float(fields[19]) if fields and len(fields) > 19 else None
