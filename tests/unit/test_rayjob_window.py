"""The Ray-job window's fences (control/rayjob.py), with Ray's placement-group calls recorded: no Ray."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tpufleet.control import rayjob
from tpufleet.control.cluster import AttemptSpec, HostInfo, SliceInfo
from tpufleet.control.rayjob import RayJobs, fence_name
from tpufleet.control.slices import SlicePool


def _slice(name: str) -> SliceInfo:
    hosts = tuple(HostInfo(w, f"node-{name}-{w}", "127.0.0.1", True) for w in range(2))
    return SliceInfo(name, "v4-16", "2x2x2", 2, hosts)


class _Jobs:
    """Ray's job submission as far as the window needs it: a submitted driver that stays PENDING."""

    def __init__(self) -> None:
        self.submitted: list[str] = []

    def submit_job(self, **kw: Any) -> None:
        self.submitted.append(kw["submission_id"])

    def get_job_info(self, _submission_id: str) -> Any:
        return SimpleNamespace(status="PENDING", message="", job_id=None)


@pytest.fixture
def fences(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    held: dict[str, object] = {}

    def placement_group(**kw: Any) -> object:
        handle = object()
        held[kw["name"]] = handle
        return handle

    def remove_placement_group(handle: object) -> None:
        for name, pg in list(held.items()):
            if pg is handle:
                del held[name]

    monkeypatch.setattr(rayjob, "placement_group", placement_group)
    monkeypatch.setattr(rayjob, "remove_placement_group", remove_placement_group)
    return held


def test_a_slice_that_comes_back_while_a_window_is_open_is_fenced_before_the_next_cycle(
    fences: dict[str, object],
) -> None:
    jobs = _Jobs()
    ray_jobs = RayJobs(SlicePool(), client=lambda: jobs)
    mine, other, back = _slice("tpu-v4-16-0"), _slice("tpu-v4-16-1"), _slice("tpu-v4-16-2")
    spec = AttemptSpec("job-1", 1, (mine.name,), "v4-16", ("python", "train.py"), kind="ray")
    ray_jobs.launch(spec, [mine])
    ray_jobs.advance({mine.name: mine, other.name: other})  # tpu-v4-16-2's hosts are down
    assert jobs.submitted == [rayjob.submission_id("job-1", 1)]
    assert set(fences) == {fence_name(other.name)}  # never the admitted slice's head
    # its hosts are back; the driver still waits for a head of the type: the next cycle fences it
    ray_jobs.advance({mine.name: mine, other.name: other, back.name: back})
    assert set(fences) == {fence_name(other.name), fence_name(back.name)}
