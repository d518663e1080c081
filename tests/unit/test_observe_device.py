"""TPU device metrics: the device-plugin parser on a real exposition, libtpu's gRPC service with the
real protobuf types, the sampler's retries, and the collector's join and idle-chip rule."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import libtpu_fake
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from tpu_info.proto import tpu_metric_service_pb2 as pb
from tpu_info.proto import tpu_metric_service_pb2_grpc as pb_grpc

from tpufleet.fleet import HostInfo, SliceInfo
from tpufleet.observe import device, tpumetrics
from tpufleet.observe.device import DeviceCollector, DeviceSampler, Endpoint, Holder, HostTarget
from tpufleet.observe.tpumetrics import ChipReading, DeviceReadError

V5P = (Path(__file__).parent / "data" / "device_plugin_v5p.prom").read_text()


# -- the device plugin's exposition ------------------------------------------------------------------


def test_real_v5p_exposition_maps_slice_indices_onto_host_chips() -> None:
    chips = tpumetrics.parse_device_plugin(V5P)
    assert [c.chip for c in chips] == [0, 1, 2, 3]
    # duty cycle and memory are indexed 404, 405, 412, 413 in the slice; tensor core 0..3 on the host
    assert [c.duty_cycle_percent for c in chips] == [100, 100, 100, 100]
    assert [c.tensorcore_utilization_percent for c in chips] == [1.0, 2.0, 3.0, 4.0]
    assert {c.hbm_used_bytes for c in chips} == {6.5e10}
    assert {c.hbm_total_bytes for c in chips} == {1.02803439616e11}
    assert {c.memory_bandwidth_utilization_percent for c in chips} == {30.0}  # the pod's, not _node's
    assert {(c.model, c.topology, c.emulated) for c in chips} == {("tpu-v5p-slice", "8x8x16", False)}


def test_node_families_stand_in_when_no_container_holds_the_chips() -> None:
    pod_level = (
        "duty_cycle{",
        "memory_used{",
        "memory_total{",
        "tensorcore_utilization{",
        "memory_bandwidth_utilization{",
    )
    node_only = "\n".join(line for line in V5P.splitlines() if not line.startswith(pod_level)) + "\n"
    chips = tpumetrics.parse_device_plugin(node_only)
    assert len(chips) == 4
    assert chips[0].memory_bandwidth_utilization_percent == pytest.approx(30.440544843673706)
    assert chips[3].tensorcore_utilization_percent == 4.0


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('duty_cycle{accelerator_id="1-x"} 5\n', "chip index"),
        ('duty_cycle{accelerator_id="1-0"} -3\n', ">= 0"),
        (
            'duty_cycle{accelerator_id="1-7"} 1\nduty_cycle{accelerator_id="1-8"} 1\n'
            'tensorcore_utilization{accelerator_id="1-0"} 1\n',
            "same chips",
        ),
        ('duty_cycle{accelerator_id="1-0" 5\n', "not Prometheus"),
    ],
)
def test_nonsense_is_one_clear_error(text: str, why: str) -> None:
    with pytest.raises(DeviceReadError, match=why):
        tpumetrics.parse_device_plugin(text)


class _Handler(http.server.BaseHTTPRequestHandler):
    body = V5P.encode()

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def plugin_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_read_device_plugin_over_http(plugin_server: str) -> None:
    chips = tpumetrics.read_device_plugin(plugin_server, timeout_s=2)
    assert [c.tensorcore_utilization_percent for c in chips] == [1.0, 2.0, 3.0, 4.0]


def test_a_host_that_never_answers_fails_within_the_timeout() -> None:
    with socket.socket() as silent:  # accepts connections (backlog) but never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        with pytest.raises(DeviceReadError, match="timed out"):
            tpumetrics.read_device_plugin(f"127.0.0.1:{silent.getsockname()[1]}", timeout_s=0.3)


def test_nothing_listening_is_a_read_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DeviceReadError, match=f"127.0.0.1:{port}"):
        tpumetrics.read_device_plugin(f"127.0.0.1:{port}", timeout_s=1)


# -- libtpu's runtime metric service (tpu-info's protobuf types) ----------------------------------------


class _Libtpu(pb_grpc.RuntimeMetricServiceServicer):
    """Two chips of two TensorCore devices each (memory per device, duty cycle per chip)."""

    def __init__(self, with_bandwidth: bool = True) -> None:
        self.with_bandwidth = with_bandwidth
        self.asked: list[str] = []

    def GetRuntimeMetric(self, request: pb.MetricRequest, context: grpc.ServicerContext) -> pb.MetricResponse:
        self.asked.append(request.metric_name)
        names = tpumetrics.LIBTPU_METRICS
        if request.metric_name == names["duty_cycle"]:
            rows = [(1, pb.Gauge(as_double=75.5)), (0, pb.Gauge(as_double=12.0))]  # out of order on purpose
        elif request.metric_name == names["hbm_total"]:
            rows = [(d, pb.Gauge(as_int=96 << 30)) for d in range(4)]
        elif request.metric_name == names["hbm_used"]:
            rows = [(d, pb.Gauge(as_int=(d + 1) << 30)) for d in range(4)]
        elif request.metric_name == names["bandwidth"] and self.with_bandwidth:
            rows = [(0, pb.Gauge(as_double=3.5)), (1, pb.Gauge(as_double=40.0))]
        else:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no metric {request.metric_name}")
        return libtpu_fake.metric_response(request.metric_name, rows)


@pytest.mark.parametrize("with_bandwidth", [True, False])
def test_read_libtpu_from_a_real_grpc_server(with_bandwidth: bool) -> None:
    servicer = _Libtpu(with_bandwidth)
    server, address = libtpu_fake.serve(servicer)
    try:
        chips = tpumetrics.read_libtpu(address, timeout_s=5)
    finally:
        server.stop(None)
    assert [c.duty_cycle_percent for c in chips] == [12.0, 75.5]
    assert [c.hbm_used_bytes for c in chips] == [3 << 30, 7 << 30]  # devices 0+1, 2+3
    assert [c.hbm_total_bytes for c in chips] == [192 << 30, 192 << 30]
    expected = [3.5, 40.0] if with_bandwidth else [None, None]
    assert [c.memory_bandwidth_utilization_percent for c in chips] == expected
    assert "tpu.runtime.tensorcore.dutycycle.percent" in servicer.asked


def test_libtpu_not_running_is_a_read_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DeviceReadError, match=r"UNAVAILABLE|DEADLINE_EXCEEDED"):
        tpumetrics.read_libtpu(f"127.0.0.1:{port}", timeout_s=1)


# -- the sampler and the collector ---------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _target(slice_name: str, worker: int, chips: int = 4, endpoint: bool = True) -> HostTarget:
    ep = Endpoint("device_plugin", f"{slice_name}/{worker}") if endpoint else None
    return HostTarget(slice_name, worker, "v4-16", "v4", chips, True, ep)


def test_a_failing_host_is_retried_with_growing_pauses_and_never_dropped() -> None:
    clock, calls, broken = _Clock(), [], {"a/1"}

    def reader(ep: Endpoint, timeout_s: float) -> list[ChipReading]:
        calls.append(ep.address)
        if ep.address in broken:
            raise DeviceReadError(f"{ep.address}: connection refused")
        return [ChipReading(chip=i, duty_cycle_percent=50.0) for i in range(4)]

    targets = [_target("a", 0), _target("a", 1)]
    s = DeviceSampler(lambda: targets, reader=reader, clock=clock, interval_s=10, max_backoff_s=40)
    tries_at = []
    for _ in range(30):  # 300 s of rounds, one every 10 s
        before = calls.count("a/1")
        s.sample_once()
        if calls.count("a/1") > before:
            tries_at.append(clock.now - 1000)
        clock.now += 10
    assert tries_at[:5] == [0, 10, 30, 70, 110]  # pauses 10, 20, 40, then capped at 40
    assert len(tries_at) >= 8  # still trying at the end
    assert s.failures()[("a", 1)][0] == len(tries_at)
    broken.clear()
    clock.now = 1000 + 10 * 30 + 40  # past any pause
    s.sample_once()
    assert ("a", 1) not in s.failures()
    assert set(s.view()[2]) == {("a", 0), ("a", 1)}
    s.stop()


def test_a_reading_goes_stale_when_the_host_stops_answering() -> None:
    clock, ok = _Clock(), [True]

    def reader(ep: Endpoint, timeout_s: float) -> list[ChipReading]:
        if not ok[0]:
            raise DeviceReadError("down")
        return [ChipReading(chip=0, duty_cycle_percent=80.0)]

    s = DeviceSampler(
        lambda: [_target("a", 0, chips=1)], reader=reader, clock=clock, interval_s=10, stale_s=25
    )
    s.sample_once()
    assert s.view()[2] == {("a", 0): [ChipReading(chip=0, duty_cycle_percent=80.0)]}
    ok[0] = False
    for _ in range(3):
        clock.now += 10
        s.sample_once()
    assert s.view()[2] == {}
    s.stop()


def _scrape(collector: DeviceCollector) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {f.name: [(s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(text)}


def test_collector_joins_chips_to_holder_and_counts_silent_chips_as_idle() -> None:
    def reader(ep: Endpoint, timeout_s: float) -> list[ChipReading]:
        if ep.address == "a/0":
            return [ChipReading(i, 80.0, 70.0, 1e9, 32e9, emulated=True) for i in range(4)]
        raise DeviceReadError("refused")

    targets = [_target("a", 0), _target("a", 1), _target("b", 0, endpoint=False)]
    s = DeviceSampler(lambda: targets, lambda: {"a": Holder("job-1", "alpha")}, reader=reader, clock=_Clock())
    s.sample_once()
    got = _scrape(DeviceCollector(s))
    duty = {
        (lab["slice"], lab["host"], lab["chip"]): (lab["tenant"], v)
        for lab, v in got["tpufleet_tpu_duty_cycle_percent"]
    }
    assert len(duty) == 12  # every chip of the inventory, reporting or not
    assert duty[("a", "0", "2")] == ("alpha", 80.0)
    assert duty[("a", "1", "0")] == ("alpha", 0.0)  # held but silent: idle, not missing
    assert duty[("b", "0", "3")] == ("", 0.0)
    fleet_utilization = sum(v for _, v in duty.values()) / 100 / len(duty)
    assert fleet_utilization == pytest.approx(4 * 0.8 / 12)
    assert {lab["slice"] + lab["host"] for lab, _ in got["tpufleet_tpu_hbm_used_bytes"]} == {"a0"}
    assert {
        (lab["slice"], lab["host"], lab["emulated"], v) for lab, v in got["tpufleet_tpu_metrics_source_up"]
    } == {
        ("a", "0", "true", 1.0),
        ("a", "1", "false", 0.0),
    }
    assert got["tpufleet_job_slice_info"] == [({"job": "job-1", "tenant": "alpha", "slice": "a"}, 1.0)]
    assert set(device.METRIC_NAMES) <= set(got)
    s.stop()


def test_targets_cover_missing_hosts_and_endpoints_come_from_node_labels() -> None:
    nodes = [
        {
            "Alive": True,
            "NodeManagerAddress": "10.0.0.5",
            "Labels": {
                "ray.io/tpu-slice-name": "s",
                "ray.io/tpu-worker-id": "0",
                device.DEVICE_PLUGIN_PORT_LABEL: "4100",
            },
        },
        {
            "Alive": True,
            "NodeManagerAddress": "10.0.0.6",
            "Labels": {"ray.io/tpu-slice-name": "s", "ray.io/tpu-worker-id": "1"},
        },
        {
            "Alive": False,
            "NodeManagerAddress": "10.0.0.7",
            "Labels": {
                "ray.io/tpu-slice-name": "t",
                "ray.io/tpu-worker-id": "0",
                device.DEVICE_PLUGIN_PORT_LABEL: "1",
            },
        },
    ]
    assert device.endpoints_from_nodes(nodes) == {("s", 0): Endpoint("device_plugin", "10.0.0.5:4100")}
    eps = device.endpoints_from_nodes(nodes, default_port=device.GKE_DEVICE_PLUGIN_PORT)
    assert eps[("s", 1)] == Endpoint("device_plugin", "10.0.0.6:2112")
    sl = SliceInfo(
        "s", "v4-16", "2x2x2", 2, (HostInfo(0, "n0", "10.0.0.5", True),), problems=("host 1 missing",)
    )
    targets = device.targets_from_slices([sl], eps)
    assert [(t.worker_id, t.chips, t.alive, t.endpoint) for t in targets] == [
        (0, 4, True, Endpoint("device_plugin", "10.0.0.5:4100")),
        (1, 4, False, None),
    ]


def test_register_wires_inventory_and_holders_into_a_registry_and_the_thread_samples() -> None:
    sl = SliceInfo("s", "v6e-4", "2x2", 1, (HostInfo(0, None, "127.0.0.1", True),))
    registry = CollectorRegistry()
    sampler = device.register(registry, lambda: [sl], lambda: {"s": Holder("job-9", "beta")}, interval_s=0.05)
    assert _families_of(registry)["tpufleet_tpu_duty_cycle_percent"] == []  # nothing sampled yet
    sampler.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not _families_of(registry)["tpufleet_tpu_duty_cycle_percent"]:
            time.sleep(0.05)
    finally:
        sampler.stop()
    duty = _families_of(registry)["tpufleet_tpu_duty_cycle_percent"]
    assert [(lab["chip"], lab["tenant"], v) for lab, v in duty] == [(str(i), "beta", 0.0) for i in range(4)]
    assert _families_of(registry)["tpufleet_host_up"] == [
        ({"slice": "s", "host": "0", "accelerator_type": "v6e-4"}, 1.0)
    ]


def _families_of(registry: CollectorRegistry) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = generate_latest(registry).decode()
    return {f.name: [(s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(text)}
