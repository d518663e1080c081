"""bench/kueue.py: Kueue's configs mapped onto tenants, slices and job bodies (the pure parts only)."""

from __future__ import annotations

import benches
import pytest

from tpufleet import catalog

kq = benches.load("kueue")


def _fleet_chips(fleet: str) -> int:
    return sum(st.chips * n for st, n in catalog.parse_slice_list(fleet))


@pytest.mark.parametrize(
    ("name", "tenants", "workloads"), [("baseline", 30, 15_000), ("large-scale", 2000, 60_000)]
)
@pytest.mark.parametrize("mapping", ["slices", "chips"])
def test_every_queue_is_a_tenant_and_the_fleet_is_the_quotas_summed(
    name: str, tenants: int, workloads: int, mapping: str
) -> None:
    p = kq.plan(kq.CONFIGS[name], mapping)
    assert len(set(p.tenants)) == tenants and p.workloads == workloads
    assert _fleet_chips(p.fleet) == p.quota * tenants  # Kueue: a cohort's capacity is its quotas summed
    assert p.shapes["large"].chips == p.quota  # a large workload fills its queue's quota, as in Kueue


def test_whole_slices_keep_kueues_ratios_where_a_slice_exists() -> None:
    p = kq.plan(kq.CONFIGS["baseline"], "slices")
    assert p.quota == 32
    assert {k: (s.accelerator_type, s.num_slices) for k, s in p.shapes.items()} == {
        "small": ("v5litepod-1", 1),
        "medium": ("v5litepod-8", 1),
        "large": ("v5litepod-32", 1),
    }
    assert p.shapes["medium"].chips / p.quota == 5 / 20
    # split by each class's chip-seconds: 70 / 400 / 1,600 per tenant of 2,070
    assert p.fleet == "v5litepod-32:23,v5litepod-8:23,v5litepod-1:40"


def test_chips_are_one_chip_slices_so_every_ratio_is_exact() -> None:
    p = kq.plan(kq.CONFIGS["baseline"], "chips")
    assert p.quota == 20 and p.fleet == "v5litepod-1:600"
    assert {k: s.chips for k, s in p.shapes.items()} == {"small": 1, "medium": 5, "large": 20}


def test_a_job_body_carries_the_class_priority_runtime_and_tenant() -> None:
    p = kq.plan(kq.CONFIGS["baseline"], "slices")
    medium = p.sets[1]
    body = kq.job_body(p, "cq-1-cohort-2", medium, 7)
    assert body == {
        "command": ["true"],
        "name": "medium-7",
        "tenant": "cq-1-cohort-2",
        "accelerator_type": "v5litepod-8",
        "num_slices": 1,
        "priority": 100,
        "env": {"TPUFLEET_SANDBOX_SECONDS": "0.5"},
    }


def test_scale_keeps_a_fraction_of_each_set_and_at_least_one() -> None:
    p = kq.plan(kq.CONFIGS["baseline"], "slices", scale=0.01)
    assert [(s.name, s.count, s.interval_ms) for s in p.sets] == [
        ("small", 4, 100),
        ("medium", 1, 500),
        ("large", 1, 1200),
    ]


def test_figures_take_the_first_admission_and_every_attempts_chips() -> None:
    p = kq.plan(kq.CONFIGS["baseline"], "chips", scale=0.01)
    base = {"accelerator_type": "v5litepod-1", "state": "SUCCEEDED", "tenant": p.tenants[0]}
    jobs = [
        {**base, "name": "small-0", "num_slices": 1, "attempt": 1, "submitted_at": 100.0}
        | {"admitted_at": 101.0, "finished_at": 102.0},
        {**base, "name": "large-0", "num_slices": 20, "attempt": 2, "submitted_at": 100.0}
        | {"admitted_at": 106.0, "finished_at": 110.0}
        | {
            "attempts": [
                {"admitted_at": 103.0, "ended_at": 104.0, "state": "PREEMPTED"},
                {"admitted_at": 106.0, "ended_at": 110.0, "state": "SUCCEEDED"},
            ]
        },
    ]
    f = kq.figures(p, jobs, started=100.0, generated=101.0)
    assert f.wall == 10.0 and f.admission == {"small": 1.0, "large": 3.0}
    assert f.preempted == 1 and f.succeeded == f.jobs == 2
    held = 1 * 1.0 + 20 * 1.0 + 20 * 4.0
    assert f.min_tenant_usage == 0.0  # the other tenants held nothing
    assert f.usage == pytest.approx(held / (20 * len(p.tenants) * 10.0) * 100)
    assert f.lost["all"] == pytest.approx(20 * 1.0 / held * 100)  # the preempted attempt's, run again
    assert f.lost["large"] == pytest.approx(20 / (20 + 80) * 100) and f.lost["small"] == 0.0


def test_the_policy_alone_replays_a_plan_on_ticks_of_its_intervals() -> None:
    # One tenant of one chip, three 200 ms jobs created 100 ms apart on one 1-chip slice: created
    # at 0.1, 0.2, 0.3 s, admitted at 0.1, 0.3, 0.5 s (waits 0, 0.1, 0.2 s), the last ends at 0.7 s.
    p = kq.Plan(
        ("a",), 1, "v5litepod-1:1", {"small": kq.Shape("v5litepod-1", 1)},
        (kq.WorkloadSet("small", 3, 100, 200, 50, 1),),
    )  # fmt: skip
    f = kq.simulate(p)
    assert f.wall == pytest.approx(0.7)
    assert f.generation == pytest.approx(0.3)
    assert f.admission == {"small": pytest.approx(0.1)}
    assert f.usage == pytest.approx(600 / 7)  # 0.6 chip-seconds held of 0.7
    assert (f.succeeded, f.jobs, f.preempted) == (3, 3, 0)
    assert f.lost == {"small": 0.0, "all": 0.0}  # no run a preemption ended


def test_the_policy_alone_can_be_timed_as_a_control_plane() -> None:
    # The plan above. Deciding every 300 ms: admitted at 0.3, 0.6, 0.9 s (each end seen at the next
    # decision; waits 0.2, 0.4, 0.6 s), the last seen ended at 1.2 s. With 100 ms more a job instead:
    # held 300 ms each, admitted at 0.1, 0.4, 0.7 s.
    p = kq.Plan(
        ("a",), 1, "v5litepod-1:1", {"small": kq.Shape("v5litepod-1", 1)},
        (kq.WorkloadSet("small", 3, 100, 200, 50, 1),),
    )  # fmt: skip
    f = kq.simulate(p, kq.Timing(cadence_ms=300))
    assert (f.wall, f.admission["small"]) == (pytest.approx(1.2), pytest.approx(0.4))
    f = kq.simulate(p, kq.Timing(cost_ms=100))
    assert (f.wall, f.admission["small"]) == (pytest.approx(1.0), pytest.approx(0.2))
    drifted = [kq.simulate(p, kq.Timing(tick_ms=10, drift_ms=50, seed=s)).generation for s in (1, 1, 2)]
    assert drifted[0] == drifted[1] != drifted[2] and min(drifted) > 0.3  # later, and by the seed
    with pytest.raises(ValueError, match="multiple of the tick"):
        kq.simulate(p, kq.Timing(cadence_ms=150))
    with pytest.raises(ValueError, match="--tick-ms must be >= 1"):
        kq.simulate(p, kq.Timing(tick_ms=0))


def test_the_policy_alone_admits_by_priority_and_keeps_every_chip_busy_on_fungible_capacity() -> None:
    # The policy with no cost per job (a fifth of the baseline's workloads, all 30 tenants):
    # higher priorities are admitted first, and every chip is used while the queue has work.
    p = kq.plan(kq.CONFIGS["baseline"], "chips", scale=0.2)
    f = kq.simulate(p)
    assert f.succeeded == f.jobs == p.workloads
    assert f.admission["large"] < f.admission["medium"] < f.admission["small"]
    assert f.usage > 85
