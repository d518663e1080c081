"""``--provider kuberay``: slice groups as replicas of a RayCluster's TPU worker group.

One replica of a worker group is one slice of ``numOfHosts`` pods (render/kuberay.py renders one
worker group per pool, counted in slices). Through the official ``kubernetes`` client:

- **create** N slices of type T: GET the RayCluster, find the worker group whose ``nodeSelector``
  asks for T (``cloud.google.com/gke-tpu-accelerator`` + ``-topology``, ``gke-spot`` for spot), PATCH
  (JSON merge patch, with the ``resourceVersion`` read, so a concurrent writer makes it 409 and
  it is retried) ``replicas`` + N.
- **delete**: PATCH ``replicas`` - N and ``scaleStrategy.workersToDelete`` += one pod of each of the
  group's replicas. With KubeRay's ``RayMultiHostIndexing`` (on by default since KubeRay 1.6) the
  operator deletes every pod of a named pod's replica (``reconcileMultiHostWorkerGroup``, step 4;
  docs/provisioning.md cites it).
- **states** come from the worker pods (``ray.io/cluster``, ``ray.io/node-type=worker``), grouped by
  ``ray.io/worker-group-replica-name``: new replicas are given to the groups that asked for them,
  oldest request first. A pod that is unschedulable makes its group WAITING_FOR_RESOURCES (the
  scheduler's words as the message); all pods Ready: ACTIVE; a pod being deleted that we did not
  delete is a preemption notice (its ``deletionTimestamp`` is the deadline); a replica whose pods
  are gone was preempted: SUSPENDED until KubeRay's replacement replica (it keeps ``replicas``) is up.

The groups (request, worker group, replica names) are kept in the RayCluster's annotation
``tpufleet.dev/slice-groups``, so a restarted provider knows which replicas are whose.

Physical slice names are ``<worker group>-<replica index>``, as the GKE TPU webhook names
``TPU_NAME``. The RBAC this needs is rendered with the fleet (render/kuberay.py:
``render_provider_rbac``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tpufleet import catalog
from tpufleet.errors import ClusterError, ConflictError, InputError, NotFoundError
from tpufleet.provision.base import GroupState, GroupStatus, HostHealth, PhysicalSlice, SliceRequest
from tpufleet.provision.requests import validate
from tpufleet.spec import FleetSpec

__all__ = ["ANNOTATION", "KubeRayConfig", "KubeRayProvider", "config_from_spec", "make_api_client"]

REPLICA_NAME = "ray.io/worker-group-replica-name"
REPLICA_INDEX = "ray.io/worker-group-replica-index"
HOST_INDEX = "ray.io/replica-host-index"
GROUP = "ray.io/group"
# The provider's own record of its groups, on the RayCluster, so a restarted control plane knows
# which replicas are whose (a create after a restart must not add replicas again).
ANNOTATION = "tpufleet.dev/slice-groups"
_CRD = ("ray.io", "v1", "rayclusters")


@dataclass(frozen=True)
class KubeRayConfig:
    namespace: str
    cluster: str  # the RayCluster's name


def config_from_spec(spec: FleetSpec) -> KubeRayConfig:
    """The RayCluster ``render --target kuberay`` makes from the spec: its name, in its namespace."""
    return KubeRayConfig(namespace=spec.namespace, cluster=spec.name)


def make_api_client(host: str | None = None) -> Any:
    """A ``kubernetes`` ApiClient: in-cluster (the control plane's ServiceAccount), else the local
    kubeconfig; or plainly ``host`` (a local server answering as the API, for tests)."""
    from kubernetes import client, config

    if host is not None:
        return client.ApiClient(client.Configuration(host=host))
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        try:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        except (config.ConfigException, OSError) as err:
            raise InputError(
                f"no Kubernetes credentials for --provider kuberay ({str(err).splitlines()[0]}): run the "
                "control plane in the cluster as the ServiceAccount `render --provider-rbac` makes, "
                "or point KUBECONFIG at a kubeconfig"
            ) from None
    return client.ApiClient()


@dataclass
class _Group:
    request: SliceRequest
    worker_group: str = ""
    error: str = ""
    replicas: list[str] = field(default_factory=list)  # assigned replica names, oldest first
    names: dict[str, str] = field(default_factory=dict)  # replica name -> physical slice name
    deleting: bool = False
    lost: set[str] = field(default_factory=set)  # physical slices whose pods vanished: preempted


@dataclass(frozen=True)
class _Pod:
    name: str
    group: str  # the worker group (ray.io/group)
    replica: str
    index: int  # replica index
    host: int
    phase: str
    ready: bool
    unschedulable: str  # the scheduler's message, "" when scheduled
    deleting_at: float | None


def _pod(p: Any) -> _Pod | None:
    labels = p.metadata.labels or {}
    if REPLICA_NAME not in labels:
        return None  # a pod of a single-host group or of a KubeRay without RayMultiHostIndexing
    conds = {c.type: c for c in (p.status.conditions or [])}
    sched = conds.get("PodScheduled")
    unschedulable = ""
    if sched is not None and sched.status == "False" and sched.reason == "Unschedulable":
        unschedulable = sched.message or "unschedulable"
    ready = conds.get("Ready")
    stamp = p.metadata.deletion_timestamp
    return _Pod(
        name=p.metadata.name,
        group=labels.get(GROUP, ""),
        replica=labels[REPLICA_NAME],
        index=int(labels.get(REPLICA_INDEX, -1)),
        host=int(labels.get(HOST_INDEX, 0)),
        phase=p.status.phase or "Pending",
        ready=bool(ready is not None and ready.status == "True"),
        unschedulable=unschedulable,
        deleting_at=stamp.timestamp() if stamp is not None else None,
    )


class KubeRayProvider:
    """Slice groups as worker-group replicas of one RayCluster; see the module docstring."""

    kind = "kuberay"

    def __init__(
        self, config: KubeRayConfig, *, api_client: Any = None, clock: Callable[[], float] = time.time
    ):
        from kubernetes import client

        self.config = config
        api = api_client if api_client is not None else make_api_client()
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        self._clock = clock
        self._groups: dict[str, _Group] = {}
        self._lock = threading.Lock()
        cluster = self._get_cluster()  # NotFoundError at once for a wrong name
        raw = (cluster["metadata"].get("annotations") or {}).get(ANNOTATION, "{}")
        for name, r in json.loads(raw).items():
            req = SliceRequest(name, r["acceleratorType"], int(r["count"]), bool(r["spot"]), r.get("tenant"))
            self._groups[name] = _Group(req, worker_group=r["workerGroup"], replicas=list(r["replicas"]))
        self._written = self._record()
        # Replicas no recorded group owns belong to the fleet's own pools.
        claimed = {r for g in self._groups.values() for r in g.replicas}
        self._foreign = {p.replica for p in self._pods()} - claimed

    def _record(self) -> str:
        """The annotation's value: every live group's request, worker group and replicas."""
        return json.dumps(
            {
                name: {
                    "acceleratorType": g.request.accelerator_type,
                    "count": g.request.count,
                    "spot": g.request.spot,
                    "tenant": g.request.tenant,
                    "workerGroup": g.worker_group,
                    "replicas": g.replicas,
                }
                for name, g in sorted(self._groups.items())
                if not g.deleting and not g.error
            },
            sort_keys=True,
        )

    # -- the Kubernetes API ------------------------------------------------------------------------

    def _get_cluster(self) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        group, version, plural = _CRD
        try:
            obj: Any = self._custom.get_namespaced_custom_object(
                group, version, self.config.namespace, plural, self.config.cluster
            )
        except ApiException as err:
            if err.status == 404:
                raise NotFoundError(
                    f"no RayCluster {self.config.cluster!r} in namespace {self.config.namespace!r}"
                ) from err
            raise ClusterError(f"Kubernetes API: {err.status} {err.reason}", retry_after=5.0) from err
        return dict(obj)

    def _patch_group(self, worker_group: str, change: Callable[[dict[str, Any]], None]) -> None:
        """Read the RayCluster, apply ``change`` to one worker group, write ``workerGroupSpecs`` back
        as a merge patch carrying the resourceVersion read; retried when someone wrote in between."""
        from kubernetes.client.exceptions import ApiException

        group, version, plural = _CRD
        for _ in range(5):
            cluster = self._get_cluster()
            specs = cluster["spec"].get("workerGroupSpecs", [])
            target = next((g for g in specs if g.get("groupName") == worker_group), None)
            if target is None:
                raise NotFoundError(f"RayCluster {self.config.cluster} has no worker group {worker_group!r}")
            change(target)
            with self._lock:
                record = self._record()
            body = {
                "metadata": {
                    "resourceVersion": cluster["metadata"]["resourceVersion"],
                    "annotations": {ANNOTATION: record},
                },
                "spec": {"workerGroupSpecs": specs},
            }
            try:
                self._custom.patch_namespaced_custom_object(
                    group, version, self.config.namespace, plural, self.config.cluster, body
                )
                with self._lock:
                    self._written = record
                return
            except ApiException as err:
                if err.status != 409:
                    raise ClusterError(
                        f"Kubernetes API refused the RayCluster patch: {err.status} {err.reason}: {err.body}"
                    ) from err
        raise ConflictError(f"RayCluster {self.config.cluster} kept changing under the patch; try again")

    def _pods(self) -> list[_Pod]:
        from kubernetes.client.exceptions import ApiException

        selector = f"ray.io/cluster={self.config.cluster},ray.io/node-type=worker"
        try:
            items = self._core.list_namespaced_pod(self.config.namespace, label_selector=selector).items
        except ApiException as err:
            raise ClusterError(
                f"Kubernetes API: listing pods: {err.status} {err.reason}", retry_after=5.0
            ) from err
        return [p for p in (_pod(item) for item in items) if p is not None]

    # -- the protocol ------------------------------------------------------------------------------

    def worker_group_for(self, request: SliceRequest, cluster: dict[str, Any]) -> str:
        """The worker group whose nodeSelector asks for the request's slice type (and spot-ness)."""
        st = catalog.slice_type(request.accelerator_type)
        names = []
        for g in cluster["spec"].get("workerGroupSpecs", []):
            sel = g.get("template", {}).get("spec", {}).get("nodeSelector", {})
            names.append(g.get("groupName", "?"))
            if (
                sel.get("cloud.google.com/gke-tpu-accelerator") == st.gke_accelerator
                and sel.get("cloud.google.com/gke-tpu-topology") == str(st.topology)
                and (sel.get("cloud.google.com/gke-spot") == "true") == request.spot
                and int(g.get("numOfHosts", 1)) == st.hosts
            ):
                return str(g["groupName"])
        spot = "spot " if request.spot else ""
        kind = f"{spot}{request.accelerator_type} ({st.gke_accelerator} {st.topology})"
        raise NotFoundError(
            f"RayCluster {self.config.cluster} has no worker group for {kind}; its groups: {', '.join(names)}"
        )

    def create(self, request: SliceRequest) -> None:
        validate(request)
        with self._lock:
            old = self._groups.get(request.name)
            if old is not None and old.request == request and not old.deleting:
                return
            if old is not None:
                raise ConflictError(
                    f"slice group {request.name!r} exists with another request or is being deleted"
                )
            self._groups[request.name] = g = _Group(request)
        try:
            g.worker_group = self.worker_group_for(request, self._get_cluster())
            self._patch_group(
                g.worker_group,
                lambda spec: spec.update(replicas=int(spec.get("replicas", 0)) + request.count),
            )
        except (NotFoundError, ClusterError, ConflictError) as err:
            g.error = str(err)

    def delete(self, name: str, *, force: bool = False) -> None:
        with self._lock:
            g = self._groups.get(name)
            if g is None or g.deleting:
                return
            g.deleting = True
            if g.error:
                del self._groups[name]
                return
        first_pods: dict[str, _Pod] = {}
        for p in sorted(self._pods(), key=lambda p: p.host):
            if p.replica in g.replicas and p.deleting_at is None:
                first_pods.setdefault(p.replica, p)
        named = [first_pods[r].name for r in g.replicas if r in first_pods]

        def scale_down(spec: dict[str, Any]) -> None:
            spec["replicas"] = max(0, int(spec.get("replicas", 0)) - g.request.count)
            if named:
                strategy = spec.setdefault("scaleStrategy", {})
                old = strategy.get("workersToDelete") or []
                strategy["workersToDelete"] = old + [n for n in named if n not in old]

        self._patch_group(g.worker_group, scale_down)

    def poll(self) -> list[GroupStatus]:
        try:
            pods = self._pods()
        except ClusterError as err:
            with self._lock:
                return [GroupStatus(n, GroupState.FAILED, str(err)) for n in self._groups]
        by_replica: dict[str, list[_Pod]] = {}
        for p in pods:
            by_replica.setdefault(p.replica, []).append(p)
        with self._lock:
            self._assign(by_replica)
            out = []
            for name, g in list(self._groups.items()):
                status = self._status(g, by_replica)
                if status is None:
                    del self._groups[name]
                else:
                    out.append(status)
            record = self._record()
        if record != self._written:
            self._write_record(record)
        return out

    def _write_record(self, record: str) -> None:
        """Keep the annotation up to date with the replicas just given to groups (a merge patch of
        that one key; the provider owns it). A failure is retried at the next poll."""
        from kubernetes.client.exceptions import ApiException

        group, version, plural = _CRD
        body = {"metadata": {"annotations": {ANNOTATION: record}}}
        try:
            self._custom.patch_namespaced_custom_object(
                group, version, self.config.namespace, plural, self.config.cluster, body
            )
        except ApiException:
            return
        with self._lock:
            self._written = record

    def close(self) -> None:
        pass

    # -- states ------------------------------------------------------------------------------------

    def _assign(self, by_replica: dict[str, list[_Pod]]) -> None:
        """Give replicas nobody owns to the groups still short of replicas, oldest request first;
        a replica no group wants (KubeRay replacing one of the pools' own) belongs to the pools."""
        for g in self._groups.values():
            if not g.deleting:
                g.lost |= {g.names.get(r, r) for r in g.replicas if r not in by_replica}
            g.replicas = [r for r in g.replicas if r in by_replica]
            for r in g.replicas:  # replicas restored from the annotation get their names here
                g.names.setdefault(r, f"{g.worker_group}-{by_replica[r][0].index}")
        owned = self._foreign | {r for g in self._groups.values() for r in g.replicas}
        free = sorted((r for r in by_replica if r not in owned), key=lambda r: by_replica[r][0].index)
        for g in self._groups.values():
            if g.deleting or g.error:
                continue
            for r in [r for r in free if by_replica[r][0].group == g.worker_group]:
                if len(g.replicas) >= g.request.count:
                    break
                free.remove(r)
                g.replicas.append(r)
                g.names[r] = f"{g.worker_group}-{by_replica[r][0].index}"
        self._foreign |= set(free)

    def _status(self, g: _Group, by_replica: dict[str, list[_Pod]]) -> GroupStatus | None:
        name, req = g.request.name, g.request
        if g.error:
            return GroupStatus(name, GroupState.FAILED, g.error)
        pods = [p for r in g.replicas for p in by_replica.get(r, [])]
        st = catalog.slice_type(req.accelerator_type)
        complete = len(g.replicas) == req.count and all(len(by_replica[r]) == st.hosts for r in g.replicas)
        active = complete and all(p.ready and p.phase == "Running" for p in pods)
        if active:
            g.lost.clear()  # KubeRay replaced what was preempted
        slices = tuple(self._slice(g.names[r], by_replica[r]) for r in g.replicas)
        slices += tuple(PhysicalSlice(n, (HostHealth.PREEMPTED,)) for n in sorted(g.lost))
        if g.deleting:
            return GroupStatus(name, GroupState.DELETING, "", slices) if pods else None
        if active:
            return GroupStatus(name, GroupState.ACTIVE, "", slices)
        waiting = next((p.unschedulable for p in pods if p.unschedulable), "")
        if g.lost:
            msg = f"spot preemption: {', '.join(sorted(g.lost))} lost; KubeRay is replacing it"
            return GroupStatus(name, GroupState.SUSPENDED, msg, slices)
        if waiting:
            return GroupStatus(name, GroupState.WAITING_FOR_RESOURCES, waiting, slices)
        msg = f"{len(g.replicas)} of {req.count} replica(s) of worker group {g.worker_group} created"
        return GroupStatus(name, GroupState.PROVISIONING, msg, slices)

    @staticmethod
    def _slice(name: str, pods: list[_Pod]) -> PhysicalSlice:
        pods = sorted(pods, key=lambda p: p.host)
        hosts = []
        for p in pods:
            if p.phase in ("Failed", "Succeeded"):
                hosts.append(HostHealth.PREEMPTED if p.deleting_at is not None else HostHealth.REPAIRING)
            elif p.phase == "Running" and not p.ready and p.deleting_at is None:
                hosts.append(HostHealth.REPAIRING)
            else:
                hosts.append(HostHealth.READY)
        notices = [p.deleting_at for p in pods if p.deleting_at is not None]
        return PhysicalSlice(name, tuple(hosts), min(notices) if notices else None)
