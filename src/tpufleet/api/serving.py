"""What one ``tpufleet serve`` process holds for its whole life, taken before it changes anything.

- Its state dir: an OS lock (``fcntl.flock``) on ``<state-dir>/serve.lock``, which also names the
  holder (PID, URL once known). The kernel drops the lock when the process ends however it ends
  (SIGKILL included), so there is never a stale lock to clean up; the file stays, and its content
  only means something while the lock is held. The descriptor is not inherited by child processes
  (Python's default), so a Ray process the emulator provider started does not keep it, and an
  ``os.execv`` of serve in place (a lost Ray head) drops it and takes it again.
- Its port: a socket bound and listening before the store, the loop, the device sampler or the CLI
  context are touched, handed to uvicorn (:meth:`ControlPlane.serve`). A taken port is one line,
  exit 2, and nothing was started or recorded.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tpufleet.control.store.values import sqlite_file
from tpufleet.errors import ConflictError, InputError, SpecError

# The admin token's file in a serve's state dir (mode 0600). Here, with where that dir is by
# default, so that the CLI's client commands find both without importing the app (~1 s of CPU).
ADMIN_TOKEN_FILE = "admin-token"


def default_state_dir() -> Path:
    """``$TPUFLEET_STATE_DIR``, or ``~/.tpufleet``."""
    return Path(os.environ.get("TPUFLEET_STATE_DIR") or Path.home() / ".tpufleet")


__all__ = [
    "LOCK_FILE",
    "Holder",
    "StateDirLock",
    "holder",
    "listen",
    "lock_database",
    "lock_state_dir",
    "url_of",
]

LOCK_FILE = "serve.lock"


@dataclass(frozen=True)
class Holder:
    """The serve process that holds a state dir: its PID and, once its port is bound, its URL."""

    pid: int | None = None
    url: str | None = None

    def __str__(self) -> str:
        named = ", ".join(x for x in (f"PID {self.pid}" if self.pid else "", self.url or "") if x)
        return f"another tpufleet serve ({named})" if named else "another tpufleet serve"


class StateDirLock:
    """The lock on a state dir, held until :meth:`release` or the process's end."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self._fd = path, fd

    def fileno(self) -> int:
        """The locked descriptor (-1 once released)."""
        return self._fd

    def note(self, url: str | None = None) -> None:
        """Write this process's PID (and ``url``) into the lock file, for a second serve to name."""
        data = json.dumps({"pid": os.getpid(), "url": url}).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = -1


def _read(fd: int) -> Holder:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return Holder()
    if not isinstance(data, dict):
        return Holder()
    pid, url = data.get("pid"), data.get("url")
    return Holder(pid if isinstance(pid, int) else None, url if isinstance(url, str) else None)


def _open(state_dir: Path) -> int:
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        return os.open(state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as err:
        raise InputError(f"cannot use the state dir {state_dir}: {err.strerror or err}") from None


def _flock(fd: int, tries: int = 5) -> None:
    """An exclusive flock, tried a few times: :func:`holder` holds a shared one for an instant."""
    for _ in range(tries - 1):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            time.sleep(0.05)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _take(fd: int, path: Path, what: str, taken: Callable[[Holder, str], str]) -> StateDirLock:
    """Lock ``fd`` (the lock file ``path``) for this process and note who holds it, or close it
    and raise: a ConflictError of ``taken(holder, how to stop it)`` when another process holds
    it, an InputError naming ``what`` for any other failure. One line, exit 2."""
    try:
        _flock(fd)
    except OSError as err:
        who = _read(fd)
        os.close(fd)
        if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise InputError(f"cannot lock {what}: {err.strerror or err}") from None
        raise ConflictError(taken(who, f"stop it (kill {who.pid})" if who.pid else "stop it")) from None
    lock = StateDirLock(path, fd)
    lock.note()
    return lock


def lock_state_dir(state_dir: Path) -> StateDirLock:
    """Lock ``state_dir`` for this process (made if missing), or a ConflictError naming the serve
    that holds it: one line, exit 2."""
    return _take(
        _open(state_dir),
        state_dir / LOCK_FILE,
        f"the state dir {state_dir}",
        lambda who, stop: (
            f"{who} already runs from the state dir {state_dir}: {stop}, or give this one another --state-dir"
        ),
    )


def lock_database(url: str) -> StateDirLock | None:
    """SQLite takes one serve: lock ``<file>.serve.lock`` beside a SQLite database file (whichever
    state dir the serve has), or a ConflictError naming the serve that uses it: one line, exit 2.
    None for PostgreSQL (replicas share it; the lease says which one leads) and in-memory SQLite."""
    path = sqlite_file(url)
    if path is None:
        return None
    where = Path(path).absolute()
    lock_path = where.with_name(where.name + ".serve.lock")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as err:
        raise InputError(f"cannot lock the database {where}: {err.strerror or err}") from None
    return _take(
        fd,
        lock_path,
        f"the database {where}",
        lambda who, stop: (
            f"{who} already uses the SQLite database {where}, and SQLite takes one "
            f"serve: {stop}, or run replicas on PostgreSQL (--db postgresql+psycopg://...)"
        ),
    )


def holder(state_dir: Path) -> Holder | None:
    """The serve process that holds ``state_dir`` now, or None when none does (no lock taken)."""
    try:
        fd = os.open(state_dir / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return _read(fd)  # held: its holder wrote who it is
    finally:
        os.close(fd)
    return None


def listen(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0: a free port) and listening, or one line saying why
    not: a taken port is a ConflictError naming the fix (``--port``), anything else a SpecError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on connections of a socket that says it is
    # TCP; with proto 0 every keep-alive response waits ~40 ms for the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart beside TIME_WAITs
        sock.bind((host, port))
        sock.listen(backlog)  # at once: with SO_REUSEADDR two bound, unlistening sockets may share a port
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise ConflictError(
                f"port {port} on {host} is taken (another tpufleet serve or another program listens "
                "there): give another with --port, e.g. --port 0 for a free one"
            ) from None
        why = err.strerror or str(err)
        raise SpecError(
            f"cannot listen on {host}:{port}: {why}; give --host an address of this machine "
            "(e.g. 127.0.0.1) and --port a free port (1024-65535, 0 for any)"
        ) from None
    except OverflowError:
        sock.close()
        raise SpecError(f"port {port} is out of range: give --port 0-65535", field="--port") from None
    return sock


def url_of(host: str, sock: socket.socket) -> str:
    """The URL clients use for ``sock`` bound to ``host``: 127.0.0.1 for any-address binds."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    if ":" in shown:
        shown = f"[{shown}]"
    return f"http://{shown}:{sock.getsockname()[1]}"
