"""``/api/v1/jobs``: submit one job or a batch, list them a page at a time, read one, its events
and its logs (streamed, ``logstream.py``), cancel it. A tenant's token sees only its own jobs:
another tenant's job is the same 404 as one that does not exist. Every job body passes
:meth:`~tpufleet.control.store.values.JobRequest.build`, the one path into the store."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tpufleet.api import auth, logstream
from tpufleet.api.cursor import decode_cursor, encode_cursor
from tpufleet.api.deps import API, Db, Who, changed
from tpufleet.api.errormap import responses
from tpufleet.api.jobviews import fleet_warnings, job_with_goodput, jobs_with_goodput
from tpufleet.api.limits import MAX_BATCH_BODY_BYTES, MAX_BATCH_JOBS
from tpufleet.api.watch import MAX_WAIT_S, JobChanges
from tpufleet.control.store import listing
from tpufleet.control.store.facade import Store
from tpufleet.control.store.values import (
    ACTIVE,
    DEFAULT_MAX_RETRIES,
    PAGE_DEFAULT,
    PAGE_MAX,
    QUEUED,
    TENANT_NAME,
    TERMINAL,
    JobRecord,
    JobRequest,
)
from tpufleet.errors import SpecError, TpufleetError, unknown_field

__all__ = ["BatchOut", "BatchWarning", "JobBatch", "JobPage", "JobSubmit", "router"]


class JobSubmit(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    command: list[str] = Field(
        description="run on every host, SPMD style, e.g. ['python', 'train.py']; at most 256 arguments "
        "of 8 KiB, 64 KiB in all, no NUL"
    )
    accelerator_type: str = Field(description="slice type, GCE naming, e.g. v4-16, v6e-16")
    num_slices: int = Field(1, description="1 to 4096")
    priority: int = Field(0, description="-1,000,000 to 1,000,000; higher runs first")
    max_retries: int = Field(DEFAULT_MAX_RETRIES, description="0 to 100")
    name: str | None = Field(None, description="1 to 128 printable characters (default: from the command)")
    env: dict[str, str] = Field(
        default_factory=dict, description="at most 256 variables, values of 32 KiB, 256 KiB in all"
    )
    working_dir: str | None = Field(
        None,
        description="shipped to every host: a package id sha256:<64 hex> from POST /api/v1/packages, "
        "or a URL under a prefix the operator allows (serve --allow-working-dir-url)",
    )
    tenant: str | None = Field(None, description="only with the admin token: the tenant to submit for")
    kind: str = Field(
        "spmd",
        description="spmd (the command on every host) or ray (the command once, as a Ray driver through "
        "Ray's job submission, on the slices admitted; only with serve --allow-ray-jobs)",
    )


class JobBatch(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    jobs: list[dict[str, Any]] = Field(
        min_length=1,
        max_length=MAX_BATCH_JOBS,
        description=f"1 to {MAX_BATCH_JOBS:,} job bodies, each with the fields of POST /api/v1/jobs; "
        f"the request body at most {MAX_BATCH_BODY_BYTES // (1 << 20)} MiB",
    )


class BatchWarning(BaseModel):
    jobs: list[int] = Field(description="the items it is about: their indices in the batch, from 0")
    message: str = Field(description="what POST /api/v1/jobs says under warnings for each of them")


class BatchOut(BaseModel):
    ids: list[str] = Field(description="the new jobs' ids, in the order of the batch")
    warnings: list[BatchWarning] = Field(
        description="the warnings POST /api/v1/jobs gives, each once, with the items it is about"
    )


class JobPage(BaseModel):
    items: list[dict[str, Any]]
    next: str | None = Field(description="pass as ?after= for the next page; null on the last page")


router = APIRouter(prefix=API)


@router.post("/jobs", status_code=201, tags=["jobs"], responses=responses(400, 403, 404, 409, 413, 422))
def submit(body: JobSubmit, me: Who, store: Db, request: Request) -> dict[str, Any]:
    """Queue a job. Over the per-tenant cap on queued jobs (``serve --max-queued-per-tenant``,
    default 100,000) it is a 409; a working_dir package this tenant did not upload is a 404.
    The job as stored, plus ``warnings``: sentences about a job that is queued but cannot run as
    things are (the fleet has no slice of its type and no pool makes them), with the fix."""
    tenant = auth.submit_tenant(me, body.tenant)
    fields = body.model_dump(exclude={"tenant"})
    job = store.jobs.submit(tenant, JobRequest.build(**fields, limits=request.app.state.limits))
    changed(request)
    return {**job.to_dict(), "warnings": _warnings(request, store, job)}


def _warnings(request: Request, store: Store, job: JobRecord) -> list[str]:
    """``jobviews.fleet_warnings`` for a queued job (:func:`_shapes_warnings`)."""
    if job.state != QUEUED:
        return []
    return _shapes_warnings(request, store, [(job.accelerator_type, job.num_slices)])[0]


def _shapes_warnings(request: Request, store: Store, shapes: list[tuple[str, int]]) -> list[list[str]]:
    """``jobviews.fleet_warnings`` for queued jobs of each (type, slices) shape; the autoscaler's
    pool types are the app's ``pool_types`` (``ControlPlane`` sets them; none without a provider),
    and the fleet counts as seen once the loop has cycled."""
    pools: frozenset[str] = getattr(request.app.state, "pool_types", frozenset())
    seen = bool(request.app.state.status().get("cycles"))  # the loop has synced the fleet's slices
    return [fleet_warnings(store, kind, n, pools, fleet_seen=seen) for kind, n in shapes]


def _batch_warnings(request: Request, store: Store, requests: list[JobRequest]) -> list[dict[str, Any]]:
    """The warnings of a queued batch (``BatchOut.warnings``): each once, with the items it is
    about; the fleet is looked at once per shape of job, not per item."""
    items: dict[tuple[str, int], list[int]] = {}
    for i, req in enumerate(requests):
        items.setdefault((req.accelerator_type, req.num_slices), []).append(i)
    shapes = list(items)
    by_message: dict[str, list[int]] = {}
    for shape, warnings in zip(shapes, _shapes_warnings(request, store, shapes), strict=True):
        for message in warnings:
            by_message.setdefault(message, []).extend(items[shape])
    return [{"jobs": sorted(jobs), "message": message} for message, jobs in by_message.items()]


@router.post(
    "/jobs/batch",
    status_code=201,
    tags=["jobs"],
    response_model=BatchOut,
    responses=responses(400, 403, 404, 409, 413, 422),
)
def submit_batch(body: JobBatch, me: Who, store: Db, request: Request) -> dict[str, Any]:
    """Queue many jobs at once, all or none: every item is validated first (one bad item is a 400
    naming it, e.g. ``jobs[3].num_slices: ...``, and nothing is stored), then all are stored in one
    transaction. The per-tenant queued cap applies to the batch as a whole (409). The ids, and
    ``warnings``: those ``POST /api/v1/jobs`` gives, each once with the items it is about."""
    limits = request.app.state.limits
    owners: list[str] = []
    requests: list[JobRequest] = []
    for i, item in enumerate(body.jobs):
        try:
            job = JobSubmit.model_validate(item)
            owners.append(auth.submit_tenant(me, job.tenant))
            requests.append(JobRequest.build(**job.model_dump(exclude={"tenant"}), limits=limits))
        except ValidationError as err:
            raise SpecError(f"jobs[{i}]{_first_problem(err)}") from None
        except TpufleetError as err:
            raise _at_item(err, i) from None
    ids = store.jobs.submit_many(owners, requests)
    changed(request)
    return {"ids": ids, "warnings": _batch_warnings(request, store, requests)}


def _first_problem(err: ValidationError) -> str:
    """``.num_slices: Input should be a valid integer`` (or ``[0]`` for a list item); an unknown
    field names the closest valid one, as a fleet spec's does."""
    e = err.errors()[0]
    loc = e.get("loc", ())
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)
    if e.get("type") == "extra_forbidden" and len(loc) == 1:
        return f"{where}: {unknown_field(loc[0], JobSubmit.model_fields)}"
    return f"{where}: {e.get('msg', 'invalid')}"


def _at_item(err: TpufleetError, index: int) -> TpufleetError:
    """The same error, its message prefixed with the item: ``jobs[3].num_slices: ...``."""
    if isinstance(err, SpecError):
        return SpecError(f"jobs[{index}]{'.' if err.field else ': '}{err}")
    return type(err)(f"jobs[{index}]: {err}")


@router.get("/jobs", tags=["jobs"], response_model=JobPage, responses=responses(400, 422))
def list_jobs(
    me: Who,
    store: Db,
    state: Annotated[list[str] | None, Query(description="only these states")] = None,
    tenant: Annotated[str | None, Query(description="admin only: one tenant's jobs")] = None,
    limit: Annotated[
        int,
        Query(ge=1, le=PAGE_MAX, description=f"jobs per page: default {PAGE_DEFAULT}, at most {PAGE_MAX}"),
    ] = PAGE_DEFAULT,
    after: Annotated[str | None, Query(description="the `next` of the previous page")] = None,
) -> dict[str, Any]:
    """Jobs in submission order, a page at a time: ``{"items": [...], "next": CURSOR or null}``;
    ``limit`` defaults to 100 and is at most 1000; pass ``next`` back as ``after`` for the next page.
    A page also ends before its items pass 1 MiB of JSON (``next`` goes on from there). A listed
    job has no ``env`` and no ``attempts``, its ``command`` is cut to 256 characters (ending in
    '\u2026', ``command_cut`` true), its ``reason`` and ``working_dir`` to 512: ``GET
    /api/v1/jobs/{id}`` has the whole job."""
    scope = auth.job_scope(me) or tenant
    if scope is not None and not TENANT_NAME.fullmatch(scope):
        raise SpecError(f"{scope[:70]!r} is not a tenant name", field="tenant")
    states = _job_states("state", state or ())
    items, last = listing.jobs_page(store, scope, states, limit=limit, after=decode_cursor(after))
    listed = jobs_with_goodput(store, items)
    return {"items": listed, "next": None if last is None else encode_cursor(last)}


def _job_states(param: str, given: Iterable[str]) -> tuple[str, ...]:
    """``given`` in upper case; a 400 naming ``param`` for one that is not a job state."""
    states = tuple(s.upper() for s in given)
    valid = (QUEUED, *ACTIVE, *TERMINAL)
    for bad in (s for s in states if s not in valid):
        raise SpecError(f"{param}={bad[:40]!r} is not a job state; valid: {', '.join(valid)}")
    return states


@router.get("/jobs/{job_id}", tags=["jobs"], responses=responses(400, 404, 409, 422))
def get_job(
    job_id: str,
    me: Who,
    store: Db,
    request: Request,
    while_state: Annotated[
        list[str] | None,
        Query(
            description="with wait_s: answer once the job is in none of these states (e.g. QUEUED, or "
            "QUEUED, ADMITTED and STARTING to wait until it runs or ends), not before"
        ),
    ] = None,
    wait_s: Annotated[
        float,
        Query(
            ge=0,
            le=MAX_WAIT_S,
            description=f"with while_state: wait at most this long, 0 to {MAX_WAIT_S:g} s",
        ),
    ] = 0,
) -> dict[str, Any]:
    """The whole job, its attempts and goodput, and ``warnings`` as ``POST /api/v1/jobs`` gives
    them while it is queued. With ``while_state`` (one or more) and ``wait_s`` the answer waits
    while the job is in one of those states, at most ``wait_s`` seconds, and is the job as it then
    is (a long poll, ``watch.py``: no need to ask again every few milliseconds); too many waits
    at once is a 409."""
    scope = auth.job_scope(me)
    if not while_state:
        if wait_s:
            raise SpecError("wait_s needs while_state: the states to wait for the job to leave, e.g. QUEUED")
        job = store.jobs.get(job_id, tenant=scope)
    else:
        states = frozenset(_job_states("while_state", while_state))
        changes: JobChanges = request.app.state.job_changes
        job = changes.wait(
            me.tenant or "(admin)",
            job_id,
            lambda: store.jobs.get(job_id, tenant=scope),
            lambda j: j.state in states,
            wait_s,
        )
    return {**job_with_goodput(job, store.clock()), "warnings": _warnings(request, store, job)}


@router.get("/jobs/{job_id}/events", tags=["jobs"], responses=responses(404, 422))
def job_events(job_id: str, me: Who, store: Db) -> list[dict[str, Any]]:
    store.jobs.get(job_id, tenant=auth.job_scope(me))
    return store.events(job_id)


@router.get(
    "/jobs/{job_id}/logs", tags=["jobs"], response_model=logstream.LogOut, responses=responses(404, 422)
)
def job_logs(
    job_id: str,
    me: Who,
    store: Db,
    attempt: Annotated[int | None, Query(ge=1, description="default: the latest that ran")] = None,
    host: Annotated[
        int | None, Query(ge=0, description="host index in the attempt (slice, then worker)")
    ] = None,
    offset: Annotated[int, Query(ge=0, description="characters already read (per host)")] = 0,
) -> StreamingResponse:
    """A job's stored output, every host or one, from ``offset``: streamed, read from the store a
    piece at a time (a 64 MiB log is never held whole)."""
    scope = auth.job_scope(me)
    read, spans = store.jobs.plan_logs(job_id, tenant=scope, attempt=attempt, host=host, offset=offset)
    return logstream.response(store, read, spans)


@router.post("/jobs/{job_id}/cancel", tags=["jobs"], responses=responses(404, 409, 422))
def cancel(job_id: str, me: Who, store: Db, request: Request) -> dict[str, Any]:
    job = store.jobs.request_cancel(job_id, tenant=auth.job_scope(me), actor=me.actor)
    changed(request)
    request.app.state.job_changes.changed([job_id])  # a queued job is CANCELLED at once
    return job.to_dict()
