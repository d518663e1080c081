"""The REST API: ``create_app(store)`` -> a FastAPI app with routes under ``/api/v1`` and ``/healthz``.

Thin: parse (pydantic v2, strict: no string or boolean is coerced to a number), authenticate
(``auth.py``), call the store, return JSON. Everything a caller sends is untrusted: bodies are
capped before they are read whole (``Limits``, 413), fields are validated by
:meth:`JobRequest.build` (the one path into the store), and a tenant asking for another tenant's
job gets the same 404 as for a job that does not exist. The scheduling loop is told about changes
through ``on_change`` (it wakes up instead of waiting for its next tick). Every error is
``{"error": "<one line>"}`` with the status of its :class:`~tpufleet.errors.TpufleetError` (400
bad input, 401, 403, 404, 409, 413 body too large, 415, 422 malformed body, 429 too many failed
authentications from one address, 503 cluster or database trouble), and the OpenAPI schema
(``/openapi.json``) declares them. There is no ``/docs`` or ``/redoc``: FastAPI's pages load
scripts from a public CDN, on the fleet page's origin where the signed-in token lives.

No answer grows with what a tenant stored: listings carry cut job bodies, a page of them is capped
in bytes (``control/store/listing.py``), logs are streamed (``logstream.py``), and failed
authentications are counted, logged and slowed (``authguard.py``).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool

import tpufleet
from tpufleet.api import auth, errormap, logstream, page
from tpufleet.api.authguard import AuthGuard
from tpufleet.api.errormap import responses
from tpufleet.api.limits import MAX_BATCH_BODY_BYTES, MAX_BATCH_JOBS, BodyLimit
from tpufleet.control.store import listing
from tpufleet.control.store.facade import Store
from tpufleet.control.store.fleetview import fleet_view
from tpufleet.control.store.values import (
    ACTIVE,
    DEFAULT_MAX_RETRIES,
    PAGE_DEFAULT,
    PAGE_MAX,
    PREEMPTION_MODES,
    QUEUED,
    TENANT_NAME,
    TERMINAL,
    JobRequest,
    Limits,
    Principal,
)
from tpufleet.errors import AuthError, ForbiddenError, SpecError, TpufleetError

API = "/api/v1"


class TenantCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field(description="lowercase letters, digits and '-', 1 to 63 characters")
    quota: dict[str, int] = Field(
        default_factory=dict, description="nominal chips per generation (0 to 1,000,000), e.g. {'v4': 32}"
    )
    weight: float = Field(1.0, description="fair-share weight, above 0 and at most 1000")
    preemption: str = Field(
        PREEMPTION_MODES[0],
        description="lower_priority: its higher-priority jobs may preempt its own lower-priority ones; never",
    )


class TenantUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    quota: dict[str, int] | None = Field(
        None, description="merged per generation: the generations given are set, 0 removes one"
    )
    weight: float | None = Field(None, description="fair-share weight, above 0 and at most 1000")
    preemption: str | None = Field(None, description="lower_priority or never")


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    tenant: str = Field(description="the tenant the token is for")
    scope: str = Field("jobs", description="jobs (the tenant's jobs) or metrics (only GET /metrics)")


class EventPage(BaseModel):
    items: list[dict[str, Any]]
    next: str | None = Field(description="pass as ?after= for the next page; null on the last page")


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


class BatchOut(BaseModel):
    ids: list[str] = Field(description="the new jobs' ids, in the order of the batch")


class JobPage(BaseModel):
    items: list[dict[str, Any]]
    next: str | None = Field(description="pass as ?after= for the next page; null on the last page")


class PackageOut(BaseModel):
    id: str = Field(description="sha256:<64 hex>: the working_dir of a job")
    size: int


class Health(BaseModel):
    status: str = Field(description="ok, or stalled when the scheduling loop is not cycling")
    version: str
    cycles: int


class UnsupportedMediaType(SpecError):
    http_status = 415


def _store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


def _who(request: Request) -> Principal:
    """The caller, or the error: 401 for no or a wrong token (429 instead while its address is over
    the failure limit), 403 for a token out of its scope; each failure is counted and logged
    (``authguard.py``). A valid token always passes, whoever else shares its address."""
    guard: AuthGuard = request.app.state.auth_guard
    address = request.client.host if request.client else "unknown"
    try:
        who = _store(request).authenticate(auth.bearer_token(request))
        auth.check_scope(who, request.url.path)
    except AuthError as err:
        guard.check(address)
        guard.failed(address, err.reason, request.method, request.url.path)
        raise
    except ForbiddenError:
        guard.failed(address, "scope", request.method, request.url.path)
        raise
    return who


def _changed(request: Request) -> None:
    request.app.state.on_change()


Who = Annotated[Principal, Depends(_who)]
Db = Annotated[Store, Depends(_store)]
router = APIRouter()


STATUS_DEFAULTS: dict[str, Any] = {
    "cycles": 0,
    "stalled": False,
    "last_error": None,
    "cycle_ms_last": None,
    "cycle_ms_p50": None,
}


def create_app(
    store: Store,
    *,
    on_change: Callable[[], None] = lambda: None,
    status: Callable[[], dict[str, Any]] = dict,
    limits: Limits | None = None,
    metrics: Any = None,
    prices: Any = None,
    admin_token_path: Path | None = None,
    auth_guard: AuthGuard | None = None,
) -> FastAPI:
    """The API over ``store``. ``status`` is the loop's health (``cycles``, ``stalled``,
    ``last_error``, ``cycle_ms_last``, ``cycle_ms_p50``; missing keys read as their defaults):
    ``/healthz`` shows only whether it cycles, ``GET /api/v1/status`` (admin) all of it. ``limits``:
    the caps on what callers send, set on the store too (default: the store's). ``metrics``: the
    ``CollectorRegistry`` ``GET /metrics`` serves (default: the store's, ``observe.registry``);
    ``prices``: the ``pricing.PriceTable`` for cost (default: the shipped one). ``admin_token_path``:
    the file ``POST /api/v1/tokens/rotate-admin`` writes the new admin token to (mode 0600).
    ``auth_guard``: counts and slows failed authentications (default: 10 a minute per address)."""
    app = FastAPI(
        title="tpufleet",
        version=tpufleet.__version__,
        description="A multi-tenant queue that places SPMD jobs on whole TPU slices.",
        openapi_url="/openapi.json",
        docs_url=None,  # FastAPI's /docs and /redoc load unpinned CDN scripts on the page's origin
        redoc_url=None,
    )
    app.state.auth_guard = auth_guard or AuthGuard()
    if limits is not None:
        store.limits = limits  # one set of caps for the API and the store (package checks, queued cap)
    app.state.limits = store.limits
    app.state.store, app.state.on_change = store, on_change
    app.state.admin_token_path = admin_token_path
    app.state.status = lambda: {**STATUS_DEFAULTS, **(status() or {})}
    app.state.duty_cycles = dict  # the fleet view's measured duty cycles (ControlPlane: its sampler's)
    app.add_middleware(
        BodyLimit, limits=app.state.limits, upload_path=f"{API}/packages", batch_path=f"{API}/jobs/batch"
    )
    errormap.install(app)

    @app.get("/healthz", tags=["health"], response_model=Health, responses={503: {"model": Health}})
    def healthz() -> JSONResponse:
        """Unauthenticated liveness: ``ok``, or ``stalled`` (503) when the scheduling loop is not
        cycling or the database does not answer. Never any error text (see ``GET /api/v1/status``)."""
        try:
            info = app.state.status()
            store.ping()
            stalled = bool(info["stalled"])
            cycles = int(info["cycles"] or 0)
        except Exception:
            stalled, cycles = True, 0
        body = {"status": "stalled" if stalled else "ok", "version": tpufleet.__version__, "cycles": cycles}
        return JSONResponse(body, status_code=503 if stalled else 200)

    app.include_router(router, prefix=API)
    from tpufleet.api import metrics_routes  # GET /metrics and /api/v1/cost (they import this module)

    metrics_routes.install(app, store, who=_who, errors=responses, registry=metrics, prices=prices)
    from tpufleet.api import slicegroups  # the slice manager's routes (they import this module)

    app.include_router(slicegroups.router, prefix=API)
    page.install(app)  # the fleet page at / (static files only; its data comes from /api/v1 with a token)
    return app


@router.get("/whoami", tags=["auth"], responses=responses())
def whoami(me: Who) -> dict[str, Any]:
    return {"tenant": me.tenant, "admin": me.admin, "scope": me.scope, "token_id": me.token_id}


@router.get("/status", tags=["health"], responses=responses(403))
def scheduler_status(me: Who, store: Db, request: Request) -> dict[str, Any]:
    """The loop's figures and the fleet's counts (admin): ``queued``, ``running`` (jobs holding
    slices), ``cycles``, ``cycle_ms_last``, ``cycle_ms_p50``, ``slices`` (count by state),
    ``stalled``, ``last_error``."""
    auth.require_admin(me)
    return {**request.app.state.status(), **store.counts()}


@router.post("/tenants", status_code=201, tags=["tenants"], responses=responses(400, 403, 409, 413, 422))
def create_tenant(body: TenantCreate, me: Who, store: Db, request: Request) -> dict[str, Any]:
    """Create a tenant (admin). Its token is in the answer, and only there. The name of a deleted
    tenant stays taken (409)."""
    auth.require_admin(me)
    tenant, token = store.create_tenant(body.name, body.quota, body.weight, body.preemption, actor=me.actor)
    _changed(request)
    return {**tenant.to_dict(), "token": token}


@router.get("/tenants", tags=["tenants"], responses=responses(403, 422))
def list_tenants(
    me: Who,
    store: Db,
    include_deleted: Annotated[
        bool, Query(description="also deleted tenants (state deleting or deleted)")
    ] = False,
) -> list[dict[str, Any]]:
    """Live tenants by name (admin), each with its ``checkpoints`` usage and quota;
    ``include_deleted=true`` adds the deleted ones."""
    auth.require_admin(me)
    return [t.to_dict() for t in store.tenants(include_deleted=include_deleted)]


@router.get("/tenants/{name}", tags=["tenants"], responses=responses(403, 404, 422))
def get_tenant(name: str, me: Who, store: Db) -> dict[str, Any]:
    """One tenant (admin; a tenant's own token reads its own), live or deleted: ``state`` is active,
    deleting or deleted; ``checkpoints``: its checkpoint directory as a host last measured it
    (``used_bytes``, ``measured_at``, ``complete``) and the quota (``quota_bytes``, null: none)."""
    if me.admin or me.tenant != name:
        auth.require_admin(me)
    return store.tenant(name).to_dict()


@router.patch("/tenants/{name}", tags=["tenants"], responses=responses(400, 403, 404, 409, 422))
def update_tenant(name: str, body: TenantUpdate, me: Who, store: Db, request: Request) -> dict[str, Any]:
    """Change a tenant's quota (merged per generation; 0 removes one), weight or preemption
    setting (admin). Used from the scheduling loop's next cycle; lowering a quota below what the
    tenant holds stops nothing: the excess counts as borrowed, reclaimable by other tenants."""
    auth.require_admin(me)
    out = store.update_tenant(
        name, quota=body.quota, weight=body.weight, preemption=body.preemption, actor=me.actor
    ).to_dict()
    _changed(request)
    return out


@router.delete("/tenants/{name}", tags=["tenants"], responses=responses(403, 404, 409, 422))
def delete_tenant(
    name: str,
    me: Who,
    store: Db,
    request: Request,
    force: Annotated[
        bool, Query(description="cancel its queued and running jobs (checkpoint signal, grace) first")
    ] = False,
) -> dict[str, Any]:
    """Delete a tenant (admin): 409 naming its queued and running jobs unless ``force``. Soft:
    its jobs, attempts, logs and events stay readable to the admin; its tokens stop working; its
    name stays taken. ``state`` is ``deleting`` while cancelled jobs still stop, then ``deleted``;
    ``cancelled``: the jobs this call cancelled."""
    auth.require_admin(me)
    tenant, cancelled = store.delete_tenant(name, force=force, actor=me.actor)
    _changed(request)
    return {**tenant.to_dict(), "cancelled": cancelled}


@router.post("/tokens", status_code=201, tags=["tokens"], responses=responses(400, 403, 404, 409, 422))
def create_token(body: TokenCreate, me: Who, store: Db) -> dict[str, Any]:
    """A new token for a tenant (admin): scope ``jobs`` or ``metrics``. The secret is in the
    answer (``token``), and only there."""
    auth.require_admin(me)
    record, token = store.create_token(body.tenant, body.scope, actor=me.actor)
    return {**record.to_dict(), "token": token}


@router.get("/tokens", tags=["tokens"], responses=responses(403, 404, 422))
def list_tokens(
    me: Who,
    store: Db,
    tenant: Annotated[str | None, Query(description="only this tenant's tokens")] = None,
) -> list[dict[str, Any]]:
    """Tokens that work (admin): id, tenant, scope, created and last-used times; never a secret.
    Last use is recorded at most once a minute per token."""
    auth.require_admin(me)
    return [t.to_dict() for t in store.tokens(tenant)]


@router.post("/tokens/rotate-admin", tags=["tokens"], responses=responses(403))
def rotate_admin(me: Who, store: Db, request: Request) -> dict[str, Any]:
    """A new admin token; every other admin token is revoked at once (admin). The server writes it
    to its ``<state-dir>/admin-token`` (mode 0600, ``path``); the answer has it too (``token``)."""
    auth.require_admin(me)
    record, token, revoked = store.rotate_admin(actor=me.actor)
    path: Path | None = request.app.state.admin_token_path
    if path is not None:
        auth.write_token_file(path, token)
    return {**record.to_dict(), "token": token, "revoked": revoked, "path": str(path) if path else None}


@router.post("/tokens/{token_id}/revoke", tags=["tokens"], responses=responses(403, 404, 409, 422))
def revoke_token(token_id: str, me: Who, store: Db) -> dict[str, Any]:
    """Revoke a token by id (admin): every request with it is a 401 from now on. The last admin
    token is not revoked (409: rotate it instead)."""
    auth.require_admin(me)
    return store.revoke_token(token_id, actor=me.actor).to_dict()


@router.get("/events", tags=["events"], response_model=EventPage, responses=responses(400, 403, 422))
def list_events(
    me: Who,
    store: Db,
    tenant: Annotated[str | None, Query(description="admin: one tenant's events")] = None,
    limit: Annotated[
        int,
        Query(ge=1, le=PAGE_MAX, description=f"events per page: default {PAGE_DEFAULT}, at most {PAGE_MAX}"),
    ] = PAGE_DEFAULT,
    after: Annotated[str | None, Query(description="the `next` of the previous page")] = None,
) -> dict[str, Any]:
    """The audit log, oldest first, a page at a time (``{"items", "next"}`` as ``GET /jobs``):
    tenant and token changes, cancels, drains and preemptions, each with ``actor`` (``admin``, a
    token id, or ``scheduler``) and ``tenant``. A tenant's token reads only its own tenant's."""
    if not me.admin and tenant is not None and tenant != me.tenant:
        raise ForbiddenError(f"your token is for tenant {me.tenant!r}; it reads only its own tenant's events")
    scope = auth.job_scope(me) or tenant
    if scope is not None and not TENANT_NAME.fullmatch(scope):
        raise SpecError(f"{scope[:70]!r} is not a tenant name", field="tenant")
    items, last = store.audit_events(scope, limit=limit, after=decode_cursor(after))
    return {"items": [e.to_dict() for e in items], "next": None if last is None else encode_cursor(last)}


@router.get("/slices", tags=["slices"], responses=responses())
def list_slices(me: Who, store: Db) -> list[dict[str, Any]]:
    """Every slice and its state; a tenant's token sees the holder only of its own jobs (another
    tenant's job id shows as null, the slice still HELD)."""
    rows = [s.to_dict() for s in store.slices()]
    scope = auth.job_scope(me)
    if scope is not None:
        own = {j.id for j in store.jobs(tenant=scope, states=ACTIVE)}
        for row in rows:
            row["holder"] = row["holder"] if row["holder"] in own else None
    return rows


@router.get("/fleet", tags=["slices"], responses=responses())
def fleet(me: Who, store: Db, request: Request) -> dict[str, Any]:
    """The fleet page's (and ``tpufleet top``'s) one read: every slice with its hosts and chips,
    the queue head with positions and wait reasons, the caller's running and recent jobs, and each
    tenant's chips held against quota. A tenant's token sees every slice but only its own jobs and
    tenant (a slice another tenant holds says ``held_by_other``); see ``control/store/fleetview.py``.
    Running and recent jobs carry their ``goodput``, as every job view does."""
    from tpufleet.api.metrics_routes import jobs_with_goodput

    view = fleet_view(store, me, duty=request.app.state.duty_cycles())
    view["active"] = jobs_with_goodput(store, view["active"])
    view["recent"] = jobs_with_goodput(store, view["recent"])
    return view


@router.post("/slices/{name}/drain", tags=["slices"], responses=responses(403, 404, 422))
def drain(name: str, me: Who, store: Db, request: Request) -> dict[str, Any]:
    """Place no new job on the slice (admin); its current holder runs to the end."""
    auth.require_admin(me)
    out = store.set_draining(name, True, actor=me.actor).to_dict()
    _changed(request)
    return out


@router.post("/slices/{name}/undrain", tags=["slices"], responses=responses(403, 404, 422))
def undrain(name: str, me: Who, store: Db, request: Request) -> dict[str, Any]:
    auth.require_admin(me)
    out = store.set_draining(name, False, actor=me.actor).to_dict()
    _changed(request)
    return out


@router.post(
    "/packages",
    status_code=201,
    tags=["jobs"],
    response_model=PackageOut,
    responses=responses(400, 403, 404, 409, 413, 415, 422),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/zip": {"schema": {"type": "string", "format": "binary"}}},
        }
    },
)
async def upload_package(
    me: Who,
    store: Db,
    request: Request,
    tenant: Annotated[
        str | None, Query(description="only with the admin token: the tenant it is for")
    ] = None,
) -> dict[str, Any]:
    """Upload a job's working directory as a zip (raw body, ``Content-Type: application/zip``),
    at most 100 MiB by default (``serve --max-package-bytes``), 20,000 entries, 1 GiB unpacked,
    no absolute paths, ``..`` or symbolic links, every entry's size and CRC-32 as declared. Answers
    its id, the ``working_dir`` of a job. A tenant's packages share its package quota (1 GiB by
    default, ``serve --package-quota-mib``; past it a 409); one no queued or running job names is
    deleted an hour after its upload or its last job's end."""
    owner = auth.submit_tenant(me, tenant)
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/zip":
        raise UnsupportedMediaType(f"Content-Type must be application/zip, got {kind[:60]!r}")
    data = await request.body()
    package_id = await run_in_threadpool(store.put_package, owner, data)
    return {"id": package_id, "size": len(data)}


@router.post("/jobs", status_code=201, tags=["jobs"], responses=responses(400, 403, 404, 409, 413, 422))
def submit(body: JobSubmit, me: Who, store: Db, request: Request) -> dict[str, Any]:
    """Queue a job. Over the per-tenant cap on queued jobs (``serve --max-queued-per-tenant``,
    default 100,000) it is a 409; a working_dir package this tenant did not upload is a 404."""
    tenant = auth.submit_tenant(me, body.tenant)
    fields = body.model_dump(exclude={"tenant"})
    job = store.submit(tenant, JobRequest.build(**fields, limits=request.app.state.limits))
    _changed(request)
    return job.to_dict()


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
    transaction. The per-tenant queued cap applies to the batch as a whole (409)."""
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
    ids = store.submit_many(owners, requests)
    _changed(request)
    return {"ids": ids}


def _first_problem(err: ValidationError) -> str:
    """``.num_slices: Input should be a valid integer`` (or ``[0]`` for a list item)."""
    e = err.errors()[0]
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e.get("loc", ()))
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
    states = tuple(s.upper() for s in state or ())
    valid = (QUEUED, *ACTIVE, *TERMINAL)
    for bad in (s for s in states if s not in valid):
        raise SpecError(f"state={bad[:40]!r} is not a job state; valid: {', '.join(valid)}")
    items, last = listing.jobs_page(store, scope, states, limit=limit, after=decode_cursor(after))
    from tpufleet.api.metrics_routes import jobs_with_goodput

    listed = jobs_with_goodput(store, items)
    return {"items": listed, "next": None if last is None else encode_cursor(last)}


_CURSOR = re.compile(r"[A-Za-z0-9_-]{1,40}")
_CURSOR_BODY = re.compile(r"seq:(0|[1-9][0-9]{0,17})")


def encode_cursor(seq: int) -> str:
    """An opaque page cursor: the last listed job's seq."""
    return base64.urlsafe_b64encode(f"seq:{seq}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> int:
    if cursor is None:
        return 0
    found = None
    if _CURSOR.fullmatch(cursor):
        try:
            found = _CURSOR_BODY.fullmatch(
                base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
            )
        except (binascii.Error, UnicodeDecodeError, ValueError):
            found = None
    if found is None:
        raise SpecError("not a cursor; pass the `next` of an earlier page", field="after")
    return int(found.group(1))


@router.get("/jobs/{job_id}", tags=["jobs"], responses=responses(404, 422))
def get_job(job_id: str, me: Who, store: Db) -> dict[str, Any]:
    from tpufleet.api.metrics_routes import job_with_goodput

    return job_with_goodput(store.job(job_id, tenant=auth.job_scope(me)), store.clock())


@router.get("/jobs/{job_id}/events", tags=["jobs"], responses=responses(404, 422))
def job_events(job_id: str, me: Who, store: Db) -> list[dict[str, Any]]:
    store.job(job_id, tenant=auth.job_scope(me))
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
    read, spans = store.plan_logs(job_id, tenant=scope, attempt=attempt, host=host, offset=offset)
    return logstream.response(store, read, spans)


@router.post("/jobs/{job_id}/cancel", tags=["jobs"], responses=responses(404, 409, 422))
def cancel(job_id: str, me: Who, store: Db, request: Request) -> dict[str, Any]:
    job = store.request_cancel(job_id, tenant=auth.job_scope(me), actor=me.actor)
    _changed(request)
    return job.to_dict()
