"""``/api/v1/slices`` and ``/api/v1/fleet``: the slices and their state, the fleet view, drains."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from tpufleet.api import auth
from tpufleet.api.deps import API, Db, Who, changed
from tpufleet.api.errormap import responses
from tpufleet.api.jobviews import jobs_with_goodput
from tpufleet.control.store.fleetview import fleet_view
from tpufleet.control.store.values import ACTIVE

__all__ = ["router"]

router = APIRouter(prefix=API)


@router.get("/slices", tags=["slices"], responses=responses())
def list_slices(me: Who, store: Db) -> list[dict[str, Any]]:
    """Every slice and its state; a tenant's token sees the holder only of its own jobs (another
    tenant's job id shows as null, the slice still HELD)."""
    rows = [s.to_dict() for s in store.slices.all()]
    scope = auth.job_scope(me)
    if scope is not None:
        own = {j.id for j in store.jobs.all(tenant=scope, states=ACTIVE)}
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
    view = fleet_view(store, me, duty=request.app.state.duty_cycles())
    view["active"] = jobs_with_goodput(store, view["active"])
    view["recent"] = jobs_with_goodput(store, view["recent"])
    return view


@router.post("/slices/{name}/drain", tags=["slices"], responses=responses(403, 404, 422))
def drain(name: str, me: Who, store: Db, request: Request) -> dict[str, Any]:
    """Place no new job on the slice (admin); its current holder runs to the end."""
    auth.require_admin(me)
    out = store.slices.set_draining(name, True, actor=me.actor).to_dict()
    changed(request)
    return out


@router.post("/slices/{name}/undrain", tags=["slices"], responses=responses(403, 404, 422))
def undrain(name: str, me: Who, store: Db, request: Request) -> dict[str, Any]:
    auth.require_admin(me)
    out = store.slices.set_draining(name, False, actor=me.actor).to_dict()
    changed(request)
    return out
