"""The one seam between the control plane and the machines: ``ClusterClient``.

The service loop (``control/loop/service.py``) never touches Ray directly; it talks to a
``ClusterClient``. Two real implementations ship as modules:

- ``control/ray/client.py`` (``RayExecutor``): Ray, ``ray.util.tpu.SlicePlacementGroup`` pinned by
  ``bundle_label_selector`` on ``ray.io/tpu-slice-name``, one named, detached runner actor per host.
- ``control/cluster/memory.py`` (``MemoryCluster``): the in-memory cluster, which executes nothing:
  scripted in polls, the service, the store and the API are tested on it without Ray (a real module,
  not a mock of our own code); on the wall clock it is ``serve --sandbox``'s fleet.

All calls are synchronous and must return quickly (well under 100 ms on a warm cluster): ``launch``
starts work and returns; progress is observed through ``poll``. Names are plain strings at this
seam; the typed ids live in ``scheduler.model``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from tpufleet.fleet import HostInfo, SliceInfo
from tpufleet.host.jobfiles import DiskUsage
from tpufleet.host.runlimits import RunLimits
from tpufleet.runtime import StepProgress
from tpufleet.scheduler.lifecycle import JobKind

__all__ = [
    "AttemptSpec",
    "AttemptStatus",
    "ClusterClient",
    "DiskUsage",
    "FilesRemoved",
    "HostInfo",
    "HostState",
    "HostStatus",
    "LogChunk",
    "SliceInfo",
]


@dataclass(frozen=True)
class AttemptSpec:
    """Everything needed to run one attempt of a job on the slices the policy chose.

    Where the job's files go on a host: ``job_root/<tenant>/<job>`` is TPUFLEET_CHECKPOINT_DIR
    (``jobfiles.run_paths``); ``hide`` names paths of the control plane a jailed job must not see.
    The code comes either as ``package`` (the zip the tenant uploaded, unpacked on every host as the
    working directory) or as ``working_dir_url`` (an operator-allowed URL, fetched by Ray's
    runtime_env); never as a path of the control plane's disk. ``limits``: what each host's run may
    use (processes, open files, its runner's copy of the output; ``serve --job-process-limit``...)."""

    job_id: str
    attempt: int
    slices: tuple[str, ...]  # slice names, in MEGASCALE_SLICE_ID order
    accelerator_type: str
    command: tuple[str, ...]  # run on every host, SPMD style
    env: dict[str, str] = field(default_factory=dict)  # the user's env; the contract is added on top
    tenant: str = "default"
    job_root: str = ""
    checkpoint_dir: str = ""  # TPUFLEET_CHECKPOINT_DIR, stable across attempts of the job
    package: bytes | None = field(default=None, repr=False)
    working_dir_url: str | None = None
    hide: tuple[str, ...] = ()
    limits: RunLimits = field(default_factory=RunLimits)
    kind: JobKind = JobKind.SPMD  # RAY: ``command`` runs once, as a Ray driver (Ray's job submission)
    # bytes ``job_root/<tenant>`` may hold (serve --checkpoint-quota-gib), checked on the hosts every
    # ``checkpoint_check_s``; None: no limit (still measured)
    checkpoint_quota: int | None = None
    checkpoint_check_s: float = 5.0


class HostState(StrEnum):
    STARTING = "STARTING"  # runner placed, process not yet started
    RUNNING = "RUNNING"
    EXITED = "EXITED"  # process ended; see exit_code
    LOST = "LOST"  # the host (node) died or the runner vanished


@dataclass(frozen=True)
class HostStatus:
    slice: str
    worker_id: int
    state: HostState
    exit_code: int | None = None
    # why a host is LOST, when the cluster knows (e.g. its code could not be fetched), or why the
    # host itself ended its process (past a limit of its run, or its tenant's checkpoint quota)
    detail: str | None = None


@dataclass(frozen=True)
class AttemptStatus:
    job_id: str
    attempt: int
    hosts: tuple[HostStatus, ...]
    # The steps process 0 reported (``tpufleet.runtime.report_step``), when the cluster has them.
    progress: StepProgress | None = None
    # A Ray job: the slices its Ray Train workers were found on (Ray's placement groups), once known.
    placed: tuple[str, ...] = ()
    # Why tpufleet itself must end this attempt, through no fault of the job or its hosts (a Ray
    # job's trainer that Ray placed on a slice that came back while its window was open): the
    # service ends it and requeues the job without using a retry.
    interrupted: str | None = None
    # The tenant's checkpoint directory as the hosts last measured it (the largest of their answers).
    disk: DiskUsage | None = None

    @property
    def all_running(self) -> bool:
        return bool(self.hosts) and all(h.state is HostState.RUNNING for h in self.hosts)

    @property
    def succeeded(self) -> bool:
        return bool(self.hosts) and all(h.state is HostState.EXITED and h.exit_code == 0 for h in self.hosts)

    @property
    def failure(self) -> str | None:
        """Why the attempt failed, or None while it may still succeed (SPMD: one host ends all)."""
        for h in self.hosts:
            if h.state is HostState.LOST:
                return f"host {h.slice}/{h.worker_id} was lost" + (f": {h.detail}" if h.detail else "")
            if h.state is HostState.EXITED and h.exit_code not in (0, None):
                why = f": {h.detail}" if h.detail else ""
                return f"host {h.slice}/{h.worker_id} exited with code {h.exit_code}{why}"
        return None


@dataclass(frozen=True)
class FilesRemoved:
    """What ``remove_job_files`` did: the bytes each job's directory held (0: there was none), and
    the tenant's directory as measured after (None when the cluster has no files to measure)."""

    removed: dict[str, int]
    disk: DiskUsage | None = None


@dataclass(frozen=True)
class LogChunk:
    data: str
    next_offset: int
    complete: bool  # the process has ended and every line has been read


@runtime_checkable
class ClusterClient(Protocol):
    """Everything the service may ask of a cluster. Reads (``inventory``, ``poll``, ``read_logs``,
    ``running_attempts``) change nothing; ``adopt`` is the explicit call that does. A cluster that
    keeps slices reserved between attempts is also a :class:`WarmPool`.
    Both implementations pass the same conformance suite (tests/conformance)."""

    def inventory(self) -> list[SliceInfo]:
        """Every TPU slice the cluster has, intact or not (a free slice whose runner is being
        replaced is reported with that problem). Changes nothing."""
        ...

    def launch(self, spec: AttemptSpec) -> None:
        """Start ``spec.command`` on every host of ``spec.slices`` with the full host contract.
        Launching an attempt that is already running does nothing."""
        ...

    def poll(self, job_id: str, attempt: int) -> AttemptStatus:
        """The state of every host of a launched (or adopted) attempt; NotFoundError for an
        attempt this client does not know."""
        ...

    def stop(self, job_id: str, attempt: int, grace_s: float = 10.0) -> None:
        """End every process of the attempt (SIGTERM, then SIGKILL after ``grace_s``) and free
        its slices. Idempotent; safe on an attempt that already ended or is unknown."""
        ...

    def read_logs(self, job_id: str, attempt: int, slice_name: str, worker_id: int, offset: int) -> LogChunk:
        """Output (stdout and stderr, interleaved) of one host's process from ``offset``."""
        ...

    def running_attempts(self) -> list[tuple[str, int]]:
        """(job_id, attempt) of every attempt whose processes the cluster still runs. Changes nothing."""
        ...

    def adopt(self) -> list[tuple[str, int]]:
        """After a control-plane restart, and when a replica begins a term as leader: forget what
        this client remembers of attempts (another leader may have ended them since) and take over
        the attempts the cluster still runs (so that ``poll``, ``stop`` and ``read_logs`` reach
        them); return them. Only ``reconcile`` calls it."""
        ...

    def remove_job_files(self, job_root: str, tenant: str, job_ids: Sequence[str]) -> FilesRemoved:
        """Remove ``job_root/<tenant>/<job>`` of each finished job, through a host (the control plane
        never touches that disk itself); never follows a link. ClusterError when no host can."""
        ...


@runtime_checkable
class WarmPool(Protocol):
    """A cluster that keeps free slices reserved between attempts, so a launch does not wait for a
    reservation (the Ray client: placement groups and idle runners). Optional: the service keeps the
    pool only when its cluster is one (``isinstance(cluster, WarmPool)``); a sandbox has none."""

    def maintain(self) -> None:
        """Keep the warm pool: reserve free intact slices, give back broken, drained or missing
        ones, replace dead runners. The service calls it once a cycle, before ``inventory``."""
        ...

    def release(self, names: list[str]) -> None:
        """Take free slices out of the warm pool and give them back to the cluster (``DRAINING``)."""
        ...

    def warm(self, names: list[str]) -> None:
        """Put slices back into the warm pool (the next ``maintain`` reserves them)."""
        ...

    def launches_at_once(self, names: Sequence[str]) -> bool:
        """Whether a plain launch (an SPMD attempt, nothing to ship) on these slices returns at once:
        each is reserved in the pool already, so ``launch`` only sends the hosts their start. The
        loop then launches on its own thread instead of its pool's, and polls in the same turn.
        No I/O."""
        ...


@runtime_checkable
class Notifying(Protocol):
    """A cluster that says when an attempt's hosts have changed (every host of a launch started;
    the sandbox's hosts ended), so the loop acts at once instead of at its next cycle. Optional:
    the service subscribes only when its cluster is one (``isinstance(cluster, Notifying)``);
    without it the loop polls."""

    def notify(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` (from any thread) whenever a launched attempt's hosts have all started or
        failed to start, and when they end where the cluster knows when (the sandbox's timed runs).
        ``wake`` only wakes the loop: it must be cheap and never raise. Waking when nothing
        changed costs a cycle, nothing else."""
        ...
