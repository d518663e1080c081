"""Ray jobs (``submit --ray``, docs/ray-jobs.md) through the whole control plane on the shared
emulated fleet (two ``v4-16`` slices): Ray Train's JaxTrainer (``examples/train_jaxtrainer.py``,
uploaded as the tenant's package) lands on exactly the slice tpufleet admitted, next to an SPMD job
and next to another Ray job, and a multi-slice one on both slices; cancel ends the driver and every
Train worker and frees the slice; a lost host or a preemption ends the attempt and the next one
restores Ray Train's checkpoint, with a Ray Data pipeline feeding the workers throughout. The tests
of where the trainer lands feed it from memory (``--data memory``): a Ray Data pipeline starts a
dozen processes of its own, which would cost them most of their time and tell them nothing more.

Where each Train worker runs is read from inside it: the example prints
``worker <rank> on <TPU_NAME>/<TPU_WORKER_ID>``, which Ray forwards to the driver's log.
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import planes
import pytest
import ray
from _executor_helpers import wait_for

from tpufleet.client.http import Client
from tpufleet.control.loop.service import ServiceConfig
from tpufleet.control.ray.client import RayExecutor
from tpufleet.control.store.values import Limits

pytestmark = pytest.mark.integration

PY = sys.executable
EXAMPLE = Path(__file__).parents[2] / "examples" / "train_jaxtrainer.py"
CONFIG = ServiceConfig(
    interval_s=0.2, preempt_grace_s=3.0, cancel_grace_s=1.0, fail_grace_s=1.0, start_timeout_s=300.0
)
WORKER = re.compile(r"worker (\d+) on ([\w-]+)/(\d+)")
MEMORY = ("--data", "memory")  # no Ray Data pipeline: see the module docstring


@dataclass
class Plane(planes.Served):
    package_dir: Path = Path()  # examples/train_jaxtrainer.py, as the tenants' package
    ray_address: str = ""  # the shared fleet's: Ray's state API asks for it when another cluster runs here

    def tenant(self, **quota: int) -> Client:
        return self.tenant_client("ray", **quota)[1]

    def ray_job(self, client: Client, *args: str, **kw: Any) -> str:
        package = client.upload_package(self.package_dir)
        command = [PY, "train_jaxtrainer.py", "--rows", "512", *args]
        job = client.submit(command, "v4-16", working_dir=package, kind="ray", **kw)
        return str(job["id"])


@pytest.fixture(scope="module")
def plane(ray_client: object, fleet: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    package_dir = tmp_path_factory.mktemp("package")
    shutil.copy(EXAMPLE, package_dir)
    cluster = RayExecutor.connect(fleet.ray_address)
    state_dir = tmp_path_factory.mktemp("control-plane")
    v4 = [s.name for s in cluster.inventory() if s.intact and s.accelerator_type == "v4-16"]
    limits = Limits(ray_jobs=True)
    with planes.served(
        cluster, state_dir, kind=Plane, warm=v4, cancel_timeout_s=120, config=CONFIG, limits=limits
    ) as p:
        p.package_dir, p.ray_address = package_dir, fleet.ray_address
        yield p


@pytest.fixture(autouse=True)
def _no_job_left_behind(plane: Plane) -> Iterator[None]:
    yield
    plane.cancel_all(120)


def wait_state(client: Client, job_id: str, *states: str, timeout_s: float = 300.0) -> dict[str, Any]:
    return planes.wait_state(
        client, job_id, *states, timeout_s=timeout_s, every_s=0.5, explain=lambda: _driver_log(client, job_id)
    )


def _driver_log(client: Client, job_id: str, attempt: int | None = None) -> str:
    hosts = client.logs(job_id, attempt=attempt)["hosts"]
    return str(hosts[0]["data"]) if hosts else ""


def workers_on(client: Client, job_id: str, count: int, attempt: int | None = None) -> set[tuple[str, int]]:
    """(TPU_NAME, TPU_WORKER_ID) of every Train worker, as each printed it, once all ``count`` did."""

    def probe() -> set[tuple[str, int]] | None:
        found = {(m[1], int(m[2])) for m in WORKER.findall(_driver_log(client, job_id, attempt))}
        return found if len(found) >= count else None

    try:
        return wait_for(f"{count} Train workers of {job_id} to say where they run", probe, 300, every_s=0.5)
    except AssertionError as err:
        raise AssertionError(
            f"{err}; the driver's log ends:\n{_driver_log(client, job_id, attempt)[-4000:]}"
        ) from None


_PRINT_AND_WAIT = (
    "import os, time; print('on', os.environ['TPU_NAME'] + '/' + os.environ['TPU_WORKER_ID'], flush=True); "
    "time.sleep(120)"
)


def _all_hosts(client: Client, job_id: str, text: str) -> list[str] | None:
    hosts = client.logs(job_id)["hosts"]
    lines = [ln for h in hosts for ln in str(h["data"]).splitlines() if ln.startswith(text)]
    return lines if len(lines) == len(hosts) and hosts else None


@pytest.mark.timeout(900)  # two Ray Train start-ups on a shared 2-core machine
def test_two_ray_jobs_of_the_same_type_each_train_on_their_slice_then_one_beside_an_spmd_job_is_cancelled(
    plane: Plane,
) -> None:
    """Two tenants' Ray jobs of the same type are admitted together and each Train worker runs on
    the slice its job was admitted on (from the workers' own TPU_NAME). Once the short one has
    ended, an SPMD job takes its slice and runs beside the long one; cancelling the Ray job ends
    its driver and every Train worker and frees its slice, and leaves the SPMD job running."""
    a, b = plane.tenant(v4=8), plane.tenant(v4=8)
    long = plane.ray_job(a, "--steps", "500", "--step-time", "0.5", *MEMORY)
    short = plane.ray_job(b, "--steps", "4", *MEMORY)
    jobs = [(a, long), (b, short)]
    admitted = [wait_state(c, j, "STARTING", "RUNNING")["slices"] for c, j in jobs]
    assert sorted(s for x in admitted for s in x) == ["tpu-v4-16-0", "tpu-v4-16-1"]
    for (client, job), slices in zip(jobs, admitted, strict=True):
        assert workers_on(client, job, 2) == {(slices[0], 0), (slices[0], 1)}
    assert wait_state(b, short, "SUCCEEDED")["exit_code"] == 0
    assert "RESULT " in _driver_log(b, short)  # the driver's final metrics line

    slices = admitted[0]
    spmd = b.submit([PY, "-c", _PRINT_AND_WAIT], "v4-16")["id"]
    other = wait_state(b, spmd, "RUNNING")["slices"]
    assert other == admitted[1]  # the short job's slice, beside the long one's
    spmd_lines = wait_for("the SPMD job's hosts", lambda: _all_hosts(b, spmd, "on "), 120)
    assert {line.split()[-1] for line in spmd_lines} == {f"{other[0]}/0", f"{other[0]}/1"}
    assert a.job(long)["state"] == "RUNNING"
    events = [e["message"] for e in a.events(long)]
    assert any(f"placement groups are on {slices[0]}" in m for m in events), events
    ray_job = plane.cluster._ray.get((long, 1))
    assert ray_job is not None and ray_job.ray_job
    assert _alive_actors(plane, ray_job.ray_job) >= 2  # the controller and the Train workers
    a.cancel(long)
    assert wait_state(a, long, "CANCELLED")["state"] == "CANCELLED"
    # Ray ends a job's actors once its driver is gone, on its own time: tpufleet waits for the job's
    # placement groups (the Train workers' TPUs) before CANCELLED, not for every actor.
    wait_for("every actor of the Ray job to end", lambda: _alive_actors(plane, ray_job.ray_job) == 0, 30, 0.5)
    wait_for("the slice to be free", lambda: _free(plane, slices[0]), 60)
    assert b.job(spmd)["state"] == "RUNNING"


def _alive_actors(plane: Plane, ray_job: str) -> int:
    """The job's live actors that share its fate: not the detached ones, which Ray Data makes on
    purpose to outlive the job that first asks for them (its stats actors, get_if_exists)."""
    from ray.util.state import list_actors

    actors = list_actors(
        address=plane.ray_address,
        filters=[("job_id", "=", ray_job), ("state", "=", "ALIVE")],
        detail=True,
        raise_on_missing_output=False,
    )
    return sum(1 for a in actors if not a.is_detached)


def _free(plane: Plane, name: str) -> bool:
    return any(s["name"] == name and s["state"] == "FREE" for s in plane.admin.slices())


@pytest.mark.timeout(1200)  # four Ray Train start-ups on a shared 2-core machine
def test_a_preempted_by_a_multi_slice_job_then_host_lost_ray_job_restores_its_checkpoint_each_time(
    plane: Plane, fleet: Any
) -> None:
    """Quota and recovery apply to Ray jobs. One that borrows (its tenant has no v4 quota) is
    preempted when a tenant owed the chips needs them for a multi-slice Ray job, which trains on
    every host of both admitted slices: the borrower's driver gets SIGTERM through Ray's job stop,
    the job is requeued without using a retry, and attempt 2 restores a checkpoint attempt 1
    reported. Then a host of attempt 2's slice dies: the attempt ends, the slice is quarantined, and
    attempt 3 runs elsewhere from attempt 2's newest checkpoint to the end."""
    borrower, owner = plane.tenant(v4=0), plane.tenant(v4=16)
    job = plane.ray_job(borrower, "--steps", "20", "--checkpoint-every", "2", "--step-time", "0.5")
    wait_state(borrower, job, "RUNNING")
    assert borrower.job(job)["borrowing"] is True
    _checkpointed(borrower, job, 1, after=0)
    # The worker says "checkpoint at step N" before it reports the checkpoint, which Ray Train
    # records at its controller's next poll: preempt once one is recorded, or there is none to restore.
    wait_for("a checkpoint of attempt 1 recorded", lambda: max(_recorded(borrower, job), default=0) > 0, 60)
    # The owner's job is a multi-slice Ray job (--num-slices 2): the trainer
    # (runtime.scaling_config(): one worker per host of every admitted slice) gets exactly the two
    # slices tpufleet admitted, one Train worker on each host, and JAX sees one computation over
    # all four processes.
    both = plane.ray_job(owner, "--steps", "4", *MEMORY, num_slices=2)
    slices = wait_state(owner, both, "STARTING", "RUNNING")["slices"]
    assert sorted(slices) == ["tpu-v4-16-0", "tpu-v4-16-1"]
    first = borrower.job(job)["attempts"][0]
    assert first["state"] == "PREEMPTED" and "preempted" in (first["message"] or ""), first
    assert "SIGTERM (the checkpoint signal)" in _driver_log(borrower, job, 1)
    assert borrower.job(job)["state"] == "QUEUED" and borrower.job(job)["failures"] == 0
    assert workers_on(owner, both, 4) == {(s, w) for s in slices for w in (0, 1)}
    done = wait_state(owner, both, "SUCCEEDED")
    assert done["exit_code"] == 0 and done["slices"] == slices
    log = _driver_log(owner, both)
    assert "(4 processes, 16 devices)" in log and "RESULT " in log, log[-3000:]

    second = wait_for("attempt 2 to run", lambda: _running(borrower, job, 2), 300)
    from_first = _restored(borrower, job, 2)
    assert from_first in _saved(borrower, job, 1), (from_first, _driver_log(borrower, job, 1)[-3000:])
    _checkpointed(borrower, job, 2, after=from_first)
    # Ray Train records a reported checkpoint at its controller's next poll; a host lost before that
    # loses the checkpoint (Ray Train's behaviour, not tpufleet's). Kill once one is recorded.
    wait_for(
        "a checkpoint of attempt 2 recorded",
        lambda: max(_recorded(borrower, job), default=0) > from_first,
        60,
    )
    fleet.kill_host(second["slices"][0], 1)

    third = wait_for("attempt 3 to run", lambda: _running(borrower, job, 3), 480)
    assert third["slices"] != second["slices"]  # the broken slice is quarantined
    from_second = _restored(borrower, job, 3)
    assert from_second in _saved(borrower, job, 2) and from_second > from_first, (from_first, from_second)
    done = wait_state(borrower, job, "SUCCEEDED", timeout_s=400)
    assert done["attempt"] == 3 and done["failures"] == 1 and done["exit_code"] == 0
    assert '"step": 20' in _driver_log(borrower, job, 3)
    lost = borrower.job(job)["attempts"][1]["message"] or ""
    assert "lost" in lost or "broken" in lost, lost


def _running(client: Client, job_id: str, attempt: int) -> dict[str, Any] | None:
    job = client.job(job_id)
    return job if job["attempt"] == attempt and job["state"] == "RUNNING" else None


def _saved(client: Client, job_id: str, attempt: int) -> set[int]:
    return {int(s) for s in re.findall(r"checkpoint at step (\d+)", _driver_log(client, job_id, attempt))}


def _checkpointed(client: Client, job_id: str, attempt: int, after: int) -> None:
    """Until the attempt has reported a checkpoint past step ``after``."""
    try:
        wait_for("a checkpoint", lambda: max(_saved(client, job_id, attempt), default=0) > after, 300, 0.5)
    except AssertionError:
        raise AssertionError(_driver_log(client, job_id, attempt)[-3000:]) from None


def _recorded(client: Client, job_id: str) -> set[int]:
    """Steps of the checkpoints Ray Train has recorded in the run's snapshot (what the next run
    restores from), found next to the checkpoints the driver's log names."""
    where = re.findall(
        r"Checkpoint successfully created at: Checkpoint\(filesystem=local, path=(\S+?)\)",
        _driver_log(client, job_id),
    )
    if not where:
        return set()
    snapshot = Path(where[-1]).parent / "checkpoint_manager_snapshot.json"
    text = snapshot.read_text() if snapshot.exists() else ""
    return {int(s) for s in re.findall(r'\\?"step\\?":\s*(\d+)', text)}


def _restored(client: Client, job_id: str, attempt: int) -> int:
    found = wait_for(
        f"attempt {attempt} to restore",
        lambda: re.search(r"restored step (\d+)", _driver_log(client, job_id, attempt)),
        300,
        0.5,
    )
    return int(found.group(1))


def test_the_fleet_is_whole_afterwards() -> None:
    """Nothing of this module holds a head resource or fence any more (later modules reserve)."""
    from tpufleet.control.ray.jobs import FENCE_PREFIX

    names = [
        row.get("name") or ""
        for row in ray.util.placement_group_table().values()
        if row.get("state") != "REMOVED"
    ]
    assert not [n for n in names if n.startswith(FENCE_PREFIX)]
