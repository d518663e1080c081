"""Tokens: who may call the API. Ids, scopes (``admin``, ``jobs``, ``metrics``), revocation, admin
rotation; composed into :class:`~tpufleet.control.store.facade.Store` as ``store.tokens``.

Tokens are stored only hashed (SHA-256: a token is 32 random bytes, so no salt or stretching is
needed). A revoked token is refused from the next request on. Last use is written at most once a
minute per token, never a write per request. Every change is an event with ``actor`` (the audit
log: ``Database.audit_events``). Rules: ``docs/control-plane.md``, "Operating tenants".
"""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tpufleet.control.store import values as r
from tpufleet.control.store.database import Database
from tpufleet.control.store.lookup import live_tenant_row, tenant_row
from tpufleet.control.store.tables import TokenRow
from tpufleet.errors import AuthError, ConflictError, NotFoundError, SpecError

__all__ = ["LAST_USE_EVERY_S", "TokenStore", "add_token", "new_token", "revoke_all", "token_hash"]

LAST_USE_EVERY_S = 60.0  # a token's last_used_at is written at most this often


def new_token() -> str:
    return "tf_" + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token_id() -> str:
    """Twelve hex digits: how listings, events and ``token revoke`` name a token."""
    return secrets.token_hex(6)


def add_token(s: Session, tenant: str | None, scope: str, now: float) -> tuple[TokenRow, str]:
    """A new token row in ``s`` (its id drawn until unused): the row and the secret, shown once."""
    token = new_token()
    token_id = new_token_id()
    while s.scalar(select(TokenRow.id).where(TokenRow.id == token_id)) is not None:
        token_id = new_token_id()
    row = TokenRow(
        token_hash=token_hash(token),
        id=token_id,
        tenant=tenant,
        scope=scope,
        created_at=now,
        last_used_at=None,
        revoked_at=None,
    )
    s.add(row)
    s.flush()
    return row, token


def revoke_all(s: Session, tenant: str, now: float) -> int:
    """Revoke every working token of ``tenant`` in ``s`` (its deletion); how many were."""
    rows = list(s.scalars(select(TokenRow).where(TokenRow.tenant == tenant, TokenRow.revoked_at.is_(None))))
    for t in rows:
        t.revoked_at = now
    return len(rows)


class TokenStore:
    """Tokens in the database ``db``: issue, create, authenticate, list, revoke, rotate the admin's."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def issue(self, tenant: str | None = None, scope: str | None = None) -> str:
        """A new token for ``tenant`` (None: admin); only its hash is stored. No event (the
        control plane's own first admin token); :meth:`create` is the audited way."""
        with self._db.tx() as s:
            _, token = add_token(s, tenant, scope or _default_scope(tenant), self._db.clock())
        return token

    def create(
        self, tenant: str, scope: str = r.JOBS_SCOPE, *, actor: str = "admin"
    ) -> tuple[r.TokenRecord, str]:
        """A new ``jobs`` or ``metrics`` token for a live tenant: its record and the secret (shown once)."""
        if scope not in r.TOKEN_SCOPES:
            raise SpecError(
                f"{str(scope)[:40]!r} is not a token scope; use {' or '.join(r.TOKEN_SCOPES)}", field="scope"
            )
        with self._db.tx() as s:
            live_tenant_row(s, tenant)
            row, token = add_token(s, tenant, scope, self._db.clock())
            self._db.add_event(
                s, f"token {row.id} ({scope}) created", kind="token", tenant=tenant, actor=actor
            )
            return _token(row), token

    def authenticate(self, token: str | None) -> r.Principal:
        """Who ``token`` is (AuthError: missing, unknown or revoked); its last use noted."""
        if not token:
            raise AuthError("missing bearer token; pass --token or set TPUFLEET_TOKEN", reason="missing")
        with self._db.tx() as s:
            row = s.get(TokenRow, token_hash(token))
            if row is None:
                raise AuthError("unknown token; ask the admin for a tenant token (tpufleet tenant create)")
            if row.revoked_at is not None:
                raise AuthError(
                    "this token was revoked; ask the admin for a new one (tpufleet token create)",
                    reason="revoked",
                )
            now = self._db.clock()
            if row.last_used_at is None or now - row.last_used_at >= LAST_USE_EVERY_S:
                row.last_used_at = now
            return r.Principal(tenant=row.tenant, scope=row.scope, token_id=row.id)

    def all(self, tenant: str | None = None) -> list[r.TokenRecord]:
        """The tokens that work (revoked ones are left out), oldest first; ``tenant``: only its."""
        query = select(TokenRow).where(TokenRow.revoked_at.is_(None))
        with self._db.tx() as s:
            if tenant is not None:
                tenant_row(s, tenant)
                query = query.where(TokenRow.tenant == tenant)
            rows = s.scalars(query.order_by(TokenRow.created_at, TokenRow.id))
            return [_token(t) for t in rows]

    def revoke(self, token_id: str, *, actor: str = "admin") -> r.TokenRecord:
        """Revoke a token by id: refused from the next request on. The last admin token is not
        revoked (:meth:`rotate_admin` replaces it); revoking a revoked token changes nothing."""
        with self._db.tx() as s:
            row = s.scalar(select(TokenRow).where(TokenRow.id == token_id)) if _short(token_id) else None
            if row is None:
                shown = token_id if len(token_id) <= 40 else token_id[:37] + "..."
                raise NotFoundError(f"token {shown!r} not found; list tokens with `tpufleet tokens`")
            if row.revoked_at is not None:
                return _token(row)
            if row.scope == r.ADMIN_SCOPE and _live_admin_tokens(s) <= 1:
                raise ConflictError(
                    f"token {row.id} is the last admin token; replace it with `tpufleet token rotate-admin`"
                )
            row.revoked_at = self._db.clock()
            self._db.add_event(
                s, f"token {row.id} ({row.scope}) revoked", kind="token", tenant=row.tenant, actor=actor
            )
            return _token(row)

    def rotate_admin(self, *, actor: str = "admin") -> tuple[r.TokenRecord, str, int]:
        """A new admin token; every other admin token is revoked in the same transaction.
        Returns the new token's record, its secret and how many were revoked."""
        with self._db.tx() as s:
            now = self._db.clock()
            old = list(
                s.scalars(
                    select(TokenRow).where(TokenRow.scope == r.ADMIN_SCOPE, TokenRow.revoked_at.is_(None))
                )
            )
            row, token = add_token(s, None, r.ADMIN_SCOPE, now)
            for t in old:
                t.revoked_at = now
            revoked = ", ".join(t.id for t in old) or "none"
            self._db.add_event(
                s, f"admin token rotated: {row.id} created, revoked {revoked}", kind="token", actor=actor
            )
            return _token(row), token, len(old)


def _live_admin_tokens(s: Session) -> int:
    query = select(func.count()).where(TokenRow.scope == r.ADMIN_SCOPE, TokenRow.revoked_at.is_(None))
    return int(s.scalar(query.select_from(TokenRow)) or 0)


def _default_scope(tenant: str | None) -> str:
    return r.ADMIN_SCOPE if tenant is None else r.JOBS_SCOPE


def _short(value: str) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 16 and "\0" not in value


def _token(t: TokenRow) -> r.TokenRecord:
    return r.TokenRecord(
        id=t.id, tenant=t.tenant, scope=t.scope, created_at=t.created_at, last_used_at=t.last_used_at
    )
