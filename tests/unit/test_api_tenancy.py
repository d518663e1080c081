"""Operating tenants through the REST API (in-process): PATCH and DELETE of a tenant, tokens
(create, list, revoke, admin rotation), token scopes (a metrics token reads only /metrics), and
the audit log at GET /api/v1/events."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from test_api import Api

from tpufleet.api import auth
from tpufleet.api.app import create_app
from tpufleet.control.store.facade import Store
from tpufleet.control.store.values import Principal
from tpufleet.errors import ForbiddenError


@pytest.fixture
def api(store: Store) -> Iterator[Api]:
    a = Api(store)
    yield a
    a.http.close()


def test_patch_changes_a_tenant_and_only_the_admin_may(api: Api) -> None:
    token = api.tenant("team-a", v4=32)
    resp = api.call(
        "PATCH", "/tenants/team-a", api.admin, json={"quota": {"v4": 16, "v6e": 8}, "weight": 2.0}
    )
    assert resp.status_code == 200, resp.text
    got = resp.json()
    assert (got["quota"], got["weight"], got["preemption"], got["state"]) == (
        {"v4": 16, "v6e": 8},
        2.0,
        "lower_priority",
        "active",
    )
    assert api.call("PATCH", "/tenants/team-a", token, json={"weight": 9.0}).status_code == 403
    again = api.call("PATCH", "/tenants/team-a", api.admin, json={"preemption": "never"}).json()
    assert again["preemption"] == "never" and again["quota"] == {"v4": 16, "v6e": 8}


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/tenants/team-a", {"quota": {"v4": "lots"}}, 422, "quota.v4"),
        ("/tenants/team-a", {"preemption": "always"}, 400, "'always' is not a preemption setting"),
        ("/tenants/team-a", {"colour": "red"}, 422, "colour"),
        ("/tenants/team-b", {"weight": 2.0}, 404, "tenant 'team-b' not found; closest: team-a"),
    ],
)
def test_bad_patches_are_one_line_errors(
    api: Api, path: str, body: dict[str, object], status: int, message: str
) -> None:
    api.tenant("team-a", v4=32)
    resp = api.call("PATCH", path, api.admin, json=body)
    assert resp.status_code == status and message in resp.json()["error"]
    assert "\n" not in resp.json()["error"]


def test_delete_refuses_with_jobs_and_force_cancels_them(api: Api) -> None:
    token = api.tenant("team-a", v4=32)
    jobs = [api.submit(token) for _ in range(2)]
    refused = api.call("DELETE", "/tenants/team-a", api.admin)
    assert refused.status_code == 409
    assert refused.json()["error"].startswith("tenant team-a has 2 queued and 0 running jobs")
    gone = api.call("DELETE", "/tenants/team-a", api.admin, params={"force": "true"})
    assert gone.status_code == 200 and (gone.json()["state"], gone.json()["cancelled"]) == ("deleted", 2)
    assert api.call("GET", "/jobs", token).status_code == 401  # its tokens stopped working
    assert [api.call("GET", f"/jobs/{j}", api.admin).json()["state"] for j in jobs] == ["CANCELLED"] * 2
    assert [t["name"] for t in api.call("GET", "/tenants", api.admin).json()] == []
    listed = api.call("GET", "/tenants", api.admin, params={"include_deleted": "true"}).json()
    assert [(t["name"], t["state"]) for t in listed] == [("team-a", "deleted")]
    assert api.call("POST", "/tenants", api.admin, json={"name": "team-a"}).status_code == 409


def test_tokens_are_created_listed_without_secrets_and_revoked_at_once(api: Api) -> None:
    api.tenant("team-a")
    made = api.call("POST", "/tokens", api.admin, json={"tenant": "team-a", "scope": "jobs"})
    assert made.status_code == 201 and made.json()["token"].startswith("tf_")
    secret, token_id = made.json()["token"], made.json()["id"]
    assert api.call("GET", "/whoami", secret).json() == {
        "tenant": "team-a",
        "admin": False,
        "scope": "jobs",
        "token_id": token_id,
    }
    listed = api.call("GET", "/tokens", api.admin, params={"tenant": "team-a"})
    assert token_id in {t["id"] for t in listed.json()} and secret not in listed.text
    assert set(listed.json()[0]) == {"id", "tenant", "scope", "created_at", "last_used_at"}
    assert api.call("POST", f"/tokens/{token_id}/revoke", api.admin).status_code == 200
    assert api.call("GET", "/jobs", secret).status_code == 401
    bad = api.call("POST", "/tokens", api.admin, json={"tenant": "team-a", "scope": "root"})
    assert bad.status_code == 400 and "not a token scope; use jobs or metrics" in bad.json()["error"]
    assert api.call("POST", "/tokens", api.admin, json={"tenant": "nope"}).status_code == 404


def test_rotate_admin_writes_the_file_and_revokes_the_old_admin_token(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "state" / "admin-token"
    old = store.tokens.issue()
    http = TestClient(create_app(store, admin_token_path=path))
    resp = http.post("/api/v1/tokens/rotate-admin", headers={"Authorization": f"Bearer {old}"})
    assert resp.status_code == 200, resp.text
    new = resp.json()["token"]
    assert path.read_text().strip() == new and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert resp.json()["revoked"] == 1 and resp.json()["path"] == str(path)
    assert http.get("/api/v1/tenants", headers={"Authorization": f"Bearer {old}"}).status_code == 401
    assert http.get("/api/v1/tenants", headers={"Authorization": f"Bearer {new}"}).status_code == 200
    http.close()


def test_a_metrics_token_is_refused_everywhere_but_metrics(api: Api) -> None:
    api.tenant("team-a")
    metrics = api.call("POST", "/tokens", api.admin, json={"tenant": "team-a", "scope": "metrics"}).json()[
        "token"
    ]
    routes = [
        (method, path.replace("{", "").replace("}", ""))
        for path, ops in api.http.get("/openapi.json").json()["paths"].items()
        if path.startswith("/api/v1")
        for method in ops
    ]
    assert len(routes) > 15
    for method, path in routes:
        resp = api.http.request(
            method.upper(),
            path,
            headers={"Authorization": f"Bearer {metrics}"},
            json={} if method != "get" else None,
        )
        assert resp.status_code == 403, (method, path, resp.status_code)
    jobs = api.call("GET", "/jobs", metrics)
    assert "a metrics token may only read GET /metrics" in jobs.json()["error"]


def test_require_metrics_reader_accepts_admin_and_metrics_scope_only() -> None:
    auth.require_metrics_reader(Principal(tenant=None))
    auth.require_metrics_reader(Principal(tenant="team-a", scope="metrics"))
    with pytest.raises(ForbiddenError, match="metrics token"):
        auth.require_metrics_reader(Principal(tenant="team-a"))
    auth.check_scope(Principal(tenant="team-a", scope="metrics"), "/metrics")
    with pytest.raises(ForbiddenError):
        auth.check_scope(Principal(tenant="team-a", scope="metrics"), "/api/v1/jobs")


def test_the_audit_log_pages_and_a_tenant_reads_only_its_own(api: Api) -> None:
    token_a = api.tenant("team-a", v4=8)
    api.tenant("team-b")
    api.call("PATCH", "/tenants/team-a", api.admin, json={"weight": 3.0})
    job = api.submit(token_a)
    api.call("POST", f"/jobs/{job}/cancel", token_a)
    first = api.call("GET", "/events", api.admin, params={"limit": 2}).json()
    assert len(first["items"]) == 2 and first["next"]
    rest = api.call("GET", "/events", api.admin, params={"after": first["next"], "limit": 100}).json()
    seen = first["items"] + rest["items"]
    assert rest["next"] is None and [e["id"] for e in seen] == sorted(e["id"] for e in seen)
    assert [(e["kind"], e["tenant"]) for e in seen] == [
        ("tenant", "team-a"),
        ("tenant", "team-b"),
        ("tenant", "team-a"),
        ("cancel", "team-a"),
    ]
    tenant_id = api.call("GET", "/whoami", token_a).json()["token_id"]
    own = api.call("GET", "/events", token_a).json()["items"]
    assert {e["tenant"] for e in own} == {"team-a"} and own[-1]["actor"] == tenant_id
    assert seen[2]["actor"] == "admin" and "weight 1 -> 3" in seen[2]["message"]
    assert api.call("GET", "/events", token_a, params={"tenant": "team-b"}).status_code == 403
    assert api.call("GET", "/events", api.admin, params={"after": "nope!"}).status_code == 400
