"""What the emulator starts, as pure functions: slice names, each host's environment, the
``ray start`` command lines. No processes are touched here, so all of it is unit-tested.

Each emulated host gets exactly what a real TPU host has (``tpufleet.contract.host_env``: the
variables the GKE webhook / TPU VM metadata provide) and ``TPU: <chips_per_host>`` as its Ray
resource; Ray's own ``TPUAcceleratorManager`` turns those into the ``ray.io/tpu-*`` labels and the
``TPU-<type>-head`` / ``<TPU_NAME>`` resources. On top come the emulator's own variables
(:func:`emulator_env`): ``TPU_SKIP_MDS_QUERY`` as on a GKE pod (there is no metadata server), JAX on
CPU with ``chips_per_host`` devices and gloo collectives, PyTorch/XLA on CPU (``PJRT_DEVICE=CPU``, one
device per process), and ``TPUFLEET_EMULATED=1`` so :func:`tpufleet.runtime.initialize_jax` and
``initialize_torch`` know. :func:`site_env` puts ``hostsite/`` first on the hosts' ``PYTHONPATH``: its
``sitecustomize`` says in a job's log that PyTorch/XLA runs on CPU and warns where it cannot
synchronise.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpufleet.catalog import SliceType
from tpufleet.contract import HOST_VARS, MEGASCALE_VARS, NO_METADATA_VARS, host_env
from tpufleet.errors import SpecError

EMULATED_VAR = "TPUFLEET_EMULATED"

# Variables of the caller that must not leak into an emulated host: they would describe another
# host, another cluster, or another JAX platform.
_SCRUB_PREFIXES = ("TPU_", "MEGASCALE_", "JAX_", "XLA_", "PJRT_", "RAY_", "TPUFLEET_")
# What every Python process of an emulated host runs first (its sitecustomize; see site_env).
HOST_SITE_DIR = Path(__file__).parent / "hostsite"


def slice_name(accelerator_type: str, index: int) -> str:
    """``tpu-<accelerator_type>-<index>``, e.g. ``tpu-v4-16-0`` (KubeRay: ``<group>-<replica>``)."""
    return f"tpu-{accelerator_type}-{index}"


def next_slice_names(existing: Iterable[str], accelerator_type: str, count: int) -> list[str]:
    """``count`` new names for ``accelerator_type``, numbered after the highest index in use."""
    pattern = re.compile(rf"tpu-{re.escape(accelerator_type)}-(\d+)")
    used = [int(m.group(1)) for name in existing if (m := pattern.fullmatch(name))]
    start = max(used, default=-1) + 1
    return [slice_name(accelerator_type, start + i) for i in range(count)]


def emulator_env(slice_type: SliceType) -> dict[str, str]:
    """What an emulated host adds to the contract: no metadata server (``TPU_SKIP_MDS_QUERY``, as on a
    GKE pod), JAX on CPU, one CPU device per chip, gloo; PyTorch/XLA on CPU, one device per process:
    its CPU client hangs in an all-reduce over several devices of one process (pytorch/xla#9089)."""
    return {
        **NO_METADATA_VARS,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={slice_type.chips_per_host}",
        "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
        "PJRT_DEVICE": "CPU",
        EMULATED_VAR: "1",
    }


def site_env(pythonpath: str | None) -> dict[str, str]:
    """``PYTHONPATH`` for an emulated host: ``HOST_SITE_DIR`` first, then the caller's ``pythonpath``.
    Its ``sitecustomize`` (``hostsite/sitecustomize.py``) notes PyTorch/XLA's CPU device in a job's
    log, warns when ``xm.optimizer_step`` or ``xm.rendezvous`` cannot synchronise a job of several
    processes, then runs any other ``sitecustomize`` there is."""
    rest = [p for p in (pythonpath or "").split(os.pathsep) if p and p != str(HOST_SITE_DIR)]
    return {"PYTHONPATH": os.pathsep.join([str(HOST_SITE_DIR), *rest])}


# A JAX persistent compilation cache the hosts of emulated fleets share, as a real pod points every
# host at one bucket: with ``TPUFLEET_EMULATOR_JAX_CACHE=DIR`` where a fleet starts, each host's JAX
# (SPMD jobs, Ray Train workers) keeps every XLA compilation in DIR, and the next process that runs
# the same program on the same shapes loads it instead (a small model's compile is ~1 of the ~4
# CPU-s a JAX process costs here). The test suite sets it: its fleets run the same examples often.
JAX_CACHE_VAR = "TPUFLEET_EMULATOR_JAX_CACHE"


def jax_cache_env(directory: str | None) -> dict[str, str]:
    """JAX's own settings for a shared persistent compilation cache in ``directory`` (none: {})."""
    if not directory:
        return {}
    return {
        "JAX_COMPILATION_CACHE_DIR": directory,
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",  # every compilation, not only slow ones
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
        # A size limit turns on JAX's file lock around each read and write: the processes of every
        # host on this machine write the same entries at once.
        "JAX_COMPILATION_CACHE_MAX_SIZE": str(4 << 30),
    }


def host_envs(name: str, slice_type: SliceType, address: str) -> list[dict[str, str]]:
    """The environment of every host of one slice, in worker-id order.

    All emulated hosts share one machine, so ``TPU_WORKER_HOSTNAMES`` lists the same address (the
    one Ray reports as each node's IP) once per host.
    """
    hostnames = [address] * slice_type.hosts
    return [
        host_env(name, slice_type, worker, hostnames) | emulator_env(slice_type)
        for worker in range(slice_type.hosts)
    ]


def clean_base_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The caller's environment without anything that describes a host, a cluster or JAX."""
    env = {k: v for k, v in environ.items() if not k.startswith(_SCRUB_PREFIXES)}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


@dataclass(frozen=True)
class AgentPorts:
    """Ports a node's agents will listen on, chosen before it starts. A raylet given none waits for
    each agent to write the port it took to a file, and gives up after about 15 s (Ray's fixed
    wait): it aborts ("WaitForDashboardAgentPorts"), and the node never starts. On a loaded 2-core
    CI runner the head's dashboard agent once took 16 s to get there. Given the ports, the raylet
    waits for nothing and each agent binds its own when it is up. Zero: Ray's way (a file)."""

    runtime_env: int = 0  # every node's runtime env agent
    grpc: int = 0  # the dashboard agent's (the head's only: a host has the stand-in)
    listen: int = 0
    metrics_export: int = 0

    def argv(self) -> list[str]:
        named = (
            ("--runtime-env-agent-port", self.runtime_env),
            ("--dashboard-agent-grpc-port", self.grpc),
            ("--metrics-export-port", self.metrics_export),
        )
        return [flag for name, port in named if port for flag in (name, str(port))]


def _common_args(
    address: str, temp_dir: str, object_store_bytes: int, ports: AgentPorts | None = None
) -> list[str]:
    ports = ports or AgentPorts()
    return [
        "--node-ip-address",
        address,
        "--temp-dir",
        temp_dir,
        "--object-store-memory",
        str(object_store_bytes),
        "--num-gpus",
        "0",
        # Random ports everywhere: several clusters (and several raylets) share this machine.
        "--min-worker-port",
        "0",
        "--max-worker-port",
        "0",
        "--dashboard-agent-listen-port",
        str(ports.listen),
        *ports.argv(),
        "--disable-usage-stats",
    ]


def head_argv(
    ray_bin: str,
    address: str,
    gcs_port: int,
    dashboard_port: int,
    client_port: int | None,
    temp_dir: str,
    object_store_bytes: int,
    *,
    monitor: bool = True,
    ports: AgentPorts | None = None,
) -> list[str]:
    """The head: no TPU and no CPU, so nothing a job asks for is ever placed there.

    ``client_port`` None starts no Ray Client server (``ray://``; tpufleet connects to the GCS
    address and refuses Ray Client addresses), and ``monitor`` False no autoscaler monitor (an
    emulated fleet has nothing to autoscale: its slices come from the emulator or a provider);
    only :func:`lean_head_argv` asks for either, since a plain ``ray start --head`` would start a
    client server on 10001 without the flag, which a second fleet on this machine would then find
    taken."""
    client = ["--ray-client-server-port", str(client_port)] if client_port is not None else []
    return [
        ray_bin,
        "start",
        "--head",
        "--port",
        str(gcs_port),
        "--num-cpus",
        "0",
        # The dashboard serves Ray's job submission API, which Ray jobs (docs/ray-jobs.md) go
        # through; it listens on 127.0.0.1 and, like every Ray API here, wants the cluster's token.
        "--include-dashboard",
        "true",
        "--dashboard-port",
        str(dashboard_port),
        *client,
        *([] if monitor else ["--no-monitor"]),
        *_common_args(address, temp_dir, object_store_bytes, ports),
    ]


def host_cpus(slice_type: SliceType, cap: int) -> int:
    """Logical CPUs an emulated host offers Ray: its machine type's vCPUs (``catalog``: a v4 host has
    240, a v5p host 208), at most ``cap`` (``--cpus-per-host``), since every emulated host shares
    this machine's cores. A host with one CPU cannot run Ray Train's workers and Ray Data's read tasks
    at once (the trainer hangs), so a JaxTrainer with a dataset wants 2 or more."""
    vcpus = slice_type.vcpus_per_host
    return cap if vcpus is None else min(vcpus, cap)


def host_argv(
    ray_bin: str,
    address: str,
    gcs_address: str,
    slice_type: SliceType,
    cpus: int,
    temp_dir: str,
    object_store_bytes: int,
    log_monitor: bool,
    *,
    ports: AgentPorts | None = None,
) -> list[str]:
    """One TPU host: ``TPU: <chips_per_host>`` is the only accelerator fact passed to Ray."""
    return [
        ray_bin,
        "start",
        "--address",
        gcs_address,
        "--num-cpus",
        str(host_cpus(slice_type, cpus)),
        "--resources",
        json.dumps({"TPU": slice_type.chips_per_host}),
        "--include-log-monitor",
        "true" if log_monitor else "false",
        *_common_args(address, temp_dir, object_store_bytes, ports),
    ]


# What every node of an emulated fleet (head and hosts) gets, whatever its start path:
# - no Ray OOM killer: each emulated host's raylet would see the whole machine's memory and kill
#   its own workers for memory that other hosts (and whatever else runs here) use; on a real host
#   the memory is the host's own;
# - the log monitor looks for new log files every 0.5 s (Ray's own pace past 1,000 files) instead of
#   globbing the log directory ten times a second: a new worker's first line may reach its driver
#   0.4 s later. Together they save a sixth of an idle fleet's CPU on this 2-core machine (an
#   idle v4-16:2,v6e-4 fleet: 6.8 CPU-s a minute before, 5.6 with this on its hosts only).
NODE_ENV = {"RAY_memory_monitor_refresh_ms": "0", "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0"}

# What a lean host's Ray processes get on top of the host env:
# - no workers prestarted when the first driver connects (Ray's default starts one per CPU on every
#   host at once: a CPU storm and ~65 MiB per worker on a big fleet); workers start when a task
#   needs them, as Ray does for later drivers;
# - no idle workers kept for good: Ray keeps up to one per logical CPU of a node for its next tasks,
#   and each idle one costs ~0.55 CPU-s a minute (its core worker's loop) and ~65 MiB, on every
#   emulated host at once (a v4-16:2,v6e-4 fleet with 2 CPUs a host: 11.9 CPU-s a minute idle after
#   one task per CPU, 6.6 without). A worker idle for 30 s ends; one used again within 30 s is reused.
LEAN_HOST_ENV = {
    "RAY_prestart_worker_first_driver": "0",
    "RAY_num_workers_soft_limit": "0",
    "RAY_idle_worker_killing_time_threshold_ms": "30000",
}
RAYHOST_SCRIPT = str(Path(__file__).with_name("rayhost.py"))


HOST_FLOOR_BYTES = 12 << 20  # the least an emulated host takes: a lean one's raylet alone (docs/emulator.md)


def check_fits(hosts: int, memory_bytes: int | None, asked: str, *, adding: bool = False) -> None:
    """SpecError when ``hosts`` emulated hosts cannot fit in ``memory_bytes`` (this machine's; None:
    unknown, no check) even at their least: ``emulate up --slices v4-8:100000`` started raylets
    until the machine ran out of memory. ``adding``: ``asked`` is one slice type added to a running
    fleet, ``hosts`` counting its hosts too (``EmulatedFleet.add``, a provider's slices)."""
    if not memory_bytes or hosts * HOST_FLOOR_BYTES <= memory_bytes:
        return
    fits = memory_bytes // HOST_FLOOR_BYTES
    room = f"this machine's {memory_bytes / (1 << 30):.0f} GiB holds at most {fits:,}"
    floor = f"each takes over {HOST_FLOOR_BYTES >> 20} MiB"
    if adding:
        message = (
            f"one more {asked} would make the fleet {hosts:,} emulated hosts; {room} ({floor}); "
            "remove a slice first"
        )
    else:
        message = f"{asked!r} is {hosts:,} emulated hosts; {room} ({floor}); give fewer slices"
    raise SpecError(message, field="slices", locate=False)


def lean_host_argv(
    python: str, *args: Any, ports: AgentPorts | None = None, heads_runtime_env: bool = False
) -> list[str]:
    """:func:`host_argv` (same arguments after ``python``) started by ``rayhost.py``, which takes
    ``ray start``'s flags and starts Ray's worker node without the ``ray start`` CLI, with a
    stand-in for the dashboard agent. ``-P``: the script's folder (this package) must not shadow
    top-level modules. ``heads_runtime_env``: the host starts no runtime env agent and its raylet
    uses the head's, whose port ``ports.runtime_env`` then is (``rayhost.py --runtime-env-agent``)."""
    shared = ["--runtime-env-agent", "head"] if heads_runtime_env else []
    return [python, "-P", RAYHOST_SCRIPT, *host_argv("ray", *args, ports=ports)[2:], *shared]


def lean_head_argv(
    python: str,
    address: str,
    gcs_port: int,
    dashboard_port: int,
    temp_dir: str,
    object_store_bytes: int,
    *,
    ports: AgentPorts | None = None,
    host_logs: bool = False,
) -> list[str]:
    """:func:`head_argv` started by ``rayhost.py``: Ray's head node, the processes ``ray start
    --head`` starts, without the CLI's imports and without the two an emulated fleet never uses:
    the Ray Client server and the autoscaler monitor (~1.2 s of CPU and ~150 MiB together).
    ``host_logs``: its log monitor forwards the hosts' worker output too (``fleetlogs``), and the
    hosts start none."""
    where = (address, gcs_port, dashboard_port, None, temp_dir, object_store_bytes)
    argv = head_argv("ray", *where, monitor=False, ports=ports)
    modules = ["--dashboard-modules", ",".join(DASHBOARD_MODULES)]
    return [python, "-P", RAYHOST_SCRIPT, *argv[2:], *modules, *(["--host-logs"] if host_logs else [])]


# The lean head's dashboard loads only the modules of Ray's APIs that a fleet's users and tpufleet
# call: jobs (``ray job``, ``JobSubmissionClient``, Ray jobs through the queue), state (``ray list``,
# ``ray.util.state``), nodes and tasks (the dashboard's cluster and task views), and the two that run
# inside the dashboard process. Each other module (metrics, data, events, reporter, serve, train) is a
# process of its own: together ~1 CPU-s a minute of an idle fleet's 5.5 (docs/emulator.md).
DASHBOARD_MODULES = (
    "JobHead",
    "StateHead",
    "NodeHead",
    "TaskEventsHead",
    "UsageStatsHead",
    "PlatformEventsHead",
)


def contract_of(env: Mapping[str, str]) -> dict[str, str]:
    """The host-contract part of an environment (for display and checks)."""
    keys: Sequence[str] = (*HOST_VARS, *MEGASCALE_VARS)
    return {k: env[k] for k in keys if k in env}
