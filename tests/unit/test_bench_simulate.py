"""bench/simulate.py: the trace replay's invariants, on tiny traces through every policy."""

from __future__ import annotations

import benches
import pytest

sim = benches.load("simulate")
H = 3600.0


def _quiet(**kw: object) -> object:
    """A config without faults, so a hand-built trace plays out exactly as written."""
    return sim.Config(hosts=40, host_failures=0.0, spot_fraction=0.0, spot_preemptions=0.0, **kw)


def _job(idx: int, tenant: str, units: int, arrival_h: float, hours: float) -> object:
    acc, n = sim.UNIT_SHAPES[units]
    return sim.Job(idx, tenant, units, acc, n, units * 8, arrival_h * H, hours * H)


def test_trace_follows_the_gavel_mix() -> None:
    cfg = sim.Config(hosts=400, jobs=4000, seed=3)
    trace = sim.build_trace(cfg)
    sizes = [j.units for j in trace.jobs]
    for units, p in sim.SIZE_MIX:
        assert abs(sizes.count(units) / len(sizes) - p) < 0.03, units
    durations = [j.duration for j in trace.jobs]
    assert min(durations) >= 60 * 10**1.5 and max(durations) <= 60 * 10**4
    long = sum(d > 60 * 10**3 for d in durations) / len(durations)
    assert abs(long - 0.2) < 0.03
    arrivals = [j.arrival for j in trace.jobs]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0
    work = sum(j.chips * j.duration for j in trace.jobs)
    assert work / (trace.capacity_chips * trace.horizon) == pytest.approx(cfg.load, rel=1e-6)
    for name, acc, _ in trace.slices:
        assert name.startswith(acc + "-")


@pytest.mark.parametrize("seed", [1, 2])
def test_every_policy_keeps_the_books(seed: int) -> None:
    cfg = sim.Config(hosts=120, jobs=300, seed=seed, host_failures=0.02, spot_preemptions=1.0)
    result = sim.compare(cfg)
    assert set(result["policies"]) == {"fifo", "static_quota", "tpufleet", "tpufleet_autoscaled"}
    faults = result["trace"]["faults"]
    assert faults["host"] > 0 and faults["spot"] > 0
    for name, m in result["policies"].items():
        assert m["finished"] + m["unfinished"] == m["jobs"] == 300, name
        assert m["chip_hours_used"] <= m["chip_hours_paid"] + 1e-6, name
        assert 0 < m["jain_fairness"] <= 1, name
        assert 0 < m["goodput"] <= 1, name
        assert 0 < m["utilization"] <= 1, name
        # Tenant shares add up to the utilization (both are chips held over the window's fleet).
        assert sum(t["share"] for t in m["tenants"].values()) == pytest.approx(m["utilization"], abs=0.002)
        assert m["wait_p50_s"] <= m["wait_p99_s"], name
        started = sum(w["jobs"] for w in m["wait_by_units"].values())
        assert started >= m["finished"], name
    # fifo and tpufleet can always place every job once the fleet is whole again; the autoscaler
    # can always make the slices of a job within its tenant's quota (a borrower waits for idle ones).
    policies = result["policies"]
    for name in ("fifo", "tpufleet", "tpufleet_autoscaled"):
        assert policies[name]["unfinished"] == 0, name
    assert policies["tpufleet"]["failures"] > 0
    # The autoscaled fleet never exceeds the fixed one, and pays only while slices exist.
    assert policies["tpufleet_autoscaled"]["chip_hours_paid"] < policies["tpufleet"]["chip_hours_paid"]


def test_replay_is_deterministic() -> None:
    cfg = sim.Config(hosts=80, jobs=150, seed=5)

    def strip(m: dict[str, object]) -> dict[str, object]:
        return {k: v for k, v in m.items() if k not in ("sim_seconds", "decide_seconds")}

    a, b = sim.compare(cfg), sim.compare(cfg)
    assert {p: strip(m) for p, m in a["policies"].items()} == {p: strip(m) for p, m in b["policies"].items()}


def test_fifo_idles_behind_a_head_of_line_job_that_tpufleet_does_not() -> None:
    # Three v4-64 slices: two 4-unit jobs hold two for 10 h, so the 8-unit job (two v4-64 slices)
    # heads the queue for 10 h. FIFO keeps the v4-16 jobs behind it waiting on idle slices.
    cfg = _quiet()
    jobs = [
        _job(0, "t0", 4, 0.0, 10),
        _job(1, "t1", 4, 0.0, 10),
        _job(2, "t2", 8, 0.1, 5),
        *(_job(3 + i, "t3", 1, 0.2, 5) for i in range(6)),
        _job(9, "t0", 1, 12.0, 1),  # closes the window: FIFO's v4-16 jobs are still running then
    ]
    trace = sim.build_trace(cfg, jobs)
    assert sum(acc == "v4-64" for _, acc, _ in trace.slices) == 3
    result = sim.compare(cfg, trace=trace)["policies"]
    fifo, tpf = result["fifo"], result["tpufleet"]
    assert fifo["utilization"] < tpf["utilization"]
    assert fifo["wait_by_units"]["1"]["p50_s"] >= 9 * H  # behind the head for its whole wait
    assert tpf["wait_by_units"]["1"]["p99_s"] <= cfg.cycle_s
    assert fifo["unfinished"] == tpf["unfinished"] == 0


def test_tpufleet_reclaims_a_tenant_entitlement_that_fifo_leaves_to_the_flood() -> None:
    # t0 fills every v4-64 and v4-16 slice with long jobs, far beyond its quota (half the fleet's
    # chips), then t1 asks for one v4-16 slice within its quota.
    cfg = _quiet(tenants=2)
    trace = sim.build_trace(cfg, [_job(0, "t0", 1, 0, 0)])
    n = sum(acc == "v4-16" for _, acc, _ in trace.slices)
    jobs = [_job(i, "t0", 4, 0.0, 30) for i in range(3)]
    jobs += [_job(3 + i, "t0", 1, 0.0, 30) for i in range(2 * n)]
    jobs += [_job(3 + 2 * n, "t1", 1, 1.0, 2), _job(4 + 2 * n, "t0", 1, 12.0, 1)]
    trace = sim.build_trace(cfg, jobs)
    result = sim.compare(cfg, trace=trace)["policies"]
    fifo, tpf = result["fifo"], result["tpufleet"]
    assert tpf["preemptions"] >= 1
    assert tpf["tenants"]["t1"]["entitlement_met"] > 0.9
    assert fifo["tenants"]["t1"]["entitlement_met"] < 0.5
    assert tpf["tenants"]["t1"]["wait_p99_s"] <= 2 * cfg.cycle_s + cfg.grace_s  # reclaimed, not waited out
    assert fifo["tenants"]["t1"]["wait_p99_s"] >= 28 * H  # behind t0's 30-hour jobs
    assert tpf["jain_fairness"] > fifo["jain_fairness"]
    assert tpf["min_entitlement_met"] > fifo["min_entitlement_met"]


def test_static_partition_never_lends_and_reports_what_cannot_run() -> None:
    # Four tenants share three v4-64 slices: none owns two, so an 8-unit job can never run there.
    cfg = _quiet()
    jobs = [_job(0, "t0", 8, 0.0, 1), _job(1, "t0", 1, 0.0, 1), _job(2, "t1", 1, 2.0, 1)]
    trace = sim.build_trace(cfg, jobs)
    result = sim.compare(cfg, trace=trace)["policies"]
    assert result["static_quota"]["unfinished"] == 1
    assert result["fifo"]["unfinished"] == result["tpufleet"]["unfinished"] == 0


def test_jain_index() -> None:
    assert sim.jain([1.0, 1.0, 1.0]) == 1.0
    assert sim.jain([1.0, 0.0]) == pytest.approx(0.5)
    assert 0 < sim.jain([0.2, 0.9, 1.0]) < 1


def test_cli_json_and_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert sim.main(["--hosts", "60", "--jobs", "40", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for name in ("fifo", "static_quota", "tpufleet", "tpufleet_autoscaled"):
        for key in (
            "utilization",
            "offered_load",
            "wait_p50_s",
            "wait_p99_s",
            "jain_fairness",
            "goodput",
            "chip_hours_paid",
            "chip_hours_used",
        ):
            assert isinstance(out["policies"][name][key], int | float), (name, key)
    assert sim.main(["--hosts", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--hosts must be at least" in err[0]
    assert sim.main(["--policies", "fifo,lottery"]) == 2
    assert "unknown policy 'lottery'" in capsys.readouterr().err


def test_autoscaler_makes_slices_on_demand_and_deletes_them_when_idle() -> None:
    # One 1-unit job of 2 h at the start and one at 48 h: the fixed fleet pays for every slice for
    # 48 h; the autoscaled one makes one v4-16 for each job and deletes it once idle.
    cfg = _quiet(provision_min=5.0, idle_timeout_min=10.0)
    trace = sim.build_trace(cfg, [_job(0, "t0", 1, 0.0, 2), _job(1, "t1", 1, 48.0, 2)])
    result = sim.compare(cfg, ("tpufleet", "tpufleet_autoscaled"), trace)["policies"]
    fixed, auto = result["tpufleet"], result["tpufleet_autoscaled"]
    assert fixed["chip_hours_paid"] == pytest.approx(trace.capacity_chips * 48, rel=1e-6)
    assert auto["unfinished"] == 0
    assert auto["wait_by_units"]["1"]["p99_s"] >= 5 * 60  # it waited for its slice to be made
    # Paid: one v4-16 (8 chips) from its request until idle_timeout after the job ended (about
    # 5 min + 2 min restart + 2 h + 10 min, rounded up to cycles).
    assert 8 * 2 <= auto["chip_hours_paid"] <= 8 * 3
    assert auto["chip_hours_used"] <= auto["chip_hours_paid"]


def test_the_autoscaler_makes_slices_for_a_borrower_out_of_quota_left_unused() -> None:
    # t0's 8-unit job wants 64 chips, beyond its quota of 40 (160 chips, four tenants): it borrows
    # what the idle tenants leave, and the autoscaled fleet makes the slices for it.
    cfg = _quiet(provision_min=5.0, idle_timeout_min=10.0)
    trace = sim.build_trace(cfg, [_job(0, "t0", 8, 0.0, 2)])
    assert trace.quota["t0"] < 8 * 8
    auto = sim.compare(cfg, ("tpufleet_autoscaled",), trace)["policies"]["tpufleet_autoscaled"]
    assert auto["unfinished"] == 0
    assert 5 * 60 <= auto["wait_by_units"]["8"]["p99_s"] <= 10 * 60  # the time to make its slices


def test_spare_slices_let_an_arriving_job_start_without_waiting_for_one_to_be_made() -> None:
    # the 1-unit job comes at 48 h; the 2-unit one at the start waits for the empty fleet's slices
    jobs = [_job(0, "t0", 2, 0.0, 2), _job(1, "t1", 1, 48.0, 2)]
    waits, paid = {}, {}
    for spares in (0, 1):
        cfg = _quiet(provision_min=5.0, idle_timeout_min=10.0, spare_slices=spares)
        trace = sim.build_trace(cfg, jobs)
        auto = sim.compare(cfg, ("tpufleet_autoscaled",), trace)["policies"]["tpufleet_autoscaled"]
        assert auto["unfinished"] == 0
        waits[spares], paid[spares] = auto["wait_by_units"]["1"]["p99_s"], auto["chip_hours_paid"]
    assert waits[0] >= 5 * 60 and waits[1] < 5 * 60  # the spare was ready when the job came
    # the spares (one of each type) are paid for the 48 h: 8 + 16 + 32 chips
    assert paid[1] - paid[0] >= (8 + 16 + 32) * 40


@pytest.mark.parametrize(
    ("name", "t0_jobs", "t1_jobs", "cause"),
    [
        # t0 holds two of the three v4-64 slices within its quota (64 of 84 chips) and t1 the third:
        # t1's second v4-64 job is within its quota, but no slice of the type can be reclaimed.
        ("type saturated", 2, 1, "type_saturated"),
        # t0's third v4-64 job borrows (96 of 84 chips): t1's job in quota has it preempted.
        ("reclaimed", 3, 0, "reclaim_in_progress"),
        # t1 holds 64 of its 84 chips on two v4-64s: a third (32 chips) would pass its quota and
        # nothing is idle to borrow, so the 20 chips of headroom stay unused (whole slices).
        ("headroom", 1, 2, "headroom_below_job"),
    ],
)
def test_explain_shortfall_names_why_a_tenant_is_below_its_entitlement(
    name: str, t0_jobs: int, t1_jobs: int, cause: str
) -> None:
    cfg = _quiet(tenants=2, explain_shortfall=True)
    jobs = [_job(i, "t0", 4, 0.0, 10) for i in range(t0_jobs)]
    jobs += [_job(t0_jobs + i, "t1", 4, 0.0, 10) for i in range(t1_jobs)]
    jobs += [_job(len(jobs), "t1", 4, 1.0, 2), _job(len(jobs) + 1, "t0", 1, 12.0, 1)]
    trace = sim.build_trace(cfg, jobs)
    assert sum(acc == "v4-64" for _, acc, _ in trace.slices) == 3 and trace.quota["t1"] == 84
    t1 = sim.replay(trace, cfg, "tpufleet")["tenants"]["t1"]
    assert t1["entitlement_met"] < 1.0, name
    assert max(t1["shortfall"], key=t1["shortfall"].get) == cause, t1["shortfall"]
    assert t1["shortfall"][cause] >= 0.5 and sum(t1["shortfall"].values()) == pytest.approx(1.0, abs=1e-3)


def test_without_explain_shortfall_no_tenant_carries_one() -> None:
    cfg = _quiet(tenants=2)
    trace = sim.build_trace(cfg, [_job(0, "t0", 4, 0.0, 10), _job(1, "t1", 4, 1.0, 2)])
    result = sim.replay(trace, cfg, "tpufleet")
    assert all("shortfall" not in v for v in result["tenants"].values())
