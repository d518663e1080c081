"""The autoscaler's rules, table by table, and a simulation with the real policy (properties)."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import pytest
from tests.unit.scheduler_builders import Fleet

from tpufleet.scheduler.autoscale import (
    Create,
    Delete,
    Managed,
    Phase,
    PoolView,
    ScaleSnapshot,
    autoscale,
    plan,
)
from tpufleet.scheduler.model import (
    Admit,
    JobId,
    JobState,
    JobView,
    SliceName,
    SliceState,
    SliceView,
    Snapshot,
    TenantName,
)
from tpufleet.scheduler.policy import decide

POOL = PoolView("v4", "v4-8", min_slices=0, max_slices=3)
SPOT = PoolView("v4-spot", "v4-8", min_slices=0, max_slices=2, spot=True)


def ready(
    group: str, slice_name: str, *, idle_s: float | None = 0.0, for_job: str | None = None, pool: str = "v4"
) -> Managed:
    return Managed(
        group,
        pool,
        Phase.READY,
        SliceName(slice_name),
        idle_s=idle_s,
        for_job=JobId(for_job) if for_job else None,
    )


def creates(actions: list[object]) -> list[tuple[str, bool, str | None]]:
    return [(a.pool, a.spot, a.for_job) for a in actions if isinstance(a, Create)]


def deletes(actions: list[object]) -> list[str]:
    return [a.group for a in actions if isinstance(a, Delete)]


# name, fleet, pools, managed, expected creates, expected deletes
CASES = [
    (
        "a queued job with no slice of its type makes one",
        Fleet().tenant("a", v4=64).queued("j1", "a", "v4-8"),
        [POOL],
        [],
        [("v4", False, "j1")],
        [],
    ),
    (
        "a free slice serves it: nothing made",
        Fleet().slices("v4-8", 1).tenant("a", v4=64).queued("j1", "a", "v4-8"),
        [POOL],
        [],
        [],
        [],
    ),
    (
        "a slice being made serves it: nothing more made",
        Fleet().tenant("a", v4=64).queued("j1", "a", "v4-8"),
        [POOL],
        [Managed("v4-1", "v4", Phase.PENDING, for_job=JobId("j1"))],
        [],
        [],
    ),
    (
        "a multi-slice job gets whole slices: what is missing",
        Fleet().slices("v4-8", 1).tenant("a", v4=64).queued("j1", "a", "v4-8", num_slices=3),
        [POOL],
        [],
        [("v4", False, "j1"), ("v4", False, "j1")],
        [],
    ),
    (
        "never beyond max_slices: a job the pool cannot hold makes nothing",
        Fleet().tenant("a", v4=64).queued("j1", "a", "v4-8", num_slices=4),
        [POOL],
        [],
        [],
        [],
    ),
    (
        "max counts slices being made",
        Fleet().tenant("a", v4=64).queued("j1", "a", "v4-8").queued("j2", "a", "v4-8"),
        [replace(POOL, max_slices=1)],
        [Managed("v4-1", "v4", Phase.PENDING, for_job=JobId("j0"))],
        [],
        [],
    ),
    (
        "a job its tenant's quota does not allow makes nothing (4 chips each, quota 4)",
        Fleet().tenant("a", v4=4).queued("j1", "a", "v4-8").queued("j2", "a", "v4-8"),
        [POOL],
        [],
        [("v4", False, "j1")],
        [],
    ),
    (
        "a borrower makes slices out of quota another tenant leaves unused, after the jobs within quota",
        Fleet().tenant("a", v4=4).tenant("b", v4=8).queued("j1", "a", "v4-8").queued("j2", "a", "v4-8"),
        [POOL],
        [],
        [("v4", False, "j1"), ("v4", False, "j2")],
        [],
    ),
    (
        "borrowers together never go past the sum of the quotas (4 + 4 chips: one borrower of two)",
        Fleet()
        .tenant("a", v4=4)
        .tenant("b", v4=4)
        .queued("j1", "a", "v4-8")
        .queued("j2", "a", "v4-8")
        .queued("j3", "a", "v4-8"),
        [POOL],
        [],
        [("v4", False, "j1"), ("v4", False, "j2")],
        [],
    ),
    (
        "what a tenant holds counts against the quota it lends (b uses its 4 chips: nothing to lend)",
        Fleet()
        .slices("v4-8", 1)
        .tenant("a", v4=4)
        .tenant("b", v4=4)
        .running("r1", "b", "v4-8")
        .queued("j1", "a", "v4-8")
        .queued("j2", "a", "v4-8"),
        [POOL],
        [],
        [("v4", False, "j1")],
        [],
    ),
    (
        "a job within its quota queued after a borrower is served first",
        Fleet()
        .tenant("a", v4=4)
        .tenant("b", v4=4)
        .queued("j1", "a", "v4-8")
        .queued("j2", "a", "v4-8")
        .queued("j3", "b", "v4-8"),
        [replace(POOL, max_slices=2)],
        [],
        [("v4", False, "j1"), ("v4", False, "j3")],
        [],
    ),
    (
        "spot is preferred where a pool allows it",
        Fleet().tenant("a", v4=64).queued("j1", "a", "v4-8", num_slices=3),
        [POOL, SPOT],
        [],
        [("v4-spot", True, "j1"), ("v4-spot", True, "j1"), ("v4", False, "j1")],
        [],
    ),
    (
        "a pool below min_slices is filled up",
        Fleet().tenant("a", v4=64),
        [replace(POOL, min_slices=2)],
        [],
        [("v4", False, None), ("v4", False, None)],
        [],
    ),
    (
        "idle past the timeout and not needed: deleted",
        Fleet().slices("v4-8", 1).tenant("a", v4=64),
        [POOL],
        [ready("v4-1", "v4-8-0", idle_s=61)],
        [],
        ["v4-1"],
    ),
    (
        "idle, but not yet for the timeout: kept",
        Fleet().slices("v4-8", 1).tenant("a", v4=64),
        [POOL],
        [ready("v4-1", "v4-8-0", idle_s=59)],
        [],
        [],
    ),
    (
        "never below min_slices",
        Fleet().slices("v4-8", 2).tenant("a", v4=64),
        [replace(POOL, min_slices=1)],
        [ready("v4-1", "v4-8-0", idle_s=100), ready("v4-2", "v4-8-1", idle_s=90)],
        [],
        ["v4-1"],
    ),
    (
        "never a held slice",
        Fleet().slices("v4-8", 1).tenant("a", v4=64).running("r1", "a", "v4-8"),
        [POOL],
        [ready("v4-1", "v4-8-0", idle_s=100)],
        [],
        [],
    ),
    (
        "no flapping: a slice made for a job still queued stays",
        Fleet().slices("v4-8", 1).tenant("a", v4=0).queued("j1", "a", "v4-8"),
        [POOL],
        [ready("v4-1", "v4-8-0", idle_s=100, for_job="j1")],
        [],
        [],
    ),
    (
        "an idle slice a queued job needs is not deleted",
        Fleet().slices("v4-8", 1).tenant("a", v4=64).queued("j1", "a", "v4-8"),
        [POOL],
        [ready("v4-1", "v4-8-0", idle_s=100)],
        [],
        [],
    ),
    (
        "a failed request is retried after retry_after_s: deleted and made again",
        Fleet().tenant("a", v4=64).queued("j1", "a", "v4-8"),
        [POOL],
        [Managed("v4-1", "v4", Phase.FAILED, age_s=11, for_job=JobId("j1"))],
        [("v4", False, "j1")],
        ["v4-1"],
    ),
    (
        "a failed request is kept (its message shown) until retry_after_s",
        Fleet().tenant("a", v4=64).queued("j1", "a", "v4-8"),
        [POOL],
        [Managed("v4-1", "v4", Phase.FAILED, age_s=3, for_job=JobId("j1"))],
        [],
        [],
    ),
    (
        "a preempted slice is deleted and replaced for the requeued job",
        Fleet().slices("v4-8", 1).broken("v4-8-0").tenant("a", v4=64).queued("j1", "a", "v4-8"),
        [SPOT],
        [Managed("s-1", "v4-spot", Phase.GONE, SliceName("v4-8-0"), spot=True)],
        [("v4-spot", True, "j1")],
        ["s-1"],
    ),
    (
        "spare_slices: a type with no demand keeps that many free slices made",
        Fleet().tenant("a", v4=64),
        [replace(POOL, spare_slices=2)],
        [],
        [("v4", False, None), ("v4", False, None)],
        [],
    ),
    (
        "spares are counted after the demand: a free slice the queued job takes is no spare",
        Fleet().slices("v4-8", 1).tenant("a", v4=64).queued("j1", "a", "v4-8"),
        [replace(POOL, spare_slices=1)],
        [ready("v4-1", "v4-8-0", idle_s=600)],
        [("v4", False, None)],
        [],
    ),
    (
        "a slice being made that no job waits on, or one the floor makes, is a spare",
        Fleet().tenant("a", v4=64),
        [replace(POOL, spare_slices=2, min_slices=2)],
        [Managed("v4-1", "v4", Phase.PENDING)],
        [("v4", False, None)],  # the floor's second slice: with v4-1, the two spares
        [],
    ),
    (
        "the idle rule keeps the spares and deletes only what is beyond them",
        Fleet().slices("v4-8", 3).tenant("a", v4=64),
        [replace(POOL, spare_slices=2)],
        [
            ready("v4-1", "v4-8-0", idle_s=900),
            ready("v4-2", "v4-8-1", idle_s=600),
            ready("v4-3", "v4-8-2", idle_s=600),
        ],
        [],
        ["v4-1"],
    ),
    (
        "spares never go past max_slices",
        Fleet().tenant("a", v4=64),
        [replace(POOL, spare_slices=5)],
        [],
        [("v4", False, None)] * 3,
        [],
    ),
    (
        "slices of other types are not touched",
        Fleet().slices("v4-16", 1).tenant("a", v4=64).queued("j1", "a", "v4-16"),
        [POOL],
        [],
        [],
        [],
    ),
]


@pytest.mark.parametrize(
    ("fleet", "pools", "managed", "want_creates", "want_deletes"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_rules(fleet, pools, managed, want_creates, want_deletes):
    actions = autoscale(ScaleSnapshot(fleet.build(), pools, managed, idle_timeout_s=60, retry_after_s=10))
    assert creates(actions) == want_creates
    assert deletes(actions) == want_deletes


def test_private_slices_serve_only_their_tenant():
    snap = Fleet().slices("v4-8", 1).tenant("a", v4=64).tenant("b", v4=64).queued("j1", "b", "v4-8").build()
    private = {SliceName("v4-8-0"): TenantName("a")}
    got = plan(ScaleSnapshot(snap, [POOL], [], private=private))
    assert creates(got.actions) == [("v4", False, "j1")]  # a's private slice is not b's supply
    snap = Fleet().slices("v4-8", 1).tenant("a", v4=64).queued("j1", "a", "v4-8").build()
    assert autoscale(ScaleSnapshot(snap, [POOL], [], private=private)) == []


def test_with_borrowing_off_a_borrower_never_makes_a_slice_but_a_job_within_quota_does():
    snap = (
        Fleet()
        .tenant("a", v4=4)
        .tenant("b", v4=64)
        .queued("j1", "a", "v4-8")
        .queued("j2", "a", "v4-8")
        .build()
    )
    assert creates(autoscale(ScaleSnapshot(snap, [POOL], [], borrowing=False))) == [("v4", False, "j1")]
    assert creates(autoscale(ScaleSnapshot(snap, [POOL], []))) == [("v4", False, "j1"), ("v4", False, "j2")]


def test_a_borrower_takes_a_free_slice_so_the_idle_rule_keeps_it():
    snap = Fleet().slices("v4-8", 1).tenant("a", v4=0).tenant("b", v4=8).queued("j1", "a", "v4-8").build()
    idle = [ready("v4-1", "v4-8-0", idle_s=600)]
    assert autoscale(ScaleSnapshot(snap, [POOL], idle, idle_timeout_s=60)) == []
    assert deletes(autoscale(ScaleSnapshot(snap, [POOL], idle, idle_timeout_s=60, borrowing=False))) == [
        "v4-1"
    ]


def test_plan_says_which_jobs_wait_on_which_groups():
    snap = Fleet().tenant("a", v4=64).queued("j1", "a", "v4-8").queued("j2", "a", "v4-8").build()
    got = plan(ScaleSnapshot(snap, [POOL], [Managed("v4-1", "v4", Phase.PENDING, for_job=JobId("j1"))]))
    assert got.waiting == {"j1": ("v4-1",), "j2": ()}
    assert got.creating == {"j2": 1}


# -- simulation ---------------------------------------------------------------------------------


@dataclass
class _Slice:
    group: str
    pool: str
    phase: Phase
    ready_at: int  # cycle
    since: int  # cycle the phase (or idleness) began
    for_job: str | None
    spot: bool
    name: str


@pytest.mark.parametrize("seed", range(12))
def test_simulation_properties(seed):
    """A random workload against the real policy: the autoscaler never deletes a held slice, never
    exceeds max_slices, keeps min_slices once reached, and every feasible job is eventually served."""
    rng = random.Random(seed)
    pools = [
        PoolView("small", "v4-8", min_slices=rng.choice([0, 1]), max_slices=rng.randint(2, 4), spot=True),
        PoolView("small-od", "v4-8", min_slices=0, max_slices=rng.randint(0, 2)),
        PoolView("big", "v4-16", min_slices=0, max_slices=rng.randint(1, 3)),
    ]
    maxima = {"v4-8": sum(p.max_slices for p in pools[:2]), "v4-16": pools[2].max_slices}
    tenants = Fleet().tenant("a", v4=rng.choice([8, 16, 64])).tenant("b", v4=64).build().tenants
    managed: dict[str, _Slice] = {}
    jobs: dict[str, JobView] = {}
    remaining: dict[str, int] = {}  # running job -> cycles left
    served: set[str] = set()
    serial = 0
    for cycle in range(400):
        if cycle < 150 and rng.random() < 0.25:
            kind = rng.choice(["v4-8", "v4-16"])
            jid = f"j{len(jobs)}"
            n = rng.randint(1, 3)
            jobs[jid] = JobView(
                JobId(jid),
                TenantName(rng.choice("ab")),
                kind,
                n,
                rng.choice([0, 0, 1]),
                len(jobs),
                JobState.QUEUED,
            )
        for m in managed.values():  # provisioning takes 3 cycles
            if m.phase is Phase.PENDING and cycle >= m.ready_at:
                m.phase, m.since = Phase.READY, cycle
        holders = {s: j.id for j in jobs.values() if j.state is JobState.RUNNING for s in j.slices}
        views = [
            SliceView(
                SliceName(m.name),
                _type(pools, m.pool),
                SliceState.HELD if m.name in holders else SliceState.FREE,
                holders.get(m.name),
            )
            for m in managed.values()
            if m.phase is Phase.READY
        ]
        for m in managed.values():
            if m.phase is Phase.READY and m.name in holders:
                m.since = cycle  # idle counts from the last time it was held
        fleet = Snapshot(
            tenants, views, [j for j in jobs.values() if j.state in (JobState.QUEUED, JobState.RUNNING)]
        )
        scale = ScaleSnapshot(
            fleet,
            pools,
            [
                Managed(
                    m.group,
                    m.pool,
                    m.phase,
                    SliceName(m.name) if m.phase is Phase.READY else None,
                    m.spot,
                    float(cycle - m.since),
                    float(cycle - m.since) if m.phase is Phase.READY and m.name not in holders else None,
                    JobId(m.for_job) if m.for_job else None,
                )
                for m in managed.values()
            ],
            idle_timeout_s=10,
        )
        for action in autoscale(scale):
            if isinstance(action, Delete):
                gone = managed.pop(action.group)
                assert gone.name not in holders, f"cycle {cycle}: deleted held slice {gone.name}"
            else:
                serial += 1
                name = f"{action.pool}-{serial}"
                managed[name] = _Slice(
                    name, action.pool, Phase.PENDING, cycle + 3, cycle, action.for_job, action.spot, name
                )
        for pool in pools:
            live = sum(1 for m in managed.values() if m.pool == pool.name)
            assert live <= pool.max_slices, f"cycle {cycle}: pool {pool.name} has {live} > max"
            if cycle > 20:
                assert live >= pool.min_slices
        for d in decide(fleet):
            if isinstance(d, Admit):
                jobs[d.job] = replace(jobs[d.job], state=JobState.RUNNING, slices=d.slices)
                remaining[d.job] = rng.randint(1, 8)
                served.add(d.job)
        for jid in list(remaining):
            remaining[jid] -= 1
            if remaining[jid] <= 0:
                del remaining[jid]
                jobs[jid] = replace(jobs[jid], state=JobState.SUCCEEDED, slices=())
    quota = {t.name: t.quota.get("v4", 0) for t in tenants}
    for job in jobs.values():
        chips = {"v4-8": 4, "v4-16": 8}[job.accelerator_type] * job.num_slices
        # borrowing: a job beyond its tenant's quota is served out of the quota the other leaves
        feasible = job.num_slices <= maxima[job.accelerator_type] and chips <= sum(quota.values())
        if feasible:
            assert job.id in served, f"feasible job {job} never ran"
    # and, the queue drained, every pool went back to its minimum
    for pool in pools:
        assert sum(1 for m in managed.values() if m.pool == pool.name) == pool.min_slices


def _type(pools: list[PoolView], name: str) -> str:
    return next(p.accelerator_type for p in pools if p.name == name)
