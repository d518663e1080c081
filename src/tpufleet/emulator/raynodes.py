"""Read a Ray cluster's node table (the same dicts ``ray.nodes()`` returns) without a driver.

``ray.nodes()`` needs ``ray.init``, which registers a job and takes seconds; the CLI's ``status``
and the emulator's join polling only need the GCS node table. Ray's own ``GlobalState`` reads it
from an address directly (``ray.cluster_utils.Cluster`` does the same). This uses one private Ray
API, isolated here; when the calling process is already connected to that cluster, the public
``ray.nodes()`` is used instead.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

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
