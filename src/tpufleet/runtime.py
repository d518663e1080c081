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

This module imports nothing heavy: ``jax`` is imported inside :func:`initialize_jax`, ``torch``
inside :func:`initialize_torch` (the same three facts, for ``torch.distributed``: ``gloo`` on the
emulator, torch_xla's ``xla`` backend on real TPUs).

**Step progress** (goodput): :func:`report_step` records, from process 0 (worker 0 of slice 0; a
call on any other process returns at once), the steps the job has completed. It writes a small JSON
file, ``$TPUFLEET_PROGRESS_FILE`` (set by the runner to ``progress.json`` in the attempt's scratch
directory, which the job may write inside its jail), at most once a second and once more at exit;
the host's runner reads it (:func:`read_progress`, size-capped and strict: the file is the job's, so
it is untrusted) and the control plane stores the first and the last step of each attempt with
their times. Outside tpufleet (no variable) it does nothing.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from tpufleet.contract import RAY_TRAIN_POLL_VAR, SLICE_LABEL, WORKER_LABEL

__all__ = [
    "DEFAULT_COORDINATOR_PORT",
    "PROGRESS_VAR",
    "DistributedArgs",
    "StepProgress",
    "distributed_args",
    "handle_stop_signal",
    "initialize_jax",
    "is_emulated",
    "ray_train_settle_s",
    "read_progress",
    "report_step",
]

DEFAULT_COORDINATOR_PORT = 8482  # JAX's coordinator port for Cloud TPU auto-detection
PORT_VAR = "TPUFLEET_JAX_COORDINATOR_PORT"
EMULATED_VAR = "TPUFLEET_EMULATED"
PROGRESS_VAR = "TPUFLEET_PROGRESS_FILE"
PROGRESS_WRITE_S = 1.0  # report_step writes the file at most this often (and once more at exit)
MAX_PROGRESS_BYTES = 4096
MAX_STEP = 2**31 - 1


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


# -- PyTorch (docs/emulator.md) -------------------------------------------------------------------

__all__ += ["TORCH_INSTALL", "initialize_torch"]

TORCH_INSTALL = "pip install 'tpufleet[torch]'"


def initialize_torch(environ: Mapping[str, str] | None = None) -> DistributedArgs | None:
    """Start ``torch.distributed``'s default process group on this host; returns the arguments used
    on the emulator.

    Real TPUs: the ``xla`` backend through torch_xla (``init_method="xla://"``: torch_xla finds the
    ranks and the master itself, from the same contract or the metadata server; returns None).
    Emulator: ``gloo`` with the coordinator, process count and id of :func:`distributed_args`
    (rank over every host of every slice, master = host 0 of slice 0), at ``MASTER_PORT`` when set,
    else the port ``initialize_jax`` would use. Without PyTorch (or torch_xla on a TPU host) it
    raises ImportError saying what to install.
    """
    env = os.environ if environ is None else environ
    try:
        import torch.distributed as dist
    except ModuleNotFoundError as err:
        if not _missing(err, "torch"):
            raise
        raise ImportError(
            f"initialize_torch needs PyTorch, which is not installed: {TORCH_INSTALL}"
        ) from None
    if not is_emulated(env):
        try:
            import torch_xla.distributed.xla_backend  # noqa: F401  (registers the "xla" backend)
        except ModuleNotFoundError as err:
            if not _missing(err, "torch_xla"):
                raise
            raise ImportError(
                f"initialize_torch on a TPU host needs torch_xla, which is not installed: {TORCH_INSTALL}"
            ) from None
        dist.init_process_group("xla", init_method="xla://")
        return None
    args = distributed_args(env)
    if port := _int(env, "MASTER_PORT", 0):
        args = replace(args, coordinator_address=f"{args.coordinator_address.rsplit(':', 1)[0]}:{port}")
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{args.coordinator_address}",
        world_size=args.num_processes,
        rank=args.process_id,
    )
    return args


def _missing(err: ModuleNotFoundError, package: str) -> bool:
    """Whether ``err`` says ``package`` itself is absent (not a broken install that lacks something
    else: that error is the one to show)."""
    return err.name is not None and (err.name == package or err.name.startswith(f"{package}."))


# -- Ray jobs (``tpufleet submit --ray``; docs/ray-jobs.md) ----------------------------------------
# The driver of a Ray job gets the slices the policy admitted (``contract.ray_driver_env``); these
# helpers turn them into Ray Train's configuration, so a script hard-codes no topology.

__all__ += ["RaySlices", "admitted_slices", "run_config", "scaling_config", "torch_scaling_config"]


@dataclass(frozen=True)
class RaySlices:
    """The slices a Ray job was admitted on: their names, type and topology."""

    names: tuple[str, ...]
    accelerator_type: str  # GCE naming, e.g. v4-16
    topology: str  # e.g. 2x2x2
    hosts_per_slice: int
    ray_accelerator_type: str  # what Ray Train calls the generation, e.g. TPU-V4

    @property
    def num_workers(self) -> int:
        """One Ray Train worker per host of every slice, as ``JaxTrainer(use_tpu=True)`` wants."""
        return self.hosts_per_slice * len(self.names)


def admitted_slices(environ: Mapping[str, str] | None = None) -> RaySlices:
    """The slices this Ray job was admitted on (from the driver's environment); ValueError naming
    what is missing outside a tpufleet Ray job."""
    env = os.environ if environ is None else environ
    names = tuple(n for n in env.get("TPUFLEET_SLICES", "").split(",") if n)
    if env.get("TPUFLEET_JOB_KIND") != "ray" or not names:
        raise ValueError(
            "not a tpufleet Ray job: TPUFLEET_JOB_KIND=ray and TPUFLEET_SLICES are set only for a job "
            "submitted with tpufleet submit --ray"
        )
    return RaySlices(
        names=names,
        accelerator_type=env.get("TPUFLEET_ACCELERATOR_TYPE", ""),
        topology=env.get("TPUFLEET_TOPOLOGY", ""),
        hosts_per_slice=_int(env, "TPUFLEET_HOSTS_PER_SLICE", 1),
        ray_accelerator_type=env.get("TPUFLEET_RAY_ACCELERATOR_TYPE", ""),
    )


def scaling_config(environ: Mapping[str, str] | None = None, **overrides: Any) -> Any:
    """Ray Train's ``ScalingConfig`` for the admitted slices: ``use_tpu=True``, one worker per host,
    their topology and accelerator type (``overrides`` win, e.g. ``resources_per_worker``)."""
    from ray.train import ScalingConfig

    s = admitted_slices(environ)
    fields: dict[str, Any] = {
        "use_tpu": True,
        "num_workers": s.num_workers,
        "topology": s.topology,
        "accelerator_type": s.ray_accelerator_type,
    }
    return ScalingConfig(**(fields | overrides))


def torch_scaling_config(environ: Mapping[str, str] | None = None, **overrides: Any) -> Any:
    """Ray Train's ``ScalingConfig`` for a ``TorchTrainer`` on the admitted slices: one worker per
    host of every admitted slice, in (slice, worker id) order, each placed on its host by Ray's TPU
    node labels (``label_selector``), so rank r runs on host r.

    No ``TPU`` resource is asked for (``use_tpu`` stays False): in Ray 2.60 a Torch worker that holds
    TPU chips gets Ray's TPU device manager, which is TorchTPU's (``torch_tpu``, TPU hardware only)
    and fails without it, before the training function starts ("Using TPUTorchDeviceManager but
    torch_tpu is not available"), whatever the backend. The chips stay the job's all the same:
    tpufleet admitted it on whole slices, and a process on the host sees all of them, as PyTorch/XLA
    wants (one process per host). With TorchTPU use :func:`scaling_config` instead. ``overrides``
    win."""
    from ray.train import ScalingConfig

    s = admitted_slices(environ)
    hosts = [{SLICE_LABEL: name, WORKER_LABEL: str(w)} for name in s.names for w in range(s.hosts_per_slice)]
    fields: dict[str, Any] = {"num_workers": len(hosts), "label_selector": hosts}
    return ScalingConfig(**(fields | overrides))


def run_config(environ: Mapping[str, str] | None = None, **overrides: Any) -> Any:
    """Ray Train's ``RunConfig`` that survives attempts: ``storage_path`` is the job's
    ``TPUFLEET_CHECKPOINT_DIR`` and ``name`` the job's id, so the next attempt's trainer finds the
    last attempt's checkpoints (``ray.train.get_checkpoint()``)."""
    from ray.train import RunConfig

    env = os.environ if environ is None else environ
    where, job = env.get("TPUFLEET_CHECKPOINT_DIR", ""), env.get("TPUFLEET_JOB_ID", "")
    if not where or not job:
        raise ValueError("not a tpufleet job: TPUFLEET_CHECKPOINT_DIR and TPUFLEET_JOB_ID are not set")
    return RunConfig(**({"storage_path": where, "name": f"tpufleet-{job}"} | overrides))


TRAIN_POLL_VAR = RAY_TRAIN_POLL_VAR  # how often Ray Train's controller polls workers
TRAIN_POLL_DEFAULT_S = 2.0  # Ray Train 2.60's default for it
MAX_SETTLE_S = 20.0  # well inside the 30 s between a Ray job's SIGTERM and its SIGKILL (rayjob.STOP_WAIT_S)


def ray_train_settle_s(environ: Mapping[str, str] | None = None) -> float:
    """How long a stopped Ray Train driver should live on so that the checkpoints its workers have
    already reported are recorded: two polls of Ray Train's controller plus a second.

    A worker's ``train.report(checkpoint=...)`` returns once the checkpoint is in storage, but the
    run's ``checkpoint_manager_snapshot.json`` (what the next run restores from) is written by the
    controller when it next polls the workers (``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``, 2 s by
    default). The controller dies with the driver, so a driver that exits at once on SIGTERM loses
    the newest checkpoints, or all of them when the stop comes just after the first."""
    env = os.environ if environ is None else environ
    try:
        poll = float(env.get(TRAIN_POLL_VAR, TRAIN_POLL_DEFAULT_S))
    except ValueError:
        poll = TRAIN_POLL_DEFAULT_S
    if not math.isfinite(poll) or poll <= 0:
        poll = TRAIN_POLL_DEFAULT_S
    return min(2 * poll + 1.0, MAX_SETTLE_S)


def handle_stop_signal(settle_s: float | None = None, *, say: Callable[[str], None] | None = None) -> None:
    """Install the SIGTERM handler a Ray Train driver wants under tpufleet (call it before ``fit()``).

    tpufleet stops a Ray job (preemption, cancel, a lost host) with Ray's job stop: SIGTERM to the
    driver, SIGKILL 30 s later. On SIGTERM the handler says so in the driver's log, waits
    ``settle_s`` (default :func:`ray_train_settle_s`) while the Train controller records the
    checkpoints already reported, then dies of SIGTERM as an unhandled one would (no unwinding
    through ``fit()``). A second SIGTERM while it waits ends the driver at once."""
    import signal

    wait = ray_train_settle_s() if settle_s is None else max(0.0, float(settle_s))
    tell: Callable[[str], None] = say if say is not None else (lambda line: print(line, flush=True))

    def on_sigterm(_signum: int, _frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        tell(
            f"driver: SIGTERM (the checkpoint signal); exiting in {wait:g} s, once Ray Train has "
            "recorded the checkpoints already reported; the next attempt resumes from the newest"
        )
        time.sleep(wait)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)


@dataclass(frozen=True)
class StepProgress:
    """One attempt's progress: the first step it reported and when, the last one and when
    (seconds since the epoch, the host's clock)."""

    first_step: int
    first_at: float
    step: int
    at: float

    def advance(self, step: int, at: float) -> StepProgress:
        return StepProgress(self.first_step, self.first_at, step, at)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> StepProgress | None:
        """A progress record from untrusted data, or None unless it is whole and sane: steps are
        whole numbers in [0, 2**31), times finite, and neither goes backwards."""
        if not isinstance(data, dict):
            return None
        steps = [data.get("first_step"), data.get("step")]
        times = [data.get("first_at"), data.get("at")]
        if not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= MAX_STEP for s in steps):
            return None
        if not all(
            isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t) for t in times
        ):
            return None
        first_step, step = int(steps[0]), int(steps[1])  # type: ignore[arg-type]
        first_at, at = float(times[0]), float(times[1])  # type: ignore[arg-type]
        if step < first_step or at < first_at:
            return None
        return cls(first_step, first_at, step, at)


def read_progress(path: str | os.PathLike[str]) -> StepProgress | None:
    """The progress file a job wrote, or None (missing, not a regular file, too big, malformed).
    Opened without following a link and without blocking: the job controls that path."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = os.read(fd, MAX_PROGRESS_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(raw) > MAX_PROGRESS_BYTES:
        return None
    try:
        return StepProgress.from_dict(json.loads(raw.decode("utf-8")))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


class _Reporter:
    """What :func:`report_step` keeps between calls (one per process)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.progress: StepProgress | None = None
        self.written: StepProgress | None = None
        self.last_write = -math.inf
        self.path: str | None = None
        self.hooked = False

    def write(self) -> None:
        progress, path = self.progress, self.path
        if progress is None or path is None or progress == self.written:
            return
        tmp = f"{path}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(progress.to_dict(), f)
            os.replace(tmp, path)
        except OSError:
            return  # a full disk or a vanished scratch dir must never stop training
        self.written, self.last_write = progress, time.monotonic()


_reporter = _Reporter()


def _process_zero(env: Mapping[str, str]) -> bool:
    return env.get("TPU_WORKER_ID", "0").strip() in ("", "0") and env.get(
        "MEGASCALE_SLICE_ID", "0"
    ).strip() in ("", "0")


def report_step(step: int, *, environ: Mapping[str, str] | None = None) -> None:
    """Record that the job has completed ``step`` (a whole number that grows as it trains; after a
    resume, the step it continues from + 1). Cheap: at most one small file write a second. Only
    process 0 records (worker 0 of slice 0); elsewhere, and outside tpufleet, it does nothing."""
    env = os.environ if environ is None else environ
    path = env.get(PROGRESS_VAR)
    if not path or not _process_zero(env):
        return
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
        raise ValueError(f"report_step: step must be a whole number from 0 to {MAX_STEP}, got {step!r}")
    now = time.time()
    with _reporter.lock:
        r = _reporter
        if r.path != path:
            r.path, r.progress, r.written, r.last_write = path, None, None, -math.inf
        r.progress = (
            StepProgress(step, now, step, now) if r.progress is None else r.progress.advance(step, now)
        )
        if not r.hooked:
            atexit.register(_flush)
            r.hooked = True
        if time.monotonic() - r.last_write >= PROGRESS_WRITE_S or r.written is None:
            r.write()


def _flush() -> None:
    with _reporter.lock:
        _reporter.write()
