"""``GET /api/v1/events``: the audit log, a page at a time (the admin's, or a tenant's own)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from tpufleet.api import auth
from tpufleet.api.cursor import decode_cursor, encode_cursor
from tpufleet.api.deps import API, Db, Who
from tpufleet.api.errormap import responses
from tpufleet.control.store.values import PAGE_DEFAULT, PAGE_MAX, TENANT_NAME
from tpufleet.errors import ForbiddenError, SpecError

__all__ = ["EventPage", "router"]


class EventPage(BaseModel):
    items: list[dict[str, Any]]
    next: str | None = Field(description="pass as ?after= for the next page; null on the last page")


router = APIRouter(prefix=API)


@router.get("/events", tags=["events"], response_model=EventPage, responses=responses(400, 403, 422))
def list_events(
    me: Who,
    store: Db,
    tenant: Annotated[str | None, Query(description="admin: one tenant's events")] = None,
    limit: Annotated[
        int,
        Query(ge=1, le=PAGE_MAX, description=f"events per page: default {PAGE_DEFAULT}, at most {PAGE_MAX}"),
    ] = PAGE_DEFAULT,
    after: Annotated[str | None, Query(description="the `next` of the previous page")] = None,
) -> dict[str, Any]:
    """The audit log, oldest first, a page at a time (``{"items", "next"}`` as ``GET /jobs``):
    tenant and token changes, cancels, drains and preemptions, each with ``actor`` (``admin``, a
    token id, or ``scheduler``) and ``tenant``. A tenant's token reads only its own tenant's."""
    if not me.admin and tenant is not None and tenant != me.tenant:
        raise ForbiddenError(f"your token is for tenant {me.tenant!r}; it reads only its own tenant's events")
    scope = auth.job_scope(me) or tenant
    if scope is not None and not TENANT_NAME.fullmatch(scope):
        raise SpecError(f"{scope[:70]!r} is not a tenant name", field="tenant")
    items, last = store.audit_events(scope, limit=limit, after=decode_cursor(after))
    return {"items": [e.to_dict() for e in items], "next": None if last is None else encode_cursor(last)}
