"""A real gRPC server answering as libtpu's runtime metric service, for the tests of the reader
(test_observe_device.py) and of the GCE relay (test_libtpu_relay.py). Built from tpu-info's
generated types and servicer, on 127.0.0.1 with local credentials, as libtpu itself serves."""

from __future__ import annotations

from collections.abc import Iterable
from concurrent import futures

import grpc
from tpu_info.proto import tpu_metric_service_pb2 as pb
from tpu_info.proto import tpu_metric_service_pb2_grpc as pb_grpc


def metric_response(name: str, rows: Iterable[tuple[int, pb.Gauge]]) -> pb.MetricResponse:
    """One metric's answer: a gauge per device, keyed by the device's ``int_attr``."""
    metrics = [
        pb.Metric(attribute=pb.Attribute(key="device-id", value=pb.AttrValue(int_attr=d)), gauge=g)
        for d, g in rows
    ]
    return pb.MetricResponse(metric=pb.TPUMetric(name=name, metrics=metrics))


def serve(servicer: pb_grpc.RuntimeMetricServiceServicer, port: int = 0) -> tuple[grpc.Server, str]:
    """Start ``servicer`` on ``127.0.0.1:port`` (0: any free port); the server and its address."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_RuntimeMetricServiceServicer_to_server(servicer, server)
    bound = server.add_secure_port(f"127.0.0.1:{port}", grpc.local_server_credentials())
    assert bound, f"could not bind 127.0.0.1:{port}"
    server.start()
    return server, f"127.0.0.1:{bound}"
