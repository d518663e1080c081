"""The GCE relay (``host/devicerelay.py``): a real libtpu-shaped gRPC server (tpu-info's generated types)
read by the relay on 127.0.0.1, its page scraped over HTTP and parsed by the control plane's own
reader; a failed libtpu read is a 503 with the reason; a host without libtpu still gets a relay;
the address is published under the key the control plane reads; runners of one host share a port."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import libtpu_fake
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tpu_info.proto import tpu_metric_service_pb2 as pb
from tpu_info.proto import tpu_metric_service_pb2_grpc as pb_grpc

from tpufleet import tpudevice
from tpufleet.emulator import procs
from tpufleet.host import devicerelay
from tpufleet.host.devicerelay import HostFacts, Node, Relay
from tpufleet.observe import device, tpumetrics
from tpufleet.observe.tpumetrics import DeviceReadError

GIB = 1 << 30


class _Libtpu(pb_grpc.RuntimeMetricServiceServicer):
    """libtpu's metric service for ``chips`` chips of ``cores`` TensorCore devices each: duty cycle
    per chip, memory per device (as tpu-info documents), bandwidth per chip where ``bandwidth``."""

    def __init__(self, chips: int, cores: int, bandwidth: bool) -> None:
        self.chips, self.cores, self.bandwidth = chips, cores, bandwidth
        self.duty = [10.0 + 20 * c for c in range(chips)]

    def GetRuntimeMetric(self, request: pb.MetricRequest, context: grpc.ServicerContext) -> pb.MetricResponse:
        names = tpudevice.LIBTPU_METRICS
        devices = self.chips * self.cores
        if request.metric_name == names["duty_cycle"]:
            rows = [(c, pb.Gauge(as_double=self.duty[c])) for c in reversed(range(self.chips))]
        elif request.metric_name == names["hbm_total"]:
            rows = [(d, pb.Gauge(as_int=16 * GIB)) for d in range(devices)]
        elif request.metric_name == names["hbm_used"]:
            rows = [(d, pb.Gauge(as_int=(d + 1) * GIB)) for d in range(devices)]
        elif request.metric_name == names["bandwidth"] and self.bandwidth:
            rows = [(c, pb.Gauge(as_double=5.0 * (c + 1))) for c in range(self.chips)]
        else:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no metric {request.metric_name}")
        return libtpu_fake.metric_response(request.metric_name, rows)


def _free_port() -> int:
    return procs.free_port()  # below the ephemeral range: nobody takes it meanwhile


def _scrape(relay: Relay) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{relay.address}/metrics", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.fixture
def relays() -> Iterator[list[Relay]]:
    started: list[Relay] = []
    yield started
    for relay in started:
        relay.close()


def _start(relays: list[Relay], facts: HostFacts, libtpu: str, **kw: object) -> Relay:
    relay = devicerelay.start("127.0.0.1", facts, port=0, libtpu=libtpu, timeout_s=5, **kw)  # type: ignore[arg-type]
    relays.append(relay)
    assert relay.serving.wait(10)
    return relay


@pytest.mark.parametrize(
    ("accelerator_type", "topology", "cores", "bandwidth", "model"),
    [
        ("tpu7x-8", "2x2x1", 2, True, "tpu7x"),  # two TensorCore devices per chip: memory added up
        ("v5litepod-8", "2x4", 1, False, "tpu-v5-lite-podslice"),  # one device per chip, older libtpu
    ],
)
def test_relay_serves_libtpu_as_the_device_plugin_page(
    relays: list[Relay], accelerator_type: str, topology: str, cores: int, bandwidth: bool, model: str
) -> None:
    chips = 4
    servicer = _Libtpu(chips, cores, bandwidth)
    server, libtpu = libtpu_fake.serve(servicer)
    try:
        facts = HostFacts("my-slice", 1, accelerator_type, "")
        relay = _start(relays, facts, libtpu)
        status, text = _scrape(relay)
        assert status == 200, text
        parsed = tpumetrics.parse_device_plugin(text)  # the control plane's parser
        assert [c.chip for c in parsed] == list(range(chips))
        assert [c.duty_cycle_percent for c in parsed] == [10.0, 30.0, 50.0, 70.0]
        used = [sum(range(c * cores + 1, (c + 1) * cores + 1)) * GIB for c in range(chips)]
        assert [c.hbm_used_bytes for c in parsed] == used
        assert [c.hbm_total_bytes for c in parsed] == [cores * 16 * GIB] * chips
        expected_bw = [5.0, 10.0, 15.0, 20.0] if bandwidth else [None] * chips
        assert [c.memory_bandwidth_utilization_percent for c in parsed] == expected_bw
        assert {(c.model, c.topology, c.emulated) for c in parsed} == {(model, topology, False)}
        assert tpudevice.EMULATED_INFO not in text
        assert "duty_cycle_node{" in text and 'make="cloud-tpu"' in text
        assert ("memory_bandwidth_utilization{" in text) == bandwidth
        ids = {
            s.labels["accelerator_id"].rsplit("-", 1)[1]
            for f in text_string_to_metric_families(text)
            if f.name == "duty_cycle"
            for s in f.samples
        }
        assert ids == {"4", "5", "6", "7"}  # runtime families count across the slice: host 1's first is 4

        servicer.duty = [99.0] * chips  # every scrape reads libtpu afresh
        endpoint = device.Endpoint("device_plugin", relay.address)
        read = device.read_endpoint(endpoint, 5.0)  # the sampler's own read
        assert [c.duty_cycle_percent for c in read] == [99.0] * chips
    finally:
        server.stop(None)


def test_a_failed_libtpu_read_is_503_with_the_reason_and_read_again_later(relays: list[Relay]) -> None:
    port = _free_port()  # libtpu not running (yet) on this host
    relay = _start(relays, HostFacts("s", 0, "tpu7x-8", "2x2x1"), f"127.0.0.1:{port}")
    status, text = _scrape(relay)
    assert status == 503
    assert text.count("\n") == 1 and f"libtpu at 127.0.0.1:{port}" in text, text
    assert "UNAVAILABLE" in text or "DEADLINE_EXCEEDED" in text, text
    with pytest.raises(DeviceReadError, match=r"503|Service Unavailable"):
        tpumetrics.read_device_plugin(relay.address, timeout_s=10)

    server, _ = libtpu_fake.serve(_Libtpu(4, 2, True), port)  # libtpu comes up: the next scrape reads it
    try:
        status, text = _scrape(relay)
        assert status == 200, text
        assert len(tpumetrics.parse_device_plugin(text)) == 4
    finally:
        server.stop(None)
    status, text = _scrape(relay)  # and goes away again
    assert status == 503 and f"libtpu at 127.0.0.1:{port}" in text


def test_only_metrics_is_served(relays: list[Relay]) -> None:
    relay = _start(relays, HostFacts("s", 0, "v4-8", ""), f"127.0.0.1:{_free_port()}")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://{relay.address}/", timeout=10)
    assert err.value.code == 404


# -- where it is published, and when there is none ------------------------------------------------------

TPU_LABELS = {
    "ray.io/tpu-slice-name": "tpu-v4-16-0",
    "ray.io/tpu-worker-id": "1",
    "ray.io/tpu-pod-type": "v4-16",
    "ray.io/tpu-topology": "2x2x2",
}


@pytest.fixture
def fresh_process() -> Iterator[list[Relay]]:
    """serve_from_env starts one relay per process: give each test its own and close it after."""
    running: list[Relay] = []
    yield running
    for relay in running:
        relay.close()


def test_publish_puts_the_address_under_the_node_key() -> None:
    puts: dict[str, str] = {}
    assert tpudevice.publish("10.0.0.7:8432", "node-7", puts.__setitem__)
    assert puts == {"tpufleet:device-plugin:node-7": "10.0.0.7:8432"}

    def broken(key: str, value: str) -> None:
        raise ConnectionError("GCS away")

    assert not tpudevice.publish("10.0.0.7:8432", "node-7", broken)  # never raises


def test_a_gce_tpu_host_without_libtpu_gets_a_relay_published_under_its_node(
    fresh_process: list[Relay], tmp_path: Path
) -> None:
    puts: dict[str, str] = {}
    node = Node("127.0.0.1", "node-1", TPU_LABELS, tmp_path)
    dead = f"127.0.0.1:{_free_port()}"
    relay = devicerelay.serve_from_env(
        {devicerelay.PORT_VAR: "0"}, node=node, put=puts.__setitem__, libtpu=dead, running=fresh_process
    )
    assert relay is not None and relay.port > 0
    assert relay.address == f"127.0.0.1:{relay.port}"
    assert puts == {f"{tpudevice.KV_PREFIX}node-1": relay.address}  # where published_or_default reads
    assert relay.facts == HostFacts("tpu-v4-16-0", 1, "v4-16", "2x2x2")
    assert relay.serving.wait(10)
    status, text = _scrape(relay)
    assert status == 503 and dead in text
    # a second runner in the same process reuses it
    again = devicerelay.serve_from_env(
        {devicerelay.PORT_VAR: "0"}, node=node, put=puts.__setitem__, running=fresh_process
    )
    assert again is relay


@pytest.mark.parametrize(
    ("env", "labels"),
    [
        ({"TPU_DEVICE_PLUGIN_ADDR": "10.0.0.1:2112"}, TPU_LABELS),  # GKE: the plugin serves it
        ({"TPUFLEET_EMULATED": "1"}, TPU_LABELS),  # the emulator's plugin serves it
        ({devicerelay.PORT_VAR: "off"}, TPU_LABELS),  # the operator said no
        ({devicerelay.PORT_VAR: "http"}, TPU_LABELS),  # not a port: said in the log, no relay
        ({}, {"ray.io/node-group": "head"}),  # not a TPU host
    ],
)
def test_no_relay_where_there_is_another_source_or_no_tpu(
    fresh_process: list[Relay], tmp_path: Path, env: dict[str, str], labels: dict[str, str]
) -> None:
    puts: dict[str, str] = {}
    node = Node("127.0.0.1", "node-1", labels, tmp_path)
    assert devicerelay.serve_from_env(env, node=node, put=puts.__setitem__, running=fresh_process) is None
    assert puts == {} and fresh_process == []


def test_no_relay_without_ray(fresh_process: list[Relay]) -> None:
    assert devicerelay.serve_from_env({"TPU_ACCELERATOR_TYPE": "v4-8"}) is None  # Ray not initialized here


def test_runners_of_one_host_share_one_port_and_take_it_over(relays: list[Relay], tmp_path: Path) -> None:
    libtpu = f"127.0.0.1:{_free_port()}"
    facts = HostFacts("s", 0, "v4-8", "")
    with socket.socket() as foreign:  # another program holds the default port: any free one
        foreign.bind(("127.0.0.1", 0))
        foreign.listen()
        taken = foreign.getsockname()[1]
        first = devicerelay.start("127.0.0.1", facts, default_port=taken, state_dir=tmp_path, libtpu=libtpu)
        relays.append(first)
        assert first.serving.wait(10)
        assert first.port not in (0, taken)
        second = devicerelay.start(
            "127.0.0.1", facts, default_port=taken, state_dir=tmp_path, libtpu=libtpu, retry_s=0.05
        )
        relays.append(second)
    assert second.address == first.address  # both publish the one address
    assert not second.serving.is_set()  # standing by: the first holds the port
    first.close()
    assert second.serving.wait(10)  # the first runner ended: the second serves the same port
    status, _ = _scrape(second)
    assert status == 503
