"""The split the control plane keeps between cycles is the one ``split`` makes of the same jobs.

``KeptQueues`` is changed one job at a time (arrivals, admissions, requeues with their old seq,
head-of-line flips, endings, jobs arriving out of submission order, queues with very many runs);
after every change its ``JobSet`` must iterate the jobs in submission order, its split must equal
``split`` of the same jobs, and every run boundary it kept must be the one ``run_ends`` finds. The
policy must make the same decisions from a ``JobSet`` as from a plain list of its jobs.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from tests.unit.test_policy_golden import messy_snapshot

from tpufleet.scheduler.model import JobId, JobState, JobView, Snapshot, TenantName
from tpufleet.scheduler.policy import decide
from tpufleet.scheduler.queues import MAX_KEPT_RUNS, JobSet, KeptQueues, Split, run_ends, split

STATES = (JobState.QUEUED, JobState.QUEUED, JobState.QUEUED, JobState.ADMITTED, JobState.RUNNING)


def assert_same_split(kept: Split, fresh: Split) -> None:
    """``kept`` is ``fresh`` (made by ``split``), and each run end it gives is where a run ends."""
    assert kept.active == fresh.active
    assert [(t, [j.id for j in q]) for t, q in kept.queues] == [
        (t, [j.id for j in q]) for t, q in fresh.queues
    ]
    assert kept.queues == fresh.queues
    queues = dict(kept.queues)
    assert kept.ends.keys() <= queues.keys()
    for tenant, ends in kept.ends.items():
        assert ends == run_ends(queues[tenant]), tenant


def _job(rng: random.Random, seq: int, tenants: int = 3, shapes: int = 2) -> JobView:
    return JobView(
        JobId(f"j{seq}"),
        TenantName(f"t{rng.randrange(tenants)}"),
        rng.choice(("v4-16", "v6e-16")[:shapes]),
        rng.choice((1, 1, 2)[: shapes + 1]),
        rng.choice((0, 0, 1)),
        seq,
        rng.choice(STATES),
        head_of_line=rng.random() < 0.05,
    )


def _check(kept: KeptQueues, jobs: dict[str, JobView]) -> None:
    got = kept.jobs()
    assert list(got) == sorted(jobs.values(), key=lambda j: (j.seq, j.id))
    assert len(got) == len(jobs) == len(kept)
    assert_same_split(got.split, split(jobs.values()))


@pytest.mark.parametrize("seed", range(12))
def test_a_kept_split_is_the_split_of_the_same_jobs_after_every_change(seed: int) -> None:
    rng = random.Random(seed)
    seq = 0
    jobs: dict[str, JobView] = {}
    for _ in range(rng.randrange(0, 40)):
        seq += 1
        view = _job(rng, seq)
        jobs[view.id] = view
    kept = KeptQueues(rng.sample(list(jobs.values()), len(jobs)))  # any order in
    _check(kept, jobs)
    for _ in range(150):
        roll = rng.random()
        if roll < 0.3 or not jobs:  # arrivals, now and then one that was submitted earlier
            seq += 1
            view = _job(rng, seq if rng.random() < 0.9 else rng.randrange(-50, seq))
            view = replace(view, id=JobId(f"j{seq}"))
        else:
            old = jobs[rng.choice(sorted(jobs))]
            if roll < 0.45:
                kept.drop(old.id)  # ended
                del jobs[old.id]
                _check(kept, jobs)
                continue
            if roll < 0.6:
                view = replace(old, head_of_line=not old.head_of_line)
            elif roll < 0.8:
                view = replace(old, state=rng.choice(STATES))  # admitted, requeued (same seq), ...
            else:
                view = replace(old, priority=rng.choice((0, 1, 2)), num_slices=rng.choice((1, 2)))
        kept.put(view)
        jobs[view.id] = view
        _check(kept, jobs)
    kept.drop("not-a-job")  # nothing happens
    _check(kept, jobs)


def test_a_queue_of_very_many_runs_keeps_no_ends_until_it_has_fewer() -> None:
    rng = random.Random(3)
    jobs = {}
    for seq in range(1, 2 * MAX_KEPT_RUNS + 10):  # alternating shapes: a run per job
        view = JobView(JobId(f"j{seq}"), TenantName("a"), "v4-16", 1 + seq % 2, 0, seq, JobState.QUEUED)
        jobs[view.id] = view
    kept = KeptQueues(jobs.values())
    assert kept.jobs().split.ends == {}
    _check(kept, jobs)
    for job_id in [j for j, v in jobs.items() if v.num_slices == 2]:  # the 2-slice jobs are admitted
        view = replace(jobs[job_id], state=JobState.ADMITTED)
        kept.put(view)
        jobs[job_id] = view
    assert kept.jobs().split.ends == {TenantName("a"): [len(jobs) // 2]}  # one run again
    _check(kept, jobs)
    for seq in range(10_000, 10_000 + 2 * MAX_KEPT_RUNS):  # many runs again, one arrival at a time
        size = 1 + seq % 2 if rng.random() < 0.9 else 3
        view = JobView(JobId(f"j{seq}"), TenantName("a"), "v4-16", size, 0, seq, JobState.QUEUED)
        kept.put(view)
        jobs[view.id] = view
    assert kept.jobs().split.ends == {}  # past the cap again: the policy finds the runs itself
    _check(kept, jobs)


@pytest.mark.parametrize("case", [(1, 60, 400), (2, 30, 2000), (5, 80, 3000)])
def test_the_policy_decides_the_same_from_a_job_set_as_from_a_list(case: tuple[int, int, int]) -> None:
    snapshot = messy_snapshot(*case, "lower_priority")
    rng = random.Random(case[0])
    kept = KeptQueues(snapshot.jobs)
    for view in rng.sample(list(snapshot.jobs), len(snapshot.jobs) // 10):  # flips and re-puts
        kept.put(replace(view, head_of_line=not view.head_of_line) if rng.random() < 0.2 else view)
    jobs = kept.jobs()
    assert isinstance(jobs, JobSet)
    with_set = replace(snapshot, jobs=jobs)
    with_list = replace(snapshot, jobs=list(jobs))
    assert decide(with_set) == decide(with_list)
    assert isinstance(with_set, Snapshot)
