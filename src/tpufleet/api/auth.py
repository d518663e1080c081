"""Bearer tokens: who is calling, and what they may touch.

The admin token manages tenants and slices and sees every job; a tenant's token sees and changes
only that tenant's jobs (403 otherwise); a missing or unknown token is 401. Tokens are stored only
as SHA-256 hashes (``control/store.py``); the plain token is shown once, when it is created.
"""

from __future__ import annotations

import os
from pathlib import Path

from fastapi import Request

from tpufleet.control.records import Principal
from tpufleet.control.store import Store
from tpufleet.errors import AuthError, ForbiddenError, SpecError

ADMIN_TOKEN_FILE = "admin-token"


def bearer_token(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        return None
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthError("the Authorization header must be 'Bearer <token>'")
    return token.strip()


def require_admin(who: Principal) -> None:
    if not who.admin:
        raise ForbiddenError(f"this needs the admin token; your token is for tenant {who.tenant!r}")


def job_scope(who: Principal) -> str | None:
    """The tenant whose jobs a caller may see: its own, or None (all) for the admin."""
    return who.tenant


def submit_tenant(who: Principal, requested: str | None) -> str:
    """The tenant a job is submitted for: the caller's own; the admin names one."""
    if who.admin:
        if not requested:
            raise SpecError("the admin token submits on behalf of a tenant: give tenant", field="tenant")
        return requested
    if requested and requested != who.tenant:
        raise ForbiddenError(f"your token is for tenant {who.tenant!r}; it cannot submit for {requested!r}")
    assert who.tenant is not None
    return who.tenant


def ensure_admin_token(store: Store, path: Path) -> tuple[str, bool]:
    """The admin token in ``path`` if it is valid, else a new one written there (mode 0600).

    Returns (token, created). A database that already has admin tokens keeps them; the file always
    holds one that works.
    """
    if path.exists():
        token = path.read_text().strip()
        try:
            if store.authenticate(token).admin:
                return token, False
        except AuthError:
            pass
    token = store.issue_token(tenant=None)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.chmod(path, 0o600)
    return token, True
