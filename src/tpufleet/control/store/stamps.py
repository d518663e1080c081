"""Reading back the fencing stamps of the loop's writes (``Store.fenced``): what ``tpufleet chaos
--replicas`` judges (``chaos/fencing.py``). Reads only."""

from __future__ import annotations

from sqlalchemy import func, select

from tpufleet.control.store.database import Database
from tpufleet.control.store.tables import AttemptRow, EventRow

__all__ = ["last_event", "leader_events", "stamped_attempts", "stamped_events"]


def last_event(store: Database) -> int:
    """The newest event's id (0: none)."""
    with store.tx() as s:
        return int(s.scalar(select(func.max(EventRow.id))) or 0)


def stamped_events(store: Database, after: int = 0) -> list[tuple[int, int, float, str]]:
    """``(id, term, fenced_at, kind)`` of every event after id ``after`` that carries a term."""
    query = select(EventRow.id, EventRow.term, EventRow.fenced_at, EventRow.kind).where(
        EventRow.id > after, EventRow.term.is_not(None), EventRow.fenced_at.is_not(None)
    )
    with store.tx() as s:
        rows = s.execute(query).all()
    return [(int(i), int(t), float(at), str(k)) for i, t, at, k in rows if t is not None and at is not None]


def stamped_attempts(store: Database) -> list[tuple[str, int, int | None, int | None]]:
    """``(job id, attempt, launch_term, end_term)`` of every attempt with a term on it."""
    query = select(AttemptRow.job_id, AttemptRow.attempt, AttemptRow.launch_term, AttemptRow.end_term).where(
        AttemptRow.launch_term.is_not(None) | AttemptRow.end_term.is_not(None)
    )
    with store.tx() as s:
        return [(str(j), int(n), lt, et) for j, n, lt, et in s.execute(query)]


def leader_events(store: Database, after: int = 0) -> list[tuple[str | None, str]]:
    """``(actor, message)`` of the leader changes (kind ``leader``) after event id ``after``."""
    query = select(EventRow.actor, EventRow.message).where(EventRow.id > after, EventRow.kind == "leader")
    with store.tx() as s:
        return [(a, str(m)) for a, m in s.execute(query.order_by(EventRow.id))]
