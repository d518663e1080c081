"""The runner actor's body (``HostRunner``) as a plain object: processes, stop, logs; no Ray cluster."""

from __future__ import annotations

import io
import json
import os
import signal
import stat
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tpufleet.emulator import plan
from tpufleet.host import contain, runlimits
from tpufleet.host.runner import HostRunner, RunRequest, _decode, log_path

JOB_ROOT: Path = Path("/nonexistent")  # set per test by the runner fixture


class _Payload(dict[str, Any]):
    """A RunRequest being built: tests set fields like a dict, ``start`` gets the dataclass."""


def _payload(job: str, code: str, **env: str) -> _Payload:
    return _Payload(
        tenant="team-a",
        job_root=str(JOB_ROOT),
        job_id=job,
        attempt=1,
        layout=(("s", 0), ("s", 1)),
        command=(sys.executable, "-c", code),
        user_env={"FOO": "bar", "TPU_NAME": "user-value"},
        env={"TPUFLEET_JOB_ID": job, **env},
        contract={"TPU_NAME": "from-labels", "TPU_WORKER_ID": "1"},
    )


def _start(runner: HostRunner, payload: _Payload) -> str:
    fields = {**payload}
    for key in ("layout", "command", "hide"):
        if key in fields:
            fields[key] = tuple(fields[key])
    return runner.start(RunRequest(**fields))


def _wait(runner: HostRunner, job: str, state: str, timeout_s: float = 20) -> tuple[str, int | None]:
    deadline = time.monotonic() + timeout_s
    while (got := runner.status(job, 1))[0] != state:
        assert time.monotonic() < deadline, f"{job} stayed {got}"
        time.sleep(0.02)
    return got


def _log(runner: HostRunner, job: str) -> str:
    """The job's output, less the runner's note that a run without a jail is not isolated."""
    data = str(runner.read_log(job, 1, 0)["data"])
    return "".join(line for line in data.splitlines(True) if "is not isolated" not in line)


def _alive(pid: int) -> bool:
    """A zombie (ended, not yet reaped by its new parent) counts as gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _procs_with(token: str) -> list[int]:
    """Host pids of live (non-zombie) processes whose command line contains ``token``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if token in entry.joinpath("cmdline").read_bytes().decode(errors="replace") and _alive(
                    int(entry.name)
                ):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


# How the runner contains a run: a cgroup and a jail (where root and bubblewrap allow), a cgroup
# alone, or tracking descendants (no writable cgroup v2 hierarchy). Each mode runs every test.
# "spare": jailed and in cgroups, every run that can started in the runner's spare (``host/spare.py``).
MODES = {
    "jail": {},
    "cgroup": {"TPUFLEET_JAIL": "off"},
    "tracking": {"TPUFLEET_JAIL": "off", "TPUFLEET_CGROUP_ROOT": ""},
    "spare": {},
}


@pytest.fixture(params=list(MODES))
def runner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[HostRunner]:
    global JOB_ROOT
    JOB_ROOT = tmp_path / "jobs"
    for key, value in MODES[request.param].items():
        monkeypatch.setenv(key, value)
    if request.param in ("jail", "spare") and (why := contain.jail_available()):
        pytest.skip(f"no jail here: {why}")
    if request.param != "tracking" and contain.cgroup_root() is None:
        pytest.skip("no writable cgroup v2 hierarchy here")
    monkeypatch.delenv("TPU_NAME", raising=False)
    monkeypatch.setenv("TPU_VISIBLE_CHIPS", "0")  # as Ray sets it for a worker holding part of a host
    made = HostRunner("s", 1, str(tmp_path / "logs"), spare=request.param == "spare")
    if request.param == "spare":
        _spare_ready(made)  # the test's first run takes it
    yield made
    made.close()


def _spare_ready(runner: HostRunner, timeout_s: float = 20) -> int:
    """The pid of ``runner``'s spare, once it has one."""
    deadline = time.monotonic() + timeout_s
    while (spare := runner._spare) is None:
        assert time.monotonic() < deadline, "the runner made no spare"
        time.sleep(0.01)
    return spare.proc.pid


def test_env_layers_host_contract_over_user_env(runner: HostRunner) -> None:
    code = "import os; print(os.environ['TPU_NAME'], os.environ['FOO'], 'TPU_VISIBLE_CHIPS' in os.environ)"
    _start(runner, _payload("env", code))
    assert _wait(runner, "env", "EXITED") == ("EXITED", 0)
    assert _log(runner, "env").split() == ["from-labels", "bar", "False"]


@pytest.mark.parametrize(("code", "exit_code"), [("import sys; sys.exit(7)", 7), ("pass", 0)])
def test_exit_codes_are_reported_and_persisted(
    runner: HostRunner, tmp_path: Path, code: str, exit_code: int
) -> None:
    _start(runner, _payload("j", code))
    assert _wait(runner, "j", "EXITED") == ("EXITED", exit_code)
    fresh = HostRunner("s", 1, str(tmp_path / "logs"))  # a later runner on the same host
    assert fresh.status("j", 1) == ("EXITED", exit_code)
    assert fresh.status("other", 1) == ("UNKNOWN", None)


def test_a_missing_command_exits_127_with_a_message(runner: HostRunner) -> None:
    payload = _payload("nope", "")
    payload["command"] = ["/nonexistent/binary"]
    _start(runner, payload)
    assert _wait(runner, "nope", "EXITED") == ("EXITED", 127)
    assert "cannot start" in _log(runner, "nope")


def test_a_command_that_is_not_executable_exits_126(runner: HostRunner) -> None:
    """As a shell says it: 126 is there but cannot run, 127 not found (scheduler/attempts.py fails
    a job for good when every host says either)."""
    payload = _payload("noexec", "")
    payload["command"] = ["/etc"]  # a directory: there on every host, jailed or not, and not executable
    _start(runner, payload)
    assert _wait(runner, "noexec", "EXITED") == ("EXITED", 126)
    assert "cannot start" in _log(runner, "noexec")


def _wait_log(runner: HostRunner, job: str, text: str) -> None:
    deadline = time.monotonic() + 20
    while text not in _log(runner, job):
        assert time.monotonic() < deadline, _log(runner, job)
        time.sleep(0.02)


def test_stop_kills_the_whole_group_after_the_grace(runner: HostRunner) -> None:
    code = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60.101)'])\n"
        "print('up', flush=True); time.sleep(60.102)"
    )
    _start(runner, _payload("stop", code))
    _wait_log(runner, "stop", "up")
    assert len(_procs_with("60.10")) >= 2
    assert runner.stop("stop", 1, grace_s=0.3) == -9  # SIGTERM was ignored
    assert _procs_with("60.10") == []
    assert runner.assignments()[0]["current"] is False


# A daemon that leaves the job's process group and session, as `setsid sleep 90 &` does. Its
# command line says `sleep(90.2NN)`; the job's own (and a jail's) only holds the two halves.
ESCAPE = (
    "import subprocess, sys\n"
    "secs = 90 + {frac}\n"
    "subprocess.Popen([sys.executable, '-c', f'import time; time.sleep({{secs}})'],"
    " start_new_session=True)\n"
    "print('detached', flush=True)\n"
)


def test_stop_ends_processes_that_left_the_session(runner: HostRunner) -> None:
    _start(runner, _payload("esc", ESCAPE.format(frac=0.201) + "import time; time.sleep(60)"))
    _wait_log(runner, "esc", "detached")
    time.sleep(0.5)  # the tracking fallback scans every 0.2 s
    assert len(_procs_with("sleep(90.201")) == 1
    runner.stop("esc", 1, grace_s=1)
    assert _procs_with("sleep(90.201") == []


def test_nothing_of_a_run_outlives_its_main_process(runner: HostRunner) -> None:
    _start(runner, _payload("bg", ESCAPE.format(frac=0.202) + "import time; time.sleep(0.6)"))
    assert _wait(runner, "bg", "EXITED") == ("EXITED", 0)
    assert _procs_with("sleep(90.202") == []


@pytest.mark.parametrize(
    "where", [("command", 1), ("env", "FOO"), ("env_key", "BAD\x00KEY")], ids=["arg", "value", "key"]
)
def test_a_nul_byte_anywhere_ends_the_run_with_127_and_a_reason(
    runner: HostRunner, where: tuple[str, object]
) -> None:
    payload = _payload("nul", "print('hi')")
    kind, detail = where
    if kind == "command":
        payload["command"] = [sys.executable, "-c", "print('a\x00b')"]
    elif kind == "env":
        payload["user_env"] = {"FOO": "a\x00b"}
    else:
        payload["user_env"] = {str(detail): "x"}
    assert _start(runner, payload) in ("RUNNING", "EXITED")
    assert _wait(runner, "nul", "EXITED") == ("EXITED", 127)
    assert "cannot start" in _log(runner, "nul")


def test_busy_host_refuses_a_second_attempt_and_a_stopped_one_never_starts(runner: HostRunner) -> None:
    runner.stop("early", 1, grace_s=0)  # stop arrived before start
    assert _start(runner, _payload("early", "print('ran')")) == "EXITED"
    assert _log(runner, "early") == ""
    _start(runner, _payload("long", "import time; time.sleep(60)"))
    with pytest.raises(RuntimeError, match="still runs long/1"):
        _start(runner, _payload("next", "pass"))
    runner.stop("long", 1, grace_s=1)
    assert _start(runner, _payload("next", "pass")) in ("RUNNING", "EXITED")


def test_logs_by_offset_are_complete_only_at_the_end(runner: HostRunner) -> None:
    _start(
        runner,
        _payload("log", "import sys\nfor i in range(3): print('é' * 5, i)\nprint('e', file=sys.stderr)"),
    )
    _wait(runner, "log", "EXITED")
    whole = str(runner.read_log("log", 1, 0)["data"])
    base = len("".join(x for x in whole.splitlines(True) if "is not isolated" in x).encode())
    first = runner.read_log("log", 1, base, limit=7)  # cuts inside a two-byte character
    assert first["data"] == "ééé" and first["next_offset"] == base + 6 and not first["complete"]
    rest = runner.read_log("log", 1, first["next_offset"])
    assert first["data"] + rest["data"] == "ééééé 0\nééééé 1\nééééé 2\ne\n"
    assert rest["complete"]


@pytest.mark.parametrize(
    ("data", "text", "used"),
    [(b"abc", "abc", 3), ("é".encode() * 2, "éé", 4), ("é".encode() + b"\xc3", "é", 2), (b"", "", 0)],
)
def test_decode_stops_at_whole_characters(data: bytes, text: str, used: int) -> None:
    assert _decode(data) == (text, used)


def _zip(files: dict[str, bytes], links: tuple[str, ...] = ()) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        for name in links:  # a symlink entry, as `zip --symlinks` writes it
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            z.writestr(info, "/etc/passwd")
    return buf.getvalue()


def test_the_uploaded_package_is_the_working_directory(runner: HostRunner) -> None:
    payload = _payload("pkg", "")
    payload["command"] = [sys.executable, "main.py"]
    payload["package"] = _zip({"main.py": b"import os, lib\nprint(lib.X, os.getcwd().endswith('/wd'))\n",
                               "lib/__init__.py": b"X = 42\n"})  # fmt: skip
    _start(runner, payload)
    assert _wait(runner, "pkg", "EXITED") == ("EXITED", 0), _log(runner, "pkg")
    assert _log(runner, "pkg").split() == ["42", "True"]


@pytest.mark.parametrize(
    ("files", "links", "why"),
    [
        ({"../escape.py": b"x"}, (), "unsafe name"),
        ({"/abs.py": b"x"}, (), "unsafe name"),
        ({"ok.py": b"x"}, ("link",), "not a plain file"),
    ],
    ids=["dotdot", "absolute", "symlink"],
)
def test_an_unsafe_package_ends_the_run_with_127_and_writes_nothing_outside(
    runner: HostRunner, tmp_path: Path, files: dict[str, bytes], links: tuple[str, ...], why: str
) -> None:
    payload = _payload("bad", "print('ran')")
    payload["package"] = _zip(files, links)
    _start(runner, payload)
    assert _wait(runner, "bad", "EXITED") == ("EXITED", 127)
    assert why in _log(runner, "bad") and "ran" not in _log(runner, "bad")
    assert not list(tmp_path.rglob("escape.py")) and not Path("/abs.py").exists()


def test_secrets_in_the_runners_environment_never_reach_the_job(
    runner: HostRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_AUTH_TOKEN", "ray-secret")
    monkeypatch.setenv("SOME_API_TOKEN", "other-secret")
    _start(runner, _payload("sec", "import os; print(sorted(k for k in os.environ if 'TOKEN' in k))"))
    assert _wait(runner, "sec", "EXITED") == ("EXITED", 0)
    assert _log(runner, "sec").strip() == "[]"


def test_logs_are_private_to_the_runner(runner: HostRunner) -> None:
    _start(runner, _payload("perm", "print(1)"))
    _wait(runner, "perm", "EXITED")
    log = log_path(runner.log_root, "perm", 1, "s", 1)
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert stat.S_IMODE(log.parent.stat().st_mode) == 0o700


def test_a_new_runner_sweeps_what_a_dead_runner_left(runner: HostRunner, tmp_path: Path) -> None:
    if runner._cgroups is None:
        pytest.skip("sweeping needs a cgroup hierarchy")
    _start(runner, _payload("left", ESCAPE.format(frac=0.203) + "import time; time.sleep(60)"))
    _wait_log(runner, "left", "detached")
    fresh = HostRunner("s", 1, str(tmp_path / "logs"))  # the old one "died": it knows nothing of it
    assert fresh.sweep() >= 1  # (and whatever earlier tests of this host left)
    assert _procs_with("sleep(90.203") == []
    runner.stop("left", 1, grace_s=0)


class _StartsDuringSweep(HostRunner):
    """A runner whose start call arrives while its sweep is under way, after the sweep read what to
    keep: what a launch on a slice its executor had just reserved (``SlicePool.reserve`` sends the
    sweep, ``launch`` the start) met on a threaded runner actor."""

    def __init__(self, payload: _Payload, log_root: str) -> None:
        super().__init__("s", 1, log_root)
        self.payload, self.answer = payload, list[str]()
        self.done = threading.Event()  # the calling thread stays, as an actor's does: a run dies with it

    def _remove_unknown(self, keep: set[str]) -> int:
        def call() -> None:
            self.answer.append(_start(self, self.payload))
            self.done.wait(60)

        threading.Thread(target=call, daemon=True).start()
        deadline = time.monotonic() + 1.0  # started by then, unless the sweep holds it off (it must)
        while not self.answer and time.monotonic() < deadline:
            time.sleep(0.01)
        return super()._remove_unknown(keep)


def test_a_run_started_during_a_sweep_is_not_swept(runner: HostRunner, tmp_path: Path) -> None:
    if runner._cgroups is None:
        pytest.skip("sweeping needs a cgroup hierarchy")
    sleeps = _payload("during", "import time; print('up', flush=True); time.sleep(60.417)")
    racing = _StartsDuringSweep(sleeps, str(tmp_path / "logs"))
    try:
        racing.sweep()  # what it killed is gone when it returns
        _wait_log(racing, "during", "up")
        assert _procs_with("sleep(60.417") != [] and racing.answer == ["RUNNING"], _log(racing, "during")
        assert racing.status("during", 1) == ("RUNNING", None)
    finally:
        racing.stop("during", 1, grace_s=0)
        racing.done.set()


JAIL_PROBE = """
import json, os, pathlib
root = pathlib.Path(os.environ['TPUFLEET_CHECKPOINT_DIR']).parent.parent
ckpt = pathlib.Path(os.environ['TPUFLEET_CHECKPOINT_DIR'])
(ckpt / 'step').write_text('1')
def can_read(p):
    try:
        pathlib.Path(p).read_text(); return True
    except OSError:
        return False
print(json.dumps({
    'tenants': sorted(p.name for p in root.iterdir()),
    'other_secret': can_read(os.environ['OTHER']),
    'admin_token': can_read(os.environ['ADMIN']),
    'logs': can_read(os.environ['LOGFILE']),
    'jax_cache': can_read(os.environ['JAX_COMPILATION_CACHE_DIR'] + '/jit_entry'),
    'pids': sorted(int(p) for p in os.listdir('/proc') if p.isdigit()),
    'tmp': os.listdir('/tmp'),
    'write_etc': os.access('/etc', os.W_OK),
}))
"""


def test_a_jailed_job_sees_only_its_own_tenants_files(
    runner: HostRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if runner._jail_off is not None:
        pytest.skip("jail mode only")
    # the JAX compilation cache emulated hosts may share (plan.jax_cache_env): its settings reach the
    # job with the host's environment, its entries (which any unjailed process may have written) do not
    cache = tmp_path / "jax-cache"
    cache.mkdir()
    (cache / "jit_entry").write_text("compiled by someone else")
    for key, value in plan.jax_cache_env(str(cache)).items():
        monkeypatch.setenv(key, value)
    other = JOB_ROOT / "team-b" / "job-b"
    other.mkdir(parents=True)
    (other / "secret").write_text("b's weights")
    state = tmp_path / "state"
    state.mkdir()
    (state / "admin-token").write_text("tf_admin")
    (Path("/tmp") / f"tpufleet-test-{os.getpid()}").write_text("host tmp")
    other_log = log_path(runner.log_root, "old", 1, "s", 1)
    other_log.parent.mkdir(parents=True, exist_ok=True)
    other_log.write_text("another job's log")
    payload = _payload("jail", JAIL_PROBE)
    payload["hide"] = [str(state)]
    payload["user_env"] = {"OTHER": str(other / "secret"), "ADMIN": str(state / "admin-token"),
                           "LOGFILE": str(other_log)}  # fmt: skip
    _start(runner, payload)
    assert _wait(runner, "jail", "EXITED") == ("EXITED", 0), _log(runner, "jail")
    seen = json.loads(_log(runner, "jail"))
    assert seen["tenants"] == ["team-a"]
    assert not seen["other_secret"] and not seen["admin_token"] and not seen["logs"]
    assert seen["jax_cache"] is False
    assert max(seen["pids"]) < 10  # its own PID namespace: nothing of the host's processes
    assert f"tpufleet-test-{os.getpid()}" not in seen["tmp"] and seen["write_etc"] is False
    assert (JOB_ROOT / "team-a" / "jail" / "step").read_text() == "1"
    Path("/tmp", f"tpufleet-test-{os.getpid()}").unlink()


def test_a_sweep_leaves_other_hosts_runs_alone_but_removes_their_long_empty_cgroups(
    runner: HostRunner,
) -> None:
    root = runner._cgroups
    if root is None:
        pytest.skip("sweeping needs a cgroup hierarchy")
    _start(runner, _payload("mine", ESCAPE.format(frac=0.204) + "import time; time.sleep(60)"))
    _wait_log(runner, "mine", "detached")
    stale = root / contain.cgroup_name("othernode", "s", 1, "gone", 1)
    stale.mkdir(exist_ok=True)
    os.utime(stale, (time.time() - 3600, time.time() - 3600))  # empty for an hour
    # another host's sweep (same slice name, another node): the live run stays, the old empty one goes
    assert contain.sweep(root, contain.cgroup_name("othernode", "s", 1) + ".x", set()) >= 1
    assert not stale.exists()
    assert len(_procs_with("sleep(90.204")) == 1
    runner.stop("mine", 1, grace_s=0)
    assert _procs_with("sleep(90.204") == []


def test_the_command_gets_the_signals_a_shell_would_give_it(runner: HostRunner) -> None:
    payload = _payload("signals", "")
    payload["command"] = ["sh", "-c", "grep SigIgn /proc/$$/status"]
    _start(runner, payload)
    assert _wait(runner, "signals", "EXITED") == ("EXITED", 0)
    ignored = int(_log(runner, "signals").split()[-1], 16)
    assert ignored & (1 << (signal.SIGPIPE - 1)) == 0, "SIGPIPE ignored: `yes | head` would never end"
    assert ignored & (1 << (signal.SIGXFSZ - 1)) == 0


# -- the spare (host/spare.py) -------------------------------------------------------------------
@pytest.fixture
def spared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HostRunner]:
    """A runner that keeps a spare, its runs contained in cgroups (unjailed: the job's view of its
    own process is the host's)."""
    global JOB_ROOT
    JOB_ROOT = tmp_path / "jobs"
    if contain.cgroup_root() is None:
        pytest.skip("no writable cgroup v2 hierarchy here")
    monkeypatch.setenv("TPUFLEET_JAIL", "off")
    made = HostRunner("s", 1, str(tmp_path / "logs"), spare=True)
    yield made
    made.close()


SELF_PROBE = """
import json, os, resource
print(json.dumps({
    'pid': os.getpid(), 'sid': os.getsid(0), 'foo': os.environ.get('FOO'), 'eq': os.environ.get('EQ'),
    'cgroup': open('/proc/self/cgroup').read(), 'nofile': resource.getrlimit(resource.RLIMIT_NOFILE),
    'umask': os.umask(0o077),
}), flush=True)
"""


def test_a_run_takes_over_the_spare_with_its_own_environment_and_limits(spared: HostRunner) -> None:
    pid = _spare_ready(spared)
    cgroup = spared._spare.box.cgroup if spared._spare is not None else None
    payload = _payload("taken", SELF_PROBE)
    payload["limits"] = runlimits.RunLimits(open_files=333)
    payload["user_env"] = {"FOO": "bar", "EQ": "a=b\u00e9"}
    assert _start(spared, payload) == "RUNNING"
    assert _wait(spared, "taken", "EXITED") == ("EXITED", 0)
    seen = json.loads(_log(spared, "taken").strip().splitlines()[-1])
    assert seen["pid"] == pid and seen["sid"] == pid  # the spare's process, in its own session
    assert cgroup is not None and f"/{cgroup.name}\n" in seen["cgroup"]  # and in the spare's cgroup
    assert seen["foo"] == "bar" and seen["eq"] == "a=b\u00e9"  # the run's environment, not the spare's
    assert seen["nofile"][1] == 333  # the run's open-files limit
    assert seen["umask"] == 0o077
    assert not cgroup.exists()  # removed with the run, as a plain run's cgroup is
    _spare_ready(spared)  # and the next run's spare made once this one ended


def test_a_spare_that_died_leaves_the_plain_way_and_is_made_again(spared: HostRunner) -> None:
    dead = _spare_ready(spared)
    os.kill(dead, signal.SIGKILL)
    while _alive(dead):
        time.sleep(0.01)
    assert _start(spared, _payload("plain", "import os; print(os.getpid(), flush=True)")) == "RUNNING"
    assert _wait(spared, "plain", "EXITED") == ("EXITED", 0)
    assert int(_log(spared, "plain").split()[-1]) != dead
    assert _spare_ready(spared) != dead


def test_a_sweep_keeps_the_spare_and_a_start_that_cannot_happen_leaves_it_unused(spared: HostRunner) -> None:
    pid = _spare_ready(spared)
    spared.sweep()
    assert _alive(pid)
    payload = _payload("nul", "print('hi')")
    payload["command"] = [sys.executable, "-c", "print('a\x00b')"]
    _start(spared, payload)
    assert _wait(spared, "nul", "EXITED") == ("EXITED", 127)
    assert "cannot start this job: ValueError: embedded null byte" in _log(spared, "nul")
    assert _spare_ready(spared) == pid and _alive(pid)


def test_closing_the_runner_ends_its_spare_and_removes_its_cgroup(spared: HostRunner) -> None:
    pid = _spare_ready(spared)
    cgroup = spared._spare.box.cgroup if spared._spare is not None else None
    spared.close()
    assert not _alive(pid)
    assert cgroup is not None and not cgroup.exists()
