"""Step progress through the in-memory cluster and the loop, goodput on job views, the cost report
and ``GET /metrics`` parsed with prometheus_client's own parser, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from requeues import Ends

from tpufleet import pricing
from tpufleet.api.app import create_app
from tpufleet.control.cluster.memory import FakeClock, MemoryCluster
from tpufleet.control.loop.service import Service, ServiceConfig
from tpufleet.control.store.facade import Store
from tpufleet.control.store.values import JobRequest

CONFIG = ServiceConfig(stop_threads=0, fail_grace_s=0, progress_write_s=0)
V4_16_CHIPS = 8


class Fleet:
    """A store, a fake fleet of two v4-16 and a v6e-16, the loop and the API in-process."""

    def __init__(self, store: Store, clock: FakeClock, state_dir: Path) -> None:
        self.store, self.clock, self.state_dir = store, clock, state_dir
        self.cluster = MemoryCluster.of("v4-16:2,v6e-16")
        self.service = Service(store, self.cluster, state_dir=state_dir, config=CONFIG)
        self.http = TestClient(create_app(store), raise_server_exceptions=True)
        self.admin = store.tokens.issue()

    def restart_api(self) -> None:
        """A new app (a restarted control plane's API and collectors) on the same store."""
        self.http.close()
        self.http = TestClient(create_app(self.store), raise_server_exceptions=True)

    def submit(self, tenant: str, accelerator_type: str = "v4-16", **kw: object) -> str:
        request = JobRequest.build(command=("python", "t.py"), accelerator_type=accelerator_type, **kw)  # type: ignore[arg-type]
        return self.store.jobs.submit(tenant, request).id

    def cycle(self, seconds: float = 0.0) -> None:
        self.clock.advance(seconds)
        self.service.run_once()

    def get(self, path: str, token: str | None = None) -> dict:  # type: ignore[type-arg]
        resp = self.http.get(path, headers={"Authorization": f"Bearer {token or self.admin}"})
        assert resp.status_code == 200, resp.text
        return resp.json()  # type: ignore[no-any-return]

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        resp = self.http.get("/metrics", headers={"Authorization": f"Bearer {self.admin}"})
        assert resp.status_code == 200, resp.text
        assert resp.headers["content-type"].startswith("text/plain")
        out = {}
        for family in text_string_to_metric_families(resp.text):
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out


@pytest.fixture
def fleet(store: Store, clock: FakeClock, tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(store, clock, tmp_path / "state")
    yield f
    f.http.close()


def lab(**labels: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def run_with_steps(f: Fleet, job_id: str) -> float:
    """Admit (t=0), start; steps 1..50 from t=10 to t=59; exit 0 at t=65. Returns the admission time."""
    admitted = f.clock.now
    f.cycle()
    f.cluster.start(job_id)
    f.cycle(5)
    f.cluster.report_step(job_id, 1, f.clock.advance(5))  # t = 10
    f.cycle()
    f.cluster.report_step(job_id, 50, f.clock.advance(49))  # t = 59
    f.cycle()
    f.cluster.exit(job_id, 0)
    f.cycle(6)  # t = 65: every host exited 0
    f.cycle()
    return admitted


def test_reported_steps_reach_the_store_and_the_job_view(fleet: Fleet) -> None:
    fleet.store.tenants.create("team-a", {"v4": 16})
    job_id = fleet.submit("team-a")
    admitted = run_with_steps(fleet, job_id)
    job = fleet.store.jobs.get(job_id)
    assert job.state == "SUCCEEDED"
    (a,) = job.attempts
    assert (a.first_step, a.last_step) == (1, 50)
    assert (a.first_step_at, a.last_step_at) == (admitted + 10, admitted + 59)
    got = fleet.get(f"/api/v1/jobs/{job_id}")["goodput"]
    assert got["held_s"] == pytest.approx(65) and got["productive_s"] == pytest.approx(49)
    assert got["startup_s"] == pytest.approx(10) and got["idle_s"] == pytest.approx(6)
    assert got["ratio"] == pytest.approx(49 / 65, abs=1e-4)
    listed = fleet.get("/api/v1/jobs")["items"]
    assert listed[0]["goodput"]["ratio"] == got["ratio"]


def test_a_job_that_reports_nothing_has_an_unknown_goodput(fleet: Fleet) -> None:
    fleet.store.tenants.create("team-a", {"v4": 16})
    job_id = fleet.submit("team-a")
    fleet.cycle()
    fleet.cluster.start(job_id)
    fleet.cycle(30)
    got = fleet.get(f"/api/v1/jobs/{job_id}")["goodput"]
    assert got["ratio"] is None and got["held_s"] == pytest.approx(30) and got["reported"] is False


def test_a_restart_that_redoes_steps_counts_them_as_wasted(fleet: Fleet) -> None:
    fleet.store.tenants.create("team-a", {"v4": 16})
    job_id = fleet.submit("team-a", max_retries=2)
    fleet.cycle()
    fleet.cluster.start(job_id)
    fleet.cycle()
    fleet.cluster.report_step(job_id, 1, fleet.clock.advance(10))
    fleet.cycle()
    fleet.cluster.report_step(job_id, 41, fleet.clock.advance(40))  # 1 step/s
    fleet.cycle()
    ends = Ends.on(fleet.service, fleet.store)
    v4 = [x.name for x in fleet.store.slices.all() if x.accelerator_type == "v4-16"]
    for name in v4:  # no v4-16 takes a new job for the next 5 s
        fleet.store.slices.set_draining(name, True)
    fleet.cluster.exit(job_id, 1)  # a host fails: attempt 2 resumes from the checkpoint at step 20
    fleet.cycle()
    assert (ends.at_end(job_id).attempt, fleet.store.jobs.get(job_id).state) == (2, "QUEUED")
    for name in v4:
        fleet.store.slices.set_draining(name, False)
    fleet.cycle(5)  # admitted again 5 s later
    fleet.cluster.start(job_id)
    fleet.cycle()
    fleet.cluster.report_step(job_id, 21, fleet.clock.advance(3))
    fleet.cycle()
    got = fleet.get(f"/api/v1/jobs/{job_id}")["goodput"]
    assert got["wasted_s"] == pytest.approx(21)  # steps 21..41 of attempt 1 (t = 30..51 of it)
    assert got["recovery_s"] == pytest.approx(5)


def test_metrics_parse_and_count_jobs_slices_chips_cost_and_goodput(fleet: Fleet) -> None:
    fleet.store.tenants.create("team-a", {"v4": 16})
    fleet.store.tenants.create("team-b", {"v6e": 16})
    done = fleet.submit("team-a")
    run_with_steps(fleet, done)  # 65 s on one v4-16 (8 chips)
    running = fleet.submit("team-a", num_slices=2)
    fleet.submit("team-b", accelerator_type="v6e-16", num_slices=2)  # cannot fit: one v6e-16
    fleet.cycle()
    fleet.cluster.start(running)
    fleet.cycle(10)
    fleet.cluster.report_step(running, 1, fleet.clock.now)
    fleet.cycle(20)  # the running job has held 2 x 8 chips for 30 s, reported step 1 at 10 s
    m = fleet.metrics()
    assert m[("tpufleet_jobs", lab(tenant="team-a", state="SUCCEEDED"))] == 1
    assert m[("tpufleet_jobs", lab(tenant="team-a", state="RUNNING"))] == 1
    assert m[("tpufleet_jobs", lab(tenant="team-b", state="QUEUED"))] == 1
    assert m[("tpufleet_slices", lab(accelerator_type="v4-16", state="HELD"))] == 2
    assert m[("tpufleet_slices", lab(accelerator_type="v6e-16", state="FREE"))] == 1
    assert m[("tpufleet_tenant_chips_held", lab(tenant="team-a", generation="v4"))] == 16
    assert m[("tpufleet_tenant_chips_held", lab(tenant="team-b", generation="v6e"))] == 0
    assert m[("tpufleet_tenant_chips_quota", lab(tenant="team-b", generation="v6e"))] == 16
    assert m[("tpufleet_attempts_ended_total", lab(tenant="team-a", reason="succeeded"))] == 1
    chip_s = 65 * V4_16_CHIPS + 30 * 2 * V4_16_CHIPS
    key = lab(tenant="team-a", generation="v4", pricing="on_demand")
    assert m[("tpufleet_chip_seconds_total", key)] == pytest.approx(chip_s)
    assert m[("tpufleet_cost_dollars_total", key)] == pytest.approx(chip_s / 3600 * 3.22)
    assert m[("tpufleet_admission_wait_seconds_count", lab(tenant="team-a"))] == 2
    assert ("tpufleet_job_goodput_ratio", lab(tenant="team-a", job=running)) in m
    assert m[("tpufleet_job_goodput_ratio", lab(tenant="team-a", job=running))] == pytest.approx(0.0)
    assert not any(k[0] == "tpufleet_job_goodput_ratio" and ("job", done) in k[1] for k in m)  # finished
    assert ("tpufleet_scheduling_cycle_seconds_count", ()) not in m  # the loop's own: ControlPlane adds it


def test_counters_survive_a_restart_and_keep_growing(fleet: Fleet) -> None:
    fleet.store.tenants.create("team-a", {"v4": 16})
    run_with_steps(fleet, fleet.submit("team-a"))
    running = fleet.submit("team-a")
    fleet.cycle()
    fleet.cluster.start(running)
    fleet.cycle(10)
    key = ("tpufleet_chip_seconds_total", lab(tenant="team-a", generation="v4", pricing="on_demand"))
    before = fleet.metrics()[key]
    fleet.restart_api()  # fresh collectors: the totals come from the store again
    assert fleet.metrics()[key] == pytest.approx(before)
    fleet.cycle(10)
    assert fleet.metrics()[key] == pytest.approx(before + 10 * V4_16_CHIPS)
    fleet.cluster.exit(running, 0)
    fleet.cycle(5)
    fleet.cycle()
    after = fleet.metrics()
    assert after[key] == pytest.approx(before + 15 * V4_16_CHIPS)  # counted once, as ended
    ended = ("tpufleet_attempts_ended_total", lab(tenant="team-a", reason="succeeded"))
    assert after[ended] == 2


def test_a_lost_host_is_counted_as_host_lost(fleet: Fleet) -> None:
    fleet.store.tenants.create("team-a", {"v4": 16})
    job_id = fleet.submit("team-a", max_retries=0)
    fleet.cycle()
    fleet.cluster.start(job_id)
    fleet.cycle()
    fleet.cluster.kill_host("tpu-v4-16-0", 1)
    fleet.cycle()
    fleet.cycle()
    key = ("tpufleet_attempts_ended_total", lab(tenant="team-a", reason="host_lost"))
    assert fleet.metrics()[key] == 1


def test_metrics_need_the_admin_token_or_a_metrics_token(fleet: Fleet) -> None:
    tenant_token = fleet.store.tenants.create("team-a", {"v4": 16})[1]
    _, metrics_token = fleet.store.tokens.create("team-a", "metrics", actor="admin")

    def status(path: str, token: str | None) -> int:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return fleet.http.get(path, headers=headers).status_code

    assert status("/metrics", None) == 401
    assert status("/metrics", tenant_token) == 403  # a tenant's jobs token
    assert status("/metrics", metrics_token) == 200
    assert (
        "tpufleet_jobs"
        in fleet.http.get("/metrics", headers={"Authorization": f"Bearer {metrics_token}"}).text
    )
    assert status("/api/v1/cost", metrics_token) == 403  # and nothing else
    assert status("/api/v1/jobs", metrics_token) == 403


def test_the_cost_report_per_tenant_and_job_and_who_sees_what(fleet: Fleet) -> None:
    token_a = fleet.store.tenants.create("team-a", {"v4": 16})[1]
    fleet.store.tenants.create("team-b", {"v6e": 16})
    job_a = fleet.submit("team-a")
    run_with_steps(fleet, job_a)
    job_b = fleet.submit("team-b", accelerator_type="v6e-16")
    fleet.cycle()
    fleet.cluster.start(job_b)
    fleet.cycle(3600)
    everyone = fleet.get("/api/v1/cost")
    tenants = {t["tenant"]: t for t in everyone["tenants"]}
    assert set(tenants) == {"team-a", "team-b"}
    assert tenants["team-b"]["chip_hours"] == pytest.approx(16)  # 16 chips for an hour
    assert tenants["team-b"]["dollars"] == pytest.approx(16 * 2.7)
    assert tenants["team-b"]["badput_dollars"] is None  # reports no steps: unknown, not zero
    a = next(j for j in everyone["jobs"] if j["job_id"] == job_a)
    assert a["dollars"] == pytest.approx(65 * 8 / 3600 * 3.22)
    assert a["badput_dollars"] == pytest.approx(16 * 8 / 3600 * 3.22)  # 10 s start-up + 6 s idle
    own = fleet.get("/api/v1/cost", token_a)
    assert [t["tenant"] for t in own["tenants"]] == ["team-a"]
    resp = fleet.http.get("/api/v1/cost?tenant=team-b", headers={"Authorization": f"Bearer {token_a}"})
    assert resp.status_code == 403
    window = fleet.get("/api/v1/cost?since=30m")
    assert {t["tenant"] for t in window["tenants"]} == {"team-b"}
    assert window["tenants"][0]["chip_hours"] == pytest.approx(8)  # the last half hour only
    bad = fleet.http.get("/api/v1/cost?since=soon", headers={"Authorization": f"Bearer {fleet.admin}"})
    assert bad.status_code == 400 and "7d" in bad.json()["error"]


def test_an_unknown_price_leaves_dollars_unknown(store: Store, clock: FakeClock, tmp_path: Path) -> None:
    no_v4 = pricing.PriceTable(tuple(p for p in pricing.shipped().rows if p.generation != "v4"))
    f = Fleet(store, clock, tmp_path)
    f.http = TestClient(create_app(store, prices=no_v4))
    f.store.tenants.create("team-a", {"v4": 16})
    job_id = f.submit("team-a")
    f.cycle()
    f.cycle(100)
    row = f.get("/api/v1/cost")["tenants"][0]
    assert row["dollars"] is None and row["unpriced_chip_hours"] == pytest.approx(800 / 3600)
    assert f.get("/api/v1/cost")["jobs"][0]["job_id"] == job_id
    f.http.close()


def test_a_slice_of_a_spot_group_is_priced_spot(fleet: Fleet) -> None:
    from tpufleet.control.store.slicegroups import SliceGroups

    groups = SliceGroups(fleet.store)
    groups.create("cheap", "v4-16", spot=True)
    groups.set_state("cheap", "ACTIVE", "", ["tpu-v4-16-0"])  # the provider made this slice, spot
    fleet.store.tenants.create("team-a", {"v4": 16})
    job_id = fleet.submit("team-a", num_slices=2)  # one spot slice, one Ray already had
    fleet.cycle()
    fleet.cluster.start(job_id)
    fleet.cycle(100)
    m = fleet.metrics()
    spot, on_demand = (lab(tenant="team-a", generation="v4", pricing=p) for p in ("spot", "on_demand"))
    assert m[("tpufleet_chip_seconds_total", spot)] == pytest.approx(800)
    assert m[("tpufleet_chip_seconds_total", on_demand)] == pytest.approx(800)
    assert m[("tpufleet_cost_dollars_total", spot)] == pytest.approx(800 / 3600 * 0.9215)
    (job,) = fleet.get("/api/v1/cost")["jobs"]
    assert job["dollars"] == pytest.approx(800 / 3600 * (0.9215 + 3.22))


def test_a_cost_report_is_fresh_after_any_change(fleet: Fleet) -> None:
    fleet.store.tenants.create("team-a", {"v4": 16})
    run_with_steps(fleet, fleet.submit("team-a"))
    first = fleet.get("/api/v1/cost")["tenants"][0]["jobs"]
    assert fleet.get("/api/v1/cost")["tenants"][0]["jobs"] == first  # the same answer, from memory
    run_with_steps(fleet, fleet.submit("team-a"))  # within the cache's seconds, but things changed
    assert fleet.get("/api/v1/cost")["tenants"][0]["jobs"] == first + 1


def test_lean_reads_give_the_same_cost_and_goodput(fleet: Fleet) -> None:
    from tpufleet.control.store.usage import Usage
    from tpufleet.observe import cost

    fleet.store.tenants.create("team-a", {"v4": 16})
    run_with_steps(fleet, fleet.submit("team-a"))
    usage = Usage(fleet.store)
    full, lean = usage.attempts(), usage.attempts(lean=True)
    assert [(a.job_id, a.attempt, a.first_step, a.last_step_at) for a in full] == [
        (a.job_id, a.attempt, a.first_step, a.last_step_at) for a in lean
    ]
    now = fleet.clock.now
    reports = [cost.report(rows, pricing.shipped(), {}, now=now).to_dict() for rows in (full, lean)]
    assert reports[0] == reports[1] and reports[0]["jobs"][0]["goodput"] is not None


def test_the_kept_all_time_costs_equal_a_fresh_report_as_jobs_come_and_go(fleet: Fleet) -> None:
    from tpufleet.control.store.usage import Usage
    from tpufleet.observe import cost

    usage = Usage(fleet.store)
    kept = cost.AllTime(usage, pricing.shipped())

    def same() -> None:
        fresh = cost.report(usage.attempts(), pricing.shipped(), usage.slice_pricing(), now=fleet.clock.now)
        assert kept.report().to_dict() == fresh.to_dict()
        assert kept.report("team-b").to_dict()["tenants"] == [
            t for t in fresh.to_dict()["tenants"] if t["tenant"] == "team-b"
        ]

    fleet.store.tenants.create("team-a", {"v4": 16})
    fleet.store.tenants.create("team-b", {"v6e": 16})
    same()  # nothing yet
    run_with_steps(fleet, fleet.submit("team-a"))
    same()
    retried = fleet.submit("team-a", max_retries=1)
    running = fleet.submit("team-b", accelerator_type="v6e-16")
    fleet.cycle()
    fleet.cluster.start(retried)
    fleet.cluster.start(running)
    fleet.cycle(30)
    same()  # two running: their cost grows
    fleet.cluster.exit(retried, 1)  # fails: back to the queue for attempt 2
    fleet.cycle(10)
    same()
    fleet.store.jobs.request_cancel(retried)  # cancelled while queued: no attempt changes
    fleet.cycle(10)
    same()
    assert kept.open == {running}  # what is read again next time
