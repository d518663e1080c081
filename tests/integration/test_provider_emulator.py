"""``--provider emulator`` on the shared running fleet: a slice group is made of new emulated hosts
that Ray labels as a TPU slice, then a spot preemption with notice (``tpufleet emulate preempt
SLICE --notice S`` in another process) drains the hosts for preemption in Ray, the provider reports
the deadline, and every host dies together at the deadline; a deleted group ends as Ray's
autoscaler ends nodes (an idle host drained, a busy one stopped)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from tpufleet import doctor
from tpufleet.emulator import EmulatedFleet
from tpufleet.inventory import MEANT_DEATHS
from tpufleet.provision.base import GroupState, GroupStatus, HostHealth, SliceRequest
from tpufleet.provision.emulator import EmulatorConfig, EmulatorProvider

pytestmark = pytest.mark.integration

SLICE = "itest-spot-0"
NOTICE_S = 15  # long enough that the provider sees the notice before its deadline on a loaded machine


def _until(what: str, probe: Callable[[], Any], timeout_s: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (found := probe()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)
    return found


def _group(provider: EmulatorProvider, name: str) -> GroupStatus | None:
    return next((g for g in provider.poll() if g.name == name), None)


def _nodes(slice_name: str) -> list[dict[str, Any]]:
    return [n for n in ray.nodes() if n["Labels"].get("ray.io/tpu-slice-name") == slice_name]


def _death(slice_name: str) -> tuple[str, str]:
    """Once Ray has declared the one host of ``slice_name`` dead: its death reason's name and
    message (``NodeDeathInfo``)."""
    (dead,) = _until(
        "Ray to declare the host dead", lambda: [n for n in _nodes(slice_name) if not n["Alive"]]
    )
    reasons = importlib.import_module("ray.core.generated.common_pb2").NodeDeathInfo.Reason
    return reasons.Name(dead["DeathReason"]), dead["DeathReasonMessage"]


def _gone(slice_name: str) -> str:
    """Why doctor lists ``slice_name`` as gone; it must not be a finding too."""
    report = doctor.check(probe=False)
    assert slice_name not in {f.slice for f in report.findings}
    return dict(report.gone)[slice_name]


def test_create_active_in_ray_then_preempt_with_notice(fleet: EmulatedFleet, ray_client: Any) -> None:
    provider = EmulatorProvider(fleet.state_dir, EmulatorConfig(delay_s=1.0), interval_s=0.2)
    try:
        provider.create(SliceRequest("itest-spot", "v6e-4", spot=True))
        seen = {g.state for g in provider.poll() if g.name == "itest-spot"}
        _until(
            "ACTIVE",
            lambda: (g := _group(provider, "itest-spot")) and (seen.add(g.state) or g.state == "ACTIVE"),
        )
        assert GroupState.PROVISIONING in seen
        (node,) = [n for n in _nodes(SLICE) if n["Alive"]]
        assert node["Labels"]["ray.io/tpu-pod-type"] == "v6e-4"
        assert node["Resources"][SLICE] == 1.0

        @ray.remote(num_cpus=0, resources={SLICE: 1})
        class Holder:  # a held slice: Ray keeps a drained node until its work ends or it dies
            def ping(self) -> int:
                return 1

        holder = Holder.remote()
        assert ray.get(holder.ping.remote(), timeout=60) == 1

        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
        cmd = [
            "-m",
            "tpufleet",
            "emulate",
            "preempt",
            SLICE,
            "--notice",
            str(NOTICE_S),
            "--state-dir",
            str(fleet.state_dir),
        ]
        cli = subprocess.Popen(
            [sys.executable, *cmd], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        try:
            g = _until(
                "the notice",
                lambda: (g := _group(provider, "itest-spot")) and g.slices[0].preempt_deadline and g,
            )
            deadline = g.slices[0].preempt_deadline
            assert time.time() < deadline <= time.time() + NOTICE_S + 0.5
            assert g.state is GroupState.ACTIVE and g.slices[0].hosts == (HostHealth.READY,)
            state: Any = importlib.import_module("ray._private.state").state
            draining = state.get_draining_nodes()  # the hosts were told: drained for preemption
            assert draining.get(node["NodeID"]) == pytest.approx(deadline * 1000, abs=1500)
            while time.time() < deadline - 1.0:
                assert [n["Alive"] for n in _nodes(SLICE)] == [True], "a host died before its deadline"
                time.sleep(0.3)
            out, _ = cli.communicate(timeout=120)
        finally:
            if cli.poll() is None:
                cli.kill()
        assert cli.returncode == 0, out
        assert time.time() >= deadline
        (dead,) = _nodes(SLICE)
        assert not dead["Alive"] and "spot preemption" in dead["DeathReasonMessage"]
        with pytest.raises(ray.exceptions.ActorDiedError, match="preempted"):
            ray.get(holder.ping.remote(), timeout=60)

        g = _until(
            "SUSPENDED", lambda: (g := _group(provider, "itest-spot")) and g.state == "SUSPENDED" and g
        )
        assert g.slices[0].hosts == (HostHealth.PREEMPTED,) and "preempted" in g.message
    finally:
        provider.delete("itest-spot")
        _until("the group to go", lambda: _group(provider, "itest-spot") is None, timeout_s=60)
        provider.close()
    assert SLICE not in fleet.slice_names
    # Its host stays in Ray's node table, drained for a preemption: doctor lists the slice as gone
    # (ended on purpose), not as broken (inventory.MEANT_DEATHS are Ray's own reasons).
    reasons = importlib.import_module("ray.core.generated.common_pb2").NodeDeathInfo.Reason
    assert {reasons.Name(r) for r in MEANT_DEATHS} == {
        "EXPECTED_TERMINATION",
        "AUTOSCALER_DRAIN_PREEMPTED",
        "AUTOSCALER_DRAIN_IDLE",
    }
    report = doctor.check(probe=False)
    assert (
        dict(report.gone)[SLICE]
        == f"drained for a preemption: spot preemption of {SLICE} (tpufleet emulator)"
    )
    assert SLICE not in {s.name for s in report.slices} | {f.slice for f in report.findings}


def test_a_group_whose_slice_name_is_taken_by_the_fleet_fails_and_leaves_it_alone(
    fleet: EmulatedFleet,
) -> None:
    before = fleet.status()["slices"]
    provider = EmulatorProvider(fleet.state_dir, interval_s=0.2)
    try:
        provider.create(SliceRequest("tpu-v6e-4", "v6e-4"))  # its slice would be tpu-v6e-4-0, the fleet's
        g = _until("FAILED", lambda: (g := _group(provider, "tpu-v6e-4")) and g.state == "FAILED" and g)
        assert "already has a slice named tpu-v6e-4-0" in g.message
        provider.delete("tpu-v6e-4")
        _until("the group to go", lambda: _group(provider, "tpu-v6e-4") is None, timeout_s=30)
    finally:
        provider.close()
    after = fleet.status()["slices"]
    assert [(s["name"], [h["node_id"] for h in s["hosts"]]) for s in after] == [
        (s["name"], [h["node_id"] for h in s["hosts"]]) for s in before
    ]


def test_a_deleted_group_s_hosts_end_as_a_scale_in_does_and_the_slice_is_gone_not_broken(
    fleet: EmulatedFleet, ray_client: Any
) -> None:
    """The provider deletes an idle group as an autoscaler scales in (``EmulatedFleet.remove``):
    Ray is asked to drain its hosts as idle, then they end, so Ray records the deaths as meant
    (``AUTOSCALER_DRAIN_IDLE``, with why) and doctor lists the slice as gone, not as a finding."""
    provider = EmulatorProvider(fleet.state_dir, EmulatorConfig(delay_s=0.5), interval_s=0.2)
    name = "itest-idle-0"
    try:
        provider.create(SliceRequest("itest-idle", "v6e-4"))
        _until("ACTIVE", lambda: (g := _group(provider, "itest-idle")) and g.state == "ACTIVE")
        assert [n["Alive"] for n in _nodes(name)] == [True]
    finally:
        provider.delete("itest-idle")
        _until("the group to go", lambda: _group(provider, "itest-idle") is None, timeout_s=60)
        provider.close()
    why = f"{name} removed from the emulated fleet (scaled in)"
    assert _death(name) == ("AUTOSCALER_DRAIN_IDLE", why)
    assert _gone(name) == f"drained as idle: {why}"


def test_a_busy_slice_removed_is_stopped_as_an_autoscaler_stops_a_node_and_is_gone_too(
    fleet: EmulatedFleet, ray_client: Any
) -> None:
    """A host with work on it refuses the idle drain; ``remove`` then stops it as Ray's autoscaler
    stops a node it ends for another cause (DrainNodes): its work ends with it, and Ray records the
    death as meant (``EXPECTED_TERMINATION``), so the slice is gone, not a finding (it was
    ``UNEXPECTED_TERMINATION``, missed heartbeats, before)."""
    name = fleet.add("v6e-4", "itest-busy-0")
    (node,) = [n["NodeID"] for n in _nodes(name) if n["Alive"]]

    @ray.remote(num_cpus=0)
    class Work:
        def where(self) -> str:
            return ray.get_runtime_context().get_node_id()

    work = Work.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
    assert ray.get(work.where.remote(), timeout=60) == node
    fleet.remove(name)
    assert _death(name)[0] == "EXPECTED_TERMINATION"
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(work.where.remote(), timeout=60)
    assert _gone(name).startswith("stopped")
