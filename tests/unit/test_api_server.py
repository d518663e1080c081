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


def test_device_metrics_leave_out_a_slice_that_left_and_count_a_broken_one_s_hosts_down(
    tmp_path: Path,
) -> None:
    """Ray lists the dead hosts of a slice that ended on purpose (an autoscaler's scale-in) long
    after it left the slices table: they are not hosts down (``tpufleet_host_up`` 0 pages as the
    critical ``TpufleetHostDown``). A crashed host of a slice the table keeps, BROKEN, still is."""
    cluster = MemoryCluster.of("v4-16:3")
    with ControlPlane(cluster, state_dir=tmp_path) as cp:
        cp.service.run_once()
        cluster.end_slice("tpu-v4-16-1", "drained as idle")
        cluster.kill_host("tpu-v4-16-2", 1)
        cp.service.run_once()
        assert [s.name for s in cp.store.slices.all()] == ["tpu-v4-16-0", "tpu-v4-16-2"]
        cp.devices.sample_once()
        up = {
            (s.labels["slice"], s.labels["host"]): s.value
            for family in cp.loop_metrics.collect()
            if family.name == "tpufleet_host_up"
            for s in family.samples
        }
    assert up == {
        ("tpu-v4-16-0", "0"): 1.0,
        ("tpu-v4-16-0", "1"): 1.0,
        ("tpu-v4-16-2", "0"): 1.0,
        ("tpu-v4-16-2", "1"): 0.0,
    }
