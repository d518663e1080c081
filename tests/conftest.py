"""Every test, and every process a test starts, runs with its own CLI context and no cloud access.

``TPUFLEET_CONFIG`` points at a file in a session temp dir, so ``tpufleet emulate up`` and
``tpufleet serve`` run by a test never write the user's ``~/.config/tpufleet/config.yaml``, and a
context the user has never changes what a test does. google-auth never probes a GCE metadata
server: ``NO_GCE_CHECK`` (lowercase ``true`` is what google-auth reads) and both metadata addresses
point at a closed local port.

``make test`` runs pytest on two workers (pytest-xdist, ``-n 2``): every test under
``tests/integration`` and ``tests/e2e`` goes to one worker, one after another in file order, around
the one emulated fleet they share (and the fleets the demo and the chaos soak start are never up
beside it); the unit tests fill the other worker (:func:`pytest_xdist_make_scheduler`). Without
xdist (``make unit``, ``make integration``, a plain ``pytest``) nothing changes.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CLUSTER_DIRS = ("tests/integration/", "tests/e2e/")  # the tests that start or share a Ray fleet
CLUSTER_GROUP = "cluster"
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


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under xdist (``make test``: ``-n 2``): every test under ``CLUSTER_DIRS`` is one unit of work,
    sent whole to one worker and run there in file order; each other test is a unit of its own.

    xdist's own ``--dist loadgroup`` would do this from an ``xdist_group`` marker, but pytest-xdist
    3.8.0 names the group by rewriting ``item._nodeid``, which pytest 9 no longer reads (a node's id
    is ``_id``): the marked tests were spread over both workers, each starting a Ray fleet."""
    from xdist.scheduler import LoadScopeScheduling

    class ClusterTestsTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return CLUSTER_GROUP if nodeid.startswith(CLUSTER_DIRS) else nodeid

    return ClusterTestsTogether(config, log)
