"""The leader lease and the fencing of the loop's writes (``control/store/lease.py``), on SQLite and
PostgreSQL: one leader at a time, takeover after expiry or a release with a larger token, the
database's clock (not a replica's), and a deposed leader's grouped write refused whole."""

from __future__ import annotations

import pytest
from sqlalchemy import select, text

from tpufleet.control.cluster.memory import MemoryCluster
from tpufleet.control.store.facade import Store
from tpufleet.control.store.lease import FencedError, Lease
from tpufleet.control.store.loopwrites import Transitions
from tpufleet.control.store.tables import AttemptRow, EventRow, JobRow
from tpufleet.control.store.values import JobRequest
from tpufleet.scheduler.lifecycle import StopKind
from tpufleet.scheduler.model import Admit, JobId, SliceName


def expire(store: Store) -> None:
    """What the lease length does to a leader that stopped renewing (without waiting for it)."""
    with store.tx() as s:
        s.execute(text("UPDATE leader_lease SET expires_at = 0"))


def test_one_leader_at_a_time_and_a_takeover_after_expiry_has_a_larger_token(store: Store) -> None:
    a, b = Lease(store, "host:1:a"), Lease(store, "host:2:b")
    assert a.read() is None  # no replica ever led
    assert a.acquire() and a.token == 1
    assert not b.acquire() and b.token is None
    held = b.read()
    assert held is not None and held.holder == "host:1:a" and held.token == 1 and held.live
    assert a.renew() and a.acquire()  # a leader's acquire renews: still term 1
    assert a.token == 1
    expire(store)
    assert b.acquire() and b.token == 2
    assert not a.renew() and a.token is None  # the old leader learns it lost on its next renewal
    assert not a.acquire()  # b's lease is live


def test_a_release_hands_over_at_once(store: Store) -> None:
    a, b = Lease(store, "host:1:a"), Lease(store, "host:2:b")
    assert a.acquire() and not b.acquire()
    assert a.release() and a.token is None
    assert b.acquire() and b.token == 2
    assert not a.release()  # nothing held, nothing written


def test_the_lease_is_timed_by_the_databases_clock_not_the_replicas(db_url: str) -> None:
    """A replica whose clock runs an hour ahead must not think the leader's lease expired."""
    ok = Store.open(db_url)
    ahead = Store(db_url, clock=lambda: 4_000_000_000.0)
    try:
        a, b = Lease(ok, "host:1:a"), Lease(ahead, "host:2:b")
        assert a.acquire()
        assert not b.acquire()
        state = b.read()
        assert state is not None and state.live and abs(state.now - state.since) < 60
    finally:
        ahead.close()
        ok.close()


def test_leader_changes_are_audit_events(store: Store) -> None:
    a, b = Lease(store, "host:1:a"), Lease(store, "host:2:b")
    a.acquire()
    a.release()
    b.acquire()
    events, _ = store.audit_events()
    assert [(e.kind, e.actor, e.message) for e in events] == [
        ("leader", "host:1:a", "replica host:1:a leads (fencing token 1)"),
        ("leader", "host:1:a", "replica host:1:a hands over the lease (fencing token 1)"),
        ("leader", "host:2:b", "replica host:2:b leads (fencing token 2)"),
    ]


def test_lease_lengths_are_checked() -> None:
    with pytest.raises(ValueError, match="renew_s"):
        Lease(Store("sqlite://"), lease_s=1.0, renew_s=1.0)


# -- fencing ------------------------------------------------------------------------------------
def fenced(store: Store, lease: Lease, term: int | None) -> Transitions:
    """The loop's writes as a replica's loop makes them: on the store fenced by its term."""
    return Transitions(store.fenced(lambda conn: lease.check(conn, term)))


def test_a_deposed_leaders_grouped_writes_are_refused_and_change_nothing(store: Store) -> None:
    store.tenants.create("t", {"v4": 64})
    Transitions(store).sync_slices(MemoryCluster.of("v4-16:2").inventory())
    job = store.jobs.submit("t", JobRequest.build(command=["true"], accelerator_type="v4-16"))
    old, new = Lease(store, "host:1:a"), Lease(store, "host:2:b")
    assert old.acquire()
    term = old.token
    leader = fenced(store, old, term)
    s0, s1 = SliceName("tpu-v4-16-0"), SliceName("tpu-v4-16-1")
    assert leader.admit_all([Admit(JobId(job.id), (s0,), False)]) == [True]  # its term: written
    expire(store)  # it paused past its lease...
    assert new.acquire()  # ...and another replica took over
    with pytest.raises(FencedError, match="fencing token is 2, this replica's term is 1"):
        leader.begin_stops([(job.id, StopKind.CANCEL, "cancelled")])
    with pytest.raises(FencedError):
        leader.sync_slices(MemoryCluster.of("v4-16:1").inventory())
    with pytest.raises(FencedError):
        leader.launched_all([(job.id, 1)])
    with store.tx() as s:
        assert s.execute(select(JobRow.state, JobRow.stop_kind)).one() == ("ADMITTED", None)
    assert {s.name: s.state for s in store.slices.all()} == {"tpu-v4-16-0": "HELD", "tpu-v4-16-1": "FREE"}
    follower = fenced(store, new, new.token)  # the new leader's writes go through
    assert follower.launched_all([(job.id, 1)]) == [True]
    with pytest.raises(FencedError):  # a standby (no term) writes nothing either
        fenced(store, new, None).admit_all([Admit(JobId(job.id), (s1,), False)])


def test_the_api_store_is_not_fenced(store: Store) -> None:
    """Every replica serves the API: submits on a standby's (unfenced) store are written."""
    lease = Lease(store, "host:1:a")
    assert lease.read() is None
    store.tenants.create("t", {"v4": 16})
    assert (
        store.jobs.submit("t", JobRequest.build(command=["true"], accelerator_type="v4-16")).state == "QUEUED"
    )


def test_every_write_of_a_fenced_transaction_carries_its_term_and_the_databases_clock(store: Store) -> None:
    """The stamps ``tpufleet chaos --replicas`` checks: events and attempts the loop wrote name the
    term that wrote them; the API's writes and a store with no fence (a lone SQLite serve) none."""
    store.tenants.create("t", {"v4": 64})
    Transitions(store).sync_slices(MemoryCluster.of("v4-16:2").inventory())  # unfenced: NULL
    job = store.jobs.submit("t", JobRequest.build(command=["true"], accelerator_type="v4-16"))
    a, b = Lease(store, "host:1:a"), Lease(store, "host:2:b")
    assert a.acquire()
    first = fenced(store, a, a.token)
    assert first.admit_all([Admit(JobId(job.id), (SliceName("tpu-v4-16-0"),), False)]) == [True]
    assert first.launched_all([(job.id, 1)]) == [True]
    expire(store)
    assert b.acquire()
    assert fenced(store, b, b.token).finish_all([(job.id, 1, None)]) == ["SUCCEEDED"]
    with store.tx() as s:
        stamps = select(EventRow.kind, EventRow.term, EventRow.fenced_at).order_by(EventRow.id)
        events = s.execute(stamps).all()
        attempt = s.execute(select(AttemptRow.launch_term, AttemptRow.end_term)).one()
    assert [(k, t) for k, t, _ in events] == [
        ("tenant", None), ("slice", None), ("slice", None), ("submit", None),  # unfenced: the API's
        ("leader", 1), ("admit", 1), ("launch", 1), ("leader", 2), ("end", 2),
    ]  # fmt: skip
    stamped = [at for _, t, at in events if t is not None]
    assert stamped == sorted(stamped) and all(isinstance(at, float) for at in stamped)
    assert tuple(attempt) == (1, 2)
