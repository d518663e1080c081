"""Host tests start, scan or kill the host's processes. They may run beside the pure unit tests
(which start none), and beside each other, but for the ones that sweep a host's runs or scan its
processes (``ALONE``): beside another host test, one runner's sweep or process scan met the other
test's jobs (a jail's stop test timed out), so those run with no other host test at all.

The rule is a reader-writer lock on one file per pytest-xdist run, held for a whole module (its
fixtures start runners and fleets that outlive one test): every host module holds it shared, an
``ALONE`` one exclusively. Without xdist there is one process and nothing to lock.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ALONE = frozenset(
    {
        "test_runner.py",
        "test_runner_progress.py",
        "test_runner_limits.py",
        "test_runner_files.py",
        "test_emulator_deviceplugin.py",
        "test_emulator_lean.py",
    }
)


@pytest.fixture(autouse=True, scope="module")
def _one_process_scan_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        yield
        return
    lock = Path(tempfile.gettempdir()) / f"tpufleet-host-tests-{run}.lock"
    mode = fcntl.LOCK_EX if request.path.name in ALONE else fcntl.LOCK_SH
    with lock.open("a") as f:
        fcntl.flock(f, mode)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
