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
  ``tpu-info`` reads): ``GetRuntimeMetric`` for ``tpu.runtime.hbm.memory.total.bytes``,
  ``tpu.runtime.hbm.memory.usage.bytes``, ``tpu.runtime.tensorcore.dutycycle.percent`` and
  ``tpu.runtime.hbm.utilization.percent``, one ``Metric`` per device keyed by the ``int_attr`` of
  its attribute. Memory is per TensorCore device on two-core chips (v2, v3, tpu7x) and duty cycle
  per chip, as tpu-info says; memory of a chip's devices is added up. The protobuf types and the
  stub are the ones the ``tpu-info`` package ships (pinned), never copies.

Every read takes a timeout and raises :class:`DeviceReadError` (one line, what and where) on any
failure; the sampler (``device.py``) decides when to try again.
"""

from __future__ import annotations

import math
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace

from prometheus_client.parser import text_string_to_metric_families

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

LIBTPU_ADDR = "localhost:8431"
LIBTPU_METRICS = {  # libtpu's names, as tpu-info's MetricName has them
    "hbm_total": "tpu.runtime.hbm.memory.total.bytes",
    "hbm_used": "tpu.runtime.hbm.memory.usage.bytes",
    "duty_cycle": "tpu.runtime.tensorcore.dutycycle.percent",
    "bandwidth": "tpu.runtime.hbm.utilization.percent",
}
# An emulated host's device plugin says so with this info family (see emulator/deviceplugin.py).
EMULATED_INFO = "tpufleet_emulated_device_plugin"

_RUNTIME = {"duty_cycle": "duty_cycle", "memory_used": "hbm_used", "memory_total": "hbm_total"}
_HOST = {"tensorcore_utilization": "tensorcore", "memory_bandwidth_utilization": "bandwidth"}
_MAX_BODY = 4 << 20  # a device plugin's page is a few KiB; refuse anything absurd


class DeviceReadError(Exception):
    """A host's device numbers could not be read or made sense of; the message says which and why."""


@dataclass(frozen=True)
class ChipReading:
    """One chip's numbers, indexed 0..n-1 on its host; None where the source gave nothing."""

    chip: int
    duty_cycle_percent: float | None = None
    tensorcore_utilization_percent: float | None = None
    hbm_used_bytes: float | None = None
    hbm_total_bytes: float | None = None
    memory_bandwidth_utilization_percent: float | None = None
    model: str = ""
    topology: str = ""
    emulated: bool = False


def _index(accelerator_id: str) -> int:
    tail = accelerator_id.rsplit("-", 1)[-1]
    if not tail.isdigit():
        raise DeviceReadError(f"accelerator_id {accelerator_id!r} does not end in -<chip index>")
    return int(tail)


def _finite(value: float, what: str) -> float:
    if not math.isfinite(value) or value < 0:
        raise DeviceReadError(f"{what} is {value}; expected a finite number >= 0")
    return value


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


def _by_device(metrics: Iterable[object], as_double: bool) -> list[float]:
    """Values of one libtpu metric in device order (``attribute.value.int_attr``)."""
    pairs = []
    for m in metrics:
        key = m.attribute.value.int_attr  # type: ignore[attr-defined]
        gauge = m.gauge  # type: ignore[attr-defined]
        pairs.append((key, float(gauge.as_double if as_double else gauge.as_int)))
    return [v for _, v in sorted(pairs)]


def _per_chip(values: list[float], chips: int) -> list[float]:
    """Per-device values added up per chip (two TensorCore devices per chip on v2/v3/tpu7x)."""
    if chips == 0 or len(values) % chips:
        raise DeviceReadError(f"libtpu reports memory for {len(values)} devices over {chips} chips")
    per = len(values) // chips
    return [sum(values[i * per : (i + 1) * per]) for i in range(chips)]


def read_libtpu(address: str = LIBTPU_ADDR, timeout_s: float = 2.0) -> list[ChipReading]:
    """Duty cycle, HBM used/total and HBM bandwidth of every chip from libtpu's metric service.

    Connects as tpu-info does (``grpc.local_channel_credentials``: the service only answers local
    callers) with ``timeout_s`` per call. A missing bandwidth metric (older libtpu) is left None.
    """
    import grpc
    from tpu_info.proto import tpu_metric_service_pb2 as pb
    from tpu_info.proto import tpu_metric_service_pb2_grpc as pb_grpc

    def get(stub: object, name: str) -> list[object]:
        resp = stub.GetRuntimeMetric(pb.MetricRequest(metric_name=name), timeout=timeout_s)  # type: ignore[attr-defined]
        return list(resp.metric.metrics)

    with grpc.secure_channel(address, grpc.local_channel_credentials()) as channel:
        stub = pb_grpc.RuntimeMetricServiceStub(channel)
        try:
            duty = _by_device(get(stub, LIBTPU_METRICS["duty_cycle"]), as_double=True)
            total = _by_device(get(stub, LIBTPU_METRICS["hbm_total"]), as_double=False)
            used = _by_device(get(stub, LIBTPU_METRICS["hbm_used"]), as_double=False)
        except grpc.RpcError as err:
            raise DeviceReadError(f"libtpu at {address}: {err.code().name} {err.details()}") from None
        try:
            bandwidth: list[float] | None = _by_device(get(stub, LIBTPU_METRICS["bandwidth"]), as_double=True)
        except grpc.RpcError:
            bandwidth = None
    chips = len(duty)
    used_c, total_c = _per_chip(used, chips), _per_chip(total, chips)
    band = bandwidth if bandwidth is not None and len(bandwidth) == chips else None
    out = []
    for i in range(chips):
        reading = ChipReading(
            chip=i,
            duty_cycle_percent=_finite(duty[i], "duty cycle"),
            hbm_used_bytes=_finite(used_c[i], "HBM used"),
            hbm_total_bytes=_finite(total_c[i], "HBM total"),
        )
        if band is not None:
            reading = replace(reading, memory_bandwidth_utilization_percent=_finite(band[i], "HBM bandwidth"))
        out.append(reading)
    return out
