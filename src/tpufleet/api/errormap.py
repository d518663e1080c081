"""The API's one error mapping: every error as ``{"error": "<one line>"}`` with its status, and the
OpenAPI ``responses`` each route declares (:func:`responses`). Routers import this; nothing here
imports a router or the app.

An unknown field in a request body names the closest valid one (``num_slice: unknown field
'num_slice'; did you mean num_slices?``), as a fleet spec's typo does: the valid names are the
fields of the body's model, found from the route's endpoint (:func:`unknown_body_field`)."""

from __future__ import annotations

import typing
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy.exc import DataError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute

from tpufleet.api.authguard import TooManyFailures
from tpufleet.errors import AuthError, ClusterError, TpufleetError, unknown_field


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
    def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        problems = []
        for e in err.errors()[:3]:
            loc = tuple(e.get("loc", ()))
            where = ".".join(str(p) for p in loc if p not in ("body", "query", "path"))
            typo = e.get("type") == "extra_forbidden"
            msg = (typo and unknown_body_field(request.scope.get("route"), loc)) or e.get("msg", "invalid")
            problems.append(f"{where}: {msg}" if where else str(msg))
        return JSONResponse({"error": _one_line("; ".join(problems))}, status_code=422)

    @app.exception_handler(DataError)
    def unstorable(_request: Request, _err: DataError) -> JSONResponse:
        return JSONResponse({"error": "a value the database cannot store (e.g. a NUL character)"}, 400)

    @app.exception_handler(OperationalError)
    def database_down(_request: Request, err: OperationalError) -> JSONResponse:
        return JSONResponse({"error": _one_line(f"database unavailable: {err.orig}")}, status_code=503)

    @app.exception_handler(StarletteHTTPException)
    def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        detail, path = str(err.detail), request.url.path[:200]
        if err.status_code == 404 and detail == "Not Found":  # no route: say which was asked for
            detail = f"no such path on this server: {request.method} {path}"
        elif err.status_code == 405 and detail == "Method Not Allowed":
            detail = f"{request.method} is not allowed on {path}"
        return JSONResponse({"error": _one_line(detail)}, status_code=err.status_code, headers=err.headers)


def unknown_body_field(route: BaseRoute | None, loc: tuple[Any, ...]) -> str | None:
    """``unknown field 'num_slice'; did you mean num_slices?`` for a key of a JSON body (``loc``:
    a validation error's, ``("body", "num_slice")``) that the body's model does not have; None
    where the model cannot be told (not a key of the body itself; a route whose endpoint does not
    take exactly one pydantic model)."""
    if len(loc) != 2 or loc[0] != "body":
        return None
    model = _body_model(route)
    return None if model is None else unknown_field(loc[1], model.model_fields)


def _body_model(route: BaseRoute | None) -> type[BaseModel] | None:
    """The one pydantic model among the route's endpoint parameters (its JSON body), or None."""
    endpoint = getattr(route, "endpoint", None)
    try:
        hints = typing.get_type_hints(endpoint) if endpoint is not None else {}
    except (NameError, TypeError):  # an annotation that does not resolve: no suggestion, not an error
        return None
    hints.pop("return", None)
    models = [h for h in hints.values() if isinstance(h, type) and issubclass(h, BaseModel)]
    return models[0] if len(models) == 1 else None


def _one_line(message: str) -> str:
    return " ".join(message.split())
