"""What ``RayExecutor.launch`` asks each host to run with, and slices read from node labels; no Ray."""

from __future__ import annotations

from typing import Any

import pytest

from tpufleet.control.cluster.protocol import AttemptSpec, HostInfo, SliceInfo
from tpufleet.control.ray.client import _requests
from tpufleet.inventory import slices_from_nodes


def _slice(name: str, *addresses: str) -> SliceInfo:
    hosts = tuple(HostInfo(w, f"node-{name}-{w}", a, True) for w, a in enumerate(addresses))
    return SliceInfo(name, "v4-16", "2x2x2", len(addresses), hosts)


def _spec(*slices: SliceInfo) -> AttemptSpec:
    return AttemptSpec(
        "job-1", 2, tuple(s.name for s in slices), "v4-16", ("run",), {"A": "1"}, checkpoint_dir="/ck"
    )


@pytest.mark.parametrize(
    ("slices", "megascale_port"),
    [
        ([_slice("a", "10.0.0.1", "10.0.0.2")], None),
        ([_slice("a", "10.0.0.1", "10.0.0.2"), _slice("b", "10.0.1.1", "10.0.1.2")], "8081"),
        ([_slice("a", "127.0.0.1", "127.0.0.1"), _slice("b", "127.0.0.1", "127.0.0.1")], "free"),
    ],
    ids=["one-slice", "two-slices-real", "two-slices-emulated"],
)
def test_every_host_gets_the_contract(slices: list[SliceInfo], megascale_port: str | None) -> None:
    layout = [(s.name, h.worker_id) for s in slices for h in s.hosts]
    payloads = _requests(_spec(*slices), slices, layout)
    assert all((p.layout, p.command, p.user_env) == (tuple(layout), ("run",), {"A": "1"}) for p in payloads)
    assert len(payloads) == len(layout)
    ports = {p.env.get("MEGASCALE_PORT") for p in payloads}
    jax_ports = {p.env["TPUFLEET_JAX_COORDINATOR_PORT"] for p in payloads}
    assert len(ports) == 1 and len(jax_ports) == 1
    port = ports.pop()
    if megascale_port == "free":
        assert port is not None and port != "8081" and int(port) > 0
    else:
        assert port == megascale_port
    for p, (slice_name, worker) in zip(payloads, layout, strict=True):
        env: dict[str, Any] = p.env
        assert env["TPUFLEET_JOB_ID"] == "job-1" and env["TPUFLEET_ATTEMPT"] == "2"
        assert env["TPUFLEET_CHECKPOINT_DIR"] == "/ck"
        info = next(s for s in slices if s.name == slice_name)
        assert p.contract["TPU_NAME"] == slice_name and p.contract["TPU_WORKER_ID"] == str(worker)
        assert p.contract["TPU_WORKER_HOSTNAMES"] == ",".join(h.address or "" for h in info.hosts)
        if len(slices) > 1:
            assert env["MEGASCALE_COORDINATOR_ADDRESS"] == slices[0].hosts[0].address
            assert env["MEGASCALE_SLICE_ID"] == str(slices.index(info))
            assert env["MEGASCALE_NUM_SLICES"] == str(len(slices))


def _node(slice_name: str, worker: int, pod_type: str, topology: str, chips: int) -> dict[str, Any]:
    labels = {
        "ray.io/tpu-slice-name": slice_name,
        "ray.io/tpu-worker-id": str(worker),
        "ray.io/tpu-pod-type": pod_type,
        "ray.io/tpu-topology": topology,
    }
    address = f"10.0.0.{worker + 1}"
    return {"NodeID": f"{slice_name}-{worker}", "Alive": True, "NodeManagerAddress": address,
            "Labels": labels, "Resources": {"TPU": float(chips)}}  # fmt: skip


@pytest.mark.parametrize(
    ("pod_type", "topology", "chips", "hosts", "accelerator_type"),
    [("v4-16", "2x2x2", 4, 2, "v4-16"), ("v6e-4", "2x2", 4, 1, "v6e-4"), ("v7x-8", "2x2x1", 4, 1, "tpu7x-8")],
)
def test_slices_discovered_from_node_labels_feed_the_contract(
    pod_type: str, topology: str, chips: int, hosts: int, accelerator_type: str
) -> None:
    """The executor discovers slices with ``tpufleet.inventory`` (tested there, reason by reason);
    what it finds is enough to build every host's contract, in GCE spelling."""
    head = {"NodeID": "head", "Alive": True, "Labels": {}, "Resources": {"CPU": 1.0}}
    nodes = [_node("s", w, pod_type, topology, chips) for w in range(hosts)]
    (info,) = slices_from_nodes([head, *nodes])
    assert info.intact and info.expected_hosts == hosts
    spec = AttemptSpec("j", 1, ("s",), info.accelerator_type, ("run",))
    payloads = _requests(spec, [info], [("s", w) for w in range(hosts)])
    assert [p.contract["TPU_WORKER_ID"] for p in payloads] == [str(w) for w in range(hosts)]
    assert {p.contract["TPU_ACCELERATOR_TYPE"] for p in payloads} == {accelerator_type}
    assert {p.contract["TPU_TOPOLOGY"] for p in payloads} == {topology}
