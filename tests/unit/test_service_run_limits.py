"""The serve options that limit a job's run (processes, open files, log bytes) reach every attempt
the loop launches; the limits themselves are enforced on a host (tests/host/test_runner_limits.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from test_service import CONFIG, World

from tpufleet.control.loop.service import Service
from tpufleet.control.store.facade import Store
from tpufleet.host.runlimits import RunLimits


def test_serves_limits_reach_every_attempt(store: Store, tmp_path: Path) -> None:
    world = World(store, tmp_path / "state")
    config = replace(CONFIG, job_process_limit=77, job_open_files_limit=999, max_log_bytes=1234)
    world.service = Service(world.store, world.cluster, state_dir=world.state_dir, config=config)
    job = world.submit(world.tenant("a", v4=8))
    world.cycle()
    assert [(s.job_id, s.limits) for s in world.cluster.launches] == [(job, RunLimits(77, 999, 1234))]
