"""A TPU host's per-chip numbers: the reading type, libtpu's reader and the device plugin's page.

Below every layer that needs them: the control plane's sampler (``observe/``) reads them, and
the hosts' side serves them (the emulated device plugin, ``emulator/deviceplugin.py``, and the
GCE relay, ``host/devicerelay.py``, which the runner actor starts). ``observe.tpumetrics`` re-exports
the names and adds the device plugin's parser.

- **libtpu's runtime metric service** (gRPC on ``localhost:8431`` of a GCE TPU VM, what
  ``tpu-info`` reads): ``GetRuntimeMetric`` for ``tpu.runtime.hbm.memory.total.bytes``,
  ``tpu.runtime.hbm.memory.usage.bytes``, ``tpu.runtime.tensorcore.dutycycle.percent`` and
  ``tpu.runtime.hbm.utilization.percent``, one ``Metric`` per device keyed by the ``int_attr`` of
  its attribute. Memory is per TensorCore device on two-core chips (v2, v3, tpu7x) and duty cycle
  per chip, as tpu-info says; memory of a chip's devices is added up. The protobuf types and the
  stub are the ones the ``tpu-info`` package ships (pinned), never copies; ``grpc`` is imported
  only when a read happens.
- **The device plugin's page** (:func:`render_device_plugin`): the GKE TPU device plugin's
  Prometheus families for given chip readings, the format ``observe.tpumetrics`` parses, and the
  HTTP handler both host-side servers answer ``GET /metrics`` with (:func:`page_handler`).
- **Where a host's page is** (:func:`publish`, :func:`published_endpoints`): each host's runner
  writes its page's ``ip:port`` (the ``$TPU_DEVICE_PLUGIN_ADDR`` the GKE webhook or the emulator set,
  or the GCE relay's) into Ray's internal KV under ``tpufleet:device-plugin:<node id>`` (Ray node
  labels cannot hold ``ip:port``), and the control plane's sampler reads it back. Here, below the
  hosts' code, the emulator and the control plane, so each speaks to the others only through this.
- **The host's device-page hook** (:data:`PAGE_HOOK_VAR`): a host's environment may name a function
  (``module:function``) that its runner calls with that environment to start the host's page; the
  emulator names its device plugin so, and the runner never imports the emulator.

Every read takes a timeout and raises :class:`DeviceReadError` (one line, what and where) on any
failure; the caller decides when to try again.
"""

from __future__ import annotations

import http.server
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

__all__ = [
    "ADDR_VAR",
    "EMULATED_INFO",
    "KV_PREFIX",
    "LIBTPU_ADDR",
    "LIBTPU_METRICS",
    "PAGE_HOOK_VAR",
    "ChipReading",
    "DeviceReadError",
    "page_handler",
    "publish",
    "published_endpoints",
    "read_libtpu",
    "render_device_plugin",
]

log = logging.getLogger(__name__)

LIBTPU_ADDR = "localhost:8431"
LIBTPU_METRICS = {  # libtpu's names, as tpu-info's MetricName has them
    "hbm_total": "tpu.runtime.hbm.memory.total.bytes",
    "hbm_used": "tpu.runtime.hbm.memory.usage.bytes",
    "duty_cycle": "tpu.runtime.tensorcore.dutycycle.percent",
    "bandwidth": "tpu.runtime.hbm.utilization.percent",
}
# An emulated host's device plugin says so with this info family (see emulator/deviceplugin.py).
EMULATED_INFO = "tpufleet_emulated_device_plugin"
ADDR_VAR = "TPU_DEVICE_PLUGIN_ADDR"  # where a host's device plugin listens (GKE webhook, emulator)
KV_PREFIX = "tpufleet:device-plugin:"  # + Ray node id -> the host's device page's ip:port
PAGE_HOOK_VAR = "TPUFLEET_DEVICE_PAGE_HOOK"  # module:function the host's runner calls with its environment
SPARE_MARK = "tpufleet-spare"  # the last argument of a runner's spare (host/spare.py): no job's process yet


def spare_argv(python: str) -> list[str]:
    """The whole command line of a runner's spare (``host/spare.py``) started with ``python``: a
    host's device page counts no such process as a job's. Whole, not the mark alone: a job's own
    process that ends its arguments with the mark is still the job's."""
    return [python, "-I", "-S", str(Path(__file__).resolve().parent / "host" / "sparewait.py"), SPARE_MARK]


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


def _finite(value: float, what: str) -> float:
    if not math.isfinite(value) or value < 0:
        raise DeviceReadError(f"{what} is {value}; expected a finite number >= 0")
    return value


# -- libtpu's runtime metric service --------------------------------------------------------------


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


# -- the device plugin's page ---------------------------------------------------------------------

# (family, help, field of ChipReading, runtime family?) in the order the page lists them. Runtime
# families index chips across the slice, host families 0..n-1 on the host, as the real plugin does.
_FAMILIES = (
    ("duty_cycle", "Percent of time when the TPU was actively processing", "duty_cycle_percent", True),
    ("memory_used", "Allocated TPU memory in bytes", "hbm_used_bytes", True),
    ("memory_total", "Total memory available on the TPU in bytes", "hbm_total_bytes", True),
    ("tensorcore_utilization", "TensorCore utilization percent", "tensorcore_utilization_percent", False),
    (
        "memory_bandwidth_utilization",
        "Memory bandwidth utilization percent",
        "memory_bandwidth_utilization_percent",
        False,
    ),
)


def _labels(pairs: Mapping[str, str]) -> str:
    text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(pairs.items()))
    return "{" + text + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_device_plugin(
    chips: Sequence[ChipReading],
    *,
    id_prefix: str,
    first_index: int = 0,
    model: str = "",
    topology: str = "",
    pod: Mapping[str, str] | None = None,
) -> list[str]:
    """The GKE TPU device plugin's families for ``chips`` (one host), as text lines.

    Each family is written only where some chip has its number, with its ``<name>_node`` twin;
    ``accelerator_id`` is ``<id_prefix>-<index>``, the index counted from ``first_index`` (the
    host's first chip in the slice) in the runtime families and from 0 in the host families.
    ``pod`` labels (``namespace``/``pod``/``container``) go on the pod-level families only.
    """
    base = {"make": "cloud-tpu", "model": model, "tpu_topology": topology}
    lines: list[str] = []
    for name, help_text, attr, runtime in _FAMILIES:
        values = [(c.chip, getattr(c, attr)) for c in chips]
        if all(v is None for _, v in values):
            continue
        for suffix, labels in (("", {**(pod or {}), **base}), ("_node", base)):
            lines += [f"# HELP {name}{suffix} {help_text}", f"# TYPE {name}{suffix} gauge"]
            for chip, value in values:
                if value is None:
                    continue
                index = first_index + chip if runtime else chip
                ident = {"accelerator_id": f"{id_prefix}-{index}", **labels}
                lines.append(f"{name}{suffix}{_labels(ident)} {float(value)}")
    return lines


def page_handler(page: Callable[[], tuple[int, str]]) -> type[http.server.BaseHTTPRequestHandler]:
    """An HTTP handler answering ``GET /metrics`` with ``page()``'s (status, Prometheus text) and
    every other path with 404; it logs nothing (a scrape every few seconds is not news)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "only /metrics here")
                return
            status, text = page()
            body = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


# -- where each host's page is ----------------------------------------------------------------------


def publish(
    address: str, node_id: str | None = None, put: Callable[[str, str], object] | None = None
) -> bool:
    """Tell the control plane where this host's device page is (a ``TPU_DEVICE_PLUGIN_ADDR`` or the
    GCE relay's ``ip:port``): Ray's internal KV under ``KV_PREFIX + node id`` (Ray node labels
    cannot hold ``ip:port``). ``node_id`` defaults to this process's Ray node and ``put`` to Ray's
    KV (only from a process connected to Ray). Returns whether it was published; never raises."""
    try:
        if put is None or node_id is None:
            import ray

            if not ray.is_initialized():
                return False
            node_id = node_id or ray.get_runtime_context().get_node_id()
        (put or _kv_put)(f"{KV_PREFIX}{node_id}", address)
        return True
    except Exception as err:  # Ray away for a moment: the next runner of the host publishes again
        log.debug("cannot publish the device page's address %s: %s", address, err)
        return False


def _kv_put(key: str, value: str) -> object:
    from ray.experimental import internal_kv

    return internal_kv._internal_kv_put(key, value, overwrite=True)


def published_endpoints(node_ids: list[str]) -> dict[str, str]:
    """``{node id: ip:port}`` of the given hosts that published a device page (from a process
    connected to the fleet's Ray)."""
    from ray.experimental import internal_kv

    out = {}
    for node in node_ids:
        value = internal_kv._internal_kv_get(f"{KV_PREFIX}{node}")
        if value:
            out[node] = value.decode() if isinstance(value, bytes) else str(value)
    return out
