"""Host tests start, scan or kill the host's processes. They may run beside the pure unit tests
(which start none), and beside each other, but for the ones that sweep a host's runs or scan its
processes (``ALONE``): beside another host test, one runner's sweep or process scan met the other
test's jobs (a jail's stop test timed out), so those run with no other host test at all.

The rule is a reader-writer lock on one file of the pytest-xdist run (in the temp dir its workers
share), held for a whole module (its fixtures start runners that outlive one test): every host
module holds it shared, an ``ALONE`` one exclusively. Without xdist there is one process and nothing
to lock. A worker holds it only between a module's first test and its last, so it never waits on the
lock while holding it: no deadlock.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator

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
def _one_process_scan_at_a_time(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    lock = tmp_path_factory.getbasetemp().parent / "host-tests.lock"  # .../pytest-N/, not popen-gwN/
    mode = fcntl.LOCK_EX if request.path.name in ALONE else fcntl.LOCK_SH
    with lock.open("a") as f:
        fcntl.flock(f, mode)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
