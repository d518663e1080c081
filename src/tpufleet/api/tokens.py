"""``/api/v1/tokens``: create, list and revoke tokens, and rotate the admin token (admin)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from tpufleet.api import auth
from tpufleet.api.deps import API, Db, Who
from tpufleet.api.errormap import responses

__all__ = ["TokenCreate", "router"]


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    tenant: str = Field(description="the tenant the token is for")
    scope: str = Field("jobs", description="jobs (the tenant's jobs) or metrics (only GET /metrics)")


router = APIRouter(prefix=API)


@router.post("/tokens", status_code=201, tags=["tokens"], responses=responses(400, 403, 404, 409, 422))
def create_token(body: TokenCreate, me: Who, store: Db) -> dict[str, Any]:
    """A new token for a tenant (admin): scope ``jobs`` or ``metrics``. The secret is in the
    answer (``token``), and only there."""
    auth.require_admin(me)
    record, token = store.tokens.create(body.tenant, body.scope, actor=me.actor)
    return {**record.to_dict(), "token": token}


@router.get("/tokens", tags=["tokens"], responses=responses(403, 404, 422))
def list_tokens(
    me: Who,
    store: Db,
    tenant: Annotated[str | None, Query(description="only this tenant's tokens")] = None,
) -> list[dict[str, Any]]:
    """Tokens that work (admin): id, tenant, scope, created and last-used times; never a secret.
    Last use is recorded at most once a minute per token."""
    auth.require_admin(me)
    return [t.to_dict() for t in store.tokens.all(tenant)]


@router.post("/tokens/rotate-admin", tags=["tokens"], responses=responses(403))
def rotate_admin(me: Who, store: Db, request: Request) -> dict[str, Any]:
    """A new admin token; every other admin token is revoked at once (admin). The server writes it
    to its ``<state-dir>/admin-token`` (mode 0600, ``path``); the answer has it too (``token``)."""
    auth.require_admin(me)
    record, token, revoked = store.tokens.rotate_admin(actor=me.actor)
    path: Path | None = request.app.state.admin_token_path
    if path is not None:
        auth.write_token_file(path, token)
    return {**record.to_dict(), "token": token, "revoked": revoked, "path": str(path) if path else None}


@router.post("/tokens/{token_id}/revoke", tags=["tokens"], responses=responses(403, 404, 409, 422))
def revoke_token(token_id: str, me: Who, store: Db) -> dict[str, Any]:
    """Revoke a token by id (admin): every request with it is a 401 from now on. The last admin
    token is not revoked (409: rotate it instead)."""
    auth.require_admin(me)
    return store.tokens.revoke(token_id, actor=me.actor).to_dict()
