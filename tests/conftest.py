"""Every test, and every process a test starts, runs with its own CLI context and no cloud access.

``TPUFLEET_CONFIG`` points at a file in a session temp dir, so ``tpufleet emulate up`` and
``tpufleet serve`` run by a test never write the user's ``~/.config/tpufleet/config.yaml``, and a
context the user has never changes what a test does. google-auth never probes a GCE metadata
server: ``NO_GCE_CHECK`` (lowercase ``true`` is what google-auth reads) and both metadata addresses
point at a closed local port.

``make test`` runs pytest on two workers (pytest-xdist, ``--dist loadgroup``): every test under
``tests/integration`` and ``tests/e2e`` is in one group, so they run one after another on one
worker, in file order, around the one emulated fleet they share (and the fleets the demo and the
chaos soak start are never up beside it); the unit tests fill the other worker. Without xdist
(``make unit``, ``make integration``, a plain ``pytest``) the marker does nothing.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

CLUSTER_GROUP = "cluster"  # the xdist group of every test that starts or shares Ray
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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    cluster_dirs = (here / "integration", here / "e2e")
    for item in items:
        if any(d in Path(str(item.path)).parents for d in cluster_dirs):
            item.add_marker(pytest.mark.xdist_group(CLUSTER_GROUP))
