"""No API answer grows with what a tenant stored (issue 28): listings carry cut job bodies and a
page is capped in bytes, the fleet view stays small, logs are streamed, queued job bodies are
capped per tenant in bytes; failed authentications are counted, logged without the token and
slowed per address; /docs and /redoc are off."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from test_api import Api

from tpufleet.api.app import create_app
from tpufleet.api.authguard import AuthGuard
from tpufleet.control.store import listing, logs
from tpufleet.control.store.facade import Store
from tpufleet.control.store.tokens import token_hash
from tpufleet.control.store.values import LIST_COMMAND_CHARS, JobRequest, Limits

KiB = 1024
BIG_COMMAND = ["python", *(["x" * (8 * KiB - 1)] * 7)]  # ~56 KiB, within the 64 KiB cap
BIG_ENV = {f"V{i}": "y" * (32 * KiB - 8) for i in range(8)}  # ~256 KiB, within the cap
BIG = {"command": BIG_COMMAND, "accelerator_type": "v4-16", "env": BIG_ENV}


@pytest.fixture
def api(store: Store) -> Iterator[Api]:
    a = Api(store)
    yield a
    a.http.close()


def _batch(api: Api, token: str, n: int) -> list[str]:
    resp = api.call("POST", "/jobs/batch", token, json={"jobs": [BIG] * n})
    assert resp.status_code == 201, resp.text
    return list(resp.json()["ids"])


# -- listings ----------------------------------------------------------------------------------
def test_a_listed_job_has_no_env_and_its_command_cut_and_the_job_itself_is_whole(api: Api) -> None:
    token = api.tenant("team-a", v4=16)
    [job_id] = _batch(api, token, 1)
    [item] = api.call("GET", "/jobs", token).json()["items"]
    assert "env" not in item and "attempts" not in item
    assert item["command_cut"] is True and item["command"][-1].endswith("\u2026")
    assert len(" ".join(item["command"])) <= LIST_COMMAND_CHARS + 1
    assert item["id"] == job_id and item["state"] == "QUEUED" and "goodput" in item
    whole = api.call("GET", f"/jobs/{job_id}", token).json()
    assert whole["command"] == BIG_COMMAND and whole["env"] == BIG_ENV
    small = api.submit(token, command=["python", "t.py"])
    listed = {j["id"]: j for j in api.call("GET", "/jobs", token).json()["items"]}
    assert listed[small]["command"] == ["python", "t.py"] and listed[small]["command_cut"] is False


def test_a_listing_of_big_jobs_stays_small(api: Api) -> None:
    """20 jobs of ~312 KiB each were a 6 MiB answer; cut, each is about a kilobyte."""
    token = api.tenant("team-a", v4=16)
    _batch(api, token, 20)
    resp = api.call("GET", "/jobs", token, params={"limit": 1000})
    assert len(resp.json()["items"]) == 20 and resp.json()["next"] is None
    assert len(resp.content) < 20 * 2 * KiB


def test_a_page_ends_at_its_byte_cap_and_next_goes_on_from_there(store: Store) -> None:
    store.tenants.create("team-a", {"v4": 16})
    for i in range(12):
        store.jobs.submit(
            "team-a", JobRequest.build(command=["python", f"t{i}.py"], accelerator_type="v4-16")
        )
    seen: list[str] = []
    after, pages = 0, 0
    while True:
        items, last = listing.jobs_page(store, "team-a", limit=1000, after=after, max_bytes=3 * KiB)
        assert 1 <= len(items) < 12
        assert sum(listing.item_bytes(i) for i in items) <= 3 * KiB or len(items) == 1
        seen += [i["id"] for i in items]
        pages += 1
        if last is None:
            break
        after = last
    assert pages > 1 and len(seen) == len(set(seen)) == 12


def test_the_fleet_view_stays_small_however_big_the_queued_jobs(api: Api) -> None:
    """60 queued jobs of 64 KiB commands were a 3 MiB fleet view (polled every second by the page)."""
    token = api.tenant("team-a", v4=16)
    _batch(api, token, 60)
    for who in (token, api.admin):
        resp = api.call("GET", "/fleet", who)
        assert resp.status_code == 200 and resp.json()["queued"] == 60
        assert len(resp.json()["queue"]) == 50
        assert all(
            "env" not in j and len(" ".join(j["command"])) <= LIST_COMMAND_CHARS + 1
            for j in resp.json()["queue"]
        )
        assert len(resp.content) < 128 * KiB


# -- logs ----------------------------------------------------------------------------------------
def _stored_log(store: Store, job_id: str, text: str, chunk: int) -> None:
    with store.tx() as s:
        logs.open_streams(s, job_id, 1, [("tpu-v4-16-0", 0), ("tpu-v4-16-0", 1)])
    for host in (0, 1):
        for at in range(0, len(text), chunk):
            with store.tx() as s:
                part = text[at : at + chunk]
                logs.append(s, job_id, 1, host, part, at + len(part), at + chunk >= len(text))


def test_logs_are_streamed_in_pieces_and_read_as_before(api: Api) -> None:
    token = api.tenant("team-a", v4=16)
    job_id = api.submit(token)
    text = "".join(f'line {i} \u00e9\t"quoted" \\ {"z" * (i % 50)}\n' for i in range(40_000))  # ~2.6 MB
    _stored_log(api.store, job_id, text, chunk=300_000)
    resp = api.call("GET", f"/jobs/{job_id}/logs", token)
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/json"
    assert "content-length" not in resp.headers  # streamed, not built whole first
    got = resp.json()
    assert got == api.store.jobs.read_logs(job_id).to_dict()
    assert [h["data"] for h in got["hosts"]] == [text, text]
    assert [h["next_offset"] for h in got["hosts"]] == [len(text)] * 2
    one = api.call("GET", f"/jobs/{job_id}/logs", token, params={"host": 1, "offset": 299_990}).json()
    assert one == api.store.jobs.read_logs(job_id, host=1, offset=299_990).to_dict()
    assert one["hosts"][0]["data"] == text[299_990:]
    read, spans = api.store.jobs.plan_logs(job_id, host=0, offset=10)
    parts = list(logs.stored_text(api.store, spans[0], size=70_000))
    assert max(len(p) for p in parts) <= 70_000 and "".join(parts) == text[10:]
    assert read.hosts[0].data == "" and read.hosts[0].next_offset == len(text)


def test_a_job_without_output_streams_no_hosts(api: Api) -> None:
    token = api.tenant("team-a", v4=16)
    job_id = api.submit(token)
    got = api.call("GET", f"/jobs/{job_id}/logs", token)
    assert got.json() == {"job_id": job_id, "attempt": 1, "job_state": "QUEUED", "hosts": []}
    assert api.call("GET", "/jobs/nope/logs", token).status_code == 404


# -- the queued-bytes cap ------------------------------------------------------------------------
def test_queued_job_bodies_are_capped_in_bytes_per_tenant(store: Store) -> None:
    limits = Limits(max_queued_bytes_per_tenant=700 * KiB)
    api = Api(store)
    api.http = TestClient(create_app(store, limits=limits))
    a, b = api.tenant("team-a", v4=16), api.tenant("team-b", v4=16)
    first = api.submit(a, **BIG)
    api.submit(a, **BIG)
    over = api.call("POST", "/jobs", a, json=BIG)
    assert over.status_code == 409
    assert "and this job adds 0.3 MiB: over the cap of 0.7 MiB" in over.json()["error"]
    assert "--max-queued-mib-per-tenant" in over.json()["error"]
    batch = api.call("POST", "/jobs/batch", b, json={"jobs": [BIG] * 3})
    assert batch.status_code == 409 and "the batch adds" in batch.json()["error"]
    assert api.call("POST", "/jobs/batch", b, json={"jobs": [BIG] * 2}).status_code == 201  # b's own
    assert api.call("POST", f"/jobs/{first}/cancel", a).status_code == 200  # cancelled: not queued
    assert api.call("POST", "/jobs", a, json=BIG).status_code == 201
    small = JobRequest.build(command=["python", "t.py"], accelerator_type="v4-16", env={"A": "bc"})
    assert small.body_bytes == len("python") + len("t.py") + len("A") + len("bc") + len("t")


# -- /docs -----------------------------------------------------------------------------------------
def test_docs_and_redoc_are_off_and_the_schema_stays(api: Api) -> None:
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        assert api.http.get(path).status_code == 404
    schema = api.http.get("/openapi.json").json()
    assert "429" in schema["paths"]["/api/v1/jobs"]["get"]["responses"]


# -- failed authentications ----------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _guarded(store: Store, clock: Clock) -> tuple[TestClient, TestClient, str]:
    app = create_app(store, auth_guard=AuthGuard(clock=clock))
    admin = store.tokens.issue()
    return TestClient(app, client=("10.0.0.7", 5000)), TestClient(app, client=("10.0.0.8", 5000)), admin


def _failures(http: TestClient, admin: str) -> dict[str, float]:
    text = http.get("/metrics", headers={"Authorization": f"Bearer {admin}"}).text
    out = {}
    for line in text.splitlines():
        if line.startswith("tpufleet_auth_failures_total{"):
            out[line.split('reason="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    return out


def test_failed_authentications_are_counted_by_reason_and_logged_without_the_token(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    attacker, other, admin = _guarded(store, Clock())
    assert _failures(other, admin) == {"missing": 0, "invalid": 0, "revoked": 0, "scope": 0}
    _, tenant_token = store.tenants.create("team-a", {"v4": 16})
    record, revoked_secret = store.tokens.create("team-a")
    store.tokens.revoke(record.id)
    metrics_token = store.tokens.create("team-a", "metrics")[1]
    wrong = "tf_" + "W" * 43
    caplog.set_level(logging.WARNING, logger="tpufleet.api.auth")
    assert attacker.get("/api/v1/jobs").status_code == 401
    assert attacker.get("/api/v1/jobs", headers={"Authorization": f"Bearer {wrong}"}).status_code == 401
    assert attacker.get("/api/v1/jobs", headers={"Authorization": "Basic abc"}).status_code == 401
    assert (
        attacker.get("/api/v1/fleet", headers={"Authorization": f"Bearer {revoked_secret}"}).status_code
        == 401
    )
    assert (
        attacker.get("/api/v1/jobs", headers={"Authorization": f"Bearer {metrics_token}"}).status_code == 403
    )
    assert attacker.get("/metrics", headers={"Authorization": f"Bearer {tenant_token}"}).status_code == 403
    assert _failures(other, admin) == {"missing": 1, "invalid": 2, "revoked": 1, "scope": 2}
    lines = [r.getMessage() for r in caplog.records if r.name == "tpufleet.api.auth"]
    assert len(lines) == 6
    assert "authentication failed: invalid from 10.0.0.7 on GET /api/v1/jobs" in lines
    assert "authentication failed: revoked from 10.0.0.7 on GET /api/v1/fleet" in lines
    for secret in (wrong, revoked_secret, metrics_token, tenant_token):
        assert not any(secret[3:15] in line for line in lines)

    assert not any(token_hash(wrong)[:16] in line for line in lines)


def test_repeated_failures_from_one_address_get_429_and_valid_tokens_and_other_addresses_pass(
    store: Store,
) -> None:
    clock = Clock()
    attacker, other, admin = _guarded(store, clock)
    wrong = {"Authorization": "Bearer tf_wrong"}
    codes = [attacker.get("/api/v1/jobs", headers=wrong).status_code for _ in range(12)]
    assert codes == [401] * 10 + [429] * 2
    blocked = attacker.get("/api/v1/jobs", headers=wrong)
    assert blocked.status_code == 429 and 1 <= int(blocked.headers["Retry-After"]) <= 60
    assert "too many failed authentications" in blocked.json()["error"]
    # a valid token from the same (shared) address still passes: nobody is locked out by another
    assert attacker.get("/api/v1/whoami", headers={"Authorization": f"Bearer {admin}"}).status_code == 200
    assert other.get("/api/v1/whoami", headers={"Authorization": f"Bearer {admin}"}).status_code == 200
    assert other.get("/api/v1/jobs", headers=wrong).status_code == 401  # counted for 10.0.0.8 only
    assert _failures(other, admin)["invalid"] == 11  # the 429s are not failures
    clock.now += 61  # the window passed: let in again, a new count
    assert attacker.get("/api/v1/whoami", headers={"Authorization": f"Bearer {admin}"}).status_code == 200
    assert attacker.get("/api/v1/jobs", headers=wrong).status_code == 401
    assert json.loads(attacker.get("/healthz").text)["status"] == "ok"  # unauthenticated routes: never


def test_the_slice_manager_routes_authenticate_as_every_other_route(store: Store) -> None:
    """``/api/v1/slice-groups`` once checked the token on its own: failures there went uncounted and
    were never slowed, and a metrics token read as a tenant's. Now one dependency serves every route."""
    attacker, other, admin = _guarded(store, Clock())
    metrics_token = store.tokens.create(store.tenants.create("team-a", {"v4": 16})[0].name, "metrics")[1]
    wrong = {"Authorization": "Bearer tf_wrong"}
    codes = [attacker.get("/api/v1/slice-groups", headers=wrong).status_code for _ in range(11)]
    assert codes == [401] * 10 + [429]
    scoped = other.get("/api/v1/slice-groups", headers={"Authorization": f"Bearer {metrics_token}"})
    assert (
        scoped.status_code == 403 and "a metrics token may only read GET /metrics" in scoped.json()["error"]
    )
    assert _failures(other, admin) == {"missing": 0, "invalid": 10, "revoked": 0, "scope": 1}
    assert other.get("/api/v1/slice-groups", headers={"Authorization": f"Bearer {admin}"}).json() == []


def test_the_failure_table_is_bounded() -> None:
    clock = Clock()
    guard = AuthGuard(clock=clock, max_failures=3, max_addresses=100)
    for i in range(500):
        for _ in range(5):
            guard.failed(f"10.1.{i // 256}.{i % 256}", "invalid", "GET", "/api/v1/jobs")
    assert len(guard._recent) == 100 and all(len(t) <= 3 for t in guard._recent.values())
    assert guard.failures["invalid"] == 2500
