"""The REST API: ``create_app(store)`` -> a FastAPI app with routes under ``/api/v1`` and ``/healthz``,
and, with Ray jobs on, Ray's own job submission API under ``/ray`` (``rayjobs.py``).

This module only assembles: the app's state, the body cap, the error mapping and one router per
resource, each added the same way (its routes, built once per process), in the order of ``ROUTERS`` (the order
of the OpenAPI schema's paths). The routes are thin: parse (pydantic v2, strict: no string or
boolean is coerced to a number), authenticate (``deps.py``: one dependency for every router, over
``auth.py`` and ``authguard.py``), call the store, return JSON.

Everything a caller sends is untrusted: bodies are capped before they are read whole (``Limits``,
``limits.py``, 413), job fields are validated by :meth:`JobRequest.build` (the one path into the
store, ``jobs.py``), and a tenant asking for another tenant's job gets the same 404 as for a job
that does not exist. The scheduling loop is told about changes through ``on_change`` (it wakes up
instead of waiting for its next tick). Every error is ``{"error": "<one line>"}`` with the status
of its :class:`~tpufleet.errors.TpufleetError` (400 bad input, 401, 403, 404, 409, 413 body too
large, 415, 422 malformed body, 429 too many failed authentications from one address, 503 cluster
or database trouble), and the OpenAPI schema (``/openapi.json``) declares them (``errormap.py``).
There is no ``/docs`` or ``/redoc``: FastAPI's pages load scripts from a public CDN, on the fleet
page's origin where the signed-in token lives.

No answer grows with what a tenant stored: listings carry cut job bodies, a page of them is capped
in bytes (``control/store/listing.py``), logs are streamed (``logstream.py``), and failed
authentications are counted, logged and slowed (``authguard.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI

import tpufleet
from tpufleet import pricing
from tpufleet.api import (
    errormap,
    events,
    health,
    jobs,
    metrics,
    packages,
    page,
    rayjobs,
    slicegroups,
    slices,
    tenants,
    tokens,
)
from tpufleet.api.authguard import AuthGuard
from tpufleet.api.deps import API
from tpufleet.api.limits import BodyLimit
from tpufleet.api.metrics import CostReports
from tpufleet.api.watch import JobChanges
from tpufleet.control.store.facade import Store
from tpufleet.control.store.values import Limits
from tpufleet.observe.registry import metrics_registry

__all__ = ["API", "ROUTERS", "create_app"]

ROUTERS: tuple[APIRouter, ...] = (
    health.router,  # /healthz, /api/v1/whoami, /api/v1/status
    tenants.router,
    tokens.router,
    events.router,
    slices.router,  # /api/v1/slices, /api/v1/fleet
    packages.router,
    jobs.router,
    metrics.router,  # /metrics, /api/v1/cost
    slicegroups.router,
    rayjobs.router,  # /ray: Ray's job submission API (serve --allow-ray-jobs; not in the OpenAPI schema)
    page.router,  # the fleet page at / (static files only; its data comes from /api/v1 with a token)
)


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
    provider: str | None = None,
    job_changes: JobChanges | None = None,
) -> FastAPI:
    """The API over ``store``. ``status`` is the loop's health (``cycles``, ``stalled``,
    ``last_error``, ``cycle_ms_last``, ``cycle_ms_p50``; missing keys read as their defaults):
    ``/healthz`` shows only whether it cycles, ``GET /api/v1/status`` (admin) all of it. ``limits``:
    the caps on what callers send, set on the store too (default: the store's). ``metrics``: the
    ``CollectorRegistry`` ``GET /metrics`` serves (default: the store's, ``observe.registry``);
    ``prices``: the ``pricing.PriceTable`` for cost (default: the shipped one). ``admin_token_path``:
    the file ``POST /api/v1/tokens/rotate-admin`` writes the new admin token to (mode 0600).
    ``auth_guard``: counts and slows failed authentications (default: 10 a minute per address).
    ``provider``: the kind of provider that makes slices (``serve --provider``); without one, asking
    for a slice group is refused (409) and deleting one no provider made removes it at once.
    ``job_changes``: what the scheduling loop tells of the jobs it moved, for the long-polled job
    reads (``watch.py``; default: one that only the API's own cancels wake)."""
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
    app.state.job_changes = job_changes or JobChanges()  # wakes long-polled job reads (watch.py)
    app.state.admin_token_path = admin_token_path
    app.state.provider = provider
    app.state.status = lambda: {**health.STATUS_DEFAULTS, **(status() or {})}
    app.state.duty_cycles = dict  # the fleet view's measured duty cycles (ControlPlane: its sampler's)
    app.state.metrics = metrics if metrics is not None else metrics_registry(store, prices=prices)
    app.state.prices = prices or pricing.shipped()
    app.state.cost_reports = CostReports(store, app.state.prices)
    app.add_middleware(
        BodyLimit,
        limits=app.state.limits,
        upload_path=f"{API}/packages",
        upload_prefixes=(f"{rayjobs.PREFIX}/api/packages/",),
        batch_path=f"{API}/jobs/batch",
    )
    errormap.install(app)
    for router in ROUTERS:
        # The routers' own routes, as they are: each was built once, when its module was imported
        # (prefix, tags and dependencies included), and holds nothing of an app. FastAPI's
        # include_router would wrap each router and build all its routes again for every app, at
        # the app's first requests (~40 ms of CPU per app; the tests make thousands of apps).
        app.router.routes.extend(router.routes)
    return app
