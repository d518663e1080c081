"""The REST API: ``create_app(store)`` -> a FastAPI app with routes under ``/api/v1`` and ``/healthz``.

Thin: parse (pydantic v2), authenticate (``auth.py``), call the store, return JSON. The scheduling
loop is told about changes through ``on_change`` (it wakes up instead of waiting for its next
tick). Every error is ``{"error": "<one line>"}`` with the status of its
:class:`~tpufleet.errors.TpufleetError` (400 bad input, 401, 403, 404, 409, 422 malformed body,
503 cluster or database trouble). OpenAPI is at ``/openapi.json``, the docs at ``/docs``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

import tpufleet
from tpufleet.api import auth
from tpufleet.control.records import ACTIVE, DEFAULT_MAX_RETRIES, QUEUED, TERMINAL, JobRequest, Principal
from tpufleet.control.store import Store
from tpufleet.errors import AuthError, ClusterError, SpecError, TpufleetError

API = "/api/v1"


class TenantCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    quota: dict[str, int] = Field(
        default_factory=dict, description="nominal chips per generation, e.g. {'v4': 32}"
    )
    weight: float = 1.0


class JobSubmit(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: list[str] = Field(description="run on every host, SPMD style, e.g. ['python', 'train.py']")
    accelerator_type: str = Field(description="slice type, GCE naming, e.g. v4-16, v6e-16")
    num_slices: int = 1
    priority: int = 0
    max_retries: int = DEFAULT_MAX_RETRIES
    name: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    working_dir: str | None = Field(None, description="directory shipped to every host (Ray runtime_env)")
    tenant: str | None = Field(None, description="only with the admin token: the tenant to submit for")


def _store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


def _who(request: Request) -> Principal:
    return _store(request).authenticate(auth.bearer_token(request))


def _changed(request: Request) -> None:
    request.app.state.on_change()


Who = Annotated[Principal, Depends(_who)]
Db = Annotated[Store, Depends(_store)]
router = APIRouter()


def create_app(
    store: Store,
    *,
    on_change: Callable[[], None] = lambda: None,
    status: Callable[[], dict[str, Any]] = dict,
) -> FastAPI:
    """The API over ``store``. ``status`` adds fields (the loop's health) to ``/healthz``."""
    app = FastAPI(
        title="tpufleet",
        version=tpufleet.__version__,
        description="A multi-tenant queue that places SPMD jobs on whole TPU slices.",
        openapi_url="/openapi.json",
    )
    app.state.store, app.state.on_change = store, on_change
    _errors(app)

    @app.get("/healthz", tags=["health"])
    def healthz() -> JSONResponse:
        try:
            with store.tx() as s:
                s.execute(text("SELECT 1"))
        except Exception as err:
            return JSONResponse({"status": "error", "error": f"database: {err}"}, status_code=503)
        return JSONResponse({"status": "ok", "version": tpufleet.__version__, **status()})

    app.include_router(router, prefix=API)
    return app


@router.get("/whoami", tags=["auth"])
def whoami(me: Who) -> dict[str, Any]:
    return {"tenant": me.tenant, "admin": me.admin}


@router.post("/tenants", status_code=201, tags=["tenants"])
def create_tenant(body: TenantCreate, me: Who, store: Db, request: Request) -> dict[str, Any]:
    """Create a tenant (admin). Its token is in the answer, and only there."""
    auth.require_admin(me)
    tenant, token = store.create_tenant(body.name, body.quota, body.weight)
    _changed(request)
    return {**tenant.to_dict(), "token": token}


@router.get("/tenants", tags=["tenants"])
def list_tenants(me: Who, store: Db) -> list[dict[str, Any]]:
    auth.require_admin(me)
    return [t.to_dict() for t in store.tenants()]


@router.get("/slices", tags=["slices"])
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


@router.post("/slices/{name}/drain", tags=["slices"])
def drain(name: str, me: Who, store: Db, request: Request) -> dict[str, Any]:
    """Place no new job on the slice (admin); its current holder runs to the end."""
    auth.require_admin(me)
    out = store.set_draining(name, True).to_dict()
    _changed(request)
    return out


@router.post("/slices/{name}/undrain", tags=["slices"])
def undrain(name: str, me: Who, store: Db, request: Request) -> dict[str, Any]:
    auth.require_admin(me)
    out = store.set_draining(name, False).to_dict()
    _changed(request)
    return out


@router.post("/jobs", status_code=201, tags=["jobs"])
def submit(body: JobSubmit, me: Who, store: Db, request: Request) -> dict[str, Any]:
    tenant = auth.submit_tenant(me, body.tenant)
    job = store.submit(tenant, JobRequest.build(**body.model_dump(exclude={"tenant"})))
    _changed(request)
    return job.to_dict()


@router.get("/jobs", tags=["jobs"])
def list_jobs(
    me: Who,
    store: Db,
    state: Annotated[list[str] | None, Query(description="only these states")] = None,
    tenant: Annotated[str | None, Query(description="admin only: one tenant's jobs")] = None,
) -> list[dict[str, Any]]:
    scope = auth.job_scope(me) or tenant
    states = tuple(s.upper() for s in state or ())
    valid = (QUEUED, *ACTIVE, *TERMINAL)
    for bad in (s for s in states if s not in valid):
        raise SpecError(f"state={bad!r} is not a job state; valid: {', '.join(valid)}")
    return [j.to_dict() for j in store.jobs(tenant=scope, states=states)]


@router.get("/jobs/{job_id}", tags=["jobs"])
def get_job(job_id: str, me: Who, store: Db) -> dict[str, Any]:
    return store.job(job_id, tenant=auth.job_scope(me)).to_dict()


@router.get("/jobs/{job_id}/events", tags=["jobs"])
def job_events(job_id: str, me: Who, store: Db) -> list[dict[str, Any]]:
    store.job(job_id, tenant=auth.job_scope(me))
    return store.events(job_id)


@router.get("/jobs/{job_id}/logs", tags=["jobs"])
def job_logs(
    job_id: str,
    me: Who,
    store: Db,
    attempt: Annotated[int | None, Query(ge=1, description="default: the latest that ran")] = None,
    host: Annotated[
        int | None, Query(ge=0, description="host index in the attempt (slice, then worker)")
    ] = None,
    offset: Annotated[int, Query(ge=0, description="characters already read (per host)")] = 0,
) -> dict[str, Any]:
    logs = store.read_logs(job_id, tenant=auth.job_scope(me), attempt=attempt, host=host, offset=offset)
    return logs.to_dict()


@router.post("/jobs/{job_id}/cancel", tags=["jobs"])
def cancel(job_id: str, me: Who, store: Db, request: Request) -> dict[str, Any]:
    job = store.request_cancel(job_id, tenant=auth.job_scope(me))
    _changed(request)
    return job.to_dict()


def _errors(app: FastAPI) -> None:
    """Every error as ``{"error": "<one line>"}``."""

    @app.exception_handler(TpufleetError)
    def tpufleet_error(_request: Request, err: TpufleetError) -> JSONResponse:
        headers = {}
        if isinstance(err, ClusterError) and err.retry_after is not None:
            headers["Retry-After"] = str(max(1, round(err.retry_after)))
        if isinstance(err, AuthError):
            headers["WWW-Authenticate"] = "Bearer"
        return JSONResponse({"error": _one_line(str(err))}, status_code=err.http_status, headers=headers)

    @app.exception_handler(RequestValidationError)
    def invalid(_request: Request, err: RequestValidationError) -> JSONResponse:
        problems = []
        for e in err.errors()[:3]:
            where = ".".join(str(p) for p in e.get("loc", ()) if p not in ("body", "query", "path"))
            problems.append(f"{where}: {e.get('msg', 'invalid')}" if where else str(e.get("msg")))
        return JSONResponse({"error": _one_line("; ".join(problems))}, status_code=422)

    @app.exception_handler(OperationalError)
    def database_down(_request: Request, err: OperationalError) -> JSONResponse:
        return JSONResponse({"error": _one_line(f"database unavailable: {err.orig}")}, status_code=503)

    @app.exception_handler(StarletteHTTPException)
    def http_error(_request: Request, err: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": _one_line(str(err.detail))}, status_code=err.status_code)


def _one_line(message: str) -> str:
    return " ".join(message.split())
