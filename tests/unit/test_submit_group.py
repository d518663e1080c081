"""Group commit of concurrent submits (``JobStore.submit``, issue 30): the submits that arrive while
another's transaction is under way are committed together in the next one, each checked as if
alone and answered on its own, on SQLite and PostgreSQL (the ``db_url`` fixture).

To make a group for certain, the first submit's transaction is held open at its insert (through
SQLAlchemy's ``before_cursor_execute`` event, which blocks until the test lets it go) while the
others arrive; the engine's ``commit`` event counts the transactions."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import event

from tpufleet.control.store.database import FenceStamp
from tpufleet.control.store.facade import Store
from tpufleet.control.store.values import JobRecord, JobRequest
from tpufleet.errors import ConflictError, NotFoundError

FOLLOWERS = 6


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store.open(db_url)  # random ids: safe to draw from many threads
    s.tenants.create("team-a", {})
    s.tenants.create("team-b", {})
    yield s
    s.close()


def req(step: int = 0) -> JobRequest:
    return JobRequest.build(command=("python", "t.py", f"--step={step}"), accelerator_type="v4-16")


class Held:
    """The first ``INSERT INTO jobs`` waits until ``release()``; commits are counted."""

    def __init__(self, store: Store) -> None:
        self.engine = store.engine
        self.inserting = threading.Event()
        self.go = threading.Event()
        self.commits = 0
        event.listen(self.engine, "before_cursor_execute", self._insert)
        event.listen(self.engine, "commit", self._commit)

    def _insert(self, conn: Any, cursor: Any, statement: str, *args: object) -> None:
        if statement.startswith("INSERT INTO jobs") and not self.inserting.is_set():
            self.inserting.set()
            assert self.go.wait(30), "the test never let the first submit go"

    def _commit(self, conn: Any) -> None:
        self.commits += 1

    def release(self) -> None:
        self.go.set()

    def remove(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._insert)
        event.remove(self.engine, "commit", self._commit)


def submit_together(
    store: Store, first: Callable[[], JobRecord], others: list[Callable[[], JobRecord]]
) -> tuple[list[JobRecord | BaseException], int]:
    """``first`` held at its insert while ``others`` join the group behind it; their answers in
    order (a record or the error raised), and the transactions committed for all of them."""
    held = Held(store)
    answers: list[JobRecord | BaseException] = [ConflictError("no answer")] * (1 + len(others))

    def run(i: int, call: Callable[[], JobRecord]) -> None:
        try:
            answers[i] = call()
        except BaseException as err:
            answers[i] = err

    try:
        threads = [threading.Thread(target=run, args=(0, first))]
        threads[0].start()
        assert held.inserting.wait(30)
        for i, call in enumerate(others, start=1):
            threads.append(threading.Thread(target=run, args=(i, call)))
            threads[-1].start()
        deadline = time.monotonic() + 30
        while waiting(store) < len(others):  # every other one queued behind the held transaction
            assert time.monotonic() < deadline, waiting(store)
            time.sleep(0.01)
        before = held.commits
        held.release()
        for t in threads:
            t.join(30)
        return answers, held.commits - before
    finally:
        held.go.set()
        held.remove()


def waiting(store: Store) -> int:
    group: Any = store.jobs._group
    with group._lock:
        return len(group._waiting)


def test_submits_that_arrive_during_a_commit_are_committed_together_each_answered(store: Store) -> None:
    tenants = ["team-b" if i % 2 else "team-a" for i in range(FOLLOWERS)]
    others = [lambda i=i: store.jobs.submit(tenants[i], req(i)) for i in range(FOLLOWERS)]
    answers, commits = submit_together(store, lambda: store.jobs.submit("team-a", req(99)), others)
    assert commits == 2  # the held one, then every one that arrived meanwhile in one transaction
    records = [a for a in answers if isinstance(a, JobRecord)]
    assert len(records) == 1 + FOLLOWERS and len({r.id for r in records}) == 1 + FOLLOWERS
    assert [r.tenant for r in records[1:]] == tenants
    assert [r.command[-1] for r in records] == ["--step=99", *(f"--step={i}" for i in range(FOLLOWERS))]
    stored = {j.id: j for j in store.jobs.all()}
    assert all(stored[r.id].state == "QUEUED" and stored[r.id].tenant == r.tenant for r in records)
    submitted = [e["job_id"] for e in store.events() if e["kind"] == "submit"]
    assert sorted(submitted) == sorted(r.id for r in records)  # each with its event


def test_a_submit_refused_in_a_group_writes_nothing_and_the_others_are_queued(store: Store) -> None:
    """The cap counts the group's earlier submits of the same tenant; an unknown or deleted
    tenant is that submit's own error."""
    store.limits = replace(store.limits, max_queued_per_tenant=3)
    store.jobs.submit("team-a", req())  # 1 of 3 queued
    store.tenants.create("gone", {})
    store.tenants.delete("gone")
    others: list[Callable[[], JobRecord]] = [
        lambda: store.jobs.submit("team-a", req(1)),  # 3 of 3
        lambda: store.jobs.submit("team-a", req(2)),  # over the cap
        lambda: store.jobs.submit("nobody", req(3)),
        lambda: store.jobs.submit("gone", req(4)),
        lambda: store.jobs.submit("team-b", req(5)),
    ]
    answers, commits = submit_together(store, lambda: store.jobs.submit("team-a", req(0)), others)
    assert commits == 2
    ok0, ok1, capped, nobody, gone, ok5 = answers
    assert isinstance(capped, ConflictError) and "cap (serve --max-queued-per-tenant 3)" in str(capped)
    assert isinstance(nobody, NotFoundError) and "nobody" in str(nobody)
    assert isinstance(gone, ConflictError) and "was deleted" in str(gone)
    assert all(isinstance(a, JobRecord) for a in (ok0, ok1, ok5)), answers
    queued = sorted(j.command[-1] for j in store.jobs.all(states=("QUEUED",)))
    assert queued == ["--step=0", "--step=0", "--step=1", "--step=5"]


def test_a_group_locks_its_tenants_once_each_in_one_order(store: Store) -> None:
    """As a batch does: sorted, so two groups (two replicas serving submits) never wait for each
    other's tenants, and once each, however many of the group's submits are a tenant's: one
    statement a group locks all of its tenants."""
    locked: list[list[str]] = []

    def watch(conn: Any, cursor: Any, statement: str, parameters: Any, *args: object) -> None:
        if statement.startswith("SELECT tenants.name, tenants.deleted_at"):
            values = parameters.values() if isinstance(parameters, dict) else parameters
            locked.append([v for v in values if isinstance(v, str)])

    event.listen(store.engine, "before_cursor_execute", watch)
    try:
        others = [lambda t=t: store.jobs.submit(t, req()) for t in ("team-b", "team-a", "team-b")]
        answers, commits = submit_together(store, lambda: store.jobs.submit("team-a", req()), others)
    finally:
        event.remove(store.engine, "before_cursor_execute", watch)
    assert commits == 2 and all(isinstance(a, JobRecord) for a in answers), answers
    assert locked == [["team-a"], ["team-a", "team-b"]]  # the held submit's, then the group's


def test_a_failed_group_transaction_is_every_submits_error_and_the_next_group_runs(store: Store) -> None:
    """The transaction's own failure (here: a deposed leader's fence, the first thing a
    transaction of a fenced store does) is each member's error, nothing of the group is stored,
    and the next submit leads a group of its own as before."""

    class Deposed(Exception):
        pass

    entered, go, leading = threading.Event(), threading.Event(), threading.Event()

    def fence(_conn: Any) -> FenceStamp:
        if leading.is_set():
            return FenceStamp(term=2, at=1.0)
        if not entered.is_set():  # the first transaction waits here while the others queue
            entered.set()
            assert go.wait(30)
        raise Deposed("another replica leads")

    fenced = store.fenced(fence)
    answers: list[object] = [None] * 4

    def run(i: int) -> None:
        try:
            answers[i] = fenced.jobs.submit("team-a", req(i))
        except BaseException as err:
            answers[i] = err

    threads = [threading.Thread(target=run, args=(0,))]
    threads[0].start()
    assert entered.wait(30)
    threads += [threading.Thread(target=run, args=(i,)) for i in range(1, 4)]
    for t in threads[1:]:
        t.start()
    deadline = time.monotonic() + 30
    while waiting(fenced) < 3:
        assert time.monotonic() < deadline, waiting(fenced)
        time.sleep(0.01)
    go.set()
    for t in threads:
        t.join(30)
    assert all(isinstance(a, Deposed) for a in answers), answers
    assert store.jobs.all() == []
    leading.set()
    assert fenced.jobs.submit("team-a", req(7)).state == "QUEUED"  # the group is free again
    assert [j.command[-1] for j in store.jobs.all()] == ["--step=7"]
