"""PyTorch jobs through the whole control plane on the shared emulated fleet (``tpufleet submit``, the
API a user has): PyTorch/XLA on an emulated single-host slice, the guides' single-host check as the
guide prints it (read from ``../shared/guides/pytorch``), and data-parallel training (DDP over
``tpufleet.runtime.initialize_torch``) over both hosts of a v4-16 and over two v4-16 slices, which
checkpoints and resumes after a host is killed (``examples/``; docs/pytorch.md)."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import planes
import pytest
import torchreq
from _executor_helpers import wait_for
from planes import wait_state

from tpufleet.client.http import Client
from tpufleet.control.loop.service import ServiceConfig
from tpufleet.control.ray.client import RayExecutor

pytestmark = pytest.mark.integration
torchreq.require("torch_xla")  # the jobs import it on the hosts, from the same virtualenv

PY = sys.executable
ROOT = Path(__file__).parents[2]
GUIDES = ROOT.parent / "shared" / "guides" / "pytorch"
CONFIG = ServiceConfig(interval_s=0.5, fail_grace_s=1.0, cancel_grace_s=1.0, start_timeout_s=60.0)
NOTE = "PyTorch/XLA runs on this emulated host's CPU (PJRT_DEVICE=CPU)"
STEPS = 20


@pytest.fixture(scope="module")
def plane(
    ray_client: object, fleet: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[planes.Served]:
    cluster = RayExecutor.connect(fleet.ray_address)
    warm = [s.name for s in cluster.inventory() if s.intact]
    with planes.served(cluster, tmp_path_factory.mktemp("torch-plane"), warm=warm, config=CONFIG) as p:
        yield p


@pytest.fixture(autouse=True)
def _no_job_left_behind(plane: planes.Served) -> Iterator[None]:
    yield
    plane.cancel_all()


def _package(client: Client, tmp_path: Path, *files: Path) -> str:
    code = tmp_path / "code"
    code.mkdir()
    for f in files:
        shutil.copy(f, code / f.name)
    return client.upload_package(code)


def _summaries(client: Client, job_id: str, attempt: int | None = None) -> list[dict[str, Any]]:
    """The JSON summary each host printed last, in (slice, worker) order."""
    hosts = client.logs(job_id, attempt=attempt)["hosts"]
    return [json.loads([x for x in h["data"].splitlines() if x.startswith("{")][-1]) for h in hosts]


def _program(
    plane: planes.Served, tmp_path: Path, program: Path, accelerator_type: str, **quota: int
) -> tuple[Client, dict[str, Any], list[dict[str, Any]]]:
    """``python <program>`` (uploaded as a new tenant's package) once it SUCCEEDED, and its hosts' logs."""
    _, client = plane.tenant_client(**quota)
    package = _package(client, tmp_path, program)
    job = client.submit([PY, program.name], accelerator_type, working_dir=package)
    done = wait_state(client, job["id"], "SUCCEEDED", timeout_s=180)
    return client, done, client.logs(done["id"])["hosts"]


def _ddp(client: Client, package: str, num_slices: int, *extra: str, **submit: Any) -> dict[str, Any]:
    command = [PY, "train_torch_ddp.py", "--steps", str(STEPS), *extra]
    return client.submit(command, "v4-16", num_slices=num_slices, working_dir=package, **submit)


# -- one host: PyTorch/XLA as on a TPU VM ---------------------------------------------------------
def test_a_single_host_pytorch_xla_loop_runs_unchanged_and_the_log_says_it_is_on_cpu(
    plane: planes.Served, tmp_path: Path
) -> None:
    client, done, (host,) = _program(
        plane, tmp_path, ROOT / "examples" / "torch_xla_single_host.py", "v6e-4", v6e=4
    )
    assert NOTE in host["data"] and "does not synchronise" not in host["data"]
    (summary,) = _summaries(client, done["id"])
    assert summary["device"] == "xla:0" and summary["steps"] == 40
    assert summary["last"] < summary["first"] / 2, summary  # it learnt


def test_the_guides_single_host_check_runs_as_the_guide_prints_it(
    plane: planes.Served, tmp_path: Path
) -> None:
    _, _, (host,) = _program(plane, tmp_path, GUIDES / "single_host_check.py", "v6e-4", v6e=4)
    assert "TPU设备: xla:0" in host["data"] and "TPU计算结果: tensor(" in host["data"], host["data"]
    assert NOTE in host["data"]


# -- several hosts: DDP over torch.distributed ----------------------------------------------------
def _synchronised(client: Client, job_id: str, world: int) -> list[dict[str, Any]]:
    """Every rank's summary, once each shows it trained ``STEPS`` steps from scratch in a world of
    ``world`` and ended with the same parameters as every other rank, although each trained on its
    own data from its own start: the unsynchronised copies, trained on the same data, all differ."""
    ranks = _summaries(client, job_id)
    assert sorted(r["rank"] for r in ranks) == list(range(world))
    assert {(r["world"], r["step"], r["resumed_from"]) for r in ranks} == {(world, STEPS, 0)}
    assert len({r["params"] for r in ranks}) == 1, ranks
    assert len({r["alone"] for r in ranks}) == world, ranks
    return ranks


def test_ddp_over_every_host_of_two_slices_keeps_the_replicas_identical(
    plane: planes.Served, tmp_path: Path
) -> None:
    """(Over the two hosts of one slice: the uninterrupted run of the next test.)"""
    _, client = plane.tenant_client(v4=16)
    package = _package(client, tmp_path, ROOT / "examples" / "train_torch_ddp.py")
    done = wait_state(client, _ddp(client, package, 2)["id"], "SUCCEEDED", timeout_s=180)
    assert len(done["slices"]) == 2
    _synchronised(client, done["id"], 4)


def test_ddp_resumes_from_its_checkpoint_after_a_host_is_killed(
    plane: planes.Served, fleet: Any, tmp_path: Path
) -> None:
    _, client = plane.tenant_client(v4=16)
    package = _package(client, tmp_path, ROOT / "examples" / "train_torch_ddp.py")
    uninterrupted = wait_state(client, _ddp(client, package, 1)["id"], "SUCCEEDED", timeout_s=180)
    expected = {r["params"] for r in _synchronised(client, uninterrupted["id"], 2)}

    job = _ddp(client, package, 1, "--step-seconds", "0.3", max_retries=2)
    running = wait_state(client, job["id"], "RUNNING", timeout_s=120)
    (victim,) = running["slices"]

    def saved() -> bool:
        hosts = client.logs(job["id"], attempt=1)["hosts"]
        return any("saved step 10" in h["data"] for h in hosts)

    wait_for("a checkpoint of step 10", saved, 120, every_s=0.5)
    fleet.kill_host(victim, 1)
    done = wait_state(client, job["id"], "SUCCEEDED", timeout_s=240)
    first, second = done["attempts"]
    assert (first["state"], second["state"], done["attempt"]) == ("FAILED", "SUCCEEDED", 2), done
    assert second["slices"] != [victim]
    ranks = _summaries(client, done["id"])
    resumed = {r["resumed_from"] for r in ranks}
    assert len(resumed) == 1 and 10 <= resumed.pop() < STEPS, ranks
    # Nothing lost: the resumed run ends with exactly the parameters of the run that was never stopped.
    assert {r["params"] for r in ranks} == expected, (ranks, expected)
    fleet.restore(victim)
    wait_for("the restored slice to be free", lambda: plane.all_free([victim]), 120, every_s=0.5)
    plane.cluster.wait_warm([victim], timeout_s=120)


def test_a_pytorch_xla_loop_on_several_hosts_warns_that_it_does_not_synchronise(
    plane: planes.Served, tmp_path: Path
) -> None:
    *_, hosts = _program(plane, tmp_path, ROOT / "examples" / "torch_xla_single_host.py", "v4-16", v4=8)
    assert len(hosts) == 2
    for host in hosts:
        (warning,) = [x for x in host["data"].splitlines() if "does not synchronise" in x]
        assert "xm.optimizer_step" in warning and "2 processes" in warning and "initialize_torch()" in warning
