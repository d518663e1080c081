"""One builder for a control plane under test, for every kind of test.

- ``running(cluster, state_dir, http=..., **options)``: the whole process (store, loop, API) over a
  cluster client in this process (a ``MemoryCluster``, scripted or a sandbox, or a ``RayExecutor``),
  serving HTTP on a free port if asked, closed at the end. Every test that needs a control plane
  builds it here, so a change to how the process is assembled is made once.
- ``served(...)``: the same serving HTTP, as a :class:`Served`: the admin's ``Client``, tenants made
  by the test, and at the end every job cancelled and every slice warm reservation given back (the
  Ray tests of the shared fleet run one module after another on the same slices).
- ``wait_state``: a job once it is in one of some states, failing at once if it ended otherwise.
- ``ServeProcess``: ``tpufleet serve ...`` as a process of its own (``--sandbox``, ``--provider``:
  what an operator runs), with its own CLI context and state dir, once it answers ``/healthz``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
from _executor_helpers import wait_for

from tpufleet.api.server import ControlPlane
from tpufleet.client.http import Client
from tpufleet.control.cluster.protocol import ClusterClient
from tpufleet.emulator import procs
from tpufleet.errors import ConflictError

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
_names = itertools.count()


@contextlib.contextmanager
def running(
    cluster: ClusterClient, state_dir: Path, *, http: bool = False, **options: Any
) -> Iterator[ControlPlane]:
    """A control plane over ``cluster`` keeping its state in ``state_dir``; ``options`` are the
    process's own (``config``, ``limits``, ``db_url``, ``clock``, ...)."""
    cp = ControlPlane(cluster, state_dir=state_dir, **options)
    try:
        if http:
            cp.start_http()
        yield cp
    finally:
        cp.close()


@dataclass
class Served:
    """A control plane serving HTTP at ``url``, with its admin's client and the tenants' clients."""

    cp: ControlPlane
    cluster: Any  # the ClusterClient it runs on (tests of the Ray executor reach into it)
    url: str
    admin: Client
    clients: list[Client] = field(default_factory=list)

    def tenant_client(
        self, prefix: str = "team", preemption: str | None = None, **quota: int
    ) -> tuple[str, Client]:
        """A new tenant named ``<prefix>-<n>`` with ``quota`` (chips per generation) and its client."""
        name = f"{prefix}-{next(_names)}"
        client = Client(self.url, self.admin.create_tenant(name, quota, preemption=preemption)["token"])
        self.clients.append(client)
        return name, client

    def all_free(self, names: list[str]) -> bool:
        """Whether each of the slices ``names`` is FREE and held by no job."""
        found = {s["name"]: s for s in self.admin.slices() if s["name"] in names}
        return len(found) == len(set(names)) and all(
            s["state"] == "FREE" and s["holder"] is None for s in found.values()
        )

    def cancel_all(self, timeout_s: float = 60.0) -> None:
        """Cancel every job not ended and wait until all have (the next test finds every slice free)."""
        for j in self.admin.jobs():
            if j["state"] not in TERMINAL:
                self.admin.cancel(j["id"])
        wait_for(
            "every job to end", lambda: all(j["state"] in TERMINAL for j in self.admin.jobs()), timeout_s
        )


S = TypeVar("S", bound=Served)


@contextlib.contextmanager
def served(
    cluster: ClusterClient,
    state_dir: Path,
    *,
    kind: Callable[..., S] = Served,  # type: ignore[assignment]
    warm: list[str] | None = None,
    cancel_timeout_s: float = 60.0,
    **options: Any,
) -> Iterator[S]:
    """``running(..., http=True)`` as a ``kind`` (a :class:`Served` or a test's subclass of it).
    ``warm``: slices of a Ray executor to wait warm for before serving; at the end every job is
    cancelled, the clients closed and (on Ray) every warm reservation given back."""
    try:
        with running(cluster, state_dir, **options) as cp:
            if warm is not None:
                cluster.wait_warm(warm, timeout_s=120)  # type: ignore[attr-defined]
            url = cp.start_http()
            with Client(url, cp.admin_token) as admin:
                plane = kind(cp=cp, cluster=cluster, url=url, admin=admin)
                yield plane
                plane.cancel_all(cancel_timeout_s)
                for c in plane.clients:
                    c.close()
    finally:
        if warm is not None:
            cluster.release_all()  # type: ignore[attr-defined]  # later modules use ray.util.tpu


def wait_state(
    client: Client,
    job_id: str,
    *states: str,
    timeout_s: float = 60.0,
    every_s: float = 0.25,
    explain: Callable[[], str] = str,
) -> dict[str, Any]:
    """The job once it is in one of ``states``; fails at once if it ended in another state (saying
    ``explain()``, e.g. the driver's log). Each ask is a long poll (``while_state``: the server
    answers once the job is in none of the other live states, within 5 s), so the answer comes
    when the job moves, and a fleet's processes do not wait for a poll's CPU (~3 ms of client,
    server and store) every 0.25 s on two cores; asked again ``every_s`` after an answer that
    was not yet it (plainly, without the wait, when the tenant's waits are all taken)."""
    others = [s for s in ("QUEUED", "ADMITTED", "STARTING", "RUNNING") if s not in states]

    def probe() -> dict[str, Any] | None:
        try:
            job = client.job(job_id, while_state=others, wait_s=5) if others else client.job(job_id)
        except ConflictError:  # too many waiting reads of this tenant at once (watch.PER_TENANT)
            job = client.job(job_id)
        if job["state"] in states:
            return job
        if job["state"] in TERMINAL:
            raise AssertionError(f"job {job_id} ended {job['state']}, expected {states}: {job}\n{explain()}")
        return None

    return wait_for(f"job {job_id} to be {'/'.join(states)}", probe, timeout_s, every_s=every_s)


class ServeProcess:
    """``tpufleet serve ARGS --port P`` on a free port, its output in ``tmp/serve.log``, with
    ``TPUFLEET_CONFIG`` and ``TPUFLEET_STATE_DIR`` in ``tmp`` (over ``env``, or this process's),
    started once it answers ``/healthz``; ``stop()`` ends it with SIGTERM and returns its output."""

    def __init__(
        self, tmp: Path, *args: str, env: dict[str, str] | None = None, timeout_s: float = 60
    ) -> None:
        self.env = (os.environ if env is None else env) | {
            "TPUFLEET_CONFIG": str(tmp / "config.yaml"),
            "TPUFLEET_STATE_DIR": str(tmp / "home"),
        }
        port = procs.free_port()  # below the ephemeral range: nobody takes it meanwhile
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = tmp / "serve.log"
        self.log = self.log_path.open("w")
        cmd = [sys.executable, "-m", "tpufleet", "serve", *args, "--port", str(port)]
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        try:
            while not self._healthy():
                assert time.monotonic() < deadline, (
                    f"serve did not listen within {timeout_s:g} s: {self.output()}"
                )
                time.sleep(0.2)
        except BaseException:  # no test holds it yet to stop it: a failed start must not outlive the test
            self.stop()
            raise

    def _healthy(self) -> bool:
        assert self.proc.poll() is None, f"serve exited: {self.output()}"
        try:
            return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text()[-3000:]

    def stop(self) -> str:
        """SIGTERM, then SIGKILL if it has not ended in 30 s; everything it wrote."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()
        return self.log_path.read_text()
