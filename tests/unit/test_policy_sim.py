"""The policy over time, on the simulator's fake clock: no starvation, fair share, reclaim round trip."""

from __future__ import annotations

import pytest

from tpufleet import catalog
from tpufleet.scheduler.model import NotFitCode, TenantName, TenantView
from tpufleet.scheduler.simulate import SimJob, Simulation, make_fleet


def tenant(name: str, weight: float = 1.0, **quota: int) -> TenantView:
    return TenantView(TenantName(name), quota, weight)


def stream(
    tenant: str, count: int, *, per_tick: int = 1, duration: int = 4, prefix: str = "s"
) -> list[SimJob]:
    """``count`` one-slice v4-16 jobs, ``per_tick`` arriving every tick from tick 0."""
    return [
        SimJob(f"{prefix}{i:04d}", tenant, "v4-16", arrival=i // per_tick, duration=duration)
        for i in range(count)
    ]


@pytest.mark.parametrize("big_tenant", ["other", "small"], ids=["another-tenant", "same-tenant"])
def test_a_large_job_is_not_starved_by_a_stream_of_small_ones(big_tenant: str) -> None:
    # Small jobs alone would keep all four slices busy forever (demand is twice the fleet); without
    # the head-of-line reservation a 4-slice job would never see four free slices at once.
    sim = Simulation([tenant("small", v4=32), tenant("other", v4=32)], make_fleet("v4-16:4"))
    big = SimJob("big", big_tenant, "v4-16", num_slices=4, arrival=10, duration=10)
    result = sim.run([*stream("small", 400, per_tick=2), big])
    rec = result.record("big")
    assert rec.first_admitted is not None and rec.finished == rec.first_admitted + 10
    seq = rec.view.seq
    overtook = [j for j, r in result.records.items() if r.view.seq > seq and r.admitted[0] < rec.admitted[0]]
    assert overtook == [], "no job submitted after the big one started before it"
    if big_tenant == "other":  # below its fair share: first in line at once, waits only for slices to drain
        assert rec.first_admitted <= 10 + 4
    held_back = [
        r
        for r in result.records.values()
        if any(w.code == NotFitCode.RESERVED_FOR_HEAD_OF_LINE for w in r.reasons)
    ]
    assert held_back, "small jobs were held back by the reservation"
    assert result.unfinished() == []


@pytest.mark.parametrize(
    ("a", "b", "slices", "ratio"),
    [
        # nothing in quota: the borrowed shares follow the weights (2 : 6 and 4 : 8 slices)
        (tenant("a", weight=1), tenant("b", weight=3), 8, 3.0),
        (tenant("a", weight=1), tenant("b", weight=2), 12, 2.0),
        (tenant("a", weight=2), tenant("b", weight=2), 8, 1.0),
        # quota first: 2 and 6 of 8 slices
        (tenant("a", v4=16), tenant("b", v4=48), 8, 3.0),
        # 2 slices each in quota, the other 6 borrowed 1 : 2 by weight, so 4 : 6
        (tenant("a", v4=16, weight=1), tenant("b", v4=16, weight=2), 10, 1.5),
    ],
    ids=["weights-1-3", "weights-1-2", "weights-equal", "quota-1-3", "quota-equal-weights-1-2"],
)
def test_fair_share_converges_to_weights_and_quotas(
    a: TenantView, b: TenantView, slices: int, ratio: float
) -> None:
    sim = Simulation([a, b], make_fleet(f"v4-16:{slices}"))
    # all submitted at once, more than the fleet runs by tick 120: both tenants always have work queued
    jobs = [
        *stream("a", 300, per_tick=300, duration=5, prefix="a"),
        *stream("b", 300, per_tick=300, duration=5, prefix="b"),
    ]
    result = sim.run(jobs, until=120)
    assert result.chip_ticks["b"] / result.chip_ticks["a"] == pytest.approx(ratio, rel=0.08), (
        result.chip_ticks
    )


@pytest.mark.parametrize(("resume", "rerun"), [(True, 95), (False, 100)], ids=["resumes", "starts-over"])
def test_a_borrower_is_preempted_requeued_and_finishes_later(resume: bool, rerun: int) -> None:
    sim = Simulation(
        [tenant("prod", v4=16), tenant("research")], make_fleet("v4-16:4"), grace=1, resume=resume
    )
    research = [SimJob(f"r{i}", "research", "v4-16", arrival=0, duration=100) for i in range(4)]
    prod = SimJob("p", "prod", "v4-16", num_slices=2, arrival=5, duration=10)
    result = sim.run([*research, prod])
    chips = catalog.slice_type("v4-16").chips
    assert result.record("p").admitted == [6]  # preempt at 5, slices released after the grace tick
    assert result.record("p").reasons[-1].code == NotFitCode.WAITING_FOR_PREEMPTION
    victims = sorted(j for j, r in result.records.items() if r.preemptions)
    assert victims == ["r2", "r3"]  # the most recently admitted borrowers, exactly as many as needed
    for job in victims:
        rec = result.record(job)
        assert rec.admitted == [0, 16]  # back when prod finished
        # resumed from its checkpoint (5 ticks of work kept), or run again whole (Kueue's eviction)
        assert rec.finished == 16 + rerun
        # held 0 to 6 by the attempt the preemption ended (lost), then 16 to its end
        assert (rec.lost, rec.held) == (6 * chips, (6 + rerun) * chips)
    assert result.record("r0").finished == 100
    assert (result.record("r0").lost, result.record("r0").held) == (0, 100 * chips)
    assert result.unfinished() == []


def test_the_simulation_is_deterministic() -> None:
    def once() -> dict[str, tuple[list[int], int | None, list[str]]]:
        sim = Simulation([tenant("a", v4=16), tenant("b", weight=2)], make_fleet("v4-16:3,v6e-4:2"))
        jobs = stream("a", 50, per_tick=2, prefix="a") + stream("b", 50, per_tick=3, prefix="b")
        jobs.append(SimJob("w", "b", "v6e-4", num_slices=2, arrival=3, duration=7))
        result = sim.run(jobs)
        return {
            j: (r.admitted, r.finished, [w.code.value for w in r.reasons]) for j, r in result.records.items()
        }

    assert once() == once()


def test_with_a_cadence_the_policy_decides_only_on_it_and_what_ends_between_waits_for_it() -> None:
    """``every=5``: a control plane deciding once a cycle. A job that ends at tick 3 holds its slice
    until tick 5, where the next job (arrived at tick 1) is admitted; without a cadence at tick 3."""
    jobs = [
        SimJob("first", "a", "v4-16", arrival=0, duration=3),
        SimJob("next", "a", "v4-16", arrival=1, duration=3),
    ]
    fleet = make_fleet("v4-16:1")
    plain = Simulation([tenant("a", v4=8)], fleet).run(jobs)
    assert plain.record("next").admitted == [3]
    cadenced = Simulation([tenant("a", v4=8)], fleet, every=5).run(jobs)
    assert (cadenced.record("first").finished, cadenced.record("next").admitted) == (5, [5])
    assert cadenced.record("next").finished == 10  # ended at 8, seen at the next decision
    with pytest.raises(ValueError, match="every"):
        Simulation([tenant("a", v4=8)], fleet, every=0)
