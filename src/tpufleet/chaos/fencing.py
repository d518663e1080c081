"""At most one leader acted at any time, checked from the store's own records (``tpufleet chaos
--replicas``, docs/reliability.md).

Every transaction of a leader's loop passes the fence and stamps what it writes with its term's
fencing token and the database's clock at the check (``Store.fenced``, ``events.term`` and
``fenced_at``, ``attempts.launch_term`` and ``end_term``); a term's first stamped write is its
``... leads`` event, stamped once the lease was taken. A write of term T passed the fence while the
lease still had token T, and a takeover waits for it to commit, so if only one leader acted at a
time:

- the terms' spans do not overlap: every write of a term is stamped before the first write (the
  beginning) of every later term, by the database's clock;
- in commit order (the events' ids, drawn inside each transaction) no write of a term comes after
  a write of a later term;
- no attempt was ended by a term older than the one that launched it.

:func:`overlapping_leaders` checks these on records (pure); :func:`read_records` reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Write:
    """One stamped event: its id (commit order), its term and the database's clock at its fence."""

    id: int
    term: int
    at: float
    what: str = ""


@dataclass(frozen=True)
class AttemptTerms:
    job_id: str
    attempt: int
    launch_term: int | None
    end_term: int | None


def overlapping_leaders(
    writes: Sequence[Write], attempts: Sequence[AttemptTerms] = ()
) -> list[dict[str, Any]]:
    """What shows two leaders acting at one time; [] when nothing does (see the module docstring)."""
    found: list[dict[str, Any]] = []
    spans: dict[int, tuple[Write, Write]] = {}
    for w in writes:
        first, last = spans.get(w.term, (w, w))
        spans[w.term] = (min(first, w, key=_at), max(last, w, key=_at))
    terms = sorted(spans)
    for i, term in enumerate(terms):  # every later term began after this term's last write
        last = spans[term][1]
        for later in terms[i + 1 :]:
            began = spans[later][0]
            if last.at >= began.at:
                found.append(
                    {
                        "term": term,
                        "later_term": later,
                        "why": f"term {term} wrote event {last.id} ({last.what}) at {last.at:.6f}, "
                        f"not before term {later} began at {began.at:.6f}",
                    }
                )
    newest: Write | None = None  # in commit order, the write of the newest term so far
    for w in sorted(writes, key=lambda x: x.id):
        if newest is not None and w.term < newest.term:
            found.append(
                {
                    "term": w.term,
                    "later_term": newest.term,
                    "why": f"event {w.id} of term {w.term} committed after event {newest.id} of term "
                    f"{newest.term}",
                }
            )
        if newest is None or w.term > newest.term:
            newest = w
    for a in attempts:
        if a.launch_term is not None and a.end_term is not None and a.end_term < a.launch_term:
            found.append(
                {
                    "term": a.end_term,
                    "later_term": a.launch_term,
                    "why": f"job {a.job_id} attempt {a.attempt} launched by term {a.launch_term} "
                    f"was ended by the older term {a.end_term}",
                }
            )
    return found


def _at(w: Write) -> tuple[float, int]:
    return (w.at, w.id)


def read_records(db_url: str, after_event: int = 0) -> tuple[list[Write], list[AttemptTerms]]:
    """The stamped events after event id ``after_event``, and every attempt with a stamped term."""
    from tpufleet.control.store import stamps
    from tpufleet.control.store.facade import Store

    store = Store(db_url)
    try:
        events = stamps.stamped_events(store, after_event)
        attempts = stamps.stamped_attempts(store)
    finally:
        store.close()
    return [Write(*e) for e in events], [AttemptTerms(*a) for a in attempts]


def last_event(db_url: str) -> int:
    """The newest event's id (0: none): a soak on a database used before checks only its own. An
    empty database gets its schema first (as ``serve`` would give it)."""
    from tpufleet.control.store import stamps
    from tpufleet.control.store.facade import Store

    store = Store.open(db_url)
    try:
        return stamps.last_event(store)
    finally:
        store.close()


def refused_writes(db_url: str, after_event: int = 0) -> int:
    """The loop transactions the fence refused, as the deposed leaders' audit events said
    (``... stopped leading (fencing token N); writes refused: K``, K counted over the replica's
    life: the last one of each replica)."""
    from tpufleet.control.store import stamps
    from tpufleet.control.store.facade import Store

    store = Store(db_url)
    try:
        said = stamps.leader_events(store, after_event)
    finally:
        store.close()
    marker = "; writes refused: "
    last: dict[str, int] = {}
    for actor, message in said:
        count = message.rsplit(marker, 1)[1] if marker in message else ""
        if count.isdigit():
            last[actor or ""] = max(last.get(actor or "", 0), int(count))
    return sum(last.values())


def judge(db_url: str, after_event: int) -> dict[str, Any]:
    """The soak's leader verdict: ``overlapping_leaders`` (what :func:`overlapping_leaders` found;
    also when no write carried a token: the check would prove nothing), ``terms`` (how many terms
    wrote), ``stamped_writes`` and ``refused_writes`` (:func:`refused_writes`: a deposed leader
    tried, and the fence stopped it)."""
    writes, attempts = read_records(db_url, after_event)
    found = overlapping_leaders(writes, attempts)
    if not writes:
        found.append({"term": None, "later_term": None, "why": "no write carried a fencing token"})
    return {
        "overlapping_leaders": found,
        "terms": len({w.term for w in writes}),
        "stamped_writes": len(writes),
        "refused_writes": refused_writes(db_url, after_event),
    }
