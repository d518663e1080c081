"""What a control plane serves at ``GET /metrics``: one ``CollectorRegistry`` per control plane.

:func:`collectors` is the list a control plane registers; a new source of metrics (the TPU device
collector, say) adds its collector there. ``ControlPlane.metrics`` is the registry itself, so a
caller can also ``register`` more at run time.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector

from tpufleet import pricing
from tpufleet.control.store.facade import Store
from tpufleet.control.store.usage import Usage
from tpufleet.observe.metrics import FleetCollector

__all__ = ["collectors", "metrics_registry"]


def collectors(store: Store, *, prices: pricing.PriceTable | None = None) -> list[Collector]:
    """The collectors every control plane registers (store-derived fleet metrics first)."""
    return [FleetCollector(Usage(store), prices)]


def metrics_registry(
    store: Store, *, prices: pricing.PriceTable | None = None, extra: Iterable[Collector] = ()
) -> CollectorRegistry:
    """A fresh registry with :func:`collectors` and ``extra`` registered."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in (*collectors(store, prices=prices), *extra):
        registry.register(collector)
    return registry
