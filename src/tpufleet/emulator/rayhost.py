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

Prestarted workers are off through the environment (``plan.LEAN_HOST_ENV``), not here.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any, NoReturn

# The dashboard agent's stand-in, a POSIX shell script (no quotes or backslashes: the raylet splits
# its agent command itself). The raylet appends nothing we rely on; the node id and session dir
# come as arguments. Port files are written whole (temp file, then rename): the raylet polls them.
# It then waits for its parent, the raylet, to exit: GNU tail's --pid, else a kill -0 loop.
AGENT_STANDIN = (
    "for a; do case $a in --node-id=*) n=${a#*=};; --session-dir=*) d=${a#*=};; esac; done; "
    "for p in metrics_agent_port metrics_export_port dashboard_agent_listen_port; "
    "do echo -1 > $d/.${p}_$n && mv $d/.${p}_$n $d/${p}_$n; done; "
    "tail --pid=$PPID -f /dev/null 2>/dev/null || while kill -0 $PPID 2>/dev/null; do sleep 1; done"
)
STANDIN_NAME = "tpufleet-agent-standin"


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


def _without_dashboard_agent(services: Any, constants: Any) -> None:
    """Make ``services.start_ray_process`` give every raylet the stand-in as its dashboard agent."""
    original = services.start_ray_process

    def start_ray_process(command: list[str], process_type: str, *args: Any, **kwargs: Any) -> Any:
        if process_type == constants.PROCESS_TYPE_RAYLET:
            standin = standin_command(_flag(command, "node_id"), _flag(command, "session_dir"))
            command = [
                f"--dashboard_agent_command={standin}" if a.startswith("--dashboard_agent_command=") else a
                for a in command
            ]
        return original(command, process_type, *args, **kwargs)

    services.start_ray_process = start_ray_process


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
    p.add_argument("--disable-usage-stats", action="store_true")
    p.add_argument("--no-monitor", action="store_true", help="no autoscaler monitor on the head")
    p.add_argument(
        "--dashboard-agent",
        choices=["real", "standin"],
        help="not a ray start flag: the head's default is Ray's agent, a host's the stand-in",
    )
    args = p.parse_args(argv)
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
