"""``Waits.each`` builds the same Wait values as the dataclass's own ``__init__``, only faster, and
``expand`` puts them in place of their run."""

from __future__ import annotations

import dataclasses

import pytest

from tpufleet.scheduler.model import (
    Admit,
    JobId,
    JobState,
    JobView,
    NotFit,
    NotFitCode,
    SliceName,
    TenantName,
    Wait,
    Waits,
    expand,
)

REASON = NotFit(NotFitCode.WAITING_FOR_FREE_SLICES, "needs 1 v4-16 slice, 0 free")


def _view(i: int) -> JobView:
    return JobView(JobId(f"j{i}"), TenantName("a"), "v4-16", 1, 0, i, JobState.QUEUED)


def test_each_wait_of_a_run_equals_hashes_and_prints_as_built_one_by_one() -> None:
    views = tuple(_view(i) for i in range(5))
    fast = Waits(views, REASON).each()
    slow = [Wait(v.id, REASON) for v in views]
    assert fast == slow
    assert [hash(w) for w in fast] == [hash(w) for w in slow]
    assert [repr(w) for w in fast] == [repr(w) for w in slow]
    assert all(type(w) is Wait and w.head_of_line is False for w in fast)
    assert Waits((), REASON).each() == []


def test_the_waits_of_a_run_stay_frozen() -> None:
    (w,) = Waits((_view(1),), REASON).each()
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.job = JobId("other")  # type: ignore[misc]


def test_expand_puts_each_runs_waits_in_its_place() -> None:
    admit = Admit(JobId("a"), (SliceName("v4-16-0"),), False)
    head = Wait(JobId("h"), REASON, head_of_line=True)
    runs = [head, Waits((_view(1), _view(2)), REASON), admit, Waits((_view(3),), REASON)]
    assert expand(runs) == [
        head,
        Wait(JobId("j1"), REASON),
        Wait(JobId("j2"), REASON),
        admit,
        Wait(JobId("j3"), REASON),
    ]
    assert expand([]) == []
