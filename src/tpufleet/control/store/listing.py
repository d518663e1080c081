"""Jobs as listings show them (``GET /api/v1/jobs``, the fleet view): small, whatever a tenant stored.

A job's body may hold a 64 KiB command and 256 KiB of env (``Limits``); a listing of 1,000 such
jobs whole was a 306 MiB answer, and ``serve`` grew by 1.5 GiB building it. So a listed job
(:func:`job_item`) is the job of ``GET /api/v1/jobs/{id}`` without its ``env`` and ``attempts``,
its ``command`` cut to ``LIST_COMMAND_CHARS`` characters (``command_cut`` says when), its
``reason`` and ``working_dir`` to ``LIST_TEXT_CHARS``; the env column is never read (a
``raiseload``: reading it by mistake is an error, not a silent load). :func:`jobs_page` reads
``READ_ROWS`` rows per query and stops a page when its items would pass ``LIST_MAX_BYTES`` of JSON
(its ``next`` goes on from there), so neither the answer nor the memory behind it grows with
what was stored.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import defer
from sqlalchemy.sql import Select

from tpufleet.control.store import values as r
from tpufleet.control.store.database import Database
from tpufleet.control.store.tables import JobRow

LIST_MAX_BYTES = 1 * r.MiB  # a page of GET /api/v1/jobs stops before its items pass this
ITEM_EXTRA_BYTES = 256  # what the API adds to each listed job (its goodput), counted in the cap
READ_ROWS = 50  # rows per query while a page is built
LEAN = defer(JobRow.env, raiseload=True)  # a listing never loads a job's env


def lean(query: Select[Any]) -> Select[Any]:
    """``query`` (of ``JobRow``) without the env column."""
    return query.options(LEAN)


def job_item(j: JobRow) -> dict[str, Any]:
    """A listed job: see the module docstring. ``j`` was read with :func:`lean` (or whole)."""
    command, cut = r.cut_command(j.command or ())
    return {
        "id": j.id,
        "name": j.name,
        "tenant": j.tenant,
        "state": j.state,
        "attempt": j.attempt,
        "slices": list(j.slices or ()),
        "reason": r.cut_text(j.reason_message),
        "reason_code": j.reason_code,
        "accelerator_type": j.accelerator_type,
        "num_slices": j.num_slices,
        "priority": j.priority,
        "max_retries": j.max_retries,
        "failures": j.failures,
        "command": command,
        "command_cut": cut,
        "working_dir": r.cut_text(j.working_dir),
        "borrowing": j.borrowing,
        "preempting": j.preempting,
        "cancel_requested": j.cancel_requested,
        "stopping": j.stop_kind is not None,
        "exit_code": j.exit_code,
        "seq": j.seq,
        "submitted_at": j.submitted_at,
        "admitted_at": j.admitted_at,
        "started_at": j.started_at,
        "finished_at": j.finished_at,
        "kind": j.kind or "spmd",
    }


def item_bytes(item: dict[str, Any]) -> int:
    """The bytes ``item`` takes in a JSON answer, with what the API adds to it."""
    return len(json.dumps(item, ensure_ascii=False).encode("utf-8", "replace")) + ITEM_EXTRA_BYTES


def jobs_page(
    store: Database,
    tenant: str | None = None,
    states: tuple[str, ...] = (),
    *,
    limit: int = r.PAGE_DEFAULT,
    after: int = 0,
    max_bytes: int = LIST_MAX_BYTES,
) -> tuple[list[dict[str, Any]], int | None]:
    """Up to ``limit`` listed jobs with ``seq > after`` in submission order, fewer where the next
    would take the items past ``max_bytes`` (never none while one is left); and the seq to go on
    after (None on the last page)."""
    items: list[dict[str, Any]] = []
    size, cursor = 0, after
    while True:
        query = lean(select(JobRow).where(JobRow.seq > cursor).order_by(JobRow.seq).limit(READ_ROWS))
        if tenant is not None:
            query = query.where(JobRow.tenant == tenant)
        if states:
            query = query.where(JobRow.state.in_(states))
        with store.tx() as s:
            chunk = [job_item(j) for j in s.scalars(query)]
        for item in chunk:
            grown = size + item_bytes(item)
            if len(items) >= limit or (items and grown > max_bytes):
                return items, items[-1]["seq"]
            items.append(item)
            size = grown
        if len(chunk) < READ_ROWS:
            return items, None
        cursor = chunk[-1]["seq"]
