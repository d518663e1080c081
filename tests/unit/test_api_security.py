"""The API as a hostile tenant sees it (issue 8): working_dir never names the control plane's disk,
packages cannot unpack outside their directory, every field is strictly typed and capped, bodies
are capped before they are read, other tenants' jobs are indistinguishable from missing ones, and
/healthz tells nothing but whether the loop cycles."""

from __future__ import annotations

import io
import json
import os
import stat
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from test_api import Api

from tpufleet.api.app import create_app
from tpufleet.client.http import Client
from tpufleet.control.store.facade import Store
from tpufleet.control.store.tables import JobRow, PackageRow
from tpufleet.control.store.values import Limits
from tpufleet.errors import NotFoundError

JOB = {"command": ["python", "t.py"], "accelerator_type": "v4-16"}
ZIP = {"Content-Type": "application/zip"}


def make_zip(entries: dict[str, bytes] | None = None, *, links: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in (entries if entries is not None else {"train.py": b"print(1)\n"}).items():
            # A fixed time: the same entries make the same bytes, whenever (writestr takes the clock's).
            zf.writestr(zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0)), data, zipfile.ZIP_DEFLATED)
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, target)
    return buf.getvalue()


def rows(store: Store, column: Any) -> int:
    with store.tx() as s:
        return int(s.scalar(select(func.count(column))) or 0)


@pytest.fixture
def api(store: Store) -> Iterator[Api]:
    a = Api(store)
    yield a
    a.http.close()


def with_limits(store: Store, limits: Limits) -> Api:
    a = Api(store)
    a.http = TestClient(create_app(store, limits=limits))
    return a


# -- working_dir -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "working_dir",
    [
        "/etc",
        "../../../../etc",
        ".",
        "state",
        "~/.tpufleet",
        "file:///etc",
        "file://localhost/root/.tpufleet/admin-token",
        "https://evil.example/x.zip",  # a URL, but no prefix is allow-listed
        "gs://bucket/pkg.zip",
        "sha256:../tenants",
        "sha256:" + "g" * 64,
        "sha256:" + "A" * 64,
        "sha256:" + "a" * 63,
        " sha256:" + "a" * 64,
        "/etc\x00",
    ],
)
def test_a_working_dir_that_is_not_a_package_or_allowed_url_is_a_400(api: Api, working_dir: str) -> None:
    token = api.tenant("team-a", v4=8)
    resp = api.call("POST", "/jobs", token, json=JOB | {"working_dir": working_dir})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error.startswith("working_dir: ") and "is not accepted; give a package id sha256:" in error
    assert "\n" not in error and rows(api.store, JobRow.seq) == 0


def test_only_urls_under_an_allowed_prefix_pass(store: Store) -> None:
    api = with_limits(store, Limits(working_dir_url_prefixes=("https://artifacts.example.com/pkgs/",)))
    token = api.tenant("team-a", v4=8)
    ok = "https://artifacts.example.com/pkgs/train.zip"
    assert api.store.jobs.get(api.submit(token, working_dir=ok)).working_dir == ok
    for bad in (
        "https://artifacts.example.com.evil.net/pkgs/x.zip",
        "https://artifacts.example.com/other/x.zip",
        "http://artifacts.example.com/pkgs/x.zip",
        "file:///etc",
        "/etc",
    ):
        resp = api.call("POST", "/jobs", token, json=JOB | {"working_dir": bad})
        assert resp.status_code == 400 and "https://artifacts.example.com/pkgs/" in resp.json()["error"], bad
    api.http.close()


def test_a_package_is_uploaded_referenced_and_private_to_its_tenant(api: Api) -> None:
    a, b = api.tenant("team-a", v4=8), api.tenant("team-b", v4=8)
    data = make_zip({"train.py": b"print(1)\n", "pkg/util.py": b"X = 1\n"})
    resp = api.call("POST", "/packages", a, content=data, headers=ZIP)
    assert resp.status_code == 201, resp.text
    pid = resp.json()["id"]
    assert resp.json() == {"id": pid, "size": len(data)} and pid.startswith("sha256:") and len(pid) == 71
    job_id = api.submit(a, working_dir=pid)
    assert api.store.jobs.get(job_id).working_dir == pid
    assert api.store.packages.get("team-a", pid) == data
    # team-b cannot use team-a's package, and cannot tell it from one that does not exist
    theirs = api.call("POST", "/jobs", b, json=JOB | {"working_dir": pid})
    unknown = api.call("POST", "/jobs", b, json=JOB | {"working_dir": "sha256:" + "0" * 64})
    assert theirs.status_code == unknown.status_code == 404
    assert "not found; upload it first" in theirs.json()["error"]
    with pytest.raises(NotFoundError):
        api.store.packages.get("team-b", pid)
    # the same bytes uploaded by team-b are team-b's own copy
    assert api.call("POST", "/packages", b, content=data, headers=ZIP).json()["id"] == pid
    assert api.store.packages.get("team-b", pid) == data and rows(api.store, PackageRow.sha256) == 2
    assert api.call("POST", "/packages", a, content=data, headers=ZIP).status_code == 201  # idempotent
    assert rows(api.store, PackageRow.sha256) == 2


@pytest.mark.parametrize(
    "package_id",
    ["../tenants", "sha256:../tenants", "sha256:" + "0" * 64, "", "sha256:" + "f" * 64 + "/../x", "tenants"],
)
def test_store_package_is_not_found_for_anything_but_an_own_upload(store: Store, package_id: str) -> None:
    store.tenants.create("team-a", {"v4": 8})
    with pytest.raises(NotFoundError, match="not found for tenant 'team-a'"):
        store.packages.get("team-a", package_id)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (make_zip({"/etc/cron.d/x": b"x"}), "is an absolute path"),
        (make_zip({"../x.py": b"x"}), "has a '..' component"),
        (make_zip({"a/../../x.py": b"x"}), "has a '..' component"),
        (make_zip({"a\\..\\..\\x.py": b"x"}), "backslash"),
        (make_zip({"C:/x.py": b"x"}), "is an absolute path"),
        (make_zip(links={"data": "/root/.tpufleet"}), "is a symbolic link"),
        (b"#!/bin/sh\necho not a zip\n", "not a readable zip file"),
        (make_zip({f"f{i}.txt": b"" for i in range(11)}), "11 entries; at most 10"),
        (make_zip({"zeros.bin": b"\0" * 5000}), "unpacked, the package has over 4,096 bytes"),
    ],
)
def test_a_package_that_could_unpack_outside_or_past_the_caps_is_refused(
    store: Store, data: bytes, message: str
) -> None:
    api = with_limits(store, Limits(max_package_entries=10, max_package_unpacked_bytes=4096))
    token = api.tenant("team-a", v4=8)
    resp = api.call("POST", "/packages", token, content=data, headers=ZIP)
    assert resp.status_code == 400, resp.text
    assert message in resp.json()["error"] and "\n" not in resp.json()["error"]
    assert rows(store, PackageRow.sha256) == 0
    api.http.close()


def test_a_package_over_the_size_cap_is_413_and_the_wrong_type_415(store: Store) -> None:
    api = with_limits(store, Limits(max_package_bytes=2000))
    token = api.tenant("team-a", v4=8)
    big = make_zip({"r.bin": os.urandom(3000)})
    resp = api.call("POST", "/packages", token, content=big, headers=ZIP)
    assert resp.status_code == 413 and "at most 2,000" in resp.json()["error"]
    chunked = api.call("POST", "/packages", token, content=iter([big[:1500], big[1500:]]), headers=ZIP)
    assert chunked.status_code == 413 and "at most 2,000" in chunked.json()["error"]
    wrong = api.call("POST", "/packages", token, content=make_zip(), headers={"Content-Type": "text/plain"})
    assert wrong.status_code == 415 and "application/zip" in wrong.json()["error"]
    assert rows(store, PackageRow.sha256) == 0
    api.http.close()


def test_the_client_uploads_bytes_and_the_admin_uploads_for_a_tenant(api: Api) -> None:
    api.tenant("team-a", v4=8)
    client = Client("http://testserver", api.admin, http=api.http)
    pid = client.upload_package(make_zip(), tenant="team-a")
    assert api.store.packages.get("team-a", pid) == make_zip()
    job = client.submit(["python", "train.py"], "v4-16", working_dir=pid, tenant="team-a")
    assert job["working_dir"] == pid


# -- strict types and caps ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"num_slices": "2"}, "num_slices: Input should be a valid integer"),
        ({"num_slices": True}, "num_slices: Input should be a valid integer"),
        ({"num_slices": 2.0}, "num_slices: Input should be a valid integer"),
        ({"priority": "1"}, "priority: Input should be a valid integer"),
        ({"max_retries": False}, "max_retries: Input should be a valid integer"),
        ({"command": ["python", 1]}, "command.1: Input should be a valid string"),
        ({"command": "python t.py"}, "command: Input should be a valid list"),
        ({"env": {"A": 1}}, "env.A: Input should be a valid string"),
        ({"name": 5}, "name: Input should be a valid string"),
    ],
)
def test_numbers_and_strings_are_not_coerced(api: Api, body: dict[str, object], message: str) -> None:
    token = api.tenant("team-a", v4=8)
    resp = api.call("POST", "/jobs", token, json=JOB | body)
    assert resp.status_code == 422, resp.text
    assert message in resp.json()["error"] and rows(api.store, JobRow.seq) == 0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"command": ["x"] * 257}, "command: 257 arguments; at most 256"),
        ({"command": ["echo", "a" * 8193]}, "command: argument 1 has 8193 bytes; at most 8192"),
        ({"command": ["echo", *["é" * 4000] * 9]}, "command: 72004 bytes in all; at most 65536"),
        ({"command": ["echo", "a\x00b"]}, "command: argument 1 contains a NUL byte"),
        ({"env": {f"V{i}": "x" for i in range(257)}}, "env: 257 variables; at most 256"),
        ({"env": {"A" * 257: "x"}}, "env: a name of 257 characters; at most 256"),
        ({"env": {"A": "x" * 32769}}, "env: A has 32769 bytes; at most 32768"),
        ({"env": {f"V{i}": "x" * 30000 for i in range(9)}}, "bytes in all; at most 262144"),
        ({"env": {"A": "x\x00y"}}, "env: A contains a NUL byte"),
        ({"env": {"A\x00": "x"}}, "is not a valid variable name"),
        ({"env": {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.001"}}, "a number of seconds, at least 0.5"),
        ({"env": {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0"}}, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S='0'"),
        ({"env": {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "-5"}}, "at least 0.5"),
        ({"env": {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "nan"}}, "at least 0.5"),
        ({"env": {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "inf"}}, "at least 0.5"),
        ({"env": {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "soon"}}, "at least 0.5"),
        ({"name": "n" * 129}, "name must have 1 to 128 characters, got 129"),
        ({"name": "\x1b[2J\x1b[31mowned"}, "control or format character '\\x1b' in the name"),
        ({"name": "abc\u202edcba"}, "control or format character"),
        ({"priority": 10**30}, "priority: must be an integer from -1000000 to 1000000"),
    ],
)
def test_fields_over_their_caps_are_a_one_line_400(api: Api, body: dict[str, object], message: str) -> None:
    token = api.tenant("team-a", v4=8)
    resp = api.call("POST", "/jobs", token, json=JOB | body)
    assert resp.status_code == 400, resp.text
    assert message in resp.json()["error"] and "\n" not in resp.json()["error"]
    assert rows(api.store, JobRow.seq) == 0


@pytest.mark.parametrize("seconds", ["0.5", "2", "30"])
def test_a_job_may_slow_ray_trains_polling_down_to_its_floor(api: Api, seconds: str) -> None:
    """The controller polls from the head, which every job shares: at or above the floor is the job's own
    business and reaches it unchanged."""
    token = api.tenant("team-a", v4=8)
    env = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": seconds}
    resp = api.call("POST", "/jobs", token, json=JOB | {"env": env})
    assert resp.status_code in (200, 201), resp.text
    assert api.store.jobs.get(resp.json()["id"]).env == env


@pytest.mark.parametrize(
    ("quota", "weight", "status", "message"),
    [
        ({"v4": 10**30}, 1.0, 400, "chips must be an integer from 0 to 1,000,000"),
        ({"v4": "8"}, 1.0, 422, "quota.v4: Input should be a valid integer"),
        ({"v4": True}, 1.0, 422, "quota.v4: Input should be a valid integer"),
        ({"v4": 8}, "2", 422, "weight: Input should be a valid number"),
        ({"v4": 8}, True, 422, "weight: Input should be a valid number"),
    ],
)
def test_tenant_quota_and_weight_are_strict_and_bounded(
    api: Api, quota: dict[str, object], weight: object, status: int, message: str
) -> None:
    resp = api.call("POST", "/tenants", api.admin, json={"name": "team-a", "quota": quota, "weight": weight})
    assert resp.status_code == status, resp.text
    assert message in resp.json()["error"] and api.store.tenants.all() == []


def test_a_body_over_the_cap_is_413_before_it_is_read(store: Store) -> None:
    api = with_limits(store, Limits(max_body_bytes=10_000))
    token = api.tenant("team-a", v4=8)
    body = json.dumps(JOB | {"env": {"A": "x" * 20_000}}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    declared = api.http.post("/api/v1/jobs", content=body, headers=headers)
    assert declared.status_code == 413 and "at most 10,000" in declared.json()["error"]
    chunks = iter([body[i : i + 4096] for i in range(0, len(body), 4096)])
    streamed = api.http.post("/api/v1/jobs", content=chunks, headers=headers)
    assert streamed.status_code == 413 and "over" in streamed.json()["error"]
    assert rows(store, JobRow.seq) == 0
    small = api.http.post("/api/v1/jobs", content=iter([json.dumps(JOB).encode()]), headers=headers)
    assert small.status_code == 201, small.text  # a chunked body under the cap still arrives whole
    api.http.close()


def test_a_tenant_cannot_queue_past_its_cap(store: Store) -> None:
    api = with_limits(store, Limits(max_queued_per_tenant=2))
    a, b = api.tenant("team-a", v4=8), api.tenant("team-b", v4=8)
    first = api.submit(a)
    api.submit(a)
    resp = api.call("POST", "/jobs", a, json=JOB)
    assert resp.status_code == 409
    assert "already has 2 queued jobs, the cap (serve --max-queued-per-tenant 2)" in resp.json()["error"]
    api.submit(b)  # another tenant is not affected
    api.call("POST", f"/jobs/{first}/cancel", a)
    api.submit(a)  # room again once one left the queue
    api.http.close()


# -- paging ------------------------------------------------------------------------------------
def test_jobs_are_listed_a_page_at_a_time(api: Api) -> None:
    token = api.tenant("team-a", v4=8)
    ids = [api.submit(token) for _ in range(5)]
    seen, after, pages = [], None, 0
    while True:
        params = {"limit": 2} | ({"after": after} if after else {})
        page = api.call("GET", "/jobs", token, params=params).json()
        assert set(page) == {"items", "next"} and len(page["items"]) <= 2
        seen += [j["id"] for j in page["items"]]
        pages += 1
        after = page["next"]
        if after is None:
            break
    assert seen == ids and pages == 3
    all_of_them = api.call("GET", "/jobs", token, params={"limit": 1000}).json()
    assert [j["id"] for j in all_of_them["items"]] == ids and all_of_them["next"] is None
    client = Client("http://testserver", token, http=api.http)
    assert [j["id"] for j in client.jobs(page_size=2)] == ids
    assert [j["id"] for j in client.jobs(limit=3, page_size=2)] == ids[:3]
    assert client.jobs_page(limit=1)["next"] is not None


@pytest.mark.parametrize("cursor", ["x", "!!!", "c2VxOmFiYw", "c2VxOi0x", "bm9wZQ", "A" * 41, "c2VxOjE=="])
def test_an_invalid_cursor_is_a_400(api: Api, cursor: str) -> None:
    resp = api.call("GET", "/jobs", api.tenant("team-a", v4=8), params={"after": cursor})
    assert resp.status_code == 400 and "after: not a cursor" in resp.json()["error"]


@pytest.mark.parametrize("limit", [0, 1001, -1])
def test_a_limit_outside_1_to_1000_is_a_422(api: Api, limit: int) -> None:
    resp = api.call("GET", "/jobs", api.tenant("team-a", v4=8), params={"limit": limit})
    assert resp.status_code == 422 and "limit" in resp.json()["error"]


# -- health and status -------------------------------------------------------------------------
def test_healthz_reports_a_stalled_loop_without_error_text(store: Store) -> None:
    secret = "/home/team-b/secret-project: permission denied"
    health = {"cycles": 7, "stalled": True, "last_error": secret, "cycle_ms_last": 9.5, "cycle_ms_p50": 8.0}
    http = TestClient(create_app(store, status=lambda: health))
    resp = http.get("/healthz")
    assert resp.status_code == 503
    assert resp.json() == {
        "status": "stalled",
        "version": resp.json()["version"],
        "cycles": 7,
        "leader": True,  # one process without replicas always leads
        "leader_replica": None,
    }
    assert "secret" not in resp.text
    health["stalled"] = False
    assert http.get("/healthz").status_code == 200 and http.get("/healthz").json()["status"] == "ok"

    def broken() -> dict[str, Any]:
        raise RuntimeError(secret)

    down = TestClient(create_app(store, status=broken)).get("/healthz")
    assert down.status_code == 503 and "secret" not in down.text


def test_status_is_admin_only_and_has_the_loop_and_fleet_figures(api: Api) -> None:
    token = api.tenant("team-a", v4=8)
    api.submit(token)
    assert api.call("GET", "/status", token).status_code == 403
    got = api.call("GET", "/status", api.admin).json()
    assert {"queued", "running", "cycles", "cycle_ms_last", "cycle_ms_p50", "slices"} <= set(got)
    assert (got["queued"], got["running"], got["cycles"], got["slices"]) == (1, 0, 0, {})


# -- the database file -------------------------------------------------------------------------
def test_the_sqlite_file_and_its_wal_are_private(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    old = os.umask(0o022)
    try:
        store = Store.open(f"sqlite:///{path}")
        store.tenants.create("team-a", {"v4": 8})  # a write, so the -wal file exists
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
        store.close()
        assert "fleet.db-wal" in modes
        assert modes == dict.fromkeys(modes, 0o600)
        path.chmod(0o644)  # a file made world-readable by an older version is tightened on start
        Store.open(f"sqlite:///{path}").close()
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    finally:
        os.umask(old)


# -- the OpenAPI schema ------------------------------------------------------------------------
def test_openapi_declares_the_errors_each_route_returns(api: Api) -> None:
    spec = api.http.get("/openapi.json").json()
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            codes = set(op["responses"])
            if path.startswith("/api/v1"):
                assert {"401", "503"} <= codes, (method, path)
            for code in codes - {"200", "201"}:
                ref = op["responses"][code]["content"]["application/json"]["schema"]["$ref"]
                assert ref.endswith(("/ErrorBody", "/Health")), (method, path, code)
    submit = spec["paths"]["/api/v1/jobs"]["post"]["responses"]
    assert {"400", "403", "404", "409", "413", "422"} <= set(submit)
    assert "application/zip" in spec["paths"]["/api/v1/packages"]["post"]["requestBody"]["content"]
    assert spec["components"]["schemas"]["ErrorBody"]["required"] == ["error"]
