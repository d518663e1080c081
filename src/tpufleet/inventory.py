"""Discover the TPU slices of any live Ray cluster (emulated or real) from its node table.

Ray's ``TPUAcceleratorManager`` labels every TPU node with ``ray.io/tpu-slice-name``,
``ray.io/tpu-worker-id``, ``ray.io/tpu-topology`` and ``ray.io/tpu-pod-type`` and gives it the
``TPU`` resource (chips on that host). :func:`slices_from_nodes` turns ``ray.nodes()``-style dicts
into :class:`~tpufleet.control.cluster.protocol.SliceInfo` values, one per slice, with the reasons a slice
is not intact. It is a pure function; :func:`discover` is the thin wrapper that reads a cluster.

A slice is intact when every worker id ``0 .. hosts-1`` has exactly one alive node, the hosts agree
on type and topology, and their chips add up to the topology's: the same facts
``ray.util.tpu.get_num_tpu_slices`` checks, spelled out as reasons.

Ray keeps dead nodes in its node table (up to 1,000), so a slice that ended on purpose (drained for
a spot preemption, or as idle by an autoscaler, then ended) stays there as dead nodes. Such a
slice's ``SliceInfo.gone`` says why: every node dead, and each death one that was meant
(``DeathReason``). ``doctor`` lists it as gone rather than broken, and the control plane lets it
leave its slices table rather than keep it ``BROKEN``.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tpufleet import catalog, contract
from tpufleet.errors import InputError, SpecError
from tpufleet.fleet import HostInfo, SliceInfo

SLICE_NAME, WORKER_ID = contract.SLICE_LABEL, contract.WORKER_LABEL
TOPOLOGY = "ray.io/tpu-topology"
POD_TYPE = "ray.io/tpu-pod-type"

Node = Mapping[str, Any]

__all__ = ["discover", "slices_from_nodes"]

# Why a node died, as Ray's GCS records it (``NodeDeathInfo.Reason``, the ``DeathReason`` of a
# ``ray.nodes()`` dict): the deaths that were meant, and how doctor words them. 2 is
# UNEXPECTED_TERMINATION (a crash, a lost VM, missed heartbeats) and 0 UNSPECIFIED: never meant.
MEANT_DEATHS = {
    1: "stopped",  # EXPECTED_TERMINATION: ``ray stop``, a node shut down gracefully
    3: "drained for a preemption",  # AUTOSCALER_DRAIN_PREEMPTED: a notice, then the deadline
    4: "drained as idle",  # AUTOSCALER_DRAIN_IDLE: an autoscaler's scale-in
}
# Ray's message for a death is whatever the caller of a drain wrote (any client of the GCS can):
# kept to a line's worth.
MESSAGE_CHARS = 200


def _labels(node: Node) -> Mapping[str, str]:
    return node.get("Labels") or {}


def _chips(node: Node) -> int:
    return int((node.get("Resources") or {}).get("TPU", 0))


def _gce_type(pod_type: str) -> str:
    """Ray spells tpu7x ``v7x-8``; tpufleet (and GCE) spell it ``tpu7x-8``."""
    try:
        return catalog.slice_type(pod_type).accelerator_type
    except SpecError:
        return pod_type


def _one(values: Iterable[str], what: str, problems: list[str]) -> str:
    distinct = sorted(set(values))
    if len(distinct) > 1:
        problems.append(f"hosts disagree on {what}: {', '.join(distinct)}")
    return distinct[0] if distinct else ""


def _expected_hosts(topology: str, nodes: Sequence[Node], problems: list[str]) -> int:
    """Hosts the slice should have: the topology's chips over the chips each host has."""
    try:
        chips = catalog.Topology.parse(topology).chips
    except SpecError:
        problems.append(f"topology label {topology!r} is not a topology")
        return len({_labels(n).get(WORKER_ID) for n in nodes})
    per_host = {_chips(n) for n in nodes if n.get("Alive")} or {_chips(n) for n in nodes}
    if len(per_host) > 1:
        problems.append(f"hosts disagree on chips per host: {sorted(per_host)}")
    chips_per_host = max(per_host) if per_host else 0
    if chips_per_host <= 0:
        problems.append("hosts have no TPU resource")
        return 1
    return max(1, chips // chips_per_host)


def _hosts(nodes: Sequence[Node], expected: int, problems: list[str]) -> tuple[HostInfo, ...]:
    by_worker: dict[int, list[Node]] = defaultdict(list)
    for n in nodes:
        raw = _labels(n).get(WORKER_ID, "")
        if not raw.isdigit():
            problems.append(f"node {n.get('NodeID', '?')} has worker id {raw!r}, not a number")
            continue
        by_worker[int(raw)].append(n)
    hosts = []
    for worker in range(expected):
        candidates = by_worker.pop(worker, [])
        alive = [n for n in candidates if n.get("Alive")]
        head = " (the slice's head)" if worker == 0 else ""
        if len(alive) > 1:
            ids = ", ".join(str(n.get("NodeID")) for n in alive)
            problems.append(f"worker id {worker} is claimed by {len(alive)} alive nodes: {ids}")
        elif not alive:
            problems.append(f"worker {worker}{head} is {'dead' if candidates else 'missing'}")
        pick = alive or candidates
        node = pick[0] if pick else None
        hosts.append(
            HostInfo(
                worker_id=worker,
                node_id=node.get("NodeID") if node else None,
                address=node.get("NodeManagerAddress") if node else None,
                alive=bool(alive),
            )
        )
    for worker in sorted(w for w, ns in by_worker.items() if any(n.get("Alive") for n in ns)):
        problems.append(f"worker id {worker} is out of range: the slice has workers 0..{expected - 1}")
    return tuple(hosts)


def _slice(name: str, nodes: Sequence[Node]) -> SliceInfo:
    problems: list[str] = []
    live = [n for n in nodes if n.get("Alive")] or list(nodes)
    pod_type = _one((_labels(n).get(POD_TYPE, "") for n in live), "accelerator type", problems)
    topology = _one((_labels(n).get(TOPOLOGY, "") for n in live), "topology", problems)
    expected = _expected_hosts(topology, nodes, problems)
    hosts = _hosts(nodes, expected, problems)
    chips = sum(_chips(n) for n in nodes if n.get("Alive"))
    try:
        wanted = catalog.Topology.parse(topology).chips
    except SpecError:
        wanted = 0  # already reported by _expected_hosts
    if wanted and chips != wanted and all(h.alive for h in hosts):
        problems.append(f"alive hosts have {chips} chips, topology {topology} has {wanted}")
    return SliceInfo(
        name=name,
        accelerator_type=_gce_type(pod_type),
        topology=topology,
        expected_hosts=expected,
        hosts=hosts,
        problems=tuple(problems),
        gone=_gone(nodes),
    )


def slices_from_nodes(nodes: Iterable[Node]) -> list[SliceInfo]:
    """Every TPU slice in ``nodes`` (``ray.nodes()`` dicts, alive and dead), sorted by name."""
    groups: dict[str, list[Node]] = defaultdict(list)
    for node in nodes:
        name = _labels(node).get(SLICE_NAME)
        if name:
            groups[name].append(node)
    return [_slice(name, groups[name]) for name in sorted(groups)]


def _gone(members: Sequence[Node]) -> str:
    """Why a slice's nodes all ended on purpose: every node dead, each of a death that was meant
    (``MEANT_DEATHS``); the reason's words and Ray's message for it, cut to ``MESSAGE_CHARS``.
    Empty for a slice with a node alive, or one that died otherwise (which is broken)."""
    reasons = [int(n.get("DeathReason") or 0) for n in members if not n.get("Alive")]
    if len(reasons) < len(members) or not all(r in MEANT_DEATHS for r in reasons):
        return ""
    message = next((str(m) for n in members if (m := n.get("DeathReasonMessage"))), "")
    if len(message) > MESSAGE_CHARS:
        message = message[: MESSAGE_CHARS - 1] + "\u2026"
    words = MEANT_DEATHS[reasons[0]]
    return f"{words}: {message}" if message else words


def resolve_address(ray_address: str | None) -> str | None:
    """The cluster to look at: the argument, else ``RAY_ADDRESS``, else the connected one (None).

    Raises :class:`InputError` for anything but a GCS ``host:port`` (a user error, exit 2).
    """
    address = ray_address or os.environ.get("RAY_ADDRESS") or None
    if address is None:
        return None
    source = "--ray-address" if ray_address else "RAY_ADDRESS"
    if "://" in address:
        raise InputError(f"{source} {address} is a Ray Client or URL address; give the GCS address host:port")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"{source} {address!r} is not a GCS address host:port, e.g. 10.0.0.1:6379")
    return address


def discover(ray_address: str | None = None) -> list[SliceInfo]:
    """The slices of the cluster at ``ray_address`` (GCS ``host:port``; see :func:`resolve_address`)."""
    from tpufleet.emulator.raynodes import read_nodes

    return slices_from_nodes(read_nodes(resolve_address(ray_address)))
