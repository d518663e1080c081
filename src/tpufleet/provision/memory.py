"""``MemoryProvider``: slice groups made in memory, on an injected clock (sandbox mode and tests).

It behaves as a Cloud TPU queued resource does, with the timings set by the caller: a request waits
in ``WAITING_FOR_RESOURCES`` while its type has no capacity left, is ``PROVISIONING`` for
``delay_s``, then ``ACTIVE`` with its slices; ``delete`` makes it ``DELETING`` for
``delete_delay_s`` and then it is gone. Failure injection (:meth:`fail_next`) makes the next
requests end ``FAILED`` with a message; :meth:`preempt` gives a spot slice a notice (its
``preempt_deadline``), after which its hosts are ``PREEMPTED`` and the group ``SUSPENDED``, as GCE
does with a spot queued resource.

Slices appear where the control plane sees them through two callbacks: ``on_up(slices)`` when a
group turns ``ACTIVE`` and ``on_down(names)`` when its slices go (preempted, deleted). ``serve
--sandbox --provider memory`` wires them to the sandbox cluster's ``add_slices``/``remove_slices``,
so the whole loop (autoscaler, provider, inventory, policy) runs without Ray. Time moves only when
the clock does (:meth:`poll` reads it); nothing runs in the background. Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tpufleet import catalog
from tpufleet.catalog import SliceType
from tpufleet.errors import ConflictError, SpecError
from tpufleet.fleet import HostInfo, SliceInfo
from tpufleet.provision.base import (
    GroupState,
    GroupStatus,
    HostHealth,
    PhysicalSlice,
    SliceRequest,
)

__all__ = ["MemoryProvider", "slice_info"]

Clock = Callable[[], float]
SlicesUp = Callable[[list[SliceInfo]], None]
SlicesDown = Callable[[list[str]], None]


@dataclass
class _Group:
    request: SliceRequest
    slice_type: SliceType
    asked_at: float
    state: GroupState = GroupState.WAITING_FOR_RESOURCES
    message: str = ""
    since: float = 0.0  # when the current state began
    slices: list[str] = field(default_factory=list)
    deadlines: dict[str, float] = field(default_factory=dict)  # slice -> preemption deadline
    preempted: set[str] = field(default_factory=set)
    failure: str | None = None  # injected: the request ends FAILED with this message


class MemoryProvider:
    kind = "memory"

    def __init__(
        self,
        *,
        clock: Clock = time.time,
        delay_s: float = 0.0,
        delete_delay_s: float = 0.0,
        capacity: Mapping[str, int] | None = None,
        notice_s: float = 30.0,
        on_up: SlicesUp | None = None,
        on_down: SlicesDown | None = None,
    ) -> None:
        self.clock = clock
        self.delay_s = delay_s
        self.delete_delay_s = delete_delay_s
        self.capacity = {catalog.slice_type(t).accelerator_type: n for t, n in (capacity or {}).items()}
        self.notice_s = notice_s
        self.on_up = on_up
        self.on_down = on_down
        self._groups: dict[str, _Group] = {}
        self._failures: list[tuple[str | None, str]] = []  # (type or None for any, message)
        self._subnet = 200
        self._lock = threading.RLock()
        self.requests: list[SliceRequest] = []  # every create, in order (what tests read)
        self.deletes: list[tuple[str, bool]] = []

    # -- Provider -------------------------------------------------------------------------------
    def create(self, request: SliceRequest) -> None:
        st = catalog.slice_type(request.accelerator_type)  # SpecError for an unknown type
        if request.count < 1:
            raise SpecError(f"count must be at least 1, got {request.count}", field="count")
        with self._lock:
            if request.name in self._groups:
                if self._groups[request.name].request != request:
                    raise ConflictError(f"slice group {request.name} exists with another request")
                return  # idempotent by name
            now = self.clock()
            group = _Group(request, st, asked_at=now, since=now)
            for i, (kind, message) in enumerate(self._failures):
                if kind in (None, st.accelerator_type):
                    group.failure = message
                    del self._failures[i]
                    break
            self._groups[request.name] = group
            self.requests.append(request)
            self._advance(now)

    def delete(self, name: str, *, force: bool = False) -> None:
        with self._lock:
            group = self._groups.get(name)
            self.deletes.append((name, force))
            if group is None or group.state is GroupState.DELETING:
                return
            self._set(group, GroupState.DELETING, "deleting", self.clock())
            self._advance(self.clock())

    def poll(self) -> list[GroupStatus]:
        with self._lock:
            self._advance(self.clock())
            return [self._status(g) for g in self._groups.values()]

    def close(self) -> None:
        with self._lock:
            gone = [s for g in self._groups.values() for s in g.slices if s not in g.preempted]
            self._groups.clear()
        if gone and self.on_down:
            self.on_down(gone)

    # -- what tests and the sandbox drive ----------------------------------------------------------
    def fail_next(self, message: str, accelerator_type: str | None = None, times: int = 1) -> None:
        """The next ``times`` requests (of ``accelerator_type``, or any) end FAILED with ``message``."""
        kind = catalog.slice_type(accelerator_type).accelerator_type if accelerator_type else None
        with self._lock:
            self._failures.extend([(kind, message)] * times)

    def preempt(self, slice_name: str, notice_s: float | None = None) -> float:
        """Give the slice a preemption notice; its hosts die ``notice_s`` (default ``self.notice_s``)
        later. Returns the deadline. KeyError for a slice no ACTIVE group has."""
        with self._lock:
            for group in self._groups.values():
                if slice_name in group.slices and group.state is GroupState.ACTIVE:
                    deadline = self.clock() + (self.notice_s if notice_s is None else notice_s)
                    group.deadlines[slice_name] = min(deadline, group.deadlines.get(slice_name, deadline))
                    self._advance(self.clock())
                    return group.deadlines[slice_name]
        raise KeyError(f"no active slice {slice_name!r}")

    # -- the state machine ----------------------------------------------------------------------
    def _advance(self, now: float) -> None:
        """Move every group as far as the clock allows (called under the lock)."""
        up: list[SliceInfo] = []
        down: list[str] = []
        for name, group in list(self._groups.items()):
            if group.state is GroupState.DELETING:
                if now - group.since >= self.delete_delay_s:
                    down += [s for s in group.slices if s not in group.preempted]
                    del self._groups[name]
                continue
            if group.state is GroupState.WAITING_FOR_RESOURCES:
                free = self._free(group.slice_type.accelerator_type)
                if free is None or free >= group.request.count:
                    self._set(group, GroupState.PROVISIONING, "creating the TPU VMs", now)
                else:
                    group.message = (
                        f"no capacity for {group.request.count} {group.slice_type.accelerator_type} "
                        f"slice(s): {max(free, 0)} of {self.capacity[group.slice_type.accelerator_type]} free"
                    )
            if group.state is GroupState.PROVISIONING and now - group.since >= self.delay_s:
                if group.failure is not None:
                    self._set(group, GroupState.FAILED, group.failure, now)
                    continue
                group.slices = [f"{name}-{i}" for i in range(group.request.count)]
                self._set(group, GroupState.ACTIVE, "", now)
                up += [self._make(s, group.slice_type) for s in group.slices]
            if group.state is GroupState.ACTIVE:
                for slice_name, deadline in group.deadlines.items():
                    if now >= deadline and slice_name not in group.preempted:
                        group.preempted.add(slice_name)
                        down.append(slice_name)
                if group.preempted:
                    self._set(group, GroupState.SUSPENDED, "spot slice preempted", now)
        if down and self.on_down:
            self.on_down(down)
        if up and self.on_up:
            self.on_up(up)

    def _free(self, accelerator_type: str) -> int | None:
        """Physical slices of the type still free (None: no limit)."""
        cap = self.capacity.get(accelerator_type)
        if cap is None:
            return None
        used = sum(
            g.request.count
            for g in self._groups.values()
            if g.slice_type.accelerator_type == accelerator_type
            and g.state in (GroupState.PROVISIONING, GroupState.ACTIVE, GroupState.SUSPENDED)
        )
        return cap - used

    @staticmethod
    def _set(group: _Group, state: GroupState, message: str, now: float) -> None:
        group.state, group.message, group.since = state, message, now

    def _make(self, name: str, st: SliceType) -> SliceInfo:
        self._subnet = self._subnet % 50_000 + 1
        return slice_info(name, st, self._subnet)

    def _status(self, group: _Group) -> GroupStatus:
        slices = []
        for name in group.slices:
            health = HostHealth.PREEMPTED if name in group.preempted else HostHealth.READY
            slices.append(PhysicalSlice(name, (health,) * group.slice_type.hosts, group.deadlines.get(name)))
        return GroupStatus(group.request.name, group.state, group.message, tuple(slices))


def slice_info(name: str, st: SliceType, subnet: int = 0) -> SliceInfo:
    """An intact slice of type ``st`` whose hosts are 10.<a>.<b>.<worker+1> (``subnet`` picks a.b)."""
    a, b = divmod(subnet, 256)
    hosts = tuple(HostInfo(w, f"node-{name}-{w}", f"10.{a % 256}.{b}.{w + 1}", True) for w in range(st.hosts))
    return SliceInfo(name, st.accelerator_type, str(st.topology), st.hosts, hosts)
