"""``GET /api/v1/jobs/{id}/logs`` as a stream: the JSON of ``LogRead.to_dict()``, written as it is read.

The answer is the same document as ever (``{"job_id", "attempt", "job_state", "hosts": [{"host",
"slice", "worker_id", "data", "next_offset", "complete", "truncated", "note"}]}``), so every
client reads it as before; only ``data`` is written a piece at a time (``control/store/logs.py``,
:func:`~tpufleet.control.store.logs.stored_text`), each piece JSON-escaped on its own. What the
server holds for one read is one piece (256 Ki characters) and its encoding, whatever the log's
size. The store opens a transaction per piece; nothing here opens one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from tpufleet.control.store import logs
from tpufleet.control.store.facade import Store
from tpufleet.control.store.values import LogRead


class HostLogOut(BaseModel):
    host: int = Field(description="host index in the attempt (slice, then worker)")
    slice: str
    worker_id: int
    data: str = Field(description="stored output from offset to next_offset")
    next_offset: int = Field(description="pass as ?offset= (with ?host=) to read on")
    complete: bool = Field(description="the host's stream has ended; nothing more will be stored")
    truncated: bool = Field(description="the per-host cap was reached; the rest was not kept")
    note: str | None = Field(description="why the stored log is not the whole output, when it is not")


class LogOut(BaseModel):
    job_id: str
    attempt: int
    job_state: str
    hosts: list[HostLogOut]


def response(store: Store, read: LogRead, spans: tuple[logs.Span, ...]) -> StreamingResponse:
    """The streamed answer to ``read`` (its hosts' ``data`` empty), the text of ``spans`` filled in."""
    return StreamingResponse(_body(store, read, spans), media_type="application/json")


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _body(store: Store, read: LogRead, spans: tuple[logs.Span, ...]) -> Iterator[bytes]:
    head = {"job_id": read.job_id, "attempt": read.attempt, "job_state": read.job_state}
    yield _encode(_dumps(head)[:-1] + ',"hosts":[')
    for i, (host, span) in enumerate(zip(read.hosts, spans, strict=True)):
        fields = asdict(host)
        del fields["data"]
        rest = _dumps(fields)  # {"host":0,...}: data goes first, the rest after it
        yield _encode(("," if i else "") + '{"data":"')
        for piece in logs.stored_text(store, span):
            yield _encode(_dumps(piece)[1:-1])
        yield _encode('",' + rest[1:])
    yield b"]}"


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "replace")  # a lone surrogate in a log cannot be UTF-8: '?'
