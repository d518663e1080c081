"""What one run may use of its host (``runlimits.py``): processes, open files, the runner's own copy
of its output; and a package that lies ends as one line, exit 127. Host tests: they start processes
(tests/host)."""

from __future__ import annotations

import ast
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import test_runner
from test_runner import _log, _procs_with, _start, _wait, _wait_log, runner  # noqa: F401 (the fixture)

from tpufleet.control.cluster.protocol import AttemptStatus, HostState, HostStatus
from tpufleet.host import contain, runlimits
from tpufleet.host.runlimits import FILES_REASON, PROCESS_REASON, RunLimits
from tpufleet.host.runner import HostRunner, log_path


def _payload(job: str, code: str, limits: RunLimits) -> test_runner._Payload:
    payload = test_runner._payload(job, code)
    payload["limits"] = limits
    return payload


def _v1_base() -> Path | None:
    mounts = runlimits._v1_pids_mounts()
    return mounts[0] / contain.CGROUP_DIR if mounts else None


def _v2_pids() -> bool:
    root = contain.cgroup_root()
    return root is not None and runlimits._v2_pids(root)


# Where a run's process limit lives: the run's cgroup v2 with the pids controller, the cgroup v1
# pids hierarchy, or none (the runner's scan counts the run's tasks).
PIDS_MODES = ["pids-v2", "pids-v1", "scan"]


@pytest.fixture(params=PIDS_MODES)
def limited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> str:
    """Sets up the host for one mode; the test makes its runners (``_host``) after it."""
    test_runner.JOB_ROOT = tmp_path / "jobs"
    monkeypatch.delenv("TPU_NAME", raising=False)
    if request.param == "pids-v2":
        if not _v2_pids():
            pytest.skip("no cgroup v2 hierarchy with the pids controller here")
    elif request.param == "pids-v1":
        base = _v1_base()
        if base is None or os.geteuid() != 0:
            pytest.skip("no writable cgroup v1 pids hierarchy here")
        monkeypatch.setenv(runlimits.PIDS_ENV, str(base))
    else:
        monkeypatch.setenv(runlimits.PIDS_ENV, "")
        monkeypatch.setenv("TPUFLEET_JAIL", "off")
    return str(request.param)


def _host(tmp_path: Path, worker: int) -> HostRunner:
    return HostRunner("s", worker, str(tmp_path / "logs"))


FORKS = """
import os, time
n = 0
for i in range(300):
    try:
        pid = os.fork()
    except OSError:
        print('refused at', n, flush=True)
        time.sleep(60)
    if pid == 0:
        time.sleep(90.31)
        os._exit(0)
    n += 1
    print('forked', n, flush=True)
    time.sleep(DELAY)
print('all forked', flush=True)
time.sleep(60)
"""

SIBLING = """
import os, time
kids = []
for i in range(20):
    pid = os.fork()
    if pid == 0:
        time.sleep(0.5)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
print('sibling ok', flush=True)
"""


def test_a_job_past_its_process_limit_fails_alone(limited: str, tmp_path: Path) -> None:
    hostile, sibling = _host(tmp_path, 1), _host(tmp_path, 2)  # two hosts of one machine
    limits = RunLimits(processes=50)
    delay = "0.02" if limited == "scan" else "0"  # the scan samples every 0.2 s; a pids cgroup refuses
    _start(hostile, _payload("fork", FORKS.replace("DELAY", delay), limits))
    _start(sibling, _payload("calm", SIBLING, limits))
    state, code = _wait(hostile, "fork", "EXITED", timeout_s=30)
    assert (state, code) == ("EXITED", -9), _log(hostile, "fork")
    reason = PROCESS_REASON.format(n=50)
    assert hostile.report("fork", 1)["reason"] == reason
    log = _log(hostile, "fork")
    assert f"tpufleet: {reason}: the run was ended" in log and "all forked" not in log
    forked = [int(line.split()[1]) for line in log.splitlines() if line.startswith("forked ")]
    if limited != "scan":  # the cgroup refused every fork past the limit: none ever existed
        assert forked and max(forked) < 50
    assert _procs_with("90.31") == []
    assert _wait(sibling, "calm", "EXITED") == ("EXITED", 0)
    assert "sibling ok" in _log(sibling, "calm") and sibling.report("calm", 1)["reason"] is None
    assert HostRunner("s", 1, hostile.log_root).report("fork", 1)["reason"] == reason  # kept beside the log
    if hostile._pids is not None and not hostile._pids.shared:  # its own v1 directory is gone
        assert not list(hostile._pids.path.glob("*.fork.1"))


def test_all_runs_together_leave_the_host_pids_of_its_own(limited: str, tmp_path: Path) -> None:
    host = _host(tmp_path, 1)
    if host._pids is None:
        pytest.skip("no pids hierarchy: no ceiling")
    ceiling = (host._pids.path / "pids.max").read_text().strip()
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    assert ceiling != "max" and int(ceiling) < pid_max  # 3/4 of pid_max, unless the operator set one


OPENS = """
import os, time
for i in range(3):
    if os.fork() == 0:
        fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(120)]
        os.write(1, b'opened %d\\n' % len(fds))  # one write: the three children share the log
        time.sleep(60.32)
        os._exit(0)
time.sleep(60.32)
"""


def test_a_job_past_its_open_files_limit_is_ended(limited: str, tmp_path: Path) -> None:
    host = _host(tmp_path, 1)
    _start(host, _payload("fds", OPENS, RunLimits(open_files=200)))  # 120 per process: each may
    state, code = _wait(host, "fds", "EXITED", timeout_s=30)
    assert (state, code) == ("EXITED", -9), _log(host, "fds")
    reason = FILES_REASON.format(n=200)
    assert host.report("fds", 1)["reason"] == reason and reason in _log(host, "fds")
    assert "opened 120" in _log(host, "fds")
    assert _procs_with("60.32") == []


def test_no_process_may_hold_more_files_than_its_run() -> None:
    limits = RunLimits(open_files=100)
    code = "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE))"
    guard = runlimits.RunGuard("x", limits, None, None)
    out = subprocess.run([sys.executable, "-c", code], preexec_fn=guard.preexec(), capture_output=True)
    soft, hard = ast.literal_eval(out.stdout.decode())
    assert hard == 100 and soft <= 100


FLOOD = """
import os, sys, time
print('first line', flush=True)
flag = os.path.join(os.environ['TPUFLEET_CHECKPOINT_DIR'], '..', 'go')
while not os.path.exists(flag):
    time.sleep(0.02)
line = 'x' * 1023 + '\\n'
for i in range(4096):  # 4 MiB
    sys.stdout.write(line)
sys.stdout.flush()
print('done', file=sys.stderr, flush=True)
"""


def test_the_runners_copy_of_the_output_stops_at_the_cap(runner: HostRunner, tmp_path: Path) -> None:  # noqa: F811
    cap = 256 << 10
    _start(runner, _payload("flood", FLOOD, RunLimits(log_bytes=cap)))
    _wait_log(runner, "flood", "first line")  # copied while the job runs
    (test_runner.JOB_ROOT / "team-a" / "go").touch()
    assert _wait(runner, "flood", "EXITED", timeout_s=60) == ("EXITED", 0)  # never blocked
    log = log_path(runner.log_root, "flood", 1, "s", 1)
    marker = runlimits.truncation_marker(cap)
    assert log.stat().st_size <= cap + len(marker)
    text = log.read_text()
    assert text.endswith(marker) and text.count(marker) == 1
    assert "first line\n" + "x" * 1023 + "\n" in text and "done" not in text


def _lying_zip() -> bytes:
    """A zip whose entry's stored bytes do not match the CRC its headers give."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("main.py", b"print('ran')\n" * 20)
    data = bytearray(buf.getvalue())
    at = 30 + len("main.py")  # the local header, then the entry's data
    data[at] ^= 0x20
    return bytes(data)


def test_a_lying_package_ends_in_one_line_with_127(runner: HostRunner) -> None:  # noqa: F811
    payload = test_runner._payload("lie", "")
    payload["command"] = [sys.executable, "main.py"]
    payload["package"] = _lying_zip()
    _start(runner, payload)
    assert _wait(runner, "lie", "EXITED") == ("EXITED", 127), _log(runner, "lie")
    lines = _log(runner, "lie").splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("tpufleet: cannot start this job: the package is damaged: Bad CRC-32")
    assert str(test_runner.JOB_ROOT) not in lines[0] and "ran" not in lines[0]


def test_a_hosts_reason_is_the_attempts_failure() -> None:
    why = PROCESS_REASON.format(n=50)
    status = AttemptStatus("j", 1, (HostStatus("s", 0, HostState.EXITED, -9, why),))
    assert status.failure == f"host s/0 exited with code -9: {why}"
