"""The runner hands process 0's reported steps to the control plane: while the job runs (from the
file the jailed job writes), and after it ended (kept beside the log, the scratch being gone)."""

from __future__ import annotations

import time
from pathlib import Path

from test_runner import _payload, _start, _wait, runner  # noqa: F401  (runner: the fixture, every mode)

from tpufleet.host.runner import HostRunner
from tpufleet.runtime import PROGRESS_VAR, StepProgress

REPORT = (
    "import os, sys, time\n"
    "from tpufleet.runtime import report_step\n"
    "print(os.environ['" + PROGRESS_VAR + "'], flush=True)\n"
    "for step in (7, 8, 9):\n"
    "    report_step(step)\n"
    "flag = os.path.join(os.path.dirname(os.environ['TPUFLEET_CHECKPOINT_DIR']), 'go')\n"
    "while not os.path.exists(flag): time.sleep(0.02)\n"
)


def test_reported_steps_while_running_and_after_the_end(runner: HostRunner, tmp_path: Path) -> None:  # noqa: F811
    payload = _payload("prog", REPORT)
    payload["contract"] = {"TPU_NAME": "s", "TPU_WORKER_ID": "0"}  # process 0 reports
    _start(runner, payload)
    deadline = time.monotonic() + 20
    while (live := runner.progress("prog", 1)) is None:
        assert time.monotonic() < deadline, "no progress reported"
        time.sleep(0.02)
    seen = StepProgress.from_dict(live)
    assert seen is not None and seen.first_step == 7  # the first report is written at once
    (tmp_path / "jobs" / "team-a" / "go").touch()
    assert _wait(runner, "prog", "EXITED") == ("EXITED", 0)
    final = StepProgress.from_dict(runner.progress("prog", 1))
    assert final is not None and (final.first_step, final.step) == (7, 9)  # flushed at exit
    fresh = HostRunner("s", 1, runner.log_root)  # a later runner of the host: from beside the log
    assert StepProgress.from_dict(fresh.progress("prog", 1)) == final
    assert fresh.progress("never-ran", 1) is None


def test_other_hosts_report_nothing(runner: HostRunner, tmp_path: Path) -> None:  # noqa: F811
    payload = _payload("quiet", REPORT)  # TPU_WORKER_ID 1: not process 0
    _start(runner, payload)
    (tmp_path / "jobs" / "team-a" / "go").touch()
    assert _wait(runner, "quiet", "EXITED") == ("EXITED", 0)
    assert runner.progress("quiet", 1) is None
