"""``/healthz`` (no token), ``GET /api/v1/whoami`` and ``GET /api/v1/status`` (admin).

``app.state.status()`` is the scheduling loop's health (``create_app(status=...)``), its missing
keys read as ``STATUS_DEFAULTS``: ``/healthz`` shows only whether the loop cycles and the database
answers, never any error text; ``/api/v1/status`` shows all of it, with the fleet's counts.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

import tpufleet
from tpufleet.api import auth
from tpufleet.api.deps import API, Db, Who
from tpufleet.api.errormap import responses

__all__ = ["STATUS_DEFAULTS", "Health", "router"]

STATUS_DEFAULTS: dict[str, Any] = {
    "cycles": 0,
    "stalled": False,
    "last_error": None,
    "cycle_ms_last": None,
    "cycle_ms_p50": None,
    "leader": True,
    "leader_since": None,
    "replica": None,
    "leader_replica": None,
    "fenced_writes": 0,
}


class Health(BaseModel):
    status: str = Field(description="ok, or stalled when the scheduling loop is not cycling")
    version: str
    cycles: int
    leader: bool = Field(description="true on the replica that leads (runs the loop); false on a standby")
    leader_replica: str | None = Field(
        description="the replica that leads now (hostname:pid:random); null while none holds the lease"
    )


router = APIRouter()


@router.get("/healthz", tags=["health"], response_model=Health, responses={503: {"model": Health}})
def healthz(store: Db, request: Request) -> JSONResponse:
    """Unauthenticated liveness: ``ok``, or ``stalled`` (503) when the scheduling loop is not
    cycling or the database does not answer. Never any error text (see ``GET /api/v1/status``).
    ``leader``: whether this replica leads; ``leader_replica``: which one does (a standby is
    ``ok``: it serves the whole API)."""
    try:
        info = request.app.state.status()
        store.ping()
        stalled = bool(info["stalled"])
        cycles = int(info["cycles"] or 0)
        leader, leader_replica = bool(info["leader"]), info["leader_replica"]
    except Exception:
        stalled, cycles, leader, leader_replica = True, 0, False, None
    body = {
        "status": "stalled" if stalled else "ok",
        "version": tpufleet.__version__,
        "cycles": cycles,
        "leader": leader,
        "leader_replica": leader_replica,
    }
    return JSONResponse(body, status_code=503 if stalled else 200)


@router.get(f"{API}/whoami", tags=["auth"], responses=responses())
def whoami(me: Who) -> dict[str, Any]:
    return {"tenant": me.tenant, "admin": me.admin, "scope": me.scope, "token_id": me.token_id}


@router.get(f"{API}/status", tags=["health"], responses=responses(403))
def scheduler_status(me: Who, store: Db, request: Request) -> dict[str, Any]:
    """The loop's figures and the fleet's counts (admin): ``queued``, ``running`` (jobs holding
    slices), ``cycles``, ``cycle_ms_last``, ``cycle_ms_p50``, ``slices`` (count by state),
    ``stalled``, ``last_error``; and who leads: ``leader`` (true on the replica that runs the loop),
    ``leader_since``, ``replica`` (this one), ``leader_replica``, ``fenced_writes``."""
    auth.require_admin(me)
    return {**request.app.state.status(), **store.counts()}
