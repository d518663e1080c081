"""The Ray-job window's fences (control/ray/jobs.py), with Ray's placement-group calls recorded: no Ray."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from tpufleet.control.cluster.protocol import AttemptSpec, HostInfo, SliceInfo
from tpufleet.control.ray import jobs as rayjob
from tpufleet.control.ray.jobs import RayJobs, fence_name


def _slice(name: str) -> SliceInfo:
    hosts = tuple(HostInfo(w, f"node-{name}-{w}", "127.0.0.1", True) for w in range(2))
    return SliceInfo(name, "v4-16", "2x2x2", 2, hosts)


class _Pool:
    """The warm pool as far as the window uses it, holding nothing: a real ``SlicePool`` asks Ray's
    placement-group table on ``release``, which in a process without Ray starts a local cluster."""

    def __init__(self) -> None:
        self.released: list[str] = []

    def get(self, _name: str) -> None:
        return None

    def release(self, name: str) -> None:
        self.released.append(name)


class _Jobs:
    """Ray's job submission as far as the window needs it: a submitted driver that stays PENDING."""

    def __init__(self) -> None:
        self.submitted: list[str] = []

    def submit_job(self, **kw: Any) -> None:
        self.submitted.append(kw["submission_id"])

    def get_job_info(self, _submission_id: str) -> Any:
        return SimpleNamespace(status="PENDING", message="", job_id=None)


class _Placements:
    """Ray's placement-group calls as the window makes them, recorded: ``held`` is every fence by name,
    ``groups`` what Ray's table says each driver (Ray job id) placed."""

    def __init__(self) -> None:
        self.held: dict[str, object] = {}
        self.groups: dict[str, list[dict[str, Any]]] = {}

    def create(self, **options: Any) -> object:
        handle = object()
        self.held[options["name"]] = handle
        return handle

    def remove(self, handle: object) -> None:
        for name, pg in list(self.held.items()):
            if pg is handle:
                del self.held[name]

    def remove_id(self, pg_id: str) -> None:
        for groups in self.groups.values():
            groups[:] = [g for g in groups if g["id"] != pg_id]

    def of_job(self, ray_job: str) -> list[dict[str, Any]]:
        return list(self.groups.get(ray_job, []))

    def existing(self, prefixes: tuple[str, ...]) -> dict[str, object]:
        return {n: pg for n, pg in self.held.items() if n.startswith(prefixes)}


@pytest.fixture
def fences() -> _Placements:
    return _Placements()


def test_a_slice_that_comes_back_while_a_window_is_open_is_fenced_before_the_next_cycle(
    fences: _Placements,
) -> None:
    jobs = _Jobs()
    ray_jobs = RayJobs(_Pool(), client=lambda: jobs, placements=fences)  # type: ignore[arg-type]
    mine, other, back = _slice("tpu-v4-16-0"), _slice("tpu-v4-16-1"), _slice("tpu-v4-16-2")
    spec = AttemptSpec("job-1", 1, (mine.name,), "v4-16", ("python", "train.py"), kind="ray")
    ray_jobs.launch(spec, [mine])
    ray_jobs.advance({mine.name: mine, other.name: other})  # tpu-v4-16-2's hosts are down
    assert jobs.submitted == [rayjob.submission_id("job-1", 1)]
    assert set(fences.held) == {fence_name(other.name)}  # never the admitted slice's head
    # its hosts are back; the driver still waits for a head of the type: the next cycle fences it
    ray_jobs.advance({mine.name: mine, other.name: other, back.name: back})
    assert set(fences.held) == {fence_name(other.name), fence_name(back.name)}


class _Started(_Jobs):
    """A driver Ray has started (it has a Ray job id), so its placement groups are checked."""

    def get_job_info(self, _submission_id: str) -> Any:
        return SimpleNamespace(status="RUNNING", message="", job_id="02000000")


def _trainer_head_on(fences: _Placements, info: SliceInfo, resource: str) -> None:
    """Ray's placement-group table: the driver's one group has a bundle on ``info``'s first host."""
    bundle = (info.hosts[0].node_id, {resource: 1.0})
    fences.groups["02000000"] = [{"id": "ab" * 14, "name": "", "bundles": [bundle]}]


@pytest.mark.parametrize(
    ("where", "resource", "requeued"),
    [
        ("back", "TPU-v4-16-head", True),  # the race: a head freed by hosts that came back mid-window
        ("other", "TPU-v4-16-head", False),  # a slice held (fenced) when the window opened
        ("back", "TPU", False),  # not a head: chips taken on another slice are the job's own doing
    ],
)
def test_a_trainer_on_a_slice_that_came_back_during_its_window_is_requeued_any_other_misplacement_fails(
    fences: _Placements, where: str, resource: str, requeued: bool
) -> None:
    ray_jobs = RayJobs(_Pool(), client=_Started, placements=fences)  # type: ignore[arg-type]
    mine, other, back = _slice("tpu-v4-16-0"), _slice("tpu-v4-16-1"), _slice("tpu-v4-16-2")
    down = replace(back, hosts=tuple(replace(h, alive=False) for h in back.hosts), problems=("hosts down",))
    assert not down.intact
    ray_jobs.launch(AttemptSpec("job-1", 1, (mine.name,), "v4-16", ("python", "t.py"), kind="ray"), [mine])
    ray_jobs.advance({mine.name: mine, other.name: other, back.name: down})  # the window opens
    _trainer_head_on(fences, {"back": back, "other": other}[where], resource)
    ray_jobs.advance({mine.name: mine, other.name: other, back.name: back})  # its hosts are back
    status = ray_jobs.status(("job-1", 1), dead_nodes=set())
    name = {"back": back, "other": other}[where].name
    if requeued:
        assert status.interrupted is not None and name in status.interrupted
        assert "came back while this job's window was open" in status.interrupted
        assert status.failure is None
    else:
        assert status.interrupted is None
        assert status.failure is not None and f"on {name}, outside the admitted slices" in status.failure


def test_a_restarted_control_plane_keeps_an_adopted_jobs_fences_and_removes_the_ones_left_stray(
    fences: _Placements,
) -> None:
    """Fences are detached, so a killed control plane leaves them in Ray; the next one takes them
    over by name. One left on a slice no live Ray job holds would keep that slice's head forever."""
    mine, stray = _slice("tpu-v4-16-0"), _slice("tpu-v4-16-1")
    left = {fence_name(mine.name): object(), fence_name(stray.name): object()}
    fences.held.update(left)  # what Ray holds after the kill
    ray_jobs = RayJobs(_Pool(), client=_Started, placements=fences)  # type: ignore[arg-type]
    ray_jobs.take_over_fences()
    ray_jobs.adopt(("job-1", 1), [mine], "v4-16")  # its driver still runs: its slice stays fenced
    ray_jobs.drop_stray_fences()
    assert fences.held == {fence_name(mine.name): left[fence_name(mine.name)]}  # the same group, not a second
    ray_jobs.release_fences()  # and teardown removes the one it took over
    assert fences.held == {}
