"""The provider protocol: requests of whole slices in, queued-resource states out.

A *slice group* is what an operator names (``tpufleet slice create NAME --type v4-8 --count 2``): a
request for ``count`` physical slices of one accelerator type, spot or not. A provider makes the
slices, reports the group's state the way a Cloud TPU queued resource does, and reports each host's
health. It never decides anything: the autoscaler (``scheduler/autoscale.py``, pure) and the slice
manager (``control``) decide, the provider carries it out.

Rules for every implementation:
- ``create`` and ``delete`` are idempotent by name and return quickly (the work happens in the
  background; progress is read through ``poll``).
- ``poll`` has no side effects beyond refreshing what it reports; it never raises for one bad group
  (a group it cannot read is reported FAILED with the reason).
- Physical slice names are the names Ray sees (``ray.io/tpu-slice-name``, TPU_NAME on the hosts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

__all__ = [
    "GroupState",
    "GroupStatus",
    "HostHealth",
    "PhysicalSlice",
    "Provider",
    "SliceRequest",
]


class GroupState(StrEnum):
    """A queued resource's states (Cloud TPU API v2 ``QueuedResourceState.State``)."""

    WAITING_FOR_RESOURCES = "WAITING_FOR_RESOURCES"
    PROVISIONING = "PROVISIONING"
    ACTIVE = "ACTIVE"
    SUSPENDED = "SUSPENDED"
    FAILED = "FAILED"
    DELETING = "DELETING"


class HostHealth(StrEnum):
    """A host's health, as Cloud TPU reports a node's (``Node.health`` / ``Node.state``)."""

    READY = "READY"
    PREEMPTED = "PREEMPTED"
    REPAIRING = "REPAIRING"


@dataclass(frozen=True)
class SliceRequest:
    """``count`` physical slices of ``accelerator_type`` (e.g. ``v4-8``) under one group name."""

    name: str
    accelerator_type: str
    count: int = 1
    spot: bool = False
    tenant: str | None = None  # a private group: only this tenant's jobs run there


@dataclass(frozen=True)
class PhysicalSlice:
    name: str  # as Ray sees it (TPU_NAME)
    hosts: tuple[HostHealth, ...] = ()
    # Seconds since the epoch by which a spot slice noticed for preemption will be gone; None if no notice.
    preempt_deadline: float | None = None


@dataclass(frozen=True)
class GroupStatus:
    name: str
    state: GroupState
    message: str = ""  # the provider's own words (why WAITING/FAILED), shown on waiting jobs
    slices: tuple[PhysicalSlice, ...] = field(default=())


@runtime_checkable
class Provider(Protocol):
    kind: str  # "emulator" | "gce" | "kuberay" | "memory"

    def create(self, request: SliceRequest) -> None: ...

    def delete(self, name: str, *, force: bool = False) -> None: ...

    def poll(self) -> list[GroupStatus]: ...

    def close(self) -> None: ...
