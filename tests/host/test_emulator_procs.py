"""Processes found and ended by session, including children that left it, and the state file."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from tpufleet.emulator import procs
from tpufleet.emulator import state as store
from tpufleet.emulator.state import EmulatedSlice, FleetState, HostRecord

# A launcher with a plain child and a child that starts its own session (as `setsid` would).
LAUNCHER = """
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
time.sleep(60)
"""


def _wait_for(count: int, session: procs.Session) -> list[int]:
    deadline = time.monotonic() + 20
    while len(found := procs.members(session)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def test_kill_sessions_ends_the_session_and_a_child_that_left_it(tmp_path: Path) -> None:
    proc, session = procs.spawn([sys.executable, "-c", LAUNCHER], dict(os.environ), tmp_path / "log")
    found = _wait_for(3, session)
    assert len(found) == 3 and proc.pid in found
    assert os.getpid() not in found
    assert procs.kill_sessions([session], grace_s=0.5) == []
    proc.wait(timeout=10)
    assert procs.members(session) == []


def test_a_session_id_reused_by_someone_else_is_left_alone() -> None:
    me = procs._stat(os.getpid())
    assert me is not None
    # Pretend our own session leader was recorded with another start time: it is not ours.
    fake = procs.Session(me.sid, start_ticks=10**12)
    assert procs.members(fake) == []


def test_free_ports_are_distinct() -> None:
    ports = procs.free_ports(5)
    assert len(set(ports)) == 5 and all(p > 0 for p in ports)


def test_a_port_handed_out_is_not_handed_out_again_while_its_user_may_not_listen_yet() -> None:
    """A fleet draws its dashboard port, then its head's agent ports a moment later: the port
    drawn first is still free then (nothing listens on it yet), and was once drawn again, so Ray
    refused to start a head whose dashboard and runtime env agent had one port."""
    only = procs.free_port()
    again = procs.free_ports(1, candidates=[only])  # still free: nothing listens on it
    assert again != [only], f"port {only} was handed out twice"
    other = procs.free_ports(1, candidates=[only + 1, only + 2], exclude=[only + 1])
    assert other != [only + 1], "an excluded port was handed out"
    drawn = [p for _ in range(50) for p in procs.free_ports(3)]
    assert len(set(drawn)) == len(drawn), "a port was handed out twice within one process"


def test_the_default_candidates_are_every_port_of_the_range_once() -> None:
    """Drawn one at a time as asked for, then the rest shuffled: no port tried twice, none left out
    (a draw falls back to bind(0) only once the whole range is taken)."""
    for low, high in ((2000, 2010), (2000, 2000 + 4 * procs._RANDOM_TRIES)):
        drawn = list(procs._shuffled(low, high))
        assert sorted(drawn) == list(range(low, high))


def test_state_round_trips_through_the_file(tmp_path: Path) -> None:
    st = FleetState("id", "10.0.0.1", 6379, 8265, "/tmp/tpf-x", 2, 1 << 27, True, procs.Session(10, 20))
    st.slices.append(
        EmulatedSlice(
            "tpu-v4-16-0", "v4-16", [HostRecord(0, procs.Session(11, 21), "/t/h0"), HostRecord(1, None)]
        )
    )
    with store.locked(tmp_path):
        store.save(tmp_path, st)
    loaded = store.load(tmp_path)
    assert loaded == st
    assert loaded is not None and loaded.ray_address == "10.0.0.1:6379"
    assert loaded.sessions() == [procs.Session(10, 20), procs.Session(11, 21)]
    store.remove(tmp_path)
    assert store.load(tmp_path) is None
