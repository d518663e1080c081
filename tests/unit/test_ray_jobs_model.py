"""Ray jobs (kind ``ray``, docs/ray-jobs.md) without Ray: validation, the API, the store, the loop
over the in-memory cluster, the driver's variables and ``tpufleet.runtime``'s slice helpers, the
catalog's vCPUs and the emulator's CPU cap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tpufleet import catalog, contract, runtime
from tpufleet.api.app import create_app
from tpufleet.control.cluster.memory import MemoryCluster
from tpufleet.control.loop.service import Service, ServiceConfig
from tpufleet.control.store.facade import Store
from tpufleet.control.store.values import DEFAULT_LIMITS, JobRequest, Limits
from tpufleet.emulator import plan
from tpufleet.errors import SpecError

RAY = Limits(ray_jobs=True)


def test_a_job_is_spmd_unless_it_says_ray() -> None:
    assert JobRequest.build(command=["python", "t.py"], accelerator_type="v4-16").kind == "spmd"
    ray = JobRequest.build(command=["python", "t.py"], accelerator_type="v4-16", kind="ray", limits=RAY)
    assert ray.kind == "ray"


@pytest.mark.parametrize(
    ("kind", "limits", "says"),
    [
        ("mpi", RAY, "'mpi' is not a job kind; use spmd or ray"),
        ("ray", DEFAULT_LIMITS, "serve --allow-ray-jobs"),
    ],
)
def test_a_bad_or_disabled_kind_is_one_line(kind: str, limits: Limits, says: str) -> None:
    with pytest.raises(SpecError) as err:
        JobRequest.build(command=["python", "t.py"], accelerator_type="v4-16", kind=kind, limits=limits)
    assert err.value.field == "kind" and says in str(err.value) and "\n" not in str(err.value)


def test_the_api_takes_kind_ray_only_where_the_operator_allows_it(store: Store) -> None:
    for limits, status in ((RAY, 201), (DEFAULT_LIMITS, 400)):
        http = TestClient(create_app(store, limits=limits))
        admin = store.tokens.issue()
        name = f"t{status}"
        made = http.post("/api/v1/tenants", json={"name": name}, headers={"Authorization": f"Bearer {admin}"})
        token = made.json()["token"]
        body = {"command": ["python", "t.py"], "accelerator_type": "v4-16", "kind": "ray"}
        resp = http.post("/api/v1/jobs", json=body, headers={"Authorization": f"Bearer {token}"})
        assert resp.status_code == status, resp.text
        if status == 201:
            job = resp.json()
            assert job["kind"] == "ray"
            got = http.get(f"/api/v1/jobs/{job['id']}", headers={"Authorization": f"Bearer {token}"})
            assert got.json()["kind"] == "ray"
        else:
            assert "--allow-ray-jobs" in resp.json()["error"]
        http.close()


def test_the_store_keeps_the_kind_through_batch_and_single_submits(store: Store) -> None:
    store.tenants.create("a", {"v4": 8})
    one = store.jobs.submit(
        "a", JobRequest.build(command=["x"], accelerator_type="v4-16", kind="ray", limits=RAY)
    )
    many = store.jobs.submit_many(
        "a",
        [
            JobRequest.build(command=["x"], accelerator_type="v4-16", kind="ray", limits=RAY),
            JobRequest.build(command=["x"], accelerator_type="v4-16"),
        ],
    )
    assert [store.jobs.get(j).kind for j in (one.id, *many)] == ["ray", "ray", "spmd"]


def _service(store: Store, tmp_path: Path, fleet: str = "v4-16:2") -> tuple[Service, MemoryCluster]:
    cluster = MemoryCluster.of(fleet)
    config = ServiceConfig(stop_threads=0, preempt_grace_s=30, cancel_grace_s=10, fail_grace_s=5)
    return Service(store, cluster, state_dir=tmp_path / "state", config=config), cluster


def test_a_ray_job_runs_once_as_a_driver_of_its_admitted_slices(store: Store, tmp_path: Path) -> None:
    service, cluster = _service(store, tmp_path)
    store.tenants.create("a", {"v4": 8})
    req = JobRequest.build(command=["python", "train.py"], accelerator_type="v4-16", kind="ray", limits=RAY)
    job_id = store.jobs.submit("a", req).id
    service.run_once()
    (spec,) = cluster.launches
    assert spec.kind == "ray" and spec.slices == ("tpu-v4-16-0",)
    procs = cluster.processes(job_id)
    driver = procs[0].env
    assert driver["TPUFLEET_JOB_KIND"] == "ray" and driver["TPUFLEET_SLICES"] == "tpu-v4-16-0"
    assert (driver["TPUFLEET_TOPOLOGY"], driver["TPUFLEET_RAY_ACCELERATOR_TYPE"]) == ("2x2x2", "TPU-V4")
    assert "TPU_NAME" not in driver  # the driver runs on the Ray head, not on a TPU host
    cluster.start(job_id)
    cluster.write(job_id, "epoch 1 loss 0.5\n")
    service.run_once()
    job = store.jobs.get(job_id)
    assert job.state == "RUNNING" and job.slices == ("tpu-v4-16-0",)
    assert any("placement groups are on tpu-v4-16-0" in e["message"] for e in store.events(job_id))
    cluster.exit(job_id, 0)
    service.run_once()
    assert store.jobs.get(job_id).state == "SUCCEEDED"
    hosts = store.jobs.read_logs(job_id).hosts
    assert [h.data for h in hosts] == ["epoch 1 loss 0.5\n", ""]  # the driver's output is host 0's


def test_quota_borrowing_preemption_and_priority_apply_to_ray_jobs(store: Store, tmp_path: Path) -> None:
    service, cluster = _service(store, tmp_path)
    store.tenants.create("a", {"v4": 8})  # one v4-16 slice (8 chips)
    store.tenants.create("b", {"v4": 8})
    ray = JobRequest.build(command=["python", "t.py"], accelerator_type="v4-16", kind="ray", limits=RAY)
    first, borrower = store.jobs.submit("a", ray).id, store.jobs.submit("a", ray).id
    service.run_once()
    assert [store.jobs.get(j).state for j in (first, borrower)] == ["STARTING", "STARTING"]
    assert [store.jobs.get(j).borrowing for j in (first, borrower)] == [False, True]
    low = store.jobs.submit("b", JobRequest.build(command=["x"], accelerator_type="v4-16", priority=0)).id
    high = store.jobs.submit("b", JobRequest.build(command=["x"], accelerator_type="v4-16", priority=5)).id
    service.run_once()  # b is owed its quota: a's borrowing Ray job is preempted (and requeued)
    assert (borrower, 1, 30) in cluster.stops
    assert store.jobs.get(borrower).state == "QUEUED" and store.jobs.get(borrower).attempt == 2
    service.run_once()
    assert store.jobs.get(high).state == "STARTING" and store.jobs.get(low).state == "QUEUED"


def test_admitted_slices_and_run_config_come_from_the_driver_env() -> None:
    st = catalog.slice_type("v4-16")
    env = contract.ray_driver_env("j1", 2, "/ckpt/a/j1", [("tpu-v4-16-0", st), ("tpu-v4-16-1", st)])
    got = runtime.admitted_slices(env)
    assert got.names == ("tpu-v4-16-0", "tpu-v4-16-1") and got.num_workers == 4
    assert (got.topology, got.ray_accelerator_type, got.accelerator_type) == ("2x2x2", "TPU-V4", "v4-16")
    with pytest.raises(ValueError, match="not a tpufleet Ray job"):
        runtime.admitted_slices({"TPUFLEET_JOB_KIND": "spmd"})


@pytest.mark.parametrize(
    ("accelerator_type", "vcpus"),
    [("v4-16", 240), ("v5p-8", 208), ("v5litepod-1", 24), ("v5litepod-8", 224), ("v6e-4", 180)],
)
def test_the_catalog_knows_each_host_machines_vcpus(accelerator_type: str, vcpus: int) -> None:
    assert catalog.slice_type(accelerator_type).vcpus_per_host == vcpus


@pytest.mark.parametrize(("cap", "expected"), [(1, 1), (2, 2), (239, 239), (1000, 240)])
def test_an_emulated_host_offers_its_vcpus_up_to_the_cap(cap: int, expected: int) -> None:
    st = catalog.slice_type("v4-16")
    argv = plan.host_argv("ray", "127.0.0.1", "127.0.0.1:1", st, cap, "/tmp/x", 1 << 28, False)
    assert argv[argv.index("--num-cpus") + 1] == str(expected) == str(plan.host_cpus(st, cap))


def test_cli_submit_ray_queues_a_ray_job_where_the_server_allows_it(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from tpufleet.api.server import ControlPlane
    from tpufleet.cli import command
    from tpufleet.errors import SpecError

    monkeypatch.setenv("TPUFLEET_STATE_DIR", str(tmp_path / "nowhere"))
    for limits, ok in ((RAY, True), (DEFAULT_LIMITS, False)):
        cp = ControlPlane(
            MemoryCluster.of("v4-16:1"),
            state_dir=tmp_path / f"state-{ok}",
            db_url=db_url if ok else None,
            config=ServiceConfig(stop_threads=0),
            limits=limits,
        )
        http = TestClient(cp.app)
        args = ["submit", "--ray", "--type", "v4-16", "--tenant", "a", "--json"]
        auth = ["--token", cp.admin_token, "--server", "http://testserver"]
        cp.store.tenants.create("a", {"v4": 8})
        result = CliRunner().invoke(command(), [*args, *auth, "--", "python", "train.py"], obj=http)
        if ok:
            assert result.exit_code == 0, result.output
            assert cp.store.jobs.get(json.loads(result.stdout)["id"]).kind == "ray"
        else:
            assert isinstance(result.exception, SpecError) and "--allow-ray-jobs" in str(result.exception)
        http.close()
        cp.close()
