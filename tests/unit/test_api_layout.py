"""The API's shape, checked: ``api/app.py`` only assembles, one router per resource, one way to
authenticate, and no router reaches back to the app.

- Every route comes from a router in ``app.ROUTERS``, added with ``app.include_router``; none is
  defined in ``app.py``.
- Every route in the OpenAPI schema but ``/healthz`` depends on ``deps.principal`` (the token
  checked against its scope, failures counted and slowed), and nothing else authenticates.
- No module of ``api/`` but ``server.py`` (which starts the app) imports ``api/app.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grimp
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, APIWebSocketRoute

from tpufleet.api import app as app_module
from tpufleet.api import deps
from tpufleet.api.app import ROUTERS, create_app
from tpufleet.control.store.facade import Store


def _routes() -> Iterator[APIRoute]:
    for router in ROUTERS:
        for route in router.routes:
            if isinstance(route, APIWebSocketRoute):  # Ray's log tail: authenticates in its body
                continue
            assert isinstance(route, APIRoute), route
            yield route


def _calls(dependant: Dependant) -> Iterator[Callable[..., Any]]:
    for sub in dependant.dependencies:
        if sub.call is not None:
            yield sub.call
        yield from _calls(sub)


def test_every_route_comes_from_a_router_of_its_own_module(store: Store) -> None:
    routed = {(r.path, m) for r in _routes() for m in r.methods}
    in_schema = {
        (path, method.upper()) for path, ops in create_app(store).openapi()["paths"].items() for method in ops
    }
    assert in_schema <= routed
    assert {r.endpoint.__module__ for r in _routes()}.isdisjoint({app_module.__name__})
    assert len({id(r) for r in ROUTERS}) == len(ROUTERS)


def test_every_route_but_healthz_authenticates_through_the_one_dependency() -> None:
    unauthenticated = sorted(
        f"{sorted(r.methods)} {r.path}"
        for r in _routes()
        if r.include_in_schema and deps.principal not in set(_calls(r.dependant))
    )
    assert unauthenticated == ["['GET'] /healthz"]


def test_no_module_of_the_api_imports_the_app_but_the_servers() -> None:
    graph = grimp.build_graph("tpufleet", exclude_type_checking_imports=False)
    importers = graph.find_modules_that_directly_import("tpufleet.api.app")
    servers = {"tpufleet.api.server", "tpufleet.api.processes"}  # serve's, and its API processes'
    assert {m for m in importers if m.startswith("tpufleet.api.")} == servers
