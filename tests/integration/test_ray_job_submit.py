"""Ray's own ``ray job`` CLI (the pinned Ray's, run as a user types it) against a control plane
serving Ray jobs on the shared emulated fleet: issue 33's proof that two tenants' ``ray job
submit``s run, through tpufleet's queue, each on its own admitted ``v4-16`` slice
(docs/ray-jobs.md, "The ``ray job submit`` way").

tests/host/test_ray_job_cli.py runs the same CLI against ``serve --sandbox`` (which executes
nothing) for the API's every route and refusal; here the drivers really run. Kept cheap: the
entrypoint is a few lines of plain Ray (no Ray Train, no JAX) that does what Ray's docs show for a
TPU slice, ``ray.util.tpu.run_on_slice``: one task on every host of a slice it reserves by the
slice's head resource (which tpufleet steers onto the admitted slice, as for Ray Train), each task
answering the ``TPU_NAME``/``TPU_WORKER_ID`` its host has; the driver prints them. Each start of
Ray's CLI costs about 2 s of CPU, so the CLI runs five times in all.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import planes
import pytest
import raycli
from _executor_helpers import wait_for

from tpufleet.client.http import Client
from tpufleet.control.loop.service import ServiceConfig
from tpufleet.control.ray.client import RayExecutor
from tpufleet.control.store.values import Limits

pytestmark = pytest.mark.integration

# a cycle every 0.5 s (serve's default): each polls Ray, and these jobs last seconds
CONFIG = ServiceConfig(interval_s=0.5, cancel_grace_s=1.0, fail_grace_s=1.0, start_timeout_s=300.0)
# The user's script: plain Ray, as Ray documents running a function on every host of a TPU slice.
PROBE = """\
import os

import ray
from ray.util.tpu import run_on_slice


@ray.remote
def where():
    return os.environ["TPU_NAME"], os.environ["TPU_WORKER_ID"]


ray.init()
for name, worker in sorted(ray.get(run_on_slice(where, topology="2x2x2", accelerator_version="v4"))):
    print(f"on {name}/{worker}", flush=True)
"""
ON = re.compile(r"^on ([\w-]+)/(\d+)$", re.M)


@pytest.fixture(scope="module")
def plane(
    ray_client: object, fleet: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[planes.Served]:
    cluster = RayExecutor.connect(fleet.ray_address)
    v4 = [s.name for s in cluster.inventory() if s.intact and s.accelerator_type == "v4-16"]
    state_dir = tmp_path_factory.mktemp("control-plane")
    with planes.served(
        cluster, state_dir, warm=v4, cancel_timeout_s=120, config=CONFIG, limits=Limits(ray_jobs=True)
    ) as p:
        yield p


def ray_job(
    plane: planes.Served, tenant: Client, *args: str, cwd: Path | None = None, wait: bool = True
) -> Any:
    """``ray job ARGS`` as docs/ray-jobs.md has a user type it: the address and the tenant's token
    in ``RAY_API_SERVER_ADDRESS`` and ``RAY_JOB_HEADERS``. Run to its end, or only started."""
    env = {"RAY_API_SERVER_ADDRESS": f"{plane.url}/ray"} | raycli.bearer(tenant.token)
    return raycli.ray_job(list(args), env, cwd=cwd, wait=wait, merge=True)


def _free(plane: planes.Served, names: list[str]) -> bool:
    return all(s["state"] == "FREE" for s in plane.admin.slices() if s["name"] in names)


@pytest.mark.timeout(600)
def test_two_tenants_ray_job_submits_each_run_on_their_own_admitted_slice(
    plane: planes.Served, tmp_path: Path
) -> None:
    """Two tenants (a v4-16's chips of quota each) submit at once with ``ray job submit
    --working-dir . --entrypoint-resources '{"TPU-v4-16-head": 1}'``, following the logs to the
    end: each driver's tasks ran on both hosts of the one slice tpufleet admitted that tenant's job
    on (from their own TPU_NAME/TPU_WORKER_ID), the two slices differ, both jobs ended SUCCEEDED,
    ``ray job status``/``logs``/``list`` answer a tenant for its own submissions only, and the
    slices are free again."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "probe.py").write_text(PROBE)
    tenants = [plane.tenant_client("rayjob", v4=8)[1] for _ in range(2)]
    ids = ["probe-a", "probe-b"]
    # `-- python probe.py` as a user types it, with this venv's Python: the emulated head's PATH
    # may find another one first
    submit = ("submit", "--working-dir", ".", "--entrypoint-resources", '{"TPU-v4-16-head": 1}')
    run = ("--", sys.executable, "probe.py")
    submits = [
        ray_job(plane, t, *submit, "--submission-id", sid, *run, cwd=code, wait=False)
        for t, sid in zip(tenants, ids, strict=True)
    ]
    try:
        outs = [p.communicate(timeout=300)[0] for p in submits]
    finally:
        for p in submits:  # the test failed first: end the CLIs it started
            if p.poll() is None:
                p.kill()
                p.communicate()

    admitted = []
    for tenant, sid, proc, out in zip(tenants, ids, submits, outs, strict=True):
        assert proc.returncode == 0 and f"Job '{sid}' succeeded" in out, out
        [job] = [j for j in tenant.jobs() if j["name"] == sid]
        job = tenant.job(job["id"])
        assert (job["kind"], job["state"], job["exit_code"]) == ("ray", "SUCCEEDED", 0), job
        [slice_name] = job["slices"]
        # the driver's log, followed by the CLI: a task on every host of exactly the admitted slice
        assert set(ON.findall(out)) == {(slice_name, "0"), (slice_name, "1")}, out
        admitted.append(slice_name)
    assert sorted(admitted) == ["tpu-v4-16-0", "tpu-v4-16-1"]

    # the first tenant's view: its own job's log and list; the other's job "does not exist"
    a = tenants[0]
    logs = ray_job(plane, a, "logs", "probe-a")
    assert logs.returncode == 0 and set(ON.findall(logs.stdout)) == set(ON.findall(outs[0])), logs.stdout
    listed = ray_job(plane, a, "list")
    assert listed.returncode == 0 and "'probe-a'" in listed.stdout, listed.stdout
    assert "probe-b" not in listed.stdout, listed.stdout
    other = ray_job(plane, a, "status", "probe-b")
    assert other.returncode != 0 and "does not exist" in other.stdout, other.stdout
    wait_for("the slices to be free", lambda: _free(plane, admitted), 60, every_s=0.5)
