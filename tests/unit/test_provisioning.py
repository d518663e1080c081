"""The whole provisioning story on the memory provider and the sandbox cluster (no Ray), fake clock:
PROVISIONING -> a slice appears -> the job runs -> the slice goes after the idle timeout; a failed
request shown on the job and retried; a spot notice mid-job -> attempt 2 on a replacement slice
with no retry used; slice groups made, measured and deleted (drained or forced)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from requeues import Ends

from tpufleet.control.cluster.memory import FakeClock, MemoryCluster
from tpufleet.control.loop.provisioner import ProvisionConfig, Provisioner
from tpufleet.control.loop.service import Service, ServiceConfig
from tpufleet.control.store.facade import Store
from tpufleet.control.store.loopwrites import LEFT
from tpufleet.control.store.slicegroups import SliceGroups
from tpufleet.control.store.usage import Usage
from tpufleet.control.store.values import JobRecord, JobRequest
from tpufleet.fleet import SliceInfo
from tpufleet.inventory import POD_TYPE, SLICE_NAME, TOPOLOGY, WORKER_ID, slices_from_nodes
from tpufleet.provision.memory import MemoryProvider
from tpufleet.scheduler.autoscale import PoolView
from tpufleet.scheduler.policy import decide

CONFIG = ServiceConfig(stop_threads=0, preempt_grace_s=30, cancel_grace_s=10, fail_grace_s=5)


class PooledSandbox(MemoryCluster):
    """The sandbox cluster with a warm pool's interface (``WarmPool``), as the Ray client has: it
    records each ``release`` with how many deletes ``provider`` had been asked by then."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.provider: MemoryProvider | None = None
        self.released: list[tuple[tuple[str, ...], int]] = []
        self.warmed: list[tuple[str, ...]] = []

    def maintain(self) -> None:
        return None

    def release(self, names: list[str]) -> None:
        assert self.provider is not None
        self.released.append((tuple(names), len(self.provider.deletes)))

    def warm(self, names: list[str]) -> None:
        self.warmed.append(tuple(names))

    def launches_at_once(self, names: Sequence[str]) -> bool:
        return False


class World:
    def __init__(
        self,
        store: Store,
        clock: FakeClock,
        state_dir: Path,
        pools: tuple[PoolView, ...],
        cluster: type[MemoryCluster] = MemoryCluster,
        **provider: object,
    ) -> None:
        self.store, self.clock = store, clock
        self.cluster = cluster.sandbox([], job_seconds=20, clock=clock)
        self.provider = MemoryProvider(
            clock=clock, on_up=self.cluster.add_slices, on_down=self.cluster.remove_slices, **provider
        )  # type: ignore[arg-type]
        self.prov = Provisioner(
            store, self.provider, ProvisionConfig(pools=pools, idle_timeout_s=60, retry_after_s=10)
        )
        self.service = Service(
            store, self.cluster, state_dir=state_dir, decide=decide, config=CONFIG, provisioner=self.prov
        )
        self.groups = SliceGroups(store)
        store.tenants.create("a", {"v4": 64})

    def submit(self, accelerator_type: str = "v4-8", **kw: object) -> str:
        request = JobRequest.build(command=("python", "t.py"), accelerator_type=accelerator_type, **kw)  # type: ignore[arg-type]
        return self.store.jobs.submit("a", request).id

    def cycle(self, seconds: float = 1.0, n: int = 1) -> None:
        for _ in range(n):
            self.clock.advance(seconds)
            self.service.run_once()

    def job(self, job_id: str) -> JobRecord:
        return self.store.jobs.get(job_id)

    def until(self, what, limit: int = 200, seconds: float = 1.0) -> None:  # type: ignore[no-untyped-def]
        for _ in range(limit):
            if what():
                return
            self.cycle(seconds)
        raise AssertionError("never happened")


POOL = PoolView("v4", "v4-8", min_slices=0, max_slices=2)
SPOT = PoolView("v4-spot", "v4-8", min_slices=0, max_slices=2, spot=True)


@pytest.fixture
def world(store: Store, clock: FakeClock, tmp_path: Path) -> World:
    return World(store, clock, tmp_path, (POOL,), delay_s=5)


def test_a_job_waits_provisioning_runs_and_the_slice_goes_when_idle(world: World) -> None:
    job = world.submit()
    world.cycle()
    waiting = world.job(job)
    assert (waiting.state, waiting.reason_code) == ("QUEUED", "PROVISIONING")
    assert "v4-1 PROVISIONING" in (waiting.reason or "")
    assert [r.accelerator_type for r in world.provider.requests] == ["v4-8"]
    world.until(lambda: world.job(job).state in ("STARTING", "RUNNING"))
    assert world.job(job).slices == ("v4-1-0",)
    world.until(lambda: world.job(job).state == "SUCCEEDED", seconds=2)
    assert [g.name for g in world.groups.all()] == ["v4-1"]
    world.cycle(seconds=30)
    assert [g.name for g in world.groups.all()] == ["v4-1"]  # idle, but not yet for 60 s
    world.until(lambda: not world.groups.all(), seconds=10)
    assert world.provider.deletes == [("v4-1", False)]
    assert world.store.slices.all() == []  # the deleted slice left the table


def dead_nodes(info: SliceInfo) -> SliceInfo:
    """``info`` as Ray's node table lists it once its hosts died: the same labels, not alive, no
    resources (what ``ray.nodes()`` says of a dead node), through the real inventory code."""
    nodes = [
        {
            "NodeID": f"{info.name}-{h.worker_id}",
            "Alive": False,
            "NodeManagerAddress": h.address,
            "Resources": {},
            "Labels": {
                SLICE_NAME: info.name,
                WORKER_ID: str(h.worker_id),
                TOPOLOGY: info.topology,
                POD_TYPE: info.accelerator_type,
            },
        }
        for h in info.hosts
    ]
    (dead,) = slices_from_nodes(nodes)
    assert "worker 0 (the slice's head) is dead" in dead.problems
    return dead


def slice_events(store: Store, name: str) -> list[str]:
    return [e["message"] for e in store.events(limit=1000) if e["slice"] == name]


def test_a_deleted_groups_slice_leaves_and_never_comes_back_from_rays_node_table(world: World) -> None:
    """The issue's story: after its group was deleted, Ray still listed the slice (its hosts dying,
    then dead): it was "discovered" again, "intact again", then BROKEN for ever in the table."""
    world.groups.create("old", "v4-8", 1)
    world.until(lambda: world.groups.get("old").state == "ACTIVE")
    (info,) = world.cluster.inventory()
    world.groups.request_delete("old")
    world.until(lambda: not world.groups.all())
    assert "old-0" not in {s.name for s in world.store.slices.all()}
    seen = len(slice_events(world.store, "old-0"))
    world.cluster.add_slices([info])  # Ray lists the hosts alive a while after they went away
    job = world.submit()
    world.until(lambda: world.job(job).state in ("STARTING", "RUNNING"))
    assert world.job(job).slices == ("v4-1-0",)  # a new slice, not old-0
    assert "old-0" not in {s.name for s in world.store.slices.all()}
    world.cluster.add_slices([dead_nodes(info)])  # then dead, and Ray keeps dead nodes listed
    world.cycle(n=3)
    world.cycle(seconds=2 * 3600)  # hours later too
    assert "old-0" not in {s.name for s in world.store.slices.all()}
    assert slice_events(world.store, "old-0")[seen:] == []  # never discovered, broken or intact again
    assert slice_events(world.store, "old-0")[-1] == LEFT  # its history stays
    assert [s for _, s, _ in Usage(world.store).slice_counts()] == ["FREE"]  # tpufleet_slices: v4-1-0
    assert [g.name for g in world.groups.all(include_deleted=True)] == ["old", "v4-1"]


def test_a_slice_whose_group_went_under_its_holder_leaves_once_the_attempt_ended(world: World) -> None:
    """A group being drained for deletion is deleted by the provider while a job still holds its
    slice (the cloud took it): the attempt ends as its hosts are lost, and the slice leaves the
    table instead of staying BROKEN from Ray's dead nodes."""
    world.groups.create("old", "v4-8", 1)
    world.until(lambda: world.groups.get("old").state == "ACTIVE")
    (info,) = world.cluster.inventory()
    world.cluster.job_seconds = 10_000
    job = world.submit(max_retries=0)
    world.until(lambda: world.job(job).state == "RUNNING")
    assert world.job(job).slices == ("old-0",)
    world.groups.request_delete("old")  # drains: waits for the holder
    world.cycle(n=2)
    assert world.job(job).state == "RUNNING"
    world.provider.delete("old")  # the group goes with its slice held
    world.cluster.add_slices([dead_nodes(info)])  # Ray lists the dead hosts
    world.until(lambda: world.job(job).state not in ("STARTING", "RUNNING"))
    world.cycle(n=3)
    assert "old-0" not in {s.name for s in world.store.slices.all()}
    assert world.groups.all(include_deleted=True)[0].state == "DELETED"


def test_a_failed_request_is_shown_on_the_job_and_retried(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    w = World(store, clock, tmp_path, (POOL,), delay_s=2)
    w.provider.fail_next("stockout: no v4-8 capacity in us-central2-b")
    job = w.submit()
    w.cycle(n=3)
    shown = w.job(job)
    assert shown.reason_code == "PROVISIONING"
    assert "v4-1 FAILED: stockout: no v4-8 capacity in us-central2-b" in (shown.reason or "")
    w.until(lambda: w.job(job).state == "SUCCEEDED", seconds=2)
    assert [r.name for r in w.provider.requests] == ["v4-1", "v4-2"]  # the retry
    assert w.job(job).slices == ("v4-2-0",)
    assert w.job(job).attempt == 1


def test_waiting_for_capacity_says_so(store: Store, clock: FakeClock, tmp_path: Path) -> None:
    w = World(store, clock, tmp_path, (POOL,), capacity={"v4-8": 0})
    job = w.submit()
    w.cycle(n=2)
    shown = w.job(job)
    assert shown.reason_code == "WAITING_FOR_CAPACITY"
    assert "no capacity for 1 v4-8" in (shown.reason or "")
    w.provider.capacity["v4-8"] = 1
    w.until(lambda: w.job(job).state in ("STARTING", "RUNNING"))


def test_a_spot_notice_mid_job_requeues_it_without_a_retry_on_a_replacement(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    w = World(store, clock, tmp_path, (SPOT,), notice_s=30)
    job = w.submit(env={"TPUFLEET_SANDBOX_SECONDS": "100"})
    w.until(lambda: w.job(job).state == "RUNNING")
    (first,) = w.job(job).slices
    assert [r.spot for r in w.provider.requests] == [True]  # the pool allows spot: preferred
    ends = Ends.on(w.service, w.store)
    w.provider.preempt(first)
    w.cycle()  # the notice reaches the loop: every process gets SIGTERM at once
    w.until(lambda: w.job(job).attempt == 2)
    j = ends.at_end(job)
    assert (j.state, j.reason_code, j.failures) == ("QUEUED", "PREEMPTED_BY_PROVIDER", 0)
    a1 = j.attempts[0]
    assert a1.state == "PREEMPTED" and "preempts spot slice" in (a1.message or "")
    assert all(c["exit_code"] == -15 for c in a1.exit_codes)  # SIGTERM, before the deadline
    w.until(lambda: w.job(job).state == "RUNNING")
    (second,) = w.job(job).slices
    assert second != first
    w.until(lambda: w.job(job).state == "SUCCEEDED", seconds=5)
    assert w.job(job).failures == 0
    assert len(w.provider.requests) == 2
    w.until(lambda: first not in {s.name for s in w.store.slices.all()})  # the preempted slice is gone


def test_a_group_is_made_measured_and_deleted_after_its_holder_finished(world: World) -> None:
    world.groups.create("train", "v4-8", 2)
    world.until(lambda: world.groups.get("train").state == "ACTIVE")
    job = world.submit(num_slices=2, env={"TPUFLEET_SANDBOX_SECONDS": "30"})
    world.cycle(seconds=10, n=1)
    assert set(world.job(job).slices) == {"train-0", "train-1"}
    world.cycle(seconds=10, n=5)  # held 30 s, then idle
    assert world.job(job).state == "SUCCEEDED"
    used = world.groups.utilization("train", 60)
    assert used["holders"] and used["holders"][0]["job"] == job
    assert 0.3 < used["utilization"] < 0.8  # measured from the attempt's admission to its end
    assert used["slice_seconds"] == pytest.approx(120.0)
    job2 = world.submit(num_slices=2, env={"TPUFLEET_SANDBOX_SECONDS": "30"})
    world.cycle()
    assert world.job(job2).state in ("STARTING", "RUNNING")
    world.groups.request_delete("train")
    world.cycle(n=3)
    assert world.groups.get("train").state == "ACTIVE"  # drains: waits for the holder
    world.until(lambda: world.job(job2).state == "SUCCEEDED", seconds=5)
    world.until(lambda: not world.groups.all())
    assert world.job(job2).failures == 0


def test_a_group_s_slices_leave_the_warm_pool_before_the_provider_deletes_it(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    """So its hosts are idle when they end, and Ray drains them as a scale-in does: the autoscaler's
    delete of an idle slice and an operator's delete of a held group alike."""
    world = World(store, clock, tmp_path, (POOL,), cluster=PooledSandbox, delay_s=5)
    pool = world.cluster
    assert isinstance(pool, PooledSandbox)
    pool.provider = world.provider
    job = world.submit()
    world.until(lambda: world.job(job).state == "SUCCEEDED", seconds=2)
    world.until(lambda: not world.groups.all(), seconds=10)  # idle 60 s: the autoscaler deletes it
    assert world.provider.deletes == [("v4-1", False)]
    assert [r for r in pool.released if "v4-1-0" in r[0]] == [(("v4-1-0",), 0)]  # before the delete

    world.groups.create("train", "v4-8", 2)
    world.until(lambda: world.groups.get("train").state == "ACTIVE")
    job = world.submit(num_slices=2, env={"TPUFLEET_SANDBOX_SECONDS": "30"})
    world.until(lambda: world.job(job).state == "RUNNING")
    world.groups.request_delete("train")
    world.cycle(n=2)  # the first step sees the request; the next cycle gives the slices back
    assert world.provider.deletes == [("v4-1", False)]  # held: the delete waits for the attempt
    assert pool.released[-1] == (("train-0", "train-1"), 1)  # held: each goes when the attempt ends
    world.until(lambda: not any(g.name == "train" for g in world.groups.all()), seconds=5)
    assert world.provider.deletes == [("v4-1", False), ("train", False)]
    assert world.job(job).state == "SUCCEEDED"
    assert pool.warmed == []  # a deleted group's slices never go back to the pool


def test_force_delete_preempts_the_holder(world: World) -> None:
    world.groups.create("train", "v4-8", 1)
    world.until(lambda: world.groups.get("train").state == "ACTIVE")
    job = world.submit(env={"TPUFLEET_SANDBOX_SECONDS": "1000"})
    world.until(lambda: world.job(job).state == "RUNNING")
    ends = Ends.on(world.service, world.store)
    world.groups.request_delete("train", force=True)
    world.until(lambda: world.job(job).attempt == 2)
    j = ends.at_end(job)
    assert (j.reason_code, j.failures, j.attempts[0].state) == ("PREEMPTED", 0, "PREEMPTED")
    world.until(lambda: not any(g.name == "train" for g in world.groups.all()))


def test_a_private_group_runs_only_its_tenants_jobs(world: World) -> None:
    world.store.tenants.create("b", {"v4": 64})
    world.prov.config = ProvisionConfig(pools=(), autoscale=False)
    world.groups.create("mine", "v4-8", 1, tenant="a")
    world.until(lambda: world.groups.get("mine").state == "ACTIVE")
    other = world.store.jobs.submit("b", JobRequest.build(command=("x",), accelerator_type="v4-8")).id
    world.cycle(n=3)
    assert world.job(other).state == "QUEUED"
    own = world.submit()
    world.cycle()
    assert world.job(own).slices == ("mine-0",)
    assert world.job(other).state == "QUEUED"


def test_utilization_over_rest_carries_measured_duty_cycles(world: World) -> None:
    from fastapi.testclient import TestClient

    from tpufleet.api.app import create_app

    world.groups.create("train", "v4-8", 1)
    world.until(lambda: world.groups.get("train").state == "ACTIVE")
    app = create_app(world.store)
    http = TestClient(app, headers={"Authorization": f"Bearer {world.store.tokens.issue()}"})
    got = http.get("/api/v1/slice-groups/train/utilization", params={"window": "1m"}).json()
    assert (got["utilization"], got["device_metrics"]) == (0.0, None)  # idle, nothing measured
    app.state.duty_cycles = lambda: {("train-0", 0): {0: 50.0, 1: 70.0}, ("other-0", 0): {0: 1.0}}
    got = http.get("/api/v1/slice-groups/train/utilization").json()
    assert got["device_metrics"] == {"duty_cycle_percent": {"train-0": 60.0}}
    assert http.get("/api/v1/slice-groups/nope/utilization").status_code == 404
    assert http.get("/api/v1/slice-groups/train/utilization", params={"window": "x"}).status_code == 400


def test_a_restarted_control_plane_asks_a_fresh_provider_for_its_groups_again(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    w = World(store, clock, tmp_path, (POOL,), delay_s=1)
    w.groups.create("keep", "v4-8", 1)
    w.until(lambda: w.groups.get("keep").state == "ACTIVE")
    # A restart: a new loop, a new provider and cluster that know nothing (as serve --provider
    # emulator starts a fresh fleet); the stored groups are asked for again under their names.
    cluster = MemoryCluster.sandbox([], job_seconds=1, clock=clock)
    provider = MemoryProvider(clock=clock, on_up=cluster.add_slices, on_down=cluster.remove_slices)
    prov = Provisioner(store, provider, ProvisionConfig(pools=(POOL,)))
    w.service = Service(store, cluster, state_dir=tmp_path, decide=decide, config=CONFIG, provisioner=prov)
    w.cycle()
    assert [r.name for r in provider.requests] == ["keep"]
    job = w.submit()
    w.until(lambda: w.job(job).state == "SUCCEEDED")
    assert w.job(job).slices == ("keep-0",)


def test_a_borrower_gets_a_slice_made_from_quota_others_leave_unused_unless_borrowing_is_off(
    world: World,
) -> None:
    world.store.tenants.create("small", {"v4": 0})  # a's 64 chips lie unused: small may borrow them
    request = JobRequest.build(command=("python", "t.py"), accelerator_type="v4-8")
    job = world.store.jobs.submit("small", request).id
    world.until(lambda: world.job(job).state in ("STARTING", "RUNNING"))
    assert world.job(job).slices == ("v4-1-0",)
    assert [r.accelerator_type for r in world.provider.requests] == ["v4-8"]
    world.until(lambda: world.job(job).state == "SUCCEEDED", seconds=2)
    world.prov.config = replace(world.prov.config, borrowing=False)
    world.until(lambda: not world.groups.all(), seconds=10)  # idle, deleted
    second = world.store.jobs.submit("small", request).id
    world.cycle(n=20)
    assert world.job(second).state == "QUEUED"  # a borrower no longer makes slices
    assert len(world.provider.requests) == 1


def test_the_fleet_specs_autoscaling_borrowing_reaches_the_provisioner(tmp_path: Path) -> None:
    from tpufleet.cli.slices import provisioning

    spec = tmp_path / "fleet.yaml"
    body = "name: f\npools: [{name: v4, type: v4-8, slices: 0, max_slices: 2}]\nautoscaling: {enabled: true"
    spec.write_text(body + "}\n")
    made, _ = provisioning(spec, "memory", MemoryCluster.sandbox([]), tmp_path)
    assert made is not None and made.config.borrowing is True  # the default: lend unused quota
    spec.write_text(body + ", borrowing: false}\n")
    made, _ = provisioning(spec, "memory", MemoryCluster.sandbox([]), tmp_path)
    assert made is not None and made.config.borrowing is False
