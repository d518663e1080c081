"""Small builders shared by the executor's integration tests."""

from __future__ import annotations

import atexit
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tpufleet.control.cluster.protocol import AttemptSpec, AttemptStatus, HostState, SliceInfo
from tpufleet.control.ray.client import RayExecutor
from tpufleet.host.jobfiles import run_paths

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


def v4_slices(cluster: RayExecutor, n: int) -> list[SliceInfo]:
    found = [s for s in cluster.inventory() if s.accelerator_type == "v4-16" and s.intact]
    assert len(found) >= n, f"the fleet has {len(found)} intact v4-16 slices, the test needs {n}"
    return found[:n]


# Where the runners put jobs' files (<root>/<tenant>/<job>); a jailed job sees only its tenant's part.
# Made at import, by every pytest process that imports this module, and removed as that process exits.
JOB_ROOT = tempfile.mkdtemp(prefix="tpufleet-test-jobs-")
atexit.register(shutil.rmtree, JOB_ROOT, ignore_errors=True)
TENANT = "itest"


def spec(slices: list[SliceInfo], code: str, **kw: object) -> AttemptSpec:
    job = str(kw.pop("job_id", f"t{os.getpid()}-{next(_ids)}"))
    attempt = int(kw.pop("attempt", 1))  # type: ignore[call-overload]
    command = (sys.executable, "-c", code)
    return AttemptSpec(
        job_id=job,
        attempt=attempt,
        slices=tuple(s.name for s in slices),
        accelerator_type=slices[0].accelerator_type,
        command=command,
        tenant=TENANT,
        job_root=JOB_ROOT,
        checkpoint_dir=str(run_paths(JOB_ROOT, TENANT, job, attempt, "-").checkpoint),
        **kw,  # type: ignore[arg-type]
    )


def flag(name: str) -> Path:
    """A file in the test tenant's directory: the one place a jailed job shares with the test."""
    return Path(JOB_ROOT) / TENANT / name


def token() -> str:
    return f"tok-{uuid.uuid4().hex}"


def procs_with(tok: str) -> list[int]:
    """Host pids of the live job processes whose command line holds ``tok`` (not their jails:
    inside its jail a job has its own pids, so tests find its processes from the host's /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and tok.encode() in (entry / "cmdline").read_bytes()
                and os.path.basename(os.readlink(entry / "exe")) != "bwrap"
                and pid_alive(int(entry.name))
            ):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def finished(cluster: RayExecutor, s: AttemptSpec) -> AttemptStatus | None:
    st = cluster.poll(s.job_id, s.attempt)
    return st if all(h.state in (HostState.EXITED, HostState.LOST) for h in st.hosts) else None


def full_log(cluster: RayExecutor, s: AttemptSpec, slice_name: str, worker: int) -> str:
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
