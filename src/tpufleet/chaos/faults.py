"""The soak's faults, done in one background thread in seeded order at seeded times: hosts killed,
slices preempted with and without notice and restored, the control plane SIGKILLed and started
again (with replicas: the leader faults of ``leaders.py``), and once the Ray head killed and the
fleet restarted in place. A fault that leaves something down puts the event that brings it back
on the heap (a restore, a restart)."""

from __future__ import annotations

import heapq
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from tpufleet import catalog
from tpufleet.chaos.leaders import LEADER_RETURNS, Replicas
from tpufleet.chaos.plan import DAMAGE, HEAD_KILL, LEADER_FAULTS, Event
from tpufleet.chaos.server import ControlPlane

LEADER_TRIES = 4  # how often a leader fault is tried before it is skipped (no replica led)


class Faults:
    """The planned faults on ``fleet`` (an ``EmulatedFleet``) and ``server``; targets and delays
    are drawn from ``rng`` as faults happen. ``now`` is seconds into the fault window."""

    def __init__(
        self,
        plan: list[Event],
        *,
        fleet: Any,
        server: ControlPlane | Replicas,
        types: list[str],
        rng: random.Random,
        now: Callable[[], float],
        say: Callable[[str], None],
    ) -> None:
        self.fleet, self.server, self.types, self.rng, self.now, self.say = (
            fleet,
            server,
            types,
            rng,
            now,
            say,
        )
        self.counts: Counter[str] = Counter()
        self.log: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._events = list(plan)
        heapq.heapify(self._events)
        self._seq = len(plan)
        # planned damage not yet done or skipped: the window lasts until it is through (a fault
        # that came due while the fault thread was busy, e.g. restarting the fleet, is done late)
        self.damage_left = sum(1 for e in plan if e.kind in DAMAGE)
        self._noticed: set[str] = set()  # slices under a preemption notice, not yet reaped
        self._head_down = False  # between a Ray head kill and the fleet's restart
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="chaos-faults", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        """No new damage from now on; with ``timeout_s``, wait that long for the pending
        restores and restarts to be done."""
        self._stop.set()
        if timeout_s is not None and self._thread is not None:
            self._thread.join(timeout=timeout_s)

    def _push(self, delay: float, kind: str, target: str | None = None) -> None:
        self._seq += 1
        heapq.heappush(self._events, Event(round(self.now() + delay, 3), self._seq, kind, target))

    def _whole_slices(self) -> list[str]:
        down = self.fleet.down_hosts()
        return sorted(n for n in self.fleet.slice_names if n not in down and n not in self._noticed)

    def _type_of(self, slice_name: str) -> str:
        for t in self.types:
            if slice_name.startswith(f"tpu-{t}-"):
                return t
        raise KeyError(slice_name)

    def _loop(self) -> None:
        while self._events:
            ev = self._events[0]
            if self._stop.is_set() and ev.kind in DAMAGE:
                heapq.heappop(self._events)  # no new damage once the soak stopped waiting for it
                self.damage_left -= 1
                continue
            wait = ev.at - self.now()
            if wait > 0:
                time.sleep(min(wait, 0.2))
                continue
            heapq.heappop(self._events)
            try:
                self._fault(ev)
            except Exception as err:  # a fault that could not be done is reported
                self.errors.append(f"{ev.kind} {ev.target or ''}: {type(err).__name__}: {err}")
                self.say(f"[{self.now():6.1f}s] {ev.kind} failed: {err}")
            finally:
                if ev.kind in DAMAGE:
                    self.damage_left -= 1

    def _fault(self, ev: Event) -> None:
        """Do one event; new events (restores, a restart) go on the heap."""
        comebacks = ("control_plane_restart", "restore", "reap", *LEADER_RETURNS)
        if self._head_down and ev.kind in (*DAMAGE, *comebacks):
            # Nothing to break, and no server or host to bring back, until the cluster is: the
            # event waits for it, so a slow fleet restart changes when a fault lands, not which.
            if ev.kind in DAMAGE:
                self.damage_left += 1  # still to be done (the loop counts this event as done)
            self._push(5.0, ev.kind, ev.target)
            return
        if ev.kind in ("kill_host", "preempt", "preempt_notice"):
            what = self._host_fault(ev.kind)
            if what is None:
                self.counts["skipped"] += 1
                return
        elif ev.kind in (*LEADER_FAULTS, *LEADER_RETURNS):
            assert not isinstance(self.server, ControlPlane)  # the leader faults need replicas
            back_at = max((e.at for e in self._events if e.kind in LEADER_RETURNS), default=None)
            if ev.kind in LEADER_FAULTS and back_at is not None:
                # One leader fault at a time: this one waits until the last one's replicas are
                # back, so a loaded machine that does a fault late changes when the next lands,
                # not what it finds (a SIGKILL of every replica would otherwise continue a
                # stopped one before its own SIGCONT came due).
                self.damage_left += 1  # still to be done (the loop counts this event as done)
                self._push(max(back_at - self.now(), 0.0) + 1.0, ev.kind, ev.target)
                return
            what = self.server.fault(ev.kind, ev.target, self.rng, self._push)
            if what is None:  # no replica leads now (a takeover under way), or it is back already
                self._leader_fault_again(ev)
                return
        else:
            what = ev.target
            if not self._other_fault(ev):
                return
        self.counts[ev.kind] += 1
        self.log.append({"at": round(self.now(), 1), "kind": ev.kind, "target": what})
        self.say(f"[{self.now():6.1f}s] {ev.kind} {what or ''}".rstrip())

    def _leader_fault_again(self, ev: Event) -> None:
        """A leader fault that found no leader is done again a little later, up to
        ``LEADER_TRIES`` times in all (a loaded machine's takeover, or a replica slow to answer)."""
        if ev.kind not in LEADER_FAULTS:
            return
        tries = int(ev.target or 1)
        if tries >= LEADER_TRIES:
            self.counts["skipped"] += 1
            return
        self.damage_left += 1  # still to be done (the loop counts this event as done)
        self._push(3.0, ev.kind, str(tries + 1))
        self.say(f"[{self.now():6.1f}s] {ev.kind}: no replica leads now; again in 3 s")

    def _host_fault(self, kind: str) -> str | None:
        """Kill a host of, preempt, or give notice to a whole slice drawn at random; what was hit
        (None when no slice is whole)."""
        from tpufleet.emulator import spot

        whole = self._whole_slices()
        if not whole:
            return None
        what: str = self.rng.choice(whole)
        if kind == "kill_host":
            hosts = catalog.slice_type(self._type_of(what)).hosts
            worker = self.rng.randrange(hosts)
            self.fleet.kill_host(what, worker, wait=False)
            self._push(self.rng.uniform(3, 10), "restore", what)
            return f"{what}/{worker}"
        if kind == "preempt":
            self.fleet.preempt(what, wait=False)
            self._push(self.rng.uniform(3, 10), "restore", what)
            return what
        notice = round(self.rng.uniform(3, 8), 1)
        spot.announce(self.fleet.state_dir, what, notice)
        self._noticed.add(what)
        self._push(notice, "reap", what)
        return f"{what} (notice {notice:g}s)"

    def _other_fault(self, ev: Event) -> bool:
        """A reap, restore, control-plane kill or restart, or the head's loss or return; whether it
        counts as done (False: nothing to do, or skipped)."""
        from tpufleet.emulator import spot

        if ev.kind == "reap":
            assert ev.target is not None
            spot.reap(self.fleet.state_dir, only=ev.target)
            self._noticed.discard(ev.target)
            self._push(self.rng.uniform(3, 10), "restore", ev.target)
        elif ev.kind == "restore":
            assert ev.target is not None
            if ev.target not in self.fleet.down_hosts():
                return False
            self.fleet.restore(ev.target)
        elif ev.kind == "control_plane_kill":
            if not self.server.killable():
                self.counts["skipped"] += 1
                return False
            self.server.kill(signal.SIGKILL)
            self._push(self.rng.uniform(1, 5), "control_plane_restart")
        elif ev.kind == "control_plane_restart":
            self.server.start()
        elif ev.kind == HEAD_KILL:
            # The control plane notices on its own (headwatch) and starts afresh once Ray answers.
            self.fleet.kill_head()
            self._head_down = True
            self._push(self.rng.uniform(3, 8), "ray_head_restart")
        elif ev.kind == "ray_head_restart":
            try:
                self.fleet.restart()
            except Exception:
                self._push(5.0, "ray_head_restart")  # the fleet must come back: try again
                raise
            self._head_down = False
            self._noticed.clear()  # every host is new: earlier notices died with the old ones
        return True
