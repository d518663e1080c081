"""Processes the emulator starts, found and ended by PID, never by name.

Every emulated host (and the head) is one ``ray start`` launched in a new session
(``start_new_session=True``), so the session id is the launcher's PID. Everything Ray then starts
for that host (raylet, agents, worker processes, and the processes they fork) stays in that
session, even processes that call ``setpgid`` (Ray workers do). Killing a host is therefore
"SIGKILL every live member of its session": the closest local equivalent of a VM vanishing.

Why this cannot hit someone else's process: Linux never hands out a PID that is still in use as a
session id, so while any member of our session lives nobody else can create a session with that
id. For the case where every member died and the id was reused, we record the launcher's start
time: a reused id has a live leader with a different start time and is left alone, and a process
that started before our launcher is never counted as a member.
``/proc/<pid>/environ`` cannot serve as a marker: Ray's ``setproctitle`` overwrites it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Session:
    """A process session we started: its id (the launcher's PID) and the launcher's start time."""

    sid: int
    start_ticks: int  # /proc/<pid>/stat field 22 of the launcher, to detect PID reuse

    def to_dict(self) -> dict[str, int]:
        return {"sid": self.sid, "start_ticks": self.start_ticks}

    @classmethod
    def from_dict(cls, data: Mapping[str, int]) -> Session:
        return cls(int(data["sid"]), int(data["start_ticks"]))


def physical_memory() -> int | None:
    """This machine's memory in bytes (None where the platform does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def free_ports(
    count: int, *, exclude: Iterable[int] = (), candidates: Iterable[int] | None = None
) -> list[int]:
    """``count`` distinct TCP ports that are free right now (bound together, then released).

    They are drawn from below the kernel's ephemeral range (``ip_local_port_range``), which the
    kernel never hands out by itself: a port chosen now and listened on later (a GCS, a dashboard,
    a control plane) cannot meanwhile be taken as the local end of someone's connection or by a
    process listening on port 0, as a port from ``bind(0)`` can (and was, under load). Falls back
    to ``bind(0)`` when nothing below the range is free.

    A port this process handed out is not handed out again for ``HELD_S``: it is free until its
    user listens on it, so a later draw (a fleet's dashboard port, then its head's agent ports a
    moment later) could return it again, and two of Ray's components were given one port.
    ``exclude``: ports taken already that may not listen now (a restarted head's GCS and dashboard,
    drawn by another process); ``candidates``: the ports to try, in order (default: the range below
    the ephemeral one, shuffled)."""
    if candidates is None:
        high = _ephemeral_start()
        candidates = _shuffled(max(1024, high - _BELOW_EPHEMERAL), high)
    with _handed_lock:
        now = time.monotonic()
        for port, until in list(_handed_out.items()):
            if until <= now:
                del _handed_out[port]
        taken = set(exclude) | _handed_out.keys()
        ports = _bind_free(count, (p for p in candidates if p not in taken))
        _handed_out.update(dict.fromkeys(ports, now + HELD_S))
    return ports


def _shuffled(low: int, high: int) -> Iterator[int]:
    """Every port of ``[low, high)`` once, in random order, drawn as they are asked for: a draw
    wants a few, and shuffling the whole range first (16,384 ports from the system's random
    source) took ~18 ms of CPU a draw, twice on every attempt's launch on an emulated fleet."""
    seen: set[int] = set()
    for _ in range(_RANDOM_TRIES):
        port = _random.randrange(low, high)
        if port not in seen:
            seen.add(port)
            yield port
    rest = [p for p in range(low, high) if p not in seen]  # a crowded range: the others, shuffled
    _random.shuffle(rest)
    yield from rest


def _bind_free(count: int, candidates: Iterable[int]) -> list[int]:
    """The first ``count`` of ``candidates`` that bind, bound together then released (``bind(0)``
    for the rest when too few do)."""
    socks: list[socket.socket] = []
    try:
        for port in candidates:
            if len(socks) == count:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("", port))
            except OSError:
                s.close()
                continue
            socks.append(s)
        while len(socks) < count:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    """One port as :func:`free_ports` picks them."""
    return free_ports(1)[0]


_BELOW_EPHEMERAL = 16384  # how far below the ephemeral range ports are drawn from
_random = random.SystemRandom()  # not the process's seeded `random`: two processes must differ
_RANDOM_TRIES = 64  # ports drawn one at a time before the rest of the range is shuffled (_shuffled)
HELD_S = 300.0  # how long a port handed out is not handed out again by this process (free_ports)
_handed_out: dict[int, float] = {}  # port -> until (time.monotonic())
_handed_lock = threading.Lock()


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


@dataclass(frozen=True)
class _Proc:
    pid: int
    ppid: int
    sid: int
    state: str
    start_ticks: int


def _stat(pid: int) -> _Proc | None:
    """One process's state, parent, session and start time (in clock ticks), or None if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # the command name may contain spaces and ')'
    return _Proc(pid, int(fields[1]), int(fields[3]), fields[0], int(fields[19]))


def _table() -> list[_Proc]:
    procs = (_stat(int(e.name)) for e in os.scandir("/proc") if e.name.isdigit())
    return [p for p in procs if p is not None and p.state != "Z"]


def spawn(
    argv: Sequence[str], env: Mapping[str, str], log_path: Path
) -> tuple[subprocess.Popen[bytes], Session]:
    """Start ``argv`` in a new session with exactly ``env``; output goes to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    info = _stat(proc.pid)
    return proc, Session(proc.pid, info.start_ticks if info else 0)


def spawn_group(
    argv: Sequence[str],
    env: Mapping[str, str],
    log_path: Path,
    hosts: Sequence[tuple[Sequence[str], Mapping[str, str], Path]],
    timeout_s: float,
) -> tuple[subprocess.Popen[bytes], list[Session | None]]:
    """Start one launcher for several hosts (``rayhost.py --group``: ``argv`` plus the path of a
    spec file it reads and removes); ``hosts`` are each host's ``ray start`` flags, whole
    environment and log. The launcher forks a child per host, each a session of its own, and
    reports each child's pid and start time as it forks; returns the launcher and every host's
    session once all are reported (None for a host not reported when the launcher exited or
    ``timeout_s`` passed)."""
    spec, reported = log_path.with_suffix(".json"), log_path.with_suffix(".sessions")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    reported.unlink(missing_ok=True)
    body = {
        "hosts": [{"argv": list(a), "env": dict(e), "log": str(log)} for a, e, log in hosts],
        "sessions": str(reported),
    }
    fd = os.open(spec, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the hosts' environments
    with os.fdopen(fd, "w") as f:
        json.dump(body, f)
    proc, _ = spawn([*argv, str(spec)], env, log_path)
    deadline = time.monotonic() + timeout_s
    found: dict[int, Session] = {}
    while True:
        exited = proc.poll() is not None
        text = reported.read_text() if reported.exists() else ""
        for line in text.splitlines():
            index, pid, ticks = (int(x) for x in line.split())
            found[index] = Session(pid, ticks)
        if len(found) >= len(hosts) or exited or time.monotonic() > deadline:
            return proc, [found.get(i) for i in range(len(hosts))]
        time.sleep(0.02)


def members(session: Session, table: list[_Proc] | None = None) -> list[int]:
    """Live PIDs of ``session`` plus their descendants that left it (``setsid``); empty if the id
    was reused by someone else."""
    procs = _table() if table is None else table
    leader = next((p for p in procs if p.pid == session.sid), None)
    if leader is not None and leader.sid == session.sid and leader.start_ticks != session.start_ticks:
        return []  # the id now leads a different, newer session
    ours = {p.pid for p in procs if p.sid == session.sid and p.start_ticks >= session.start_ticks}
    grew = True
    while grew:  # children that called setsid still descend from a member
        more = {p.pid for p in procs if p.ppid in ours and p.start_ticks >= session.start_ticks} - ours
        ours |= more
        grew = bool(more)
    return sorted(ours)


def alive(sessions: Iterable[Session]) -> list[int]:
    """Every live process of ``sessions`` (see :func:`members`)."""
    table = _table()
    return sorted({pid for s in sessions for pid in members(s, table)})


def _still(known: dict[int, int]) -> dict[int, int]:
    """The subset of ``known`` (pid -> start ticks) that is still the same live process."""
    out = {}
    for pid, ticks in known.items():
        info = _stat(pid)
        if info is not None and info.state != "Z" and info.start_ticks == ticks:
            out[pid] = ticks
    return out


def _snapshot(sessions: Sequence[Session], known: dict[int, int]) -> dict[int, int]:
    table = _table()
    ticks = {p.pid: p.start_ticks for p in table}
    found = {pid: ticks[pid] for s in sessions for pid in members(s, table)}
    return _still(known) | found


def _send(procs: dict[int, int], sig: signal.Signals) -> None:
    for pid in procs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def kill_sessions(sessions: Sequence[Session], grace_s: float = 0.0, timeout_s: float = 15.0) -> list[int]:
    """End every process of ``sessions``: SIGTERM and ``grace_s`` to exit, then SIGKILL; with no
    grace (a host that vanishes), all of them are frozen (SIGSTOP) before the first SIGKILL.

    Processes seen once are tracked by PID and start time, so a child that was orphaned (and
    re-parented) on the way is still ended. Returns the PIDs still alive after ``timeout_s``.
    """
    known = _snapshot(sessions, {})
    if grace_s > 0:
        _send(known, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while known and time.monotonic() < deadline:
            time.sleep(0.1)
            known = _snapshot(sessions, known)
    else:
        # A VM that vanishes ends all its processes at the same instant. Sent one by one, SIGKILL
        # gave a raylet that outlived its workers by a few milliseconds (a loaded machine) the time
        # to report them dead on their own, so Ray blamed a worker crash instead of the node's end
        # (a preempted host's actors died "unexpectedly", not "preempted"). Frozen first, none can.
        _send(known, signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while True:
        _send(known, signal.SIGKILL)
        time.sleep(0.05)
        known = _snapshot(sessions, known)
        if not known or time.monotonic() >= deadline:
            return sorted(known)


# What each process of a fleet is, from its command line (Ray retitles its Python processes
# "ray::<what>"; the rest are found by their program). First match wins.
_COMPONENTS = (
    ("gcs_server", "gcs server"),
    ("/raylet/raylet", "raylet"),
    ("ray::DashboardAgent", "dashboard agent"),
    ("dashboard/agent.py", "dashboard agent"),
    ("ray::RuntimeEnvAgent", "runtime env agent"),
    ("runtime_env/agent/main.py", "runtime env agent"),
    ("tpufleet-runtime-env-standin", "runtime env agent stand-in"),  # its shell: the script names tail
    ("tpufleet-agent-standin", "dashboard agent stand-in"),
    ("tail --pid", "agent stand-in"),  # what either shell waits with
    ("log_monitor.py", "log monitor"),
    ("autoscaler/_private/monitor.py", "autoscaler monitor"),
    ("dashboard/dashboard.py", "dashboard"),
    ("ray.util.client.server", "ray client server"),
    ("rayhost.py", "launcher"),
    (" start --", "launcher"),
    ("ray::", "worker"),
    ("default_worker.py", "worker"),
)


def component(cmdline: str) -> str:
    """What a fleet process is (``raylet``, ``log monitor``, ``worker``...), from its command line."""
    return next((name for needle, name in _COMPONENTS if needle in cmdline), "other")


@dataclass(frozen=True)
class ProcMemory:
    """One process's memory: PSS (its share of every page it maps: what it really costs; summed
    over processes it adds up to what they use together) and RSS (pages mapped, shared ones
    counted in full)."""

    pid: int
    component: str
    pss: int
    rss: int


def memory(pids: Iterable[int]) -> list[ProcMemory]:
    """PSS and RSS of each of ``pids`` still alive (read with psutil from /proc/<pid>/smaps)."""
    import psutil

    out = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            mem = proc.memory_full_info()
            cmdline = " ".join(proc.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        out.append(ProcMemory(pid, component(cmdline), int(mem.pss), int(mem.rss)))
    return out


def rss_bytes(pids: Iterable[int]) -> int:
    """Sum of the resident set sizes of ``pids`` (those still alive)."""
    total = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
    return total
