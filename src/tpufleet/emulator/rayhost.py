"""Start one emulated TPU host's Ray node (or the head's), as ``ray start`` would, lean.

Run as a script, ``python -P rayhost.py <ray start flags>`` (:func:`tpufleet.emulator.plan.lean_host_argv`
and ``lean_head_argv``); the rest of tpufleet imports it only for its pure parts (tests). It takes
the flags of ``ray start`` that ``plan.host_argv``/``head_argv`` give, with the same meaning, and
makes the calls ``ray start`` makes after parsing them (``RayParams``, ``ray._private.node.Node``,
as ``ray.cluster_utils.Cluster`` does too), so what runs is Ray's own: the raylet (scheduler,
object store, worker pool), the runtime env agent (runtime_env, Ray jobs' working dirs), the log
monitor (worker output to drivers) unless ``--include-log-monitor false``, and on the head the GCS
and dashboard (the autoscaler monitor and the Ray Client server only when asked for; the lean
head asks for neither, see ``plan.lean_head_argv``). Two differences:

- **No ``ray start`` CLI**: its module imports Ray Serve (pandas, numpy), 1.2-2.4 s of CPU and
  ~190 MiB per node before any Ray process starts; this imports only ``Node``'s path (~0.4 s).
- **A host's dashboard agent is a stand-in** (~80 MiB and ~2 s of CPU saved per host). The raylet
  insists on launching an agent and ends itself when it exits, so its agent command becomes
  :data:`AGENT_STANDIN`, a shell that writes ``-1`` to the agent's three port files and then waits
  for the raylet to exit. ``-1`` is what Ray's own agent writes for a service that is off (a
  minimal install, metrics collection disabled, an HTTP server that failed), so the raylet, the GCS
  and every worker treat the node's metrics export, agent gRPC and agent HTTP (log and job APIs)
  as absent. Nothing Ray core, Ray Train or JAX needs runs there; the head keeps Ray's agent.

- **The log monitor is a fork of the launcher**, not a fresh interpreter: its ~0.5 s of CPU is
  importing Ray, which the launcher has done already. Before the node connects to anything (no
  gRPC thread yet, so forking is safe) the launcher forks a child that waits on a pipe; when Ray
  would start the log monitor, the child gets Ray's command line and environment instead and runs
  Ray's ``log_monitor.py`` as ``__main__`` under that command line's title (what ``ps`` and
  ``ray stop`` look for), in the host's session, with stdout and stderr as Ray would set them.

- **A host's runtime env agent can be the head's** (``--runtime-env-agent head``, what a lean fleet
  does): the raylet is given the head agent's port (all nodes of a fleet share this machine's IP and
  file system) and, as the agent it launches and fate-shares with, a shell that only waits for it.
- **The head's log monitor can forward every host's output** (``--host-logs``, what a lean fleet
  does; the hosts then start none): its fork runs ``fleetlogs.main``, Ray's ``LogMonitor`` for the
  head and for each host found under the head's ``--temp-dir``.

Prestarted workers are off through the environment (``plan.LEAN_HOST_ENV``), not here.

A host starting up waits until the head node is registered (Ray reads the head's session and temp
dirs from its node info), which made every host of a fleet wait for the head twice over:

- **The head's dashboard starts after its raylet**, not before: ``ray start --head`` registers the
  head only once the dashboard has started and published its URL (~2 s of imports on a 2-core
  machine), which the hosts do not use. The dashboard still starts, and the head's launcher still
  returns only once it answers, so ``EmulatedFleet.up`` returns with Ray's job API up as before.
- **A host looks for the head every 50 ms**, not every 2 s (Ray's pause between two reads of the
  node table when the head is not there yet; hosts start at the same time as the head, so they
  always missed it once), for as long as Ray would look.

And a node waiting for its own raylet to register asks the GCS every 50 ms: Ray asks again at once,
each time through a new GCS connection, and five nodes starting on two cores spent seconds of CPU
doing so, which slowed the raylets they waited for.

Both waits last ``REGISTER_WAIT_S`` (four minutes), not Ray's 30 s for a node's own raylet and 40 s
for the head: on an overloaded machine (several fleets starting at once on a 2-core CI runner) the
GCS answered late and a healthy node gave up (``The current node timed out during startup``), which
left the fleet half started; two minutes were once not enough for a host waiting on a head that a
CI runner started slowly. A node that is really broken still fails, after four minutes.
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import os
import runpy
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

# The dashboard agent's stand-in, a POSIX shell script (no quotes or backslashes: the raylet splits
# its agent command itself). The raylet appends nothing we rely on; the node id and session dir
# come as arguments. Port files are written whole (temp file, then rename): the raylet polls them.
# It then waits for its parent, the raylet, to exit: GNU tail's --pid, else a kill -0 loop.
_UNTIL_THE_RAYLET_EXITS = (
    "tail --pid=$PPID -f /dev/null 2>/dev/null || while kill -0 $PPID 2>/dev/null; do sleep 1; done"
)
AGENT_STANDIN = (
    "for a; do case $a in --node-id=*) n=${a#*=};; --session-dir=*) d=${a#*=};; esac; done; "
    "for p in metrics_agent_port metrics_export_port dashboard_agent_listen_port; "
    "do echo -1 > $d/.${p}_$n && mv $d/.${p}_$n $d/${p}_$n; done; " + _UNTIL_THE_RAYLET_EXITS
)
STANDIN_NAME = "tpufleet-agent-standin"
# A host's runtime env agent when it uses the head's (``--runtime-env-agent head``): the raylet is
# given the head's agent port and only needs a child to fate-share with, which writes nothing.
RUNTIME_ENV_STANDIN_NAME = "tpufleet-runtime-env-standin"


def _flag(command: list[str], name: str) -> str:
    prefix = f"--{name}="
    return next(a[len(prefix) :] for a in command if a.startswith(prefix))


def standin_command(node_id: str, session_dir: str) -> str:
    """The ``--dashboard_agent_command`` value that starts the stand-in for one raylet."""
    argv = [
        "/bin/sh",
        "-c",
        AGENT_STANDIN,
        STANDIN_NAME,
        f"--node-id={node_id}",
        f"--session-dir={session_dir}",
    ]
    return subprocess.list2cmdline(argv)


def _raylet_agent_as(
    services: Any, constants: Any, agent: str, command_for: Callable[[list[str]], str]
) -> None:
    """Make ``services.start_ray_process`` give every raylet ``command_for(raylet's command)`` as
    its ``--<agent>_agent_command`` (the process it launches as that agent and fate-shares with)."""
    original = services.start_ray_process
    prefix = f"--{agent}_agent_command="

    def start_ray_process(command: list[str], process_type: str, *args: Any, **kwargs: Any) -> Any:
        if process_type == constants.PROCESS_TYPE_RAYLET:
            value = command_for(command)
            command = [prefix + value if a.startswith(prefix) else a for a in command]
        return original(command, process_type, *args, **kwargs)

    services.start_ray_process = start_ray_process


def _without_dashboard_agent(services: Any, constants: Any) -> None:
    """Make ``services.start_ray_process`` give every raylet the stand-in as its dashboard agent."""
    _raylet_agent_as(
        services,
        constants,
        "dashboard",
        lambda command: standin_command(_flag(command, "node_id"), _flag(command, "session_dir")),
    )


def _with_the_heads_runtime_env_agent(services: Any, constants: Any) -> None:
    """Make ``services.start_ray_process`` give every raylet a stand-in as its runtime env agent
    (see the module docstring): the raylet's ``--runtime_env_agent_port`` is then the head's agent,
    which serves this host's worker starts as the host's own would have."""
    standin = subprocess.list2cmdline(["/bin/sh", "-c", _UNTIL_THE_RAYLET_EXITS, RUNTIME_ENV_STANDIN_NAME])
    _raylet_agent_as(services, constants, "runtime_env", lambda _command: standin)


def _with_flag(services: Any, process_type: str, flag: str) -> None:
    """Make ``services.start_ray_process`` add ``flag`` to the command of every ``process_type``."""
    original = services.start_ray_process

    def start_ray_process(command: list[str], kind: str, *args: Any, **kwargs: Any) -> Any:
        if kind == process_type:
            command = [*command, flag]
        return original(command, kind, *args, **kwargs)

    services.start_ray_process = start_ray_process


def _raylet_told_the_agent_listen_port(services: Any, constants: Any, port: int) -> None:
    """Give the raylet ``--dashboard_agent_listen_port``, which Ray's Python leaves out (it passes
    the port only to the agent): told none, the raylet waits ~15 s for the agent's port file and
    then aborts (see ``plan.AgentPorts``)."""
    _with_flag(services, constants.PROCESS_TYPE_RAYLET, f"--dashboard_agent_listen_port={port}")


def _dashboard_with_modules(services: Any, constants: Any, modules: str) -> None:
    """Start the dashboard with only ``modules`` (Ray's ``dashboard.py --modules-to-load``, which
    ``ray start`` does not expose)."""
    _with_flag(services, constants.PROCESS_TYPE_DASHBOARD, f"--modules-to-load={modules}")


def _dashboard_after_raylet(node_class: Any) -> None:
    """Make the head's ``Node`` start its dashboard (Ray's API server) right after its raylet and
    the processes that go with it, instead of before them (see the module docstring)."""
    deferred: dict[int, dict[str, Any]] = {}
    start_api_server, start_ray_processes = node_class.start_api_server, node_class.start_ray_processes

    def defer(self: Any, **kwargs: Any) -> None:
        deferred[id(self)] = kwargs

    def then_api_server(self: Any) -> None:
        start_ray_processes(self)
        kwargs = deferred.pop(id(self), None)
        if kwargs is not None:
            start_api_server(self, **kwargs)

    node_class.start_api_server = defer
    node_class.start_ray_processes = then_api_server


# How often a starting node asks again (for the head, for its own raylet) and checks a forked child.
POLL_S = 0.05
# How long a starting node waits for the head, and for its own raylet, to be registered in the GCS.
REGISTER_WAIT_S = 240.0


def _poll_for_the_head_quickly(node_module: Any, constants: Any) -> None:
    """Make a host's ``Node`` read the node table for the head every ``POLL_S`` instead of
    every 2 s, for ``REGISTER_WAIT_S`` or as long as Ray's own retries would take, whichever is
    longer (see the module docstring)."""
    how_long = max(constants.NUM_REDIS_GET_RETRIES * 2.0, REGISTER_WAIT_S)

    def until_retrieved(
        gcs_client: Any, node_selectors: Any = None, state_filter: Any = None, **kw: Any
    ) -> Any:
        deadline = time.monotonic() + how_long
        while True:
            try:
                found = list(
                    gcs_client.get_all_node_info(
                        timeout=kw.get("timeout_per_retry"),
                        node_selectors=node_selectors,
                        state_filter=state_filter,
                    ).values()
                )
            except Exception:  # the GCS answers late while it starts: as Ray does, try again
                found = []
            if found or time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
        if not found:
            raise RuntimeError(f"no head node registered in the GCS within {how_long:.0f} s")
        return found

    node_module.get_all_node_info_until_retrieved = until_retrieved


def _paced_node_lookup(services: Any) -> None:
    """Make ``services.get_node`` ask again every ``POLL_S`` while the raylet has not registered
    (or the GCS answers late), for up to ``REGISTER_WAIT_S``, before Ray's own loop (which gives
    up after 30 s) sees a miss (see the module docstring)."""
    get_node = services.get_node

    def paced(gcs_address: str, node_id: str) -> Any:
        deadline = time.monotonic() + REGISTER_WAIT_S
        while True:
            try:
                return get_node(gcs_address, node_id)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(POLL_S)

    services.get_node = paced


class _Forked:
    """What ``start_ray_process`` hands back for a process forked here (the part of ``Popen`` that
    Ray's ``Node`` uses): its pid, ``poll``, ``wait``, ``kill`` and ``terminate``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else: as Popen, taken as ended with 0
                self.returncode = 0
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"process {self.pid} still runs after {timeout} s")
            time.sleep(POLL_S)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)


# The variables that make Ray's start_ray_process run a process under a tool (``RAY_<TYPE>_<TOOL>``),
# which a forked log monitor would not honour. Only these: ``RAY_LOG_MONITOR_MANY_FILES_THRESHOLD``
# (``plan.NODE_ENV``) is a setting, and matching every ``RAY_LOG_MONITOR_*`` made each log monitor a
# fresh interpreter again without anyone noticing.
DEBUGGERS = ("VALGRIND", "VALGRIND_PROFILER", "PERFTOOLS_PROFILER", "TMUX", "GDB")


def _log_monitor_from_a_fork(services: Any, constants: Any, hosts_under: str | None = None) -> int:
    """Make the node's log monitor a fork of this process, made now, before the node connects to
    anything (see the module docstring). The fork waits on a pipe for the command Ray would have
    run; given one, it becomes that process (its environment, output, title and script, run as
    ``__main__``); given none (no log monitor, or the start failed: the pipe closes), it exits.
    ``hosts_under`` (the head's ``--host-logs``): the fork runs ``fleetlogs.main`` with Ray's
    command line instead, which also forwards the output of every host under that temp dir.
    Returns the fork's pid."""
    reader, writer = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(writer)
        _become_the_log_monitor(reader)
    os.close(reader)
    original = services.start_ray_process
    handed = False

    def start_ray_process(command: list[str], process_type: str, *args: Any, **kwargs: Any) -> Any:
        nonlocal handed
        debugging = any(f"RAY_{process_type.upper()}_{tool}" in os.environ for tool in DEBUGGERS)
        if (
            handed
            or process_type != constants.PROCESS_TYPE_LOG_MONITOR
            or debugging  # valgrind, gdb, profilers, tmux: Ray's own way
            or "RAY_JEMALLOC_PROFILE" in os.environ
            or kwargs.get("fate_share")
            or args  # called positionally: not the call start_log_monitor makes
            or set(kwargs) - {"fate_share", "stdout_file", "stderr_file"}
        ):
            return original(command, process_type, *args, **kwargs)
        handed = True
        quiet = [kwargs.get(k) == subprocess.DEVNULL for k in ("stdout_file", "stderr_file")]
        order = {"argv": command, "env": dict(os.environ), "quiet": quiet, "hosts_under": hosts_under}
        with os.fdopen(writer, "wb") as pipe:
            pipe.write(json.dumps(order).encode())
        return services.ProcessInfo(
            process=_Forked(pid),
            stdout_file=kwargs.get("stdout_file"),
            stderr_file=kwargs.get("stderr_file"),
            use_valgrind=False,
            use_gdb=False,
            use_valgrind_profiler=False,
            use_perftools_profiler=False,
            use_tmux=False,
        )

    services.start_ray_process = start_ray_process
    return pid


def _become_the_log_monitor(reader: int) -> NoReturn:
    """The fork's side of :func:`_log_monitor_from_a_fork`."""
    code = 0
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # as Ray's start_ray_process
        os.closerange(3, reader)  # as Popen(close_fds=True): only the pipe and stdio stay
        os.closerange(reader + 1, os.sysconf("SC_OPEN_MAX"))
        with os.fdopen(reader, "rb") as pipe:
            raw = pipe.read()
        if not raw:
            os._exit(0)  # no log monitor wanted, or the node did not start
        order = json.loads(raw)
        os.environ.clear()
        os.environ.update(order["env"])
        null = os.open(os.devnull, os.O_WRONLY)
        for fd, quiet in zip((1, 2), order["quiet"], strict=True):
            if quiet:
                os.dup2(null, fd)
        os.close(null)
        title = subprocess.list2cmdline(order["argv"])  # `ps` (and `ray stop`) see Ray's command
        importlib.import_module("ray._raylet").setproctitle(title)
        script = next(a for a in order["argv"][1:] if not a.startswith("-"))
        sys.argv = [script, *order["argv"][order["argv"].index(script) + 1 :]]
        if "-u" in order["argv"][: order["argv"].index(script)]:  # as python -u: unbuffered output
            for stream in (sys.stdout, sys.stderr):
                if isinstance(stream, io.TextIOWrapper):
                    stream.reconfigure(write_through=True)
        if order.get("hosts_under"):
            from tpufleet.emulator import fleetlogs

            fleetlogs.main(sys.argv[1:], order["hosts_under"])
        else:
            runpy.run_path(script, run_name="__main__")
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _bool(text: str) -> bool:
    if text not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text == "true"


def parse(argv: list[str]) -> argparse.Namespace:
    """The flags of ``ray start`` that the emulator's command lines use (``plan.head_argv``,
    ``plan.host_argv``), with ``ray start``'s names and meaning; any other is an error."""
    p = argparse.ArgumentParser(prog="rayhost", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--head", action="store_true")
    p.add_argument("--port", type=int, help="the head's GCS port")
    p.add_argument("--address", help="the GCS address (ip:port) a host joins")
    p.add_argument("--node-ip-address", required=True)
    p.add_argument("--num-cpus", type=int, required=True)
    p.add_argument("--num-gpus", type=int, default=0)
    p.add_argument("--resources", default="{}", help="JSON, as for ray start")
    p.add_argument("--temp-dir", required=True)
    p.add_argument("--object-store-memory", type=int, required=True)
    p.add_argument("--include-log-monitor", type=_bool, default=True)
    p.add_argument("--include-dashboard", type=_bool, default=None)
    p.add_argument("--dashboard-port", type=int)
    p.add_argument("--ray-client-server-port", type=int)
    p.add_argument("--min-worker-port", type=int, default=0)
    p.add_argument("--max-worker-port", type=int, default=0)
    p.add_argument("--dashboard-agent-listen-port", type=int, default=0)
    p.add_argument("--dashboard-agent-grpc-port", type=int, default=0)
    p.add_argument("--metrics-export-port", type=int, default=0)
    p.add_argument("--runtime-env-agent-port", type=int, default=0)
    p.add_argument("--disable-usage-stats", action="store_true")
    p.add_argument("--no-monitor", action="store_true", help="no autoscaler monitor on the head")
    p.add_argument(
        "--dashboard-modules",
        help="not a ray start flag: the head's dashboard modules to load, comma-separated (default all)",
    )
    p.add_argument(
        "--dashboard-agent",
        choices=["real", "standin"],
        help="not a ray start flag: the head's default is Ray's agent, a host's the stand-in",
    )
    p.add_argument(
        "--host-logs",
        action="store_true",
        help="not a ray start flag: the head's log monitor also forwards every host's under --temp-dir",
    )
    p.add_argument(
        "--runtime-env-agent",
        choices=["own", "head"],
        default="own",
        help="not a ray start flag: 'head' starts none; --runtime-env-agent-port is then the head's agent",
    )
    args = p.parse_args(argv)
    if args.host_logs and not (args.head and args.include_log_monitor):
        p.error("--host-logs is for a head that runs a log monitor")
    if args.runtime_env_agent == "head" and (args.head or not args.runtime_env_agent_port):
        p.error("--runtime-env-agent head is for a host, with the head agent's --runtime-env-agent-port")
    if args.head == (args.address is not None):
        p.error("give either --head (with --port) or --address")
    if args.head and args.port is None:
        p.error("--head needs --port")
    if args.dashboard_agent is None:
        args.dashboard_agent = "real" if args.head else "standin"
    return args


def params_of(args: argparse.Namespace, ray_parameter: Any) -> Any:
    """The ``RayParams`` ``ray start`` builds from the same flags."""
    params = ray_parameter.RayParams(
        node_ip_address=args.node_ip_address,
        node_name=args.node_ip_address,
        min_worker_port=args.min_worker_port,
        max_worker_port=args.max_worker_port,
        ray_client_server_port=args.ray_client_server_port,
        object_store_memory=args.object_store_memory,
        num_cpus=args.num_cpus,
        num_gpus=args.num_gpus,
        resources=json.loads(args.resources),
        labels={},
        temp_dir=args.temp_dir,
        include_dashboard=args.include_dashboard,
        dashboard_port=args.dashboard_port,
        dashboard_agent_listen_port=args.dashboard_agent_listen_port,
        metrics_agent_port=args.dashboard_agent_grpc_port,  # `ray start` names it so
        metrics_export_port=args.metrics_export_port,
        runtime_env_agent_port=args.runtime_env_agent_port,
        include_log_monitor=args.include_log_monitor,
    )
    if args.head:
        params.gcs_server_port = args.port
        params.no_monitor = args.no_monitor
        params.update_if_absent(redis_shard_ports=None, num_redis_shards=None, redis_max_clients=None)
    else:
        params.gcs_address = args.address
    return params


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--group"] and len(argv) == 2:
        return group_main(argv[1])
    return start(parse(argv))


def start(args: argparse.Namespace) -> int:
    """Start one node as ``ray start`` would with these flags; returns once it runs."""
    import ray._private.node as ray_node
    import ray._private.parameter as ray_parameter
    import ray._private.ray_constants as ray_constants
    import ray._private.services as services

    if args.dashboard_agent == "standin":
        _without_dashboard_agent(services, ray_constants)
    elif args.dashboard_agent_listen_port:
        _raylet_told_the_agent_listen_port(services, ray_constants, args.dashboard_agent_listen_port)
    if args.runtime_env_agent == "head":
        _with_the_heads_runtime_env_agent(services, ray_constants)
    if args.dashboard_modules:
        _dashboard_with_modules(services, ray_constants, args.dashboard_modules)
    if args.include_log_monitor:
        _log_monitor_from_a_fork(services, ray_constants, args.temp_dir if args.host_logs else None)
    _paced_node_lookup(services)
    if args.head:
        _dashboard_after_raylet(ray_node.Node)
    else:
        _poll_for_the_head_quickly(ray_node, ray_constants)
    params = params_of(args, ray_parameter)
    node = ray_node.Node(params, head=args.head, shutdown_at_exit=False, spawn_reaper=False)
    if args.head:
        # As `ray start --head` does: "auto" on this node (Ray's job supervisor giving a Ray job's
        # driver its RAY_ADDRESS) reads it from the temp dir, instead of picking whichever Ray
        # cluster this machine runs (another fleet's, whose token differs).
        import ray._private.utils as ray_utils

        ray_utils.write_ray_address(node.address, args.temp_dir)
    what = "head" if args.head else "host"
    print(f"emulated {what} started: Ray node {node.node_id} at {node.address}", flush=True)
    return 0


_RAY_MODULES = (
    "ray._private.node",
    "ray._private.parameter",
    "ray._private.ray_constants",
    "ray._private.services",
    "ray._private.utils",
)


def group_main(spec_path: str) -> int:
    """Start several hosts from one process (``--group SPEC``): Ray's modules are imported once,
    then each host is a child forked from here, so a wave of N hosts pays one import (~0.4 s of
    CPU) instead of N. Each child makes itself a session leader (a host is its session, as for a
    launcher of its own), takes exactly its host's environment and log, and starts its node.

    ``SPEC`` is a JSON file, read and then removed (it holds the hosts' environments):
    ``{"hosts": [{"argv": [...], "env": {...}, "log": PATH}, ...], "sessions": PATH}``. For each
    child, ``<index> <pid> <start ticks>`` is appended to ``sessions`` right after the fork, so
    the fleet knows every host's session before any of them has started. Exit 0 when every child
    did; otherwise a line per failed host."""
    path = Path(spec_path)
    spec = json.loads(path.read_text())
    path.unlink()
    hosts = [(parse(h["argv"]), h) for h in spec["hosts"]]  # a bad flag fails here, before any fork
    for module in _RAY_MODULES:  # what start() needs, imported once here for every child
        importlib.import_module(module)

    children: list[tuple[int, str]] = []
    with open(spec["sessions"], "a") as sessions:
        for index, (args, host) in enumerate(hosts):
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(args, host)
            sessions.write(f"{index} {pid} {_start_ticks(pid)}\n")
            sessions.flush()
            children.append((pid, host["log"]))
    failed = 0
    for pid, log in children:
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        if code != 0:
            failed += 1
            print(f"a host failed to start (exit {code}); {log}:\n{_tail(log)}", flush=True)
    return 1 if failed else 0


def _child(args: argparse.Namespace, host: dict[str, Any]) -> NoReturn:
    code = 1
    try:
        os.setsid()
        os.environ.clear()
        os.environ.update(host["env"])
        fd = os.open(host["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        code = start(args)
    except BaseException:  # everything ends here: a forked child never returns into the loop
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _start_ticks(pid: int) -> int:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return int(raw[raw.rindex(")") + 2 :].split()[19])


def _tail(path: str, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


if __name__ == "__main__":
    sys.exit(main())
