"""The loop's in-memory scheduling state sees exactly what a whole read of the store sees.

A randomized workload runs through the real service (MemoryCluster, the real policy, SQLite and
PostgreSQL); before every decision the snapshot the policy is handed (from ``SchedState``) is
compared with a snapshot read whole from the store. The events feed's holes (PostgreSQL committing
event ids out of order) are made by hand and must be read again.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from sqlalchemy import insert, update
from tests.unit.test_queues import assert_same_split

from tpufleet.control.cluster.memory import MemoryCluster, Script
from tpufleet.control.loop.schedstate import SchedState
from tpufleet.control.loop.service import Service, ServiceConfig
from tpufleet.control.store.facade import Store
from tpufleet.control.store.loopwrites import Transitions
from tpufleet.control.store.tables import EventRow, JobRow
from tpufleet.control.store.values import JobRequest
from tpufleet.scheduler.model import RunDecision, Snapshot, expand
from tpufleet.scheduler.policy import decide, decide_runs
from tpufleet.scheduler.queues import JobSet, split

TYPES = ("v4-16", "v4-32", "v6e-16")


def _key(s: Snapshot) -> tuple[object, ...]:
    return (tuple(s.tenants), tuple(s.slices), tuple(s.jobs))


def test_the_policy_sees_what_a_whole_read_sees_through_a_random_workload(
    store: Store, tmp_path: Path
) -> None:
    rng = random.Random(7)
    cluster = MemoryCluster.of("v4-16:3,v4-32:2,v6e-16:2", script=lambda spec: None)
    whole = Transitions(store)
    compared = []

    def checking(snapshot: Snapshot) -> Sequence[RunDecision]:
        assert _key(snapshot) == _key(whole.snapshot()[0])
        assert isinstance(snapshot.jobs, JobSet)  # and its kept split is the one made afresh
        assert_same_split(snapshot.jobs.split, split(list(snapshot.jobs)))
        compared.append(len(snapshot.jobs))
        runs = decide_runs(snapshot)  # what the loop runs: the same decisions as from a plain list
        assert expand(runs) == decide(replace(snapshot, jobs=list(snapshot.jobs)))
        return runs

    service = Service(
        store, cluster, state_dir=tmp_path, decide=checking, config=ServiceConfig(stop_threads=0)
    )
    for name, quota in (("a", {"v4": 32}), ("b", {"v4": 8, "v6e": 16}), ("c", {})):
        store.tenants.create(name, quota, weight=1 + len(name))
    for _ in range(60):
        for _ in range(rng.randrange(0, 6)):  # arrivals
            shape = {"num_slices": rng.choice((1, 1, 2)), "priority": rng.randrange(-2, 3)}
            req = JobRequest.build(command=["python", "t.py"], accelerator_type=rng.choice(TYPES), **shape)
            store.jobs.submit(rng.choice("abc"), req)
        jobs = store.jobs.all()
        for job in rng.sample(jobs, k=min(2, len(jobs))):  # users cancel queued and running jobs
            if job.state not in ("SUCCEEDED", "FAILED", "CANCELLED") and rng.random() < 0.3:
                store.jobs.request_cancel(job.id)
        for job in jobs:  # hosts start, finish, fail
            if job.state == "STARTING":
                cluster.start(job.id)
            elif job.state == "RUNNING" and rng.random() < 0.4:
                cluster.exit(job.id, rng.choice((0, 0, 0, 3)))
        service.run_once()
    assert len(compared) == 60 and max(compared) > 20
    assert service.state.loads == 1  # one whole read; every later cycle read only what changed
    states = {j.state for j in store.jobs.all()}
    assert {"SUCCEEDED", "CANCELLED", "QUEUED"} <= states


def test_a_late_event_id_is_read_again(store: Store) -> None:
    """PostgreSQL may commit event 7 after event 8: the job change behind 7 is not missed."""
    store.tenants.create("a", {"v4": 8})
    tr = Transitions(store)
    job = store.jobs.submit("a", JobRequest.build(command=["x"], accelerator_type="v4-16"))
    state = SchedState(tr)
    assert [v.id for v in state.snapshot()[0].jobs] == [job.id]
    last = tr.last_event()
    with store.tx() as s:  # event last+2 commits first ...
        s.execute(insert(EventRow), [{"id": last + 2, "at": 0.0, "kind": "info", "message": "other"}])
    assert [v.id for v in state.snapshot()[0].jobs] == [job.id]
    with store.tx() as s:  # ... then the transaction holding last+1 (it cancelled the job)
        s.execute(update(JobRow).where(JobRow.id == job.id).values(state="CANCELLED"))
        row = {"id": last + 1, "at": 0.0, "kind": "cancel", "message": "late", "job_id": job.id}
        s.execute(insert(EventRow), [row])
    assert list(state.snapshot()[0].jobs) == []
    assert state.loads == 1


def test_a_restart_reads_the_store_whole(store: Store, tmp_path: Path) -> None:
    store.tenants.create("a", {"v4": 64})
    for _ in range(5):
        store.jobs.submit("a", JobRequest.build(command=["x"], accelerator_type="v4-16"))
    cluster = MemoryCluster.of("v4-16:2", script=lambda spec: Script(run_after=1, exit_after=None))
    first = Service(store, cluster, state_dir=tmp_path, config=ServiceConfig(stop_threads=0))
    first.run_once()
    again = Service(store, cluster, state_dir=tmp_path, config=ServiceConfig(stop_threads=0))
    snapshot, _ = again.state.snapshot()
    assert _key(snapshot) == _key(Transitions(store).snapshot()[0]) and len(snapshot.jobs) == 5
