"""The per-tenant queued cap under concurrent submits (issue 34, part 6): many submitters at once, on
SQLite and PostgreSQL (the ``db_url`` fixture), and exactly the cap gets queued, never one more.

The check (count the tenant's queued jobs) and the insert are one atomic step: PostgreSQL locks the
tenant's row for the submit's transaction, SQLite takes the write lock before counting
(``BEGIN IMMEDIATE``). Every submitter waits at a barrier, so they all count at about the same time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from tpufleet.control.store.facade import Store
from tpufleet.control.store.values import JobRequest
from tpufleet.errors import ConflictError

CAP = 3
SUBMITTERS = 12
ROUNDS = 3


@pytest.fixture
def capped(db_url: str) -> Iterator[Store]:
    store = Store.open(db_url)  # the default ids: random, safe to draw from many threads
    store.limits = replace(store.limits, max_queued_per_tenant=CAP)
    store.tenants.create("team-a", {})
    store.tenants.create("team-b", {})
    yield store
    store.close()


def req() -> JobRequest:
    return JobRequest.build(command=("python", "t.py"), accelerator_type="v4-16")


def race(submit: Callable[[], object]) -> tuple[int, int, list[BaseException]]:
    """``SUBMITTERS`` threads call ``submit`` together; returns (accepted, refused, other errors)."""
    gate = threading.Barrier(SUBMITTERS)
    lock = threading.Lock()
    outcome = {"ok": 0, "refused": 0}
    errors: list[BaseException] = []

    def one() -> None:
        gate.wait()
        try:
            submit()
            key = "ok"
        except BaseException as err:
            if not (isinstance(err, ConflictError) and "cap (serve --max-queued-per-tenant" in str(err)):
                with lock:
                    errors.append(err)  # reported by the test, not lost in the thread
                return
            key = "refused"
        with lock:
            outcome[key] += 1

    threads = [threading.Thread(target=one) for _ in range(SUBMITTERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcome["ok"], outcome["refused"], errors


def queued(store: Store, tenant: str) -> int:
    return len(store.jobs.all(tenant=tenant, states=("QUEUED",)))


def cancel_all(store: Store, tenant: str) -> None:
    for job in store.jobs.all(tenant=tenant, states=("QUEUED",)):
        store.jobs.request_cancel(job.id)


def test_parallel_submits_at_the_cap_queue_exactly_the_cap(capped: Store) -> None:
    for _ in range(ROUNDS):  # each round starts from an empty queue
        ok, refused, errors = race(lambda: capped.jobs.submit("team-a", req()))
        assert errors == []
        assert (ok, refused) == (CAP, SUBMITTERS - CAP)
        assert queued(capped, "team-a") == CAP
        cancel_all(capped, "team-a")


def test_parallel_batches_of_two_tenants_stay_under_each_cap(capped: Store) -> None:
    """Batches naming both tenants, in both orders: the cap holds for each, and no two batches lock
    each other out (PostgreSQL would abort one of a deadlocked pair with an error)."""
    turn = iter(range(SUBMITTERS))
    pick = threading.Lock()

    def submit() -> object:
        with pick:
            n = next(turn)
        owners = ["team-a", "team-b"] if n % 2 else ["team-b", "team-a"]
        return capped.jobs.submit_many(owners, [req(), req()])

    ok, refused, errors = race(submit)
    assert errors == []
    assert (ok, refused) == (CAP, SUBMITTERS - CAP)
    assert (queued(capped, "team-a"), queued(capped, "team-b")) == (CAP, CAP)
