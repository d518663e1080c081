"""What user code calls on a host: ``initialize_jax()`` works the same on real TPUs and the emulator.

On a real TPU host ``jax.distributed.initialize()`` needs no arguments: JAX finds the coordinator,
the process count and this process's id itself (from ``TPU_WORKER_HOSTNAMES``/``TPU_WORKER_ID``
on GKE, the metadata server on GCE TPU VMs, and ``MEGASCALE_*`` for multi-slice), through libtpu.

On the emulator (``TPUFLEET_EMULATED=1``, set on every emulated host) there is no libtpu, so this
module derives the same three facts from the host contract:

- coordinator: host 0 of slice 0, i.e. ``MEGASCALE_COORDINATOR_ADDRESS`` for multi-slice (required
  then), else the first of ``TPU_WORKER_HOSTNAMES`` (``127.0.0.1`` on a single-host slice);
- number of processes: hosts per slice x ``MEGASCALE_NUM_SLICES``;
- process id: ``MEGASCALE_SLICE_ID`` x hosts per slice + ``TPU_WORKER_ID``.

The coordinator port is ``TPUFLEET_JAX_COORDINATOR_PORT`` when set (the control plane's executor
sets a free port per attempt, because on one machine several jobs run at once), else
``JAX_COORDINATOR_PORT`` (what JAX itself honours on TPUs), else 8482 (JAX's default).

This module imports nothing heavy: ``jax`` is imported inside :func:`initialize_jax`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_COORDINATOR_PORT", "DistributedArgs", "distributed_args", "initialize_jax", "is_emulated"]

DEFAULT_COORDINATOR_PORT = 8482  # JAX's coordinator port for Cloud TPU auto-detection
PORT_VAR = "TPUFLEET_JAX_COORDINATOR_PORT"
EMULATED_VAR = "TPUFLEET_EMULATED"


@dataclass(frozen=True)
class DistributedArgs:
    coordinator_address: str  # host:port
    num_processes: int
    process_id: int


def is_emulated(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(EMULATED_VAR) == "1"


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit():
        raise ValueError(f"{name}={raw!r} is not a whole number")
    return int(raw)


def distributed_args(environ: Mapping[str, str]) -> DistributedArgs:
    """Coordinator, process count and process id of this host, from the host contract."""
    hostnames = [h.strip() for h in environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    hosts = max(1, len(hostnames))
    worker = _int(environ, "TPU_WORKER_ID", 0)
    num_slices = _int(environ, "MEGASCALE_NUM_SLICES", 1)
    slice_id = _int(environ, "MEGASCALE_SLICE_ID", 0) if num_slices > 1 else 0
    if worker >= hosts:
        raise ValueError(f"TPU_WORKER_ID={worker} but TPU_WORKER_HOSTNAMES lists {hosts} host(s)")
    if slice_id >= num_slices:
        raise ValueError(f"MEGASCALE_SLICE_ID={slice_id} but MEGASCALE_NUM_SLICES={num_slices}")
    megascale = environ.get("MEGASCALE_COORDINATOR_ADDRESS", "").strip() if num_slices > 1 else ""
    if num_slices > 1 and not megascale:
        # Each slice would pick its own host 0 as coordinator and the processes would never meet.
        raise ValueError(f"MEGASCALE_NUM_SLICES={num_slices} but MEGASCALE_COORDINATOR_ADDRESS is not set")
    host = megascale or (hostnames[0] if hostnames else "127.0.0.1")
    host = host.rsplit(":", 1)[0] if host.count(":") == 1 else host  # tolerate host:port
    port = _int(environ, PORT_VAR, 0) or _int(environ, "JAX_COORDINATOR_PORT", DEFAULT_COORDINATOR_PORT)
    return DistributedArgs(f"{host}:{port}", hosts * num_slices, slice_id * hosts + worker)


def initialize_jax(environ: Mapping[str, str] | None = None) -> DistributedArgs | None:
    """Start JAX's distributed runtime on this host; returns the arguments used on the emulator.

    Real TPUs: ``jax.distributed.initialize()`` with no arguments (returns None). Emulator: the
    arguments from :func:`distributed_args`, gloo for cross-process CPU collectives, and no call at
    all for a single process (a one-host, one-slice job needs no coordinator).
    """
    env = os.environ if environ is None else environ
    import jax as jax_module

    jax: Any = jax_module  # JAX's config API is untyped
    if not is_emulated(env):
        jax.distributed.initialize()
        return None
    args = distributed_args(env)
    if args.num_processes > 1:
        jax.config.update(
            "jax_cpu_collectives_implementation", env.get("JAX_CPU_COLLECTIVES_IMPLEMENTATION", "gloo")
        )
        jax.distributed.initialize(
            coordinator_address=args.coordinator_address,
            num_processes=args.num_processes,
            process_id=args.process_id,
            cluster_detection_method="deactivate",
        )
    return args
