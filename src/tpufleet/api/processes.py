"""``serve --api-processes N``: the API in N processes of its own, the loop alone in serve's.

Why: one interpreter runs one thread at a time. With the API in the loop's process, every submit's
request (about 5 ms of CPU through FastAPI, pydantic and the store) takes the interpreter from the
loop, and under a stream of submits the loop's cycle stretches to a few hundred milliseconds,
which every job then waits for (docs/benchmarks.md, "The API in processes of its own"). With N
API processes the loop's process serves no request at all.

The parent (``serve``) binds the port as always, then starts N children with this module's
:func:`main` (``python -m tpufleet.api.processes``), each given the listening socket (the kernel
hands each new connection to one of them), its settings (pickled on stdin: the parent's own) and
two pipes:

- **wake** (one, shared; child to parent): a byte after each submit or cancel, so the loop runs
  its next cycle now (``Service.wake``), as an in-process submit wakes it;
- **feed** (one per child; parent to child): length-prefixed pickles of what only the loop's
  process knows: the loop's health every ``PUSH_S`` (``/healthz``, ``GET /api/v1/status``), the
  jobs each of its writes moved (wakes long-polled job reads, ``watch.py``), and every
  ``SLOW_PUSH_S`` the fleet page's duty cycles and the loop's own metric families (the cycle
  histogram, ``tpufleet_leader``, the TPU device metrics), which a child's ``/metrics`` serves
  after the store's.

A child reads its feed on a thread; the feed's end (the parent gone, however it died, SIGKILL
included) stops the child, so no API outlives its loop and holds the port. The parent restarts a
child that dies (at most one start a second per child) and stops them all, by PID, on shutdown.

What differs from one process: the failed-authentication allowance (``authguard.py``) is counted
per process, so each child gets ``MAX_FAILURES // N`` of it (at least 1): up to ``MAX_FAILURES``
children together allow no more than one process did. ``tpufleet_auth_failures_total`` is per
process, so a scrape sees the counter of the child that answered it.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import pickle
import queue
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

__all__ = ["ApiProcesses", "Feed", "Settings", "main", "settle_gc"]

PUSH_S = 0.25  # the loop's health to every child, this often
SLOW_PUSH_S = 1.0  # duty cycles and the loop's metric families, this often
# How long a child's threads hold the interpreter before handing it on (Python's default: 5 ms).
# A submit group's thread holds SQLite's write lock across its statements and needs the
# interpreter back after each one (the driver lets go of it while SQLite works); with the request
# threads wanting it, each return waited up to 5 ms, and the loop's writes waited behind the lock
# that long (docs/benchmarks.md, "A child's interpreter hands over sooner").
SWITCH_INTERVAL_S = 0.0005
# The cyclic garbage collector in a serving process (:func:`settle_gc`): its youngest generation
# collected every 10,000 net allocations of container objects instead of Python's 700, the older
# ones half as often as by default.
GC_THRESHOLDS = (10_000, 20, 20)
QUEUED_FRAMES = 256  # frames waiting for a child that does not read; more are dropped (_Pipe)
RESTART_S = 1.0  # a child that died is started again after this long
_LEN = struct.Struct("!I")


@dataclass(frozen=True)
class Settings:
    """What a child builds its app from: the parent's own settings, pickled on its stdin."""

    db_url: str
    limits: Any  # store.values.Limits
    prices: Any  # pricing.PriceTable
    admin_token_path: Path
    provider: str | None
    pool_types: frozenset[str]
    max_failures: int
    listen_fd: int
    wake_fd: int
    feed_fd: int


def _frame(obj: object) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _LEN.pack(len(data)) + data


def _read_exact(fd: int, n: int) -> bytes | None:
    """``n`` bytes from ``fd``, or None at its end."""
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, n - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frames(fd: int) -> Iterator[Any]:
    """The objects a parent wrote to ``fd`` until its end (the parent gone)."""
    while (head := _read_exact(fd, _LEN.size)) is not None:
        body = _read_exact(fd, _LEN.unpack(head)[0])
        if body is None:
            return
        yield pickle.loads(body)  # from the parent, over a pipe it made for this child


class _Families(Collector):
    """The loop process's metric families as last fed (a child's ``/metrics``)."""

    def __init__(self) -> None:
        self.families: Sequence[Metric] = ()

    def collect(self) -> Iterable[Metric]:
        return self.families


class Feed:
    """A child's view of what only the loop's process knows, kept from its feed."""

    def __init__(self, job_changes: Any) -> None:
        self.job_changes = job_changes
        self.loop_status: dict[str, Any] = {}
        self.duty: dict[str, Any] = {}
        self.families = _Families()

    def status(self) -> dict[str, Any]:
        return self.loop_status

    def duty_cycles(self) -> dict[str, Any]:
        return self.duty

    def apply(self, message: tuple[str, Any]) -> None:
        kind, value = message
        if kind == "status":
            self.loop_status = value
        elif kind == "changed":
            self.job_changes.changed(value)
        elif kind == "slow":
            self.duty, self.families.families = value

    def follow(self, fd: int, on_end: Callable[[], None]) -> None:
        """Apply every frame from ``fd``; at its end (the parent gone) call ``on_end``."""
        try:
            for message in read_frames(fd):
                self.apply(message)
        except (OSError, pickle.UnpicklingError, EOFError, ValueError) as err:
            log.error("the loop's feed broke (%s): stopping this API process", err)
        on_end()


def _stop_soon(server: Any) -> None:
    """The parent is gone: let uvicorn finish the requests under way, then leave regardless."""
    server.should_exit = True
    threading.Timer(5.0, os._exit, args=(0,)).start()


def _waker(fd: int) -> Callable[[], None]:
    def wake() -> None:
        with contextlib.suppress(BlockingIOError, BrokenPipeError):
            os.write(fd, b"w")  # a full pipe: a wake is already pending

    return wake


def main() -> None:
    """A child: the API over the parent's database on the parent's socket until its feed ends."""
    import uvicorn

    from tpufleet.api.app import create_app
    from tpufleet.api.authguard import AuthGuard
    from tpufleet.api.watch import JobChanges
    from tpufleet.control.store.facade import Store
    from tpufleet.observe.registry import metrics_registry

    settings: Settings = pickle.load(sys.stdin.buffer)  # written by the parent serve
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    logging.basicConfig(level=logging.WARNING, format=f"api process {os.getpid()}: %(message)s")
    store = Store.open(settings.db_url, limits=settings.limits)
    feed = Feed(JobChanges())
    app = create_app(
        store,
        on_change=_waker(settings.wake_fd),
        status=feed.status,
        limits=settings.limits,
        metrics=metrics_registry(store, prices=settings.prices, extra=[feed.families]),
        prices=settings.prices,
        admin_token_path=settings.admin_token_path,
        auth_guard=AuthGuard(max_failures=settings.max_failures),
        provider=settings.provider,
        job_changes=feed.job_changes,
    )
    app.state.duty_cycles = feed.duty_cycles
    app.state.pool_types = settings.pool_types
    settle_gc()
    sock = socket.socket(fileno=settings.listen_fd)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=3))
    threading.Thread(
        target=feed.follow, args=(settings.feed_fd, lambda: _stop_soon(server)), daemon=True
    ).start()
    try:
        server.run(sockets=[sock])
    finally:
        store.close()
    os._exit(0)  # as serve does: nothing of ours is left to close


def settle_gc() -> None:
    """Settle the cyclic garbage collector of a serving process once its app is built: what exists
    now (the app, its routes and models, the store's mappers, the imported modules) is frozen out
    of every later collection (``gc.freeze``), and collections come less often (``GC_THRESHOLDS``).

    Why: an API process serving Kueue's baseline replay spent about 7 of its CPU-seconds in the
    collector, 3 of them in about 30 full collections that each walked the whole app again (up to
    190 ms each, the interpreter held, often with SQLite's write lock held by a submit group
    waiting for it); settled, 0.6 s. A submit creates few reference cycles, so a request's objects
    are freed by reference counting long before 10,000 of them are counted (docs/benchmarks.md,
    "The garbage collector of a serving process")."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


class _Pipe:
    """The feed of one child process: its pipe's write end and the thread that writes to it, so
    that a child that stops reading holds up only its own frames (dropped past ``QUEUED_FRAMES``:
    its long-polls then see their jobs at their next look at the store)."""

    def __init__(self, fd: int, index: int) -> None:
        self.fd = fd
        self.frames: queue.Queue[bytes | None] = queue.Queue(QUEUED_FRAMES)
        threading.Thread(target=self._write, daemon=True, name=f"tpufleet-api-feed-{index}").start()

    def send(self, frame: bytes) -> None:
        with contextlib.suppress(queue.Full):
            self.frames.put_nowait(frame)

    def close(self) -> None:
        """No more frames: the thread closes the pipe once it is done (the child sees its end)."""
        while True:
            try:
                self.frames.put_nowait(None)
                return
            except queue.Full:
                with contextlib.suppress(queue.Empty):
                    self.frames.get_nowait()

    def _write(self) -> None:
        try:
            while (frame := self.frames.get()) is not None:
                view = memoryview(frame)
                while view:
                    view = view[os.write(self.fd, view) :]
        except OSError:
            pass  # the child is gone: its slot starts another with a pipe of its own
        finally:
            os.close(self.fd)


@dataclass
class _Child:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    pipe: _Pipe | None = None

    def send(self, frame: bytes) -> None:
        if self.pipe is not None:
            self.pipe.send(frame)


class ApiProcesses:
    """The parent's side: ``count`` children serving the API on ``sock`` for ``cp`` (a
    ``ControlPlane`` whose loop runs here)."""

    def __init__(self, cp: Any, sock: socket.socket, count: int) -> None:
        from tpufleet.api.authguard import MAX_FAILURES

        self.cp, self.sock = cp, sock
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._children = [_Child(i) for i in range(count)]
        self._keepers: list[threading.Thread] = []  # one per child: _keep
        self.max_failures = max(1, MAX_FAILURES // count)

    def _settings(self, feed_r: int) -> Settings:
        cp, app = self.cp, self.cp.app
        return Settings(
            db_url=cp.db_url,
            limits=app.state.limits,
            prices=cp.prices,
            admin_token_path=cp.admin_token_path,
            provider=app.state.provider,
            pool_types=app.state.pool_types,
            max_failures=self.max_failures,
            listen_fd=self.sock.fileno(),
            wake_fd=self._wake_w,
            feed_fd=feed_r,
        )

    def _spawn(self, child: _Child) -> None:
        feed_r, feed_w = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tpufleet.api.processes"],
                stdin=subprocess.PIPE,
                pass_fds=(self.sock.fileno(), self._wake_w, feed_r),
                # not in serve's process group: a Ctrl-C at serve's terminal stops serve, which
                # then stops them (SIGTERM by PID); were serve killed, their feed's end stops them
                start_new_session=True,
            )
        except BaseException:
            os.close(feed_w)
            raise
        finally:
            os.close(feed_r)  # the child's copy is the only one: its end is the parent's
        child.proc, child.pipe = proc, _Pipe(feed_w, child.index)
        assert proc.stdin is not None
        with contextlib.suppress(OSError):  # a child that died at once: _keep sees it
            proc.stdin.write(pickle.dumps(self._settings(feed_r)))
            proc.stdin.close()
        self._push_to(child)

    def _keep(self, child: _Child) -> None:
        """Start ``child``'s process, and another whenever it dies, until stopped."""
        while not self._stopping.is_set():
            try:
                self._spawn(child)
            except OSError as err:
                log.error("cannot start an API process: %s; trying again", err)
                self._stopping.wait(RESTART_S)
                continue
            assert child.proc is not None and child.pipe is not None
            code = child.proc.wait()
            child.pipe.close()
            if self._stopping.is_set():
                return
            log.warning("API process %s ended (exit %s): starting another", child.proc.pid, code)
            self._stopping.wait(RESTART_S)

    def _push_to(self, child: _Child) -> None:
        child.send(_frame(("status", self.cp.status())))
        child.send(_frame(("slow", self._slow())))

    def _slow(self) -> tuple[dict[str, Any], list[Metric]]:
        return self.cp.app.state.duty_cycles(), list(self.cp.loop_metrics.collect())

    def _broadcast(self, message: tuple[str, Any]) -> None:
        frame = _frame(message)
        for child in self._children:
            child.send(frame)

    def changed(self, job_ids: Sequence[str]) -> None:
        """A ``Service.write_observers`` entry: the jobs the loop just moved, to every child."""
        self._broadcast(("changed", list(job_ids)))

    def _pusher(self) -> None:
        slow_at = 0.0
        while not self._stopping.wait(PUSH_S):
            try:
                self._broadcast(("status", self.cp.status()))
                if time.monotonic() >= slow_at:
                    slow_at = time.monotonic() + SLOW_PUSH_S
                    self._broadcast(("slow", self._slow()))
            except Exception:
                log.exception("feeding the API processes failed; trying again")

    def _waker(self) -> None:
        while True:
            try:
                if not os.read(self._wake_r, 4096):
                    return
            except OSError:
                return
            self.cp.service.wake()

    def _thread(self, target: Callable[..., None], *args: Any, name: str) -> threading.Thread:
        t = threading.Thread(target=target, args=args, daemon=True, name=name)
        t.start()
        return t

    def start(self) -> ApiProcesses:
        self.cp.service.write_observers.append(self.changed)
        self._thread(self._waker, name="tpufleet-api-wake")
        for child in self._children:
            self._keepers.append(self._thread(self._keep, child, name=f"tpufleet-api-keep-{child.index}"))
        self._thread(self._pusher, name="tpufleet-api-push")
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop every child by its PID: SIGTERM, then SIGKILL after ``timeout_s``."""
        self._stopping.set()
        deadline = time.monotonic() + timeout_s
        for signum in (signal.SIGTERM, signal.SIGKILL):
            procs = [c.proc for c in self._children if c.proc is not None and c.proc.poll() is None]
            for proc in procs:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signum)
            for proc in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(max(0.0, deadline - time.monotonic()))
        for t in self._keepers:
            t.join(timeout=1.0)


if __name__ == "__main__":
    main()
