"""inventory.slices_from_nodes over ray.nodes()-style dicts: what intact means, and every reason not."""

from __future__ import annotations

from typing import Any

import pytest

from tpufleet.errors import InputError
from tpufleet.inventory import MESSAGE_CHARS, resolve_address, slices_from_nodes

_ids = iter(range(10_000))


def node(
    slice_name: str | None,
    worker: int | str,
    *,
    alive: bool = True,
    pod_type: str = "v4-16",
    topology: str = "2x2x2",
    chips: int = 4,
) -> dict[str, Any]:
    """A node dict as Ray's TPUAcceleratorManager labels it (trimmed to what inventory reads)."""
    labels = {"ray.io/node-id": f"n{next(_ids)}"}
    if slice_name is not None:
        labels |= {
            "ray.io/tpu-slice-name": slice_name,
            "ray.io/tpu-worker-id": str(worker),
            "ray.io/tpu-topology": topology,
            "ray.io/tpu-pod-type": pod_type,
            "ray.io/accelerator-type": "TPU-" + pod_type.split("-")[0].upper(),
        }
    return {
        "NodeID": labels["ray.io/node-id"],
        "Alive": alive,
        "NodeManagerAddress": "10.0.0.1",
        "Labels": labels,
        "Resources": {"TPU": chips, "CPU": 8} if slice_name else {"CPU": 8},
    }


def v4(name: str = "s", workers: tuple[int, ...] = (0, 1), **kw: Any) -> list[dict[str, Any]]:
    return [node(name, w, **kw) for w in workers]


def test_an_intact_multi_host_slice() -> None:
    (s,) = slices_from_nodes([node(None, 0), *v4("tpu-v4-16-0")])
    assert (s.name, s.accelerator_type, s.topology, s.expected_hosts) == ("tpu-v4-16-0", "v4-16", "2x2x2", 2)
    assert s.intact and [h.worker_id for h in s.hosts] == [0, 1] and all(h.alive for h in s.hosts)
    assert s.hosts[0].address == "10.0.0.1"


def test_single_host_and_ray_spelling_of_tpu7x() -> None:
    nodes = [node("a", 0, pod_type="v6e-4", topology="2x2"), node("b", 0, pod_type="v7x-8", topology="2x2x1")]
    a, b = slices_from_nodes(nodes)
    assert (a.accelerator_type, a.expected_hosts, a.intact) == ("v6e-4", 1, True)
    assert (b.accelerator_type, b.expected_hosts, b.intact) == ("tpu7x-8", 1, True)


@pytest.mark.parametrize(
    ("nodes", "problem"),
    [
        (v4(workers=(0,)), "worker 1 is missing"),
        (v4(workers=(1,)), "worker 0 (the slice's head) is missing"),
        ([node("s", 0), node("s", 1, alive=False)], "worker 1 is dead"),
        ([*v4(), node("s", 1)], "worker id 1 is claimed by 2 alive nodes"),
        ([*v4(), node("s", 2)], "worker id 2 is out of range"),
        ([node("s", 0), node("s", 1, topology="2x2x4")], "hosts disagree on topology"),
        ([node("s", 0), node("s", "x")], "has worker id 'x', not a number"),
        ([node("s", 0, chips=4), node("s", 1, chips=2)], "hosts disagree on chips per host"),
    ],
)
def test_every_reason_a_slice_is_not_intact(nodes: list[dict[str, Any]], problem: str) -> None:
    (s,) = slices_from_nodes(nodes)
    assert not s.intact
    assert any(problem in p for p in s.problems), s.problems


def test_a_restored_host_replaces_its_dead_node() -> None:
    dead, new = node("s", 1, alive=False), node("s", 1)
    (s,) = slices_from_nodes([node("s", 0), dead, new])
    assert s.intact and s.hosts[1].node_id == new["NodeID"]


def test_nodes_without_tpu_labels_are_not_slices() -> None:
    assert slices_from_nodes([node(None, 0), node(None, 0)]) == []


@pytest.mark.parametrize(
    ("arg", "env", "expected"),
    [
        ("10.0.0.1:6379", "10.9.9.9:1", "10.0.0.1:6379"),
        (None, "10.9.9.9:1", "10.9.9.9:1"),
        (None, None, None),  # the cluster this process is connected to
    ],
)
def test_resolve_address(
    arg: str | None, env: str | None, expected: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if env is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env)
    assert resolve_address(arg) == expected


@pytest.mark.parametrize("bad", ["foo", ":6379", "10.0.0.1:", "10.0.0.1:0", "10.0.0.1:x", "ray://h:10001"])
def test_resolve_address_refuses_what_is_not_a_gcs_address(bad: str) -> None:
    with pytest.raises(InputError, match="--ray-address"):
        resolve_address(bad)


def _dead(name: str, worker: int, reason: int, message: str = "") -> dict[str, Any]:
    return node(name, worker, alive=False) | {"DeathReason": reason, "DeathReasonMessage": message}


def _gone(nodes: list[dict[str, Any]]) -> dict[str, str]:
    """Each slice's ``SliceInfo.gone``: what doctor and the control plane read."""
    return {s.name: s.gone for s in slices_from_nodes(nodes)}


def test_a_slice_whose_every_host_ended_on_purpose_is_gone_and_any_other_is_not() -> None:
    """Ray's death reasons (``NodeDeathInfo.Reason``): 1 stopped, 3 drained for a preemption, 4
    drained as idle are meant; 2 (a crash, missed heartbeats) and 0 are not."""
    nodes = [
        *(_dead("spot", w, 3, "spot preemption of spot") for w in (0, 1)),  # a notice, then the deadline
        *(_dead("idle", w, 4) for w in (0, 1)),  # an autoscaler's scale-in
        _dead("half", 0, 3),  # one host drained, the other crashed: broken, not gone
        _dead("half", 1, 2),
        _dead("lost", 0, 2),  # every host lost: broken
        _dead("lost", 1, 2),
        _dead("back", 0, 3),  # preempted, then a new host under the same worker id: there
        node("back", 0),
        _dead("back", 1, 3),
        node("back", 1),
        node("alive", 0),
        node("alive", 1),
    ]
    assert _gone(nodes) == {
        "idle": "drained as idle",
        "spot": "drained for a preemption: spot preemption of spot",
    } | {name: "" for name in ("half", "lost", "back", "alive")}
    assert _gone([_dead("old", 0, 0)]) == {"old": ""}  # no reason recorded: not known to be meant


def test_a_drain_s_message_is_kept_to_a_line() -> None:
    """Whoever drains a node writes its message (any client of the GCS may): doctor keeps
    ``MESSAGE_CHARS`` of it, not a megabyte."""
    why = _gone([_dead("big", w, 4, "x" * 1_000_000) for w in (0, 1)])["big"]
    assert why == "drained as idle: " + "x" * (MESSAGE_CHARS - 1) + "\u2026"
