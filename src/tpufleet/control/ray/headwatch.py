"""The Ray head under the control plane: wait for its GCS, and start afresh when it is lost.

A Ray driver cannot outlive its cluster. Without GCS fault tolerance (an external Redis, which
neither the emulator nor a plain `ray start --head` has) a head that dies takes the cluster with
it, and one that comes back at the same address is a new cluster the old driver cannot join: its
core worker gives up and ends the process. So `tpufleet serve` watches the GCS's port
(:class:`HeadWatch`); once it has stopped answering, the process replaces itself with a fresh
start of the same command (``os.execv``: the same PID, so whoever supervises it sees no exit; its
sockets and files close on exec). The fresh start waits for the GCS to answer again
(``TPUFLEET_AWAIT_RAY``), connects to the new cluster and finds the store as the old process left
it: its reconcile ends the attempts that ran on the old cluster (their processes are gone) as
failed, so they are retried, and launches the admitted ones on the new cluster. No job is lost. The API is
down from the exec until Ray is back.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping

from tpufleet.errors import ClusterError

__all__ = ["AWAIT_ENV", "HeadWatch", "await_head", "await_seconds", "gcs_endpoint", "wait_for_gcs"]

log = logging.getLogger(__name__)

AWAIT_ENV = "TPUFLEET_AWAIT_RAY"  # set on a restart after the head was lost: wait for Ray, however long


def gcs_endpoint(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``host:port`` GCS address; None for what Ray resolves itself (``auto``)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    return (host.strip("[]"), int(port)) if sep and host and port.isdigit() else None


def answers(address: str, timeout_s: float = 1.0) -> bool:
    """Whether something accepts TCP connections at the GCS address (True for one Ray resolves)."""
    endpoint = gcs_endpoint(address)
    if endpoint is None:
        return True
    try:
        with socket.create_connection(endpoint, timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_for_gcs(address: str, timeout_s: float = 5.0) -> None:
    """Return once something accepts TCP connections at ``address``, or raise a ClusterError
    naming it within ``timeout_s``: ``ray.init`` on an address nobody listens at retries forever."""
    endpoint = gcs_endpoint(address)
    if endpoint is None:
        return
    deadline = time.monotonic() + timeout_s
    said = time.monotonic()
    while True:
        try:
            with socket.create_connection(endpoint, timeout=min(1.0, timeout_s)):
                return
        except OSError as err:
            if time.monotonic() >= deadline:
                raise ClusterError(
                    f"no Ray cluster at {address} (tried for {timeout_s:g} s: {err.strerror or err}); "
                    "start one with `tpufleet emulate up` and use `tpufleet serve --emulator`, "
                    "or give the GCS address `ray start --head` printed"
                ) from None
            if time.monotonic() - said >= 30:
                said = time.monotonic()
                log.warning("still waiting for Ray's GCS at %s", address)
        time.sleep(0.2)


def await_seconds(default_s: float, environ: Mapping[str, str] = os.environ) -> float:
    """How long to wait for the GCS at start: for ever after a restart for a lost head (``environ``
    has :data:`AWAIT_ENV`; this process's environment by default), else ``default_s``."""
    return math.inf if environ.get(AWAIT_ENV) else default_s


def await_head(alive: Callable[[], bool], every_s: float = 0.5) -> None:
    """Return once ``alive()`` says the head runs again, asking every ``every_s``, however long:
    a fresh start after a lost head waits for a fleet whose head is still coming back (e.g. an
    emulated fleet's, ``EmulatedFleet.head_alive``)."""
    while not alive():
        time.sleep(every_s)


def restart_process(address: str) -> None:
    """Replace this process with a fresh start of the same command, which waits for Ray first.

    Should the exec itself fail, the process exits (code 1) rather than serve on without a cluster:
    whatever supervises it starts it again."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os.environ[AWAIT_ENV] = address
    try:
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    except OSError as err:
        print(
            f"error: could not start afresh after losing Ray's head ({err}); exiting",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)


class HeadWatch:
    """Checks every ``every_s`` that the GCS at ``address`` accepts connections; after ``misses``
    failures in a row it logs why and calls ``on_lost`` (by default: :func:`restart_process`)."""

    def __init__(
        self,
        address: str,
        *,
        every_s: float = 1.0,
        misses: int = 3,
        probe: Callable[[str], bool] = answers,
        on_lost: Callable[[str], None] = restart_process,
    ) -> None:
        self.address = address
        self.every_s = every_s
        self.misses = misses
        self.probe = probe
        self.on_lost = on_lost
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> HeadWatch:
        if gcs_endpoint(self.address) is None:
            log.warning("Ray at %r: no host:port to watch; a lost head will not be noticed", self.address)
            return self
        self._thread = threading.Thread(target=self.run, name="tpufleet-head-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def run(self) -> None:
        missed = 0
        while not self._halt.wait(self.every_s):
            missed = 0 if self.probe(self.address) else missed + 1
            if missed >= self.misses:
                log.error(
                    "Ray's head at %s stopped answering (%d checks, %g s apart): its cluster is gone; "
                    "starting afresh, to connect once Ray answers there again",
                    self.address,
                    missed,
                    self.every_s,
                )
                self.on_lost(self.address)
                return
