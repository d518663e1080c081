"""The warning a submit gets when the fleet cannot run its job (``jobviews.fleet_warnings``) and
the read every submit makes first (``Usage.has_slices``: at most ``n`` slices of the type), on
SQLite and PostgreSQL (the ``store`` fixture)."""

from __future__ import annotations

from tpufleet.api.jobviews import fleet_warnings
from tpufleet.control.cluster.memory import MemoryCluster
from tpufleet.control.store.facade import Store
from tpufleet.control.store.loopwrites import Transitions
from tpufleet.control.store.usage import Usage


def test_has_slices_answers_for_the_type_and_the_count_asked(store: Store) -> None:
    Transitions(store).sync_slices(MemoryCluster.of("v4-16:2,v6e-16").inventory())
    usage = Usage(store)
    assert usage.has_slices("v4-16", 1) and usage.has_slices("v4-16", 2)
    assert not usage.has_slices("v4-16", 3)
    assert usage.has_slices("v6e-16", 1) and not usage.has_slices("v6e-16", 2)
    assert not usage.has_slices("v5litepod-1", 1)


def test_a_job_the_fleet_has_slices_for_gets_no_warning_and_one_it_lacks_gets_the_fix(store: Store) -> None:
    Transitions(store).sync_slices(MemoryCluster.of("v4-16:2,v6e-16").inventory())
    assert fleet_warnings(store, "v4-16", 2) == []
    short, missing = fleet_warnings(store, "v4-16", 3), fleet_warnings(store, "v5litepod-1", 1)
    assert len(short) == 1 and short[0].startswith("the fleet has 2 v4-16 slices, the job needs 3 and no")
    assert len(missing) == 1 and missing[0].startswith("the fleet has no v5litepod-1 slice and no pool makes")
    assert "the fleet has: v4-16 x2, v6e-16 x1" in missing[0]
    assert fleet_warnings(store, "v5litepod-1", 1, pool_types={"v5litepod-1"}) == []  # a pool makes them
