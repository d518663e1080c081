"""A local HTTP server that answers as the Cloud TPU API v2 does for queued resources and nodes
(https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources and
.../projects.locations.nodes; fields in docs/provisioning.md), in memory; every request it gets is
recorded. Used by tests/unit/test_provider_gce.py and the provider conformance suite."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tpufleet.provision.gce import GceConfig, GceProvider, make_client

PARENT = "projects/proj/locations/us-central2-b"
QRS = f"/v2/{PARENT}/queuedResources"
ALT = {"$alt": ["json;enum-encoding=int"]}  # the REST client asks for enums as numbers

# Enum numbers of the API (QueuedResourceState.State, Node.State, Node.Health in
# https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources and
# .../projects.locations.nodes), used when a request asks for enum-encoding=int as the client does.
QR_STATE = {
    "CREATING": 1,
    "ACCEPTED": 2,
    "PROVISIONING": 3,
    "FAILED": 4,
    "DELETING": 5,
    "ACTIVE": 6,
    "SUSPENDING": 7,
    "SUSPENDED": 8,
    "WAITING_FOR_RESOURCES": 9,
}
NODE_STATE = {
    "CREATING": 1,
    "READY": 2,
    "RESTARTING": 3,
    "REIMAGING": 4,
    "DELETING": 5,
    "REPAIRING": 6,
    "STOPPED": 8,
    "STOPPING": 9,
    "STARTING": 10,
    "PREEMPTED": 11,
    "TERMINATED": 12,
}
HEALTH = {
    "HEALTH_UNSPECIFIED": 0,
    "HEALTHY": 1,
    "TIMEOUT": 3,
    "UNHEALTHY_TENSORFLOW": 4,
    "UNHEALTHY_MAINTENANCE": 5,
}


def _as_ints(obj: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(obj))
    if "state" in out and isinstance(out["state"], dict):  # a QueuedResource
        out["state"]["state"] = QR_STATE[out["state"]["state"]]
    elif "state" in out:  # a Node
        out["state"], out["health"] = NODE_STATE[out["state"]], HEALTH[out["health"]]
    return out


class FakeTpuApi(ThreadingHTTPServer):
    """The queued-resource and node endpoints of the Cloud TPU API v2, in memory."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[tuple[str, str, dict[str, list[str]], Any]] = []
        self.qrs: dict[str, dict[str, Any]] = {}  # id -> QueuedResource JSON
        self.nodes: dict[str, dict[str, Any]] = {}  # node id -> Node JSON
        self.ops = 0
        self.refuse = ""  # a create answered 400 INVALID_ARGUMENT with this message

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def mutations(self) -> list[tuple[str, str, dict[str, list[str]], Any]]:
        return [r for r in self.requests if r[0] != "GET"]

    def set_state(self, qr_id: str, state: str, **data: Any) -> None:
        self.qrs[qr_id]["state"] = {"state": state, **data}

    def make_nodes(self, qr_id: str, hosts: int, state: str = "READY", health: str = "HEALTHY") -> None:
        spec = self.qrs[qr_id]["tpu"]["nodeSpec"][0]
        if "nodeId" in spec:
            ids = [spec["nodeId"]]
        else:
            ms = spec["multisliceParams"]
            ids = [f"{ms['nodeIdPrefix']}-{i}" for i in range(ms["nodeCount"])]
        for node_id in ids:
            self.nodes[node_id] = {
                **spec["node"],
                "name": f"{PARENT}/nodes/{node_id}",
                "state": state,
                "health": health,
                "queuedResource": f"{PARENT}/queuedResources/{qr_id}",
                "networkEndpoints": [{"ipAddress": f"10.0.0.{i + 2}", "port": 8470} for i in range(hosts)],
            }

    def operation(self) -> dict[str, Any]:
        self.ops += 1
        return {"name": f"{PARENT}/operations/operation-{self.ops}", "done": False}


class _Handler(BaseHTTPRequestHandler):
    server: FakeTpuApi

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, code: int, body: Any) -> None:
        if "int" in self.path and code == 200:  # $alt=json;enum-encoding=int
            for key in ("queuedResources", "nodes"):
                if key in body:
                    body = {key: [_as_ints(o) for o in body[key]]}
            if "state" in body:
                body = _as_ints(body)
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _not_found(self, what: str) -> None:
        self._reply(404, {"error": {"code": 404, "message": f"{what} not found", "status": "NOT_FOUND"}})

    def _handle(self, method: str) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        srv = self.server
        srv.requests.append((method, url.path, query, body))
        path = url.path
        if path == QRS and method == "POST":
            qr_id = query["queuedResourceId"][0]
            if srv.refuse:
                self._reply(
                    400, {"error": {"code": 400, "message": srv.refuse, "status": "INVALID_ARGUMENT"}}
                )
            elif qr_id in srv.qrs:
                self._reply(
                    409, {"error": {"code": 409, "message": "already exists", "status": "ALREADY_EXISTS"}}
                )
            else:
                srv.qrs[qr_id] = {
                    **body,
                    "name": f"{PARENT}/queuedResources/{qr_id}",
                    "state": {"state": "ACCEPTED"},
                }
                self._reply(200, srv.operation())
        elif path == QRS and method == "GET":
            self._reply(200, {"queuedResources": list(srv.qrs.values())})
        elif path.startswith(QRS + "/"):
            qr_id = path.rsplit("/", 1)[-1]
            if qr_id not in srv.qrs:
                self._not_found(path)
            elif method == "GET":
                self._reply(200, srv.qrs[qr_id])
            elif method == "DELETE":
                srv.set_state(qr_id, "DELETING")
                self._reply(200, srv.operation())
        elif path == f"/v2/{PARENT}/nodes" and method == "GET":
            self._reply(200, {"nodes": list(srv.nodes.values())})
        else:
            self._not_found(path)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_DELETE(self) -> None:
        self._handle("DELETE")


@contextlib.contextmanager
def running() -> Iterator[FakeTpuApi]:
    """A ``FakeTpuApi`` serving on a free loopback port until the block ends."""
    srv = FakeTpuApi()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def provider(api: FakeTpuApi) -> GceProvider:
    """A ``GceProvider`` of project ``proj`` in us-central2-b through the real client, on a clock
    that moves one second a call, that reclaims on every poll."""
    config = GceConfig(project="proj", zone="us-central2-b", ray_address="10.0.0.1:6379")
    clock = iter(float(t) for t in range(1000, 100000))
    return GceProvider(
        config,
        client=make_client(api.endpoint, anonymous=True),
        clock=lambda: next(clock),
        reclaim_interval_s=0,
    )
