"""Ray jobs on the Ray executor: one driver through Ray's job submission, steered onto the slices the
policy admitted (docs/ray-jobs.md).

**How Ray Train takes a slice.** ``JaxTrainer(scaling_config=ScalingConfig(use_tpu=True, ...))``
reserves with ``ray.util.tpu.SlicePlacementGroup``, which first takes one slice's
``TPU-<type>-head`` resource (``reserve_tpu_slice``: a one-bundle placement group on any worker 0
of that pod type), then places one bundle per host with a label selector on that slice's name. Ray
Train refuses ``label_selector`` together with ``use_tpu``, so the only handle is the head: the
trainer lands on a slice whose head resource is free.

**Steering.** Every slice's head resource is held by someone except the admitted slice's, while the
trainer takes it, one admission at a time per slice type (the "window"):

- a pooled slice (free, or held by an SPMD job) keeps its head through the warm pool
  (``slices._new_head_pg``);
- any other slice of the type (drained, broken, held by another Ray job) gets a *fence*: a detached
  one-bundle placement group ``tpufleet:fence:<slice>`` on the head resource, made when a window
  opens (pending until the head is free, it takes it as soon as its holder lets go);
- the window opens for the oldest waiting attempt of the type: its slices leave the warm pool (their
  chips and head come free) and the job is submitted; it closes when the job's own placement groups
  hold the heads of all its slices (found by ``creator_job_id`` in Ray's placement-group table) or
  when the driver ended. Then the admitted slices are fenced too, so a later trainer of any job
  (a second ``fit()``, a restarted worker group) cannot take them while another window is open.
  A restarted control plane takes over the fences a killed one left, by name, and removes those
  that no live Ray job's slice needs (``take_over_fences``, ``drop_stray_fences``).

**Verification.** Each poll reads the job's placement groups: every bundle must be on a node of an
admitted slice. A bundle anywhere else fails the attempt (the first host is ``LOST`` with the reason)
and ``placed`` says which slices hold the job's bundles; the service writes that on the job.

**Status and logs.** The attempt's hosts are the admitted slices' hosts; each reports the driver's
state (``PENDING`` is ``STARTING``; ``SUCCEEDED``/``FAILED``/``STOPPED`` are ``EXITED`` with the
driver's exit code), and a host whose node died is ``LOST``, ending the attempt as for SPMD. The
driver's output (Ray Train's workers' lines included, through Ray's log forwarding) is the first
host's log; the other hosts' logs are empty.

**Stop.** ``stop_job`` sends the driver SIGTERM (the checkpoint signal) and SIGKILL after
``RAY_JOB_STOP_WAIT_TIME_S`` (set per job to ``STOP_WAIT_S``); then the job's placement groups are
waited for (Ray removes them when the driver is gone) and any left over is removed, so the slices'
chips are free when ``stop`` returns.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from tpufleet import contract
from tpufleet.control.cluster.protocol import (
    AttemptSpec,
    AttemptStatus,
    HostState,
    HostStatus,
    LogChunk,
    SliceInfo,
)
from tpufleet.control.ray.warmpool import POD_TYPE_LABEL, SLICE_LABEL, WORKER_LABEL, SlicePool, existing_pgs
from tpufleet.errors import ClusterError
from tpufleet.host import jobfiles
from tpufleet.scheduler.lifecycle import JobKind

log = logging.getLogger(__name__)

SUBMISSION_PREFIX = "tpufleet-"
FENCE_PREFIX = "tpufleet:fence:"
KEEP_ENDED = 256  # ended attempts remembered (their final state and log)
STOP_WAIT_S = 30  # SIGTERM to SIGKILL for a Ray job's driver (RAY_JOB_STOP_WAIT_TIME_S)
_RAY_ENDED = ("SUCCEEDED", "FAILED", "STOPPED")  # Ray's JobStatus values of a driver that ended
Key = tuple[str, int]


def submission_id(job_id: str, attempt: int) -> str:
    return f"{SUBMISSION_PREFIX}{job_id}-{attempt}"


def fence_name(slice_name: str) -> str:
    return f"{FENCE_PREFIX}{slice_name}"


@dataclass
class RayAttempt:
    spec: AttemptSpec
    infos: list[SliceInfo]
    state: str = "WAITING"  # WAITING (for its type's window) -> SUBMITTED -> PLACED; ENDED
    status: str = "PENDING"  # Ray's job status, last seen
    exit_code: int | None = None
    ray_job: str | None = None  # the driver's Ray job id (hex), once Ray has started it
    placed: tuple[str, ...] = ()
    wrong: str | None = None  # why the attempt must end: its trainer landed elsewhere
    raced: bool = False  # ``wrong`` is a head taken on a slice that came back during the window
    settled: frozenset[str] = frozenset()  # slices of the type intact (so held) when the window opened
    message: str = ""
    log: str = ""  # the driver's output read so far
    order: int = 0  # launch order: windows open oldest first

    @property
    def key(self) -> Key:
        return (self.spec.job_id, self.spec.attempt)

    @property
    def type(self) -> str:
        return self.spec.accelerator_type

    def nodes(self) -> dict[str, str]:
        """Node id -> slice name of every host of the admitted slices."""
        return _slice_of_node(self.infos)


def _slice_of_node(infos: Iterable[SliceInfo]) -> dict[str, str]:
    """Node id -> slice name of every host of ``infos`` that has a node."""
    return {h.node_id: i.name for i in infos for h in i.hosts if h.node_id}


class RayJobs:
    """The Ray-job part of ``RayExecutor``; not thread-safe on its own (the executor locks)."""

    def __init__(
        self,
        pool: SlicePool,
        client: Callable[[], Any] | None = None,
        placements: RayPlacements | None = None,
    ) -> None:
        self._pool = pool
        self._pg = placements or RayPlacements()
        self._make_client = client or _default_client
        self._client: Any = None
        self._attempts: dict[Key, RayAttempt] = {}
        self._window: dict[str, Key] = {}  # slice type -> the attempt whose trainer may take a head
        self._fences: dict[str, Any] = {}  # slice name -> its fence (a PlacementGroup)
        self._inventory: dict[str, SliceInfo] = {}  # as of the last ``advance``
        self._order = itertools.count()

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = self._make_client()
        return self._client

    def knows(self, key: Key) -> bool:
        return key in self._attempts

    def get(self, key: Key) -> RayAttempt | None:
        return self._attempts.get(key)

    def launch(self, spec: AttemptSpec, infos: list[SliceInfo]) -> None:
        """Queue the attempt for its type's window (``advance`` submits it)."""
        have = self._attempts.get((spec.job_id, spec.attempt))
        if have is not None and have.state != "ENDED":
            return
        self._attempts[(spec.job_id, spec.attempt)] = RayAttempt(spec, infos, order=next(self._order))

    # -- the window ---------------------------------------------------------------------------
    def advance(self, inventory: dict[str, SliceInfo]) -> None:
        """Called once a cycle: close windows whose trainer took its heads, open the next."""
        self._inventory = inventory
        for stype, key in list(self._window.items()):
            att = self._attempts.get(key)
            if att is None or att.state == "ENDED":
                self._close(stype, inventory)
                continue
            self._refresh(att)
            if att.state == "PLACED" or att.status in _RAY_ENDED or att.wrong:
                self._close(stype, inventory)
            else:  # a slice of the type that came (back) since the window opened: fence it too
                self._fence_others(att, inventory)
        for att in sorted(self._attempts.values(), key=lambda a: a.order):
            if att.state == "WAITING" and att.type not in self._window:
                try:
                    self._open(att, inventory)
                except Exception as err:  # Ray did not take a fence or a release: next cycle again
                    log.warning("could not open the window of %s: %s", submission_id(*att.key), err)
                    self._window.pop(att.type, None)

    def _fence_others(self, att: RayAttempt, inventory: dict[str, SliceInfo]) -> None:
        """Fence every slice of the attempt's type that is neither its own nor held by the pool.

        Not only when the window opens: a slice whose hosts come back while it is open (restored,
        or a preempted slice replaced) has a free head until the pool reserves it again, and a
        trainer waiting for a head of the type takes whichever Ray offers (the soak saw it)."""
        mine = {i.name for i in att.infos}
        for name, info in inventory.items():
            if info.accelerator_type == att.type and name not in mine and self._pool.get(name) is None:
                self._fence(info)

    def _open(self, att: RayAttempt, inventory: dict[str, SliceInfo]) -> None:
        mine = {i.name for i in att.infos}
        att.settled = frozenset(
            n for n, i in inventory.items() if i.accelerator_type == att.type and i.intact
        )
        self._fence_others(att, inventory)
        for name in mine:
            self._unfence(name)
            self._pool.release(name)
        self._window[att.type] = att.key
        try:
            self._submit(att)
            att.state = "SUBMITTED"
        except Exception as err:  # the attempt fails with the reason; the window moves on
            log.warning("could not submit Ray job %s: %s", submission_id(*att.key), err)
            att.state, att.status = "ENDED", "FAILED"
            att.message = f"Ray's job submission refused it: {' '.join(str(err).split())[-500:]}"
            del self._window[att.type]

    def _close(self, stype: str, inventory: dict[str, SliceInfo]) -> None:
        """The window's trainer holds its heads (or never will): fence the slices of Ray attempts,
        give the others (drained, broken) back to Ray."""
        self._window.pop(stype, None)
        held = self._held_by_live()
        for name, info in inventory.items():
            if info.accelerator_type != stype:
                continue
            if name in held:
                self._fence(info)
            elif name in self._fences:
                self._unfence(name)

    def _held_by_live(self) -> set[str]:
        """The slices of Ray attempts whose driver was submitted and has not ended."""
        live = [a for a in self._attempts.values() if a.state in ("SUBMITTED", "PLACED")]
        return {i.name for a in live for i in a.infos}

    def _fence(self, info: SliceInfo) -> None:
        if info.name in self._fences:
            return
        self._fences[info.name] = self._pg.create(
            bundles=[{f"TPU-{info.accelerator_type}-head": 1}],
            bundle_label_selector=[
                {SLICE_LABEL: info.name, WORKER_LABEL: "0", POD_TYPE_LABEL: info.accelerator_type}
            ],
            name=fence_name(info.name),
            lifetime="detached",
        )

    def _unfence(self, name: str) -> None:
        pg = self._fences.pop(name, None)
        if pg is not None:
            with contextlib.suppress(Exception):
                self._pg.remove(pg)

    def release_fences(self) -> None:
        for name in list(self._fences):
            self._unfence(name)

    # -- submit, observe ----------------------------------------------------------------------
    def _submit(self, att: RayAttempt) -> None:
        spec = att.spec
        env = {
            # Every Train worker's lines in the driver's log, the job's one log: Ray's dedup folds
            # lines that differ only in numbers ("worker 3 on tpu-v4-16-1/0 [repeated 3x]").
            # The job's own env may turn it back on.
            "RAY_DEDUP_LOGS": "0",
            **spec.env,
            **contract.ray_driver_env(
                spec.job_id, spec.attempt, spec.checkpoint_dir, [(i.name, i.slice_type) for i in att.infos]
            ),
            "RAY_JOB_STOP_WAIT_TIME_S": str(STOP_WAIT_S),
        }
        runtime_env: dict[str, Any] = {"env_vars": env}
        scratch = None
        try:
            if spec.package is not None:  # the tenant's upload, unpacked where nothing else lives
                scratch = Path(tempfile.mkdtemp(prefix="tpufleet-rayjob-"))
                jobfiles.unpack(spec.package, scratch / "wd")
                runtime_env["working_dir"] = str(scratch / "wd")
            elif spec.working_dir_url:
                runtime_env["working_dir"] = spec.working_dir_url
            self.client.submit_job(
                entrypoint=shlex.join(spec.command),
                submission_id=submission_id(*att.key),
                runtime_env=runtime_env,
                metadata={
                    "tpufleet_job": spec.job_id,
                    "tpufleet_attempt": str(spec.attempt),
                    "tpufleet_slices": ",".join(i.name for i in att.infos),
                    "tpufleet_tenant": spec.tenant,
                },
            )
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)

    def _refresh(self, att: RayAttempt) -> None:
        """Ray's word on the driver, and where the job's placement groups are. A Ray API that does
        not answer now changes nothing (the last answer stands; the next poll asks again)."""
        try:
            self._ask_ray(att)
        except Exception as err:
            log.warning("could not read Ray job %s: %s", submission_id(*att.key), err)

    def _ask_ray(self, att: RayAttempt) -> None:
        if att.state in ("WAITING", "ENDED") and att.status not in _RAY_ENDED:
            return
        if att.status not in _RAY_ENDED:
            info = self.client.get_job_info(submission_id(*att.key))
            att.status = str(getattr(info.status, "value", info.status))
            att.message = info.message or ""
            att.exit_code = getattr(info, "driver_exit_code", None)
            att.ray_job = att.ray_job or getattr(info, "job_id", None)
        if att.ray_job and att.state in ("SUBMITTED", "PLACED"):
            self._check_placement(att)

    def _check_placement(self, att: RayAttempt) -> None:
        nodes = att.nodes()
        heads = {i.hosts[0].node_id for i in att.infos if i.hosts}
        on: set[str] = set()
        took: set[str] = set()
        for pg in self._pg.of_job(att.ray_job or ""):
            for node, resources in pg["bundles"]:
                if not node or not any(k.startswith("TPU") for k in resources):
                    continue  # not placed yet, or no TPU (a CPU bundle may go anywhere)
                if node in nodes:
                    on.add(nodes[node])
                    if node in heads and any(k.endswith("-head") for k in resources):
                        took.add(nodes[node])
                elif att.wrong is None:
                    where = _slice_of_node(self._inventory.values()).get(node)
                    att.wrong = (
                        f"Ray placed this job's placement group {pg['name'] or pg['id'][:12]} on "
                        f"{where or 'node ' + node[:12]}, outside the admitted slices "
                        f"{', '.join(sorted(set(nodes.values())))}"
                    )
                    # The race the window cannot close: a slice whose hosts came back after the
                    # window opened has a free head until the next cycle fences it, and the
                    # trainer may take it. Not the job's doing; any other misplacement may be.
                    head = any(k.endswith("-head") for k in resources)
                    att.raced = head and where is not None and where not in att.settled
                    if att.raced:
                        att.wrong += " (its hosts came back while this job's window was open)"
        att.placed = tuple(i.name for i in att.infos if i.name in on)
        if att.state == "SUBMITTED" and len(took) == len(att.infos):
            att.state = "PLACED"

    def status(self, key: Key, dead_nodes: set[str]) -> AttemptStatus:
        att = self._attempts[key]
        if att.state != "ENDED":
            self._refresh(att)
        state, code = _host_state(att)
        hosts = []
        for info in att.infos:
            for h in info.hosts:
                if h.node_id in dead_nodes:
                    hosts.append(HostStatus(info.name, h.worker_id, HostState.LOST))
                else:
                    hosts.append(HostStatus(info.name, h.worker_id, state, code))
        if att.raced:
            return AttemptStatus(key[0], key[1], tuple(hosts), interrupted=att.wrong)
        if att.wrong and hosts:
            hosts[0] = HostStatus(hosts[0].slice, hosts[0].worker_id, HostState.LOST, None, att.wrong)
        elif att.status == "FAILED" and code is None and hosts:
            hosts[0] = HostStatus(hosts[0].slice, hosts[0].worker_id, HostState.LOST, None, att.message)
        return AttemptStatus(key[0], key[1], tuple(hosts), placed=att.placed if not att.wrong else ())

    def read_log(self, key: Key, slice_name: str, worker_id: int, offset: int) -> LogChunk:
        att = self._attempts[key]
        ended = att.status in _RAY_ENDED or att.state == "ENDED"
        first = att.infos[0].name if att.infos else ""
        if (slice_name, worker_id) != (first, 0):
            return LogChunk("", offset, complete=ended)
        submitted = att.state != "WAITING" and not (att.state == "ENDED" and not att.ray_job)
        if submitted:
            with contextlib.suppress(Exception):  # Ray forgot it: keep what was read
                att.log = self.client.get_job_logs(submission_id(*key)) or att.log
        data = att.log[offset : offset + (1 << 20)]
        end = offset + len(data)
        return LogChunk(data, end, complete=ended and end >= len(att.log))

    # -- stop ---------------------------------------------------------------------------------
    def stop(self, key: Key, grace_s: float) -> None:
        """SIGTERM to the driver through Ray's job stop, SIGKILL ``STOP_WAIT_S`` later; returns when
        the driver is gone and the job's placement groups are removed."""
        att = self._attempts.get(key)
        if att is None or att.state == "ENDED":
            return
        if att.state == "WAITING":
            att.state, att.status, att.exit_code = "ENDED", "STOPPED", -15
            return
        sid = submission_id(*key)
        with contextlib.suppress(Exception):
            self.client.stop_job(sid)
        deadline = time.monotonic() + STOP_WAIT_S + 30
        while time.monotonic() < deadline:
            self._refresh(att)
            if att.status in _RAY_ENDED:
                break
            time.sleep(0.2)
        else:
            raise ClusterError(f"Ray job {sid} did not stop in {STOP_WAIT_S + 30} s", retry_after=5)
        self._remove_job_pgs(att)
        att.state = "ENDED"

    def _remove_job_pgs(self, att: RayAttempt) -> None:
        """Ray removes a job's placement groups when its driver is gone; wait for that, then remove
        what is left (a detached group the job made), so the chips are free."""
        if not att.ray_job:
            return
        deadline = time.monotonic() + 20
        while self._pg.of_job(att.ray_job) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pg in self._pg.of_job(att.ray_job):
            log.warning("removing placement group %s that Ray job %s left", pg["id"], att.ray_job)
            with contextlib.suppress(Exception):
                self._pg.remove_id(pg["id"])

    def finished(self, key: Key) -> list[str]:
        """After ``stop``: drop the attempt's fences unless a window of its type is open (then they
        stay until it closes, so that trainer cannot take these heads); returns its slices. The
        record stays (``status`` and ``read_log`` answer for it) among the last ``KEEP_ENDED``."""
        att = self._attempts.get(key)
        if att is None:
            return []
        ended = [k for k, a in self._attempts.items() if a.state == "ENDED" and k != key]
        for old in ended[: max(0, len(ended) - KEEP_ENDED)]:
            del self._attempts[old]
        names = [i.name for i in att.infos]
        if att.type not in self._window:
            for name in names:
                self._unfence(name)
        return names

    # -- after a control-plane restart ----------------------------------------------------------
    def running(self) -> list[tuple[Key, list[str]]]:
        """(job, attempt) and slices of every tpufleet Ray job whose driver Ray still runs."""
        out = []
        for job in self.client.list_jobs():
            meta = job.metadata or {}
            status = str(getattr(job.status, "value", job.status))
            if (job.submission_id or "").startswith(SUBMISSION_PREFIX) and status not in _RAY_ENDED:
                with contextlib.suppress(KeyError, ValueError):
                    key = (meta["tpufleet_job"], int(meta["tpufleet_attempt"]))
                    out.append((key, meta.get("tpufleet_slices", "").split(",")))
        return out

    def take_over_fences(self) -> None:
        """Know the fences a previous control plane left by name (they are detached: Ray holds them
        past its end), so ``adopt`` keeps an adopted job's instead of making a second of the same
        name and ``drop_stray_fences`` can give the others back."""
        for name, pg in self._pg.existing((FENCE_PREFIX,)).items():
            self._fences.setdefault(name.removeprefix(FENCE_PREFIX), pg)

    def drop_stray_fences(self) -> None:
        """After ``adopt``: keep the fences of live Ray attempts' slices and of slices whose type has
        an open window; remove the rest. A stray fence holds its slice's head resource for good, so
        the warm pool's head group of that slice never places and no trainer can take it."""
        held = self._held_by_live()
        for name in list(self._fences):
            info = self._inventory.get(name)
            if name not in held and (info is None or info.accelerator_type not in self._window):
                log.info("removing the fence %s a previous control plane left", fence_name(name))
                self._unfence(name)

    def adopt(self, key: Key, infos: list[SliceInfo], accelerator_type: str) -> None:
        if key in self._attempts:
            return
        spec = AttemptSpec(
            key[0], key[1], tuple(i.name for i in infos), accelerator_type, (), kind=JobKind.RAY
        )
        att = RayAttempt(spec, infos, state="PLACED")
        for info in infos:
            self._fence(info)
        self._attempts[key] = att


def _host_state(att: RayAttempt) -> tuple[HostState, int | None]:
    if att.state == "WAITING" or att.status == "PENDING":
        return HostState.STARTING, None
    if att.status == "RUNNING" and att.state != "ENDED":
        return HostState.RUNNING, None
    if att.status == "SUCCEEDED":
        return HostState.EXITED, 0
    if att.status == "STOPPED":
        return HostState.EXITED, -15
    if att.status == "FAILED":
        return HostState.EXITED, att.exit_code if att.exit_code not in (None, 0) else None
    return HostState.RUNNING, None


class RayPlacements:
    """Ray's placement-group calls the Ray-job window makes, in one object: fences made and removed,
    a driver's groups read, the fences a killed control plane left found again by name. Tests hand
    :class:`RayJobs` one that records the calls instead (no Ray)."""

    def create(self, **options: Any) -> Any:
        return placement_group(**options)

    def remove(self, handle: Any) -> None:
        remove_placement_group(handle)

    def remove_id(self, pg_id: str) -> None:
        remove_placement_group(_pg_handle(pg_id))

    def of_job(self, ray_job: str) -> list[dict[str, Any]]:
        return job_placement_groups(ray_job)

    def existing(self, prefixes: tuple[str, ...]) -> dict[str, Any]:
        return existing_pgs(prefixes)


def job_placement_groups(ray_job: str) -> list[dict[str, Any]]:
    """The placement groups (not removed) a Ray job created, from the GCS table: id, name, and
    (node id, resources) per bundle. One private Ray API (``creator_job_id`` is not in the public
    ``placement_group_table``), isolated here."""
    from ray._private import state as ray_state
    from ray.core.generated import gcs_pb2 as gcs_module

    gcs: Any = gcs_module
    accessor: Any = ray_state.state._connect_and_get_accessor()
    out = []
    for raw in accessor.get_placement_group_table():
        pg = gcs.PlacementGroupTableData.FromString(raw)
        if pg.creator_job_id.hex() != ray_job or pg.state == gcs.PlacementGroupTableData.REMOVED:
            continue
        bundles = [(_node_hex(b.node_id), dict(b.unit_resources)) for b in pg.bundles]
        out.append({"id": pg.placement_group_id.hex(), "name": pg.name, "bundles": bundles})
    return out


def _node_hex(node_id: bytes) -> str:
    """A bundle's node as hex, or "" while it is not placed (an empty or all-zero id)."""
    return node_id.hex() if node_id and any(node_id) else ""


def _pg_handle(pg_id: str) -> PlacementGroup:
    from ray._raylet import PlacementGroupID

    return PlacementGroup(PlacementGroupID(bytes.fromhex(pg_id)))


def _default_client() -> Any:
    """Ray's job submission client for the cluster this process is connected to: the dashboard's
    address as that cluster's GCS records it (never Ray's "auto" search, which finds whatever Ray
    runs on this machine); Ray's token is added by the client when token auth is on."""
    from ray._private.services import get_webui_url_from_internal_kv
    from ray.job_submission import JobSubmissionClient

    if not ray.is_initialized():
        raise ClusterError("not connected to Ray: RayExecutor.connect() first")
    url = get_webui_url_from_internal_kv()  # type: ignore[no-untyped-call]
    if not url:
        raise ClusterError(
            "the Ray cluster runs no dashboard, so it has no job API for Ray jobs", retry_after=30
        )
    return JobSubmissionClient(url if "://" in url else f"http://{url}")
