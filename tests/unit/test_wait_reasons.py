"""How the loop stores why queued jobs wait: bounded writes that still catch up.

A job's first reason and every head-of-line flip are written at once (the policy reads the flag
back next cycle); other changes (a new code, or a new wording of the same code) are written at most
``refresh`` per call, half to the front of the queue and half in turn over the rest, so that every
stored reason equals the policy's within a few calls.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event

from tpufleet.control.store.facade import Store
from tpufleet.control.store.loopwrites import Stored, Transitions
from tpufleet.control.store.values import JobRequest
from tpufleet.scheduler.model import (
    JobId,
    JobState,
    JobView,
    NotFit,
    NotFitCode,
    TenantName,
    Wait,
    Waits,
    expand,
)

FREE = NotFit(NotFitCode.WAITING_FOR_FREE_SLICES, "no free v4-16 slice")
HEAD = NotFit(NotFitCode.RESERVED_FOR_HEAD_OF_LINE, "reserved for the head of line")


def _queued(store: Store, n: int) -> list[str]:
    store.tenants.create("a", {"v4": 64})
    return [
        store.jobs.submit("a", JobRequest.build(command=["true"], accelerator_type="v4-16")).id
        for _ in range(n)
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

    def watch(conn: object, cursor: Any, statement: str, *args: object) -> None:
        """The setting of the connection at the moment it writes a reason, asked on that connection."""
        if statement.startswith("UPDATE jobs SET reason_code"):
            probe = cursor.connection.cursor()
            probe.execute(setting)
            seen.append(probe.fetchone()[0])
            probe.close()

    event.listen(store.engine, "before_cursor_execute", watch)
    assert len(tr.wait_reasons([Wait(JobId(j), FREE) for j in ids], _stored(tr))) == 3
    event.remove(store.engine, "before_cursor_execute", watch)
    assert seen == [1 if sqlite else "off"]  # NORMAL: a WAL commit without fsync
    assert all(v[0] == FREE.code.value for v in _stored(tr).values())  # committed
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql(setting).scalar() == before
    if sqlite:  # (the test PostgreSQL server runs with synchronous_commit off throughout)
        assert before == 2  # FULL: everything else is synced


def _one_by_one(
    decisions: list[object], stored: dict[str, Stored], refresh: int | None, turn: int
) -> tuple[list[tuple[str, Stored]], int]:
    """The rule above applied to one wait at a time: what ``wait_reasons`` must write, and the turn after."""
    changes: list[tuple[str, Stored]] = []
    codes: list[tuple[str, Stored]] = []
    wordings: list[tuple[str, Stored]] = []
    for w in decisions:
        if not isinstance(w, Wait):
            continue
        new = (w.reason.code.value, w.reason.message, w.head_of_line)
        old = stored.get(w.job)
        if old is None or old == new:
            continue
        if refresh is None or old[0] is None or old[2] != new[2]:
            changes.append((w.job, new))
        else:
            (codes if old[0] != new[0] else wordings).append((w.job, new))
    if refresh is not None:
        rest = codes + wordings
        front, rest = rest[: refresh // 2], rest[refresh // 2 :]
        changes += front
        if rest:
            start = turn % len(rest)
            changes += (rest[start:] + rest[:start])[: refresh - len(front)]
            turn += refresh - len(front)
    return changes, turn


def test_runs_of_waits_are_written_as_one_wait_at_a_time_would_be(store: Store) -> None:
    """Seeded workloads of the shapes a cycle gives: long runs of waits sharing one reason, jobs
    whose stored reasons differ within a run (first reasons, flips, new codes, new wordings, equal
    tuples that are not the same object), jobs the store does not hold, admissions in between,
    and budgets from none to more than the queue; as one ``Wait`` per job, or (as the loop gets
    them from ``decide_runs``) with stretches of them as ``Waits`` runs."""
    import random

    from tpufleet.scheduler.model import Admit, SliceName

    rng = random.Random(9)
    reasons = [
        NotFit(NotFitCode.WAITING_FOR_FREE_SLICES, f"needs 1 v4-16 slice, {n} free") for n in range(3)
    ] + [HEAD, NotFit(NotFitCode.QUOTA_EXCEEDED_NO_BORROWING, "beyond its quota")]
    tr = Transitions(store)
    turn = 0
    for _ in range(300):
        size = rng.randint(0, 60)
        ids = [f"j{i}" for i in range(size)]
        stored: dict[str, Stored] = {}
        for j in ids:
            if rng.random() < 0.1:
                continue  # not a queued job of the store's view
            pick = rng.random()
            if pick < 0.15:
                stored[j] = (None, None, False)
            else:
                reason = rng.choice(reasons)
                stored[j] = (reason.code.value, reason.message, rng.random() < 0.1)
                if pick < 0.3:
                    stored[j] = tuple(list(stored[j]))  # type: ignore[assignment]  # equal, not the same
        decisions: list[object] = []
        reason, head = rng.choice(reasons), False
        for j in ids:
            if rng.random() < 0.2:
                reason, head = rng.choice(reasons), rng.random() < 0.1
            if rng.random() < 0.05:
                decisions.append(Admit(JobId(f"a{j}"), (SliceName("tpu-v4-16-0"),), False))
            decisions.append(Wait(JobId(j), reason, head_of_line=head))
        refresh = rng.choice([None, 0, 1, 2, 3, 7, 100])
        want, next_turn = _one_by_one(decisions, stored, refresh, turn)
        given = _as_runs(decisions, rng) if rng.random() < 0.7 else decisions
        assert expand(given) == decisions  # type: ignore[arg-type]
        got = tr.wait_reasons(given, stored, refresh=refresh)  # type: ignore[arg-type]
        assert [(j, tuple(v)) for j, v in got] == want, (refresh, turn)
        assert tr._wording_turn == next_turn
        turn = next_turn


def _as_runs(decisions: list[object], rng: object) -> list[object]:
    """The same decisions with random stretches of consecutive waits for one reason (none of them
    the head of line) as one ``Waits`` run each."""
    out: list[object] = []
    for d in decisions:
        last = out[-1] if out else None
        joins = (
            isinstance(d, Wait)
            and not d.head_of_line
            and rng.random() < 0.8  # type: ignore[attr-defined]
            and (
                (isinstance(last, Waits) and last.reason is d.reason)
                or (isinstance(last, Wait) and not last.head_of_line and last.reason is d.reason)
            )
        )
        if not joins:
            out.append(d)
            continue
        assert isinstance(d, Wait)
        before = last.jobs if isinstance(last, Waits) else (_view(last.job),)  # type: ignore[union-attr]
        out[-1] = Waits((*before, _view(d.job)), d.reason)
    return out


def _view(job_id: str) -> JobView:
    return JobView(JobId(job_id), TenantName("a"), "v4-16", 1, 0, 0, JobState.QUEUED)
