"""A lean emulated host: the launcher's command lines, the dashboard agent's stand-in, and the
memory accounting (PSS/RSS per process, by component) the emulator's tests and bench rely on."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from guards import HANG_GUARD_S

from tpufleet import catalog
from tpufleet.emulator import plan, procs, rayhost

ray_parameter = pytest.importorskip("ray._private.parameter")


def test_lean_hosts_and_head_take_ray_start_s_own_flags_through_the_launcher() -> None:
    v4 = catalog.slice_type("v4-16")
    host = ("10.1.2.3", "10.1.2.3:6379", v4, 2, "/tmp/t/h0", 1, False)
    argv = plan.lean_host_argv("/venv/bin/python", *host)
    assert argv[:3] == ["/venv/bin/python", "-P", plan.RAYHOST_SCRIPT]
    assert Path(plan.RAYHOST_SCRIPT).is_file()
    assert argv[3:] == plan.host_argv("ray", *host)[2:]  # exactly what `ray start` would be given
    args = rayhost.parse(argv[3:])  # and the launcher accepts every one of them
    assert (args.head, args.address, args.node_ip_address, args.num_gpus) == (
        False,
        "10.1.2.3:6379",
        "10.1.2.3",
        0,
    )
    assert args.num_cpus == int(argv[argv.index("--num-cpus") + 1])
    assert (args.temp_dir, args.object_store_memory, args.include_log_monitor) == ("/tmp/t/h0", 1, False)
    assert args.resources == '{"TPU": 4}' and args.dashboard_agent == "standin"
    assert plan.LEAN_HOST_ENV["RAY_prestart_worker_first_driver"] == "0"
    assert plan.LEAN_HOST_ENV["RAY_num_workers_soft_limit"] == "0"  # idle workers end (after 30 s)

    argv = plan.lean_head_argv("/venv/bin/python", "10.1.2.3", 6000, 6001, "/tmp/t", 1)
    # `ray start --head`'s own flags, less the Ray Client server and with --no-monitor
    plain = plan.head_argv("ray", "10.1.2.3", 6000, 6001, None, "/tmp/t", 1, monitor=False)
    modules = ["--dashboard-modules", ",".join(plan.DASHBOARD_MODULES)]  # not a `ray start` flag
    assert argv[3:] == [*plain[2:], *modules] and "--no-monitor" in plain
    assert "--ray-client-server-port" not in plain
    args = rayhost.parse(argv[3:])
    assert (
        args.dashboard_modules
        == "JobHead,StateHead,NodeHead,TaskEventsHead,UsageStatsHead,PlatformEventsHead"
    )
    assert (args.head, args.port, args.address, args.num_cpus) == (True, 6000, None, 0)
    assert (args.dashboard_port, args.ray_client_server_port, args.no_monitor) == (6001, None, True)
    assert args.dashboard_agent == "real"  # the head keeps Ray's agent (job submission goes there)
    params = rayhost.params_of(args, ray_parameter)  # what Node reads to skip both processes
    assert params.no_monitor is True and params.ray_client_server_port is None


def test_agent_ports_chosen_up_front_reach_the_raylet_so_it_waits_for_no_port_file() -> None:
    """A raylet given no agent port waits ~15 s for each agent's port file, then aborts: the head's
    dashboard agent once missed that on a loaded CI runner (plan.AgentPorts)."""
    ports = plan.AgentPorts(runtime_env=7001, grpc=7002, listen=7003, metrics_export=7004)
    head = plan.lean_head_argv("/venv/bin/python", "10.1.2.3", 6000, 6001, "/tmp/t", 1, ports=ports)
    params = rayhost.params_of(rayhost.parse(head[3:]), ray_parameter)
    got = (params.runtime_env_agent_port, params.metrics_agent_port, params.dashboard_agent_listen_port)
    assert (*got, params.metrics_export_port) == (7001, 7002, 7003, 7004)
    plain = plan.head_argv("ray", "10.1.2.3", 6000, 6001, None, "/tmp/t", 1, monitor=False, ports=ports)
    assert head[3:-2] == plain[2:]  # the same flags `ray start --head` takes, then the dashboard's modules
    host = ("10.1.2.3", "10.1.2.3:6379", catalog.slice_type("v4-16"), 2, "/tmp/t/h0", 1, False)
    argv = plan.lean_host_argv("/venv/bin/python", *host, ports=plan.AgentPorts(runtime_env=7005))
    params = rayhost.params_of(rayhost.parse(argv[3:]), ray_parameter)
    assert params.runtime_env_agent_port == 7005  # a host's stand-in agent writes its ports at once
    dashboard = (params.metrics_agent_port, params.dashboard_agent_listen_port, params.metrics_export_port)
    assert dashboard == (0, 0, 0)


@pytest.mark.parametrize(
    "argv",
    [
        ["--node-ip-address", "a", "--num-cpus", "1", "--temp-dir", "/t", "--object-store-memory", "1"],
        [
            "--head",
            "--node-ip-address",
            "a",
            "--num-cpus",
            "0",
            "--temp-dir",
            "/t",
            "--object-store-memory",
            "1",
        ],
        ["--address", "a:1", "--node-ip-address", "a", "--num-cpus", "1", "--temp-dir", "/t"],
        ["--address", "a:1", "--include-log-monitor", "yes"],
        ["--address", "a:1", "--block"],
    ],
)
def test_the_launcher_refuses_what_ray_start_would_not_mean(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        rayhost.parse(argv)
    assert exc.value.code == 2


def test_the_raylet_gets_the_stand_in_and_every_other_process_its_own_command() -> None:
    calls: list[tuple[list[str], str]] = []
    fake = SimpleNamespace(start_ray_process=lambda command, kind, *a, **k: calls.append((command, kind)))
    constants = SimpleNamespace(PROCESS_TYPE_RAYLET="raylet")
    rayhost._without_dashboard_agent(fake, constants)
    raylet = [
        "raylet",
        "--node_id=abc",
        "--session_dir=/s",
        "--dashboard_agent_command=python agent.py",
        "--x=1",
    ]
    fake.start_ray_process(raylet, "raylet")
    fake.start_ray_process(["python", "log_monitor.py"], "log_monitor")
    (got, _), (other, _) = calls
    assert other == ["python", "log_monitor.py"]
    assert got[:3] == raylet[:3] and got[4:] == raylet[4:]
    assert got[3] == "--dashboard_agent_command=" + rayhost.standin_command("abc", "/s")


def test_a_lean_host_can_use_the_heads_runtime_env_agent_and_the_head_forward_its_output() -> None:
    """What a lean fleet runs (docs/emulator.md): a host starts no runtime env agent (its raylet is
    given the head agent's port) and no log monitor (the head's forwards its workers' output)."""
    host = ("10.1.2.3", "10.1.2.3:6379", catalog.slice_type("v4-16"), 2, "/tmp/t/h0", 1, False)
    ports = plan.AgentPorts(runtime_env=7001)
    argv = plan.lean_host_argv("/venv/bin/python", *host, ports=ports, heads_runtime_env=True)
    assert argv[3:-2] == plan.host_argv("ray", *host, ports=ports)[2:] and argv[-2:] == [
        "--runtime-env-agent",
        "head",
    ]
    args = rayhost.parse(argv[3:])
    assert args.runtime_env_agent == "head" and not args.include_log_monitor
    assert rayhost.params_of(args, ray_parameter).runtime_env_agent_port == 7001  # the head's
    assert rayhost.parse(plan.lean_host_argv("/venv/bin/python", *host)[3:]).runtime_env_agent == "own"

    head = plan.lean_head_argv("/venv/bin/python", "10.1.2.3", 6000, 6001, "/tmp/t", 1, host_logs=True)
    assert head[-1] == "--host-logs" and rayhost.parse(head[3:]).host_logs
    assert not rayhost.parse(
        plan.lean_head_argv("/venv/bin/python", "10.1.2.3", 6000, 6001, "/tmp/t", 1)[3:]
    ).host_logs

    no_port = plan.lean_host_argv("/venv/bin/python", *host, heads_runtime_env=True)
    for wrong in (
        no_port[3:],  # the head's agent, but where?
        [
            *head[3:],
            "--runtime-env-agent",
            "head",
            "--runtime-env-agent-port",
            "7001",
        ],  # the head is the head
        [*argv[3:], "--host-logs"],  # a host forwards no one's output
        [*head[3:], "--include-log-monitor", "false"],  # forwarded by a log monitor the head would not run
    ):
        with pytest.raises(SystemExit) as exc:
            rayhost.parse(wrong)
        assert exc.value.code == 2, wrong


def test_the_raylet_gets_a_runtime_env_stand_in_when_the_host_uses_the_heads_agent() -> None:
    calls: list[tuple[list[str], str]] = []
    fake = SimpleNamespace(start_ray_process=lambda command, kind, *a, **k: calls.append((command, kind)))
    rayhost._with_the_heads_runtime_env_agent(fake, SimpleNamespace(PROCESS_TYPE_RAYLET="raylet"))
    raylet = [
        "raylet",
        "--runtime_env_agent_port=7001",
        "--runtime_env_agent_command=python main.py",
        "--x=1",
    ]
    fake.start_ray_process(raylet, "raylet")
    fake.start_ray_process(["python", "main.py"], "runtime_env_agent")
    (got, _), (other, _) = calls
    assert other == ["python", "main.py"] and got[:2] == raylet[:2] and got[3:] == raylet[3:]
    standin = got[2].removeprefix("--runtime_env_agent_command=")
    assert subprocess.list2cmdline(["/bin/sh", "-c", rayhost._UNTIL_THE_RAYLET_EXITS]) in standin
    assert standin.endswith(rayhost.RUNTIME_ENV_STANDIN_NAME)


def test_the_runtime_env_stand_in_writes_nothing_and_ends_with_its_raylet(tmp_path: Path) -> None:
    argv = ["/bin/sh", "-c", rayhost._UNTIL_THE_RAYLET_EXITS, rayhost.RUNTIME_ENV_STANDIN_NAME, "--x=1"]
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, *argv], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        assert parent.stdout is not None
        standin = int(parent.stdout.readline())
        time.sleep(0.5)
        assert not _gone(standin) and list(tmp_path.iterdir()) == []
        _ends_with_its_raylet(parent, standin)
    finally:
        parent.kill()
        parent.wait()


def test_the_heads_raylet_is_told_its_agents_listen_port_which_ray_passes_only_to_the_agent() -> None:
    calls: list[tuple[list[str], str]] = []
    fake = SimpleNamespace(start_ray_process=lambda command, kind, *a, **k: calls.append((command, kind)))
    rayhost._raylet_told_the_agent_listen_port(fake, SimpleNamespace(PROCESS_TYPE_RAYLET="raylet"), 7003)
    fake.start_ray_process(["raylet", "--node_id=abc"], "raylet")
    fake.start_ray_process(["python", "agent.py", "--listen-port=7003"], "dashboard_agent")
    assert calls == [
        (["raylet", "--node_id=abc", "--dashboard_agent_listen_port=7003"], "raylet"),
        (["python", "agent.py", "--listen-port=7003"], "dashboard_agent"),
    ]


def test_the_heads_dashboard_loads_only_the_modules_it_is_given() -> None:
    calls: list[tuple[list[str], str]] = []
    fake = SimpleNamespace(start_ray_process=lambda command, kind, *a, **k: calls.append((command, kind)))
    kinds = SimpleNamespace(PROCESS_TYPE_DASHBOARD="dashboard")
    rayhost._dashboard_with_modules(fake, kinds, "JobHead,StateHead")
    fake.start_ray_process(["python", "dashboard.py", "--port=6001"], "dashboard")
    fake.start_ray_process(["raylet", "--node_id=abc"], "raylet")
    assert calls == [
        (["python", "dashboard.py", "--port=6001", "--modules-to-load=JobHead,StateHead"], "dashboard"),
        (["raylet", "--node_id=abc"], "raylet"),
    ]
    # every name is one of the pinned Ray's dashboard modules (Ray fails the dashboard on a name it lacks)
    from ray.dashboard import utils
    from ray.dashboard.subprocesses.module import SubprocessModule

    known = {
        c.__name__
        for kind in (utils.DashboardHeadModule, SubprocessModule)
        for c in utils.get_all_modules(kind)
    }
    assert set(plan.DASHBOARD_MODULES) <= known, set(plan.DASHBOARD_MODULES) - known


PARENT = """
import subprocess, sys, time
child = subprocess.Popen(sys.argv[1:])
print(child.pid, flush=True)
time.sleep(120)
"""


def _ends_with_its_raylet(parent: subprocess.Popen[str], standin: int) -> None:
    """Kill the stand-in's parent (its raylet) as a crash would; the stand-in must end within 10 s."""
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while not _gone(standin) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(standin)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "Z"


@pytest.mark.parametrize("gnu_tail", [True, False])
def test_the_stand_in_reports_no_agent_services_and_ends_with_its_raylet(
    tmp_path: Path, gnu_tail: bool
) -> None:
    node = "ab" * 28
    session = tmp_path / "session"
    session.mkdir()
    env = dict(os.environ)
    if not gnu_tail:  # a PATH without tail: the stand-in falls back to polling its parent
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        for tool in ("mv", "sleep"):
            (bin_dir / tool).symlink_to(shutil.which(tool) or f"/bin/{tool}")
        env["PATH"] = str(bin_dir)
    argv = ["/bin/sh", "-c", rayhost.AGENT_STANDIN, rayhost.STANDIN_NAME]
    argv += [f"--node-id={node}", f"--session-dir={session}", "--agent-id", "7"]
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, *argv], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert parent.stdout is not None
        standin = int(parent.stdout.readline())
        names = ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port")
        deadline = time.monotonic() + 10
        while not all((session / f"{n}_{node}").exists() for n in names) and time.monotonic() < deadline:
            time.sleep(0.05)
        # What Ray's own agent writes for a service that is off, and what Ray's persist_port reads
        assert {(session / f"{n}_{node}").read_text().strip() for n in names} == {"-1"}
        assert sorted(p.name for p in session.iterdir()) == sorted(f"{n}_{node}" for n in names)
        time.sleep(0.5)
        assert not _gone(standin)  # it stays while its raylet lives (Ray ends a raylet whose agent exits)
        _ends_with_its_raylet(parent, standin)
    finally:
        parent.kill()
        parent.wait()


def test_components_are_named_from_command_lines() -> None:
    cases = {
        "/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --raylet_socket_name=x": "raylet",
        "/venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server --x": "gcs server",
        "ray::DashboardAgent": "dashboard agent",
        "ray::RuntimeEnvAgent": "runtime env agent",
        "tail --pid=12 -f /dev/null": "agent stand-in",
        f"/bin/sh -c {rayhost.AGENT_STANDIN} {rayhost.STANDIN_NAME} --node-id=a": "dashboard agent stand-in",
        f"/bin/sh -c {rayhost._UNTIL_THE_RAYLET_EXITS} {rayhost.RUNTIME_ENV_STANDIN_NAME}": (
            "runtime env agent stand-in"
        ),
        "/venv/bin/python -u /venv/lib/ray/_private/log_monitor.py --x": "log monitor",
        "ray::IDLE": "worker",
        "ray::train_fn": "worker",
        "/venv/bin/python -P /src/tpufleet/emulator/rayhost.py --address a": "launcher",
        "/venv/bin/ray start --head --port 1": "launcher",
        "/usr/bin/sleep 5": "other",
    }
    assert {c: procs.component(c) for c in cases} == cases


def test_memory_reads_pss_and_rss_of_live_processes_only() -> None:
    child = subprocess.Popen([sys.executable, "-c", "b = bytearray(40 << 20); import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 10
        found: list[Any] = []
        while time.monotonic() < deadline:
            found = procs.memory([child.pid])
            if found and found[0].pss > 40 << 20:
                break
            time.sleep(0.1)
        (mem,) = found
        assert mem.pid == child.pid and mem.component == "other"
        assert 40 << 20 < mem.pss <= mem.rss  # its private 40 MiB count in full; shared pages split
    finally:
        child.kill()
        child.wait()
    assert procs.memory([child.pid]) == []


def test_hosts_start_in_waves_each_once_the_last_has_joined(tmp_path: Path) -> None:
    from tpufleet.emulator import EmulatedFleet
    from tpufleet.emulator.state import FleetState

    fleet = EmulatedFleet("v4-64:2,v6e-4", state_dir=tmp_path, wave_size=8)  # 8 + 8 + 1 hosts
    st = FleetState("f", "10.1.2.3", 1, 2, "/tmp/t", 1, 1, True, lean=True)
    for stype, count in fleet._spec:
        for i in range(count):
            fleet._new_slice(st, stype, f"tpu-{stype.accelerator_type}-{i}")
    events: list[tuple[str, Any]] = []

    def launch(st: FleetState, hosts: Any) -> Any:
        events.append(("launch", [(rec.name, worker) for rec, worker in hosts]))
        return [(f"launcher of {len(hosts)}", tmp_path / "log")]  # a wave: one group launcher

    def wait(st: FleetState, launchers: Any, keys: list[Any]) -> None:
        events.append(("await", (len(launchers), sorted(keys))))

    head: Any = ("head proc", tmp_path / "head.log")
    fleet._start_in_waves(st, head, launch=launch, wait=wait)

    assert [kind for kind, _ in events] == ["launch", "await"] * 3
    launched = [what for kind, what in events if kind == "launch"]
    assert [len(hosts) for hosts in launched] == [8, 8, 1]
    awaited = [what for kind, what in events if kind == "await"]
    assert [n for n, _ in awaited] == [2, 1, 1]  # the head's launcher is checked with the first wave
    assert awaited[0][1] == sorted(("tpu-v4-64-0", w) for w in range(8)) == sorted(launched[0])
    assert awaited[2][1] == [("tpu-v6e-4-0", 0)]
    assert sorted(h for hosts in launched for h in hosts) == sorted(
        (rec.name, h.worker_id) for rec in st.slices for h in rec.hosts
    )


def test_a_lean_fleets_hosts_use_the_heads_agent_and_log_monitor_and_an_older_fleets_their_own(
    tmp_path: Path,
) -> None:
    from tpufleet.emulator import EmulatedFleet
    from tpufleet.emulator.state import FleetState

    fleet = EmulatedFleet("v4-16", state_dir=tmp_path)
    st = FleetState("f", "127.0.0.1", 1, 2, "/tmp/t", 1, 1, True, lean=True)  # a host binds a port here
    st.runtime_env_port, st.host_logs_on_head = 7001, True  # what _launch_head records
    rec = fleet._new_slice(st, catalog.slice_type("v4-16"), "tpu-v4-16-0")
    _, argv, _, _ = fleet._host_start(st, rec, 0, 7999)
    args = rayhost.parse(argv[3:])
    assert (args.runtime_env_agent, args.runtime_env_agent_port, args.include_log_monitor) == (
        "head",
        7001,
        False,
    )

    # a fleet saved before these fields (its head runs neither for the hosts): each host its own
    data = st.to_dict()
    assert (
        FleetState.from_dict(data).runtime_env_port == 7001 and FleetState.from_dict(data).host_logs_on_head
    )
    old = FleetState.from_dict(
        {k: v for k, v in data.items() if k not in ("runtime_env_port", "host_logs_on_head")}
    )
    _, argv, _, _ = fleet._host_start(old, old.slices[0], 1, 7999)
    args = rayhost.parse(argv[3:])
    assert (args.runtime_env_agent, args.runtime_env_agent_port, args.include_log_monitor) == (
        "own",
        7999,
        True,
    )


# A group launcher whose node start is a stand-in: it reports what its host sees and exits with
# the code its host's env asks for. Everything else is rayhost.py's own (fork, setsid, env, logs).
GROUP = """
import os, sys
from tpufleet.emulator import rayhost
rayhost._RAY_MODULES = ()
def start(args):
    print("host", os.environ["HOST_MARK"], "session leader", os.getsid(0) == os.getpid(),
          "flags", args.address, "secret" in os.environ, flush=True)
    return int(os.environ.get("HOST_EXIT", "0"))
rayhost.start = start
sys.exit(rayhost.main(["--group", sys.argv[1]]))
"""


def _group(tmp_path: Path, exits: list[int]) -> tuple[int, str, list[Path], list[procs.Session | None]]:
    """``procs.spawn_group`` with the launcher above, waited for: exit code, its log, hosts logs, sessions."""
    flags = ["--address", "10.1.2.3:6379", "--node-ip-address", "10.1.2.3", "--num-cpus", "1"]
    flags += ["--temp-dir", "/tmp/t", "--object-store-memory", "1"]
    logs = [tmp_path / f"h{i}.log" for i in range(len(exits))]
    hosts = [
        (flags, {"HOST_MARK": str(i), "HOST_EXIT": str(code), "PATH": os.environ["PATH"]}, logs[i])
        for i, code in enumerate(exits)
    ]
    env = dict(os.environ, secret="the launcher's own environment")
    log = tmp_path / "group.log"
    proc, sessions = procs.spawn_group([sys.executable, "-c", GROUP], env, log, hosts, 60)
    code = proc.wait(timeout=HANG_GUARD_S)
    return code, log.read_text(), logs, sessions


def test_a_group_launcher_starts_each_host_as_its_own_session_with_exactly_its_environment(
    tmp_path: Path,
) -> None:
    code, out, logs, sessions = _group(tmp_path, [0, 0, 0])
    assert code == 0, out
    assert not (tmp_path / "group.json").exists()  # it holds the hosts' environments: read, then gone
    for i, log in enumerate(logs):
        assert log.read_text().strip() == f"host {i} session leader True flags 10.1.2.3:6379 False"
    assert all(s is not None and s.start_ticks > 0 for s in sessions)
    assert len({s.sid for s in sessions if s is not None}) == 3  # three sessions, one per host


def test_a_group_launcher_fails_when_one_host_fails_and_names_its_log(tmp_path: Path) -> None:
    code, out, logs, sessions = _group(tmp_path, [0, 3, 0])
    assert code == 1 and all(s is not None for s in sessions)
    assert f"a host failed to start (exit 3); {logs[1]}" in out
    assert "host 1 session leader True" in out  # the failed host's log, quoted
    assert logs[2].read_text().startswith("host 2 ")  # the others still started


FORKING = """
import json, os, subprocess, sys
from types import SimpleNamespace
from tpufleet.emulator import rayhost
calls = []
services = SimpleNamespace(
    start_ray_process=lambda command, kind, *a, **k: calls.append(kind),
    ProcessInfo=lambda **kw: SimpleNamespace(**kw),
)
constants = SimpleNamespace(PROCESS_TYPE_LOG_MONITOR="log_monitor")
pid = rayhost._log_monitor_from_a_fork(services, constants)
if sys.argv[1] == "none":
    print(json.dumps({"pid": pid}))
    sys.exit(0)
os.environ["TPUFLEET_PROBE"] = "set after the fork"
services.start_ray_process(["raylet"], "raylet", fate_share=False)
info = services.start_ray_process(
    [sys.executable, "-u", sys.argv[1], "--out", sys.argv[2]],
    "log_monitor",
    fate_share=False,
    stdout_file=subprocess.DEVNULL,
    stderr_file=None,
)
services.start_ray_process(["another"], "log_monitor", fate_share=False)
code = info.process.wait(timeout=30)
print(json.dumps({"pid": pid, "handed": info.process.pid, "calls": calls, "code": code, "me": os.getpid()}))
"""

MONITOR = """
import json, os, signal, sys
fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
out = {
    "argv": sys.argv, "name": __name__, "probe": os.environ.get("TPUFLEET_PROBE"), "fds": fds,
    "stdout": os.readlink("/proc/self/fd/1"), "parent": os.getppid(),
    "title": open("/proc/self/cmdline").read().replace("\\0", " ").strip(),
    "forked": "tpufleet.emulator.rayhost" in sys.modules,
    "sigint_blocked": bool(int(status["SigBlk"], 16) & (1 << (signal.SIGINT - 1))),
}
open(sys.argv[sys.argv.index("--out") + 1], "w").write(json.dumps(out))
sys.exit(7)
"""


def test_the_log_monitor_is_a_fork_made_before_the_node_that_becomes_ray_s_command(tmp_path: Path) -> None:
    script, out = tmp_path / "log_monitor.py", tmp_path / "out.json"
    script.write_text(MONITOR)
    run = subprocess.run(
        [sys.executable, "-c", FORKING, str(script), str(out)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert run.returncode == 0, run.stderr
    parent = json.loads(run.stdout)
    assert parent["handed"] == parent["pid"] and parent["code"] == 7  # its exit code is the script's
    assert parent["calls"] == ["raylet", "log_monitor"]  # the rest, and a second monitor: Ray's way
    got = json.loads(out.read_text())
    assert got["forked"] and got["parent"] == parent["me"]  # a fork: the launcher's imports, no exec
    assert got["name"] == "__main__" and got["argv"] == [str(script), "--out", str(out)]
    assert got["probe"] == "set after the fork"  # the environment Ray would have given it
    assert got["title"] == f"{sys.executable} -u {script} --out {out}"  # what `ps` and `ray stop` see
    assert got["stdout"] == os.devnull and got["sigint_blocked"]  # as start_ray_process's Popen
    assert got["fds"][:3] == [0, 1, 2] and len(got["fds"]) <= 4  # stdio (+ listdir's own): no pipe


CHOOSING = """
import json, sys
from types import SimpleNamespace
from tpufleet.emulator import rayhost
services = SimpleNamespace(
    start_ray_process=lambda command, kind, *a, **k: "ray's own", ProcessInfo=lambda **kw: "the fork"
)
rayhost._log_monitor_from_a_fork(services, SimpleNamespace(PROCESS_TYPE_LOG_MONITOR="log_monitor"))
got = services.start_ray_process([sys.executable, "-u", sys.argv[1]], "log_monitor", stdout_file=None)
print(json.dumps(got))
"""


@pytest.mark.parametrize(
    ("env", "handed_to"),
    [(plan.NODE_ENV, "the fork"), ({"RAY_LOG_MONITOR_GDB": "1"}, "ray's own"), ({}, "the fork")],
)
def test_only_a_debugging_variable_keeps_the_log_monitor_from_the_fork(
    tmp_path: Path, env: dict[str, str], handed_to: str
) -> None:
    """Ray runs a process under gdb, valgrind or tmux for RAY_<TYPE>_<TOOL>; the fleet's own
    RAY_LOG_MONITOR_MANY_FILES_THRESHOLD (plan.NODE_ENV) is a setting and must not count as one."""
    script = tmp_path / "log_monitor.py"
    script.write_text("pass\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_LOG_MONITOR_")}
    run = subprocess.run(
        [sys.executable, "-c", CHOOSING, str(script)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        env=base | env,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == handed_to


def test_a_log_monitor_fork_never_handed_a_command_exits_with_its_launcher(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-c", FORKING, "none"], capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert run.returncode == 0, run.stderr
    pid = json.loads(run.stdout)["pid"]
    deadline = time.monotonic() + 10
    while not _gone(pid):
        assert time.monotonic() < deadline, f"the fork {pid} outlived its launcher"
        time.sleep(0.05)


def test_a_forked_process_reaped_elsewhere_reads_as_ended_as_popen_does() -> None:
    child = rayhost._Forked(os.getppid())  # not our child: waitpid fails with ECHILD
    assert child.poll() == 0 and child.wait(timeout=1) == 0


def test_an_object_store_ray_would_refuse_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """Ray's own refusal came as the head's traceback, after the start had begun."""
    from tpufleet.emulator import EmulatedFleet
    from tpufleet.errors import SpecError

    with pytest.raises(SpecError, match="object store of 10 MiB a host: Ray needs at least 75 MiB"):
        EmulatedFleet("v4-8", state_dir=tmp_path / "fleet", object_store_mb=10)
    assert not (tmp_path / "fleet").exists()
