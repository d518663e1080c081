"""``/ray``: Ray's job submission API, served by tpufleet, so ``ray job submit --address
http://HOST:PORT/ray`` and ``JobSubmissionClient`` work unchanged against the queue (docs/ray-jobs.md).

The routes are Ray 2.60's job head's (dashboard/modules/job/job_head.py), with its request and
answer shapes, under ``/ray``: the version check, the package check and upload that
``--working-dir`` uses, submit, list, status, stop, delete, logs, and the log tail (a WebSocket)
that ``ray job submit`` and ``ray job logs -f`` follow. Each calls the path the rest of the API
takes: ``JobRequest.build`` and ``store.ray.submit`` (the tenant's caps and package), the store's
packages, ``request_cancel``, the stored logs. What Ray's words mean here is ``raysubmit.py``.

**Who.** The caller's tpufleet token, where Ray's clients send one: ``Authorization: Bearer`` (set
by ``RAY_JOB_HEADERS`` / ``--headers``, or by Ray itself with ``RAY_AUTH_MODE=token`` and
``RAY_AUTH_TOKEN``) or ``X-Ray-Authorization``. As Ray answers: no token is a 401, a wrong one a
403, each naming what to set; a tenant sees, stops and deletes only its own submissions (another
tenant's id "does not exist"). **Errors** are one line of plain text, as Ray's job head writes
them (its clients print the body). Served only with ``serve --allow-ray-jobs``: else every route
is a 404 saying so.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine, Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection
from starlette.websockets import WebSocketDisconnect

from tpufleet.api import auth, raysubmit
from tpufleet.api.authguard import TooManyFailures
from tpufleet.api.deps import principal_of
from tpufleet.control.store import logs
from tpufleet.control.store.facade import Store
from tpufleet.control.store.raysubmissions import RaySubmission
from tpufleet.control.store.values import TERMINAL, JobRequest, LogRead, Principal
from tpufleet.errors import AuthError, ConflictError, NotFoundError, SpecError, TpufleetError

__all__ = ["PREFIX", "router"]

PREFIX = "/ray"
TOKEN_HINT = (
    'set RAY_JOB_HEADERS=\'{"Authorization": "Bearer <tpufleet token>"}\' (or ray job --headers), or '
    "RAY_AUTH_MODE=token with RAY_AUTH_TOKEN=<tpufleet token>"
)
TAIL_POLL_S = 0.5  # how often the log tail reads the store (app.state.ray_tail_poll_s overrides)
TAIL_SETTLE_S = 10.0  # after the job ended, how long the tail waits for its log's last lines


class NotServed(NotFoundError):
    pass


class _PlainErrors(APIRoute):
    """Every error of a route as Ray's job head writes it: one line of plain text with its status."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def plain(request: Request) -> Response:
            try:
                return await handler(request)
            except TpufleetError as err:
                return _plain(err)
            except RequestValidationError as err:
                first = err.errors()[0] if err.errors() else {}
                where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
                return PlainTextResponse(f"{where}: {first.get('msg', 'invalid')}", status_code=400)

        return plain


def _plain(err: TpufleetError) -> Response:
    headers = {}
    if isinstance(err, TooManyFailures) and err.retry_after is not None:
        headers["Retry-After"] = str(max(1, round(err.retry_after)))
    return PlainTextResponse(" ".join(str(err).split()), status_code=err.http_status, headers=headers)


def caller(conn: HTTPConnection) -> Principal:
    """The caller of a ``/ray`` route: 404 where Ray jobs are off, 401 without a token, 403 with a
    wrong one or one out of its scope (Ray's clients explain 401 and 403 themselves)."""
    if not conn.app.state.limits.ray_jobs:
        raise NotServed(
            "Ray's job API is not served here: the operator enables Ray jobs with "
            "tpufleet serve --allow-ray-jobs"
        )
    try:
        return principal_of(conn, lambda: auth.bearer_token(conn, ("authorization", "x-ray-authorization")))
    except AuthError as err:
        if err.reason == "missing":
            raise AuthError(f"no tpufleet token: {TOKEN_HINT}", reason="missing") from None
        raise _Forbidden(f"{err} ({TOKEN_HINT})") from None


class _Forbidden(TpufleetError):
    http_status = 403


RayWho = Annotated[Principal, Depends(caller)]
router = APIRouter(prefix=PREFIX, route_class=_PlainErrors, tags=["ray"], include_in_schema=False)


def _store(conn: HTTPConnection) -> Store:
    db: Store = conn.app.state.store
    return db


@router.get("/api/version")
def version(me: RayWho) -> dict[str, str]:
    """Ray's ``VersionResponse``: the job API version and the Ray this control plane speaks."""
    return {
        "version": raysubmit.JOBS_API_VERSION,
        "ray_version": raysubmit.RAY_VERSION,
        "ray_commit": "",
        "session_name": "tpufleet",
    }


def _package_uri(protocol: str, name: str) -> str:
    if protocol != "gcs" or not raysubmit.RAY_PACKAGE.fullmatch(name):
        raise SpecError(
            f"{protocol[:10]}://{name[:80]} is not a package URI Ray's client makes (gcs://_ray_pkg_<hash>.zip)"
        )
    return f"{protocol}://{name}"


@router.get("/api/packages/{protocol}/{package_name}")
def package_exists(protocol: str, package_name: str, me: RayWho, request: Request) -> Response:
    """200 when the caller uploaded this package (and it is still stored), else 404: the client uploads it."""
    uri = _package_uri(protocol, package_name)
    if me.tenant is None or _store(request).ray.package(me.tenant, uri) is None:
        return PlainTextResponse(f"Package {uri} does not exist", status_code=404)
    return Response()


@router.put("/api/packages/{protocol}/{package_name}")
async def upload_package(protocol: str, package_name: str, me: RayWho, request: Request) -> Response:
    """Store the zip as the caller's package (the checks and quota of ``POST /api/v1/packages``)."""
    uri = _package_uri(protocol, package_name)
    if me.tenant is None:
        raise SpecError("upload packages with the tenant's token: a package belongs to a tenant")
    data = await request.body()
    await run_in_threadpool(_store(request).ray.put_package, me.tenant, uri, data)
    return Response()


def _example(store: Store) -> str:
    """A slice type the fleet has, for a refusal's example (v4-16 when it has none)."""
    return next((s.accelerator_type for s in store.slices.all()), "v4-16")


@router.post("/api/jobs/")
def submit(body: raysubmit.JobSubmitBody, me: RayWho, request: Request) -> dict[str, str]:
    """Ray's submit: the body becomes a tpufleet Ray job (``raysubmit.translate``), queued for the
    caller as ``POST /api/v1/jobs`` queues one. Answers ``{"job_id", "submission_id"}`` (both the
    submission id, as Ray answers)."""
    store = _store(request)
    named = (body.metadata or {}).get(raysubmit.META + "tenant")
    if me.admin and not named:
        raise SpecError(
            f"the admin token submits on behalf of a tenant: name it in the metadata, e.g. "
            f"""--metadata-json '{{"{raysubmit.META}tenant": "NAME"}}'; `tpufleet tenants` lists them""",
            field="metadata",
        )
    owner = auth.submit_tenant(me, named)
    got = raysubmit.translate(
        body, package_of=lambda uri: store.ray.package(owner, uri), example=lambda: _example(store)
    )
    limits = request.app.state.limits
    sub = store.ray.submit(
        owner,
        got.submission_id,
        JobRequest.build(**got.fields, limits=limits),
        entrypoint=got.entrypoint,
        metadata=got.metadata,
        runtime_env=got.runtime_env,
    )
    request.app.state.on_change()
    return {"job_id": sub.submission_id, "submission_id": sub.submission_id}


@router.get("/api/jobs/")
def list_jobs(me: RayWho, request: Request) -> list[dict[str, Any]]:
    """The caller's submissions (the admin: everyone's), the newest 1,000, oldest first."""
    return [raysubmit.details(s) for s in _store(request).ray.all(auth.job_scope(me))]


def _find(request: HTTPConnection, me: Principal, submission_id: str) -> RaySubmission:
    return _store(request).ray.get(submission_id, auth.job_scope(me))


@router.get("/api/jobs/{submission_id}")
def job_info(submission_id: str, me: RayWho, request: Request) -> dict[str, Any]:
    return raysubmit.details(_find(request, me, submission_id))


@router.post("/api/jobs/{submission_id}/stop")
def stop(submission_id: str, me: RayWho, request: Request) -> dict[str, bool]:
    """Cancel the job (``request_cancel``, as ``tpufleet cancel``): ``stopped`` is false when it had
    already ended, as Ray answers."""
    sub = _find(request, me, submission_id)
    if sub.job.state in TERMINAL:
        return {"stopped": False}
    try:
        _store(request).jobs.request_cancel(sub.job.id, tenant=auth.job_scope(me), actor=me.actor)
    except ConflictError:  # it ended meanwhile
        return {"stopped": False}
    request.app.state.on_change()
    return {"stopped": True}


@router.delete("/api/jobs/{submission_id}")
def delete(submission_id: str, me: RayWho, request: Request) -> dict[str, bool]:
    """Forget an ended submission (Ray refuses a running one); the tpufleet job stays listed."""
    _store(request).ray.delete(submission_id, auth.job_scope(me))
    return {"deleted": True}


def _driver_log(
    store: Store, job_id: str, scope: str | None, attempt: int | None, offset: int
) -> tuple[LogRead, logs.Span | None]:
    """The driver's log (host 0 of the attempt, by default the latest that ran) from ``offset``."""
    read, spans = store.jobs.plan_logs(job_id, tenant=scope, attempt=attempt, host=0, offset=offset)
    return read, (spans[0] if spans else None)


@router.get("/api/jobs/{submission_id}/logs")
def job_logs(submission_id: str, me: RayWho, request: Request) -> StreamingResponse:
    """Ray's ``{"logs": ...}``: the driver's output of the latest attempt, streamed from the store."""
    store = _store(request)
    sub = _find(request, me, submission_id)
    _read, span = _driver_log(store, sub.job.id, auth.job_scope(me), None, 0)

    def body() -> Iterator[bytes]:
        yield b'{"logs":"'
        for piece in logs.stored_text(store, span) if span else ():
            yield json.dumps(piece, ensure_ascii=False)[1:-1].encode("utf-8", "replace")
        yield b'"}'

    return StreamingResponse(body(), media_type="application/json")


@router.get("/api/jobs/{submission_id}/logs/tail")
def tail_without_websocket(submission_id: str, me: RayWho) -> Response:
    """What a log tail gets where the server could not upgrade to a WebSocket (no WebSocket library)."""
    return PlainTextResponse(
        "the log tail is a WebSocket, and this server has no WebSocket library (pip install websockets)",
        status_code=501,
    )


@router.websocket("/api/jobs/{submission_id}/logs/tail")
async def tail(websocket: WebSocket, submission_id: str) -> None:
    """The driver's output as it is stored, a message per read, until the job has ended and its log
    is complete; then a normal close (the client then reads the status). A later attempt's log
    follows the earlier one's."""
    try:
        me = caller(websocket)
        sub = await run_in_threadpool(_find, websocket, me, submission_id)
    except TpufleetError as err:
        try:
            await websocket.send_denial_response(_plain(err))
        except RuntimeError:  # a server without the denial extension: a policy-violation close
            await websocket.close(code=1008, reason=str(err)[:120])
        return
    await websocket.accept()
    if await follow_until_gone(websocket, _store(websocket), sub.job.id, auth.job_scope(me)):
        await websocket.close()


async def follow_until_gone(ws: WebSocket, store: Store, job_id: str, scope: str | None) -> bool:
    """Follow the job's log on ``ws`` until it ends (True) or the client goes (False): a tail of a
    job queued for hours must not outlive its client."""
    follow = asyncio.ensure_future(_follow(ws, store, job_id, scope))
    gone = asyncio.ensure_future(_until_gone(ws))
    done, pending = await asyncio.wait({follow, gone}, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    if follow not in done:
        return False
    try:
        follow.result()
    except WebSocketDisconnect:
        return False
    return True


async def _until_gone(ws: WebSocket) -> None:
    """Return when the client has gone (a tail of a job queued for hours must not outlive it)."""
    while (await ws.receive())["type"] != "websocket.disconnect":
        pass


def _text(store: Store, span: logs.Span) -> str:
    return "".join(logs.stored_text(store, span))


async def _follow(ws: WebSocket, store: Store, job_id: str, scope: str | None) -> None:
    """Send the driver's log as it grows: the attempt that ran first, then each later one's."""
    poll = getattr(ws.app.state, "ray_tail_poll_s", TAIL_POLL_S)
    attempt: int | None = None  # the attempt followed (None: none ran yet)
    offset, settle = 0, TAIL_SETTLE_S
    while True:
        read, span = await run_in_threadpool(_driver_log, store, job_id, scope, attempt, offset)
        if span is not None and span.end > span.start:
            text = await run_in_threadpool(_text, store, span)
            if text:
                await ws.send_text(text)
            offset = span.end
        host = read.hosts[0] if read.hosts else None
        if host is not None:
            attempt = read.attempt
        if host is not None and host.complete:
            latest, _ = await run_in_threadpool(_driver_log, store, job_id, scope, None, 0)
            if latest.attempt != attempt:  # a later attempt ran: follow its log from its start
                attempt, offset = latest.attempt, 0
                continue
        job = await run_in_threadpool(store.jobs.get, job_id, scope)
        if job.state in TERMINAL:
            if host is None or host.complete or settle <= 0:
                return
            settle -= poll
        await asyncio.sleep(poll)
