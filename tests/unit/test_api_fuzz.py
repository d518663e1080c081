"""Property-based fuzzing of the whole API from its own OpenAPI schema (schemathesis, in-process over
ASGI): as the admin and as a tenant, no request the schema allows may get a 5xx, a status code the
schema does not declare, or a body outside the declared schema. Bounded: a few dozen examples per
operation, derandomized so a failure reproduces."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks

from tpufleet.api.app import create_app
from tpufleet.control.store.facade import Store
from tpufleet.control.store.tables import SliceRow
from tpufleet.control.store.values import JobRequest

CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.response_headers_conformance,
]


@schemathesis.serializer("application/zip")
def _zip_bytes(ctx: object, value: object) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _fleet(path: Path) -> tuple[Store, dict[str, str]]:
    """A store with a tenant, a queued job and a slice, and an admin and a tenant token."""
    store = Store.open(f"sqlite:///{path}")
    _, tenant = store.tenants.create("team-a", {"v4": 16})
    store.jobs.submit("team-a", JobRequest.build(command=["python", "t.py"], accelerator_type="v4-16"))
    with store.tx() as s:
        s.add(
            SliceRow(
                name="tpu-v4-16-0",
                accelerator_type="v4-16",
                topology="2x2x2",
                expected_hosts=2,
                state="FREE",
                hosts=[],
                problems=[],
                draining=False,
                updated_at=0.0,
            )
        )
    return store, {"admin": store.tokens.issue(), "tenant": tenant}


# schemathesis reads the schema when the tests are collected, so the app exists at import, in every
# pytest process that collects this module (each xdist worker): each removes its folder as it exits,
# whether or not it ran any of these tests (the fixture below, which closes the store, runs only where
# one ran).
_DIR = Path(tempfile.mkdtemp(prefix="tpufleet-fuzz-"))
atexit.register(shutil.rmtree, _DIR, ignore_errors=True)
STORE, TOKENS = _fleet(_DIR / "fleet.db")
schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(STORE))


# Session scope: under ``--dist worksteal`` a worker may run this module's tests, move on (which would
# end a module-scoped fixture), then steal more of them; the store must outlive that.
@pytest.fixture(scope="session", autouse=True)
def _close_store() -> Iterator[None]:
    yield
    STORE.close()


FUZZ = settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)


@schema.parametrize()
@FUZZ
def test_the_api_keeps_to_its_schema_for_the_admin(case: schemathesis.Case) -> None:
    case.call_and_validate(headers={"Authorization": f"Bearer {TOKENS['admin']}"}, checks=CHECKS)


@schema.parametrize()
@FUZZ
def test_the_api_keeps_to_its_schema_for_a_tenant(case: schemathesis.Case) -> None:
    case.call_and_validate(headers={"Authorization": f"Bearer {TOKENS['tenant']}"}, checks=CHECKS)
