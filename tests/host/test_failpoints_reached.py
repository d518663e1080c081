"""A failpoint reached kills its process as kill -9 does: SIGKILL, nothing after it runs (not even
a ``finally``). ``tests/integration/test_replicas_ray.py`` kills replicas of ``serve`` this way."""

from __future__ import annotations

import signal
import subprocess
import sys

from guards import HANG_GUARD_S

PROGRAM = """
from tpufleet.control.loop import failpoints
points = failpoints.parse("after-stop")
failpoints.reach(points, "after-launch")
print("passed after-launch", flush=True)
try:
    failpoints.reach(points, "after-stop")
    print("lived past after-stop", flush=True)
finally:
    print("finally ran", flush=True)
"""


def test_reaching_a_listed_point_kills_the_process_at_once() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert done.returncode == -signal.SIGKILL, done
    assert done.stdout == "passed after-launch\n", done
    assert "failpoint after-stop reached: this process kills itself (SIGKILL)" in done.stderr, done


WAITS = """
from tpufleet.control.loop import failpoints
asked = []
def ready():
    asked.append(1)
    print("asked", len(asked), flush=True)
    if len(asked) == 2:
        raise RuntimeError("the cluster cannot answer yet")
    return len(asked) >= 3
failpoints.reach(failpoints.parse("after-launch"), "after-launch", ready=ready)
print("lived past after-launch", flush=True)
"""


def test_a_point_that_stands_for_a_later_instant_waits_for_it_then_kills() -> None:
    done = subprocess.run([sys.executable, "-c", WAITS], capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == -signal.SIGKILL, done
    assert done.stdout == "asked 1\nasked 2\nasked 3\n", done  # an error is asked again; killed at True
