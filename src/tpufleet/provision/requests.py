"""What every provider accepts as a ``SliceRequest`` (the names end up in Ray, GCE and Kubernetes)."""

from __future__ import annotations

import re

from tpufleet import catalog
from tpufleet.errors import SpecError
from tpufleet.provision.base import SliceRequest

__all__ = ["validate"]

# A group name becomes a queued-resource id, node ids ``<name>-<i>`` and Ray slice names: lowercase
# DNS-label-like and short enough for ``-<i>`` suffixes within GCE's 63-character ids.
_NAME = re.compile(r"[a-z]([a-z0-9-]{0,38}[a-z0-9])?")


def validate(request: SliceRequest) -> None:
    """A request every provider can carry out, else a SpecError naming the field."""
    if not _NAME.fullmatch(request.name):
        raise SpecError(
            f"slice group name {request.name!r} must be 1-40 lowercase letters, digits or '-', "
            "starting with a letter, e.g. train-v4",
            field="name",
            value=request.name,
        )
    catalog.slice_type(request.accelerator_type)  # SpecError with the closest types
    if request.count < 1:
        raise SpecError(f"count must be >= 1, got {request.count}", field="count", value=request.count)
