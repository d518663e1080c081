"""``--provider gce`` through the real ``google-cloud-tpu`` client (REST transport, anonymous
credentials) against a local HTTP server that answers as the Cloud TPU API v2 does
(https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources and
.../projects.locations.nodes; fields in docs/provisioning.md). Every request the provider sends is
recorded and asserted exactly."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tpufleet.provision.base import GroupState, HostHealth, SliceRequest
from tpufleet.provision.gce import GROUP_LABEL, GceConfig, GceProvider, make_client, startup_script

os.environ.setdefault("NO_GCE_CHECK", "True")
os.environ.setdefault("GCE_METADATA_HOST", "127.0.0.1:9")

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


@pytest.fixture
def api() -> Iterator[FakeTpuApi]:
    srv = FakeTpuApi()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def provider(api: FakeTpuApi) -> Iterator[GceProvider]:
    config = GceConfig(project="proj", zone="us-central2-b", ray_address="10.0.0.1:6379")
    clock = iter(float(t) for t in range(1000, 100000))
    p = GceProvider(
        config,
        client=make_client(api.endpoint, anonymous=True),
        clock=lambda: next(clock),
        reclaim_interval_s=0,
    )
    yield p
    p.close()


def _node(accelerator_type: str, runtime: str, group: str) -> dict[str, Any]:
    return {
        "acceleratorType": accelerator_type,
        "runtimeVersion": runtime,
        "labels": {GROUP_LABEL: group},
        "metadata": {"startup-script": startup_script("10.0.0.1:6379", "2.60.0")},
    }


def _state(p: GceProvider, name: str) -> Any:
    return next(g for g in p.poll() if g.name == name)


def test_create_sends_one_queued_resource_with_one_node(api: FakeTpuApi, provider: GceProvider) -> None:
    provider.create(SliceRequest("train", "v4-16"))
    assert api.mutations() == [
        (
            "POST",
            QRS,
            {"queuedResourceId": ["train"], **ALT},
            {
                "tpu": {
                    "nodeSpec": [
                        {
                            "parent": PARENT,
                            "nodeId": "train-0",
                            "node": _node("v4-16", "tpu-ubuntu2204-base", "train"),
                        }
                    ]
                }
            },
        )
    ]
    provider.create(SliceRequest("train", "v4-16"))  # idempotent: nothing more is sent
    assert len(api.mutations()) == 1
    assert _state(provider, "train").state is GroupState.WAITING_FOR_RESOURCES


def test_scale_up_is_a_spot_multislice_queued_resource(api: FakeTpuApi, provider: GceProvider) -> None:
    provider.create(SliceRequest("burst", "v5litepod-16", count=3, spot=True))
    ((method, path, query, body),) = api.mutations()
    assert (method, path, query) == ("POST", QRS, {"queuedResourceId": ["burst"], **ALT})
    assert body == {
        "tpu": {
            "nodeSpec": [
                {
                    "parent": PARENT,
                    "multisliceParams": {"nodeCount": 3, "nodeIdPrefix": "burst"},
                    "node": _node("v5litepod-16", "v2-alpha-tpuv5-lite", "burst"),
                }
            ]
        },
        "spot": {},
    }


def test_states_follow_the_queued_resource_and_its_nodes(api: FakeTpuApi, provider: GceProvider) -> None:
    provider.create(SliceRequest("g", "v4-16", count=2))
    api.set_state("g", "WAITING_FOR_RESOURCES")
    g = _state(provider, "g")
    assert g.state is GroupState.WAITING_FOR_RESOURCES and "waiting for 2 x v4-16" in g.message
    api.set_state("g", "PROVISIONING")
    api.make_nodes("g", hosts=2, state="CREATING", health="HEALTH_UNSPECIFIED")
    assert _state(provider, "g").state is GroupState.PROVISIONING
    api.set_state("g", "ACTIVE")
    api.make_nodes("g", hosts=2)
    api.nodes["g-1"]["state"] = "REPAIRING"
    g = _state(provider, "g")
    assert g.state is GroupState.ACTIVE
    assert [(s.name, s.hosts) for s in g.slices] == [
        ("g-0", (HostHealth.READY, HostHealth.READY)),
        ("g-1", (HostHealth.REPAIRING, HostHealth.REPAIRING)),
    ]


def test_failed_queued_resource_carries_the_api_error(api: FakeTpuApi, provider: GceProvider) -> None:
    provider.create(SliceRequest("g", "v4-8"))
    api.set_state("g", "FAILED", failedData={"error": {"code": 8, "message": "quota TPUV4 exceeded"}})
    g = _state(provider, "g")
    assert (g.state, g.message) == (GroupState.FAILED, "quota TPUV4 exceeded")


def test_an_existing_queued_resource_is_adopted(api: FakeTpuApi, provider: GceProvider) -> None:
    api.qrs["taken"] = {"name": f"{PARENT}/queuedResources/taken", "state": {"state": "ACTIVE"}}
    provider.create(SliceRequest("taken", "v4-8"))  # 409 ALREADY_EXISTS: a restarted control plane
    assert _state(provider, "taken").state is GroupState.ACTIVE


def test_create_refused_by_the_api_is_failed_with_its_words(api: FakeTpuApi, provider: GceProvider) -> None:
    api.refuse = "Invalid runtime version"
    provider.create(SliceRequest("bad", "v4-8"))
    g = _state(provider, "bad")
    assert g.state is GroupState.FAILED and "Invalid runtime version" in g.message
    provider.delete("bad")  # nothing was made: nothing to delete
    assert [r[0] for r in api.mutations()] == ["POST"]
    assert provider.poll() == []


def test_preempted_nodes_are_deleted_and_the_group_stays_suspended(
    api: FakeTpuApi, provider: GceProvider
) -> None:
    provider.create(SliceRequest("spot", "v4-16", spot=True))
    api.set_state("spot", "ACTIVE")
    api.make_nodes("spot", hosts=2)
    assert provider.reclaim() == []
    api.nodes["spot-0"]["state"] = "PREEMPTED"
    g = _state(provider, "spot")
    assert g.state is GroupState.SUSPENDED and "preempted" in g.message
    assert g.slices[0].hosts == (HostHealth.PREEMPTED, HostHealth.PREEMPTED)
    assert g.slices[0].preempt_deadline is not None
    before = len(api.mutations())
    assert provider.reclaim() == ["spot"]
    assert api.mutations()[before:] == [("DELETE", f"{QRS}/spot", {"force": ["true"], **ALT}, None)]
    del api.qrs["spot"], api.nodes["spot-0"]  # the API finished deleting
    assert provider.reclaim() == []  # once only
    assert _state(provider, "spot").state is GroupState.SUSPENDED
    provider.delete("spot")  # the manager's delete: nothing left to send
    assert len(api.mutations()) == before + 1
    assert [g.name for g in provider.poll()] == []


def test_scale_down_and_delete_send_force_deletes(api: FakeTpuApi, provider: GceProvider) -> None:
    provider.create(SliceRequest("a", "v4-8"))
    provider.create(SliceRequest("b", "v4-8", count=2))
    for qr in ("a", "b"):
        api.set_state(qr, "ACTIVE")
    before = len(api.mutations())
    provider.delete("a")  # scale down: one group of the pool goes
    assert api.mutations()[before:] == [("DELETE", f"{QRS}/a", {"force": ["true"], **ALT}, None)]
    assert _state(provider, "a").state is GroupState.DELETING
    del api.qrs["a"]
    assert [g.name for g in provider.poll()] == ["b"]
    provider.delete("b")
    provider.delete("b")  # the second is sent again: the API answers the same operation kind
    assert [r[:3] for r in api.mutations()[before + 1 :]] == [
        ("DELETE", f"{QRS}/b", {"force": ["true"], **ALT})
    ] * 2
    del api.qrs["b"]
    assert provider.poll() == []


def test_unreachable_api_reports_every_group_failed_with_the_reason(api: FakeTpuApi) -> None:
    config = GceConfig(project="proj", zone="us-central2-b", ray_address="10.0.0.1:6379")
    p = GceProvider(config, client=make_client(api.endpoint, anonymous=True), reclaim_interval_s=0)
    p.create(SliceRequest("g", "v4-8"))
    api.shutdown()
    api.server_close()
    (g,) = p.poll()
    assert g.state is GroupState.FAILED and "Cloud TPU API unreachable" in g.message


def test_delete_of_a_group_made_before_a_restart_reaches_the_api(
    api: FakeTpuApi, provider: GceProvider
) -> None:
    api.qrs["old"] = {"name": f"{PARENT}/queuedResources/old", "state": {"state": "ACTIVE"}}
    provider.delete("old")
    assert api.mutations() == [("DELETE", f"{QRS}/old", {"force": ["true"], **ALT}, None)]
    provider.delete("never-made")  # 404: nothing to do
    assert provider.poll() == []


def test_config_from_the_fleet_spec() -> None:
    from spec_builders import load_fleet

    from tpufleet.errors import SpecError
    from tpufleet.provision.gce import config_from_spec

    config = config_from_spec(load_fleet(), "10.0.0.1:6379")
    assert (config.project, config.zone, config.ray_version) == ("my-project", "us-east5-b", "2.60.0")
    assert config.service_account == "ray-tpu@my-project.iam.gserviceaccount.com"
    assert config.parent == "projects/my-project/locations/us-east5-b"
    with pytest.raises(SpecError, match="--provider gce needs a gce section"):
        config_from_spec(load_fleet(gce=None), "10.0.0.1:6379")


def test_no_credentials_is_one_line_naming_the_fix(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from tpufleet.errors import InputError

    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(InputError, match="gcloud auth application-default login") as err:
        make_client()
    assert "\n" not in str(err.value)
