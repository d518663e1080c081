"""``model.waits`` builds the same Wait values as the dataclass's own ``__init__``, only faster."""

from __future__ import annotations

import dataclasses

import pytest

from tpufleet.scheduler.model import JobId, JobState, JobView, NotFit, NotFitCode, TenantName, Wait, waits

REASON = NotFit(NotFitCode.WAITING_FOR_FREE_SLICES, "needs 1 v4-16 slice, 0 free")


def _view(i: int) -> JobView:
    return JobView(JobId(f"j{i}"), TenantName("a"), "v4-16", 1, 0, i, JobState.QUEUED)


def test_waits_equal_hash_and_print_as_built_one_by_one() -> None:
    views = [_view(i) for i in range(5)]
    fast = waits(views, REASON)
    slow = [Wait(v.id, REASON) for v in views]
    assert fast == slow
    assert [hash(w) for w in fast] == [hash(w) for w in slow]
    assert [repr(w) for w in fast] == [repr(w) for w in slow]
    assert all(type(w) is Wait and w.head_of_line is False for w in fast)
    assert waits([], REASON) == []


def test_waits_stay_frozen() -> None:
    (w,) = waits([_view(1)], REASON)
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.job = JobId("other")  # type: ignore[misc]
