"""The API's one error mapping: every error as ``{"error": "<one line>"}`` with its status, and the
OpenAPI ``responses`` each route declares (:func:`responses`). Routers import this; nothing here
imports a router or the app."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy.exc import DataError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from tpufleet.api.authguard import TooManyFailures
from tpufleet.errors import AuthError, ClusterError, TpufleetError


class ErrorBody(BaseModel):
    error: str = Field(description="one line: what was wrong and what is accepted")


_WHY = {
    400: "bad input",
    401: "missing or unknown bearer token",
    403: "the token may not do this",
    404: "no such object (or another tenant's)",
    409: "conflicts with the object's state or a cap",
    413: "request body over the cap",
    415: "wrong Content-Type",
    422: "malformed body or parameters",
    429: "too many failed authentications from this address; see Retry-After",
    503: "database or cluster unavailable",
}


def responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for the errors a route really returns (every /api/v1 route: 401, 429, 503)."""
    return {c: {"model": ErrorBody, "description": _WHY[c]} for c in sorted({401, 429, 503, *codes})}


def install(app: FastAPI) -> None:
    """Every error as ``{"error": "<one line>"}``."""

    @app.exception_handler(TpufleetError)
    def tpufleet_error(_request: Request, err: TpufleetError) -> JSONResponse:
        headers = {}
        if isinstance(err, ClusterError | TooManyFailures) and err.retry_after is not None:
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

    @app.exception_handler(DataError)
    def unstorable(_request: Request, _err: DataError) -> JSONResponse:
        return JSONResponse({"error": "a value the database cannot store (e.g. a NUL character)"}, 400)

    @app.exception_handler(OperationalError)
    def database_down(_request: Request, err: OperationalError) -> JSONResponse:
        return JSONResponse({"error": _one_line(f"database unavailable: {err.orig}")}, status_code=503)

    @app.exception_handler(StarletteHTTPException)
    def http_error(_request: Request, err: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": _one_line(str(err.detail))}, status_code=err.status_code)


def _one_line(message: str) -> str:
    return " ".join(message.split())
