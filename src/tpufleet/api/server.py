"""``ControlPlane``: the store, the scheduling loop, the REST API and a cluster client in one process.

``tpufleet serve`` builds one around ``RayExecutor.connect(ray_address)`` and serves it with uvicorn. The
same class runs in-process around any :class:`~tpufleet.control.cluster.protocol.ClusterClient` (the demo,
tests with ``MemoryCluster``)::

    with ControlPlane(RayExecutor.connect(address), state_dir="/tmp/fleet") as cp:
        url = cp.start_http()            # the API on a free port, in a thread; loop started too
        client = Client(url, cp.admin_token)

On first start an admin token is written to ``<state-dir>/admin-token`` (mode 0600). The store, the
loop and the provisioner are built in the control layer (``control.plane.Plane.build``); this class
adds what is the API's: the app, the metrics registry, the device sampler and the HTTP server.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from tpufleet import pricing
from tpufleet.api.app import create_app
from tpufleet.api.auth import ensure_admin_token
from tpufleet.api.serving import ADMIN_TOKEN_FILE, default_state_dir, listen
from tpufleet.api.watch import JobChanges
from tpufleet.control.cluster.protocol import ClusterClient
from tpufleet.control.loop.provisioner import ProvisionConfig, Provisioner
from tpufleet.control.loop.service import Decide, ServiceConfig
from tpufleet.control.plane import Plane, PlaneOptions, Replicas
from tpufleet.control.ray.headwatch import AWAIT_ENV, await_seconds, wait_for_gcs
from tpufleet.control.store.facade import Clock, new_job_id
from tpufleet.control.store.fleetview import duty_cycles
from tpufleet.control.store.lease import replica_id
from tpufleet.control.store.usage import Usage
from tpufleet.control.store.values import DEFAULT_LIMITS, Limits
from tpufleet.errors import ClusterError
from tpufleet.fleet import SliceInfo
from tpufleet.observe import device
from tpufleet.observe.metrics import cycle_histogram, leader_gauge
from tpufleet.observe.registry import metrics_registry
from tpufleet.provision.base import Provider

log = logging.getLogger(__name__)

DEFAULT_PORT = 8600


def ray_cluster(address: str, connect_timeout_s: float = 5.0) -> ClusterClient:
    """The Ray executor connected to ``address``, or a ClusterError saying why not: within
    ``connect_timeout_s`` when nothing listens there."""
    wait_for_gcs(address, await_seconds(connect_timeout_s))
    try:
        executor = importlib.import_module("tpufleet.control.ray.client")
    except ImportError as err:
        raise ClusterError(f"the Ray executor (tpufleet.control.ray.client) is not available: {err}") from err
    while True:
        try:
            cluster: ClusterClient = executor.RayExecutor.connect(address)
            return cluster
        except Exception as err:  # ray raises ConnectionError, RuntimeError, ValueError...
            if not os.environ.get(AWAIT_ENV):
                raise ClusterError(
                    f"cannot connect to Ray at {address!r}: {type(err).__name__}: {err}"
                ) from err
            # Back from a lost head: the GCS answers before the new cluster takes drivers.
            log.warning("Ray at %s is not ready yet (%s: %s); trying again", address, type(err).__name__, err)
            executor.ray.shutdown()
            time.sleep(2.0)


class _Of(Collector):
    """Another registry's metrics, collected as one collector of this one."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterable[Metric]:
        return self.registry.collect()


def _after_shutdown(_signum: int, _frame: object) -> None:
    """SIGTERM once uvicorn has shut down: ``ControlPlane.serve`` closes the plane next."""


class ControlPlane:
    def __init__(
        self,
        cluster: ClusterClient,
        *,
        state_dir: str | Path | None = None,
        db_url: str | None = None,
        decide: Decide | None = None,
        config: ServiceConfig | None = None,
        clock: Clock = time.time,
        new_id: Any = new_job_id,
        limits: Limits = DEFAULT_LIMITS,
        prices: pricing.PriceTable | None = None,
        provider: Provider | None = None,
        provision: ProvisionConfig | None = None,
        replicas: Replicas | None = None,
    ) -> None:
        """A control plane over ``cluster``; with a ``provider`` (``serve --provider``) its loop also
        makes and deletes slices (the provisioner, configured by ``provision``); with ``replicas``
        it is one of several on one database and runs the loop only while it leads (``serve`` on
        PostgreSQL). Everything below the API is built by ``control.plane.Plane.build`` from one
        ``PlaneOptions``."""
        options = PlaneOptions(
            state_dir=Path(state_dir) if state_dir else default_state_dir(),
            db_url=db_url,
            config=config or ServiceConfig(),
            limits=limits,
            provider=provider,
            provision=provision,
            decide=decide,
            clock=clock,
            new_id=new_id,
            replicas=replicas,
        )
        self.plane = Plane.build(cluster, options)
        self.leadership = self.plane.leadership
        self.replica = self.leadership.replica if self.leadership else replica_id()
        self.started_at = clock()
        self.state_dir, self.db_url = options.state_dir, options.database
        self.cluster, self.store, self.service = cluster, self.plane.store, self.plane.service
        self.prices = prices or pricing.shipped()  # cost: the shipped table, or serve --pricing FILE's
        # GET /metrics: the store's metrics, then this process's own (the loop's cycles, whether it
        # leads, the TPU devices' samples: ``loop_metrics``, which API processes get fed). Register
        # more on ``metrics``.
        self.loop_metrics = CollectorRegistry(auto_describe=False)
        self.service.cycle_observers.append(cycle_histogram(self.loop_metrics))
        leader_gauge(self.loop_metrics, self.replica, lambda: self.service.leads)
        self.devices = device.register(self.loop_metrics, self._fleet_slices, self._holders)
        self.metrics = metrics_registry(self.store, prices=self.prices, extra=[_Of(self.loop_metrics)])
        self.admin_token_path = self.state_dir / ADMIN_TOKEN_FILE
        self._admin_token, self.admin_token_created = ensure_admin_token(self.store, self.admin_token_path)
        self.app = create_app(
            self.store,
            on_change=self.service.wake,
            metrics=self.metrics,
            prices=self.prices,
            status=self.status,
            limits=limits,
            admin_token_path=self.admin_token_path,
            provider=provider.kind if provider is not None else None,
            job_changes=JobChanges(),
        )
        self.service.write_observers.append(self.app.state.job_changes.changed)
        # the fleet page's chips are shaded by what the device sampler last read (GET /api/v1/fleet)
        self.app.state.duty_cycles = lambda: duty_cycles(self.devices.view()[2])
        # the slice types the autoscaler makes on demand (a submit for another missing type is warned)
        made = options.provision if provider is not None and options.provision is not None else None
        self.app.state.pool_types = frozenset(
            p.accelerator_type for p in (made.pools if made and made.autoscale else ()) if p.max_slices > 0
        )
        self._http: uvicorn.Server | None = None
        self._http_thread: threading.Thread | None = None
        self.url: str | None = None

    @property
    def provisioner(self) -> Provisioner | None:
        """The loop's provisioner (with replicas, each term of leadership starts a fresh one)."""
        return self.service.provisioner

    @property
    def admin_token(self) -> str:
        """The admin token: the one in ``<state-dir>/admin-token`` (``token rotate-admin`` replaces it)."""
        try:
            return self.admin_token_path.read_text().strip() or self._admin_token
        except OSError:
            return self._admin_token

    def status(self) -> dict[str, Any]:
        """The scheduling loop's health (``Service.stats``) and who leads: /healthz and GET
        /api/v1/status. ``leader``: this replica runs the loop; ``leader_since``: since when (the
        database's clock; this process's start without replicas); ``replica``: this one's id;
        ``leader_replica``: the one that leads now (None: none holds the lease at this moment);
        ``fenced_writes``: transactions of this replica's loop refused since it was deposed."""
        lead = self.leadership
        if lead is None:
            who: dict[str, Any] = {
                "leader": True,
                "leader_since": self.started_at,
                "leader_replica": self.replica,
                "fenced_writes": 0,
            }
        else:
            leads = self.service.leads
            who = {
                "leader": leads,
                "leader_since": lead.since if leads else None,
                "leader_replica": lead.leader(),
                "fenced_writes": lead.refused,
            }
        return {**self.service.stats(), "replica": self.replica, **who}

    def _fleet_slices(self) -> list[SliceInfo]:
        """The cluster's slices that the slices table has (what is paid for), for the device
        metrics: Ray lists the dead hosts of a slice that left (a deleted group's, one every host
        of which ended on purpose) long after, and they are not hosts down (``tpufleet_host_up``,
        the critical ``TpufleetHostDown``). A slice that broke stays in the table, and its dead
        hosts count as down."""
        known = {s.name for s in self.store.slices.all()}
        return [s for s in self.cluster.inventory() if s.name in known]

    def _holders(self) -> dict[str, device.Holder]:
        return device.holders_of(Usage(self.store).open_attempts())

    def start(self) -> ControlPlane:
        """Start the scheduling loop (a daemon thread) and the TPU device sampler; with replicas,
        first the lease's thread (the loop acts only while this replica leads)."""
        if self.leadership is not None:
            self.leadership.on_change.append(self.service.wake)
            self.leadership.start()
        self.service.start()
        self.devices.start()
        return self

    def serve(self, sock: socket.socket, api_processes: int = 0) -> None:
        """Run the loop and the API on ``sock`` (:func:`~tpufleet.api.serving.listen`: bound before
        anything started) until SIGINT/SIGTERM (blocking; uvicorn handles the signals). Shutting
        down waits at most a few seconds for a cycle under way, whatever state Ray is in. With
        ``api_processes`` the API runs in that many processes of its own and this one runs only
        the loop (``api/processes.py``; ``serve --api-processes``). The process's garbage collector
        is settled first (``processes.settle_gc``): this is the process's one server."""
        from tpufleet.api.processes import settle_gc

        settle_gc()
        self.start()
        if api_processes > 0:
            self._serve_from(sock, api_processes)
            return
        if threading.current_thread() is threading.main_thread():
            # uvicorn raises the signal that stopped it again once it has shut down; with the
            # default action the process would die there, before ``close`` (the lease handed over)
            signal.signal(signal.SIGTERM, _after_shutdown)
        try:
            config = uvicorn.Config(self.app, log_level="warning", timeout_graceful_shutdown=3)
            uvicorn.Server(config).run(sockets=[sock])
        finally:
            self.close(loop_timeout_s=3.0)

    def _serve_from(self, sock: socket.socket, count: int) -> None:
        from tpufleet.api.processes import ApiProcesses

        stop = threading.Event()
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda _s, _f: stop.set())
        processes = ApiProcesses(self, sock, count).start()
        try:
            while not stop.wait(1.0):
                pass
        finally:
            processes.stop(timeout_s=3.0)
            self.close(loop_timeout_s=3.0)

    def start_http(self, host: str = "127.0.0.1", port: int = 0, timeout_s: float = 30.0) -> str:
        """Start the loop and serve the API from a thread (``port=0``: a free port); returns the URL."""
        sock = listen(host, port)  # a taken port: a ConflictError, before the loop starts
        self.start()
        server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning"))
        thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="tpufleet-api"
        )
        thread.start()
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                sock.close()
                raise ClusterError(f"the API server did not start on {host}:{port}")
            time.sleep(0.01)
        self._http, self._http_thread = server, thread
        self.url = f"http://{host}:{sock.getsockname()[1]}"
        return self.url

    def close(self, loop_timeout_s: float = 10.0) -> None:
        if self._http is not None and self._http_thread is not None:
            self._http.should_exit = True
            self._http_thread.join(timeout=30)
            self._http = self._http_thread = None
        # Asked first, waited for not at all: a device read stuck on a cluster that is gone must
        # not add its timeout to the loop's (serve must stop within seconds of SIGTERM).
        self.devices.stop(wait_s=0)
        self.service.close(timeout_s=loop_timeout_s)
        if self.leadership is not None:  # after the loop stopped: hand the lease over at once
            self.leadership.stop()
        self.store.close()

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
