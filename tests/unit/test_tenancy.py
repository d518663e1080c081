"""Operating tenants in the store (SQLite and PostgreSQL): update, soft delete, tokens with ids and
scopes, revocation, admin rotation, the audit log, and what the scheduling loop sees of it all."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from tpufleet.control.cluster.memory import FakeClock, MemoryCluster, Script
from tpufleet.control.loop.schedstate import SchedState
from tpufleet.control.loop.service import Service, ServiceConfig
from tpufleet.control.store.facade import Store
from tpufleet.control.store.loopwrites import Transitions
from tpufleet.control.store.tables import TokenRow
from tpufleet.control.store.values import JobRequest
from tpufleet.errors import AuthError, ConflictError, NotFoundError, SpecError
from tpufleet.scheduler.lifecycle import StopKind
from tpufleet.scheduler.model import Admit, JobId, Preempt, SliceName


def req(accelerator_type: str = "v4-16", **kw: object) -> JobRequest:
    return JobRequest.build(command=["python", "t.py"], accelerator_type=accelerator_type, **kw)  # type: ignore[arg-type]


def admit(store: Store, job_id: str, *slices: str, borrowing: bool = False) -> None:
    assert Transitions(store).admit(Admit(JobId(job_id), tuple(SliceName(s) for s in slices), borrowing))


def audit(store: Store, tenant: str | None = None) -> list[tuple[str, str | None, str | None, str]]:
    items, _ = store.audit_events(tenant, limit=1000)
    return [(e.kind, e.tenant, e.actor, e.message) for e in items]


# -- tokens ----------------------------------------------------------------------------------------
def test_tokens_have_ids_scopes_and_are_listed_without_secrets(store: Store) -> None:
    store.tenants.create("team-a", {"v4": 16})
    record, secret = store.tokens.create("team-a", "metrics", actor="admin")
    who = store.tokens.authenticate(secret)
    assert (who.tenant, who.scope, who.token_id, who.admin) == ("team-a", "metrics", record.id, False)
    listed = store.tokens.all("team-a")
    assert sorted((t.scope, t.tenant) for t in listed) == [("jobs", "team-a"), ("metrics", "team-a")]
    assert all(secret not in str(t.to_dict()) for t in listed)
    assert len({t.id for t in listed}) == 2 and all(len(t.id) == 12 for t in listed)
    assert ("token", "team-a", "admin", f"token {record.id} (metrics) created") in audit(store)


@pytest.mark.parametrize(
    ("tenant", "scope", "error"), [("team-a", "root", SpecError), ("nope", "jobs", NotFoundError)]
)
def test_a_token_needs_a_known_scope_and_tenant(store: Store, tenant: str, scope: str, error: type) -> None:
    store.tenants.create("team-a", {})
    with pytest.raises(error) as err:
        store.tokens.create(tenant, scope)
    assert "\n" not in str(err.value)


def test_last_use_is_written_at_most_once_a_minute(store: Store, clock: FakeClock) -> None:
    _, secret = store.tenants.create("team-a", {})
    first = clock()
    store.tokens.authenticate(secret)
    clock.advance(30)
    store.tokens.authenticate(secret)
    assert store.tokens.all("team-a")[0].last_used_at == first  # 30 s later: not written again
    clock.advance(31)
    store.tokens.authenticate(secret)
    assert store.tokens.all("team-a")[0].last_used_at == first + 61


def test_a_revoked_token_is_refused_at_once_and_leaves_the_listing(store: Store) -> None:
    _, secret = store.tenants.create("team-a", {})
    token_id = store.tokens.authenticate(secret).token_id
    assert token_id is not None
    store.tokens.revoke(token_id, actor="admin")
    with pytest.raises(AuthError, match="revoked"):
        store.tokens.authenticate(secret)
    assert store.tokens.all("team-a") == []
    assert store.tokens.revoke(token_id).id == token_id  # again: nothing changes
    assert [m for k, _, _, m in audit(store) if k == "token"] == [f"token {token_id} (jobs) revoked"]
    with pytest.raises(NotFoundError, match="token 'nope' not found"):
        store.tokens.revoke("nope")


def test_rotating_the_admin_token_revokes_every_other_admin_token(store: Store) -> None:
    old = [store.tokens.issue(), store.tokens.issue()]
    record, new, revoked = store.tokens.rotate_admin(actor="admin")
    assert (
        revoked == 2
        and store.tokens.authenticate(new).admin
        and store.tokens.authenticate(new).token_id == record.id
    )
    for token in old:
        with pytest.raises(AuthError):
            store.tokens.authenticate(token)
    with pytest.raises(ConflictError, match="last admin token"):
        store.tokens.revoke(record.id)
    assert audit(store)[-1][:3] == ("token", None, "admin")


# -- update --------------------------------------------------------------------------------------
def test_update_merges_the_quota_and_the_loop_sees_it_next_cycle(store: Store) -> None:
    store.tenants.create("team-a", {"v4": 32, "v6e": 16})
    state = SchedState(Transitions(store))
    before, _ = state.snapshot()
    assert [(t.quota, t.weight, t.preemption) for t in before.tenants] == [
        ({"v4": 32, "v6e": 16}, 1.0, "lower_priority")
    ]
    got = store.tenants.update("team-a", quota={"v4": 8, "v6e": 0, "v5e": 4}, weight=2.5, preemption="never")
    assert (got.quota, got.weight, got.preemption) == ({"v4": 8, "v5e": 4}, 2.5, "never")
    after, _ = state.snapshot()  # the kept state's next cycle
    assert [(t.quota, t.weight, t.preemption) for t in after.tenants] == [({"v4": 8, "v5e": 4}, 2.5, "never")]
    assert audit(store, "team-a")[-1] == (
        "tenant",
        "team-a",
        "admin",
        "tenant team-a updated: quota v4=32, v6e=16 -> v4=8, v5e=4; weight 1 -> 2.5; "
        "preemption lower_priority -> never",
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"quota": {"v9": 8}}, "'v9' is not a TPU generation"),
        ({"weight": 0}, "weight must be a number above 0"),
        ({"preemption": "always"}, "'always' is not a preemption setting; use lower_priority or never"),
    ],
)
def test_bad_updates_are_refused_and_change_nothing(
    store: Store, change: dict[str, object], message: str
) -> None:
    store.tenants.create("team-a", {"v4": 32})
    with pytest.raises(SpecError, match=message):
        store.tenants.update("team-a", **change)  # type: ignore[arg-type]
    assert store.tenants.get("team-a").quota == {"v4": 32}


def test_lowering_a_quota_stops_nothing_and_makes_the_excess_borrowed(store: Store) -> None:
    cluster = MemoryCluster.of("v4-16:4")
    Transitions(store).sync_slices(cluster.inventory())
    store.tenants.create("team-a", {"v4": 32})  # 4 slices of 8 chips
    jobs = [store.jobs.submit("team-a", req()).id for _ in range(3)]
    for n, job in enumerate(jobs):
        admit(store, job, f"tpu-v4-16-{n}")
    store.tenants.update("team-a", quota={"v4": 8})
    rows = {j.id: j for j in store.jobs.all(tenant="team-a")}
    assert [rows[j].state for j in jobs] == ["ADMITTED"] * 3  # nothing stopped
    # the most recently admitted beyond the new quota (8 chips: one job) count as borrowing
    assert [rows[j].borrowing for j in jobs] == [False, True, True]
    marked = [e for e in audit(store) if e[0] == "borrowing"]
    assert len(marked) == 2 and all(e[1:3] == ("team-a", "admin") for e in marked)


def test_an_unknown_or_deleted_tenant_cannot_be_updated(store: Store) -> None:
    with pytest.raises(NotFoundError, match="tenant 'team-b' not found"):
        store.tenants.update("team-b", weight=2)
    store.tenants.create("team-a", {})
    store.tenants.delete("team-a")
    with pytest.raises(ConflictError, match="was deleted"):
        store.tenants.update("team-a", weight=2)


# -- delete --------------------------------------------------------------------------------------
def test_delete_is_refused_while_jobs_are_queued_or_running(store: Store) -> None:
    Transitions(store).sync_slices(MemoryCluster.of("v4-16").inventory())
    store.tenants.create("team-a", {"v4": 8})
    running = store.jobs.submit("team-a", req()).id
    admit(store, running, "tpu-v4-16-0")
    store.jobs.submit("team-a", req())
    with pytest.raises(ConflictError) as err:
        store.tenants.delete("team-a")
    assert str(err.value).startswith("tenant team-a has 1 queued and 1 running jobs; cancel them first")
    assert store.tenants.get("team-a").state == "active"


def test_forced_delete_cancels_the_jobs_revokes_tokens_and_keeps_records(store: Store) -> None:
    Transitions(store).sync_slices(MemoryCluster.of("v4-16").inventory())
    _, secret = store.tenants.create("team-a", {"v4": 8})
    store.tenants.create("team-b", {})
    running = store.jobs.submit("team-a", req()).id
    admit(store, running, "tpu-v4-16-0")
    queued = [store.jobs.submit("team-a", req()).id for _ in range(3)]
    tenant, cancelled = store.tenants.delete("team-a", force=True, actor="admin")
    assert (tenant.state, cancelled) == ("deleting", 4)
    assert {store.jobs.get(j).state for j in queued} == {"CANCELLED"}
    assert store.jobs.get(running).cancel_requested  # the loop stops it: checkpoint signal, grace
    with pytest.raises(AuthError, match="revoked"):
        store.tokens.authenticate(secret)
    assert [t.name for t in store.tenants.all()] == ["team-b"]
    assert [(t.name, t.state) for t in store.tenants.all(include_deleted=True)] == [
        ("team-a", "deleting"),
        ("team-b", "active"),
    ]
    assert [t.name for t in Transitions(store).tenant_views()] == ["team-b"]
    with pytest.raises(ConflictError, match="was deleted"):
        store.jobs.submit("team-a", req())
    with pytest.raises(ConflictError, match="was deleted"):
        store.tokens.create("team-a")
    with pytest.raises(ConflictError, match="choose another name"):
        store.tenants.create("team-a", {})
    # once the running job ended, the tenant is deleted; its records stay readable
    tr = Transitions(store)
    tr.begin_stop(running, StopKind.CANCEL, "cancelled by request")
    tr.finish(running, 1, None)
    assert store.tenants.get("team-a").state == "deleted"
    assert store.jobs.get(running, tenant=None).state == "CANCELLED"
    kinds = [(k, a) for k, t, a, _ in audit(store, "team-a")]
    assert ("tenant", "admin") in kinds and kinds.count(("cancel", "admin")) == 4


def test_a_tenant_without_jobs_is_deleted_at_once(store: Store) -> None:
    store.tenants.create("team-a", {})
    tenant, cancelled = store.tenants.delete("team-a")
    assert (tenant.state, cancelled) == ("deleted", 0) and tenant.deleted_at is not None
    assert store.tenants.delete("team-a")[0].state == "deleted"  # again: nothing changes


def test_forced_delete_empties_the_kept_scheduling_state(store: Store) -> None:
    store.tenants.create("team-a", {})
    store.jobs.submit_many("team-a", [req() for _ in range(5)])
    state = SchedState(Transitions(store))
    assert len(state.snapshot()[0].jobs) == 5
    store.tenants.delete("team-a", force=True)
    snapshot, reasons = state.snapshot()
    assert (list(snapshot.jobs), reasons, state.loads) == ([], {}, 1)  # read from the events, not whole


# -- preemptions and cancels are audited -------------------------------------------------------------
def test_preemptions_are_audited_with_the_scheduler_as_actor(store: Store) -> None:
    Transitions(store).sync_slices(MemoryCluster.of("v4-16").inventory())
    store.tenants.create("team-a", {})
    victim = store.jobs.submit("team-a", req()).id
    admit(store, victim, "tpu-v4-16-0", borrowing=True)
    assert Transitions(store).preempt(Preempt(JobId(victim), JobId("ffffffff"), "reclaiming quota"))
    got = audit(store, "team-a")[-1]
    assert got[:3] == ("preempt", "team-a", "scheduler") and "preempted for job ffffffff" in got[3]


def test_a_tenant_reads_only_its_events_and_pages_follow_next(store: Store) -> None:
    store.tenants.create("team-a", {})
    store.tenants.create("team-b", {})
    for _ in range(3):
        store.tokens.create("team-a")
    items, last = store.audit_events("team-a", limit=2)
    assert [e.tenant for e in items] == ["team-a", "team-a"] and last == items[-1].id
    rest, end = store.audit_events("team-a", limit=2, after=last)
    assert [e.tenant for e in rest] == ["team-a", "team-a"] and end is None
    assert {e.tenant for e in store.audit_events("team-b")[0]} == {"team-b"}


def test_the_service_ends_a_forced_delete_by_stopping_running_work(store: Store, tmp_path: Path) -> None:
    cluster = MemoryCluster.of("v4-16", script=lambda spec: Script(run_after=1, exit_after=None))
    service = Service(store, cluster, state_dir=tmp_path, config=ServiceConfig(stop_threads=0))
    store.tenants.create("team-a", {"v4": 8})
    job = store.jobs.submit("team-a", req()).id
    for _ in range(4):
        service.run_once()
    assert store.jobs.get(job).state == "RUNNING"
    store.tenants.delete("team-a", force=True)
    for _ in range(6):
        service.run_once()
    assert store.jobs.get(job).state == "CANCELLED"
    assert store.tenants.get("team-a").state == "deleted"
    with store.tx() as s:
        assert s.scalar(select(TokenRow.revoked_at).where(TokenRow.tenant == "team-a")) is not None
    assert store.jobs.read_logs(job).job_id == job  # its records stay readable to the admin
