"""How the loop stores why queued jobs wait: bounded writes that still catch up.

A job's first reason and every head-of-line flip are written at once (the policy reads the flag
back next cycle); other changes (a new code, or a new wording of the same code) are written at most
``refresh`` per call, half to the front of the queue and half in turn over the rest, so that every
stored reason equals the policy's within a few calls.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection

from tpufleet.control.records import JobRequest
from tpufleet.control.store import Store
from tpufleet.control.transitions import Stored, Transitions
from tpufleet.scheduler.model import JobId, NotFit, NotFitCode, Wait

FREE = NotFit(NotFitCode.WAITING_FOR_FREE_SLICES, "no free v4-16 slice")
HEAD = NotFit(NotFitCode.RESERVED_FOR_HEAD_OF_LINE, "reserved for the head of line")


def _queued(store: Store, n: int) -> list[str]:
    store.create_tenant("a", {"v4": 64})
    return [
        store.submit("a", JobRequest.build(command=["true"], accelerator_type="v4-16")).id for _ in range(n)
    ]


def _stored(tr: Transitions) -> dict[str, Stored]:
    return tr.job_views()[1]


def test_first_reasons_and_head_of_line_flips_are_written_at_once(store: Store) -> None:
    ids = _queued(store, 12)
    tr = Transitions(store)
    written = tr.wait_reasons([Wait(JobId(j), FREE) for j in ids], _stored(tr), refresh=2)
    assert len(written) == 12  # none had a reason yet
    flips = [Wait(JobId(j), FREE, head_of_line=(i == 5)) for i, j in enumerate(ids)]
    written = tr.wait_reasons(flips, _stored(tr), refresh=2)
    assert [j for j, _ in written] == [ids[5]]
    assert _stored(tr)[ids[5]] == (FREE.code.value, FREE.message, True)


def test_other_changes_are_bounded_front_first_and_all_catch_up(store: Store) -> None:
    ids = _queued(store, 20)
    tr = Transitions(store)
    tr.wait_reasons([Wait(JobId(j), FREE) for j in ids], _stored(tr), refresh=4)
    moved = [Wait(JobId(j), HEAD) for j in ids]
    first = tr.wait_reasons(moved, _stored(tr), refresh=4)
    assert len(first) == 4
    assert [j for j, _ in first][:2] == ids[:2]  # the front of the queue is always fresh
    calls = 1
    while any(v[0] != HEAD.code.value for v in _stored(tr).values()):
        assert len(tr.wait_reasons(moved, _stored(tr), refresh=4)) <= 4
        calls += 1
        assert calls <= 10, "stored reasons never caught up with the policy's"
    assert all(v == (HEAD.code.value, HEAD.message, False) for v in _stored(tr).values())


def test_without_a_budget_every_change_is_written(store: Store) -> None:
    ids = _queued(store, 30)
    tr = Transitions(store)
    tr.wait_reasons([Wait(JobId(j), FREE) for j in ids], _stored(tr))
    assert len(tr.wait_reasons([Wait(JobId(j), HEAD) for j in ids], _stored(tr))) == 30
    assert {v[0] for v in _stored(tr).values()} == {HEAD.code.value}


def test_reasons_are_committed_unsynced_and_the_connection_gets_its_setting_back(store: Store) -> None:
    """Wait reasons, which the loop writes again anyway, commit without waiting for the disk; the
    pooled connection is left as it was for the transactions that must be synced."""
    ids = _queued(store, 3)
    tr = Transitions(store)
    sqlite = store.engine.dialect.name == "sqlite"
    setting = "PRAGMA synchronous" if sqlite else "SHOW synchronous_commit"
    with store.engine.connect() as conn:
        before = conn.exec_driver_sql(setting).scalar()
    seen: list[object] = []
    real = store.tx_unsynced

    @contextmanager
    def watched() -> Iterator[Connection]:
        with real() as conn:
            seen.append(conn.exec_driver_sql(setting).scalar())
            yield conn

    store.tx_unsynced = watched  # type: ignore[method-assign]
    assert len(tr.wait_reasons([Wait(JobId(j), FREE) for j in ids], _stored(tr))) == 3
    assert seen == [1 if sqlite else "off"]  # NORMAL: a WAL commit without fsync
    assert all(v[0] == FREE.code.value for v in _stored(tr).values())  # committed
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql(setting).scalar() == before
    if sqlite:  # (the test PostgreSQL server runs with synchronous_commit off throughout)
        assert before == 2  # FULL: everything else is synced
