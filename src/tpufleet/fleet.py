"""What a fleet is made of, as discovered: ``SliceInfo`` and ``HostInfo`` value types.

Facts-level values (below ``control/``): the inventory reads them from any Ray cluster's node
table, the doctor checks them, the control plane schedules on them and the emulator's fake
clusters make them. ``SliceInfo.slice_type`` is the one place a discovered slice is matched to
the catalog (generation, topology and chips per host), so no caller guesses it from a name.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from tpufleet import catalog
from tpufleet.catalog import SliceType
from tpufleet.errors import SpecError

__all__ = ["HostInfo", "SliceInfo"]


@dataclass(frozen=True)
class HostInfo:
    worker_id: int
    node_id: str | None  # Ray node id (hex); None when the host is missing
    address: str | None  # the host's IP as Ray sees it
    alive: bool


@dataclass(frozen=True)
class SliceInfo:
    """One slice as discovered from Ray's node labels (``ray.io/tpu-slice-name`` etc.)."""

    name: str
    accelerator_type: str  # GCE naming, e.g. "v4-16", "v5litepod-16", "tpu7x-16"
    topology: str
    expected_hosts: int
    hosts: tuple[HostInfo, ...]
    problems: tuple[str, ...] = ()  # why the slice is not intact; empty when it is
    # Why every host of the slice ended on purpose (Ray's death reasons: stopped, drained for a
    # preemption or as idle), so it left rather than broke; empty while a host is alive or any died
    # otherwise. The doctor does not check such a slice and the control plane lets it leave.
    gone: str = ""

    @property
    def intact(self) -> bool:
        return not self.problems

    @property
    def chips_per_host(self) -> int:
        """The topology's chips over the hosts the slice should have (0 for an unknown topology)."""
        try:
            return catalog.Topology.parse(self.topology).chips // max(1, self.expected_hosts)
        except SpecError:
            return 0

    @cached_property
    def slice_type(self) -> SliceType:
        """The catalog's type of this slice: its generation and topology with this many chips per
        host (v5e/v6e 2x4 is one 8-chip host or two 4-chip ones). SpecError when there is none."""
        gen = catalog.generation(self.accelerator_type.rsplit("-", 1)[0])
        for st in catalog.all_slice_types():
            if (st.gen_name, str(st.topology), st.hosts) == (gen.name, self.topology, self.expected_hosts):
                return st
        raise SpecError(
            f"slice {self.name}: {self.accelerator_type} {self.topology} on {self.expected_hosts} hosts "
            "is not in the catalog",
            field="slice",
        )
