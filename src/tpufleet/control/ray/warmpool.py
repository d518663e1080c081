"""Slice reservations and the warm pool.

A slice is reserved with Ray's own ``ray.util.tpu.SlicePlacementGroup``: one bundle per host of
``{"TPU": chips_per_host, "CPU": 0}``, pinned by ``bundle_label_selector`` to that slice
(``ray.io/tpu-slice-name``) and, per bundle, to one worker id (``ray.io/tpu-worker-id``) so bundle
``i`` is host ``i`` and its runner is ``tpufleet:runner:<slice>:<i>``. Because every selector names
the slice, Ray skips its head-reservation round trip (``reserve_tpu_slice``), and the group is
``detached`` and named ``tpufleet:slice:<slice>`` so a restarted control plane adopts it again.
A second, one-bundle group (``tpufleet:head:<slice>``) holds the slice's ``TPU-<type>-head``
resource, so Ray's own slice reservation (``reserve_tpu_slice``) never picks a slice we hold.

The warm pool keeps such a reservation, plus one idle runner per host, on every free intact slice:
handing a slice to an admitted job is then one actor call per host (see ``RayExecutor.launch``).
Holding a free slice's chips is the price: to Ray (``get_num_ready_tpu_slices``, a bare
``JaxTrainer``) a pooled slice is in use; ``RayExecutor.release`` gives a slice back to Ray.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayError
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from ray.util.tpu import SlicePlacementGroup

from tpufleet import inventory
from tpufleet.catalog import generation
from tpufleet.control.cluster.protocol import SliceInfo
from tpufleet.host.runner import NAMESPACE, RemoteRunner, job_runner_name, pool_runner_name

log = logging.getLogger(__name__)

SLICE_LABEL, WORKER_LABEL, POD_TYPE_LABEL = inventory.SLICE_NAME, inventory.WORKER_ID, inventory.POD_TYPE
PG_PREFIX = "tpufleet:slice:"
CHECK_EVERY_S = 5.0  # how often the runners of a free slice are pinged
PING_TIMEOUT_S = 30.0  # a runner that does not answer a ping in this time is replaced
MAX_REPLACEMENTS = 3  # checks in a row that found a dead runner before the slice says it cannot heal
HEAD_PREFIX = "tpufleet:head:"


def pg_name(slice_name: str) -> str:
    return f"{PG_PREFIX}{slice_name}"


def head_pg_name(slice_name: str) -> str:
    return f"{HEAD_PREFIX}{slice_name}"


@dataclass
class Reservation:
    """One slice's placement group and its pool runners (index = worker id)."""

    info: SliceInfo
    pg: PlacementGroup
    head: PlacementGroup | None = None  # holds TPU-<type>-head on worker 0, as Ray's own reservation does
    runners: list[Any] = field(default_factory=list)
    pings: list[Any] = field(default_factory=list)  # ObjectRefs of a health check in flight
    pinged_at: float = 0.0
    replaced: int = 0  # health checks in a row that found a dead runner
    problem: str | None = None  # why the slice must not be offered now (a runner being replaced)

    @property
    def nodes(self) -> tuple[str | None, ...]:
        return tuple(h.node_id for h in self.info.hosts)


def _version(info: SliceInfo) -> str:
    return generation(info.accelerator_type.rsplit("-", 1)[0]).ray_name


def existing_pgs(prefixes: tuple[str, ...] = (PG_PREFIX, HEAD_PREFIX)) -> dict[str, PlacementGroup]:
    """Detached tpufleet placement groups whose name starts with one of ``prefixes`` that Ray
    still holds, by name (any namespace): what a previous control plane left."""
    from ray._common.utils import hex_to_binary
    from ray._raylet import PlacementGroupID

    found = {}
    for pg_id, row in placement_group_table().items():
        name = row.get("name") or ""
        if name.startswith(prefixes) and row.get("state") != "REMOVED":
            found[name] = PlacementGroup(PlacementGroupID(hex_to_binary(pg_id)))  # type: ignore[no-untyped-call]
    return found


def kill_actor(handle: Any) -> None:
    try:
        ray.kill(handle, no_restart=True)
    except Exception:  # already gone
        log.debug("runner already gone", exc_info=True)


class SlicePool:
    """Reservations the control plane holds, by slice name. Not thread-safe: the caller locks."""

    def __init__(self, log_root: str | None = None) -> None:
        self.log_root = log_root
        self._res: dict[str, Reservation] = {}
        self._adopt: dict[str, PlacementGroup] | None = None

    def get(self, name: str) -> Reservation | None:
        return self._res.get(name)

    def names(self) -> list[str]:
        return sorted(self._res)

    def reserve(self, info: SliceInfo) -> Reservation:
        """Reserve ``info`` (or adopt the detached reservation a previous control plane left);
        returns at once: the group and runners come up in the background."""
        have = self._res.get(info.name)
        if have is not None:
            if have.nodes == tuple(h.node_id for h in info.hosts):
                return have
            self.release(info.name)  # the slice came back on new hosts: start clean
        if self._adopt is None:
            self._adopt = existing_pgs()
        pg = self._adopt.pop(pg_name(info.name), None) or _new_pg(info)
        head = self._adopt.pop(head_pg_name(info.name), None) or _new_head_pg(info)
        res = Reservation(info, pg, head)
        res.runners = [
            self._runner(res, w, pool_runner_name(info.name, w), spare=True)
            for w in range(info.expected_hosts)
        ]
        for runner in res.runners:
            runner.sweep.remote()  # what runs of a dead runner or host left behind (not awaited)
        self._res[info.name] = res
        return res

    def _runner(
        self,
        res: Reservation,
        worker: int,
        name: str,
        runtime_env: dict[str, Any] | None = None,
        *,
        spare: bool = False,
    ) -> Any:
        """A host's runner; ``spare``: it keeps a run's first process started ahead (``host/spare.py``),
        as the pool's runners do for the next attempt (an attempt's own runner runs one)."""
        options: dict[str, Any] = {
            "name": name,
            "namespace": NAMESPACE,
            "lifetime": "detached",
            "get_if_exists": True,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                res.pg, placement_group_bundle_index=worker
            ),
        }
        if runtime_env:
            options["runtime_env"] = runtime_env
        return RemoteRunner.options(**options).remote(res.info.name, worker, self.log_root, spare)

    def job_runners(self, name: str, job_id: str, attempt: int, url: str) -> list[Any]:
        """Runners for one attempt whose code Ray's ``runtime_env`` fetches from ``url`` (a URL the
        operator allowed; never a local path, which would be the control plane's own disk)."""
        if "://" not in url or url.startswith("file:"):
            raise ValueError(f"working_dir {url!r} is not a remote URL")
        res = self._res[name]
        env = {"working_dir": url}
        return [
            self._runner(res, w, job_runner_name(job_id, attempt, name, w), env)
            for w in range(res.info.expected_hosts)
        ]

    def replace_runners(self, name: str, workers: list[int], why: str) -> None:
        """New pool runners for hosts ``workers`` of a reserved slice, in place of dead ones; the
        slice is reported with ``problem`` (so it is not offered) until every runner answers."""
        res = self._res[name]
        for worker in workers:
            kill_actor(res.runners[worker])
            res.runners[worker] = self._runner(res, worker, pool_runner_name(name, worker))
            res.runners[worker].sweep.remote()  # kill what the dead runner's runs left behind
        res.replaced += 1
        hosts = ", ".join(str(w) for w in workers)
        if res.replaced > MAX_REPLACEMENTS:
            res.problem = f"the runner of host {hosts} cannot be replaced ({why})"
        else:
            res.problem = f"the runner of host {hosts} {why}; replacing it"
        res.pings, res.pinged_at = [], 0.0

    def check(self, name: str, now: float) -> str | None:
        """Health of a pooled slice's runners, without blocking: every ``CHECK_EVERY_S`` each runner
        is pinged; a runner that died or does not answer within ``PING_TIMEOUT_S`` is replaced.
        Returns why the slice must not be offered now, or None."""
        res = self._res[name]
        if not res.pings:
            if now - res.pinged_at >= (CHECK_EVERY_S if res.problem is None else 0.5):
                res.pings, res.pinged_at = [h.ping.remote() for h in res.runners], now
            return res.problem
        ready, _ = ray.wait(res.pings, num_returns=len(res.pings), timeout=0)
        if len(ready) < len(res.pings) and now - res.pinged_at < PING_TIMEOUT_S:
            return res.problem
        done, dead = set(ready), []
        for worker, ref in enumerate(res.pings):
            try:
                if ref not in done:
                    raise TimeoutError(f"no answer in {PING_TIMEOUT_S:.0f} s")
                ray.get(ref)
            except (RayError, TimeoutError) as err:
                log.warning("runner %s/%s is unhealthy: %s", name, worker, err)
                dead.append(worker)
        res.pings = []
        if dead:
            self.replace_runners(name, dead, "died")
        else:
            res.replaced, res.problem = 0, None
        return res.problem

    def release(self, name: str) -> None:
        """Drop a slice's reservation and its pool runners (a broken, draining or given-back slice)."""
        res = self._res.pop(name, None)
        if self._adopt is None:
            self._adopt = existing_pgs()
        pgs = [res.pg, res.head] if res else [self._adopt.pop(pg_name(name), None)]
        pgs.append(self._adopt.pop(head_pg_name(name), None))
        for handle in res.runners if res else _named_runners(name):
            kill_actor(handle)
        for pg in pgs:
            if pg is None:
                continue
            try:
                remove_placement_group(pg)
            except Exception:
                log.debug("placement group already removed", exc_info=True)

    def release_all(self) -> None:
        if self._adopt is None:
            self._adopt = existing_pgs()
        left = {n.split(":", 2)[2] for n in self._adopt}
        for name in sorted(set(self._res) | left):
            self.release(name)

    def wait_ready(self, names: list[str], timeout_s: float) -> None:
        """Block until the reservations and pool runners of ``names`` are up (tests, benchmarks)."""
        reservations = [self._res[n] for n in names]
        ray.get([pg.ready() for r in reservations for pg in (r.pg, r.head) if pg], timeout=timeout_s)
        ray.get([h.ping.remote() for r in reservations for h in r.runners], timeout=timeout_s)


def _new_pg(info: SliceInfo) -> PlacementGroup:
    cph = info.chips_per_host
    handle = SlicePlacementGroup(
        topology=info.topology,
        accelerator_version=_version(info),
        resources_per_bundle={"TPU": cph, "CPU": 0},
        name=pg_name(info.name),
        lifetime="detached",
        chips_per_vm=cph,
        bundle_label_selector=[
            {SLICE_LABEL: info.name, WORKER_LABEL: str(w)} for w in range(info.expected_hosts)
        ],
    )
    pg = handle.placement_group
    assert pg is not None
    return pg


def _new_head_pg(info: SliceInfo) -> PlacementGroup:
    """Take the slice's ``TPU-<type>-head`` resource too, pinned to this slice's worker 0, so Ray's
    own ``reserve_tpu_slice`` (``slice_placement_group``, ``JaxTrainer``) picks another slice instead
    of one whose chips the pool holds, and sees the slice as taken just as its own reservation would
    leave it. Created without waiting: Ray's own helper blocks on it, the pool need not."""
    pg: PlacementGroup = placement_group(
        bundles=[{f"TPU-{info.accelerator_type}-head": 1}],
        bundle_label_selector=[
            {SLICE_LABEL: info.name, WORKER_LABEL: "0", POD_TYPE_LABEL: info.accelerator_type}
        ],
        name=head_pg_name(info.name),
        lifetime="detached",
    )
    return pg


def _named_runners(slice_name: str) -> list[Any]:
    handles = []
    prefix = f"tpufleet:runner:{slice_name}:"
    for row in ray.util.list_named_actors(all_namespaces=True):
        if row["namespace"] == NAMESPACE and row["name"].startswith(prefix):
            try:
                handles.append(ray.get_actor(row["name"], namespace=NAMESPACE))
            except ValueError:
                continue
    return handles
