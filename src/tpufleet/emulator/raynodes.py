"""Read a Ray cluster's node table (the same dicts ``ray.nodes()`` returns) without a driver.

``ray.nodes()`` needs ``ray.init``, which registers a job and takes seconds; the CLI's ``status``
and the emulator's join polling only need the GCS node table. Ray's own ``GlobalState`` reads it
from an address directly (``ray.cluster_utils.Cluster`` does the same). This uses one private Ray
API, isolated here; when the calling process is already connected to that cluster, the public
``ray.nodes()`` is used instead. :func:`drain` sends the GCS's DrainNode RPC (Ray's private GCS
client, as ``ray drain-node`` does), for a spot notice and an emulated slice's scale-in.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

from tpufleet.contract import SLICE_LABEL
from tpufleet.errors import ClusterError


def _reachable(address: str, timeout_s: float = 2.0) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


# Ray reports a refused token only in a log line, so every failed read names the likely cause.
_AUTH_HINT = (
    "(If the cluster uses Ray token auth, this process needs its token: set RAY_AUTH_MODE=token and "
    "RAY_AUTH_TOKEN_PATH=<token file>; an emulated fleet's is <state dir>/ray-auth-token.)"
)
_states: dict[str, Any] = {}  # GCS address -> GlobalState, connected with this process's token


def _global_state(address: str) -> Any:
    if address in _states:
        return _states[address]
    import importlib

    ray_state: Any = importlib.import_module("ray._private.state")
    raylet: Any = importlib.import_module("ray._raylet")
    state = ray_state.GlobalState()
    options = raylet.GcsClientOptions.create(
        address, None, allow_cluster_id_nil=True, fetch_cluster_id_if_nil=False
    )
    state._initialize_global_state(options)
    _states[address] = state
    return state


def forget() -> None:
    """Drop every GCS connection made so far: this process's Ray auth token changed."""
    while _states:
        _, state = _states.popitem()
        with contextlib.suppress(Exception):  # a GCS that is gone
            state.disconnect()


def _connected_address() -> str | None:
    import ray

    if not ray.is_initialized():
        return None
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:
        return None


def read_nodes(address: str | None = None) -> list[dict[str, Any]]:
    """Every node Ray knows (alive and dead), as ``ray.nodes()`` dicts.

    ``address`` is the GCS address (``ip:port``); None means the cluster this process is connected
    to with ``ray.init``. Raises :class:`ClusterError` when nothing answers there.
    """
    import ray

    ray_api: Any = ray  # Ray's functions are untyped
    connected = _connected_address()
    if address is None or (connected is not None and connected == address):
        if connected is None:
            raise ClusterError("not connected to a Ray cluster; give --ray-address or set RAY_ADDRESS")
        return list(ray_api.nodes())
    if not _reachable(address):
        raise ClusterError(f"no Ray cluster answers at {address}", retry_after=5.0)
    try:
        return list(_global_state(address).node_table())
    except Exception as err:  # Ray raises RaySystemError and friends
        raise ClusterError(
            f"could not read the node table of {address}: {err} {_AUTH_HINT}", retry_after=5.0
        ) from err


def alive_slice_nodes(address: str, slice_name: str) -> list[str]:
    """The node ids (hex) of the live hosts of ``slice_name`` in the cluster at ``address``."""
    return [
        str(n["NodeID"])
        for n in read_nodes(address)
        if n.get("Alive") and (n.get("Labels") or {}).get(SLICE_LABEL) == slice_name
    ]


def drain(
    address: str,
    node_ids: list[str],
    reason: str,
    message: str,
    deadline_s: float = 0.0,
    timeout_s: float = 10.0,
) -> dict[str, str]:
    """Ask Ray's GCS to drain each of ``node_ids`` (hex): the DrainNode RPC that ``ray drain-node``
    sends and autoscaler v2 uses to end nodes, ``reason`` one of Ray's ``DrainNodeReason`` names
    (``DRAIN_NODE_REASON_PREEMPTION``, which no raylet refuses; ``DRAIN_NODE_REASON_IDLE_TERMINATION``,
    which a busy one does), ``deadline_s`` seconds since the epoch (0: none). Once a drained node
    dies, Ray records its death as the drain's (``AUTOSCALER_DRAIN_PREEMPTED``, ``_IDLE``) with
    ``message``. Returns the nodes that refused, node id -> Ray's why."""
    import importlib

    pb: Any = importlib.import_module("ray.core.generated.autoscaler_pb2")
    raylet: Any = importlib.import_module("ray._raylet")
    client = raylet.GcsClient(address=address)
    refused = {}
    for node_id in node_ids:
        ok, why = client.drain_node(
            node_id, pb.DrainNodeReason.Value(reason), message, int(deadline_s * 1000), timeout=timeout_s
        )
        if not ok:
            refused[node_id] = str(why)
    return refused


def stop(address: str, node_ids: list[str], timeout_s: float = 10.0) -> list[str]:
    """Stop each of ``node_ids`` (hex) busy or not, as Ray's autoscaler v2 ends a node for any
    cause but idleness (``ray_stopper``: the GCS's DrainNodes RPC): the raylet shuts down at once,
    ending what runs there, and Ray records the death as meant (``EXPECTED_TERMINATION``,
    "Terminated by autoscaler."). Returns the node ids the GCS stopped."""
    import importlib

    raylet: Any = importlib.import_module("ray._raylet")
    client = raylet.GcsClient(address=address)
    stopped = client.drain_nodes(node_ids=[bytes.fromhex(n) for n in node_ids], timeout=timeout_s)
    return [bytes(n).hex() for n in stopped]
