"""The scheduling loop on MemoryCluster, the real policy and a fake clock, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from _executor_helpers import wait_for
from requeues import Ends

from tpufleet.control.cluster.memory import SIGTERM_EXIT, FakeClock, MemoryCluster, Script
from tpufleet.control.cluster.protocol import AttemptSpec, HostState
from tpufleet.control.loop.service import AfterWrite, RateBudget, Service, ServiceConfig
from tpufleet.control.store.facade import Store
from tpufleet.control.store.values import JobRecord, JobRequest
from tpufleet.errors import NotFoundError
from tpufleet.scheduler.attempts import CANNOT_START_SETTLE_S


class World:
    """A store, a fake fleet and a service with inline stops; ``cycle()`` runs the loop once."""

    def __init__(self, store: Store, state_dir: Path, fleet: str = "v4-16:2,v6e-16") -> None:
        self.store = store
        self.state_dir = state_dir
        self.cluster = MemoryCluster.of(fleet)
        self.service = self.restart()

    def restart(self, after_write: AfterWrite | None = None) -> Service:
        """A new service on the same store and cluster: what a restarted control plane is."""
        self.service = Service(
            self.store, self.cluster, state_dir=self.state_dir, config=CONFIG, after_write=after_write
        )
        return self.service

    def tenant(self, name: str, **quota: int) -> str:
        self.store.tenants.create(name, quota)
        return name

    def submit(self, tenant: str, accelerator_type: str = "v4-16", **kw: object) -> str:
        command = kw.pop("command", ("python", "train.py"))
        request = JobRequest.build(command=command, accelerator_type=accelerator_type, **kw)  # type: ignore[arg-type]
        return self.store.jobs.submit(tenant, request).id

    def cycle(self, n: int = 1) -> None:
        for _ in range(n):
            self.service.run_once()

    def job(self, job_id: str) -> JobRecord:
        return self.store.jobs.get(job_id)

    def slices(self) -> dict[str, tuple[str, str | None]]:
        return {s.name: (s.state, s.holder) for s in self.store.slices.all()}


# A cycle here copies every host's new output, however loaded the machine (the budget bounds a
# real loop's cycle; these tests count cycles, not seconds).
CONFIG = ServiceConfig(stop_threads=0, preempt_grace_s=30, cancel_grace_s=10, fail_grace_s=5, log_budget_s=60)


@pytest.fixture
def world(store: Store, tmp_path: Path) -> World:
    return World(store, tmp_path / "state")


def run_to_running(w: World, job_id: str) -> None:
    w.cycle()  # admitted and launched
    assert w.job(job_id).state == "STARTING"
    w.cluster.start(job_id)
    w.cycle()
    assert w.job(job_id).state == "RUNNING"


def test_a_launch_is_polled_in_the_turn_that_marks_it(store: Store, tmp_path: Path) -> None:
    """A launch that returned has its hosts looked at before its STARTING is written: hosts that
    run already (inline launches, as the sandbox makes them) make that one write mark it RUNNING
    too, in the cycle that launched it, with both events; hosts still starting leave it STARTING
    and a later poll marks it (``run_to_running``). The look is the poll of that turn."""
    written: list[tuple[str, list[str], list[str]]] = []  # each group, with its jobs' states then

    def seen(kind: str, ids: Sequence[str]) -> None:
        written.append((kind, list(ids), [store.jobs.get(i).state for i in ids]))

    w = World(store, tmp_path / "state")
    w.cluster = MemoryCluster.of("v4-16", script=lambda spec: Script(run_after=1, exit_after=None))
    w.restart(after_write=seen)
    job_id = w.submit(w.tenant("a", v4=8))
    w.cycle()
    job = w.job(job_id)
    assert (job.state, job.attempts[0].state) == ("RUNNING", "RUNNING")
    assert job.started_at is not None and job.attempts[0].started_at == job.started_at
    assert [p.state for p in w.cluster.processes(job_id)] == [HostState.RUNNING, HostState.RUNNING]
    # one write: when the launch's group is in the store, the job is RUNNING already
    assert written == [
        ("admit", [job_id], ["ADMITTED"]),
        ("launched", [job_id], ["RUNNING"]),
        ("running", [job_id], ["RUNNING"]),
    ]
    kinds = [e["kind"] for e in store.events(job_id=job_id)]
    assert kinds.index("launch") < kinds.index("run")
    assert w.cluster._attempts[(job_id, 1)].polls == 1  # looked at once, not polled again after the write


class PooledMemory(MemoryCluster):
    """An in-memory fleet that says it keeps a warm pool (``WarmPool``): every slice is reserved
    but those released (``cold``), so a launch on the others returns at once."""

    def __init__(self, spec: str) -> None:
        super().__init__(MemoryCluster.of(spec).inventory(), lambda _: Script(run_after=1, exit_after=None))
        self.cold: set[str] = set()
        self.launched_on: list[str] = []  # the thread each launch ran on
        self.fault("launch", lambda: self.launched_on.append(threading.current_thread().name))

    def maintain(self) -> None:
        pass

    def release(self, names: list[str]) -> None:
        self.cold |= set(names)

    def warm(self, names: list[str]) -> None:
        self.cold -= set(names)

    def launches_at_once(self, names: Sequence[str]) -> bool:
        return not self.cold & set(names)


@pytest.mark.parametrize("reserved", [True, False])
def test_a_launch_on_reserved_slices_is_made_written_and_polled_in_the_turn_that_admits_it(
    store: Store, tmp_path: Path, reserved: bool
) -> None:
    """With a warm pool, a plain launch on slices it holds is made on the loop's thread: one turn
    admits the job, launches it and (its hosts running) marks it RUNNING. On slices the pool does
    not hold the launch may be slow (a reservation to make), so it goes to the loop's pool."""
    cluster = PooledMemory("v4-16")
    if not reserved:
        cluster.release(["tpu-v4-16-0"])
    service = Service(store, cluster, state_dir=tmp_path / "state", config=replace(CONFIG, stop_threads=2))
    store.tenants.create("a", {"v4": 8})
    job_id = store.jobs.submit("a", JobRequest.build(command=("train",), accelerator_type="v4-16")).id
    service.run_once()
    if reserved:
        assert store.jobs.get(job_id).state == "RUNNING"
        assert cluster.launched_on == [threading.current_thread().name]
    else:
        wait_for("the launch", lambda: cluster.launched_on, 10)
        assert cluster.launched_on != [threading.current_thread().name]
        wait_for(
            "the pool's launch to be marked",
            lambda: service.run_once() or store.jobs.get(job_id).state == "RUNNING",
            10,
        )
    service.close()


def test_one_slice_job_runs_with_the_host_contract_and_succeeds(world: World) -> None:
    job_id = world.submit(world.tenant("a", v4=8), env={"LR": "0.1"})
    run_to_running(world, job_id)
    procs = world.cluster.processes(job_id)
    ckpt = world.state_dir / "checkpoints" / "a" / job_id  # <job root>/<tenant>/<job>
    assert [(p.slice, p.worker_id) for p in procs] == [("tpu-v4-16-0", 0), ("tpu-v4-16-0", 1)]
    for p in procs:
        assert p.env["TPU_NAME"] == "tpu-v4-16-0" and p.env["TPU_WORKER_ID"] == str(p.worker_id)
        assert p.env["TPU_WORKER_HOSTNAMES"] == "10.0.0.1,10.0.0.2"
        assert (p.env["TPU_ACCELERATOR_TYPE"], p.env["TPU_TOPOLOGY"]) == ("v4-16", "2x2x2")
        assert (p.env["TPUFLEET_JOB_ID"], p.env["TPUFLEET_ATTEMPT"]) == (job_id, "1")
        assert p.env["TPUFLEET_CHECKPOINT_DIR"] == str(ckpt) and p.env["LR"] == "0.1"
        assert not [k for k in p.env if k.startswith("MEGASCALE_")]
    assert not ckpt.exists()  # made on the hosts, never by the control plane on its own disk
    assert world.slices()["tpu-v4-16-0"] == ("HELD", job_id)
    world.cluster.exit(job_id, 0)
    world.cycle()
    job = world.job(job_id)
    assert (job.state, job.exit_code, job.slices, job.reason) == ("SUCCEEDED", 0, ("tpu-v4-16-0",), None)
    assert [(a.attempt, a.state) for a in job.attempts] == [(1, "SUCCEEDED")]
    assert world.slices()["tpu-v4-16-0"] == ("FREE", None)
    assert world.cluster.running_attempts() == []


def test_a_relative_state_dir_gives_the_hosts_absolute_job_files(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`serve --state-dir my-fleet`: the hosts (each its own working directory) refuse a relative job
    root, so the control plane names its job files from where it was started."""
    monkeypatch.chdir(tmp_path)
    w = World(store, Path("my-fleet"))
    job_id = w.submit(w.tenant("a", v4=8))
    run_to_running(w, job_id)
    ckpt = tmp_path / "my-fleet" / "checkpoints" / "a" / job_id
    assert {p.env["TPUFLEET_CHECKPOINT_DIR"] for p in w.cluster.processes(job_id)} == {str(ckpt)}


def test_two_slice_job_gets_megascale_on_every_host(world: World) -> None:
    job_id = world.submit(world.tenant("a", v4=16), num_slices=2)
    run_to_running(world, job_id)
    procs = world.cluster.processes(job_id)
    assert [(p.slice, p.worker_id) for p in procs] == [
        ("tpu-v4-16-0", 0),
        ("tpu-v4-16-0", 1),
        ("tpu-v4-16-1", 0),
        ("tpu-v4-16-1", 1),
    ]
    for p in procs:
        assert p.env["MEGASCALE_COORDINATOR_ADDRESS"] == "10.0.0.1"
        assert (p.env["MEGASCALE_NUM_SLICES"], p.env["MEGASCALE_PORT"]) == ("2", "8081")
        assert p.env["MEGASCALE_SLICE_ID"] == str(int(p.slice[-1]))
        assert p.env["TPU_WORKER_HOSTNAMES"] == (
            "10.0.0.1,10.0.0.2" if p.slice.endswith("0") else "10.0.1.1,10.0.1.2"
        )
    world.cluster.exit(job_id, 0)
    world.cycle()
    assert world.job(job_id).state == "SUCCEEDED"
    assert set(world.slices().values()) == {("FREE", None)}


def test_a_failed_host_ends_the_attempt_everywhere_retries_then_fails(world: World) -> None:
    job_id = world.submit(world.tenant("a", v4=8), max_retries=1)
    run_to_running(world, job_id)
    ends = Ends.on(world.service, world.store)
    world.cluster.exit(job_id, 3, worker=1)
    world.cycle()  # requeued, and (a slice is free) admitted again in the same cycle
    job = ends.at_end(job_id)
    assert (job.state, job.attempt, job.failures, job.reason_code) == ("QUEUED", 2, 1, "RETRYING")
    assert "host tpu-v4-16-0/1 exited with code 3" in (job.reason or "")
    assert (world.job(job_id).state, world.job(job_id).attempt) == ("STARTING", 2)
    first = world.cluster.processes(job_id, attempt=1)
    assert [(p.state, p.exit_code) for p in first] == [
        (HostState.EXITED, SIGTERM_EXIT),
        (HostState.EXITED, 3),
    ]
    run_to_running(world, job_id)
    assert world.cluster.processes(job_id)[0].env["TPUFLEET_ATTEMPT"] == "2"
    world.cluster.exit(job_id, 1)
    world.cycle()
    job = world.job(job_id)
    assert (job.state, job.exit_code, job.reason_code) == ("FAILED", 1, "FAILED")
    assert "no retries left (max_retries=1)" in (job.reason or "")
    assert [(a.attempt, a.state) for a in job.attempts] == [(1, "FAILED"), (2, "FAILED")]
    assert set(world.slices().values()) == {("FREE", None)}


def test_a_command_not_found_on_every_host_fails_the_job_at_once_without_a_retry(world: World) -> None:
    job_id = world.submit(world.tenant("a", v4=8), max_retries=2, command=("pyhton", "train.py"))
    world.cycle()
    world.cluster.exit(job_id, 127, worker=0)  # the hosts fail one after the other, as they do on Ray
    world.cycle()
    assert world.job(job_id).state == "STARTING"  # waits for the other host
    world.cluster.exit(job_id, 127, worker=1)
    world.cycle()
    job = world.job(job_id)
    assert (job.state, job.attempt, job.reason_code, job.exit_code) == ("FAILED", 1, "FAILED", 127)
    assert job.reason == (
        "attempt 1 failed: pyhton: command not found or could not start (exit 127 on every host); not retried"
    )
    assert len(world.cluster.launches) == 1
    assert set(world.slices().values()) == {("FREE", None)}


def test_exit_127_on_one_host_only_is_an_ordinary_failure(world: World, clock: FakeClock) -> None:
    job_id = world.submit(world.tenant("a", v4=8), max_retries=2)
    run_to_running(world, job_id)
    ends = Ends.on(world.service, world.store)
    world.cluster.exit(job_id, 127, worker=1)
    world.cycle()
    assert world.job(job_id).state == "RUNNING"  # the other host gets a moment to say the same
    clock.advance(CANNOT_START_SETTLE_S)
    world.cycle()
    job = ends.at_end(job_id)
    assert (job.state, job.attempt, job.reason_code) == ("QUEUED", 2, "RETRYING")
    assert "host tpu-v4-16-0/1 exited with code 127" in (job.reason or "")


def test_a_lost_host_quarantines_the_slice_and_the_job_resumes_elsewhere(world: World) -> None:
    job_id = world.submit(world.tenant("a", v4=8), max_retries=2)
    run_to_running(world, job_id)
    world.cluster.kill_host("tpu-v4-16-0", 1)
    world.cycle()  # slice BROKEN -> attempt 1 ended on every host -> requeued
    assert [p.state for p in world.cluster.processes(job_id, attempt=1)] == [HostState.EXITED, HostState.LOST]
    assert (1, "slice tpu-v4-16-0 is broken (host 1 is dead)") in [
        (a.attempt, a.message) for a in world.job(job_id).attempts
    ]
    world.cycle()
    job = world.job(job_id)
    assert (job.state, job.attempt, job.slices) == ("STARTING", 2, ("tpu-v4-16-1",))
    assert world.slices()["tpu-v4-16-0"] == ("BROKEN", None)
    ckpt = {p.env["TPUFLEET_CHECKPOINT_DIR"] for p in world.cluster.processes(job_id)}
    assert ckpt == {str(world.state_dir / "checkpoints" / "a" / job_id)}  # same dir: resume from checkpoint


def test_a_borrower_is_preempted_with_a_grace_period_and_requeued_without_using_a_retry(
    tmp_path: Path, store: Store
) -> None:
    w = World(store, tmp_path, fleet="v4-16")
    borrower = w.submit(w.tenant("lender"), max_retries=0)  # no quota: it can only borrow
    run_to_running(w, borrower)
    assert w.job(borrower).borrowing
    owner = w.submit(w.tenant("owner", v4=8))
    w.cycle()
    job = w.job(borrower)
    assert (job.state, job.attempt, job.failures, job.reason_code) == ("QUEUED", 2, 0, "PREEMPTED")
    assert (borrower, 1, 30) in w.cluster.stops
    w.cycle()
    assert w.job(owner).state == "STARTING" and w.job(owner).slices == ("tpu-v4-16-0",)
    assert w.job(borrower).state == "QUEUED" and w.job(borrower).reason_code not in (None, "PREEMPTED")


def test_an_attempt_the_cluster_says_was_interrupted_is_requeued_without_using_a_retry(world: World) -> None:
    """``AttemptStatus.interrupted`` (a Ray job's trainer placed on a slice that came back during its
    window, control/ray/jobs.py): not the job's doing, so even with no retries left it runs again."""
    job_id = world.submit(world.tenant("a", v4=8), max_retries=0)
    run_to_running(world, job_id)
    why = "Ray placed this job's placement group on tpu-v4-16-1, outside the admitted slices tpu-v4-16-0"
    world.cluster.interruptions[(job_id, 1)] = why
    ends = Ends.on(world.service, world.store)
    world.cycle()
    job = ends.at_end(job_id)
    assert (job.state, job.attempt, job.failures, job.reason_code) == ("QUEUED", 2, 0, "REQUEUED")
    assert (job.attempts[0].state, job.attempts[0].message) == ("REQUEUED", why)
    assert all(p.state is HostState.EXITED for p in world.cluster.processes(job_id, attempt=1))
    world.cycle()
    assert world.job(job_id).state == "STARTING" and world.job(job_id).attempt == 2


def test_cancel_stops_every_process_and_frees_the_slices(world: World) -> None:
    job_id = world.submit(world.tenant("a", v4=16), num_slices=2)
    run_to_running(world, job_id)
    assert world.store.jobs.request_cancel(job_id).state == "RUNNING"
    world.cycle()
    assert world.job(job_id).state == "CANCELLED"
    assert all(p.state is HostState.EXITED for p in world.cluster.processes(job_id))
    assert (job_id, 1, 10) in world.cluster.stops
    assert set(world.slices().values()) == {("FREE", None)}


def test_a_restarted_service_finds_running_attempts_and_loses_no_job(world: World) -> None:
    job_id = world.submit(world.tenant("a", v4=16))
    run_to_running(world, job_id)
    world.restart()
    world.cycle()
    assert world.job(job_id).state == "RUNNING" and len(world.cluster.launches) == 1
    world.cluster.exit(job_id, 0)
    world.cycle()
    assert world.job(job_id).state == "SUCCEEDED"


def test_restart_between_admission_and_launch_launches_once(world: World) -> None:
    job_id = world.submit(world.tenant("a", v4=16))
    world.service.reconcile()
    world.service._sync()
    world.service._schedule()  # the decision is written; the process dies before acting on it
    assert world.job(job_id).state == "ADMITTED" and world.cluster.launches == []
    world.restart()
    world.cycle()
    assert world.job(job_id).state == "STARTING" and len(world.cluster.launches) == 1


def test_restart_after_launch_adopts_the_attempt_and_stops_orphans(world: World) -> None:
    job_id = world.submit(world.tenant("a", v4=16))
    world.service.reconcile()
    world.service._sync()
    world.service._schedule()
    spec = AttemptSpec(job_id, 1, ("tpu-v4-16-0",), "v4-16", ("python", "train.py"))
    world.cluster.launch(spec)  # launched, then the control plane died before writing STARTING
    world.cluster.launch(AttemptSpec("deadbeef", 1, ("tpu-v4-16-1",), "v4-16", ("x",)))  # an orphan
    world.restart()
    world.cycle()
    assert world.job(job_id).state == "STARTING" and len(world.cluster.launches) == 2
    assert ("deadbeef", 1, 10) in world.cluster.stops
    assert world.cluster.running_attempts() == [(job_id, 1)]


def test_restart_during_a_cut_short_launch_requeues_without_using_a_retry(world: World) -> None:
    job_id = world.submit(world.tenant("a", v4=16), max_retries=0)
    world.service.reconcile()
    world.service._sync()
    world.service._schedule()
    world.cluster.launch(AttemptSpec(job_id, 1, ("tpu-v4-16-0",), "v4-16", ("python", "train.py")))
    world.cluster.processes(job_id)[1].state = HostState.LOST  # host 1 never got its start
    ends = Ends(world.store)
    world.restart(after_write=ends)  # the control plane died half-way through launch()
    world.cycle()
    job = ends.at_end(job_id)
    assert (job.state, job.attempt, job.failures, job.reason_code) == ("QUEUED", 2, 0, "REQUEUED")
    assert (job_id, 1) in {(j, a) for j, a, _ in world.cluster.stops}
    world.cycle()
    assert world.job(job_id).state == "STARTING" and world.cluster.launches[-1].attempt == 2


def test_attempts_whose_processes_vanished_during_a_restart_are_retried(world: World) -> None:
    job_id = world.submit(world.tenant("a", v4=16))
    run_to_running(world, job_id)
    world.cluster = MemoryCluster.of("v4-16:2,v6e-16")  # the cluster lost every runner
    ends = Ends(world.store)
    world.restart(after_write=ends)
    world.cycle()
    job = ends.at_end(job_id)
    assert (job.state, job.attempt, job.failures) == ("QUEUED", 2, 1)
    world.cycle()
    assert world.job(job_id).state == "STARTING"
    assert "gone when the control plane restarted" in (job.attempts[0].message or "")


class Killed(BaseException):
    """The control plane dies (kill -9): nothing after this point of the cycle runs."""


@pytest.mark.parametrize(
    ("group", "hosts"),
    [
        ("admit", "start later"),
        ("launched", "start later"),
        ("running", "start later"),
        ("stop", "start later"),
        ("finish", "start later"),
        ("launched", "run at once"),  # STARTING and RUNNING in one write: killed after it
        ("running", "run at once"),
    ],
)
def test_killed_between_a_grouped_write_and_its_actions_a_restart_loses_and_repeats_nothing(
    world: World, group: str, hosts: str
) -> None:
    written: list[tuple[str, list[str]]] = []

    def kill(kind: str, job_ids: Sequence[str]) -> None:
        written.append((kind, list(job_ids)))
        if kind == group:
            raise Killed  # the group is committed; none of its members has been acted on

    script = (lambda spec: Script(run_after=1, exit_after=None)) if hosts == "run at once" else None
    world.cluster = MemoryCluster.of("v4-16:4", script=script)
    world.restart(after_write=kill)
    tenant = world.tenant("a", v4=64)
    jobs = sorted(world.submit(tenant) for _ in range(3))
    killed = False
    for _ in range(12):
        try:
            world.cycle()
        except Killed:
            killed = True
            world.restart()  # a new control plane on the same store and fleet
            continue
        for job_id in jobs:  # the fleet moves on: hosts start, then exit 0
            state = world.job(job_id).state
            if state == "STARTING":
                world.cluster.start(job_id)
            elif state == "RUNNING":
                world.cluster.exit(job_id, 0)
    assert killed and (group, jobs) in [(kind, sorted(ids)) for kind, ids in written]  # one group, 3 jobs
    for job_id in jobs:
        job = world.job(job_id)
        assert (job.state, job.attempt, job.failures) == ("SUCCEEDED", 1, 0)
        assert [(a.attempt, a.state) for a in job.attempts] == [(1, "SUCCEEDED")]
    assert sorted(spec.job_id for spec in world.cluster.launches) == jobs  # each launched exactly once
    assert set(world.slices().values()) == {("FREE", None)}


def test_a_launch_that_fails_counts_as_a_failed_attempt(world: World) -> None:
    world.cycle()
    world.cluster.launch(AttemptSpec("squatter", 1, ("tpu-v4-16-0",), "v4-16", ("x",)))
    job_id = world.submit(world.tenant("a", v4=8), max_retries=1)
    world.cycle()
    job = world.job(job_id)
    assert (job.state, job.attempt, job.reason_code) == ("QUEUED", 2, "RETRYING")
    assert "launch failed: slice tpu-v4-16-0 is held by job squatter" in (job.reason or "")


def test_logs_are_complete_and_survive_the_job(world: World) -> None:
    job_id = world.submit(world.tenant("a", v4=8))
    run_to_running(world, job_id)
    world.cluster.write(job_id, "step 1 on {TPU_WORKER_ID}\n")
    world.cycle()
    assert [h.data for h in world.store.jobs.read_logs(job_id).hosts] == ["step 1 on 0\n", "step 1 on 1\n"]
    world.cluster.write(job_id, "step 2 on {TPU_WORKER_ID}\n")
    world.cluster.write(job_id, "done\n", worker=1)
    world.cluster.exit(job_id, 0)
    world.cycle()
    logs = world.store.jobs.read_logs(job_id)
    assert logs.job_state == "SUCCEEDED"
    assert [(h.data, h.complete) for h in logs.hosts] == [
        ("step 1 on 0\nstep 2 on 0\n", True),
        ("step 1 on 1\nstep 2 on 1\ndone\n", True),
    ]


def test_a_job_that_cannot_fit_waits_with_the_policys_reason(world: World) -> None:
    job_id = world.submit(world.tenant("a", v6e=32), "v6e-16", num_slices=2)
    world.cycle()
    job = world.job(job_id)
    assert (job.state, job.reason_code) == ("QUEUED", "NO_SUCH_SLICES_IN_FLEET")
    assert job.reason


def test_a_draining_slice_gets_no_new_job(world: World) -> None:
    world.cycle()
    world.store.slices.set_draining("tpu-v4-16-0", True)
    job_id = world.submit(world.tenant("a", v4=8))
    world.cycle()
    assert world.job(job_id).slices == ("tpu-v4-16-1",)
    assert world.slices()["tpu-v4-16-0"] == ("DRAINING", None)


def test_the_head_of_line_flag_is_stored_and_fed_back_to_the_policy(world: World) -> None:
    tenant = world.tenant("a", v4=16)
    small = world.submit(tenant)
    world.cycle()
    big = world.submit(tenant, num_slices=2)
    later = world.submit(tenant)
    world.cycle()
    assert world.job(small).state == "STARTING"
    assert world.job(later).reason_code == "RESERVED_FOR_HEAD_OF_LINE"
    views = {j.id: j for j in world.service.tr.snapshot()[0].jobs}
    assert (views[big].head_of_line, views[later].head_of_line) == (True, False)


def test_a_finished_job_keeps_the_facts_of_its_last_attempt(world: World) -> None:
    """Issue 15: a job that borrowed said `borrowing yes` while it ran and `no` once it finished."""
    job_id = world.submit(world.tenant("lender"), "v4-16")  # no quota: it can only borrow
    run_to_running(world, job_id)
    assert world.job(job_id).borrowing is True
    world.cluster.exit(job_id, 0)
    world.cycle()
    done = world.job(job_id)
    assert (done.state, done.borrowing, done.slices) == ("SUCCEEDED", True, ("tpu-v4-16-0",))


class _NotifyingFleet(MemoryCluster):
    """A MemoryCluster that, like the Ray client, takes the loop's ``wake`` (``Notifying``)."""

    wakes: list[object]

    def notify(self, wake: object) -> None:
        self.wakes = [*getattr(self, "wakes", []), wake]


def test_a_notifying_cluster_wakes_the_loop_between_its_cycles(store: Store, tmp_path: Path) -> None:
    """A cluster that says when a launch's hosts started gets the loop's ``wake``; calling it runs
    a cycle at once, where the loop would otherwise sleep its whole interval (an hour here)."""
    cluster = _NotifyingFleet.of("v4-16:1")
    hour = ServiceConfig(stop_threads=0, interval_s=3600, busy_interval_s=3600)
    service = Service(store, cluster, state_dir=tmp_path / "state", config=hour)
    assert cluster.wakes == [service.wake]
    service.start()
    try:
        wait_for("the first cycle", lambda: service.cycles >= 1, 60)
        before = service.cycles
        wake = cluster.wakes[0]
        assert callable(wake)
        wake()
        wait_for("a cycle after the wake", lambda: service.cycles > before, 60)
    finally:
        service.close()


def test_the_sandbox_wakes_the_loop_when_its_jobs_hosts_end(world: World) -> None:
    """A sandbox job's hosts end at a time the cluster knows: it wakes the loop then, so a job of
    0.2 s is SUCCEEDED while the loop's idle interval is an hour. Without the wake its end waited
    for the next cycle (half a second in ``serve``), which left half a busy sandbox's slices idle."""
    world.cluster = MemoryCluster.sandbox("v4-16:1", job_seconds=0.2)
    hour = ServiceConfig(stop_threads=0, interval_s=3600, busy_interval_s=3600, log_budget_s=60)
    service = Service(world.store, world.cluster, state_dir=world.state_dir, config=hour)
    job = world.submit(world.tenant("a", v4=64))
    service.start()
    try:
        service.wake()  # the submit's wake, as the API gives it
        wait_for("the job's end", lambda: world.job(job).state == "SUCCEEDED", 60)
    finally:
        service.close()


def test_the_sandbox_alarm_rings_once_for_ends_due_together_and_then_leaves_no_thread() -> None:
    """Hosts that end at about the same time wake the loop once or a few times, never before they
    end; an alarm with nothing pending keeps no thread (a sandbox of 100,000 jobs must not hold one
    per job, nor one for ever)."""
    cluster = MemoryCluster.sandbox("v4-16:3", job_seconds=0.3)
    rings: list[float] = []
    cluster.notify(lambda: rings.append(time.monotonic()))
    started = time.monotonic()
    for n, name in enumerate(("tpu-v4-16-0", "tpu-v4-16-1", "tpu-v4-16-2")):
        cluster.launch(AttemptSpec(f"j{n}", 1, (name,), "v4-16", ("true",)))

    wait_for("the alarm to ring and its thread to end", lambda: bool(rings) and not cluster.alarm_pending, 60)
    assert 1 <= len(rings) <= 3 and rings[0] - started >= 0.3
    assert all(cluster.poll(f"j{n}", 1).hosts[0].state == HostState.EXITED for n in range(3))


def test_a_sandbox_forgets_all_but_its_last_stopped_attempts_and_no_jobs_output(world: World) -> None:
    """``serve --sandbox`` runs for days: its cluster keeps the last ``history`` stopped attempts
    (and records), not every one, and each job's output is in the store before it is forgotten."""
    world.cluster = MemoryCluster.sandbox("v4-16:2", job_seconds=0, history=3)
    world.restart()
    tenant = world.tenant("a", v4=64)
    bad = {"TPUFLEET_SANDBOX_SECONDS": "nan"}  # each host says why in its log and exits 2
    jobs = [world.submit(tenant, max_retries=0, env=bad) for _ in range(8)]
    for _ in range(40):
        world.cycle()
        if all(world.job(j).state == "FAILED" for j in jobs):
            break
    assert [world.job(j).state for j in jobs] == ["FAILED"] * 8
    assert (len(world.cluster.launches), len(world.cluster.stops)) == (3, 3)
    with pytest.raises(NotFoundError):
        world.cluster.poll(jobs[0], 1)  # forgotten
    assert world.cluster.poll(jobs[-1], 1).hosts  # kept
    for job_id in jobs:
        hosts = world.store.jobs.read_logs(job_id).hosts
        assert len(hosts) == 2 and all("TPUFLEET_SANDBOX_SECONDS must be" in h.data for h in hosts)


def test_the_wait_reasons_budget_is_per_second_not_per_cycle() -> None:
    """``reason_rewrites_per_s``: a second's worth at first, then the rate times the time since the
    last cycle (fractions carried), never more than a second's worth however long the pause."""
    budget = RateBudget(4000.0, now=100.0)
    assert budget.take(100.0) == 4000  # the first cycle: a second's worth
    assert budget.take(100.0) == 0
    busy = [budget.take(100.0 + i / 16) for i in range(1, 5)]  # a cycle every 62.5 ms
    assert busy == [250, 250, 250, 250]
    assert budget.take(100.75) == 2000  # idle: 0.5 s
    slow = RateBudget(3.0, now=0.0)
    assert [slow.take(t / 4) for t in range(1, 5)] == [3, 0, 1, 1]  # 0.75 a take: fractions carried
    assert budget.take(500.0) == 4000  # a long pause is still a second's worth
