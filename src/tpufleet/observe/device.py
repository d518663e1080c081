"""TPU device metrics per chip, joined to slice, host, job and tenant, for ``GET /metrics``.

:class:`DeviceSampler` reads every host's device source (``tpumetrics.py``: the GKE device plugin
over HTTP, the same page from a GCE host's libtpu relay (``host/devicerelay.py``) or the emulator's
plugin, or libtpu's gRPC service where the reader runs on the host) on a timer, each read with a
timeout, several hosts at once. A host that fails is tried again after a growing pause (interval,
2x, 4x ... at most ``max_backoff_s``) for as long as it is in the inventory: unlike Ray's reader,
which stops after one failure, it never gives up for good. A reading older than ``stale_s`` is dropped.

:class:`DeviceCollector` (a prometheus_client collector) exports, for every chip of tpufleet's
own inventory (what is paid for), whether or not it reported:

- ``tpufleet_tpu_duty_cycle_percent{slice,host,chip,accelerator_type,generation,tenant}``: a chip
  whose host reports nothing counts as idle (0), never as missing, so ``avg()`` over it is
  chip-time used over chip-time paid for;
- ``tpufleet_tpu_tensorcore_utilization_percent``, ``tpufleet_tpu_hbm_used_bytes``,
  ``tpufleet_tpu_hbm_total_bytes``: only where the source gave the number;
- ``tpufleet_tpu_metrics_source_up{slice,host,accelerator_type,source,emulated}``: 1 while the
  host's source answered within ``stale_s``;
- ``tpufleet_host_up{slice,host,accelerator_type}``: 1 while the inventory has the host alive
  (the control plane passes the slices its table has: not the dead hosts of one that left);
- ``tpufleet_job_slice_info{job,tenant,slice}``: 1 per slice a running attempt holds (a job
  gauge, so the job label stays off the per-chip series; join with ``* on(slice) group_left(job)``).

``tenant`` is the holder's tenant, empty on a free slice. The targets (:class:`HostTarget`) and
holders come from callables the control plane passes in (:func:`register`); the only Ray call is
reading the addresses hosts publish (:func:`published_or_default`).

In Prometheus the job gauge's ``job`` label meets the scrape job's: scrape the control plane with
``honor_labels: true`` (docs/observability.md), or it arrives as ``exported_job``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tpufleet.contract import SLICE_LABEL, WORKER_LABEL
from tpufleet.fleet import SliceInfo
from tpufleet.observe import tpumetrics
from tpufleet.observe.tpumetrics import ChipReading, DeviceReadError

__all__ = [
    "DEVICE_PLUGIN_PORT_LABEL",
    "GKE_DEVICE_PLUGIN_PORT",
    "METRIC_NAMES",
    "DeviceCollector",
    "DeviceSampler",
    "Endpoint",
    "Holder",
    "HostTarget",
    "endpoints_from_nodes",
    "holders_of",
    "published_or_default",
    "read_endpoint",
    "register",
    "targets_from_slices",
]

log = logging.getLogger(__name__)

GKE_DEVICE_PLUGIN_PORT = 2112  # the GKE TPU webhook sets TPU_DEVICE_PLUGIN_ADDR=<node IP>:2112
# A Ray node label naming the port of the host's device plugin at the node's address; the emulator
# sets it (Ray label values cannot hold ``ip:port``).
DEVICE_PLUGIN_PORT_LABEL = "tpufleet.dev/device-plugin-port"

METRIC_NAMES = (
    "tpufleet_tpu_duty_cycle_percent",
    "tpufleet_tpu_tensorcore_utilization_percent",
    "tpufleet_tpu_hbm_used_bytes",
    "tpufleet_tpu_hbm_total_bytes",
    "tpufleet_tpu_metrics_source_up",
    "tpufleet_host_up",
    "tpufleet_job_slice_info",
)


@dataclass(frozen=True)
class Endpoint:
    """Where one host's device numbers are read: a device plugin's ``host:port`` or libtpu's."""

    kind: Literal["device_plugin", "libtpu"]
    address: str


@dataclass(frozen=True)
class HostTarget:
    """One host of the inventory, with where to read it (None: nowhere known, its chips are idle)."""

    slice: str
    worker_id: int
    accelerator_type: str
    generation: str
    chips: int
    alive: bool
    endpoint: Endpoint | None

    @property
    def key(self) -> tuple[str, int]:
        return (self.slice, self.worker_id)


@dataclass(frozen=True)
class Holder:
    """The running attempt holding a slice."""

    job: str
    tenant: str


Reader = Callable[[Endpoint, float], list[ChipReading]]


def read_endpoint(endpoint: Endpoint, timeout_s: float) -> list[ChipReading]:
    """The default reader: the device plugin over HTTP, or libtpu over gRPC."""
    if endpoint.kind == "libtpu":
        return tpumetrics.read_libtpu(endpoint.address, timeout_s)
    return tpumetrics.read_device_plugin(endpoint.address, timeout_s)


def endpoints_from_nodes(
    nodes: Iterable[Mapping[str, Any]], default_port: int | None = None
) -> dict[tuple[str, int], Endpoint]:
    """Each alive TPU node's device plugin: ``<node address>:<port label>``, else ``default_port``
    (``GKE_DEVICE_PLUGIN_PORT`` where the plugin listens on the Ray node's own address)."""
    out: dict[tuple[str, int], Endpoint] = {}
    for node in nodes:
        labels = node.get("Labels") or {}
        name, worker = labels.get(SLICE_LABEL), labels.get(WORKER_LABEL)
        address = node.get("NodeManagerAddress")
        if not (node.get("Alive") and name and worker is not None and str(worker).isdigit() and address):
            continue
        port = labels.get(DEVICE_PLUGIN_PORT_LABEL)
        if port and str(port).isdigit():
            out[(name, int(worker))] = Endpoint("device_plugin", f"{address}:{port}")
        elif default_port is not None:
            out[(name, int(worker))] = Endpoint("device_plugin", f"{address}:{default_port}")
    return out


def targets_from_slices(
    slices: Sequence[SliceInfo], endpoints: Mapping[tuple[str, int], Endpoint]
) -> list[HostTarget]:
    """Every host every slice should have (missing ones too: their chips are still paid for)."""
    out = []
    for s in slices:
        chips = s.chips_per_host
        generation = s.accelerator_type.rsplit("-", 1)[0]
        with_ids = {h.worker_id: h for h in s.hosts}
        for worker in range(max(s.expected_hosts, len(with_ids))):
            host = with_ids.get(worker)
            alive = bool(host and host.alive)
            out.append(
                HostTarget(
                    s.name,
                    worker,
                    s.accelerator_type,
                    generation,
                    chips,
                    alive,
                    endpoints.get((s.name, worker)) if alive else None,
                )
            )
    return out


@dataclass
class _HostState:
    readings: list[ChipReading] = field(default_factory=list)
    read_at: float | None = None  # monotonic time of the last good read
    failures: int = 0
    next_try: float = 0.0
    last_error: str = ""


class DeviceSampler:
    """Reads every host's device source on a timer; see the module docstring.

    ``targets`` and ``holders`` are called once per round (the inventory and who holds which
    slice); ``reader`` and ``clock`` are injectable for tests. :meth:`sample_once` does one round
    now; :meth:`start` runs rounds every ``interval_s`` on a daemon thread until :meth:`stop`.
    """

    def __init__(
        self,
        targets: Callable[[], Sequence[HostTarget]],
        holders: Callable[[], Mapping[str, Holder]] = dict,
        *,
        reader: Reader = read_endpoint,
        clock: Callable[[], float] = time.monotonic,
        interval_s: float = 10.0,
        timeout_s: float = 2.0,
        max_backoff_s: float = 120.0,
        stale_s: float | None = None,
        workers: int = 16,
    ) -> None:
        self._targets_fn, self._holders_fn = targets, holders
        self._reader, self._clock = reader, clock
        self.interval_s, self.timeout_s, self.max_backoff_s = interval_s, timeout_s, max_backoff_s
        self.stale_s = stale_s if stale_s is not None else 3 * interval_s + timeout_s
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tpufleet-device")
        self._lock = threading.Lock()
        self._hosts: dict[tuple[str, int], _HostState] = {}
        self._targets: list[HostTarget] = []
        self._holders: dict[str, Holder] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- sampling ---------------------------------------------------------------------------------
    def sample_once(self) -> int:
        """One round: refresh the targets and holders, read every due host; returns how many were
        read. A failing ``targets``/``holders`` call keeps the previous round's view."""
        try:
            targets = list(self._targets_fn())
            holders = dict(self._holders_fn())
        except Exception as err:  # the store or Ray is away for a moment: keep the last view
            log.warning("device sampler: cannot read the inventory: %s", err)
            return 0
        now = self._clock()
        with self._lock:
            self._targets, self._holders = targets, holders
            keys = {t.key for t in targets}
            for gone in set(self._hosts) - keys:
                del self._hosts[gone]
            due = [
                t
                for t in targets
                if t.endpoint is not None and self._hosts.setdefault(t.key, _HostState()).next_try <= now
            ]
        futures = [
            (t, self._pool.submit(self._reader, t.endpoint, self.timeout_s)) for t in due if t.endpoint
        ]
        for target, future in futures:
            try:
                readings, error = future.result(timeout=self.timeout_s + 5.0), ""
            except DeviceReadError as err:
                readings, error = None, str(err)
            except Exception as err:  # a reader bug or a hung read must not stop the other hosts
                readings, error = None, f"{type(err).__name__}: {err}"
            self._record(target.key, readings, error)
        return len(futures)

    def _record(self, key: tuple[str, int], readings: list[ChipReading] | None, error: str) -> None:
        now = self._clock()
        with self._lock:
            state = self._hosts.get(key)
            if state is None:
                return
            if readings is not None:
                state.readings, state.read_at, state.failures, state.last_error = readings, now, 0, ""
                state.next_try = now + self.interval_s
                return
            state.failures += 1
            state.last_error = error
            state.next_try = now + min(self.max_backoff_s, self.interval_s * 2 ** (state.failures - 1))
            if state.failures == 1:
                log.info("device metrics of %s/%d: %s; trying again later", key[0], key[1], error)

    # -- reading back -------------------------------------------------------------------------------
    def view(self) -> tuple[list[HostTarget], dict[str, Holder], dict[tuple[str, int], list[ChipReading]]]:
        """The last round's targets and holders and every host's fresh readings."""
        now = self._clock()
        with self._lock:
            fresh = {
                k: s.readings
                for k, s in self._hosts.items()
                if s.read_at is not None and now - s.read_at <= self.stale_s
            }
            return list(self._targets), dict(self._holders), fresh

    def failures(self) -> dict[tuple[str, int], tuple[int, str]]:
        """Hosts whose last read failed: (failures in a row, the last error)."""
        with self._lock:
            return {k: (s.failures, s.last_error) for k, s in self._hosts.items() if s.failures}

    # -- running ------------------------------------------------------------------------------------
    def start(self) -> DeviceSampler:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tpufleet-device-sampler", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception:  # never let the thread die: the next round tries again
                log.exception("device sampler round failed")
            self._stop.wait(min(1.0, self.interval_s) if not self._targets else self.interval_s / 2)

    def stop(self, wait_s: float | None = None) -> None:
        """Stop sampling; wait up to ``wait_s`` (default: one read's timeout + 5 s) for a round
        under way. The thread is a daemon: one still stuck in a read ends with the process."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 5.0 if wait_s is None else wait_s)
            self._thread = None
        self._pool.shutdown(wait=False, cancel_futures=True)


class DeviceCollector(Collector):
    """prometheus_client collector over a :class:`DeviceSampler`'s last view."""

    def __init__(self, sampler: DeviceSampler) -> None:
        self.sampler = sampler

    def describe(self) -> list[GaugeMetricFamily]:
        return list(_families().values())  # fixed names: registering checks them for clashes

    def collect(self) -> Iterator[GaugeMetricFamily]:
        targets, holders, fresh = self.sampler.view()
        fams = _families()
        duty, core, used, total, source, host_up, held = fams.values()
        for t in targets:
            holder = holders.get(t.slice)
            tenant = holder.tenant if holder else ""
            host = str(t.worker_id)
            readings = {r.chip: r for r in fresh.get(t.key, [])}
            emulated = any(r.emulated for r in readings.values())
            host_up.add_metric([t.slice, host, t.accelerator_type], 1.0 if t.alive else 0.0)
            if t.endpoint is not None:
                source.add_metric(
                    [t.slice, host, t.accelerator_type, t.endpoint.kind, "true" if emulated else "false"],
                    1.0 if t.key in fresh else 0.0,
                )
            for chip in range(t.chips):
                labels = [t.slice, host, str(chip), t.accelerator_type, t.generation, tenant]
                r = readings.get(chip)
                duty.add_metric(labels, (r.duty_cycle_percent or 0.0) if r else 0.0)  # no report: idle
                if r is None:
                    continue
                for family, value in (
                    (core, r.tensorcore_utilization_percent),
                    (used, r.hbm_used_bytes),
                    (total, r.hbm_total_bytes),
                ):
                    if value is not None:
                        family.add_metric(labels, value)
        for slice_name, holder in sorted(holders.items()):
            held.add_metric([holder.job, holder.tenant, slice_name], 1.0)
        yield from fams.values()


_CHIP = ["slice", "host", "chip", "accelerator_type", "generation", "tenant"]


def _families() -> dict[str, GaugeMetricFamily]:
    return {
        "duty": GaugeMetricFamily(
            "tpufleet_tpu_duty_cycle_percent",
            "Percent of time the chip was busy (device plugin duty_cycle / libtpu dutycycle); "
            "0 for a chip whose host reports nothing.",
            labels=_CHIP,
        ),
        "core": GaugeMetricFamily(
            "tpufleet_tpu_tensorcore_utilization_percent",
            "TensorCore utilization percent of the chip, as its device plugin reports it.",
            labels=_CHIP,
        ),
        "used": GaugeMetricFamily(
            "tpufleet_tpu_hbm_used_bytes", "HBM allocated on the chip, bytes.", labels=_CHIP
        ),
        "total": GaugeMetricFamily("tpufleet_tpu_hbm_total_bytes", "HBM of the chip, bytes.", labels=_CHIP),
        "source": GaugeMetricFamily(
            "tpufleet_tpu_metrics_source_up",
            "1 while the host's device source (device plugin or libtpu) answered recently.",
            labels=["slice", "host", "accelerator_type", "source", "emulated"],
        ),
        "host_up": GaugeMetricFamily(
            "tpufleet_host_up",
            "1 while the inventory has the TPU host alive, 0 while it is missing or dead.",
            labels=["slice", "host", "accelerator_type"],
        ),
        "held": GaugeMetricFamily(
            "tpufleet_job_slice_info",
            "1 for each slice a running job's attempt holds.",
            labels=["job", "tenant", "slice"],
        ),
    }


# -- wiring into a control plane ------------------------------------------------------------------


def published_or_default(
    slices: Sequence[SliceInfo], default_port: int | None = None
) -> dict[tuple[str, int], Endpoint]:
    """Each alive host's device plugin: the ``TPU_DEVICE_PLUGIN_ADDR`` its runner published (Ray's
    internal KV, see ``tpudevice.publish``; an emulated host's, a GKE host's, or a GCE
    host's libtpu relay, ``host/devicerelay.py``), else
    ``<host address>:<default_port>`` when given (a plugin on the Ray node's own address)."""
    hosts = [(s.name, h) for s in slices for h in s.hosts if h.alive]
    published: dict[str, str] = {}
    node_ids = [h.node_id for _, h in hosts if h.node_id]
    if node_ids:
        try:
            import ray

            if ray.is_initialized():
                from tpufleet.tpudevice import published_endpoints

                published = published_endpoints(node_ids)
        except Exception as err:  # Ray away for a moment: next round
            log.debug("device plugin addresses unreadable: %s", err)
    out = {}
    for name, h in hosts:
        if h.node_id in published:
            out[(name, h.worker_id)] = Endpoint("device_plugin", published[h.node_id])
        elif default_port is not None and h.address:
            out[(name, h.worker_id)] = Endpoint("device_plugin", f"{h.address}:{default_port}")
    return out


def holders_of(open_attempts: Iterable[Any]) -> dict[str, Holder]:
    """``{slice: Holder}`` from attempts that hold slices (``job_id``, ``tenant``, ``slices``)."""
    return {name: Holder(a.job_id, a.tenant) for a in open_attempts for name in a.slices}


def register(
    registry: Any,
    inventory: Callable[[], Sequence[SliceInfo]],
    holders: Callable[[], Mapping[str, Holder]],
    *,
    default_port: int | None = None,
    interval_s: float = 10.0,
) -> DeviceSampler:
    """Register a :class:`DeviceCollector` on ``registry`` over a new sampler of ``inventory``'s
    hosts (not started: call ``start()`` with the control plane's loop, ``stop()`` on close)."""

    def targets() -> list[HostTarget]:
        slices = list(inventory())
        return targets_from_slices(slices, published_or_default(slices, default_port))

    sampler = DeviceSampler(targets, holders, interval_s=interval_s)
    registry.register(DeviceCollector(sampler))
    return sampler
