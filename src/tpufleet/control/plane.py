"""The control plane's one assembly: ``Plane.build(cluster, PlaneOptions(...))``.

Everything below the API that one ``tpufleet serve`` process runs, built in one place from one typed
value: the store (SQLite in the state dir, or PostgreSQL by URL), the provisioner when a provider is
given (``serve --provider``), and the scheduling loop with its collaborators (the cluster client, the
provisioner). ``api/server.py``'s ``ControlPlane`` adds the HTTP side (the app, metrics, the device
sampler) on top of a built plane; ``serve``, ``demo``, ``demo --autoscale``, ``chaos`` and the tests
all reach this through it. Building opens the store (and brings its schema up to date) and nothing
else: the loop starts with ``Plane.service.start()``. With ``PlaneOptions.replicas`` (``serve`` on
PostgreSQL) the plane is one replica of several: ``Plane.leadership`` keeps the lease, and the loop,
its executor actions and its provisioner get the store fenced by it (``control/store/lease.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tpufleet.control.cluster.protocol import ClusterClient
from tpufleet.control.loop.leader import Leadership
from tpufleet.control.loop.provisioner import ProvisionConfig, Provisioner
from tpufleet.control.loop.service import Decide, Service, ServiceConfig
from tpufleet.control.store.facade import Store, new_job_id
from tpufleet.control.store.lease import LEASE_S, RENEW_S, Lease
from tpufleet.control.store.values import DEFAULT_LIMITS, Clock, Limits
from tpufleet.provision.base import Provider

__all__ = ["Plane", "PlaneOptions", "Replicas"]


@dataclass(frozen=True)
class Replicas:
    """This process is one replica of several on one database (``serve`` on PostgreSQL): it
    leads (runs the loop) only while it holds the lease (``control/store/lease.py``). A standby
    takes over at most ``lease_s + renew_s`` after the leader's last renewal."""

    lease_s: float = LEASE_S
    renew_s: float = RENEW_S
    replica: str | None = None  # None: hostname:pid:random


@dataclass(frozen=True)
class PlaneOptions:
    """What a control plane is built from (the parsed ``serve`` flags, or a test's choices)."""

    state_dir: Path
    db_url: str | None = None  # None: sqlite:///<state_dir>/tpufleet.db
    config: ServiceConfig = field(default_factory=ServiceConfig)
    limits: Limits = DEFAULT_LIMITS
    provider: Provider | None = None  # serve --provider: the loop makes and deletes slices
    provision: ProvisionConfig | None = None  # the provisioner's pools and timeouts (with a provider)
    decide: Decide | None = None  # the policy; None: scheduler.policy.decide_runs
    clock: Clock = time.time
    new_id: Callable[[], str] = new_job_id
    replicas: Replicas | None = None  # None: the only process on its database, always leading

    @property
    def database(self) -> str:
        return self.db_url or f"sqlite:///{self.state_dir / 'tpufleet.db'}"


@dataclass
class Plane:
    """A built control plane without its API: the store, the loop and what the loop drives."""

    options: PlaneOptions
    cluster: ClusterClient
    store: Store
    service: Service
    provisioner: Provisioner | None
    leadership: Leadership | None = None  # with PlaneOptions.replicas

    @classmethod
    def build(cls, cluster: ClusterClient, options: PlaneOptions) -> Plane:
        options.state_dir.mkdir(parents=True, exist_ok=True)
        store = Store.open(
            options.database, clock=options.clock, new_id=options.new_id, limits=options.limits
        )
        leadership, loop_store = None, store
        if options.replicas is not None:  # the loop's writes, its actions' and its provisioner's: fenced
            rep = options.replicas
            leadership = Leadership(Lease(store, rep.replica, lease_s=rep.lease_s, renew_s=rep.renew_s))
            loop_store = store.fenced(leadership.check)
        provisioner = None
        if options.provider is not None:
            provisioner = Provisioner(loop_store, options.provider, options.provision or ProvisionConfig())
        service = Service(
            loop_store,
            cluster,
            state_dir=options.state_dir,
            decide=options.decide,
            config=options.config,
            provisioner=provisioner,
            leadership=leadership,
        )
        return cls(options, cluster, store, service, provisioner, leadership)
