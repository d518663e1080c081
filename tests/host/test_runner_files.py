"""A run's files on its host: the tenant's checkpoint quota (measured by the runner, at the start and
while the run goes on), its empty run directories gone at the end, finished jobs' files removed."""

from __future__ import annotations

import os
from pathlib import Path

from test_runner import _log, _payload, _start, _wait, runner  # noqa: F401  (runner: the fixture, every mode)

from tpufleet.host.runner import HostRunner

MiB = 1 << 20

# Writes 1 MiB a step into its checkpoint directory, up to 64 MiB; prints each step.
FLOOD = (
    "import os, time\n"
    "ckpt = os.environ['TPUFLEET_CHECKPOINT_DIR']\n"
    "for i in range(64):\n"
    "    with open(os.path.join(ckpt, f'part-{i}'), 'wb') as f: f.write(os.urandom(1 << 20))\n"
    "    print('wrote', i, flush=True); time.sleep(0.05)\n"
    "print('all written', flush=True)\n"
)


def _tenant_dir(tmp_path: Path) -> Path:
    return tmp_path / "jobs" / "team-a"


def test_a_run_that_writes_past_its_tenants_quota_is_ended_with_the_reason(
    runner: HostRunner,  # noqa: F811
    tmp_path: Path,
) -> None:
    payload = _payload("flood", FLOOD)
    payload.update(checkpoint_quota=4 * MiB, checkpoint_check_s=0.1)
    _start(runner, payload)
    assert _wait(runner, "flood", "EXITED", timeout_s=30)[1] != 0
    report = runner.report("flood", 1)
    assert report["reason"] is not None, (_log(runner, "flood")[-500:], report)
    assert report["reason"].startswith("checkpoint quota exceeded: tenant 'team-a' uses ")
    assert "of its 4.0 MiB (serve --checkpoint-quota-gib)" in report["reason"]
    assert "all written" not in _log(runner, "flood") and report["reason"] in _log(runner, "flood")
    assert report["disk"]["bytes"] > 4 * MiB
    written = sum(f.stat().st_size for f in (_tenant_dir(tmp_path) / "flood").iterdir())
    assert written < 32 * MiB  # stopped long before its 64 MiB
    fresh = HostRunner("s", 1, runner.log_root)  # a later runner of the host: from beside the log
    assert fresh.report("flood", 1)["reason"] == report["reason"]


def test_a_tenant_already_over_its_quota_cannot_start_a_run(runner: HostRunner, tmp_path: Path) -> None:  # noqa: F811
    old = _tenant_dir(tmp_path) / "old-job"
    old.mkdir(parents=True)
    (old / "weights").write_bytes(os.urandom(3 * MiB))
    payload = _payload("late", "print('ran')")
    payload.update(checkpoint_quota=2 * MiB)
    _start(runner, payload)
    assert _wait(runner, "late", "EXITED") == ("EXITED", 127)
    report = runner.report("late", 1)
    assert "uses 3.0 MiB of its 2.0 MiB" in report["reason"] and "ran" not in _log(runner, "late")


def test_within_the_quota_a_run_ends_normally_and_reports_its_tenants_usage(
    runner: HostRunner,  # noqa: F811
) -> None:
    code = (
        "import os; open(os.path.join(os.environ['TPUFLEET_CHECKPOINT_DIR'], 'w'), 'wb').write(b'x' * 100000)"
    )
    payload = _payload("small", code + "\nimport time; time.sleep(0.5)")
    payload.update(checkpoint_quota=64 * MiB, checkpoint_check_s=0.1)
    _start(runner, payload)
    assert _wait(runner, "small", "EXITED") == ("EXITED", 0)
    report = runner.report("small", 1)
    assert report["reason"] is None and report["disk"]["bytes"] >= 100000


def test_a_run_leaves_no_empty_run_directories(runner: HostRunner, tmp_path: Path) -> None:  # noqa: F811
    _start(runner, _payload("tidy", "print('hi')"))
    assert _wait(runner, "tidy", "EXITED") == ("EXITED", 0)
    runs = _tenant_dir(tmp_path) / ".runs"
    assert not (runs / "tidy").exists()
    assert (_tenant_dir(tmp_path) / "tidy").is_dir()  # the checkpoint directory stays


def test_removing_finished_jobs_files_spares_others_and_links(runner: HostRunner, tmp_path: Path) -> None:  # noqa: F811
    tenant = _tenant_dir(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_bytes(b"k" * 5000)
    for job in ("done-1", "done-2", "live"):
        (tenant / job).mkdir(parents=True)
        (tenant / job / "ckpt").write_bytes(b"c" * 50000)
    (tenant / "done-1" / "escape").symlink_to(outside)  # a link inside: unlinked, never entered
    (tenant / "done-3").symlink_to(outside)  # a link where the directory was: removed as a link
    got = runner.remove_job_files(str(tmp_path / "jobs"), "team-a", ["done-1", "done-3", "never"])
    assert set(got["removed"]) == {"done-1", "done-3", "never"} and got["removed"]["done-1"] >= 50000
    assert sorted(p.name for p in tenant.iterdir()) == ["done-2", "live"]
    assert (outside / "keep").read_bytes() == b"k" * 5000
    assert got["disk"]["bytes"] >= 100000 and got["disk"]["complete"]
