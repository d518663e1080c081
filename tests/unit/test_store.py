"""The store on SQLite and PostgreSQL: tenants, tokens, jobs, validation, cancel, slices, logs."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import event, func, select

from tpufleet.control.cluster.memory import MemoryCluster
from tpufleet.control.store.facade import FenceStamp, Store
from tpufleet.control.store.loopwrites import ENDED, LEFT, Transitions
from tpufleet.control.store.tables import EventRow, JobRow, TenantRow, TokenRow
from tpufleet.control.store.values import JobRequest
from tpufleet.errors import AuthError, ConflictError, NotFoundError, SpecError
from tpufleet.scheduler.lifecycle import StopKind
from tpufleet.scheduler.model import Admit, JobId, SliceName


def req(accelerator_type: str = "v4-16", **kw: object) -> JobRequest:
    return JobRequest.build(
        command=kw.pop("command", ["python", "train.py"]), accelerator_type=accelerator_type, **kw
    )  # type: ignore[arg-type]


def count(store: Store, column: object) -> int:
    with store.tx() as s:
        return int(s.scalar(select(func.count(column))))  # type: ignore[call-overload]


def column(store: Store, column: Any, job_id: str) -> object:
    with store.tx() as s:
        return s.scalar(select(column).where(JobRow.id == job_id))


def test_tenant_token_authenticates_as_that_tenant_and_admin_token_as_admin(store: Store) -> None:
    tenant, token = store.tenants.create("team-a", {"v4": 32, "v6e": 16}, weight=2)
    admin = store.tokens.issue()
    assert tenant.quota == {"v4": 32, "v6e": 16} and tenant.weight == 2.0
    assert store.tokens.authenticate(token).tenant == "team-a"
    assert store.tokens.authenticate(admin).admin
    assert token not in {t for (t,) in _token_hashes(store)}  # only hashes are stored


def _token_hashes(store: Store) -> list[tuple[str]]:
    with store.tx() as s:
        return [(h,) for h in s.scalars(select(TokenRow.token_hash))]


@pytest.mark.parametrize("token", [None, "", "tf_not-a-real-token"])
def test_missing_or_unknown_token_is_an_auth_error(store: Store, token: str | None) -> None:
    with pytest.raises(AuthError):
        store.tokens.authenticate(token)


@pytest.mark.parametrize(
    ("name", "quota", "weight", "message"),
    [
        ("Team_A", {"v4": 8}, 1, "not a valid tenant name"),
        ("team-a", {"v9": 8}, 1, "'v9' is not a TPU generation"),
        ("team-a", {"v4": -1}, 1, "chips must be an integer from 0 to 1,000,000"),
        ("team-a", {"v4": 10**30}, 1, "v4=1e\\+30: chips must be an integer from 0 to 1,000,000"),
        ("team-a", {"v4": 1_000_001}, 1, "chips must be an integer from 0"),
        ("team-a", {"v4": True}, 1, "chips must be an integer"),
        ("team-a", {"v4": 8}, float("nan"), "weight must be a number above 0"),
        ("team-a", {"v4": 8}, 0, "weight must be a number above 0"),
    ],
)
def test_bad_tenant_is_rejected_and_nothing_is_stored(
    store: Store, name: str, quota: dict[str, int], weight: float, message: str
) -> None:
    with pytest.raises(SpecError, match=message):
        store.tenants.create(name, quota, weight)
    assert count(store, TenantRow.name) == 0 and count(store, TokenRow.token_hash) == 0


def test_generation_aliases_are_normalised_and_duplicates_conflict(store: Store) -> None:
    tenant, _ = store.tenants.create("team-a", {"v5litepod": 16, "v7x": 8})
    assert tenant.quota == {"v5e": 16, "tpu7x": 8}
    with pytest.raises(ConflictError, match="already exists"):
        store.tenants.create("team-a", {"v4": 8})
    assert [t.name for t in store.tenants.all()] == ["team-a"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"accelerator_type": "v4-15"}, "v4-15 is not a v4 slice size; closest: v4-8, v4-16"),
        ({"accelerator_type": "tpu-z"}, "not an accelerator type"),
        ({"num_slices": 0}, "num_slices: must be an integer from 1"),
        ({"max_retries": -1}, "max_retries"),
        ({"command": []}, "command: a job needs a command"),
        ({"env": {"TPU_NAME": "x"}}, "set by tpufleet"),
        ({"env": {"1BAD": "x"}}, "not a valid variable name"),
    ],
)
def test_bad_job_input_names_the_field_and_value(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        req(**kwargs)


def test_submit_stores_a_queued_job_with_a_short_id_and_canonical_type(store: Store) -> None:
    store.tenants.create("team-a", {"v5e": 16})
    job = store.jobs.submit("team-a", req("v5e-16", num_slices=2, env={"LR": "0.1"}, priority=5))
    assert (job.id, job.state, job.attempt, job.name) == ("00000001", "QUEUED", 1, "train")
    assert job.accelerator_type == "v5litepod-16" and job.num_slices == 2
    got = store.jobs.get(job.id)
    assert got.env == {"LR": "0.1"} and got.command == ("python", "train.py") and got.priority == 5
    assert [j.id for j in store.jobs.all()] == [job.id]


def test_submit_for_unknown_tenant_stores_nothing(store: Store) -> None:
    with pytest.raises(NotFoundError, match="tenant 'ghost' not found"):
        store.jobs.submit("ghost", req())
    assert count(store, JobRow.seq) == 0


def test_job_id_collisions_draw_a_new_id(db_url: str) -> None:
    ids = iter(["aaaaaaaa", "aaaaaaaa", "bbbbbbbb"])
    store = Store.open(db_url, new_id=lambda: next(ids))
    try:
        store.tenants.create("t", {"v4": 8})
        assert [store.jobs.submit("t", req()).id for _ in range(2)] == ["aaaaaaaa", "bbbbbbbb"]
    finally:
        store.close()


def test_a_tenant_sees_only_its_own_jobs(store: Store) -> None:
    store.tenants.create("team-a", {"v4": 8})
    store.tenants.create("team-b", {"v4": 8})
    a = store.jobs.submit("team-a", req())
    b = store.jobs.submit("team-b", req())
    assert [j.id for j in store.jobs.all(tenant="team-a")] == [a.id]
    assert store.jobs.get(a.id, tenant="team-a").id == a.id
    for call in (store.jobs.get, store.jobs.request_cancel, store.jobs.read_logs):
        with pytest.raises(NotFoundError, match=f"job '{b.id}' not found"):
            call(b.id, tenant="team-a")
    assert store.jobs.get(b.id).state == "QUEUED"
    with pytest.raises(NotFoundError, match="job 'nope' not found"):
        store.jobs.get("nope")


def test_cancel_a_queued_job_at_once_and_again_is_harmless(store: Store) -> None:
    store.tenants.create("t", {"v4": 8})
    job = store.jobs.submit("t", req())
    assert store.jobs.request_cancel(job.id).state == "CANCELLED"
    assert store.jobs.request_cancel(job.id).state == "CANCELLED"


def test_admission_is_all_or_nothing_and_never_takes_a_held_slice(store: Store) -> None:
    tr = Transitions(store)
    tr.sync_slices(MemoryCluster.of("v4-16:2").inventory())
    store.tenants.create("t", {"v4": 16})
    first, second = store.jobs.submit("t", req()), store.jobs.submit("t", req(num_slices=2))
    assert tr.admit(Admit(JobId(first.id), (SliceName("tpu-v4-16-0"),), False))
    both = (SliceName("tpu-v4-16-0"), SliceName("tpu-v4-16-1"))
    assert not tr.admit(Admit(JobId(second.id), both, False))
    assert store.jobs.get(second.id).state == "QUEUED"
    assert {s.name: (s.state, s.holder) for s in store.slices.all()} == {
        "tpu-v4-16-0": ("HELD", first.id),
        "tpu-v4-16-1": ("FREE", None),
    }


def test_a_cycles_admissions_are_one_write_that_answers_for_each(store: Store) -> None:
    tr = Transitions(store)
    tr.sync_slices(MemoryCluster.of("v4-16:3").inventory())
    store.tenants.create("t", {"v4": 64})
    a, b, c, d = (store.jobs.submit("t", req()).id for _ in range(4))
    store.jobs.request_cancel(c)
    s0, s1, s2 = (SliceName(f"tpu-v4-16-{i}") for i in range(3))
    answers = tr.admit_all(
        [
            Admit(JobId(a), (s0,), False),
            Admit(JobId(b), (s1, s0), False),  # s0 was just taken: b is dropped whole, s1 stays free
            Admit(JobId(c), (s2,), False),  # cancelled meanwhile
            Admit(JobId(d), (s1,), False),
        ]
    )
    assert answers == [True, False, False, True]
    assert [store.jobs.get(j).state for j in (a, b, c, d)] == ["ADMITTED", "QUEUED", "CANCELLED", "ADMITTED"]
    assert {s.name: (s.state, s.holder) for s in store.slices.all()} == {
        "tpu-v4-16-0": ("HELD", a),
        "tpu-v4-16-1": ("HELD", d),
        "tpu-v4-16-2": ("FREE", None),
    }
    assert [column(store, JobRow.admit_seq, j) for j in (a, d)] == [1, 2]


def test_a_group_of_stops_keeps_each_compare_and_set(store: Store) -> None:
    tr = Transitions(store)
    tr.sync_slices(MemoryCluster.of("v4-16:2").inventory())
    store.tenants.create("t", {"v4": 64})
    a, b = (store.jobs.submit("t", req()).id for _ in range(2))
    assert tr.admit_all(
        [Admit(JobId(j), (SliceName(f"tpu-v4-16-{i}"),), False) for i, j in enumerate((a, b))]
    )
    assert tr.launched_all([(a, 1), (b, 1)]) == [True, True]
    assert tr.launched_all([(a, 1)]) == [False]  # already STARTING
    assert tr.begin_stops([(a, StopKind.CANCEL, "cancelled by request")]) == [True]
    answers = tr.begin_stops(
        [(a, StopKind.PREEMPT, "preempted"), (b, StopKind.SUCCESS, "done"), (b, StopKind.FAIL, "late")]
    )
    assert answers == [False, True, False]  # a cancel on record wins; the first stop of b stands
    assert [column(store, JobRow.stop_kind, j) for j in (a, b)] == ["cancel", "success"]
    assert tr.finish_all([(a, 1, None), (b, 1, None)]) == ["CANCELLED", "SUCCEEDED"]
    assert {s.state for s in store.slices.all()} == {"FREE"}


def test_a_cancel_that_comes_between_a_groups_read_and_its_write_wins(db_url: str) -> None:
    """A grouped write reads its members, then writes them in one statement per kind. PostgreSQL:
    a cancel another connection commits in between is found (the compare-and-set is on the row as
    read), the group is written again a member at a time, and the cancel is kept, not overwritten.
    SQLite: the group holds the write lock from its first read (the loop's writes claim it,
    ``database.claim_write_lock``), so the cancel cannot come between: it waits, commits after the
    group, and is kept all the same."""
    store, api = Store.open(db_url), Store.open(db_url)
    try:
        tr = Transitions(store)
        tr.sync_slices(MemoryCluster.of("v4-16:2").inventory())
        store.tenants.create("t", {"v4": 64})
        a, b = (store.jobs.submit("t", req()).id for _ in range(2))
        tr.admit_all([Admit(JobId(j), (SliceName(f"tpu-v4-16-{i}"),), False) for i, j in enumerate((a, b))])
        between: list[str] = []
        canceller: list[threading.Thread] = []

        def cancel_first(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
            if statement.startswith("UPDATE jobs") and not canceller:
                canceller.append(
                    threading.Thread(target=lambda: between.append(api.jobs.request_cancel(a).state))
                )
                canceller[0].start()
                if store.engine.dialect.name != "sqlite":
                    canceller[0].join()  # committed before the group's write

        event.listen(store.engine, "before_cursor_execute", cancel_first)
        try:
            answers = tr.begin_stops([(a, StopKind.PREEMPT, "preempted"), (b, StopKind.PREEMPT, "preempted")])
        finally:
            event.remove(store.engine, "before_cursor_execute", cancel_first)
        canceller[0].join(60)
        assert between == ["ADMITTED"]
        assert answers == [True, True]
        assert column(store, JobRow.cancel_requested, a) is True  # read again, not written over
        assert tr.begin_stop(a, StopKind.CANCEL, "cancelled")  # the next cycle's inventory step
        assert tr.finish_all([(a, 1, None), (b, 1, None)]) == ["CANCELLED", "QUEUED"]
    finally:
        store.close()
        api.close()


def test_an_unchanged_inventory_still_shows_what_admissions_ends_and_drains_changed(store: Store) -> None:
    """Syncing the same inventory again writes nothing, but the slices it answers carry every
    holder, state and drain changed since (the policy plans on them)."""
    tr, fleet = Transitions(store), MemoryCluster.of("v4-16:2")
    a, b = "tpu-v4-16-0", "tpu-v4-16-1"
    tr.sync_slices(fleet.inventory())
    store.tenants.create("t", {"v4": 64})
    job = store.jobs.submit("t", req()).id
    assert tr.admit(Admit(JobId(job), (SliceName(a),), False))
    store.slices.set_draining(b, True)
    now = {s.name: (s.state, s.holder, s.draining) for s in tr.sync_slices(fleet.inventory())}
    assert now == {a: ("HELD", job, False), b: ("DRAINING", None, True)}
    assert tr.begin_stop(job, StopKind.CANCEL, "cancelled") and tr.finish(job, 1, None) == "CANCELLED"
    store.slices.set_draining(b, False)
    now = {s.name: (s.state, s.holder, s.draining) for s in tr.sync_slices(fleet.inventory())}
    assert now == {a: ("FREE", None, False), b: ("FREE", None, False)}
    assert tr.sync_slices(fleet.inventory()) == store.slices.all()


def test_a_cancelled_job_is_not_admitted(store: Store) -> None:
    tr = Transitions(store)
    tr.sync_slices(MemoryCluster.of("v4-16").inventory())
    store.tenants.create("t", {"v4": 8})
    job = store.jobs.submit("t", req())
    store.jobs.request_cancel(job.id)
    assert not tr.admit(Admit(JobId(job.id), (SliceName("tpu-v4-16-0"),), False))
    assert store.slices.all()[0].state == "FREE"


def test_inventory_marks_broken_and_vanished_slices_and_drain_is_kept(store: Store) -> None:
    tr, fleet = Transitions(store), MemoryCluster.of("v4-16:2,v6e-16")
    tr.sync_slices(fleet.inventory())
    store.slices.set_draining("tpu-v6e-16-0", True)
    fleet.kill_host("tpu-v4-16-0", 1)
    tr.sync_slices([s for s in fleet.inventory() if s.name != "tpu-v4-16-1"])
    states = {s.name: (s.state, s.problems) for s in store.slices.all()}
    assert states == {
        "tpu-v4-16-0": ("BROKEN", ("host 1 is dead",)),
        "tpu-v4-16-1": ("BROKEN", ("not in the cluster's inventory",)),
        "tpu-v6e-16-0": ("DRAINING", ()),
    }
    fleet.repair("tpu-v4-16-0")
    store.slices.set_draining("tpu-v6e-16-0", False)
    tr.sync_slices(fleet.inventory())
    assert [s.state for s in store.slices.all()] == ["FREE", "FREE", "FREE"]
    with pytest.raises(NotFoundError, match="closest: tpu-v6e-16-0"):
        store.slices.set_draining("tpu-v6e-16-9", True)


def test_inventory_discovers_no_slice_from_dead_nodes_alone(store: Store) -> None:
    """Ray keeps dead nodes in its node table: a slice none of whose hosts is alive is never new
    to the table; a known slice whose hosts all died stays, BROKEN."""
    tr, fleet = Transitions(store), MemoryCluster.of("v4-16:2")
    tr.sync_slices([s for s in fleet.inventory() if s.name == "tpu-v4-16-0"])
    for name in ("tpu-v4-16-0", "tpu-v4-16-1"):
        fleet.kill_host(name, 0)
        fleet.kill_host(name, 1)
    tr.sync_slices(fleet.inventory())
    assert {s.name: s.state for s in store.slices.all()} == {"tpu-v4-16-0": "BROKEN"}
    assert not [e for e in store.events() if e["slice"] == "tpu-v4-16-1"]


def test_inventory_keeps_retired_slices_out_and_lets_a_held_one_finish(store: Store) -> None:
    """``retired`` (slices of deleted groups): not discovered although Ray lists them alive (dying
    hosts), a free row leaves the table, a held one stays until its holder let it go."""
    tr, fleet = Transitions(store), MemoryCluster.of("v4-16:3")
    a, b, c = (f"tpu-v4-16-{i}" for i in range(3))
    tr.sync_slices([s for s in fleet.inventory() if s.name != c])
    store.tenants.create("t", {"v4": 64})
    job = store.jobs.submit("t", req()).id
    assert tr.admit(Admit(JobId(job), (SliceName(b),), False))
    retired = frozenset({a, b, c})
    tr.sync_slices(fleet.inventory(), retired)
    assert {s.name: s.state for s in store.slices.all()} == {b: "HELD"}
    assert [e["message"] for e in store.events() if e["slice"] == a][-1] == LEFT
    assert tr.begin_stop(job, StopKind.CANCEL, "cancelled")
    tr.finish(job, 1, None)
    tr.sync_slices(fleet.inventory(), retired)
    assert store.slices.all() == []
    tr.sync_slices(fleet.inventory())  # no longer retired (a group of that name made again)
    assert [s.name for s in store.slices.all()] == [a, b, c]


def test_a_slice_whose_hosts_all_ended_on_purpose_leaves_once_free_and_comes_back_alive(
    store: Store,
) -> None:
    """``SliceInfo.gone`` (every host stopped, or drained for a preemption or as idle, by Ray's
    death reasons): the slice left, it did not break. A free row leaves with why, at once; a held
    one stays BROKEN until its holder let it go, then leaves at the next sync even though the
    cluster says the same as before; a host of that name alive again brings it back, FREE."""
    tr, fleet = Transitions(store), MemoryCluster.of("v4-16:3")
    a, b, c = (f"tpu-v4-16-{i}" for i in range(3))
    tr.sync_slices(fleet.inventory())
    store.tenants.create("t", {"v4": 64})
    job = store.jobs.submit("t", req()).id
    assert tr.admit(Admit(JobId(job), (SliceName(b),), False))
    for name in (a, b):
        fleet.kill_host(name, 0)
        fleet.kill_host(name, 1)
    why = {a: "drained as idle: scaled in", b: "drained for a preemption"}

    def inventory() -> list[Any]:
        return [replace(i, gone=why.get(i.name, "")) for i in fleet.inventory()]

    tr.sync_slices(inventory())
    assert {s.name: s.state for s in store.slices.all()} == {b: "BROKEN", c: "FREE"}
    left = [e["message"] for e in store.events() if e["slice"] == a][-1]
    assert left == f"{ENDED} (drained as idle: scaled in)"
    assert tr.begin_stop(job, StopKind.CANCEL, "cancelled")
    tr.finish(job, 1, None)
    tr.sync_slices(inventory())  # the same inventory as the sync before
    assert [s.name for s in store.slices.all()] == [c]
    assert [e["message"] for e in store.events() if e["slice"] == b][
        -1
    ] == f"{ENDED} (drained for a preemption)"
    tr.sync_slices(inventory())
    assert [s.name for s in store.slices.all()] == [c]  # dead nodes alone discover nothing
    fleet.repair(a)
    why.pop(a)
    tr.sync_slices(inventory())
    assert {s.name: s.state for s in store.slices.all()} == {a: "FREE", c: "FREE"}


def test_logs_are_stored_per_host_and_read_from_an_offset(store: Store) -> None:
    tr = Transitions(store)
    tr.sync_slices(MemoryCluster.of("v4-16").inventory())
    store.tenants.create("t", {"v4": 8})
    job = store.jobs.submit("t", req())
    tr.admit(Admit(JobId(job.id), (SliceName("tpu-v4-16-0"),), False))
    tr.launched(job.id, 1)
    tr.append_log(job.id, 1, 0, "step 1\n", 7, False)
    tr.append_log(job.id, 1, 0, "step 2\n", 14, True)
    tr.append_log(job.id, 1, 1, "other host\n", 11, False)
    logs = store.jobs.read_logs(job.id)
    assert [(h.host, h.slice, h.worker_id, h.data) for h in logs.hosts] == [
        (0, "tpu-v4-16-0", 0, "step 1\nstep 2\n"),
        (1, "tpu-v4-16-0", 1, "other host\n"),
    ]
    tail = store.jobs.read_logs(job.id, host=0, offset=10)
    assert [(h.data, h.next_offset, h.complete) for h in tail.hosts] == [("p 2\n", 14, True)]
    assert store.jobs.read_logs(job.id, host=0, offset=14).hosts[0].data == ""
    with pytest.raises(NotFoundError, match="hosts 0 to 1"):
        store.jobs.read_logs(job.id, host=2)
    with pytest.raises(NotFoundError, match="attempts 1 to 1, not 2"):
        store.jobs.read_logs(job.id, attempt=2)
    assert store.jobs.read_logs(job.id, attempt=1).attempt == 1


def test_a_second_store_on_the_same_database_sees_everything(db_url: str) -> None:
    first = Store.open(db_url)
    first.tenants.create("t", {"v4": 8})
    job = first.jobs.submit("t", req())
    first.close()
    second = Store.open(db_url)
    try:
        assert second.jobs.get(job.id).state == "QUEUED" and [t.name for t in second.tenants.all()] == ["t"]
    finally:
        second.close()


def test_the_parts_of_a_fenced_store_write_through_its_fence(store: Store) -> None:
    """``Store.fenced`` is a view of the same database whose parts (jobs, tenants, slices...) run
    the fence first in each of their transactions: a deposed leader's write through any of them
    rolls back having written nothing, and a passing one is stamped with the fence's term."""
    store.tenants.create("t", {"v4": 8})

    class Deposed(Exception):
        pass

    def refuse(_conn: Any) -> FenceStamp:
        raise Deposed("another replica leads")

    deposed = store.fenced(refuse)
    with pytest.raises(Deposed):
        deposed.jobs.submit("t", req())
    with pytest.raises(Deposed):
        deposed.tenants.update("t", weight=2.0)
    assert store.jobs.all() == [] and store.tenants.get("t").weight == 1.0

    leading = store.fenced(lambda _conn: FenceStamp(term=7, at=1.0))
    job = leading.jobs.submit("t", req())
    leading.jobs.request_cancel(job.id, actor="admin")
    assert store.jobs.get(job.id).state == "CANCELLED"
    with store.tx() as s:
        terms = s.execute(select(EventRow.kind, EventRow.term).where(EventRow.job_id == job.id)).all()
    assert ("cancel", 7) in terms
