"""`tpufleet cost`, and goodput in `tpufleet job`/`jobs`, against a whole control plane in-process
(MemoryCluster, a fake clock), on SQLite and PostgreSQL; plus `/metrics` with the loop's histogram."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_cli_control import Cli

from tpufleet.api.server import ControlPlane
from tpufleet.cli.cost import money
from tpufleet.control.cluster.memory import FakeClock, MemoryCluster
from tpufleet.control.loop.service import ServiceConfig


@pytest.fixture
def cli(
    tmp_path: Path, db_url: str, ids: Callable[[], str], clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cli]:
    monkeypatch.setenv("TPUFLEET_STATE_DIR", str(tmp_path / "nowhere"))
    cp = ControlPlane(
        MemoryCluster.of("v4-16:2,v6e-16"),
        state_dir=tmp_path / "state",
        db_url=db_url,
        new_id=ids,
        clock=clock,
        config=ServiceConfig(stop_threads=0, progress_write_s=0),
    )
    c = Cli(cp)
    yield c
    c.http.close()
    cp.close()


def run_job(cli: Cli, clock: FakeClock, token: str) -> str:
    """A v4-16 job (8 chips) held 100 s: 20 s start-up, 70 s of steps, 10 s to exit."""
    job_id = cli.run("submit", "--type", "v4-16", "--", "python", "t.py", token=token).strip()
    fake: MemoryCluster = cli.cp.cluster  # type: ignore[assignment]
    cli.cycle()
    fake.start(job_id)
    cli.cycle()
    fake.report_step(job_id, 1, clock.advance(20))
    cli.cycle()
    fake.report_step(job_id, 71, clock.advance(70))
    cli.cycle()
    fake.exit(job_id, 0)
    clock.advance(10)
    cli.cycle(2)
    return job_id


def test_cost_per_tenant_and_job_with_badput(cli: Cli, clock: FakeClock) -> None:
    token = json.loads(cli.run("tenant", "create", "team-a", "--quota", "v4=16", "--json"))["token"]
    job_id = run_job(cli, clock, token)
    got = json.loads(cli.run("cost", "--json"))
    (tenant,) = got["tenants"]
    chip_h = 100 * 8 / 3600
    assert tenant["tenant"] == "team-a" and tenant["chip_hours"] == pytest.approx(chip_h, abs=1e-6)
    assert tenant["dollars"] == pytest.approx(chip_h * 3.22)
    assert tenant["badput_dollars"] == pytest.approx(30 * 8 / 3600 * 3.22)
    (job,) = got["jobs"]
    assert job["job_id"] == job_id and job["goodput"] == pytest.approx(0.7)
    text = cli.run("cost")
    assert "team-a" in text and money(tenant["dollars"]) in text and "70%" in text
    assert json.loads(cli.run("cost", "--json", token=token))["tenants"][0]["tenant"] == "team-a"
    shown = cli.run("job", job_id)
    assert "70% of 100 s held: startup 20 s, wasted 0 s, idle 10 s" in shown
    assert " 70%" in cli.run("jobs")


def test_cost_since_and_bad_durations(cli: Cli, clock: FakeClock) -> None:
    token = json.loads(cli.run("tenant", "create", "team-a", "--quota", "v4=16", "--json"))["token"]
    run_job(cli, clock, token)
    clock.advance(3600)
    assert json.loads(cli.run("cost", "--since", "30m", "--json"))["tenants"] == []
    assert json.loads(cli.run("cost", "--since", "2h", "--json"))["tenants"][0]["jobs"] == 1
    err = cli.fail("cost", "--since", "a while")
    assert "--since" in str(err) and "7d" in str(err)


def test_a_tenants_badput_says_when_part_of_it_is_unknown() -> None:
    from tpufleet.cli.cost import _badput

    assert _badput({"badput_dollars": 1.5, "unreported_jobs": 0}) == "$1.50"
    assert _badput({"badput_dollars": 1.5, "unreported_jobs": 2}) == "$1.50 + unknown"
    assert _badput({"badput_dollars": None, "unreported_jobs": 1}) == "unknown"


def test_money_is_unknown_never_zero() -> None:
    assert money(None) == "unknown"
    assert money(0.0) == "$0.00"
    assert money(12.345, unpriced_hours=1.0) == "$12.35 + unknown"


def test_the_control_planes_metrics_include_the_loops_cycle_histogram(cli: Cli, clock: FakeClock) -> None:
    cli.cycle(3)
    resp = cli.http.get("/metrics", headers={"Authorization": f"Bearer {cli.cp.admin_token}"})
    assert resp.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(resp.text)}
    counts = [
        s.value for s in families["tpufleet_scheduling_cycle_seconds"].samples if s.name.endswith("_count")
    ]
    assert counts == [3]
    assert {"tpufleet_jobs", "tpufleet_slices", "tpufleet_chip_seconds", "tpufleet_job_goodput_ratio"} <= set(
        families
    )


def test_serve_refuses_a_bad_prices_file_before_starting(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from tpufleet.cli import command
    from tpufleet.errors import SpecError

    bad = tmp_path / "prices.yaml"
    bad.write_text("pricing:\n  v4: {on_demand: -3}\n")
    spec = tmp_path / "fleet.yaml"  # --fleet's pricing: section is read the same way
    spec.write_text(Path("examples/fleet.yaml").read_text() + "pricing:\n  v4: {spot: nope}\n")
    state = tmp_path / "state"
    for flag, path, field in (
        ("--pricing", bad, "pricing.v4.on_demand"),
        ("--fleet", spec, "pricing.v4.spot"),
    ):
        result = CliRunner().invoke(
            command(), ["serve", "--sandbox", "v4-16:1", flag, str(path), "--state-dir", str(state)]
        )
        assert isinstance(result.exception, SpecError) and field in str(result.exception), result.output
    assert not (state / "tpufleet.db").exists()  # nothing started
