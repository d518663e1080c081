"""``--provider emulator``: slice groups made of emulated hosts on a running emulated fleet.

Two parts:

- :class:`Machine` (pure, fake-clock tested): each group's queued-resource state from requests,
  the clock and what was observed, and the actions that move it on. Capacity per accelerator type
  (a request beyond it waits in ``WAITING_FOR_RESOURCES`` with a message), a provisioning delay,
  failure injection (``FAILED`` with a message, after the delay, as a real stockout shows), and
  spot preemption with notice (the deadline is reported on the slice; at the deadline every host of
  the slice dies together and the group is ``SUSPENDED``, as a preempted Cloud TPU queued resource).
- :class:`EmulatorProvider`: runs the machine in a background thread against the fleet in
  ``state_dir``: ``Launch`` starts the slice's hosts (``EmulatedFleet.add``), ``Remove`` ends them
  (``EmulatedFleet.remove``), ``Reap`` carries out a preemption whose notice ran out
  (``emulator.spot.reap``). Notices live in the fleet's state dir, so ``tpufleet emulate preempt
  SLICE --notice S`` and the provider agree. Physical slices are named ``<group>-<i>``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from tpufleet.contract import SLICE_LABEL, WORKER_LABEL
from tpufleet.errors import ClusterError, ConflictError, NotFoundError, SpecError
from tpufleet.provision.base import GroupState, GroupStatus, HostHealth, PhysicalSlice, SliceRequest
from tpufleet.provision.requests import validate

__all__ = ["EmulatorConfig", "EmulatorProvider", "Launch", "Machine", "Reap", "Remove", "SliceSeen"]

log = logging.getLogger(__name__)
MADE_FILE = "provider-slices.json"  # in the fleet's state dir


@dataclass(frozen=True)
class EmulatorConfig:
    delay_s: float = 0.0  # from accepted to hosts started, as a cloud's provisioning time
    capacity: Mapping[str, int] = field(default_factory=dict)  # accelerator type -> slices; absent: no limit
    failures: Mapping[str, str] = field(default_factory=dict)  # group name or type -> FAILED message
    notice_s: float = 30.0  # GCE's preemption notice
    join_timeout_s: float = 120.0  # hosts that have not joined Ray by then: FAILED


@dataclass(frozen=True)
class SliceSeen:
    """One physical slice as observed: in the fleet's state, its hosts alive in Ray (by worker id),
    and its preemption notice (deadline, and whether it was carried out)."""

    launched: bool = False
    alive: tuple[bool, ...] = ()
    notice: float | None = None
    notice_done: bool = False


@dataclass(frozen=True)
class Launch:
    slice_name: str
    accelerator_type: str


@dataclass(frozen=True)
class Remove:
    slice_name: str


@dataclass(frozen=True)
class Reap:
    slice_name: str


Action = Launch | Remove | Reap


@dataclass
class _Group:
    request: SliceRequest
    state: GroupState = GroupState.WAITING_FOR_RESOURCES
    message: str = ""
    ready_at: float | None = None  # PROVISIONING: when the hosts are started
    launched_at: float | None = None
    failure: str | None = None  # decided on acceptance, shown after the delay

    @property
    def slices(self) -> tuple[str, ...]:
        return tuple(f"{self.request.name}-{i}" for i in range(self.request.count))


class Machine:
    """The emulator's queued resources as a pure state machine; no clock reads, no I/O."""

    def __init__(self, config: EmulatorConfig = EmulatorConfig()) -> None:
        self.config = config
        self._groups: dict[str, _Group] = {}
        self._deleting: set[str] = set()
        self._fail_next: dict[str, list[str]] = {}

    def create(self, request: SliceRequest) -> None:
        validate(request)
        old = self._groups.get(request.name)
        if old is not None and (old.request != request or request.name in self._deleting):
            raise ConflictError(
                f"slice group {request.name!r} exists with another request or is being deleted"
            )
        if old is None:
            self._groups[request.name] = _Group(request)

    def delete(self, name: str) -> None:
        if name in self._groups:
            self._deleting.add(name)

    def fail_next(self, key: str, message: str, times: int = 1) -> None:
        """The next ``times`` groups named ``key`` or of type ``key`` fail with ``message``."""
        self._fail_next.setdefault(key, []).extend([message] * times)

    def _failure(self, req: SliceRequest) -> str | None:
        for key in (req.name, req.accelerator_type):
            if self._fail_next.get(key):
                return self._fail_next[key].pop(0)
        return self.config.failures.get(req.name) or self.config.failures.get(req.accelerator_type)

    def _used(self, accelerator_type: str) -> int:
        holding = (GroupState.PROVISIONING, GroupState.ACTIVE, GroupState.DELETING)
        return sum(
            g.request.count
            for g in self._groups.values()
            if g.request.accelerator_type == accelerator_type and g.state in holding
        )

    def step(self, now: float, seen: Mapping[str, SliceSeen]) -> list[Action]:
        """Move every group on; returns what must happen to the fleet."""
        actions: list[Action] = []
        for name, g in list(self._groups.items()):
            if name in self._deleting:
                actions += self._step_deleting(name, g, seen)
            elif g.state is GroupState.WAITING_FOR_RESOURCES:
                self._admit(g, now)
            if g.state is GroupState.PROVISIONING and name not in self._deleting:
                actions += self._step_provisioning(g, now, seen)
            elif g.state is GroupState.ACTIVE and name not in self._deleting:
                actions += self._step_active(g, now, seen)
        return actions

    def _admit(self, g: _Group, now: float) -> None:
        req = g.request
        cap = self.config.capacity.get(req.accelerator_type)
        used = self._used(req.accelerator_type)
        if cap is not None and used + req.count > cap:
            g.message = (
                f"no capacity for {req.count} x {req.accelerator_type}: {used} of {cap} slices in use; "
                "waiting for resources"
            )
            return
        g.state, g.ready_at, g.failure = (
            GroupState.PROVISIONING,
            now + self.config.delay_s,
            self._failure(req),
        )
        g.message = f"provisioning {req.count} x {req.accelerator_type}"

    def _step_provisioning(self, g: _Group, now: float, seen: Mapping[str, SliceSeen]) -> list[Action]:
        assert g.ready_at is not None
        if now < g.ready_at:
            return []
        if g.failure is not None:
            g.state, g.message = GroupState.FAILED, g.failure
            return []
        if g.launched_at is None:
            g.launched_at = now
            return [Launch(s, g.request.accelerator_type) for s in g.slices]
        views = [seen.get(s, SliceSeen()) for s in g.slices]
        if all(v.launched and v.alive and all(v.alive) for v in views):
            g.state, g.message = GroupState.ACTIVE, ""
        elif now - g.launched_at > self.config.join_timeout_s:
            g.state = GroupState.FAILED
            g.message = f"hosts did not join Ray within {self.config.join_timeout_s:g}s"
            return [Remove(s) for s in g.slices]
        return []

    def _step_active(self, g: _Group, now: float, seen: Mapping[str, SliceSeen]) -> list[Action]:
        actions: list[Action] = []
        for s in g.slices:
            v = seen.get(s, SliceSeen())
            if v.notice is not None and not v.notice_done and v.notice <= now:
                actions.append(Reap(s))
            elif v.notice_done and v.notice is not None:
                g.state = GroupState.SUSPENDED
                g.message = f"spot preemption: {s} was preempted (notice ran out at {v.notice:.0f})"
        return actions

    def _step_deleting(self, name: str, g: _Group, seen: Mapping[str, SliceSeen]) -> list[Action]:
        present = [s for s in g.slices if seen.get(s, SliceSeen()).launched]
        if not present:
            del self._groups[name]
            self._deleting.discard(name)
            return []
        g.state, g.message = GroupState.DELETING, ""
        return [Remove(s) for s in present]

    def status(self, seen: Mapping[str, SliceSeen]) -> list[GroupStatus]:
        out = []
        for g in self._groups.values():
            slices = []
            if g.launched_at is not None:
                for s in g.slices:
                    v = seen.get(s, SliceSeen())
                    if v.notice_done:
                        hosts = tuple(HostHealth.PREEMPTED for _ in v.alive)
                    else:
                        hosts = tuple(HostHealth.READY if a else HostHealth.REPAIRING for a in v.alive)
                    pending = v.notice if v.notice is not None and not v.notice_done else None
                    slices.append(PhysicalSlice(s, hosts, pending))
            out.append(GroupStatus(g.request.name, g.state, g.message, tuple(slices)))
        return out

    def fail(self, slice_name: str, message: str) -> list[Action]:
        """The slice could not be made: its group is FAILED with ``message``; returns the removal of
        the slices the group did make."""
        for g in self._groups.values():
            if slice_name in g.slices and g.state is GroupState.PROVISIONING:
                g.state, g.message = GroupState.FAILED, message
                return [Remove(s) for s in g.slices if s != slice_name]
        return []

    def names(self) -> list[str]:
        return [s for g in self._groups.values() for s in g.slices]


class EmulatorProvider:
    """The :class:`Machine` driven in a background thread against the fleet in ``state_dir``."""

    kind = "emulator"

    def __init__(
        self,
        state_dir: str | Path,
        config: EmulatorConfig = EmulatorConfig(),
        *,
        clock: Callable[[], float] = time.time,
        interval_s: float = 0.5,
    ) -> None:
        from tpufleet.emulator import EmulatedFleet

        self.state_dir = Path(state_dir)
        self._fleet = EmulatedFleet.attach(self.state_dir).authenticate()
        self._machine = Machine(config)
        self._clock = clock
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._seen: dict[str, SliceSeen] = {}
        self._error = ""
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="emulator-provider", daemon=True)
        self._thread.start()

    # -- the protocol ------------------------------------------------------------------------------

    def create(self, request: SliceRequest) -> None:
        with self._lock:
            self._machine.create(request)
        self._wake.set()

    def delete(self, name: str, *, force: bool = False) -> None:
        """Remove the group's hosts (the slice manager drained or preempted its holder first)."""
        with self._lock:
            self._machine.delete(name)
        self._wake.set()

    def poll(self) -> list[GroupStatus]:
        with self._lock:
            out = self._machine.status(self._seen)
            error = self._error
        if error:  # the fleet could not be read: say so on every group rather than guess
            out = [replace(s, message=f"{s.message}; {error}".strip("; ")) for s in out]
        return out

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=30)

    # -- the emulator's own controls ---------------------------------------------------------------

    def preempt(self, slice_name: str, notice_s: float | None = None) -> float:
        """Give a physical slice a spot-preemption notice; returns the deadline."""
        from tpufleet.emulator import spot

        notice = self._machine.config.notice_s if notice_s is None else notice_s
        deadline = spot.announce(self.state_dir, slice_name, notice, now=self._clock)
        self._wake.set()
        return deadline

    def fail_next(self, key: str, message: str, times: int = 1) -> None:
        with self._lock:
            self._machine.fail_next(key, message, times)

    # -- the loop ----------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as err:  # the loop must outlive one bad read; the error is reported
                log.warning("emulator provider: %s", err)
                with self._lock:
                    self._error = str(err)
            self._wake.wait(self._interval_s)
            self._wake.clear()

    def tick(self) -> None:
        """Observe the fleet, step the machine, carry out its actions, observe again."""
        seen = self._observe()
        with self._lock:
            self._seen = seen
            actions = self._machine.step(self._clock(), seen)
        for action in actions:
            self._act(action)
        if actions:
            seen = self._observe()
            with self._lock:
                self._seen = seen
        with self._lock:
            self._error = ""

    def _observe(self) -> dict[str, SliceSeen]:
        from tpufleet.emulator import spot
        from tpufleet.emulator import state as store
        from tpufleet.emulator.raynodes import read_nodes

        with self._lock:
            names = set(self._machine.names()) & self._made()  # never a slice of the fleet's own
        st = store.load(self.state_dir)
        if st is None:
            raise ClusterError(f"the emulated fleet in {self.state_dir} is gone", retry_after=5.0)
        alive: set[tuple[str, int]] = set()
        for node in read_nodes(st.ray_address):
            labels = node.get("Labels") or {}
            if node.get("Alive") and labels.get(SLICE_LABEL) in names:
                alive.add((labels[SLICE_LABEL], int(labels.get(WORKER_LABEL, -1))))
        notices = spot.read(self.state_dir)
        seen = {}
        for rec in st.slices:
            if rec.name not in names:
                continue
            n = notices.get(rec.name)
            seen[rec.name] = SliceSeen(
                launched=True,
                alive=tuple((rec.name, h.worker_id) in alive for h in rec.hosts),
                notice=n.deadline if n else None,
                notice_done=bool(n and n.done),
            )
        return seen

    def _act(self, action: Action) -> None:
        from tpufleet.emulator import spot

        if isinstance(action, Launch):
            from tpufleet.emulator import state as store

            st = store.load(self.state_dir)
            if st is not None and st.slice(action.slice_name) is not None:
                # A slice this provider made before (a restarted control plane re-creating its
                # groups) is adopted; one of the fleet's own slices of that name is not.
                if action.slice_name not in self._made():
                    self._fail(
                        action.slice_name,
                        f"the fleet already has a slice named {action.slice_name} that no slice group made",
                    )
                return
            self._remember(action.slice_name)
            try:
                self._fleet.add(action.accelerator_type, action.slice_name, wait=False)
            except ConflictError:  # made in between by another process: adopt
                pass
            except SpecError as err:  # more hosts than this machine can hold: the group fails
                self._forget(action.slice_name)
                self._fail(action.slice_name, str(err))
        elif isinstance(action, Remove):
            if action.slice_name not in self._made():
                return  # not ours: a slice of the fleet's own that a group's name collided with
            with contextlib.suppress(NotFoundError):  # already gone from the fleet
                self._fleet.remove(action.slice_name, wait=False)
            spot.forget(self.state_dir, action.slice_name)
            self._forget(action.slice_name)
        else:
            spot.reap(self.state_dir, now=self._clock, only=action.slice_name)

    def _fail(self, slice_name: str, why: str) -> None:
        """The slice could not be made: its group is FAILED with ``why``, the group's other slices
        removed."""
        with self._lock:
            undo = self._machine.fail(slice_name, why)
        for a in undo:
            self._act(a)

    # The physical slices this provider (or an earlier one on this fleet) launched.
    def _made(self) -> set[str]:
        try:
            return set(json.loads((self.state_dir / MADE_FILE).read_text()))
        except FileNotFoundError:
            return set()

    def _remember(self, slice_name: str) -> None:
        self._write_made(self._made() | {slice_name})

    def _forget(self, slice_name: str) -> None:
        self._write_made(self._made() - {slice_name})

    def _write_made(self, names: set[str]) -> None:
        tmp = self.state_dir / f".{MADE_FILE}.{os.getpid()}"
        tmp.write_text(json.dumps(sorted(names)))
        tmp.replace(self.state_dir / MADE_FILE)
