"""What the soak promised, checked (docs/reliability.md): no job lost, none ran twice, no
placement group or job process leaked. Reads the hosts' markers (``hostjob.py``), the store's
view of each job (through the API), Ray's placement groups and ``/proc``."""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpufleet.chaos.plan import PlannedJob
from tpufleet.scheduler.lifecycle import TERMINAL_STATES, JobKind, JobState

TERMINAL = tuple(s for s in JobState if s in TERMINAL_STATES)  # the lifecycle's


def read_markers(job_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """Each attempt's host markers in ``job_dir`` (a marker being rewritten is skipped)."""
    by_attempt: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(job_dir.glob("chaos-*.json")):
        try:
            m = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        by_attempt.setdefault(int(m["attempt"]), []).append(m)
    return by_attempt


def overlaps(by_attempt: dict[int, list[dict[str, Any]]]) -> list[tuple[int, int]]:
    """Pairs ``(earlier, later)`` of attempts that ran at the same time: the later one's first host
    started before the earlier one's last sign of life (its last heartbeat or its end)."""
    spans = {
        a: (
            min(float(m["start"]) for m in ms),
            max(float(m.get("end") or m.get("beat") or m["start"]) for m in ms),
        )
        for a, ms in by_attempt.items()
        if ms
    }
    found = []
    for a in sorted(spans):
        for b in sorted(spans):
            if a < b and spans[b][0] < spans[a][1]:
                found.append((a, b))
    return found


def double_runs(job: dict[str, Any], by_attempt: dict[int, list[dict[str, Any]]]) -> list[str]:
    """Why ``job`` ran twice: overlapping attempts (markers) or a second successful attempt (store)."""
    why = [f"attempts {a} and {b} ran at the same time" for a, b in overlaps(by_attempt)]
    ok = [a["attempt"] for a in job.get("attempts") or () if a.get("state") == "SUCCEEDED"]
    if len(ok) > 1:
        why.append(f"attempts {', '.join(map(str, ok))} all succeeded")
    return why


def judge_jobs(
    jobs: list[PlannedJob],
    ids: dict[int, str],
    rejected: dict[int, str],
    job_of: Callable[[str], dict[str, Any]],
    checkpoints: Path,
) -> dict[str, Any]:
    """Each planned job's fate: ``succeeded`` (ids), ``ray_succeeded`` (a count), ``failed`` (with
    why), ``lost`` (never submitted, unknown to the store, or never ended) and ``double_runs``.
    ``job_of`` reads one job with its attempts from the API (NotFoundError if the store forgot it);
    ``checkpoints`` holds ``<tenant>/<job id>``, where the hosts left their markers."""
    from tpufleet.errors import NotFoundError

    succeeded, failed, lost, doubles = [], [], [], []
    ray_succeeded = 0
    for job in jobs:
        if job.index in rejected:
            failed.append({"name": job.name, "id": None, "reason": rejected[job.index]})
            continue
        jid = ids.get(job.index)
        if jid is None:
            lost.append({"name": job.name, "id": None, "why": "never submitted (server unreachable)"})
            continue
        try:
            full = job_of(jid)
        except NotFoundError:
            lost.append({"name": job.name, "id": jid, "why": "the store no longer knows it"})
            continue
        state = full["state"]
        if state not in TERMINAL:
            lost.append({"name": job.name, "id": jid, "why": f"never ended (still {state})"})
        elif state == "SUCCEEDED":
            succeeded.append(jid)
            ray_succeeded += job.kind == JobKind.RAY
        else:
            reason = full.get("reason") or full.get("reason_code") or state
            failed.append({"name": job.name, "id": jid, "state": state, "reason": reason, "kind": job.kind})
        why = double_runs(full, read_markers(checkpoints / job.tenant / jid))
        if why:
            doubles.append({"name": job.name, "id": jid, "why": why})
    return {
        "succeeded": succeeded,
        "ray_succeeded": ray_succeeded,
        "failed": failed,
        "lost": lost,
        "double_runs": doubles,
    }


def leaked_placement_groups(fleet: Any, admin: Any, settle_s: float = 60.0) -> list[dict[str, Any]]:
    """Placement groups Ray holds that are not the warm pool's of a FREE slice (slice and head
    groups, one each), once the pool settled (or ``settle_s`` passed)."""
    import ray
    from ray.util.placement_group import placement_group_table

    from tpufleet.control.ray.warmpool import head_pg_name, pg_name

    fleet.authenticate()
    ray.init(address=fleet.ray_address, logging_level=logging.ERROR, log_to_driver=False)
    try:
        deadline = time.monotonic() + settle_s
        while True:
            free = [s["name"] for s in admin.slices() if s["state"] == "FREE"]
            allowed = Counter({pg_name(n): 1 for n in free} | {head_pg_name(n): 1 for n in free})
            leaked = []
            for pg_id, row in sorted(placement_group_table().items()):
                if row.get("state") == "REMOVED":
                    continue
                name = row.get("name") or ""
                if allowed[name] > 0:
                    allowed[name] -= 1
                    continue
                leaked.append({"id": pg_id, "name": name, "state": row.get("state")})
            if not leaked or time.monotonic() > deadline:
                return leaked
            time.sleep(2.0)
    finally:
        ray.shutdown()


def procs_with(token: str) -> list[int]:
    """Host pids of live processes whose command line holds ``token`` (not bubblewrap's own: a
    jailed job has its own pid namespace, so it is found from this host's /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if token.encode() not in (entry / "cmdline").read_bytes():
                continue
            if os.path.basename(os.readlink(entry / "exe")) == "bwrap":
                continue
            stat = (entry / "stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":  # a zombie is dead
                continue
        except OSError:
            continue
        found.append(int(entry.name))
    return found


def leaked_processes(token: str, settle_s: float = 15.0) -> list[int]:
    """Job processes (``token`` in their command line) still alive after every job ended (given
    ``settle_s`` to go)."""
    deadline = time.monotonic() + settle_s
    while True:
        left = procs_with(token)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def reconnects(log_dir: Path) -> int:
    """How often the control plane started afresh on its own after losing the Ray head (its logs)."""
    return sum(
        log.read_text(errors="replace").count("was lost: waiting for Ray to answer again")
        for log in sorted(log_dir.rglob("serve-*.log"))
    )


def passed(result: dict[str, Any]) -> bool:
    """The soak's verdict: nothing lost, nothing ran twice, nothing leaked; with replicas, never
    two leaders acting at once (``overlapping_leaders``, ``fencing.py``)."""
    return not (
        result["lost"]
        or result["double_runs"]
        or result["leaked_placement_groups"]
        or result["leaked_processes"]
        or result.get("overlapping_leaders")
    )
