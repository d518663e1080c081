"""The runner actor's body (``HostRunner``) as a plain object: processes, stop, logs; no Ray cluster."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tpufleet.control.runner import HostRunner, _decode


def _payload(job: str, code: str, **env: str) -> dict[str, object]:
    return {
        "job_id": job,
        "attempt": 1,
        "layout": [("s", 0), ("s", 1)],
        "command": [sys.executable, "-c", code],
        "user_env": {"FOO": "bar", "TPU_NAME": "user-value"},
        "env": {"TPUFLEET_JOB_ID": job, **env},
        "defaults": {"TPU_NAME": "from-labels", "TPU_WORKER_ID": "1"},
    }


def _wait(runner: HostRunner, job: str, state: str, timeout_s: float = 20) -> tuple[str, int | None]:
    deadline = time.monotonic() + timeout_s
    while (got := runner.status(job, 1))[0] != state:
        assert time.monotonic() < deadline, f"{job} stayed {got}"
        time.sleep(0.02)
    return got


def _log(runner: HostRunner, job: str) -> str:
    return str(runner.read_log(job, 1, 0)["data"])


def _alive(pid: int) -> bool:
    """A zombie (ended, not yet reaped by its new parent) counts as gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> HostRunner:
    monkeypatch.delenv("TPU_NAME", raising=False)
    monkeypatch.setenv("TPU_VISIBLE_CHIPS", "0")  # as Ray sets it for a worker holding part of a host
    return HostRunner("s", 1, str(tmp_path))


def test_env_layers_host_contract_over_user_env(runner: HostRunner) -> None:
    code = "import os; print(os.environ['TPU_NAME'], os.environ['FOO'], 'TPU_VISIBLE_CHIPS' in os.environ)"
    runner.start(_payload("env", code))
    assert _wait(runner, "env", "EXITED") == ("EXITED", 0)
    assert _log(runner, "env").split() == ["from-labels", "bar", "False"]


@pytest.mark.parametrize(("code", "exit_code"), [("import sys; sys.exit(7)", 7), ("pass", 0)])
def test_exit_codes_are_reported_and_persisted(
    runner: HostRunner, tmp_path: Path, code: str, exit_code: int
) -> None:
    runner.start(_payload("j", code))
    assert _wait(runner, "j", "EXITED") == ("EXITED", exit_code)
    fresh = HostRunner("s", 1, str(tmp_path))  # a later runner on the same host
    assert fresh.status("j", 1) == ("EXITED", exit_code)
    assert fresh.status("other", 1) == ("UNKNOWN", None)


def test_a_missing_command_exits_127_with_a_message(runner: HostRunner) -> None:
    payload = _payload("nope", "")
    payload["command"] = ["/nonexistent/binary"]
    runner.start(payload)
    assert runner.status("nope", 1) == ("EXITED", 127)
    assert "cannot start" in _log(runner, "nope")


def test_stop_kills_the_whole_group_after_the_grace(runner: HostRunner) -> None:
    code = (
        "import os, signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(os.getpid(), c.pid, flush=True); time.sleep(60)"
    )
    runner.start(_payload("stop", code))
    deadline = time.monotonic() + 20
    while len(_log(runner, "stop").split()) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    pids = [int(p) for p in _log(runner, "stop").split()]
    assert runner.stop("stop", 1, grace_s=0.3) == -9  # SIGTERM was ignored
    assert [p for p in pids if _alive(p)] == []
    assert runner.assignments()[0]["current"] is False


def test_busy_host_refuses_a_second_attempt_and_a_stopped_one_never_starts(runner: HostRunner) -> None:
    runner.stop("early", 1, grace_s=0)  # stop arrived before start
    assert runner.start(_payload("early", "print('ran')")) == "EXITED"
    assert _log(runner, "early") == ""
    runner.start(_payload("long", "import time; time.sleep(60)"))
    with pytest.raises(RuntimeError, match="still runs long/1"):
        runner.start(_payload("next", "pass"))
    runner.stop("long", 1, grace_s=1)
    assert runner.start(_payload("next", "pass")) in ("RUNNING", "EXITED")


def test_logs_by_offset_are_complete_only_at_the_end(runner: HostRunner) -> None:
    runner.start(
        _payload("log", "import sys\nfor i in range(3): print('é' * 5, i)\nprint('e', file=sys.stderr)")
    )
    _wait(runner, "log", "EXITED")
    first = runner.read_log("log", 1, 0, limit=7)  # cuts inside a two-byte character
    assert first["data"] == "ééé" and first["next_offset"] == 6 and not first["complete"]
    rest = runner.read_log("log", 1, first["next_offset"])
    assert first["data"] + rest["data"] == "ééééé 0\nééééé 1\nééééé 2\ne\n"
    assert rest["complete"]


@pytest.mark.parametrize(
    ("data", "text", "used"),
    [(b"abc", "abc", 3), ("é".encode() * 2, "éé", 4), ("é".encode() + b"\xc3", "é", 2), (b"", "", 0)],
)
def test_decode_stops_at_whole_characters(data: bytes, text: str, used: int) -> None:
    assert _decode(data) == (text, used)
