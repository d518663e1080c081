"""The pure parts of a job's files on a host: the size walk, the quota decision, removal rules."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tpufleet.host import jobfiles
from tpufleet.host.jobfiles import DiskUsage, measure, quota_problem, size_text

MiB = 1 << 20


def _tree(root: Path) -> None:
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "one").write_bytes(b"1" * 100_000)
    (root / "a" / "b" / "two").write_bytes(b"2" * 300_000)


def test_measure_counts_bytes_on_disk_of_every_entry(tmp_path: Path) -> None:
    _tree(tmp_path / "t")
    got = measure(tmp_path / "t", clock=lambda: 42.0)
    assert got.complete and got.entries == 5 and got.at == 42.0  # t, a, b, one, two
    assert 400_000 <= got.bytes < 400_000 + 64 * 4096


def test_measure_never_follows_links_and_counts_hard_links_once(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"x" * (4 * MiB))
    t = tmp_path / "t"
    t.mkdir()
    (t / "to-dir").symlink_to(outside)
    (t / "to-file").symlink_to(outside / "big")
    (t / "f").write_bytes(b"y" * MiB)
    os.link(t / "f", t / "f-again")
    got = measure(t)
    assert MiB <= got.bytes < 2 * MiB


def test_measure_is_bounded_and_says_when_it_stopped(tmp_path: Path) -> None:
    t = tmp_path / "t"
    t.mkdir()
    for i in range(50):
        (t / str(i)).touch()
    got = measure(t, max_entries=10)
    assert not got.complete and got.entries == 10
    missing = measure(tmp_path / "missing")
    assert (missing.bytes, missing.entries, missing.complete) == (0, 0, True)


@pytest.mark.parametrize(
    ("usage", "quota", "expected"),
    [
        (DiskUsage(5 * MiB, 3), None, None),
        (DiskUsage(5 * MiB, 3), 5 * MiB, None),
        (
            DiskUsage(int(1.2 * (1 << 30)), 3),
            1 << 30,
            "checkpoint quota exceeded: tenant 'research' uses 1.2 GiB of its 1.0 GiB "
            "(serve --checkpoint-quota-gib); delete old checkpoints or ask the operator",
        ),
        (
            DiskUsage(MiB, 1_000_000, complete=False),
            1 << 30,
            "checkpoint quota exceeded: tenant 'research' keeps more than 1,000,000 files and directories "
            "(at least 1.0 MiB of its 1.0 GiB (serve --checkpoint-quota-gib)); delete old checkpoints or "
            "ask the operator",
        ),
    ],
    ids=["no-quota", "at-quota", "over", "walk-stopped"],
)
def test_quota_decision(usage: DiskUsage, quota: int | None, expected: str | None) -> None:
    assert quota_problem("research", usage, quota) == expected


@pytest.mark.parametrize(
    ("n", "text"), [(0, "0 bytes"), (1023, "1023 bytes"), (1536, "1.5 KiB"), (5 * MiB, "5.0 MiB")]
)
def test_size_text(n: int, text: str) -> None:
    assert size_text(n) == text


def test_disk_usage_from_a_host_is_checked() -> None:
    good = DiskUsage(10, 2, True, 5.0)
    assert DiskUsage.from_dict(good.to_dict()) == good
    for bad in (None, [], {"bytes": -1, "entries": 0, "complete": True, "at": 1.0},
                {"bytes": True, "entries": 0, "complete": True, "at": 1.0},
                {"bytes": 1, "entries": 0, "complete": "yes", "at": 1.0}):  # fmt: skip
        assert DiskUsage.from_dict(bad) is None


def test_empty_run_directories_go_but_not_a_busy_one(tmp_path: Path) -> None:
    mine = jobfiles.run_paths(str(tmp_path), "t", "job", 2, "s-0")
    other = jobfiles.run_paths(str(tmp_path), "t", "job", 2, "s-1")
    for p in (mine.run, other.run):
        p.mkdir(parents=True)
    mine.run.rmdir()
    jobfiles.remove_run_dirs(mine)
    assert other.run.is_dir()  # another host of the attempt still runs
    other.run.rmdir()
    jobfiles.remove_run_dirs(other)
    assert not (tmp_path / "t" / ".runs" / "job").exists()


def test_removing_a_job_dir_refuses_bad_names_and_spares_busy_jobs(tmp_path: Path) -> None:
    (tmp_path / "t" / "busy").mkdir(parents=True)
    with pytest.raises(jobfiles.JobFilesError):
        jobfiles.remove_job_dir(str(tmp_path), "t", "..")
    assert jobfiles.remove_jobs(str(tmp_path), "t", ["busy"], busy=["busy"]) == {}
    assert (tmp_path / "t" / "busy").is_dir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "j").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "elsewhere")  # a tenant directory that is a link
    assert jobfiles.remove_job_dir(str(tmp_path), "linked", "j") == 0
    assert (tmp_path / "elsewhere" / "j").is_dir()
