"""Bearer tokens: who is calling, and what they may touch.

The admin token manages tenants, tokens and slices and sees every job; a tenant's token (scope
``jobs``) sees and changes only that tenant's jobs (403 otherwise); a ``metrics`` token may only
read ``GET /metrics`` (403 everywhere else, see :func:`check_scope`); a missing, unknown or revoked
token is 401. Tokens are stored only as SHA-256 hashes (``control/store/tokens.py``); the plain token is
shown once, when it is created.
"""

from __future__ import annotations

import os
from pathlib import Path

from starlette.requests import HTTPConnection

from tpufleet.control.store.facade import Store
from tpufleet.control.store.values import ADMIN_SCOPE, METRICS_SCOPE, Principal
from tpufleet.errors import AuthError, ForbiddenError, SpecError

METRICS_PATHS = frozenset({"/metrics", "/api/v1/metrics"})  # all a metrics-scope token may read


def bearer_token(conn: HTTPConnection, headers: tuple[str, ...] = ("authorization",)) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (the first of ``headers`` that is
    there: Ray's clients may send ``X-Ray-Authorization`` in the same form), or None."""
    header = next((value for name in headers if (value := conn.headers.get(name))), "")
    scheme, _, token = header.partition(" ")
    if not header:
        return None
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthError("the Authorization header must be 'Bearer <token>'")
    return token.strip()


def require_admin(who: Principal) -> None:
    if not who.admin:
        raise ForbiddenError(f"this needs the admin token; your token is for tenant {who.tenant!r}")


def check_scope(who: Principal, path: str) -> None:
    """Every authenticated route checks this: a ``metrics`` token reads ``GET /metrics`` and nothing else."""
    if who.scope == METRICS_SCOPE and path not in METRICS_PATHS:
        raise ForbiddenError("a metrics token may only read GET /metrics; use a jobs or admin token for this")


def require_metrics_reader(who: Principal) -> None:
    """``GET /metrics``: the admin token or a ``metrics``-scope token (a tenant's jobs token: 403)."""
    if who.scope not in (ADMIN_SCOPE, METRICS_SCOPE):
        raise ForbiddenError(
            "reading metrics needs the admin token or a metrics token (tpufleet token create --tenant T "
            "--scope metrics)"
        )


def job_scope(who: Principal) -> str | None:
    """The tenant whose jobs a caller may see: its own, or None (all) for the admin."""
    return who.tenant


def submit_tenant(who: Principal, requested: str | None) -> str:
    """The tenant a job is submitted for: the caller's own; the admin names one."""
    if who.admin:
        if not requested:
            raise SpecError(
                "the admin token submits on behalf of a tenant: name it with `tpufleet submit --tenant "
                'NAME` (in the API: "tenant" in the job body); `tpufleet tenants` lists them',
                field="tenant",
            )
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
            if store.tokens.authenticate(token).admin:
                return token, False
        except AuthError:
            pass
    token = store.tokens.issue(tenant=None)
    write_token_file(path, token)
    return token, True


def write_token_file(path: Path, token: str) -> None:
    """Write ``token`` to ``path``, mode 0600 from the start, replacing the file atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
