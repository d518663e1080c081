"""``/api/v1/tenants``: create, list, read, change and delete tenants (admin; a tenant reads its own)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from tpufleet.api import auth
from tpufleet.api.deps import API, Db, Who, changed
from tpufleet.api.errormap import responses
from tpufleet.control.store.values import PREEMPTION_MODES

__all__ = ["TenantCreate", "TenantUpdate", "router"]


class TenantCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field(description="lowercase letters, digits and '-', 1 to 63 characters")
    quota: dict[str, int] = Field(
        default_factory=dict, description="nominal chips per generation (0 to 1,000,000), e.g. {'v4': 32}"
    )
    weight: float = Field(1.0, description="fair-share weight, above 0 and at most 1000")
    preemption: str = Field(
        PREEMPTION_MODES[0],
        description="lower_priority: its higher-priority jobs may preempt its own lower-priority ones; never",
    )


class TenantUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    quota: dict[str, int] | None = Field(
        None, description="merged per generation: the generations given are set, 0 removes one"
    )
    weight: float | None = Field(None, description="fair-share weight, above 0 and at most 1000")
    preemption: str | None = Field(None, description="lower_priority or never")


router = APIRouter(prefix=API)


@router.post("/tenants", status_code=201, tags=["tenants"], responses=responses(400, 403, 409, 413, 422))
def create_tenant(body: TenantCreate, me: Who, store: Db, request: Request) -> dict[str, Any]:
    """Create a tenant (admin). Its token is in the answer, and only there. The name of a deleted
    tenant stays taken (409)."""
    auth.require_admin(me)
    tenant, token = store.tenants.create(body.name, body.quota, body.weight, body.preemption, actor=me.actor)
    changed(request)
    return {**tenant.to_dict(), "token": token}


@router.get("/tenants", tags=["tenants"], responses=responses(403, 422))
def list_tenants(
    me: Who,
    store: Db,
    include_deleted: Annotated[
        bool, Query(description="also deleted tenants (state deleting or deleted)")
    ] = False,
) -> list[dict[str, Any]]:
    """Live tenants by name (admin), each with its ``checkpoints`` usage and quota;
    ``include_deleted=true`` adds the deleted ones."""
    auth.require_admin(me)
    return [t.to_dict() for t in store.tenants.all(include_deleted=include_deleted)]


@router.get("/tenants/{name}", tags=["tenants"], responses=responses(403, 404, 422))
def get_tenant(name: str, me: Who, store: Db) -> dict[str, Any]:
    """One tenant (admin; a tenant's own token reads its own), live or deleted: ``state`` is active,
    deleting or deleted; ``checkpoints``: its checkpoint directory as a host last measured it
    (``used_bytes``, ``measured_at``, ``complete``) and the quota (``quota_bytes``, null: none)."""
    if me.admin or me.tenant != name:
        auth.require_admin(me)
    return store.tenants.get(name).to_dict()


@router.patch("/tenants/{name}", tags=["tenants"], responses=responses(400, 403, 404, 409, 422))
def update_tenant(name: str, body: TenantUpdate, me: Who, store: Db, request: Request) -> dict[str, Any]:
    """Change a tenant's quota (merged per generation; 0 removes one), weight or preemption
    setting (admin). Used from the scheduling loop's next cycle; lowering a quota below what the
    tenant holds stops nothing: the excess counts as borrowed, reclaimable by other tenants."""
    auth.require_admin(me)
    out = store.tenants.update(
        name, quota=body.quota, weight=body.weight, preemption=body.preemption, actor=me.actor
    ).to_dict()
    changed(request)
    return out


@router.delete("/tenants/{name}", tags=["tenants"], responses=responses(403, 404, 409, 422))
def delete_tenant(
    name: str,
    me: Who,
    store: Db,
    request: Request,
    force: Annotated[
        bool, Query(description="cancel its queued and running jobs (checkpoint signal, grace) first")
    ] = False,
) -> dict[str, Any]:
    """Delete a tenant (admin): 409 naming its queued and running jobs unless ``force``. Soft:
    its jobs, attempts, logs and events stay readable to the admin; its tokens stop working; its
    name stays taken. ``state`` is ``deleting`` while cancelled jobs still stop, then ``deleted``;
    ``cancelled``: the jobs this call cancelled."""
    auth.require_admin(me)
    tenant, cancelled = store.tenants.delete(name, force=force, actor=me.actor)
    changed(request)
    return {**tenant.to_dict(), "cancelled": cancelled}
