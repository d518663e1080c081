"""The host environment contract (DESIGN.md): the variables a real TPU host gets, as pure functions.

On GKE the TPU webhook (ai-on-gke ``kuberay-tpu-webhook``) injects ``TPU_NAME``, ``TPU_WORKER_ID``,
``TPU_WORKER_HOSTNAMES`` (multi-host only) and, for multi-slice, the ``MEGASCALE_*`` variables; GKE
sets ``TPU_ACCELERATOR_TYPE``, ``TPU_TOPOLOGY``, ``TPU_HOST_BOUNDS``, ``TPU_CHIPS_PER_HOST_BOUNDS``
and ``TPU_SKIP_MDS_QUERY``. On GCE TPU VMs the same facts come from the metadata server
(``tpu-env``: ``HOST_BOUNDS``, ``CHIPS_PER_HOST_BOUNDS``, ...). libtpu, JAX's Cloud TPU cluster
detection and torch_xla (``_internal/tpu.py``: with ``TPU_SKIP_MDS_QUERY`` set it reads
``TPU_ACCELERATOR_TYPE``, ``TPU_HOST_BOUNDS``, ``TPU_CHIPS_PER_HOST_BOUNDS``, ``TPU_WORKER_ID`` and
``TPU_WORKER_HOSTNAMES`` instead of the metadata server) read them; docs/emulator.md lists every one
with its source. The emulator gives each raylet ``host_env`` plus :data:`NO_METADATA_VARS`; the
executor gives each process ``host_env`` (read back from its host) plus ``megascale_env`` and
``job_env``.

Not given, on purpose: ``TPU_PROCESS_BOUNDS`` / ``TPU_CHIPS_PER_PROCESS_BOUNDS`` and
``CLOUD_TPU_TASK_ID`` are per process: torch_xla's ``xmp.spawn`` sets them for each process it starts
(with ``setdefault``, so a host-wide value would stop it from splitting the host's chips) and reads
the ``*_HOST_*`` ones when they are unset, as on a GKE pod.
"""

from __future__ import annotations

from collections.abc import Sequence

from tpufleet.catalog import SliceType

MEGASCALE_PORT = 8081  # the port GKE's webhook and Ray Train use for the megascale coordinator

HOST_VARS = (
    "TPU_NAME",
    "TPU_WORKER_ID",
    "TPU_WORKER_HOSTNAMES",
    "TPU_ACCELERATOR_TYPE",
    "TPU_TOPOLOGY",
    "TPU_HOST_BOUNDS",
    "TPU_CHIPS_PER_HOST_BOUNDS",
)
# What a host without a GCE metadata server sets (GKE sets it in every TPU container; the emulator on
# every host), so that libtpu and torch_xla read the slice from the variables above instead of asking
# the metadata server, and JAX does not take the host for a GCE TPU VM. Not in ``host_env``: a GCE TPU
# VM has the metadata server and does not set it (JAX's single-host detection needs the server then).
NO_METADATA_VARS = {"TPU_SKIP_MDS_QUERY": "true"}
MEGASCALE_VARS = (
    "MEGASCALE_COORDINATOR_ADDRESS",
    "MEGASCALE_PORT",
    "MEGASCALE_NUM_SLICES",
    "MEGASCALE_SLICE_ID",
)
JOB_VARS = ("TPUFLEET_JOB_ID", "TPUFLEET_ATTEMPT", "TPUFLEET_CHECKPOINT_DIR")
# The labels Ray's TPUAcceleratorManager puts on every TPU host's node (its slice and worker id),
# which Ray's label selectors place work by.
SLICE_LABEL, WORKER_LABEL = "ray.io/tpu-slice-name", "ray.io/tpu-worker-id"
RAY_TRAIN_POLL_VAR = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"  # how often Ray Train's controller polls workers
# The fastest a job may make that poll, and the emulated head's own value: the controller polls from
# the head every job shares, so the head never polls faster than a job is allowed to.
RAY_TRAIN_POLL_MIN_S = 0.5


def host_env(
    slice_name: str, slice_type: SliceType, worker_id: int, hostnames: Sequence[str]
) -> dict[str, str]:
    """The variables of host ``worker_id`` of a slice, exactly as real hardware has them.

    ``TPU_WORKER_HOSTNAMES`` is only set on multi-host slices, as the webhook does. The bounds are
    x,y,z grids as GKE and the metadata server write them: ``TPU_HOST_BOUNDS`` the hosts,
    ``TPU_CHIPS_PER_HOST_BOUNDS`` the chips of one host (v4-16: ``1,1,2`` and ``2,2,1``).
    """
    if not 0 <= worker_id < slice_type.hosts:
        raise ValueError(f"worker_id {worker_id} out of range for {slice_type.accelerator_type}")
    env = {
        "TPU_NAME": slice_name,
        "TPU_WORKER_ID": str(worker_id),
        "TPU_ACCELERATOR_TYPE": slice_type.accelerator_type,
        "TPU_TOPOLOGY": str(slice_type.topology),
        "TPU_HOST_BOUNDS": ",".join(map(str, slice_type.host_bounds)),
        "TPU_CHIPS_PER_HOST_BOUNDS": ",".join(map(str, slice_type.chips_per_host_bounds)),
    }
    if slice_type.multi_host:
        if len(hostnames) != slice_type.hosts:
            raise ValueError(
                f"{slice_type.accelerator_type} has {slice_type.hosts} hosts, got {len(hostnames)} hostnames"
            )
        env["TPU_WORKER_HOSTNAMES"] = ",".join(hostnames)
    return env


def megascale_env(
    coordinator_address: str, num_slices: int, slice_id: int, port: int = MEGASCALE_PORT
) -> dict[str, str]:
    """Multi-slice variables; empty for a single-slice job (the webhook sets none then either)."""
    if num_slices <= 1:
        return {}
    return {
        "MEGASCALE_COORDINATOR_ADDRESS": coordinator_address,  # host only, as Ray Train sets it
        "MEGASCALE_PORT": str(port),
        "MEGASCALE_NUM_SLICES": str(num_slices),
        "MEGASCALE_SLICE_ID": str(slice_id),
    }


def job_env(job_id: str, attempt: int, checkpoint_dir: str) -> dict[str, str]:
    return {
        "TPUFLEET_JOB_ID": job_id,
        "TPUFLEET_ATTEMPT": str(attempt),
        "TPUFLEET_CHECKPOINT_DIR": checkpoint_dir,
    }


def attempt_envs(
    job_id: str,
    attempt: int,
    checkpoint_dir: str,
    slices: Sequence[tuple[str, SliceType, Sequence[str]]],
    *,
    megascale_port: int = MEGASCALE_PORT,
    extra: dict[str, str] | None = None,
) -> list[tuple[dict[str, str], dict[str, str]]]:
    """Every host of an attempt, slice by slice then worker by worker: (the host's contract, the
    attempt's own variables). ``slices`` are (name, type, host addresses in worker order), in
    MEGASCALE_SLICE_ID order; host 0 of slice 0 coordinates. The one place both clusters (the Ray
    executor and the in-memory ones) build a host's environment."""
    coordinator = slices[0][2][0] if slices and slices[0][2] else ""
    common = {**job_env(job_id, attempt, checkpoint_dir), **(extra or {})}
    out = []
    for slice_id, (name, st, hostnames) in enumerate(slices):
        ms = megascale_env(coordinator, len(slices), slice_id, port=megascale_port)
        for worker in range(st.hosts):
            out.append((host_env(name, st, worker, hostnames), {**common, **ms}))
    return out


RAY_JOB_VARS = (
    "TPUFLEET_JOB_KIND",
    "TPUFLEET_SLICES",
    "TPUFLEET_ACCELERATOR_TYPE",
    "TPUFLEET_TOPOLOGY",
    "TPUFLEET_HOSTS_PER_SLICE",
    "TPUFLEET_RAY_ACCELERATOR_TYPE",
)


def ray_driver_env(
    job_id: str, attempt: int, checkpoint_dir: str, slices: Sequence[tuple[str, SliceType]]
) -> dict[str, str]:
    """The variables of a Ray job's driver (docs/ray-jobs.md): the job's own (``job_env``) and the
    slices the policy admitted, which ``tpufleet.runtime.scaling_config()`` turns into Ray Train's
    ``ScalingConfig``. The driver runs on the Ray head, so no host contract (``TPU_*``) here: Ray
    Train's workers get theirs from the hosts they land on."""
    if not slices:
        raise ValueError("a Ray job needs at least one admitted slice")
    st = slices[0][1]
    return {
        **job_env(job_id, attempt, checkpoint_dir),
        "TPUFLEET_JOB_KIND": "ray",
        "TPUFLEET_SLICES": ",".join(name for name, _ in slices),
        "TPUFLEET_ACCELERATOR_TYPE": st.accelerator_type,
        "TPUFLEET_TOPOLOGY": str(st.topology),
        "TPUFLEET_HOSTS_PER_SLICE": str(st.hosts),
        "TPUFLEET_RAY_ACCELERATOR_TYPE": st.generation.ray_accelerator_type,
    }


def process_env(
    base: dict[str, str], user_env: dict[str, str], host: dict[str, str], attempt: dict[str, str]
) -> dict[str, str]:
    """A job process's environment: the host's own (``base``), then the user's variables, then the
    host contract (the host's own values where it has them: a real TPU VM knows best), then the
    attempt's variables, which nothing overrides."""
    own = {k: base[k] for k in HOST_VARS if base.get(k)}
    return {**base, **user_env, **host, **own, **attempt}
