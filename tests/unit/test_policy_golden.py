"""Large, messy fleets get exactly the decisions recorded before the policy was tuned for speed.

Each case builds a seeded snapshot (several types and spellings, broken and draining slices,
borrowers, preemptions in flight, jobs starting without a slice list, last cycle's heads of line,
unknown tenants and types, bad sizes, many tenants with quotas and weights) or runs a seeded
simulation, and compares a digest of every decision, in order and messages included, with the
digest the policy of commit 68c354b produced. A speed change must leave them all as they are; a
change of behaviour must come with its own rule test in test_policy.py and new digests here.

Those cases give every tenant ``preemption: never``, the behaviour of that commit. The same cases
with ``lower_priority`` (the default since tenants may preempt their own lower-priority jobs) have
digests of their own, recorded when that rule landed, with its rule tests in
test_policy_priority.py, and recorded again (with the ``lower_priority`` sweeps) when a job that
yields began to head its type and hold the quota it needs, so that its victims are not admitted and
preempted again (``test_no_job_is_preempted_twice_for_the_same_job``).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import replace

import pytest

from tpufleet.scheduler.model import (
    Admit,
    Decision,
    JobId,
    JobState,
    JobView,
    Preempt,
    SliceName,
    SliceState,
    SliceView,
    Snapshot,
    TenantName,
    TenantView,
    Wait,
)
from tpufleet.scheduler.policy import decide
from tpufleet.scheduler.simulate import SimJob, Simulation, make_fleet

TYPES = ("v4-16", "v4-32", "v5p-8", "v6e-4", "v6e-16", "v5litepod-16")
SPELLINGS = {"v4-16": "TPU-V4-16", "v6e-4": "v6e-4"}


def messy_snapshot(seed: int, per_type: int, queued: int, preemption: str = "never") -> Snapshot:
    rng = random.Random(seed)
    tenants = [
        TenantView(
            TenantName(f"t{i}"),
            {g: rng.choice([0, 0, 16, 64, 256]) for g in ("v4", "v5p", "v6e", "v5litepod")},
            rng.choice([1.0, 1.0, 2.0, 0.5]),
            preemption,
        )
        for i in range(12)
    ]
    names = [t.name for t in tenants]
    slices: list[SliceView] = []
    jobs: list[JobView] = []
    seq = 0
    for acc in TYPES:
        for i in range(rng.randint(per_type // 2, per_type)):
            roll, name = rng.random(), SliceName(f"{acc}-{i}")
            if roll < 0.04:
                slices.append(
                    SliceView(name, acc, SliceState.BROKEN if roll < 0.025 else SliceState.DRAINING)
                )
            elif roll < 0.8:
                seq += 1
                job = JobView(
                    JobId(f"r{seq}"), rng.choice(names), acc, 1, rng.randint(0, 3), seq,
                    rng.choice([JobState.RUNNING, JobState.RUNNING, JobState.STARTING]),
                    () if roll > 0.78 else (name,), borrowing=rng.random() < 0.4,
                    preempting=rng.random() < 0.05, admit_seq=rng.choice([seq, None]),
                )  # fmt: skip
                jobs.append(job)
                slices.append(SliceView(name, acc, SliceState.HELD, job.id))
            else:
                slices.append(SliceView(name, acc, SliceState.FREE))
    for i in range(queued):
        seq += 1
        roll = rng.random()
        acc = rng.choice(TYPES)
        job = JobView(
            JobId(f"q{i}"), rng.choice(names), SPELLINGS.get(acc, acc) if roll < 0.3 else acc,
            rng.choice([1, 1, 1, 1, 2, 2, 3, 4, 8]), rng.randint(0, 3), seq, JobState.QUEUED,
            head_of_line=rng.random() < 0.01,
        )  # fmt: skip
        if roll < 0.005:
            job = replace(job, tenant=TenantName("ghost"))
        elif roll < 0.01:
            job = replace(job, accelerator_type="v9-8")
        elif roll < 0.015:
            job = replace(job, num_slices=rng.choice([0, -2, per_type + 1, 500]))
        jobs.append(job)
    rng.shuffle(jobs)
    rng.shuffle(slices)
    return Snapshot(tenants, slices, jobs)


def with_seq_ties(snapshot: Snapshot, seed: int) -> Snapshot:
    """Most queued jobs share their seq with others (ids break the ties), in shuffled order."""
    rng = random.Random(seed)
    jobs = [
        replace(j, seq=j.seq // 4) if j.state == JobState.QUEUED and rng.random() < 0.7 else j
        for j in snapshot.jobs
    ]
    rng.shuffle(jobs)
    return Snapshot(snapshot.tenants, snapshot.slices, jobs)


def with_sweeps(snapshot: Snapshot, seed: int) -> Snapshot:
    """Each tenant's queued jobs mostly repeat its previous one (a sweep): long runs of jobs alike."""
    rng = random.Random(seed)
    last: dict[str, JobView] = {}
    jobs = []
    for j in sorted(snapshot.jobs, key=lambda j: j.seq):
        if j.state == JobState.QUEUED:
            before = last.get(j.tenant)
            if before is not None and rng.random() < 0.9:
                j = replace(j, accelerator_type=before.accelerator_type, num_slices=before.num_slices,
                            priority=before.priority)  # fmt: skip
            last[j.tenant] = j
        jobs.append(j)
    rng.shuffle(jobs)
    return Snapshot(snapshot.tenants, snapshot.slices, jobs)


def simulated(seed: int, count: int, preemption: str = "never") -> list[Decision]:
    rng = random.Random(seed)
    tenants = [
        TenantView(TenantName("prod"), {"v4": 128}, 1.0, preemption),
        TenantView(TenantName("research"), {"v4": 64}, 2.0, preemption),
        TenantView(TenantName("batch"), {}, 1.0, preemption),
    ]
    stream = [
        SimJob(f"j{i}", rng.choice(["prod", "research", "batch"]), rng.choice(["v4-16", "v4-16", "v4-32"]),
               num_slices=rng.choice([1, 1, 1, 2, 4]), priority=rng.choice([0, 0, 1]),
               arrival=i * 3 // 2, duration=rng.randint(2, 40))
        for i in range(count)
    ]  # fmt: skip
    seen: list[Decision] = []

    def recording(snapshot: Snapshot) -> list[Decision]:
        decisions = decide(snapshot)
        seen.extend(decisions)
        return decisions

    Simulation(tenants, make_fleet("v4-16:24,v4-32:8"), grace=2, policy=recording).run(stream)
    return seen


def digest(decisions: list[Decision]) -> str:
    rows: list[tuple[object, ...]] = []
    for d in decisions:
        if isinstance(d, Admit):
            rows.append(("Admit", d.job, d.slices, d.borrowing))
        elif isinstance(d, Preempt):
            rows.append(("Preempt", d.job, d.for_job, d.reason) + (("within",) if d.within_tenant else ()))
        else:
            assert isinstance(d, Wait)
            rows.append(("Wait", d.job, d.reason.code.value, d.reason.message, d.head_of_line))
    return f"{len(rows)}:" + hashlib.sha256(repr(rows).encode()).hexdigest()[:16]


EXPECTED_SNAPSHOTS: dict[tuple[int, int, int], str] = {
    (1, 40, 3000): "3016:5c281fab477af2f3",
    (2, 80, 6000): "6058:2addb82f285b94e0",
    (3, 12, 800): "810:f0b3336ab8fd058f",
    (4, 6, 300): "304:0d61261ccb0da02e",
    (5, 25, 1500): "1523:92a316c09bee021e",
    (6, 3, 60): "60:76aacc5d43013d43",
    (7, 200, 8000): "8039:4f4ce2e10f55774c",
    (10, 2, 40): "40:36a2fe907af18f92",
    (11, 3, 43): "44:f51f354c6c49f531",
    (12, 4, 46): "47:8ebb4e2201cb8b84",
    (13, 5, 49): "50:a701dc82c249a2f6",
    (14, 6, 52): "55:e183c2de1cb6ce10",
    (15, 2, 55): "55:78ee0501ded9211d",
    (16, 3, 58): "59:7ce72a6999e2cac7",
    (17, 4, 61): "68:f54a1acdaa90bd12",
    (18, 5, 64): "64:a3e90250b862cf90",
    (19, 6, 67): "69:7ae2b5d3f417be44",
    (20, 2, 70): "72:79cca1c23715b034",
    (21, 3, 73): "73:3f408c40579f82d5",
    (22, 4, 76): "77:18f197a5e5b273c9",
    (23, 5, 79): "83:26be4d07da72be38",
    (24, 6, 82): "83:84bdf91dc41a0e60",
    (25, 2, 85): "88:f8d40fc82a13e285",
    (26, 3, 88): "88:ac32d86bd8496b3b",
    (27, 4, 91): "92:a128b59d1fe2cfea",
    (28, 5, 94): "95:04e1f0999804ef57",
    (29, 6, 97): "101:2311580801c10064",
    (30, 2, 100): "101:ad29b2197bee7aa1",
    (31, 3, 103): "104:93edda5f23b6bc9b",
    (32, 4, 106): "107:0dbfe8bdf237aa08",
    (33, 5, 109): "110:ba68d42a799e30ee",
    (34, 6, 112): "117:ff04e6abf21731bd",
    (35, 2, 115): "115:9f8e6b5881eb84f8",
    (36, 3, 118): "118:c5b0aaafd203cecc",
    (37, 4, 121): "121:6e764c1c784374fb",
    (38, 5, 124): "127:0ae3792862c01022",
    (39, 6, 127): "129:f9975fad93fc22cf",
}
EXPECTED_TIES: dict[tuple[int, int, int], str] = {
    (1, 40, 3000): "3016:cc62ba2bafd91fdc",
    (3, 12, 800): "810:26662d52a1446fcb",
    (7, 200, 8000): "8039:79d3f90c1b153e1e",
    (40, 2, 130): "130:e5a776fb01da4075",
    (41, 3, 133): "134:b807aebc5c08ab47",
    (42, 4, 136): "138:dada5580bfa2a043",
    (43, 5, 139): "142:5729869b4e0a6868",
    (44, 6, 142): "144:46bfb0c98166e39f",
    (45, 2, 145): "147:3f44c3e5cac45298",
    (46, 3, 148): "149:60fff0cc28ddbadd",
    (47, 4, 151): "153:690994f383b06578",
    (48, 5, 154): "156:c08684ce6a2c9d5d",
    (49, 6, 157): "159:3260127ddf369663",
    (50, 2, 160): "161:bc6b28f3c711c1b9",
    (51, 3, 163): "163:7cdcd1f78d44d95c",
}
EXPECTED_SIMULATIONS: dict[tuple[int, int], str] = {
    (2, 600): "24022:1dddda0f59f1a653",
    (5, 400): "6738:e6816aa14683a8ac",
}


@pytest.mark.parametrize("case", sorted(EXPECTED_SNAPSHOTS))
def test_messy_snapshot_decisions_are_unchanged(case: tuple[int, int, int]) -> None:
    assert digest(decide(messy_snapshot(*case))) == EXPECTED_SNAPSHOTS[case]


@pytest.mark.parametrize("case", sorted(EXPECTED_SIMULATIONS))
def test_simulated_decisions_are_unchanged(case: tuple[int, int]) -> None:
    assert digest(simulated(*case)) == EXPECTED_SIMULATIONS[case]


@pytest.mark.parametrize("case", sorted(EXPECTED_TIES))
def test_decisions_with_shared_seqs_are_unchanged(case: tuple[int, int, int]) -> None:
    assert digest(decide(with_seq_ties(messy_snapshot(*case), case[0]))) == EXPECTED_TIES[case]


EXPECTED_PRIORITY_SNAPSHOTS: dict[tuple[int, int, int], str] = {
    (1, 40, 3000): "3020:06ce7cf3c155773a",
    (2, 80, 6000): "6075:c664a96619536665",
    (3, 12, 800): "810:775bd867b3d0f410",
    (5, 25, 1500): "1524:5009d4c8542302fb",
    (7, 200, 8000): "8060:1445b2b7506180a3",
}
EXPECTED_PRIORITY_SIMULATIONS: dict[tuple[int, int], str] = {
    (2, 600): "26193:22be0923f7c2ef84",
    (5, 400): "8635:8ad36b5b19ffdd14",
}


@pytest.mark.parametrize("case", sorted(EXPECTED_PRIORITY_SNAPSHOTS))
def test_messy_snapshot_decisions_with_priority_preemption_are_unchanged(case: tuple[int, int, int]) -> None:
    assert digest(decide(messy_snapshot(*case, "lower_priority"))) == EXPECTED_PRIORITY_SNAPSHOTS[case]


@pytest.mark.parametrize("case", sorted(EXPECTED_PRIORITY_SIMULATIONS))
def test_simulated_decisions_with_priority_preemption_are_unchanged(case: tuple[int, int]) -> None:
    assert digest(simulated(*case, "lower_priority")) == EXPECTED_PRIORITY_SIMULATIONS[case]


@pytest.mark.parametrize("case", [(1, 40, 3000), (7, 200, 8000), (13, 5, 49), (29, 6, 97)])
def test_jobs_handed_over_in_submission_order_get_the_same_decisions(case: tuple[int, int, int]) -> None:
    """The control plane's kept state hands the jobs over by seq, which lets the policy skip sorts."""
    digests = {"never": EXPECTED_SNAPSHOTS, "lower_priority": EXPECTED_PRIORITY_SNAPSHOTS}
    for preemption, expected in digests.items():
        if case not in expected:
            continue
        snap = messy_snapshot(*case, preemption)
        by_seq = Snapshot(snap.tenants, snap.slices, sorted(snap.jobs, key=lambda j: j.seq))
        assert digest(decide(by_seq)) == expected[case]


# Recorded with the policy of commit 79375fe, before the walk took jobs alike that are deferred
# as one run (order.walk): long runs of them, cut short by placements, in both preemption modes.
EXPECTED_SWEEPS: dict[tuple[int, int, int, str], str] = {
    (60, 4, 400, "never"): "402:4f61b440e5d2cc03",
    (61, 8, 1500, "never"): "1504:57e527a75e10e62c",
    (62, 20, 4000, "never"): "4014:8ad684488aceb1f2",
    (63, 3, 200, "never"): "200:2a86e4bc5080666d",
    (64, 5, 800, "lower_priority"): "801:b180df1b949e8cbf",
    (65, 8, 2000, "lower_priority"): "2009:b5727d14f651bbfb",
    (66, 20, 4000, "lower_priority"): "4013:bbb53a52401f6f4a",
    (67, 3, 300, "lower_priority"): "304:6ae6b8cf4756c33d",
}


@pytest.mark.parametrize("case", sorted(EXPECTED_SWEEPS))
def test_decisions_for_sweeps_of_jobs_alike_are_unchanged(case: tuple[int, int, int, str]) -> None:
    assert digest(decide(with_sweeps(messy_snapshot(*case), case[0]))) == EXPECTED_SWEEPS[case]
