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
import torchreq
from _executor_helpers import wait_for

from tpufleet.client.http import Client
from tpufleet.control.loop.service import ServiceConfig
from tpufleet.control.ray.client import RayExecutor
from tpufleet.control.store.values import Limits

pytestmark = pytest.mark.integration

PY = sys.executable
EXAMPLE = Path(__file__).parents[2] / "examples" / "train_jaxtrainer.py"
TORCH_EXAMPLE = EXAMPLE.with_name("train_torchtrainer.py")
CONFIG = ServiceConfig(
    interval_s=0.5, preempt_grace_s=3.0, cancel_grace_s=1.0, fail_grace_s=1.0, start_timeout_s=300.0
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
    shutil.copy(TORCH_EXAMPLE, package_dir)
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


@pytest.mark.timeout(1500)  # five Ray Train start-ups on a shared 2-core machine
def test_ray_jobs_share_the_fleet_are_preempted_lose_a_host_restore_their_checkpoints_and_cancel(
    plane: Plane, fleet: Any
) -> None:
    """One Ray job's life on the shared fleet, with the others it meets on the way (five Ray Train
    start-ups in all, each a fifth of this module's time, so one story instead of two tests).

    1. Two tenants' Ray jobs of the same type are admitted together, and each Train worker runs on
       the slice its job was admitted on (from the workers' own TPU_NAME). One of them borrows: its
       tenant has no v4 quota; it reads its rows through a Ray Data pipeline and checkpoints.
    2. Quota applies to Ray jobs: once the other has ended, a tenant owed the chips submits a
       multi-slice Ray job, which preempts the borrower: its driver gets SIGTERM through Ray's job
       stop, the job is requeued without using a retry. The multi-slice job trains on every host
       of both admitted slices, one computation over four processes.
    3. Attempt 2 restores a checkpoint attempt 1 reported. Then a host of its slice dies: the
       attempt ends, the slice is quarantined, and attempt 3 runs elsewhere from attempt 2's newest
       checkpoint.
    4. Once the broken slice is restored, an SPMD job takes it and runs beside the Ray job;
       cancelling the Ray job ends its driver and every Train worker and frees its slice, and
       leaves the SPMD job running."""
    borrower, other, owner = plane.tenant(v4=0), plane.tenant(v4=8), plane.tenant(v4=16)

    # 1. two Ray jobs of the same type, each on its own slice
    # Long enough to be cancelled at the end (8,192 rows: one Ray Data pass covers every step).
    job = plane.ray_job(
        borrower, "--steps", "300", "--checkpoint-every", "4", "--step-time", "0.5", "--rows", "8192"
    )
    short = plane.ray_job(other, "--steps", "4", *MEMORY)
    jobs = [(borrower, job), (other, short)]
    admitted = [wait_state(c, j, "STARTING", "RUNNING")["slices"] for c, j in jobs]
    assert sorted(s for x in admitted for s in x) == ["tpu-v4-16-0", "tpu-v4-16-1"]
    for (client, job_id), slices in zip(jobs, admitted, strict=True):
        assert workers_on(client, job_id, 2) == {(slices[0], 0), (slices[0], 1)}
    assert borrower.job(job)["borrowing"] is True
    assert wait_state(other, short, "SUCCEEDED")["exit_code"] == 0
    assert "RESULT " in _driver_log(other, short)  # the driver's final metrics line

    # 2. preempted by a multi-slice Ray job of a tenant owed the chips
    _checkpointed(borrower, job, 1, after=0)
    # The worker says "checkpoint at step N" before it reports the checkpoint, which Ray Train
    # records at its controller's next poll: preempt once one is recorded, or there is none to restore.
    wait_for("a checkpoint of attempt 1 recorded", lambda: max(_recorded(borrower, job), default=0) > 0, 60)
    # The trainer (runtime.scaling_config(): one worker per host of every admitted slice) gets
    # exactly the two slices tpufleet admitted, one Train worker on each host, and JAX sees one
    # computation over all four processes.
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

    # 3. attempt 2 restores attempt 1's checkpoint, then loses a host
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
    broken = second["slices"][0]
    fleet.kill_host(broken, 1)
    third = wait_for("attempt 3 to run", lambda: _running(borrower, job, 3), 480)
    assert third["slices"] != second["slices"]  # the broken slice is quarantined
    assert third["failures"] == 1
    lost = borrower.job(job)["attempts"][1]["message"] or ""
    assert "lost" in lost or "broken" in lost, lost
    from_second = _restored(borrower, job, 3)
    assert from_second in _saved(borrower, job, 2) and from_second > from_first, (from_first, from_second)
    assert workers_on(borrower, job, 2, attempt=3) == {(third["slices"][0], 0), (third["slices"][0], 1)}

    # 4. an SPMD job beside it on the restored slice; cancelling the Ray job leaves that one running
    fleet.restore(broken)
    spmd = other.submit([PY, "-c", _PRINT_AND_WAIT], "v4-16")["id"]
    assert wait_state(other, spmd, "RUNNING")["slices"] == [broken]
    spmd_lines = wait_for("the SPMD job's hosts", lambda: _all_hosts(other, spmd, "on "), 120)
    assert {line.split()[-1] for line in spmd_lines} == {f"{broken}/0", f"{broken}/1"}
    assert borrower.job(job)["state"] == "RUNNING"
    events = [e["message"] for e in borrower.events(job)]
    assert any(f"placement groups are on {third['slices'][0]}" in m for m in events), events
    ray_job = plane.cluster._ray.get((job, 3))
    assert ray_job is not None and ray_job.ray_job
    assert _alive_actors(plane, ray_job.ray_job) >= 2  # the controller and the Train workers
    borrower.cancel(job)
    assert wait_state(borrower, job, "CANCELLED")["state"] == "CANCELLED"
    # Ray ends a job's actors once its driver is gone, on its own time: tpufleet waits for the job's
    # placement groups (the Train workers' TPUs) before CANCELLED, not for every actor.
    wait_for("every actor of the Ray job to end", lambda: _alive_actors(plane, ray_job.ray_job) == 0, 30, 0.5)
    wait_for("the slice to be free", lambda: plane.all_free(third["slices"]), 60)
    assert other.job(spmd)["state"] == "RUNNING"


@pytest.mark.timeout(900)
def test_a_torchtrainer_trains_one_worker_per_host_on_its_slice_and_resumes_after_a_lost_host(
    plane: Plane, fleet: Any
) -> None:
    """Ray Train's TorchTrainer (``examples/train_torchtrainer.py``, ``runtime.torch_scaling_config()``)
    on the emulator: one worker per host of exactly the admitted slice, with no chip mask (the whole
    host's chips), DDP over gloo; a lost host ends the attempt and the next one, elsewhere, restores
    the newest recorded checkpoint and ends with the same parameters on every worker."""
    torchreq.require("torch")
    client = plane.tenant(v4=16)
    package = client.upload_package(plane.package_dir)
    command = [PY, "train_torchtrainer.py", "--steps", "16", "--checkpoint-every", "4", "--step-time", "0.25"]
    job = client.submit(command, "v4-16", working_dir=package, kind="ray", max_retries=2)["id"]
    first = wait_state(client, job, "RUNNING")
    (lost,) = first["slices"]
    assert workers_on(client, job, 2) == {(lost, 0), (lost, 1)}
    said = re.findall(
        r"worker \d+ on \S+, (\w+), (\d+) ranks, TPU_VISIBLE_CHIPS=(\S+)", _driver_log(client, job, 1)
    )
    assert set(said) == {("gloo", "2", "unset")}, said  # (Ray may forward a worker's line twice)
    _checkpointed(client, job, 1, after=0)
    wait_for("a checkpoint of attempt 1 recorded", lambda: max(_recorded(client, job), default=0) > 0, 60)
    fleet.kill_host(lost, 1)
    second = wait_for("attempt 2 to run", lambda: _running(client, job, 2), 480)
    assert second["slices"] != [lost] and second["failures"] == 1
    assert _restored(client, job, 2) in _saved(client, job, 1)
    assert workers_on(client, job, 2, attempt=2) == {(second["slices"][0], 0), (second["slices"][0], 1)}
    done = wait_state(client, job, "SUCCEEDED")
    log = _driver_log(client, job, 2)
    digests = dict(re.findall(r"worker (\d+) params (\w+)", log))
    assert sorted(digests) == ["0", "1"] and len(set(digests.values())) == 1, log[-3000:]
    assert done["exit_code"] == 0 and "RESULT " in log
    fleet.restore(lost)
    wait_for("the restored slice to be free", lambda: plane.all_free([lost]), 120, 0.5)
    plane.cluster.wait_warm([lost], timeout_s=120)


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
