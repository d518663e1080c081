"""The memory provider on a fake clock: queued-resource states, capacity, failures, spot notices."""

from __future__ import annotations

import pytest

from tpufleet.control.cluster.memory import FakeClock, MemoryCluster
from tpufleet.errors import ConflictError, SpecError
from tpufleet.provision.base import GroupState, HostHealth, Provider, SliceRequest
from tpufleet.provision.memory import MemoryProvider


def states(p: MemoryProvider) -> dict[str, str]:
    return {s.name: str(s.state) for s in p.poll()}


def test_it_is_a_provider_and_moves_through_the_queued_resource_states() -> None:
    clock = FakeClock()
    cluster = MemoryCluster.sandbox([], clock=clock)
    p = MemoryProvider(clock=clock, delay_s=5, on_up=cluster.add_slices, on_down=cluster.remove_slices)
    assert isinstance(p, Provider)
    p.create(SliceRequest("g", "v4-16", count=2))
    p.create(SliceRequest("g", "v4-16", count=2))  # idempotent by name
    with pytest.raises(ConflictError):
        p.create(SliceRequest("g", "v4-16", count=3))
    assert states(p) == {"g": "PROVISIONING"}
    clock.advance(5)
    (status,) = p.poll()
    assert status.state is GroupState.ACTIVE
    assert [s.name for s in status.slices] == ["g-0", "g-1"]
    assert status.slices[0].hosts == (HostHealth.READY, HostHealth.READY)  # v4-16: 2 hosts
    assert sorted(s.name for s in cluster.inventory()) == ["g-0", "g-1"]
    assert all(s.intact and s.expected_hosts == 2 for s in cluster.inventory())
    p.delete("g")
    assert states(p) == {}
    assert cluster.inventory() == []


def test_capacity_makes_a_request_wait_for_resources() -> None:
    clock = FakeClock()
    p = MemoryProvider(clock=clock, capacity={"v4-8": 1})
    p.create(SliceRequest("a", "v4-8"))
    p.create(SliceRequest("b", "v4-8"))
    assert states(p) == {"a": "ACTIVE", "b": "WAITING_FOR_RESOURCES"}
    assert "no capacity for 1 v4-8 slice(s): 0 of 1 free" in {s.name: s.message for s in p.poll()}["b"]
    p.delete("a")
    assert states(p) == {"b": "ACTIVE"}


def test_an_injected_failure_ends_the_next_request_failed_with_its_message() -> None:
    p = MemoryProvider(clock=FakeClock())
    p.fail_next("stockout", accelerator_type="v4-8")
    p.create(SliceRequest("x", "v4-16"))
    p.create(SliceRequest("y", "v4-8"))
    p.create(SliceRequest("z", "v4-8"))
    got = {s.name: (str(s.state), s.message) for s in p.poll()}
    assert got == {"x": ("ACTIVE", ""), "y": ("FAILED", "stockout"), "z": ("ACTIVE", "")}
    with pytest.raises(SpecError):
        p.create(SliceRequest("bad", "v4-7"))


def test_a_spot_notice_then_every_host_dies_together() -> None:
    clock = FakeClock()
    cluster = MemoryCluster.sandbox([], clock=clock)
    p = MemoryProvider(clock=clock, on_up=cluster.add_slices, on_down=cluster.remove_slices)
    p.create(SliceRequest("s", "v4-16", spot=True))
    deadline = p.preempt("s-0", notice_s=30)
    (status,) = p.poll()
    assert status.slices[0].preempt_deadline == deadline == clock.now + 30
    assert [s.name for s in cluster.inventory()] == ["s-0"]
    clock.advance(30)
    (status,) = p.poll()
    assert status.state is GroupState.SUSPENDED
    assert status.slices[0].hosts == (HostHealth.PREEMPTED, HostHealth.PREEMPTED)
    assert cluster.inventory() == []
    with pytest.raises(KeyError):
        p.preempt("nope")
