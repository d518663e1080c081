"""Fixtures for every kind of test (tests/unit, tests/host, tests/conformance, tests/integration,
tests/e2e); what they build lives in tests/support/, which pytest puts on ``sys.path``.

- Every test, and every process a test starts, runs with its own CLI context and no cloud access.
  ``TPUFLEET_CONFIG`` points at a file in a session temp dir, so ``tpufleet emulate up`` and
  ``tpufleet serve`` run by a test never write the user's ``~/.config/tpufleet/config.yaml``, and a
  context the user has never changes what a test does. google-auth never probes a GCE metadata
  server: ``NO_GCE_CHECK`` (lowercase ``true`` is what google-auth reads) and both metadata
  addresses point at a closed local port.
- Databases: every store test runs on SQLite and on a real PostgreSQL server (``db_url``, ``store``;
  tests/support/dbserver.py). Without PostgreSQL the PostgreSQL cases skip with the reason, except
  under ``make test`` (``TPUFLEET_REQUIRE_POSTGRES=1``), where they fail: CI never passes without
  having tested the store on PostgreSQL.
- The ONE emulated TPU fleet that the Ray tests of a session share (``fleet``, ``ray_client``), here
  so that tests/integration and tests/conformance's Ray cases see the same one.
- Tests in tests/unit and tests/host run without Ray (``_no_ray_cluster``).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dbserver import PG_HINT, PostgresServer, pg_bindir

from tpufleet.control.cluster.memory import FakeClock
from tpufleet.control.store.facade import Store
from tpufleet.emulator import EmulatedFleet
from tpufleet.emulator.plan import JAX_CACHE_VAR

NO_CLOUD = {"NO_GCE_CHECK": "true", "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9"}


@pytest.fixture(autouse=True, scope="session")
def _isolated_cli_context() -> Iterator[Path]:
    saved = {k: os.environ.get(k) for k in ("TPUFLEET_CONFIG", *NO_CLOUD)}
    with tempfile.TemporaryDirectory(prefix="tpufleet-ctx-") as tmp:
        path = Path(tmp) / "config.yaml"
        os.environ.update({"TPUFLEET_CONFIG": str(path), **NO_CLOUD})
        try:
            yield path
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


# -- databases --------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    bindir = pg_bindir()
    if bindir is None and os.environ.get("TPUFLEET_REQUIRE_POSTGRES"):
        pytest.fail(f"PostgreSQL required (TPUFLEET_REQUIRE_POSTGRES is set, as in make test); {PG_HINT}")
    if bindir is None:
        pytest.skip(f"PostgreSQL SKIPPED: initdb not found under /usr/lib/postgresql/*/bin; {PG_HINT}")
    server = PostgresServer(bindir)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database for a store: a new SQLite file, or a PostgreSQL database whose schema is at
    head already (what ``Store.open`` makes of an empty one). Tests of the schema itself take
    ``empty_db_url``."""
    return _database(request, tmp_path, migrated=True)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database: a new SQLite file or PostgreSQL database."""
    return _database(request, tmp_path, migrated=False)


@pytest.fixture(scope="session")
def _sqlite_at_head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head once per process, copied for each test that wants one: running
    every migration again for each of ~1,000 tests was a tenth of the unit tests' time."""
    path = tmp_path_factory.mktemp("sqlite-template") / "tpufleet.db"
    Store.open(f"sqlite:///{path}").close()
    return path


def _database(request: pytest.FixtureRequest, tmp_path: Path, *, migrated: bool) -> str:
    if request.param == "sqlite":
        path = tmp_path / "tpufleet.db"
        if migrated:
            shutil.copyfile(request.getfixturevalue("_sqlite_at_head"), path)
        return f"sqlite:///{path}"
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.new_database(migrated=migrated)


class Ids:
    """Readable, predictable job ids: 00000001, 00000002, ..."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> str:
        self.n += 1
        return f"{self.n:08x}"


@pytest.fixture
def ids() -> Ids:
    return Ids()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(db_url: str, clock: FakeClock, ids: Ids) -> Iterator[Store]:
    s = Store.open(db_url, clock=clock, new_id=ids)
    yield s
    s.close()


# -- the shared emulated fleet ----------------------------------------------------------------------
# Fixtures (names are stable; other test modules rely on them):
#
# - ``fleet`` (session): a running :class:`tpufleet.emulator.EmulatedFleet` with ``FLEET_SLICES``
#   = two ``v4-16`` slices (``tpu-v4-16-0``, ``tpu-v4-16-1``; 2 hosts x 4 chips each) and one
#   ``v6e-4`` (``tpu-v6e-4-0``; 1 host x 4 chips), each host with ``CPUS_PER_HOST`` logical CPUs.
#   Started on first use, stopped (every PID) at the end of the session. Tests may break it
#   (``fleet.kill_host(slice, worker)``, ``fleet.preempt(slice)``): after each test that used it,
#   ``_heal_fleet`` restores every host that is down, so the next test sees a whole fleet.
# - ``ray_client`` (session): this process connected to the fleet with ``ray.init`` (once); yields
#   the ``RayContext``. Tests must release what they reserve (placement groups, detached actors).
#
# The fleet runs with Ray token authentication: ``fleet`` sets ``RAY_AUTH_MODE`` and
# ``RAY_AUTH_TOKEN_PATH`` (``fleet.client_env()``) in this process's environment, so ``ray.init``
# here and every subprocess a test starts (``tpufleet`` CLI calls, scripts) connect. A test that
# wants an unauthenticated client removes them from the child's environment.
#
# Set ``TPUFLEET_TEST_FLEET_DIR`` to the state dir of a fleet you started yourself
# (``tpufleet emulate up --slices v4-16:2,v6e-4 --cpus-per-host 2 --state-dir DIR``) to reuse it
# across runs while iterating; it is then left running.
FLEET_SLICES = "v4-16:2,v6e-4"
CPUS_PER_HOST = 2


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedFleet]:
    reuse = os.environ.get("TPUFLEET_TEST_FLEET_DIR")
    if reuse:
        yield EmulatedFleet.attach(reuse).authenticate()
        return
    state_dir = tmp_path_factory.mktemp("fleet")
    # One JAX compilation cache for every fleet of the run (scripts/side-by-side-tests.sh makes one
    # for its three pytest processes); without it, this worker's own.
    os.environ.setdefault(JAX_CACHE_VAR, str(tmp_path_factory.mktemp("jax-cache")))
    f = EmulatedFleet(FLEET_SLICES, cpus_per_host=CPUS_PER_HOST, state_dir=state_dir).up()  # authenticates
    try:
        yield f
    finally:
        f.down()


@pytest.fixture(scope="session")
def ray_client(fleet: EmulatedFleet) -> Iterator[Any]:
    import ray

    fleet.authenticate()  # a no-op unless a test switched this process to another fleet's token
    ctx = ray.init(address=fleet.ray_address, logging_level="ERROR")
    try:
        yield ctx
    finally:
        ray.shutdown()


@pytest.fixture(autouse=True)
def _heal_fleet(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used the fleet, bring back every host it killed or preempted."""
    yield
    f = request.node.funcargs.get("fleet")  # None or another fixture of that name (tests/host's sandbox)
    if not isinstance(f, EmulatedFleet):
        return
    for slice_name in f.down_hosts():
        f.restore(slice_name)


@pytest.fixture(autouse=True)
def _no_ray_cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    """Unit and host tests run without Ray: a test whose code reached a Ray API that connects on first use
    (``placement_group_table``, ``ray.get``: Ray starts a local cluster for it) fails, naming
    itself, and the cluster is stopped, instead of leaving it to the tests that follow in this
    process (one such test made a later one, which checks what happens without Ray, fail)."""
    yield
    if request.node.path.parent.name not in ("unit", "host"):
        return
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
        pytest.fail(f"{request.node.nodeid} started a Ray cluster; give the code a stand-in for that call")
