"""``tpufleet chaos --replicas 2 --sandbox``, short and seeded: two ``serve --sandbox`` replicas on one
PostgreSQL database, a minute of leader faults (the leader SIGKILLed, SIGSTOPped past its lease then
SIGCONTed, SIGTERMed, both replicas killed together; each brought back), then the verdict: nothing
lost, nothing run twice, nothing leaked, and never two leaders acting at once, read from the fencing
tokens the store's records carry.

No Ray: each replica serves an in-memory fleet (nothing is executed), so the soak is cheap: about
17 CPU-seconds of the soak and its replicas on a 2-core machine (the database's own aside), printed
below. The soak runs as a subprocess and stops what it started by PID.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from dbserver import PostgresServer

from tpufleet.chaos import procs_with
from tpufleet.chaos.plan import LEADER_FAULTS


def _cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def test_a_short_seeded_soak_with_two_replicas_never_has_two_leaders(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    db = postgres_server.new_database(migrated=True)
    cmd = [sys.executable, "-m", "tpufleet", "chaos", "--replicas", "2", "--db", db, "--sandbox", "v4-16:2"]
    cmd += ["--seed", "3", "--jobs", "8", "--minutes", "1", "--drain-timeout", "120", "--json"]
    cmd += ["--state-dir", str(tmp_path / "soak")]
    cpu, wall = _cpu_of_children(), time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    cpu, wall = _cpu_of_children() - cpu, time.monotonic() - wall
    print(f"soak: {wall:.0f} s, {cpu:.1f} CPU-seconds (the soak and its replicas)")
    assert proc.stdout.strip(), proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    keys = ("failed", "lost", "double_runs", "overlapping_leaders", "fault_errors", "faults")
    detail = json.dumps({k: result[k] for k in keys})
    assert proc.returncode == 0, f"{detail}\n{proc.stderr[-3000:]}"
    assert result["succeeded"] == result["jobs"] == 8, detail  # a sandbox job always succeeds
    assert result["lost"] == result["double_runs"] == result["overlapping_leaders"] == [], detail
    assert result["leaked_placement_groups"] == result["leaked_processes"] == [], detail
    faults = result["faults"]
    assert all(faults.get(kind) == 1 for kind in LEADER_FAULTS), faults  # a minute: one of each
    assert faults["replica_cont"] == 1 and faults["replicas_restart"] == 1, faults
    assert faults["replica_restart"] == 2, faults  # after the SIGKILL and the SIGTERM
    assert result["control_plane_starts"] == 2 + 2 + 2  # both, the two brought back, both again
    assert result["terms"] >= 5, detail  # the first, and one after each leader fault at least
    assert result["stamped_writes"] > 8 * 3, detail  # each job's admission, launch and end at least
    assert result["fault_errors"] == []
    assert procs_with(str(tmp_path / "soak")) == []  # every replica it started is gone
