"""The control plane under the soak, as processes: killed with SIGKILL (its whole process group,
as a crashed VM would lose it) and started again on the same store.

Either the soak's own ``tpufleet serve`` (a subprocess in its own session, started from the command
and environment :class:`ControlPlane` is given), or someone else's (:class:`ExternalServer`: found by
the port it listens on, killed with every process under it, started again with its own command
line, environment and working directory, and left running at the end).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tpufleet.control.ray.headwatch import AWAIT_ENV
from tpufleet.errors import TpufleetError


@dataclass
class ExternalServer:
    """A control plane this soak did not start: its process tree and how to start it again."""

    pids: list[int]
    argv: list[str]
    env: dict[str, str]
    cwd: str

    @classmethod
    def find(cls, url: str) -> ExternalServer:
        """The process listening on ``url``'s port on this machine (a TpufleetError if there is none)."""
        from urllib.parse import urlsplit

        import psutil

        parts = urlsplit(url)
        if parts.hostname not in ("127.0.0.1", "localhost", "::1") or parts.port is None:
            raise TpufleetError(f"--server {url}: the soak kills and restarts the control plane, so it "
                                "must run on this machine (http://127.0.0.1:PORT)")  # fmt: skip
        for conn in psutil.net_connections("tcp"):
            if (
                conn.status == psutil.CONN_LISTEN
                and conn.laddr
                and conn.laddr.port == parts.port
                and conn.pid
            ):
                proc = psutil.Process(conn.pid)
                tree = [proc.pid, *(c.pid for c in proc.children(recursive=True))]
                env = {
                    k: v for k, v in proc.environ().items() if k != AWAIT_ENV
                }  # set by an exec, not by its owner
                return cls(tree, proc.cmdline(), env, proc.cwd())
        raise TpufleetError(f"no process of this user listens on port {parts.port} ({url})")

    def kill(self, timeout_s: float = 30.0) -> None:
        """SIGKILL every process of the tree; return once each is gone (or a zombie its parent reaps)."""
        import psutil

        procs = []
        for pid in self.pids:
            try:
                procs.append(psutil.Process(pid))
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, psutil.NoSuchProcess):
                continue
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            while time.monotonic() < deadline:
                try:
                    if proc.status() == psutil.STATUS_ZOMBIE:
                        break
                except psutil.NoSuchProcess:
                    break
                time.sleep(0.05)


# The soak's own server: ``() -> (argv, env)`` of a fresh start (the fleet's address may change).
ServeCommand = Callable[[], tuple[list[str], dict[str, str]]]


class ControlPlane:
    """The control plane at ``url``: the soak's own (``serve`` gives its command) or someone
    else's (``serve`` is None). Each start logs to ``log_dir/serve-<n>.log``."""

    def __init__(self, url: str, log_dir: Path, serve: ServeCommand | None) -> None:
        self.url = url
        self.log_dir = log_dir
        self.serve = serve
        self.server: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._external: ExternalServer | None = None  # someone else's: how to start it again once killed
        self._external_up = True  # someone else's: not killed by us, or started again since
        self._lock = threading.Lock()

    def killable(self) -> bool:
        """Whether a kill now would end a running control plane (not one already down)."""
        return not ((self.server is None and self.serve is not None) or not self._external_up)

    def start(self) -> None:
        if self.serve is None:
            self.restart_external()
            return
        with self._lock:
            self.starts += 1
            cmd, env = self.serve()
            with open(self.log_dir / f"serve-{self.starts}.log", "wb") as log:
                self.server = subprocess.Popen(
                    cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
        self.await_up(self.server)

    def ensure_up(self) -> None:
        """Start it unless the soak's last start of it still runs."""
        if self.server is None or self.server.poll() is not None:
            self.start()

    def await_up(self, proc: subprocess.Popen[bytes] | None, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc is not None and proc.poll() is not None:
                raise TpufleetError(
                    f"tpufleet serve exited {proc.returncode}; see {self.log_dir}/serve-{self.starts}.log"
                )
            if self.answers(timeout_s=1.0):
                return
            if time.monotonic() > deadline:
                raise TpufleetError(f"tpufleet serve did not answer within {timeout_s:.0f}s")
            time.sleep(0.2)

    def restart_external(self) -> None:
        """Start the control plane someone else ran again, as it ran, unless it answers: after
        :meth:`kill` ended it, or when it died on its own since (a fresh start that failed)."""
        ext = self._external
        if ext is None or self.answers(timeout_s=2.0):  # never killed by us, or up
            self._external_up = True
            return
        with self._lock:
            self.starts += 1
            with open(self.log_dir / f"serve-{self.starts}.log", "wb") as log:
                self.server = subprocess.Popen(
                    ext.argv,
                    env=ext.env,
                    cwd=ext.cwd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        self.await_up(self.server)
        self._external_up = True

    def answers(self, timeout_s: float) -> bool:
        """Whether the control plane's /healthz says 200 within ``timeout_s``."""
        import httpx

        try:
            return httpx.get(f"{self.url}/healthz", timeout=timeout_s).status_code == 200
        except httpx.TransportError:
            return False

    def kill(self, sig: int) -> None:
        """Send ``sig`` to the soak's own server's process group and wait for it; someone else's
        only ever gets a SIGKILL (:meth:`kill_external`)."""
        if self.serve is None:
            self.kill_external(sig)
            return
        with self._lock:
            proc, self.server = self.server, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)  # its own group (start_new_session): the server and its children
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def kill_external(self, sig: int) -> None:
        """SIGKILL the control plane someone else started (found by the port it listens on) and
        every process under it, keeping what it takes to start it again."""
        if sig != signal.SIGKILL:
            return  # the end of the soak: someone else's control plane stays up
        with self._lock:
            self.server = None
            ext = self._external = ExternalServer.find(self.url)  # as it runs now (a restart runs the same)
            self._external_up = False
            ext.kill()
