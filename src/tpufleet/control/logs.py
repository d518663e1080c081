"""Job output in the store: one stream per (job, attempt, host), kept after the job ends.

The loop copies what ``ClusterClient.read_logs`` returns into ``log_chunks`` and remembers, per
host, how far it read the cluster's stream (``cluster_offset``, the executor's unit) and how many
characters the store holds (``stored``). Readers use character offsets into the stored stream, so
``tpufleet logs --follow`` asks for "everything after offset N" of one host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tpufleet.control import records as r
from tpufleet.control.schema import JobRow, LogChunkRow, LogCursorRow
from tpufleet.errors import NotFoundError


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
    for host, (slice_name, worker) in enumerate(layout):
        if s.get(LogCursorRow, (job_id, attempt, host)) is None:
            s.add(
                LogCursorRow(
                    job_id=job_id,
                    attempt=attempt,
                    host=host,
                    slice=slice_name,
                    worker_id=worker,
                    cluster_offset=0,
                    stored=0,
                    complete=False,
                )
            )


def cursors(s: Session, job_id: str, attempt: int) -> list[Cursor]:
    rows = s.scalars(
        select(LogCursorRow)
        .where(LogCursorRow.job_id == job_id, LogCursorRow.attempt == attempt)
        .order_by(LogCursorRow.host)
    )
    return [cursor_of(c) for c in rows]


def cursor_of(c: LogCursorRow) -> Cursor:
    return Cursor(c.host, c.slice, c.worker_id, c.cluster_offset, c.complete, bool(c.truncated))


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
    """Store a chunk of one host's output read from ``from_offset`` of the cluster's stream; a chunk
    that does not start where the store's copy ends (another reader stored it first) is ignored.
    Past ``cap`` characters the stream is cut, marked truncated and complete, and a last line says
    so. Returns the cursor as it is now."""
    c = s.get(LogCursorRow, (job_id, attempt, host), with_for_update=True)
    if c is None:
        return None
    if c.truncated or (from_offset is not None and c.cluster_offset != from_offset):
        return cursor_of(c)
    if cap is not None and c.stored + len(data) > cap:
        kept = max(0, cap - c.stored)
        data = data[:kept] + f"\n[tpufleet: output truncated at {cap} characters (the per-host log cap)]\n"
        c.truncated, complete = True, True
        c.note = f"truncated at {cap} characters: the per-host log cap (serve --max-log-mb)"
    if data:
        data = data.replace("\x00", "\ufffd")  # PostgreSQL text cannot hold NUL
        s.add(LogChunkRow(job_id=job_id, attempt=attempt, host=host, start=c.stored, data=data))
        c.stored += len(data)
    c.cluster_offset, c.complete = next_offset, complete
    return cursor_of(c)


def close(s: Session, job_id: str, attempt: int, host: int, note: str) -> None:
    """The attempt ended and this host's stream cannot be read to its end: complete, with why."""
    c = s.get(LogCursorRow, (job_id, attempt, host))
    if c is not None and not c.complete:
        c.complete, c.note = True, note


def read(s: Session, job: JobRow, *, attempt: int | None, host: int | None, offset: int) -> r.LogRead:
    """Stored output of an attempt (default: the latest that ran), per host, from ``offset``."""
    if attempt is not None and not 1 <= attempt <= job.attempt:
        raise NotFoundError(f"job {job.id} has attempts 1 to {job.attempt}, not {attempt}")
    if attempt is None:
        attempt = s.scalar(select(func.max(LogCursorRow.attempt)).where(LogCursorRow.job_id == job.id))
    streams = s.scalars(
        select(LogCursorRow)
        .where(LogCursorRow.job_id == job.id, LogCursorRow.attempt == (attempt or 0))
        .order_by(LogCursorRow.host)
    ).all()
    if host is not None:
        if streams and not 0 <= host < len(streams):
            raise NotFoundError(f"job {job.id} has hosts 0 to {len(streams) - 1}, not {host}")
        streams = [c for c in streams if c.host == host]
    hosts = tuple(_host_log(s, c, max(0, offset)) for c in streams)
    return r.LogRead(job_id=job.id, attempt=attempt or job.attempt, job_state=job.state, hosts=hosts)


def _host_log(s: Session, c: LogCursorRow, offset: int) -> r.HostLog:
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
    if chunks:
        data = data[max(0, offset - chunks[0].start) :]
    return r.HostLog(
        c.host,
        c.slice,
        c.worker_id,
        data,
        next_offset=max(offset, c.stored),
        complete=c.complete,
        truncated=bool(c.truncated),
        note=c.note,
    )
