"""Small builders shared by the executor's integration tests."""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from tpufleet.control.cluster import AttemptSpec, AttemptStatus, HostState, SliceInfo
from tpufleet.control.executor import RayCluster

T = TypeVar("T")
_ids = itertools.count()

# Prints the process environment as one JSON line, then whatever the test appends.
PRINT_ENV = "import json, os; print('ENV ' + json.dumps(dict(os.environ)), flush=True)"


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float = 60.0, every_s: float = 0.1) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(every_s)


def v4_slices(cluster: RayCluster, n: int) -> list[SliceInfo]:
    found = [s for s in cluster.inventory() if s.accelerator_type == "v4-16" and s.intact]
    assert len(found) >= n, f"the fleet has {len(found)} intact v4-16 slices, the test needs {n}"
    return found[:n]


def spec(slices: list[SliceInfo], code: str, **kw: object) -> AttemptSpec:
    job = f"t{os.getpid()}-{next(_ids)}"
    command = (sys.executable, "-c", code)
    return AttemptSpec(
        job_id=str(kw.pop("job_id", job)),
        attempt=int(kw.pop("attempt", 1)),  # type: ignore[call-overload]
        slices=tuple(s.name for s in slices),
        accelerator_type=slices[0].accelerator_type,
        command=command,
        checkpoint_dir=f"/tmp/tpufleet-test-ckpt/{job}",
        **kw,  # type: ignore[arg-type]
    )


def finished(cluster: RayCluster, s: AttemptSpec) -> AttemptStatus | None:
    st = cluster.poll(s.job_id, s.attempt)
    return st if all(h.state in (HostState.EXITED, HostState.LOST) for h in st.hosts) else None


def full_log(cluster: RayCluster, s: AttemptSpec, slice_name: str, worker: int) -> str:
    out, offset = [], 0
    while True:
        chunk = cluster.read_logs(s.job_id, s.attempt, slice_name, worker, offset)
        out.append(chunk.data)
        offset = chunk.next_offset
        if chunk.complete:
            return "".join(out)
        if not chunk.data:
            time.sleep(0.05)


def env_of(log: str) -> dict[str, str]:
    line = next(x for x in log.splitlines() if x.startswith("ENV "))
    env: dict[str, str] = json.loads(line[4:])
    return env


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
