"""The API's dependencies, the same for every router: the store, the caller, the loop's wake-up.

One way to authenticate (:func:`principal`): the bearer token (``auth.py``) checked by the store
and against its scope, every failure counted, logged and slowed by the app's
:class:`~tpufleet.api.authguard.AuthGuard` (``app.state.auth_guard``). A route takes ``me: Who``
and checks what it needs of the caller (``auth.require_admin``, ``auth.job_scope``); a router
that is the admin's alone says so once (``dependencies=[AdminOnly]``), so a tenant's token is
refused before its body is read. ``Db`` is the app's store, and :func:`changed` wakes the
scheduling loop after a change (``create_app(on_change=...)``). Nothing here imports a router or
the app.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request
from starlette.requests import HTTPConnection

from tpufleet.api import auth
from tpufleet.api.authguard import AuthGuard
from tpufleet.control.store.facade import Store
from tpufleet.control.store.values import Principal
from tpufleet.errors import AuthError, ForbiddenError

__all__ = ["API", "AdminOnly", "Db", "Who", "changed", "principal", "principal_of", "store"]

API = "/api/v1"


def store(request: Request) -> Store:
    """The app's store (``create_app(store)``)."""
    db: Store = request.app.state.store
    return db


def principal(request: Request) -> Principal:
    """The caller, or the error: 401 for no or a wrong token (429 instead while its address is over
    the failure limit), 403 for a token out of its scope; each failure is counted and logged
    (``authguard.py``). A valid token always passes, whoever else shares its address."""
    return principal_of(request, lambda: auth.bearer_token(request))


def principal_of(request: HTTPConnection, token: Callable[[], str | None]) -> Principal:
    """:func:`principal` with the token read by ``token()`` (``rayjobs.py``: where Ray's clients
    send it), for a request or a WebSocket."""
    guard: AuthGuard = request.app.state.auth_guard
    address = request.client.host if request.client else "unknown"
    method = request.scope.get("method", "WEBSOCKET")
    try:
        db: Store = request.app.state.store
        who = db.tokens.authenticate(token())
        auth.check_scope(who, request.url.path)
    except AuthError as err:
        guard.check(address)
        guard.failed(address, err.reason, method, request.url.path)
        raise
    except ForbiddenError:
        guard.failed(address, "scope", method, request.url.path)
        raise
    return who


Who = Annotated[Principal, Depends(principal)]
Db = Annotated[Store, Depends(store)]


def admin(me: Who) -> Principal:
    """The caller if it holds the admin token (403 otherwise)."""
    auth.require_admin(me)
    return me


AdminOnly = Depends(admin)


def changed(request: Request) -> None:
    """Wake the scheduling loop: something it schedules by has changed."""
    request.app.state.on_change()
