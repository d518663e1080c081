"""The REST API in-process (FastAPI TestClient, no sockets): auth, isolation, validation, errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tpufleet.api.app import create_app
from tpufleet.client.http import Client
from tpufleet.control.cluster.memory import MemoryCluster, Script
from tpufleet.control.loop.service import Service, ServiceConfig
from tpufleet.control.store.facade import Store
from tpufleet.errors import InputError


class Api:
    """An app over a store, an admin token, and helpers to call it as someone."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.http = TestClient(create_app(store), raise_server_exceptions=True)
        self.admin = store.tokens.issue()

    def call(self, method: str, path: str, token: str | None, **kw: object):  # type: ignore[no-untyped-def]
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        headers.update(kw.pop("headers", None) or {})  # type: ignore[call-overload]
        return self.http.request(method, "/api/v1" + path, headers=headers, **kw)  # type: ignore[arg-type]

    def tenant(self, name: str, **quota: int) -> str:
        resp = self.call("POST", "/tenants", self.admin, json={"name": name, "quota": quota})
        assert resp.status_code == 201, resp.text
        return str(resp.json()["token"])

    def submit(self, token: str, **body: object) -> str:
        resp = self.call(
            "POST", "/jobs", token, json={"command": ["python", "t.py"], "accelerator_type": "v4-16"} | body
        )
        assert resp.status_code == 201, resp.text
        return str(resp.json()["id"])


@pytest.fixture
def api(store: Store) -> Iterator[Api]:
    a = Api(store)
    yield a
    a.http.close()


def test_health_and_openapi(api: Api) -> None:
    assert api.http.get("/healthz").json()["status"] == "ok"
    paths = api.http.get("/openapi.json").json()["paths"]
    assert {"/api/v1/jobs", "/api/v1/jobs/{job_id}/logs", "/api/v1/tenants", "/api/v1/slices"} <= set(paths)


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({}, "missing bearer token"),
        ({"Authorization": "Bearer tf_nope"}, "unknown token"),
        ({"Authorization": "Basic abc"}, "must be 'Bearer <token>'"),
    ],
)
def test_missing_unknown_or_malformed_tokens_are_401(api: Api, headers: dict[str, str], message: str) -> None:
    resp = api.http.get("/api/v1/jobs", headers=headers)
    assert resp.status_code == 401 and message in resp.json()["error"]
    assert resp.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/tenants", {"name": "x", "quota": {}}),
        ("GET", "/tenants", None),
        ("POST", "/slices/tpu-v4-16-0/drain", None),
    ],
)
def test_a_tenant_token_cannot_manage_tenants_or_slices(
    api: Api, method: str, path: str, body: object
) -> None:
    token = api.tenant("team-a", v4=8)
    resp = api.call(method, path, token, json=body)
    assert resp.status_code == 403 and "needs the admin token" in resp.json()["error"]
    assert [t.name for t in api.store.tenants.all()] == ["team-a"]


def test_a_tenant_sees_and_changes_only_its_own_jobs(api: Api) -> None:
    a, b = api.tenant("team-a", v4=8), api.tenant("team-b", v4=8)
    job_a = api.submit(a)
    for method, path in [("GET", ""), ("GET", "/logs"), ("GET", "/events"), ("POST", "/cancel")]:
        theirs = api.call(method, f"/jobs/{job_a}{path}", b)
        nothing = api.call(method, f"/jobs/{'f' * len(job_a)}{path}", b)
        # no existence oracle: another tenant's job reads exactly like one that does not exist
        assert theirs.status_code == nothing.status_code == 404, (method, path)
        assert theirs.json()["error"].replace(job_a, "ID") == nothing.json()["error"].replace("f" * 8, "ID")
    assert api.store.jobs.get(job_a).state == "QUEUED"
    assert api.call("GET", "/jobs", b).json() == {"items": [], "next": None}
    assert [j["id"] for j in api.call("GET", "/jobs", a).json()["items"]] == [job_a]
    assert [j["id"] for j in api.call("GET", "/jobs", api.admin).json()["items"]] == [job_a]
    resp = api.call(
        "POST", "/jobs", b, json={"command": ["x"], "accelerator_type": "v4-16", "tenant": "team-a"}
    )
    assert resp.status_code == 403 and api.store.jobs.all(tenant="team-a")[0].id == job_a


def test_job_has_the_fields_the_cli_shows(api: Api) -> None:
    job_id = api.submit(api.tenant("team-a", v4=8), name="mlp", num_slices=1)
    job = api.call("GET", f"/jobs/{job_id}", api.admin).json()
    assert {k: job[k] for k in ("id", "name", "tenant", "state", "attempt", "slices", "reason")} == {
        "id": job_id,
        "name": "mlp",
        "tenant": "team-a",
        "state": "QUEUED",
        "attempt": 1,
        "slices": [],
        "reason": None,
    }


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"accelerator_type": "v4-15"}, 400, "v4-15 is not a v4 slice size; closest: v4-8, v4-16"),
        ({"accelerator_type": "v9-8"}, 400, "'v9' is not a TPU generation"),
        ({"num_slices": 0}, 400, "num_slices: must be an integer from 1"),
        ({"num_slices": "many"}, 422, "num_slices: Input should be a valid integer"),
        ({"command": []}, 400, "command: a job needs a command"),
        ({"colour": "red"}, 422, "colour: unknown field 'colour'; valid: accelerator_type, command, env,"),
        ({"num_slice": 2}, 422, "num_slice: unknown field 'num_slice'; did you mean num_slices?"),
        ({"env": {"TPU_NAME": "x"}}, 400, "TPU_NAME is set by tpufleet"),
    ],
)
def test_bad_job_input_is_a_one_line_error_and_stores_nothing(
    api: Api, body: dict[str, object], status: int, message: str
) -> None:
    token = api.tenant("team-a", v4=8)
    full = {"command": ["python", "t.py"], "accelerator_type": "v4-16"} | body
    resp = api.call("POST", "/jobs", token, json=full)
    assert resp.status_code == status, resp.text
    assert message in resp.json()["error"] and "\n" not in resp.json()["error"]
    assert api.store.jobs.all() == []


def test_admin_submits_for_a_named_tenant_only(api: Api) -> None:
    api.tenant("team-a", v4=8)
    resp = api.call("POST", "/jobs", api.admin, json={"command": ["x"], "accelerator_type": "v4-16"})
    assert resp.status_code == 400 and "tenant" in resp.json()["error"]
    assert "`tpufleet submit --tenant NAME`" in resp.json()["error"]  # was "give tenant"
    job_id = api.submit(api.admin, tenant="team-a")
    assert api.store.jobs.get(job_id).tenant == "team-a"
    resp = api.call(
        "POST", "/jobs", api.admin, json={"command": ["x"], "accelerator_type": "v4-16", "tenant": "zz"}
    )
    assert resp.status_code == 404 and "tenant 'zz' not found" in resp.json()["error"]


def test_tenant_errors_and_unknown_ids(api: Api) -> None:
    api.tenant("team-a", v4=8)
    dup = api.call("POST", "/tenants", api.admin, json={"name": "team-a", "quota": {"v4": 8}})
    assert dup.status_code == 409 and "already exists" in dup.json()["error"]
    bad = api.call("POST", "/tenants", api.admin, json={"name": "team-b", "quota": {"v99": 8}})
    assert bad.status_code == 400 and "not a TPU generation" in bad.json()["error"]
    typo = api.call("PATCH", "/tenants/team-a", api.admin, json={"qouta": {"v4": 16}})  # any body's typo
    assert typo.status_code == 422
    assert typo.json() == {"error": "qouta: unknown field 'qouta'; did you mean quota?"}
    assert api.call("GET", "/jobs/nope", api.admin).status_code == 404
    assert api.call("POST", "/slices/nope/drain", api.admin).status_code == 404
    assert [t["name"] for t in api.call("GET", "/tenants", api.admin).json()] == ["team-a"]


def test_a_job_through_the_api_runs_logs_and_cancels(api: Api, tmp_path: Path) -> None:
    cluster = MemoryCluster.of(
        "v4-16", script=lambda spec: Script(run_after=1, exit_after=None, output="hi {TPU_WORKER_ID}\n")
    )
    service = Service(api.store, cluster, state_dir=tmp_path, config=ServiceConfig(stop_threads=0))
    token = api.tenant("team-a", v4=8)
    job_id = api.submit(token)
    service.run_once()  # admitted + launched
    service.run_once()  # running; logs pulled
    job = api.call("GET", f"/jobs/{job_id}", token).json()
    assert (job["state"], job["slices"]) == ("RUNNING", ["tpu-v4-16-0"])
    slices = api.call("GET", "/slices", token).json()
    assert [(s["name"], s["state"], s["holder"]) for s in slices] == [("tpu-v4-16-0", "HELD", job_id)]
    other = api.call("GET", "/slices", api.tenant("team-b", v4=8)).json()  # sees the state, not the job
    assert [(s["name"], s["state"], s["holder"]) for s in other] == [("tpu-v4-16-0", "HELD", None)]
    assert api.call("GET", "/slices", api.admin).json()[0]["holder"] == job_id
    logs = api.call("GET", f"/jobs/{job_id}/logs", token).json()
    assert [(h["host"], h["data"]) for h in logs["hosts"]] == [(0, "hi 0\n"), (1, "hi 1\n")]
    follow = api.call("GET", f"/jobs/{job_id}/logs", token, params={"host": 1, "offset": 3}).json()
    assert [(h["data"], h["next_offset"]) for h in follow["hosts"]] == [("1\n", 5)]
    assert api.call("POST", f"/jobs/{job_id}/cancel", token).json()["state"] == "RUNNING"
    service.run_once()
    assert api.call("GET", f"/jobs/{job_id}", token).json()["state"] == "CANCELLED"
    assert api.call("GET", "/slices", token).json()[0]["state"] == "FREE"
    again = api.call("POST", f"/jobs/{job_id}/cancel", token)
    assert again.status_code == 200 and again.json()["state"] == "CANCELLED"
    kinds = [e["kind"] for e in api.call("GET", f"/jobs/{job_id}/events", token).json()]
    assert kinds[0] == "submit" and "cancel" in kinds and kinds[-1] == "end"


def test_listing_jobs_by_state_filters_and_rejects_unknown_states(api: Api) -> None:
    token = api.tenant("team-a", v4=8)
    job_id = api.submit(token)
    queued = api.call("GET", "/jobs", token, params={"state": "queued"})
    assert [j["id"] for j in queued.json()["items"]] == [job_id]
    assert api.call("GET", "/jobs", token, params={"state": "RUNNING"}).json()["items"] == []
    resp = api.call("GET", "/jobs", token, params={"state": "BOGUS"})
    assert resp.status_code == 400
    assert "'BOGUS' is not a job state; valid: QUEUED, ADMITTED" in resp.json()["error"]


def test_a_path_no_route_has_is_named_in_its_404_and_a_wrong_method_in_its_405(api: Api) -> None:
    missing = api.call("GET", "/jobs/a%2Fb", api.admin)  # the server decodes %2F before it routes
    assert missing.status_code == 404
    assert missing.json() == {"error": "no such path on this server: GET /api/v1/jobs/a/b"}
    wrong = api.call("GET", "/jobs/x/cancel", api.admin)
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert wrong.json() == {"error": "GET is not allowed on /api/v1/jobs/x/cancel"}
    nope = api.call("GET", "/jobs/nope", api.admin)  # a route's own 404 keeps its own words
    assert nope.status_code == 404 and "nope" in nope.json()["error"] and "path" not in nope.json()["error"]


def test_the_client_sends_no_id_with_a_slash_in_it(api: Api) -> None:
    """``a/cancel`` would reach job ``a``'s cancel (the server decodes ``%2F``): refused, nothing sent."""
    job = api.submit(api.tenant("team-a", v4=8))
    client = Client("http://testserver", api.admin, http=api.http)
    for call in (client.cancel, client.job, client.events, client.logs):
        with pytest.raises(InputError) as err:
            call(f"{job}/cancel")
        assert str(err.value) == f"'{job}/cancel' is not an id or a name: none has a '/' in it"
    with pytest.raises(InputError):
        client.drain("../tenants")
    assert api.store.jobs.get(job).state == "QUEUED"
