"""Where a TPU host's own numbers come from: the GKE TPU device plugin and libtpu's metric service.

Two sources, read the way the tools that already read them do:

- **The GKE TPU device plugin** serves Prometheus text at ``http://$TPU_DEVICE_PLUGIN_ADDR/metrics``
  (the GKE TPU webhook sets it to ``<node IP>:2112``; Ray's reporter agent reads the same URL).
  Families ``duty_cycle``, ``tensorcore_utilization``, ``memory_used``, ``memory_total`` and
  ``memory_bandwidth_utilization``, labelled ``accelerator_id`` (``<id>-<index>``), ``make``,
  ``model``, ``tpu_topology`` and, while a container holds the chips, ``namespace``/``pod``/
  ``container``; a ``<name>_node`` twin of each carries the node's view without the pod labels.
  Quirk (Ray documents it too): the runtime families (duty cycle, memory) index chips across the
  whole slice (a v5p host shows 404, 405, 412, 413) while the host families (tensor core,
  bandwidth) index them 0..n-1 on the host; both are mapped to the host index in sorted order.
- **libtpu's runtime metric service** (gRPC on ``localhost:8431`` of a GCE TPU VM, what
  ``tpu-info`` reads): :func:`read_libtpu`, which lives below the control layer in
  ``tpufleet/tpudevice.py`` (with :class:`ChipReading` and :class:`DeviceReadError`) because the
  hosts' relay (``host/devicerelay.py``, started by the runner actor) reads it too; re-exported here.
  libtpu answers local callers only, so the control plane reads a GCE host through its relay,
  which serves libtpu's numbers in the device plugin's format above.

Every read takes a timeout and raises :class:`DeviceReadError` (one line, what and where) on any
failure; the sampler (``device.py``) decides when to try again.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

from tpufleet.tpudevice import (
    EMULATED_INFO,
    LIBTPU_ADDR,
    LIBTPU_METRICS,
    ChipReading,
    DeviceReadError,
    _finite,
    read_libtpu,
)

__all__ = [
    "EMULATED_INFO",
    "LIBTPU_ADDR",
    "LIBTPU_METRICS",
    "ChipReading",
    "DeviceReadError",
    "parse_device_plugin",
    "read_device_plugin",
    "read_libtpu",
]

_RUNTIME = {"duty_cycle": "duty_cycle", "memory_used": "hbm_used", "memory_total": "hbm_total"}
_HOST = {"tensorcore_utilization": "tensorcore", "memory_bandwidth_utilization": "bandwidth"}
_MAX_BODY = 4 << 20  # a device plugin's page is a few KiB; refuse anything absurd


def _index(accelerator_id: str) -> int:
    tail = accelerator_id.rsplit("-", 1)[-1]
    if not tail.isdigit():
        raise DeviceReadError(f"accelerator_id {accelerator_id!r} does not end in -<chip index>")
    return int(tail)


def parse_device_plugin(text: str) -> list[ChipReading]:
    """The chips of one host from a device plugin's exposition, sorted by host index.

    The pod-level family wins over its ``_node`` twin where both have a chip. Raises
    :class:`DeviceReadError` for text that is not Prometheus exposition, a non-numeric chip index
    or runtime and host families that disagree on the number of chips.
    """
    found: dict[str, dict[int, float]] = defaultdict(dict)  # field -> global or host index -> value
    from_node: dict[str, dict[int, float]] = defaultdict(dict)
    meta: dict[str, str] = {}
    emulated = False
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError) as err:
        raise DeviceReadError(f"not Prometheus text exposition: {err}") from None
    for family in families:
        if family.name == EMULATED_INFO:
            emulated = True
            continue
        base, node = (
            (family.name[: -len("_node")], True) if family.name.endswith("_node") else (family.name, False)
        )
        field = _RUNTIME.get(base) or _HOST.get(base)
        if field is None:
            continue
        for sample in family.samples:
            if sample.name != family.name or "accelerator_id" not in sample.labels:
                continue
            target = from_node if node else found
            target[field][_index(sample.labels["accelerator_id"])] = _finite(sample.value, family.name)
            meta.setdefault("model", sample.labels.get("model", ""))
            meta.setdefault("topology", sample.labels.get("tpu_topology", ""))
    for field, values in from_node.items():
        found[field] = {**values, **found.get(field, {})}
    return _to_host_chips(found, meta, emulated)


def _to_host_chips(
    found: dict[str, dict[int, float]], meta: dict[str, str], emulated: bool
) -> list[ChipReading]:
    host_ids = sorted({i for f in _HOST.values() for i in found.get(f, {})})
    runtime_ids = sorted({i for f in _RUNTIME.values() for i in found.get(f, {})})
    if host_ids and runtime_ids and len(host_ids) != len(runtime_ids):
        raise DeviceReadError(
            f"runtime metrics name {len(runtime_ids)} chips and host metrics {len(host_ids)}; "
            "expected the same chips in both"
        )
    chips: dict[int, dict[str, float]] = defaultdict(dict)
    for field in _HOST.values():
        for i, value in found.get(field, {}).items():
            chips[host_ids.index(i)][field] = value
    for field in _RUNTIME.values():
        for i, value in found.get(field, {}).items():
            chips[runtime_ids.index(i)][field] = value
    return [
        ChipReading(
            chip=n,
            duty_cycle_percent=v.get("duty_cycle"),
            tensorcore_utilization_percent=v.get("tensorcore"),
            hbm_used_bytes=v.get("hbm_used"),
            hbm_total_bytes=v.get("hbm_total"),
            memory_bandwidth_utilization_percent=v.get("bandwidth"),
            model=meta.get("model", ""),
            topology=meta.get("topology", ""),
            emulated=emulated,
        )
        for n, v in sorted(chips.items())
    ]


def read_device_plugin(address: str, timeout_s: float = 2.0) -> list[ChipReading]:
    """GET ``http://<address>/metrics`` within ``timeout_s`` and parse it."""
    url = f"http://{address}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body = response.read(_MAX_BODY + 1)
    except (OSError, urllib.error.URLError, ValueError) as err:
        raise DeviceReadError(f"{url}: {getattr(err, 'reason', None) or err}") from None
    if len(body) > _MAX_BODY:
        raise DeviceReadError(f"{url}: more than {_MAX_BODY} bytes; a device plugin page is a few KiB")
    try:
        return parse_device_plugin(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise DeviceReadError(f"{url}: not UTF-8 text") from None
    except DeviceReadError as err:
        raise DeviceReadError(f"{url}: {err}") from None
