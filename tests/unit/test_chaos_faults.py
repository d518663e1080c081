"""The soak's fault thread (``chaos/faults.py``) on a stand-in fleet and control plane: what comes
due while the Ray head is down waits for the fleet instead of being skipped, so a slow restart
changes when a fault lands, not which."""

from __future__ import annotations

import random
from collections.abc import Callable

from tpufleet.chaos.faults import Faults
from tpufleet.chaos.plan import HEAD_KILL, Event


class Clock:
    """Seconds into the window, two seconds further at each look (no test waits for real)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 2.0
        return self.t


class Fleet:
    """Records what was done to it; its restart is slow (a restart
    raises until it was tried that many times, as a busy machine's does)."""

    def __init__(self, failed_restarts: int) -> None:
        self.slice_names = ["tpu-v4-8-0"]
        self.done: list[str] = []
        self.failed_restarts = failed_restarts

    def down_hosts(self) -> set[str]:
        return set()

    def kill_head(self) -> None:
        self.done.append("kill_head")

    def restart(self) -> None:
        if self.failed_restarts:
            self.failed_restarts -= 1
            raise RuntimeError("the head does not answer yet")
        self.done.append("restart")


class Server:
    def __init__(self, fleet: Fleet) -> None:
        self.fleet, self.up = fleet, True

    def killable(self) -> bool:
        return self.up

    def kill(self, sig: int) -> None:
        self.up = False
        self.fleet.done.append("kill_server")

    def start(self) -> None:
        self.up = True
        self.fleet.done.append("start_server")


def test_a_control_plane_kill_due_while_the_head_is_down_is_done_once_the_fleet_is_back() -> None:
    fleet = Fleet(failed_restarts=3)
    plan = [Event(1.0, 0, HEAD_KILL), Event(2.0, 1, "control_plane_kill")]
    faults = Faults(
        plan,
        fleet=fleet,
        server=Server(fleet),  # type: ignore[arg-type]
        types=["v4-8"],
        rng=random.Random(0),
        now=Clock(),
        say=lambda line: None,
    )
    faults._loop()  # in this thread: it returns when no event is left
    assert fleet.done == ["kill_head", "restart", "kill_server", "start_server"]
    assert faults.counts["control_plane_kill"] == faults.counts["control_plane_restart"] == 1
    assert faults.counts["skipped"] == 0 and faults.damage_left == 0
    assert len(faults.errors) == 3  # each restart that failed is reported, and tried again


class Leaders:
    """Stands in for ``Replicas``: one replica (0) that leads, stopped and continued, or killed
    with every other and started again, as ``Replicas.fault`` does; records what was done."""

    lease_s = 3.0

    def __init__(self) -> None:
        self.stopped = False
        self.done: list[str] = []

    def fault(
        self, kind: str, target: str | None, rng: random.Random, push: Callable[..., None]
    ) -> str | None:
        if kind == "replica_cont" and not self.stopped:
            return None  # continued already: nothing to do (``Replicas.cont``)
        if kind == "leader_stop":
            self.stopped = True
            push(self.lease_s + rng.uniform(1, 3), "replica_cont", "0")
        elif kind == "replica_cont":
            self.stopped = False
        elif kind == "replicas_kill_all":
            self.stopped = False  # a stopped replica is continued, then killed with the rest
            push(rng.uniform(1, 5), "replicas_restart")
        self.done.append(kind)
        return "replica 0"


def test_a_leader_fault_due_while_a_replica_is_still_out_waits_for_it_to_be_back() -> None:
    """The kill of every replica is due 1 s after the SIGSTOP, before its SIGCONT: it waits for
    the SIGCONT (which would otherwise find the replica continued already, and not count), then
    lands; each fault and each return is done once (the CI run of 2026-12-07 that lost a
    ``replica_cont`` on a loaded machine)."""
    leaders = Leaders()
    plan = [Event(1.0, 0, "leader_stop"), Event(2.0, 1, "replicas_kill_all")]
    faults = Faults(
        plan,
        fleet=Fleet(failed_restarts=0),
        server=leaders,  # type: ignore[arg-type]
        types=["v4-8"],
        rng=random.Random(0),
        now=Clock(),
        say=lambda line: None,
    )
    faults._loop()
    assert leaders.done == ["leader_stop", "replica_cont", "replicas_kill_all", "replicas_restart"]
    assert all(faults.counts[kind] == 1 for kind in leaders.done), faults.counts
    assert faults.counts["skipped"] == 0 and faults.damage_left == 0 and faults.errors == []
