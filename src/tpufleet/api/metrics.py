"""``GET /metrics`` (Prometheus exposition) and ``GET /api/v1/cost``.

``/metrics`` wants a bearer token as every route does (Prometheus: ``authorization:
{credentials_file: ...}``), the admin token or a ``metrics``-scope one, and answers
prometheus_client's text format from the app's registry (``app.state.metrics``: the control
plane's, ``observe.registry``) and the API's own count of failed authentications.
``/api/v1/cost`` is the report behind ``tpufleet cost``: the admin sees every tenant (or one,
``?tenant=``), a tenant's token its own; the app's :class:`CostReports` (``app.state.cost_reports``)
keeps the all-time totals between reports and reuses a recent answer.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tpufleet import pricing
from tpufleet.api import auth
from tpufleet.api.deps import API, Db, Who
from tpufleet.api.errormap import responses
from tpufleet.control.store.facade import Store
from tpufleet.control.store.usage import Usage
from tpufleet.control.store.values import TENANT_NAME
from tpufleet.errors import ForbiddenError, SpecError
from tpufleet.observe import cost

__all__ = ["COST_CACHE_S", "CostReports", "router"]

COST_CACHE_S = 15.0  # a cost report is reused while nothing changed, for at most this long


class CostReports:
    """One app's cost reports over ``store`` at ``prices``: the all-time totals kept between
    reports (``cost.AllTime``), and the last answers (at most 16), each reused while no event was
    recorded since, for at most ``COST_CACHE_S``."""

    def __init__(self, store: Store, prices: pricing.PriceTable) -> None:
        self.usage = Usage(store)
        self.prices = prices
        self.alltime = cost.AllTime(self.usage, prices)
        self.answers: dict[tuple[object, ...], dict[str, Any]] = {}

    def report(self, tenant: str | None, window: float | None, now: float) -> dict[str, Any]:
        """The report of ``tenant`` (None: every tenant) over the last ``window`` seconds (None:
        all time), as ``GET /api/v1/cost`` answers it."""
        # The same question with no change since (no new event) within COST_CACHE_S is answered
        # from memory: the fleet page asks every few seconds, and the report reads every attempt.
        key = (tenant, window, self.usage.last_event(), int(now // COST_CACHE_S))
        cached = self.answers.get(key)
        if cached is not None:
            return cached
        if window is None:  # all time: kept between reports, only what changed is read again
            got = self.alltime.report(tenant)
        else:
            start = now - window
            rows = self.usage.attempts(tenant=tenant, since=start, lean=True)
            got = cost.report(rows, self.prices, self.usage.slice_pricing(), now=now, since=start)
        self.answers[key] = answer = got.to_dict()
        while len(self.answers) > 16:
            self.answers.pop(next(iter(self.answers)))
        return answer


router = APIRouter()


@router.get(
    "/metrics",
    tags=["metrics"],
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {}}, "description": "Prometheus text exposition format"},
        **responses(403),
    },
)
def metrics(me: Who, request: Request) -> Response:
    """Prometheus metrics (``tpufleet_*``; docs/observability.md), for the admin token or a
    ``metrics`` token. Computed from the store at scrape time; ``tpufleet_auth_failures_total``
    (by ``reason``) from the API's own count (``authguard.py``)."""
    guard = request.app.state.auth_guard
    try:
        auth.require_metrics_reader(me)
    except ForbiddenError:
        guard.failed(request.client.host if request.client else "unknown", "scope", "GET", "/metrics")
        raise
    body = generate_latest(request.app.state.metrics) + generate_latest(guard.registry())
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.get(f"{API}/cost", tags=["cost"], responses=responses(400, 403, 422))
def cost_report(
    me: Who,
    store: Db,
    request: Request,
    tenant: Annotated[str | None, Query(description="one tenant (a tenant's token: its own)")] = None,
    since: Annotated[
        str | None, Query(description="only chip time after now minus this: 7d, 12h, 30m, or seconds")
    ] = None,
) -> dict[str, Any]:
    """Chip-hours, dollars and dollars lost to badput, per tenant and per job, from the attempt
    records; ``prices`` is the table used (an unknown price leaves dollars null, never 0)."""
    scope = auth.job_scope(me)
    if scope is not None and tenant not in (None, scope):
        raise ForbiddenError(f"your token is for tenant {scope!r}; it cannot read {tenant[:63]!r}'s cost")
    if tenant is not None and not TENANT_NAME.fullmatch(tenant):
        raise SpecError(f"{tenant[:70]!r} is not a tenant name", field="tenant")
    window = cost.parse_duration(since) if since is not None else None
    reports: CostReports = request.app.state.cost_reports
    return reports.report(scope or tenant, window, store.clock())
