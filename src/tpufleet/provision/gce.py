"""``--provider gce``: slice groups as Cloud TPU API v2 queued resources (``google-cloud-tpu``).

One group = one queued resource named after the group, in ``projects/<project>/locations/<zone>``:
a single node ``<group>-0`` for one slice, or a multislice request (``multislice_params.node_count``
= count, ``node_id_prefix`` = group: nodes ``<group>-0 .. <group>-<count-1>``). The node is the slice;
its name is what Ray sees as ``ray.io/tpu-slice-name`` (Ray reads the TPU VM metadata
``instance-id``). Spot groups set the queued resource's ``spot`` tier. Each TPU VM boots with a
startup script (:func:`startup_script`) that exports the host contract from the metadata server
and joins the Ray cluster.

States: the queued resource's state maps onto :class:`GroupState` (CREATING/ACCEPTED ->
WAITING_FOR_RESOURCES, SUSPENDING/SUSPENDED -> SUSPENDED, the rest by name); each node's
``state``/``health`` onto every host's :class:`HostHealth`. A preempted spot node keeps its quota
until it is deleted (Ray's own GCE node provider never deletes it): :meth:`GceProvider.reclaim`
deletes the queued resource of every preempted group (``force=True``) and the group stays reported
``SUSPENDED`` until the slice manager deletes it. The API shows a preemption only once it happened;
the notice before it comes from the hosts: their runners watch the metadata server
(``host/gcemetadata.py``) and publish what it announces (``host/notices.py``), which :meth:`poll`
reports as each slice's ``preempt_deadline``. Request and response fields relied on, with the API
reference: docs/provisioning.md.
"""

from __future__ import annotations

import logging
import shlex
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tpufleet import catalog
from tpufleet.errors import ClusterError, InputError, SpecError
from tpufleet.host import gcemetadata
from tpufleet.host import notices as notices_mod
from tpufleet.provision.base import GroupState, GroupStatus, HostHealth, PhysicalSlice, SliceRequest
from tpufleet.provision.requests import validate
from tpufleet.render.launcher import RUNTIME_VERSIONS
from tpufleet.spec import FleetSpec

__all__ = ["GceConfig", "GceProvider", "config_from_spec", "make_client", "startup_script"]

log = logging.getLogger(__name__)

GROUP_LABEL = "tpufleet-group"
_QR_STATES = {
    "CREATING": GroupState.WAITING_FOR_RESOURCES,
    "ACCEPTED": GroupState.WAITING_FOR_RESOURCES,
    "WAITING_FOR_RESOURCES": GroupState.WAITING_FOR_RESOURCES,
    "PROVISIONING": GroupState.PROVISIONING,
    "ACTIVE": GroupState.ACTIVE,
    "FAILED": GroupState.FAILED,
    "DELETING": GroupState.DELETING,
    "SUSPENDING": GroupState.SUSPENDED,
    "SUSPENDED": GroupState.SUSPENDED,
}
_PREEMPTED_NODE = {"PREEMPTED", "TERMINATED"}


def _api_errors() -> tuple[type[BaseException], ...]:
    """What a call to the API raises when it is refused or cannot be made (no network, a timeout)."""
    import requests
    from google.api_core import exceptions

    return (exceptions.GoogleAPICallError, exceptions.RetryError, requests.RequestException)


def _words(err: BaseException) -> str:
    return str(getattr(err, "message", None) or err)


_REPAIRING_NODE = {"REPAIRING", "RESTARTING", "REIMAGING", "UNKNOWN", "STOPPING", "STOPPED", "STARTING"}
_UNHEALTHY = {"TIMEOUT", "UNHEALTHY_TENSORFLOW", "UNHEALTHY_MAINTENANCE"}


@dataclass(frozen=True)
class GceConfig:
    project: str
    zone: str  # e.g. us-central2-b
    ray_address: str  # the head's GCS address, host:port, reachable from the TPU VMs
    ray_version: str = "2.60.0"
    network: str = ""  # e.g. projects/<p>/global/networks/default; "" = the project's default
    subnetwork: str = ""
    service_account: str = ""  # the TPU VMs' service account email; "" = the default compute one
    runtime_version: str = ""  # "" = the generation's default (render.launcher.RUNTIME_VERSIONS)
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}"


def config_from_spec(spec: FleetSpec, ray_address: str) -> GceConfig:
    """The provider's settings from the fleet spec ``render --target gce`` reads: its ``gce``
    project and zone, the Ray version, the TPU VMs' service account."""
    if spec.gce is None:
        raise SpecError(
            "--provider gce needs a gce section, e.g. gce: {project_id: my-project, zone: us-east5-b}",
            field="gce",
        )
    sa = spec.service_account.gcp_service_account if spec.service_account else None
    return GceConfig(
        project=spec.gce.project_id,
        zone=spec.gce.zone,
        ray_address=ray_address,
        ray_version=spec.ray.version,
        service_account=sa or "",
        labels={"tpufleet-fleet": spec.name},
    )


def startup_script(
    ray_address: str,
    ray_version: str,
    *,
    metadata_url: str = "http://metadata.google.internal/computeMetadata/v1/instance/attributes",
    profile: str = "/etc/profile.d/tpufleet.sh",
) -> str:
    """The TPU VM's startup script: the host contract from the metadata server, then ``ray start``.

    Every host of the slice runs it at boot (as root). The variables are those of DESIGN.md's host
    contract, read where a TPU VM keeps them (``instance/attributes/``: ``instance-id``,
    ``agent-worker-number``, ``accelerator-type``, ``tpu-env``'s TOPOLOGY,
    ``worker-network-endpoints``' addresses, as JAX's cloud TPU cluster detection reads them), written
    to ``/etc/profile.d/tpufleet.sh`` for every later process, and given to the raylet, with
    ``TPUFLEET_GCE_VM=1``: the runners on this host watch its metadata server's preemption and
    maintenance notices (``host/gcemetadata.py``).
    """
    md = metadata_url
    lines = [
        "#!/bin/bash",
        "set -euo pipefail",
        f'md() {{ curl -sf -H "Metadata-Flavor: Google" "{md}/$1"; }}',
        "name=$(md instance-id)",
        "worker=$(md agent-worker-number)",
        "accel=$(md accelerator-type)",
        r"""topology=$(md tpu-env | sed -n "s/^TOPOLOGY: *'\(.*\)'/\1/p")""",
        "hosts=$(md worker-network-endpoints | tr ',' '\\n' | cut -d: -f3 | paste -sd, -)",
        f"cat > {shlex.quote(profile)} <<EOF",
        "export TPU_NAME=$name TPU_WORKER_ID=$worker TPU_ACCELERATOR_TYPE=$accel TPU_TOPOLOGY=$topology",
        "export TPU_WORKER_HOSTNAMES=$hosts",
        f"export {gcemetadata.GCE_VM_VAR}=1",
        "EOF",
        f". {shlex.quote(profile)}",
        f'python3 -m pip install -q "ray[default]=={ray_version}" "jax[tpu]"',
        f"ray start --address={shlex.quote(ray_address)}",
    ]
    return "\n".join(lines) + "\n"


def make_client(endpoint: str | None = None, *, anonymous: bool = False) -> Any:
    """A ``tpu_v2.TpuClient`` over REST: Application Default Credentials against Google, or
    anonymous credentials against ``endpoint`` (a local server answering as the API, for tests)."""
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.auth.exceptions import GoogleAuthError
    from google.cloud import tpu_v2

    options = ClientOptions(api_endpoint=endpoint) if endpoint else None
    creds = AnonymousCredentials() if anonymous else None  # type: ignore[no-untyped-call]
    try:
        return tpu_v2.TpuClient(credentials=creds, transport="rest", client_options=options)
    except GoogleAuthError as err:
        cause = str(err).split(". ")[0].rstrip(".")
        raise InputError(
            f"no Google Cloud credentials for --provider gce ({cause}): run `gcloud auth "
            "application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file"
        ) from None


@dataclass
class _Group:
    request: SliceRequest
    error: str = ""  # the API refused the create: FAILED with its words
    deleting: bool = False
    preempted_at: float | None = None  # first seen preempted
    reclaimed: bool = False  # its queued resource was deleted to free the quota


class GceProvider:
    """Slice groups as queued resources; see the module docstring."""

    kind = "gce"

    def __init__(
        self,
        config: GceConfig,
        *,
        client: Any = None,
        clock: Callable[[], float] = time.time,
        reclaim_interval_s: float = 10.0,
        notices: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        """``reclaim_interval_s`` > 0 runs :meth:`reclaim` in a background thread; 0 leaves it to
        the caller (tests). ``notices`` gives ``{slice: deadline}`` of the hosts' metadata notices
        (default: what the TPU VMs' runners publish in Ray's KV, ``host.notices.published``)."""
        self.config = config
        self._client = client if client is not None else make_client()
        self._clock = clock
        self._notices = notices if notices is not None else notices_mod.published
        self._groups: dict[str, _Group] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if reclaim_interval_s > 0:
            self._thread = threading.Thread(
                target=self._loop, args=(reclaim_interval_s,), name="gce-reclaim", daemon=True
            )
            self._thread.start()

    # -- requests ----------------------------------------------------------------------------------

    def queued_resource(self, request: SliceRequest) -> Any:
        """The ``QueuedResource`` for a group (what :meth:`create` sends)."""
        from google.cloud import tpu_v2

        st = catalog.slice_type(request.accelerator_type)
        node = tpu_v2.Node(
            accelerator_type=st.accelerator_type,
            runtime_version=self.config.runtime_version or RUNTIME_VERSIONS[st.generation.name],
            labels={**self.config.labels, GROUP_LABEL: request.name},
            metadata={"startup-script": startup_script(self.config.ray_address, self.config.ray_version)},
        )
        if self.config.network or self.config.subnetwork:
            node.network_config = tpu_v2.NetworkConfig(
                network=self.config.network, subnetwork=self.config.subnetwork, enable_external_ips=False
            )
        if self.config.service_account:
            node.service_account = tpu_v2.ServiceAccount(
                email=self.config.service_account, scope=["https://www.googleapis.com/auth/cloud-platform"]
            )
        spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=self.config.parent, node=node)
        if request.count == 1:
            spec.node_id = f"{request.name}-0"
        else:
            spec.multislice_params = tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams(
                node_count=request.count, node_id_prefix=request.name
            )
        qr = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]))
        if request.spot:
            qr.spot = tpu_v2.QueuedResource.Spot()
        return qr

    def _name(self, group: str) -> str:
        return f"{self.config.parent}/queuedResources/{group}"

    # -- the protocol ------------------------------------------------------------------------------

    def create(self, request: SliceRequest) -> None:
        from google.api_core import exceptions

        validate(request)
        with self._lock:
            old = self._groups.get(request.name)
            if old is not None and old.request == request and not old.deleting:
                return
            self._groups[request.name] = group = _Group(request)
        try:
            self._client.create_queued_resource(
                parent=self.config.parent,
                queued_resource_id=request.name,
                queued_resource=self.queued_resource(request),
            )
        except exceptions.Conflict:  # 409 ALREADY_EXISTS
            pass  # made by an earlier provider (a restarted control plane): adopt it
        except _api_errors() as err:
            group.error = f"Cloud TPU API refused the queued resource: {_words(err)}"

    def delete(self, name: str, *, force: bool = False) -> None:
        """Delete the queued resource and its nodes (``force=True`` in the API: the slice manager has
        drained or preempted the holder already, so running nodes are expected). A group this
        provider does not know (made before a restart) is deleted too."""
        from google.api_core import exceptions

        with self._lock:
            group = self._groups.get(name)
            if group is not None:
                group.deleting = True
                if group.error or group.reclaimed:  # nothing exists in the cloud
                    del self._groups[name]
                    return
        try:
            self._client.delete_queued_resource(request={"name": self._name(name), "force": True})
        except exceptions.NotFound:
            with self._lock:
                self._groups.pop(name, None)
        except _api_errors() as err:
            raise ClusterError(
                f"Cloud TPU API: could not delete {name}: {_words(err)}", retry_after=10.0
            ) from err

    def poll(self) -> list[GroupStatus]:

        try:
            qrs = {
                q.name.rsplit("/", 1)[-1]: q
                for q in self._client.list_queued_resources(parent=self.config.parent)
            }
            nodes: dict[str, list[Any]] = {}
            for n in self._client.list_nodes(parent=self.config.parent):
                nodes.setdefault(n.queued_resource.rsplit("/", 1)[-1], []).append(n)
        except _api_errors() as err:
            with self._lock:
                groups = list(self._groups.values())
            why = f"Cloud TPU API unreachable: {_words(err)}"
            return [GroupStatus(g.request.name, GroupState.FAILED, why) for g in groups]
        noticed = self._read_notices()
        now = self._clock()
        out = []
        with self._lock:
            for name, g in list(self._groups.items()):
                status = self._status(
                    g, qrs.get(name), sorted(nodes.get(name, []), key=lambda n: n.name), now, noticed
                )
                if status is None:
                    del self._groups[name]
                else:
                    out.append(status)
        return out

    def _read_notices(self) -> Mapping[str, float]:
        try:
            return self._notices()
        except Exception as err:  # Ray away for a moment: the API's own states still count
            log.warning("gce provider: the hosts' notices could not be read: %s", err)
            return {}

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # -- states ------------------------------------------------------------------------------------

    def _status(
        self, g: _Group, qr: Any, nodes: list[Any], now: float, noticed: Mapping[str, float]
    ) -> GroupStatus | None:
        name = g.request.name
        if g.error:
            return GroupStatus(name, GroupState.FAILED, g.error)
        if qr is None:
            if g.deleting:
                return None  # deleted
            if g.reclaimed:
                return GroupStatus(name, GroupState.SUSPENDED, _PREEMPTED_MSG, ())
            return GroupStatus(name, GroupState.WAITING_FOR_RESOURCES, "the queued resource is being created")
        qr_state = qr.state.state.name
        state = _QR_STATES.get(qr_state, GroupState.WAITING_FOR_RESOURCES)
        preempted = any(n.state.name in _PREEMPTED_NODE for n in nodes)
        if preempted and g.preempted_at is None:
            g.preempted_at = now
        slices = tuple(self._slice(g, n, noticed) for n in nodes)
        message = ""
        if state is GroupState.FAILED:
            message = qr.state.failed_data.error.message or "the queued resource failed"
        elif preempted or state is GroupState.SUSPENDED:
            state, message = GroupState.SUSPENDED, _PREEMPTED_MSG
        elif state is GroupState.WAITING_FOR_RESOURCES:
            message = (
                f"queued resource {qr_state}: waiting for {g.request.count} x {g.request.accelerator_type}"
            )
        return GroupStatus(name, state, message, slices)

    def _slice(self, g: _Group, node: Any, noticed: Mapping[str, float]) -> PhysicalSlice:
        hosts = len(node.network_endpoints) or catalog.slice_type(g.request.accelerator_type).hosts
        state, health = node.state.name, node.health.name
        if state in _PREEMPTED_NODE:
            h = HostHealth.PREEMPTED
        elif state in _REPAIRING_NODE or health in _UNHEALTHY:
            h = HostHealth.REPAIRING
        else:
            h = HostHealth.READY
        name = node.name.rsplit("/", 1)[-1]
        # The API shows a preemption only once it happened: its deadline is then, not later. Before
        # that, the hosts' own metadata server announces it (relayed by their runners); a notice
        # whose deadline came before this node was made was about an earlier node of the same name.
        notice = noticed.get(name)
        created = node.create_time.timestamp() if node.create_time else None
        if notice is not None and created is not None and notice < created:
            notice = None
        deadline = g.preempted_at if h is HostHealth.PREEMPTED else notice
        return PhysicalSlice(name, (h,) * hosts, deadline)

    # -- housekeeping ------------------------------------------------------------------------------

    def reclaim(self) -> list[str]:
        """Delete the queued resource (``force=True``) of every preempted group, so its nodes stop
        holding quota; returns the groups reclaimed. The groups stay reported ``SUSPENDED``."""
        from google.api_core import exceptions

        statuses = self.poll()
        done = []
        for s in statuses:
            with self._lock:
                g = self._groups.get(s.name)
                due = g is not None and s.state is GroupState.SUSPENDED and not g.reclaimed and not g.deleting
            if not due or g is None:
                continue
            try:
                self._client.delete_queued_resource(request={"name": self._name(s.name), "force": True})
            except exceptions.NotFound:
                pass
            except _api_errors() as err:
                log.warning("gce provider: could not delete preempted %s: %s", s.name, _words(err))
                continue
            with self._lock:
                g.reclaimed = True
            done.append(s.name)
        return done

    def _loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.reclaim()
            except Exception as err:  # the loop outlives one bad call; poll reports the API's state
                log.warning("gce provider: %s", err)


_PREEMPTED_MSG = "spot preemption: the slice was preempted; its queued resource is deleted to free the quota"
