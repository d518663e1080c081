"""Job output in the store: one stream per (job, attempt, host), kept after the job ends.

The loop copies what ``ClusterClient.read_logs`` returns into ``log_chunks`` and remembers, per
host, how far it read the cluster's stream (``cluster_offset``, the executor's unit) and how many
characters the store holds (``stored``). Readers use character offsets into the stored stream, so
``tpufleet logs --follow`` asks for "everything after offset N" of one host.

The API streams a read (:func:`plan`, then :func:`stored_text` per host): the answer's hosts and
their ``next_offset`` are fixed first, then the stored text up to there is read ``PIECE_CHARS``
characters per query (:func:`pieces`), each in its own short transaction, so a 64 MiB log never
sits in memory whole (four readers of one held ~516 MiB when it was read into one string).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, cast

from sqlalchemy import Connection, Table, bindparam, func, insert, select, update
from sqlalchemy.orm import Session

from tpufleet.control.store import values as r
from tpufleet.control.store.tables import JobRow, LogChunkRow, LogCursorRow
from tpufleet.errors import NotFoundError

_CURSORS = cast(Table, LogCursorRow.__table__)
_A_STREAM = (  # one stream of an executemany's row: b_job, b_attempt, b_host
    _CURSORS.c.job_id == bindparam("b_job"),
    _CURSORS.c.attempt == bindparam("b_attempt"),
    _CURSORS.c.host == bindparam("b_host"),
)
_MOVED = ("cluster_offset", "stored", "complete", "truncated", "note")  # what a stored piece changes
PIECE_CHARS = 256 * 1024  # characters of a stored log read per query while a read streams


@dataclass(frozen=True)
class Cursor:
    host: int
    slice: str
    worker_id: int
    offset: int  # in the cluster's stream
    complete: bool
    truncated: bool = False


def open_streams(s: Session, job_id: str, attempt: int, layout: Sequence[tuple[str, int]]) -> None:
    """One stream per host of the attempt; ``layout`` is (slice, worker id) in host order."""
    open_streams_of(s.connection(), [(job_id, attempt, layout)])


def open_streams_of(conn: Connection, attempts: Sequence[tuple[str, int, Sequence[tuple[str, int]]]]) -> None:
    """:func:`open_streams` for many attempts ``(job id, attempt, layout)``: one query for the
    streams already open, one statement for the rest."""
    jobs = {job_id for job_id, _, _ in attempts}
    query = select(LogCursorRow.job_id, LogCursorRow.attempt, LogCursorRow.host)
    have = {(j, a, h) for j, a, h in conn.execute(query.where(LogCursorRow.job_id.in_(jobs)))}
    rows = [
        {
            "job_id": job_id,
            "attempt": attempt,
            "host": host,
            "slice": slice_name,
            "worker_id": worker,
            "cluster_offset": 0,
            "stored": 0,
            "complete": False,
            "truncated": False,
            "note": None,
        }
        for job_id, attempt, layout in attempts
        for host, (slice_name, worker) in enumerate(layout)
        if (job_id, attempt, host) not in have
    ]
    if rows:
        conn.execute(insert(LogCursorRow), rows)


def cursors(s: Session, job_id: str, attempt: int) -> list[Cursor]:
    rows = s.connection().execute(
        select(*_CURSORS.c)
        .where(_CURSORS.c.job_id == job_id, _CURSORS.c.attempt == attempt)
        .order_by(_CURSORS.c.host)
    )
    return [cursor_of(c) for c in rows]


def cursor_of(c: Any) -> Cursor:
    """A stream's cursor from its row (an ORM object or a row of its columns)."""
    return Cursor(c.host, c.slice, c.worker_id, c.cluster_offset, c.complete, bool(c.truncated))


@dataclass(frozen=True)
class HostOutput:
    """A chunk of one host's output as read from the cluster: ``data``, read from ``from_offset``
    of the cluster's stream (None: wherever the store's copy ends) up to ``next_offset``;
    ``complete``: the process has ended and this is the last of it."""

    job_id: str
    attempt: int
    host: int
    data: str
    next_offset: int
    complete: bool
    from_offset: int | None = None


def append(
    s: Session,
    job_id: str,
    attempt: int,
    host: int,
    data: str,
    next_offset: int,
    complete: bool,
    cap: int | None = None,
    from_offset: int | None = None,
) -> Cursor | None:
    """Store a chunk of one host's output (:func:`append_many` of one)."""
    return append_many(
        s.connection(), [HostOutput(job_id, attempt, host, data, next_offset, complete, from_offset)], cap
    )[0]


def append_many(
    conn: Connection, outputs: Sequence[HostOutput], cap: int | None = None
) -> list[Cursor | None]:
    """Store hosts' output read from the cluster, in order, with one statement per table. An output that does
    not start where the store's copy ends (another reader stored it first) is ignored. Past ``cap``
    characters a stream is cut, marked truncated and complete, and a last line says so. Returns
    each output's cursor as it is after it (None: no such stream)."""
    if not outputs:
        return []
    keys = {(p.job_id, p.attempt, p.host) for p in outputs}
    rows: dict[tuple[str, int, int], dict[str, Any]] = {}
    ids = sorted({p.job_id for p in outputs})
    for at in range(0, len(ids), 500):
        query = select(*_CURSORS.c).where(_CURSORS.c.job_id.in_(ids[at : at + 500])).with_for_update()
        for row in conn.execute(query):
            if (row.job_id, row.attempt, row.host) in keys:
                rows[(row.job_id, row.attempt, row.host)] = dict(row._mapping)
    chunks: list[dict[str, Any]] = []
    touched: dict[tuple[str, int, int], dict[str, Any]] = {}
    out: list[Cursor | None] = []
    for p in outputs:
        key = (p.job_id, p.attempt, p.host)
        c = rows.get(key)
        if c is None:
            out.append(None)
            continue
        if c["truncated"] or (p.from_offset is not None and c["cluster_offset"] != p.from_offset):
            out.append(_cursor(c))
            continue
        data, complete = p.data, p.complete
        if cap is not None and c["stored"] + len(data) > cap:
            kept = max(0, cap - c["stored"])
            data = (
                data[:kept] + f"\n[tpufleet: output truncated at {cap} characters (the per-host log cap)]\n"
            )
            c["truncated"], complete = True, True
            c["note"] = f"truncated at {cap} characters: the per-host log cap (serve --max-log-mb)"
        if data:
            data = data.replace("\x00", "\ufffd")  # PostgreSQL text cannot hold NUL
            chunks.append(
                {"job_id": p.job_id, "attempt": p.attempt, "host": p.host, "start": c["stored"], "data": data}
            )
            c["stored"] += len(data)
        c["cluster_offset"], c["complete"] = p.next_offset, complete
        touched[key] = c
        out.append(_cursor(c))
    if chunks:
        conn.execute(insert(LogChunkRow), chunks)
    if touched:
        conn.execute(
            update(_CURSORS).where(*_A_STREAM).values({k: bindparam(k) for k in _MOVED}),
            [
                {"b_job": j, "b_attempt": a, "b_host": h, **{k: c[k] for k in _MOVED}}
                for (j, a, h), c in touched.items()
            ],
        )
    return out


def _cursor(c: dict[str, Any]) -> Cursor:
    return Cursor(
        c["host"], c["slice"], c["worker_id"], c["cluster_offset"], c["complete"], bool(c["truncated"])
    )


def close(s: Session, job_id: str, attempt: int, host: int, note: str) -> None:
    """The attempt ended and this host's stream cannot be read to its end: complete, with why."""
    close_many(s.connection(), [(job_id, attempt, host, note)])


def close_many(conn: Connection, notes: Sequence[tuple[str, int, int, str]]) -> None:
    """:func:`close` for many streams ``(job id, attempt, host, note)``, one statement."""
    if not notes:
        return
    conn.execute(
        update(_CURSORS)
        .where(*_A_STREAM, _CURSORS.c.complete.is_(False))
        .values(complete=True, note=bindparam("note")),
        [{"b_job": j, "b_attempt": a, "b_host": h, "note": note} for j, a, h, note in notes],
    )


@dataclass(frozen=True)
class Span:
    """The stored characters ``start`` to ``end`` of one host's stream: what a streamed read sends."""

    job_id: str
    attempt: int
    host: int
    start: int
    end: int


def plan(
    s: Session, job: JobRow, *, attempt: int | None, host: int | None, offset: int
) -> tuple[r.LogRead, tuple[Span, ...]]:
    """A read as :func:`read` answers it but with every host's ``data`` empty, and the span of
    stored text each host's ``data`` is (read it with :func:`pieces`)."""
    attempt, streams = _streams(s, job, attempt, host)
    start = max(0, offset)
    spans = tuple(Span(c.job_id, c.attempt, c.host, start, max(start, c.stored)) for c in streams)
    hosts = tuple(_host_log(s, c, start, with_data=False) for c in streams)
    return r.LogRead(job_id=job.id, attempt=attempt or job.attempt, job_state=job.state, hosts=hosts), spans


def pieces(
    tx: Callable[[], AbstractContextManager[Session]], span: Span, size: int = PIECE_CHARS
) -> Iterator[str]:
    """The stored text of ``span``, at most ``size`` characters per query (one transaction each)."""
    pos = span.start
    while pos < span.end:
        want = min(size, span.end - pos)
        with tx() as s:
            got = s.execute(
                select(func.substr(LogChunkRow.data, pos - LogChunkRow.start + 1, want))
                .where(
                    LogChunkRow.job_id == span.job_id,
                    LogChunkRow.attempt == span.attempt,
                    LogChunkRow.host == span.host,
                    LogChunkRow.start <= pos,
                )
                .order_by(LogChunkRow.start.desc())
                .limit(1)
            ).scalar()
        if not got:
            return  # a gap in the stored stream (never written so): nothing more to send
        yield got
        pos += len(got)


class Transactions(Protocol):
    """What :func:`stored_text` needs of the store: its transactions (``Store`` has them)."""

    def tx(self) -> AbstractContextManager[Session]: ...


def stored_text(store: Transactions, span: Span, size: int = PIECE_CHARS) -> Iterator[str]:
    """The stored text of ``span`` (from ``JobStore.plan_logs``) read from ``store`` by :func:`pieces`:
    ``size`` characters per query, each in a short transaction of its own, opened as it is read."""
    return pieces(store.tx, span, size)


def _streams(
    s: Session, job: JobRow, attempt: int | None, host: int | None
) -> tuple[int | None, list[LogCursorRow]]:
    """The attempt read (default: the latest that ran; None: none ran) and its streams (one host's)."""
    if attempt is not None and not 1 <= attempt <= job.attempt:
        raise NotFoundError(f"job {job.id} has attempts 1 to {job.attempt}, not {attempt}")
    if attempt is None:
        attempt = s.scalar(select(func.max(LogCursorRow.attempt)).where(LogCursorRow.job_id == job.id))
    streams = list(
        s.scalars(
            select(LogCursorRow)
            .where(LogCursorRow.job_id == job.id, LogCursorRow.attempt == (attempt or 0))
            .order_by(LogCursorRow.host)
        )
    )
    if host is not None:
        if streams and not 0 <= host < len(streams):
            raise NotFoundError(f"job {job.id} has hosts 0 to {len(streams) - 1}, not {host}")
        streams = [c for c in streams if c.host == host]
    return attempt, streams


def read(s: Session, job: JobRow, *, attempt: int | None, host: int | None, offset: int) -> r.LogRead:
    """Stored output of an attempt (default: the latest that ran), per host, from ``offset``."""
    attempt, streams = _streams(s, job, attempt, host)
    hosts = tuple(_host_log(s, c, max(0, offset)) for c in streams)
    return r.LogRead(job_id=job.id, attempt=attempt or job.attempt, job_state=job.state, hosts=hosts)


def _host_log(s: Session, c: LogCursorRow, offset: int, *, with_data: bool = True) -> r.HostLog:
    return r.HostLog(
        c.host,
        c.slice,
        c.worker_id,
        _stored(s, c, offset) if with_data else "",
        next_offset=max(offset, c.stored),
        complete=c.complete,
        truncated=bool(c.truncated),
        note=c.note,
    )


def _stored(s: Session, c: LogCursorRow, offset: int) -> str:
    chunks = s.execute(
        select(LogChunkRow.start, LogChunkRow.data)
        .where(
            LogChunkRow.job_id == c.job_id,
            LogChunkRow.attempt == c.attempt,
            LogChunkRow.host == c.host,
            LogChunkRow.start + func.length(LogChunkRow.data) > offset,
        )
        .order_by(LogChunkRow.start)
    ).all()
    data = "".join(chunk.data for chunk in chunks)
    return data[max(0, offset - chunks[0].start) :] if chunks else data
