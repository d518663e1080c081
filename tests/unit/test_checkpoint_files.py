"""Tenants' checkpoint files through the loop, on MemoryCluster and a fake clock (SQLite and PostgreSQL):
the hosts' quota reason reaches the job, their measurements reach the store and `tpufleet tenants`,
and the retention rule removes only long-finished jobs' files, through the cluster."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_cli_control import Cli

from tpufleet.api.server import ControlPlane
from tpufleet.cli import command
from tpufleet.control.cluster.memory import FakeClock, MemoryCluster
from tpufleet.control.loop.service import Service, ServiceConfig
from tpufleet.control.store.facade import Store
from tpufleet.control.store.values import JobRequest, Limits
from tpufleet.errors import ForbiddenError, NotFoundError, SpecError

MiB = 1 << 20
DAY = 86400.0
CONFIG = ServiceConfig(stop_threads=0, progress_write_s=0, retention_check_s=0)


class World:
    def __init__(self, db_url: str, tmp_path: Path, clock: FakeClock, **config: object) -> None:
        self.clock = clock
        self.store = Store.open(db_url, clock=clock, limits=Limits(checkpoint_quota_bytes=8 * MiB))
        self.cluster = MemoryCluster.of("v4-16:2")
        self.cluster.clock = clock  # the hosts' clock
        cfg = ServiceConfig(**{**CONFIG.__dict__, **config})  # type: ignore[arg-type]
        self.service = Service(self.store, self.cluster, state_dir=tmp_path / "state", config=cfg)
        self.store.tenants.create("research", {"v4": 16})
        self.store.tenants.create("other", {"v4": 16})

    def submit(self, tenant: str = "research") -> str:
        req = JobRequest.build(command=("python", "train.py"), accelerator_type="v4-16", max_retries=0)
        return self.store.jobs.submit(tenant, req).id

    def run(self, job_id: str) -> None:
        self.service.run_once()
        self.cluster.start(job_id)
        self.service.run_once()
        assert self.store.jobs.get(job_id).state == "RUNNING"

    def finish(self, job_id: str, code: int = 0) -> None:
        self.cluster.exit(job_id, code)
        self.service.run_once()
        assert self.store.jobs.get(job_id).state in ("SUCCEEDED", "FAILED")


@pytest.fixture
def world(db_url: str, tmp_path: Path, clock: FakeClock) -> Iterator[World]:
    w = World(db_url, tmp_path, clock)
    yield w
    w.store.close()


def test_a_job_over_its_tenants_quota_fails_saying_so_and_the_usage_is_stored(world: World) -> None:
    job = world.submit()
    world.run(job)
    world.cluster.write_files(job, 3 * MiB)
    world.service.run_once()
    usage = world.store.tenants.get("research").checkpoints
    assert (usage.used_bytes, usage.measured_at, usage.quota_bytes) == (3 * MiB, world.clock(), 8 * MiB)
    assert world.store.jobs.get(job).state == "RUNNING"  # within the quota
    world.cluster.write_files(job, 6 * MiB)
    world.service.run_once()
    world.service.run_once()
    done = world.store.jobs.get(job)
    assert done.state == "FAILED"
    assert (
        done.reason is not None
        and (
            "checkpoint quota exceeded: tenant 'research' uses 9.0 MiB of its 8.0 MiB "
            "(serve --checkpoint-quota-gib); delete old checkpoints or ask the operator"
        )
        in done.reason
    )
    assert world.store.tenants.get("research").checkpoints.used_bytes == 9 * MiB
    assert world.store.tenants.get("other").checkpoints.used_bytes is None  # never measured
    assert world.cluster.launches[0].checkpoint_quota == 8 * MiB  # what the hosts check against


def test_retention_removes_only_long_finished_jobs_files_through_the_cluster(
    db_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    w = World(db_url, tmp_path, clock, checkpoint_retention_s=7 * DAY)
    try:
        old = w.submit()  # each submitted when a slice is free: admitted at once
        w.run(old)
        w.cluster.write_files(old, 2 * MiB)
        w.finish(old)
        failed = w.submit()
        w.run(failed)
        w.cluster.write_files(failed, MiB)
        w.finish(failed, code=3)
        clock.advance(6 * DAY)
        recent = w.submit()
        w.run(recent)
        w.cluster.write_files(recent, MiB)
        w.finish(recent)
        running = w.submit()
        w.run(running)
        w.cluster.write_files(running, MiB)
        clock.advance(1.5 * DAY)  # old and failed ended 7.5 days ago, recent 1.5 days ago
        w.service.run_once()
        removed = {job for _, tenant, jobs in w.cluster.removals for job in jobs if tenant == "research"}
        assert removed == {old, failed}
        assert set(w.cluster.files) == {("research", recent), ("research", running)}
        assert w.store.jobs.get(running).state == "RUNNING"
        events = [e["message"] for e in w.store.events(old) if e["kind"] == "files"]
        assert events == [
            "checkpoint files removed (2.0 MiB): finished longer ago than serve --checkpoint-retention-days"
        ]
        assert w.store.tenants.get("research").checkpoints.used_bytes == 2 * MiB  # measured after removing
        w.cluster.removals.clear()
        w.service.run_once()
        assert w.cluster.removals == []  # removed once: nothing is asked again
    finally:
        w.store.close()


def test_without_a_retention_nothing_is_removed(world: World) -> None:
    job = world.submit()
    world.run(job)
    world.cluster.write_files(job, MiB)
    world.finish(job)
    world.clock.advance(365 * DAY)
    world.service.run_once()
    assert world.cluster.removals == [] and ("research", job) in world.cluster.files


def test_the_loop_deletes_packages_no_live_job_uses_for_every_tenant(world: World) -> None:
    """Packages were deleted only at their own tenant's next upload before: one that never uploads
    again kept its unused ones for ever."""
    used = world.store.packages.put("research", _zip("train.py"))
    unused = world.store.packages.put("other", _zip("old.py"))
    req = JobRequest.build(command=("python", "train.py"), accelerator_type="v4-16", working_dir=used)
    job = world.store.jobs.submit("research", req)
    world.clock.advance(2 * 3600)
    world.service.run_once()
    world.service.run_once()  # the pass ran on the first cycle; this one collects its answer
    assert world.store.packages.get("research", used)  # a queued job names it
    with pytest.raises(NotFoundError):
        world.store.packages.get("other", unused)
    assert world.store.jobs.get(job.id).state in ("QUEUED", "ADMITTED", "STARTING")


def _zip(name: str) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr(name, b"print(1)\n")
    return out.getvalue()


@pytest.fixture
def cli(tmp_path: Path, db_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cli]:
    monkeypatch.setenv("TPUFLEET_STATE_DIR", str(tmp_path / "nowhere"))
    cluster = MemoryCluster.of("v4-16:2")
    cluster.clock = clock
    limits = Limits(checkpoint_quota_bytes=5 << 30)
    cp = ControlPlane(cluster, state_dir=tmp_path / "state", db_url=db_url, clock=clock, limits=limits,
                      config=CONFIG)  # fmt: skip
    c = Cli(cp)
    yield c
    c.http.close()
    cp.close()


def test_tpufleet_tenants_shows_the_measured_usage_of_the_quota(cli: Cli) -> None:
    token = cli.run("tenant", "create", "research", "--quota", "v4=16").strip()
    cli.run("tenant", "create", "idle", "--quota", "v4=16")
    job = json.loads(cli.run("submit", "--type", "v4-16", "--json", "--", "python", "t.py", token=token))[
        "id"
    ]
    cli.cycle()
    cluster = cli.cp.cluster
    assert isinstance(cluster, MemoryCluster)
    cluster.start(job)
    cluster.write_files(job, int(1.2 * (1 << 30)))
    cli.cycle(2)
    table = cli.run("tenants")
    row = next(line for line in table.splitlines() if "research" in line)
    assert "1.2 GiB/5.0 GiB" in row
    assert "-/5.0 GiB" in next(line for line in table.splitlines() if "idle" in line)
    shown = json.loads(cli.run("tenants", "--json"))
    assert shown[1]["checkpoints"]["used_bytes"] == int(1.2 * (1 << 30))
    assert shown[1]["checkpoints"]["quota_bytes"] == 5 << 30
    own = cli.run("tenant", "show", "research", token=token)  # a tenant reads its own
    assert "checkpoints  1.2 GiB/5.0 GiB (measured " in own
    assert isinstance(cli.fail("tenant", "show", "idle", token=token), ForbiddenError)  # not another's


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--checkpoint-quota-gib", "0"),
        ("--checkpoint-quota-gib", "-1"),
        ("--checkpoint-retention-days", "nan"),
    ],
)
def test_serve_refuses_a_quota_or_retention_that_is_not_above_zero(flag: str, value: str) -> None:
    result = CliRunner().invoke(command(), ["serve", "--sandbox", "v4-16:1", flag, value])
    assert isinstance(result.exception, SpecError) and result.exception.exit_code == 2
    assert str(result.exception) == f"{flag}: must be a number > 0, got {value}"
