"""What holds for every cycle: one decision per queued job, whole slices, determinism, readable reasons."""

from __future__ import annotations

import random

import pytest
from scheduler_builders import Fleet, admitted, preempted, waiting

from tpufleet.scheduler.model import (
    ACTIVE_STATES,
    Admit,
    JobState,
    NotFit,
    NotFitCode,
    Preempt,
    SliceState,
    Snapshot,
    Wait,
    lookup_type,
    most_important,
)
from tpufleet.scheduler.policy import decide

TYPES = ("v4-16", "v4-32", "v6e-4", "v6e-16")


def random_fleet(seed: int) -> Snapshot:
    """A messy fleet: several types, broken and draining slices, borrowers, preemptions in flight."""
    rng = random.Random(seed)
    fleet = Fleet()
    for t in TYPES:
        fleet.slices(t, rng.randint(1, 6))
    snap = fleet.build()
    for s in snap.slices:
        roll = rng.random()
        if roll < 0.1:
            fleet.broken(s.name)
        elif roll < 0.15:
            fleet.draining(s.name)
    tenants = ["a", "b", "c"]
    for t in tenants:
        fleet.tenant(t, weight=rng.choice([1, 2, 3]), v4=rng.choice([0, 16, 64]), v6e=rng.choice([0, 8, 32]))
    for i in range(rng.randint(0, 6)):
        t = rng.choice(TYPES)
        free = [s for s in fleet.build().slices if s.accelerator_type == t and s.state == SliceState.FREE]
        if free:
            fleet.running(f"r{i}", rng.choice(tenants), t, borrowing=rng.random() < 0.6,
                          preempting=rng.random() < 0.2, priority=rng.randint(0, 2))  # fmt: skip
    for i in range(rng.randint(1, 25)):
        fleet.queued(f"q{i}", rng.choice([*tenants, "ghost"] if i == 7 else tenants),
                     rng.choice([*TYPES, "v9-8"] if i == 3 else TYPES),
                     num_slices=rng.choice([0, 1, 1, 1, 2, 3, 7]), priority=rng.randint(0, 2))  # fmt: skip
    return fleet.build()


@pytest.mark.parametrize("seed", range(60))
def test_invariants_hold_on_random_fleets(seed: int) -> None:
    snap = random_fleet(seed)
    decisions = decide(snap)
    queued = {j.id for j in snap.jobs if j.state == JobState.QUEUED}
    jobs = {j.id: j for j in snap.jobs}
    slices = {s.name: s for s in snap.slices}
    fates = [d.job for d in decisions if isinstance(d, Admit | Wait)]
    assert sorted(fates) == sorted(queued), "every queued job gets exactly one Admit or Wait"
    given = [name for d in decisions if isinstance(d, Admit) for name in d.slices]
    assert len(given) == len(set(given)), "no slice is given twice"
    for d in decisions:
        if isinstance(d, Admit):
            job = jobs[d.job]
            assert len(d.slices) == job.num_slices
            for name in d.slices:
                assert slices[name].state == SliceState.FREE and slices[name].holder is None
                assert lookup_type(slices[name].accelerator_type) == lookup_type(job.accelerator_type)
        if isinstance(d, Preempt):
            victim, winner = jobs[d.job], jobs[d.for_job]
            assert victim.state in ACTIVE_STATES and not victim.preempting
            if d.within_tenant:  # priority preemption: the tenant's own lower-priority job
                assert victim.tenant == winner.tenant and victim.priority < winner.priority
            else:  # reclaim: another tenant's borrower of the same type
                assert victim.borrowing and victim.tenant != winner.tenant
                assert victim.accelerator_type == winner.accelerator_type
            assert waiting(decisions)[d.for_job] == NotFitCode.WAITING_FOR_PREEMPTION


@pytest.mark.parametrize("seed", range(20))
def test_same_snapshot_in_any_order_gives_the_same_decisions(seed: int) -> None:
    snap = random_fleet(seed)
    rng = random.Random(seed)
    shuffled = Snapshot(
        rng.sample(list(snap.tenants), len(snap.tenants)),
        rng.sample(list(snap.slices), len(snap.slices)),
        rng.sample(list(snap.jobs), len(snap.jobs)),
    )
    assert decide(snap) == decide(snap)
    assert decide(shuffled) == decide(snap)


def test_slices_are_chosen_by_name_with_numbers_compared_as_numbers() -> None:
    fleet = Fleet().slices("v4-16", 12).tenant("a", v4=1000)
    for i in range(9):
        fleet.running(f"r{i}", "a")
    decisions = decide(fleet.queued("q", "a", num_slices=2).build())
    assert admitted(decisions) == {"q": ("v4-16-9", "v4-16-10")}


def test_multi_slice_job_gets_whole_slices_of_its_own_type() -> None:
    snap = (
        Fleet()
        .slices("v6e-16", 1)
        .slices("v4-16", 3)
        .tenant("a", v4=64)
        .queued("q", "a", num_slices=3)
        .build()
    )
    assert admitted(decide(snap)) == {"q": ("v4-16-0", "v4-16-1", "v4-16-2")}


def test_types_are_matched_by_catalog_not_by_spelling() -> None:
    snap = Fleet().slices("v4-16", 1).tenant("a", v4=8).queued("q", "a", "TPU-V4-16").build()
    assert admitted(decide(snap)) == {"q": ("v4-16-0",)}


def test_admissions_in_one_cycle_use_up_slices_for_later_jobs() -> None:
    snap = (
        Fleet()
        .slices("v4-16", 3)
        .tenant("a", v4=64)
        .queued("q1", "a", num_slices=2)
        .queued("q2", "a", num_slices=2)
    )
    decisions = decide(snap.build())
    assert admitted(decisions) == {"q1": ("v4-16-0", "v4-16-1")}
    assert waiting(decisions) == {"q2": NotFitCode.WAITING_FOR_FREE_SLICES}


def test_wait_message_names_the_holders() -> None:
    snap = (
        Fleet().slices("v4-16", 2).tenant("prod", v4=16).tenant("research", v4=8)
        .running("abc", "research").queued("q", "prod", num_slices=2).build()
    )  # fmt: skip
    (wait,) = [d for d in decide(snap) if isinstance(d, Wait)]
    assert wait.reason.code == NotFitCode.WAITING_FOR_FREE_SLICES
    assert "needs 2 v4-16 slices, 1 free; 1 held by job abc (tenant research)" in wait.reason.message


def test_reserved_message_names_the_head_of_line() -> None:
    snap = (
        Fleet().slices("v4-16", 3).tenant("a", v4=64).running("r", "a")
        .queued("big", "a", num_slices=3).queued("small", "a").build()
    )  # fmt: skip
    reasons = {d.job: d.reason for d in decide(snap) if isinstance(d, Wait)}
    assert "reserved for head-of-line job big (tenant a)" in reasons["small"].message
    assert "head-of-line reservation of v4-16" in reasons["big"].message


def test_unknown_type_message_says_what_is_valid() -> None:
    snap = Fleet().slices("v4-16", 1).tenant("a").queued("q", "a", "v9-8").build()
    (wait,) = [d for d in decide(snap) if isinstance(d, Wait)]
    assert "v9-8" in wait.reason.message and "v6e" in wait.reason.message
    assert wait.reason.permanent


def test_preempt_names_the_job_it_makes_room_for() -> None:
    snap = (
        Fleet().slices("v4-16", 1).tenant("prod", v4=8).tenant("res")
        .running("b", "res", borrowing=True).queued("q", "prod").build()
    )  # fmt: skip
    (p,) = [d for d in decide(snap) if isinstance(d, Preempt)]
    assert preempted([p]) == {"b": "q"}
    assert "tenant res borrows" in p.reason


def test_terminal_jobs_are_ignored() -> None:
    snap = Fleet().slices("v4-16", 1).tenant("a", v4=8).running("done", "a", state=JobState.SUCCEEDED).build()
    assert decide(snap) == []


def test_not_fit_codes_are_stable_and_ranked() -> None:
    assert [c.value for c in NotFitCode] == [
        "UNKNOWN_SLICE_TYPE",
        "INVALID_NUM_SLICES",
        "NO_SUCH_SLICES_IN_FLEET",
        "UNKNOWN_TENANT",
        "NOT_ENOUGH_INTACT_SLICES",
        "WAITING_FOR_PREEMPTION",
        "QUOTA_EXCEEDED_NO_BORROWING",
        "RESERVED_FOR_HEAD_OF_LINE",
        "LOWER_PRIORITY_THAN_HEAD",
        "WAITING_FOR_FREE_SLICES",
        "PROVISIONING",
        "WAITING_FOR_CAPACITY",
    ]
    free = NotFit(NotFitCode.WAITING_FOR_FREE_SLICES, "later")
    unknown = NotFit(NotFitCode.UNKNOWN_SLICE_TYPE, "never")
    assert most_important([free, unknown]) is unknown
    assert sorted([free, unknown]) == [unknown, free]
    assert free.to_dict() == {"code": "WAITING_FOR_FREE_SLICES", "message": "later"}
    assert not free.permanent


def test_scheduler_public_api_is_pinned() -> None:
    import tpufleet.scheduler as scheduler

    assert sorted(scheduler.__all__) == sorted(
        ["ACTIVE_STATES", "TERMINAL_STATES", "Admit", "Decision", "JobId", "JobState", "JobView", "NotFit",
         "NotFitCode", "Preempt", "RunDecision", "SliceName", "SliceState", "SliceView", "Snapshot",
         "TenantName", "TenantView", "Wait", "Waits", "decide", "decide_runs", "expand", "most_important"]
    )  # fmt: skip
    for name in scheduler.__all__:
        assert hasattr(scheduler, name), name


def test_holders_are_summarised_beyond_three() -> None:
    fleet = Fleet().slices("v4-16", 6).tenant("a", v4=1000)
    for i in range(5):
        fleet.running(f"r{i}", "a")
    (wait,) = [d for d in decide(fleet.queued("q", "a", num_slices=3).build()) if isinstance(d, Wait)]
    assert "1 held by job r2 (tenant a); 2 more held by 2 more jobs" in wait.reason.message
