"""``GET /metrics`` (Prometheus exposition), ``GET /api/v1/cost`` and the goodput on job views.

``install(app, store, registry)`` adds the routes; ``create_app`` calls it. ``/metrics`` wants a
bearer token as every route does (Prometheus: ``authorization: {credentials_file: ...}``), the
admin token or a ``metrics``-scope one, and answers prometheus_client's text format from the
control plane's registry (``observe.registry``). ``/api/v1/cost`` is the report behind ``tpufleet
cost``: the admin sees every tenant (or one, ``?tenant=``), a tenant's token its own.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from tpufleet import pricing
from tpufleet.api import auth
from tpufleet.control.store.facade import Store
from tpufleet.control.store.usage import Usage
from tpufleet.control.store.values import TENANT_NAME, JobRecord, Principal
from tpufleet.errors import ForbiddenError, SpecError
from tpufleet.observe import cost, goodput
from tpufleet.observe.registry import metrics_registry

__all__ = ["COST_CACHE_S", "install", "job_with_goodput", "jobs_with_goodput"]

COST_CACHE_S = 15.0  # a cost report is reused while nothing changed, for at most this long


def install(
    app: FastAPI,
    store: Store,
    *,
    who: Any,
    errors: Any,
    registry: CollectorRegistry | None = None,
    prices: pricing.PriceTable | None = None,
) -> None:
    """Add ``/metrics`` and ``/api/v1/cost`` to ``app``. ``who`` is the app's authentication
    dependency, ``errors`` its ``responses=`` helper; ``registry`` defaults to the store's metrics
    (``observe.registry.metrics_registry``) and ``prices`` to the shipped table."""
    app.state.metrics = registry if registry is not None else metrics_registry(store, prices=prices)
    app.state.prices = prices or pricing.shipped()
    usage = Usage(store)
    reports: dict[tuple[object, ...], dict[str, Any]] = {}
    alltime = cost.AllTime(usage, app.state.prices)

    @app.get(
        "/metrics",
        tags=["metrics"],
        response_class=Response,
        responses={
            200: {"content": {"text/plain": {}}, "description": "Prometheus text exposition format"},
            **errors(403),
        },
    )
    def metrics(request: Request) -> Response:
        """Prometheus metrics (``tpufleet_*``; docs/observability.md), for the admin token or a
        ``metrics`` token. Computed from the store at scrape time; ``tpufleet_auth_failures_total``
        (by ``reason``) from the API's own count (``authguard.py``)."""
        me: Principal = who(request)
        guard = request.app.state.auth_guard
        try:
            auth.require_metrics_reader(me)
        except ForbiddenError:
            guard.failed(request.client.host if request.client else "unknown", "scope", "GET", "/metrics")
            raise
        body = generate_latest(request.app.state.metrics) + generate_latest(guard.registry())
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    router = APIRouter()

    @router.get("/cost", tags=["cost"], responses=errors(400, 403, 422))
    def cost_report(
        request: Request,
        tenant: Annotated[str | None, Query(description="one tenant (a tenant's token: its own)")] = None,
        since: Annotated[
            str | None, Query(description="only chip time after now minus this: 7d, 12h, 30m, or seconds")
        ] = None,
    ) -> dict[str, Any]:
        """Chip-hours, dollars and dollars lost to badput, per tenant and per job, from the attempt
        records; ``prices`` is the table used (an unknown price leaves dollars null, never 0)."""
        me: Principal = who(request)
        scope = auth.job_scope(me)
        if scope is not None and tenant not in (None, scope):
            raise ForbiddenError(f"your token is for tenant {scope!r}; it cannot read {tenant[:63]!r}'s cost")
        if tenant is not None and not TENANT_NAME.fullmatch(tenant):
            raise SpecError(f"{tenant[:70]!r} is not a tenant name", field="tenant")
        window = cost.parse_duration(since) if since is not None else None
        now = store.clock()
        # The same question with no change since (no new event) within COST_CACHE_S is answered
        # from memory: the fleet page asks every few seconds, and the report reads every attempt.
        key = (scope or tenant, window, usage.last_event(), int(now // COST_CACHE_S))
        cached = reports.get(key)
        if cached is not None:
            return cached
        if window is None:  # all time: kept between reports, only what changed is read again
            got = alltime.report(scope or tenant)
        else:
            start = now - window
            rows = usage.attempts(tenant=scope or tenant, since=start, lean=True)
            got = cost.report(rows, request.app.state.prices, usage.slice_pricing(), now=now, since=start)
        reports[key] = answer = got.to_dict()
        while len(reports) > 16:
            reports.pop(next(iter(reports)))
        return answer

    app.include_router(router, prefix="/api/v1")


def job_with_goodput(job: JobRecord, now: float) -> dict[str, Any]:
    """A job's JSON with its ``goodput`` (``observe/goodput.py``; ``ratio`` null when it reports no
    steps)."""
    return {**job.to_dict(), "goodput": goodput.job_goodput(job.attempts, now).to_dict()}


def jobs_with_goodput(store: Store, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Listed jobs (``to_dict``s) with their ``goodput``: one query for the attempts of the page."""
    if not items:
        return items
    by_job: dict[str, list[Any]] = defaultdict(list)
    for a in Usage(store).attempts(job_ids=[j["id"] for j in items], lean=True):
        by_job[a.job_id].append(a)
    now = store.clock()
    return [{**j, "goodput": goodput.job_goodput(by_job.get(j["id"], []), now).to_dict()} for j in items]
