"""runtime.handle_stop_signal: a Ray Train driver stopped by tpufleet (SIGTERM through Ray's job
stop) says so, lives on while Ray Train records the reported checkpoints, then dies of SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from tpufleet.runtime import MAX_SETTLE_S, ray_train_settle_s

DRIVER = textwrap.dedent(
    """
    import sys, time
    from tpufleet import runtime
    runtime.handle_stop_signal(float(sys.argv[1]))
    print("ready", flush=True)
    for _ in range(600):  # fit() stand-in: a driver busy until it is stopped
        time.sleep(0.1)
    print("not stopped", flush=True)
    """
)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, 5.0),  # Ray Train's default poll, 2 s: two polls and a second
        ({"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5"}, 2.0),
        ({"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "60"}, MAX_SETTLE_S),  # never past Ray's SIGKILL
        ({"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "soon"}, 5.0),
        ({"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "nan"}, 5.0),
        ({"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "-1"}, 5.0),
    ],
)
def test_the_wait_covers_two_polls_of_ray_trains_controller(env: dict[str, str], expected: float) -> None:
    assert ray_train_settle_s(env) == expected


def _driver(settle_s: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(settle_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_sigterm_is_logged_and_the_driver_then_dies_of_it() -> None:
    proc = _driver(0.3)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM, (out, err)
    assert "driver: SIGTERM (the checkpoint signal); exiting in 0.3 s" in out
    assert "not stopped" not in out


def test_a_second_sigterm_while_it_waits_ends_the_driver_at_once() -> None:
    proc = _driver(120)  # far longer than the test waits: only the second signal can end it
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout is not None and "SIGTERM (the checkpoint signal)" in proc.stdout.readline()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM
