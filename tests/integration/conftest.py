"""The ONE emulated TPU fleet every integration test of a pytest session shares.

Fixtures (names are stable; other test modules rely on them):

- ``fleet`` (session): a running :class:`tpufleet.emulator.EmulatedFleet` with ``FLEET_SLICES``
  = two ``v4-16`` slices (``tpu-v4-16-0``, ``tpu-v4-16-1``; 2 hosts x 4 chips each) and one
  ``v6e-4`` (``tpu-v6e-4-0``; 1 host x 4 chips), each host with ``CPUS_PER_HOST`` logical CPUs.
  Started on first use, stopped (every PID) at the end of the session. Tests may break it
  (``fleet.kill_host(slice, worker)``, ``fleet.preempt(slice)``): after each test that used it,
  ``_heal_fleet`` restores every host that is down, so the next test sees a whole fleet.
- ``ray_client`` (session): this process connected to the fleet with ``ray.init`` (once); yields
  the ``RayContext``. Tests must release what they reserve (placement groups, detached actors).

The fleet runs with Ray token authentication: ``fleet`` sets ``RAY_AUTH_MODE`` and
``RAY_AUTH_TOKEN_PATH`` (``fleet.client_env()``) in this process's environment, so ``ray.init``
here and every subprocess a test starts (``tpufleet`` CLI calls, scripts) connect. A test that
wants an unauthenticated client removes them from the child's environment.

Set ``TPUFLEET_TEST_FLEET_DIR`` to the state dir of a fleet you started yourself
(``tpufleet emulate up --slices v4-16:2,v6e-4 --cpus-per-host 2 --state-dir DIR``) to reuse it
across runs while iterating; it is then left running.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tpufleet.emulator import EmulatedFleet

FLEET_SLICES = "v4-16:2,v6e-4"
CPUS_PER_HOST = 2


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedFleet]:
    reuse = os.environ.get("TPUFLEET_TEST_FLEET_DIR")
    if reuse:
        yield EmulatedFleet.attach(reuse).authenticate()
        return
    state_dir = tmp_path_factory.mktemp("fleet")
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
    if "fleet" not in request.fixturenames:
        return
    f: EmulatedFleet = request.getfixturevalue("fleet")
    for slice_name in f.down_hosts():
        f.restore(slice_name)
