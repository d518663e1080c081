"""A local HTTP server that answers as the Kubernetes API does for ``rayclusters.ray.io`` (GET,
PATCH with ``application/merge-patch+json`` and resourceVersion checks) and pods (list by label
selector). Every patched RayCluster is validated against KubeRay's CRD schema (../shared/kuberay), as
the API server would; ``reconcile()`` then does what KubeRay >= 1.6 does with RayMultiHostIndexing
(one replica = numOfHosts pods labelled with the replica's name and index; a pod named in
workersToDelete takes its whole replica with it). Used by tests/unit/test_provider_kuberay.py and the
provider conformance suite."""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jsonschema
from spec_builders import crds_or_skip, load_fleet, pool

from tpufleet.provision.kuberay import KubeRayConfig, KubeRayProvider, make_api_client
from tpufleet.render.kuberay import render_raycluster

NS = "ml"
RC = f"/apis/ray.io/v1/namespaces/{NS}/rayclusters/fleet"
PODS = f"/api/v1/namespaces/{NS}/pods"
SELECTOR = "ray.io/cluster=fleet,ray.io/node-type=worker"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (what the API server applies for application/merge-patch+json)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class FakeKubeApi(ThreadingHTTPServer):
    def __init__(self, cluster: dict[str, Any], schema: dict[str, Any]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.cluster = cluster
        self.cluster["metadata"].update(resourceVersion="100", namespace=NS)
        self.schema = schema
        self.pods: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str, dict[str, list[str]], str | None, Any]] = []
        # per GET of the RayCluster: a change made as it answers (the answer shows the object before it)
        self.after_get: list[Any] = []

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def patches(self) -> list[tuple[str, str, dict[str, list[str]], str | None, Any]]:
        return [r for r in self.requests if r[0] == "PATCH"]

    def group(self, name: str) -> dict[str, Any]:
        return next(g for g in self.cluster["spec"]["workerGroupSpecs"] if g["groupName"] == name)

    def bump(self) -> None:
        md = self.cluster["metadata"]
        md["resourceVersion"] = str(int(md["resourceVersion"]) + 1)

    def reconcile(self, phase: str = "Running", ready: bool = True) -> None:
        """KubeRay's multi-host reconcile: workersToDelete removes whole replicas, then replicas are
        created until each group has ``replicas`` complete ones (new pods in ``phase``)."""
        for g in self.cluster["spec"]["workerGroupSpecs"]:
            named = (g.get("scaleStrategy") or {}).get("workersToDelete") or []
            doomed = {
                self.pods[n]["metadata"]["labels"]["ray.io/worker-group-replica-name"]
                for n in named
                if n in self.pods
            }
            for name in [
                n
                for n, p in self.pods.items()
                if p["metadata"]["labels"]["ray.io/worker-group-replica-name"] in doomed
            ]:
                del self.pods[name]
            replicas = {
                p["metadata"]["labels"]["ray.io/worker-group-replica-name"]: int(
                    p["metadata"]["labels"]["ray.io/worker-group-replica-index"]
                )
                for p in self.pods.values()
                if p["metadata"]["labels"]["ray.io/group"] == g["groupName"]
            }
            used = set(replicas.values())
            for _ in range(g["replicas"] - len(replicas)):
                index = next(i for i in range(1000) if i not in used)
                used.add(index)
                replica = f"{g['groupName']}-{uuid.uuid4().hex[:5]}"
                for host in range(g["numOfHosts"]):
                    self.add_pod(g["groupName"], replica, index, host, phase, ready)

    def add_pod(self, group: str, replica: str, index: int, host: int, phase: str, ready: bool) -> None:
        name = f"fleet-{group}-worker-{uuid.uuid4().hex[:5]}"
        scheduled = {"type": "PodScheduled", "status": "True"}
        if phase == "Pending":
            scheduled = {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient google.com/tpu.",
            }
        self.pods[name] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": NS,
                "labels": {
                    "ray.io/cluster": "fleet",
                    "ray.io/node-type": "worker",
                    "ray.io/group": group,
                    "ray.io/worker-group-replica-name": replica,
                    "ray.io/worker-group-replica-index": str(index),
                    "ray.io/replica-host-index": str(host),
                },
            },
            "spec": {"containers": [{"name": "ray-worker", "image": "rayproject/ray:2.60.0"}]},
            "status": {
                "phase": phase,
                "conditions": [scheduled, {"type": "Ready", "status": "True" if ready else "False"}],
            },
        }

    def replica_pods(self, group: str) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for name, p in sorted(self.pods.items()):
            labels = p["metadata"]["labels"]
            if labels["ray.io/group"] == group:
                out.setdefault(labels["ray.io/worker-group-replica-name"], []).append(name)
        return out


class _Handler(BaseHTTPRequestHandler):
    server: FakeKubeApi

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, code: int, body: Any) -> None:
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _status(self, code: int, reason: str, message: str) -> None:
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        }
        self._reply(code, body)

    def _handle(self, method: str) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        srv = self.server
        srv.requests.append((method, url.path, query, self.headers.get("Content-Type"), body))
        if url.path == RC and method == "GET":
            # the change lands before the answer (showing the object before it) is sent: the
            # client's next request can never overtake it (it is answered on another thread)
            answer = copy.deepcopy(srv.cluster)
            change = srv.after_get.pop(0) if srv.after_get else None
            if change is not None:
                change()
            self._reply(200, answer)
        elif url.path == RC and method == "PATCH":
            if self.headers.get("Content-Type") != "application/merge-patch+json":
                self._status(415, "UnsupportedMediaType", "want a merge patch")
                return
            want = (body.get("metadata") or {}).get("resourceVersion")
            if want is not None and want != srv.cluster["metadata"]["resourceVersion"]:
                self._status(
                    409,
                    "Conflict",
                    "the object has been modified; please apply your changes to the latest version",
                )
                return
            patched = merge_patch(srv.cluster, body)
            try:
                jsonschema.Draft7Validator(srv.schema).validate(patched)
            except jsonschema.ValidationError as err:
                self._status(422, "Invalid", f"RayCluster.ray.io is invalid: {err.message}")
                return
            srv.cluster = patched
            srv.bump()
            self._reply(200, srv.cluster)
        elif url.path == PODS and method == "GET":
            pairs = dict(kv.split("=", 1) for kv in query["labelSelector"][0].split(","))
            items = [
                p
                for p in srv.pods.values()
                if all(p["metadata"]["labels"].get(k) == v for k, v in pairs.items())
            ]
            self._reply(
                200,
                {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items},
            )
        else:
            self._status(404, "NotFound", f"{url.path} not found")

    def do_GET(self) -> None:
        self._handle("GET")

    def do_PATCH(self) -> None:
        self._handle("PATCH")


def fleet_raycluster() -> dict[str, Any]:
    """The RayCluster of a fleet with a ``v4`` pool of one v4-16 slice, and ``v4spot`` (v4-16, spot)
    and ``v6e`` (v6e-8) pools of none, up to four: what a provider scales."""
    spec = load_fleet(
        [
            pool("v4", type="v4-16", slices=1),
            pool("v4spot", type="v4-16", slices=0, max_slices=4, spot=True),
            pool("v6e", type="v6e-8", slices=0, max_slices=4),
        ],
        autoscaling={"enabled": True},
    )
    return render_raycluster(spec)


@contextlib.contextmanager
def running() -> Iterator[FakeKubeApi]:
    """A ``FakeKubeApi`` holding ``fleet_raycluster()`` (its pools' own slices made already),
    serving on a free loopback port until the block ends; skips without KubeRay's CRDs."""
    srv = FakeKubeApi(fleet_raycluster(), crds_or_skip()("RayCluster", "v1"))
    srv.reconcile()  # the pools' own slices exist before the provider starts
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def provider(api: FakeKubeApi) -> KubeRayProvider:
    """A ``KubeRayProvider`` of the RayCluster ``fleet`` in namespace ``ml``, through the real client."""
    return KubeRayProvider(KubeRayConfig(NS, "fleet"), api_client=make_api_client(api.host))
