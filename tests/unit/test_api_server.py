"""``ControlPlane.start_http``: the socket it serves the API on; a serving process's garbage collector."""

from __future__ import annotations

import gc
import socket
from pathlib import Path

from tpufleet.api.processes import GC_THRESHOLDS, settle_gc
from tpufleet.api.server import ControlPlane
from tpufleet.client.http import Client
from tpufleet.control.cluster.memory import MemoryCluster


def test_every_api_connection_has_tcp_nodelay(tmp_path: Path) -> None:
    """Without TCP_NODELAY on the accepted connection, a response written in two parts (headers,
    then body) waits for the client's delayed ACK: about 40 ms on every keep-alive request."""
    with (
        ControlPlane(MemoryCluster.of("v4-16"), state_dir=tmp_path) as cp,
        Client(cp.start_http(), cp.admin_token) as client,
    ):
        client.whoami()
        client.slices()  # a second request on the same keep-alive connection
        assert cp._http is not None
        transports = [c.transport for c in cp._http.server_state.connections]
        assert transports, "the client's connection is open"
        for transport in transports:
            sock = transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_a_settled_collector_leaves_what_exists_alone_and_collects_less_often() -> None:
    """``settle_gc`` (a serving process, once its app is built): what exists is frozen out of later
    collections, and the youngest generation is collected every 10,000 net allocations."""
    before = gc.get_threshold()
    try:
        settle_gc()
        assert gc.get_threshold() == GC_THRESHOLDS and GC_THRESHOLDS[0] == 10_000
        frozen = gc.get_freeze_count()
        assert frozen > 10_000  # this process's modules, pytest's and ours: far more than that
        gc.collect()
        assert gc.get_freeze_count() == frozen  # a full collection walks none of it, and keeps it so
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
