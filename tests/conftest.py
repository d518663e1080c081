"""Every test, and every process a test starts, runs with its own CLI context and no cloud access.

``TPUFLEET_CONFIG`` points at a file in a session temp dir, so ``tpufleet emulate up`` and
``tpufleet serve`` run by a test never write the user's ``~/.config/tpufleet/config.yaml``, and a
context the user has never changes what a test does. google-auth never probes a GCE metadata
server: ``NO_GCE_CHECK`` (lowercase ``true`` is what google-auth reads) and both metadata addresses
point at a closed local port.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

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
