"""``tpufleet emulate preempt SLICE --notice N`` after its notice was announced (issue 34, part 4):
``spot.wait_out`` waits out the deadline and kills the slice's hosts, or says the slice is gone when
the control plane, reacting to the notice, had it deleted meanwhile (the CLI then says so and exits
0, where it used to exit 2 "no slice ... in this fleet").

Without Ray: the fleet is its state file; the wait is an injected ``sleep`` on an injected clock,
during which the "control plane" acts as the emulator provider does when it deletes a slice
(``EmulatedFleet.remove``: the slice leaves the state file; ``spot.forget``: its notice goes).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tpufleet.control.cluster.memory import FakeClock
from tpufleet.emulator import spot
from tpufleet.emulator import state as fleet_state
from tpufleet.emulator.state import EmulatedSlice, FleetState, HostRecord

SLICE = "cheap-2-0"


def fleet(tmp_path: Path, clock: FakeClock, notice_s: float) -> float:
    """A fleet of one slice whose hosts are down already (nothing to kill, no process), with a notice."""
    hosts = [HostRecord(w, None) for w in range(2)]
    state = FleetState(
        "f", "127.0.0.1", 1, 2, str(tmp_path / "t"), 1, 0, False, None, [EmulatedSlice(SLICE, "v4-16", hosts)]
    )
    fleet_state.save(tmp_path, state)
    deadline = clock() + notice_s
    (tmp_path / spot.NOTICES_FILE).write_text(json.dumps({SLICE: {"deadline": deadline, "done": False}}))
    return deadline


def waiting(clock: FakeClock, meanwhile: Callable[[], None] = lambda: None) -> Callable[[float], None]:
    def sleep(seconds: float) -> None:
        meanwhile()
        clock.advance(seconds)

    return sleep


def test_a_slice_deleted_before_its_deadline_is_reported_gone(tmp_path: Path, clock: FakeClock) -> None:
    deadline = fleet(tmp_path, clock, notice_s=10)

    def control_plane_deletes_it() -> None:
        state = fleet_state.load(tmp_path)
        assert state is not None
        state.slices = [s for s in state.slices if s.name != SLICE]
        fleet_state.save(tmp_path, state)
        spot.forget(tmp_path, SLICE)

    sleep = waiting(clock, control_plane_deletes_it)
    assert spot.wait_out(tmp_path, SLICE, deadline, now=clock, sleep=sleep) is False
    assert clock() == deadline
    assert spot.read(tmp_path) == {}


def test_a_slice_still_there_at_its_deadline_is_preempted(tmp_path: Path, clock: FakeClock) -> None:
    deadline = fleet(tmp_path, clock, notice_s=10)
    assert spot.wait_out(tmp_path, SLICE, deadline, now=clock, sleep=waiting(clock)) is True
    assert spot.read(tmp_path)[SLICE].done  # reaped: a later restore is not undone
