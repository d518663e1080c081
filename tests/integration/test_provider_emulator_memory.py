"""``--provider emulator`` and ``emulate add`` on the shared running fleet, at the machine's memory:
a slice more than it can hold is refused before a host starts, and a provider's group for it fails.

A file of its own: xdist hands a worker the files with more tests first, and a third test in
``test_provider_emulator.py`` put that file (whose spot preemption leaves its slice's dead nodes in
Ray's node table) before ``test_emulator_cli.py``, whose ``doctor`` then found them on the same fleet.
"""

from __future__ import annotations

import pytest
from _executor_helpers import wait_for

from tpufleet import catalog
from tpufleet.emulator import EmulatedFleet, procs
from tpufleet.emulator.plan import HOST_FLOOR_BYTES
from tpufleet.errors import SpecError
from tpufleet.provision.base import GroupStatus, SliceRequest
from tpufleet.provision.emulator import EmulatorProvider

pytestmark = pytest.mark.integration


def _group(provider: EmulatorProvider, name: str) -> GroupStatus | None:
    return next((g for g in provider.poll() if g.name == name), None)


def _hosts_of(fleet: EmulatedFleet) -> list[tuple[str, list[str]]]:
    return [(s["name"], [h["node_id"] for h in s["hosts"]]) for s in fleet.status()["slices"]]


def test_a_slice_more_than_the_machine_holds_is_refused_and_its_group_fails(fleet: EmulatedFleet) -> None:
    """One v5p-17920 is 2,240 hosts, more than a 24 GiB machine holds at a raylet's least: adding it
    is refused before a host starts, and a provider's group for it is FAILED with that reason."""
    big = "v5p-17920"
    memory, before = procs.physical_memory(), _hosts_of(fleet)
    hosts = sum(len(ids) for _, ids in before) + catalog.slice_type(big).hosts
    if not memory or hosts * HOST_FLOOR_BYTES <= memory:
        pytest.skip(f"this machine's memory holds {hosts} emulated hosts")
    with pytest.raises(SpecError, match=f"one more {big} would make the fleet {hosts:,} emulated hosts"):
        fleet.add(big)
    provider = EmulatorProvider(fleet.state_dir, interval_s=0.2)
    try:
        provider.create(SliceRequest("itest-too-big", big))
        g = wait_for("FAILED", lambda: (g := _group(provider, "itest-too-big")) and g.state == "FAILED" and g)
        assert f"one more {big} would make the fleet" in g.message and "remove a slice first" in g.message
        provider.delete("itest-too-big")
        wait_for("the group to go", lambda: _group(provider, "itest-too-big") is None, 30)
    finally:
        provider.close()
    assert _hosts_of(fleet) == before
