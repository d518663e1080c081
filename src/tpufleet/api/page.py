"""The live fleet page: ``/`` and its two files, served without a token, with a strict CSP.

The page is static (``api/static/``: plain HTML, JS and CSS shipped as package data; no build
step). It holds no data: it asks the person for a token, keeps it in ``sessionStorage`` (never in
a URL), and reads ``GET /api/v1/fleet``, ``GET /api/v1/jobs/{id}`` and its logs with an
``Authorization: Bearer`` header, so it sees exactly what that token may see. Only the files named
in ``FILES`` are served (no directory is exposed). The Content-Security-Policy allows scripts,
styles and connections to this origin only: no inline script, no third-party origin, no frames.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}
FILES = {  # URL path -> (file in api/static/, media type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/fleet.js": ("fleet.js", "text/javascript; charset=utf-8"),
    "/fleet.css": ("fleet.css", "text/css; charset=utf-8"),
}


@cache
def _read(name: str) -> bytes:
    return resources.files("tpufleet.api").joinpath("static", name).read_bytes()


def _handler(name: str, media: str) -> Callable[[], Response]:
    def serve() -> Response:
        return Response(_read(name), media_type=media, headers=HEADERS)

    serve.__name__ = f"page_{name.replace('.', '_')}"
    return serve


def _router() -> APIRouter:
    """``/``, ``/fleet.js`` and ``/fleet.css`` (left out of the OpenAPI schema)."""
    out = APIRouter()
    for path, (name, media) in FILES.items():
        out.add_api_route(path, _handler(name, media), methods=["GET"], include_in_schema=False)
    return out


router = _router()
