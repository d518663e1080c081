"""The fleet page's server side: ``/`` and its files (no token, strict CSP, no inline script) and
``GET /api/v1/fleet`` (slices as hosts and chips, queue positions, tenants' use against quota), with
tenant isolation: a tenant's token never sees another tenant's job, id, name or usage."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path
from typing import Any

import planes
import pytest
from fastapi.testclient import TestClient

from tpufleet import catalog
from tpufleet.api.app import create_app
from tpufleet.api.page import FILES
from tpufleet.api.server import ControlPlane
from tpufleet.control.cluster.memory import MemoryCluster
from tpufleet.control.loop.service import ServiceConfig
from tpufleet.control.store.facade import Store
from tpufleet.control.store.fleetview import duty_cycles
from tpufleet.control.store.values import JobRequest
from tpufleet.observe.device import DeviceSampler, Endpoint, HostTarget
from tpufleet.observe.tpumetrics import ChipReading

STATIC = resources.files("tpufleet.api").joinpath("static")


# -- the page: static, unauthenticated, a strict CSP -----------------------------------------
@pytest.fixture
def http(tmp_path: Path) -> Iterator[TestClient]:
    store = Store.open(f"sqlite:///{tmp_path / 'db.sqlite'}")
    yield TestClient(create_app(store))
    store.close()


def _csp(header: str) -> dict[str, list[str]]:
    out = {}
    for part in header.split(";"):
        name, *values = part.split()
        out[name] = values
    return out


@pytest.mark.parametrize("path", sorted(FILES))
def test_the_page_and_its_files_are_served_without_a_token_under_a_strict_csp(
    http: TestClient, path: str
) -> None:
    resp = http.get(path)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith(FILES[path][1].split(";")[0])
    csp = _csp(resp.headers["content-security-policy"])
    assert csp["default-src"] == ["'none'"]
    for directive in ("script-src", "style-src", "connect-src"):
        assert csp[directive] == ["'self'"], directive  # no inline, no eval, no other origin
    assert csp["frame-ancestors"] == ["'none'"] and csp["base-uri"] == ["'none'"]
    assert resp.headers["x-content-type-options"] == "nosniff"
    assert resp.headers["referrer-policy"] == "no-referrer"


@pytest.mark.parametrize(
    "path", ["/static/index.html", "/index.html", "/static/fleet.js", "/../pyproject.toml", "/fleet.js/x"]
)
def test_only_the_named_files_are_served(http: TestClient, path: str) -> None:
    assert http.get(path).status_code == 404


def test_the_page_is_not_in_the_api_schema(http: TestClient) -> None:
    paths = http.get("/openapi.json").json()["paths"]
    assert "/api/v1/fleet" in paths and not {"/", "/fleet.js", "/fleet.css"} & set(paths)


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.script_text = ""
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.script_text += data


def test_the_html_has_no_inline_script_style_or_handler_and_loads_only_its_own_files() -> None:
    parser = _Tags()
    parser.feed(STATIC.joinpath("index.html").read_text())
    assert parser.script_text.strip() == ""
    for tag, attrs in parser.tags:
        assert not [a for a in attrs if a.startswith("on") or a == "style"], (tag, attrs)
        for key in ("src", "href"):
            ref = attrs.get(key)
            if ref is not None and tag in ("script", "link"):
                assert ref in FILES or ref == "data:,", ref  # same origin, nothing third-party
    assert ("script", {"src": "/fleet.js", "defer": None}) in parser.tags


def test_the_script_never_parses_text_as_html_and_keeps_the_token_out_of_urls() -> None:
    js = STATIC.joinpath("fleet.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function("):
        assert sink not in js, sink
    assert "sessionStorage" in js and "localStorage" not in js and "document.cookie" not in js
    assert '"Bearer " + token()' in js
    assert not re.search(r"[?&]token=", js)


def test_the_legend_draws_held_in_the_tenants_colour_as_the_chips_are() -> None:
    js = STATIC.joinpath("fleet.js").read_text()
    css = STATIC.joinpath("fleet.css").read_text()
    legend = js[js.index("function renderLegend(") : js.index("// -- tables")]
    chip = js[js.index("function chipNode(") : js.index("function sliceNode(")]
    # a held chip of a tenant: the class "tenant" and the tenant's hue (fleet.css draws it in that hue)
    assert 'chip.classList.add("tenant")' in chip and "hue(slice.tenant)" in chip
    assert ".chip.tenant { background: hsl(var(--hue)" in css
    # the legend once showed HELD in .chip[data-state="HELD"]'s fixed blue, which no held chip has
    assert '["HELD", "held"]' not in legend
    assert 'chip("HELD", "tenant")' in legend and "hue(name)" in legend
    assert "held: the tenant's colour (as in the tenants table)" in legend
    assert "renderLegend(f.tenants.map((t) => t.name))" in js  # the tenants on view


def test_the_fleet_view_needs_a_token(http: TestClient) -> None:
    resp = http.get("/api/v1/fleet")
    assert resp.status_code == 401 and resp.headers["www-authenticate"] == "Bearer"


# -- GET /api/v1/fleet over a live sandbox control plane -------------------------------------
@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    cluster = MemoryCluster.sandbox("v4-16:2,v6e-8:1,v5litepod-16:1", job_seconds=300)
    config = ServiceConfig(interval_s=0.02, busy_interval_s=0.005, log_budget_s=0.05)
    with planes.running(cluster, tmp_path / "state", config=config) as cp:
        yield cp


def _wait(pred: Any, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _setup(cp: ControlPlane) -> tuple[TestClient, dict[str, str], dict[str, dict[str, str]], dict[str, str]]:
    http = TestClient(cp.app)
    admin = {"Authorization": f"Bearer {cp.admin_token}"}
    tokens = {}
    for name, quota in (("alpha", {"v4": 8, "v6e": 8}), ("beta", {"v4": 8})):
        resp = http.post("/api/v1/tenants", json={"name": name, "quota": quota}, headers=admin)
        tokens[name] = {"Authorization": f"Bearer {resp.json()['token']}"}
    ids = {}
    for key, tenant, shape, prio in (
        ("a-run", "alpha", "v4-16", 0),
        ("b-run", "beta", "v4-16", 0),
        ("b-v6e", "beta", "v6e-8", 0),  # beta has no v6e quota: it borrows alpha's idle v6e
    ):
        body = {"command": ["python", f"{key}.py"], "accelerator_type": shape, "priority": prio}
        body["name"] = f"job {key}"
        ids[key] = http.post("/api/v1/jobs", json=body, headers=tokens[tenant]).json()["id"]
    cp.start()
    _wait(lambda: cp.store.counts()["running"] == 3, "three jobs hold slices")
    cp.service.close()  # stop the loop: what is queued from here on stays queued, in a known order
    for key, tenant, prio in (("a-q1", "alpha", 0), ("b-q1", "beta", 5), ("a-q2", "alpha", 0)):
        body = {"command": ["python", f"{key}.py"], "accelerator_type": "v4-16", "priority": prio}
        body["name"] = f"job {key}"
        ids[key] = http.post("/api/v1/jobs", json=body, headers=tokens[tenant]).json()["id"]
    return http, admin, tokens, ids


def test_the_admin_sees_every_slice_as_hosts_and_chips_every_job_and_every_tenant(
    plane: ControlPlane,
) -> None:
    http, admin, _, ids = _setup(plane)
    view = http.get("/api/v1/fleet", headers=admin).json()
    assert view["viewer"] == {"tenant": None, "admin": True}
    slices = {s["name"]: s for s in view["slices"]}
    assert sorted(slices) == ["tpu-v4-16-0", "tpu-v4-16-1", "tpu-v5litepod-16-0", "tpu-v6e-8-0"]
    for s in slices.values():
        st = catalog.slice_type(s["accelerator_type"])
        assert len(s["hosts"]) == st.hosts and s["chips"] == st.chips
        assert [h["chips"] for h in s["hosts"]] == [st.chips_per_host] * st.hosts
        assert all(h["duty_cycle_percent"] is None for h in s["hosts"])  # nothing measured: None, not 0
    held = {s["holder"]: s for s in slices.values() if s["holder"]}
    assert set(held) == {ids["a-run"], ids["b-run"], ids["b-v6e"]}
    assert held[ids["b-v6e"]]["tenant"] == "beta" and held[ids["a-run"]]["tenant"] == "alpha"
    assert (
        slices["tpu-v5litepod-16-0"]["state"] == "FREE" and not slices["tpu-v5litepod-16-0"]["held_by_other"]
    )
    assert {j["id"] for j in view["active"]} == {ids["a-run"], ids["b-run"], ids["b-v6e"]}
    # the queue in the policy's order before fair share: priority first, then submission
    assert [(j["id"], j["position"]) for j in view["queue"]] == [
        (ids["b-q1"], 1),
        (ids["a-q1"], 2),
        (ids["a-q2"], 3),
    ]
    assert view["queued"] == 3
    tenants = {t["name"]: t for t in view["tenants"]}
    assert tenants["alpha"]["held"] == {"v4": 8} and tenants["alpha"]["quota"] == {"v4": 8, "v6e": 8}
    assert tenants["beta"]["held"] == {"v4": 8, "v6e": 8} and tenants["beta"]["borrowing"] == {"v6e": 8}
    assert (tenants["alpha"]["running"], tenants["alpha"]["queued"]) == (1, 2)
    assert (tenants["beta"]["running"], tenants["beta"]["queued"]) == (2, 1)
    assert "env" not in view["active"][0]
    # each running job carries its goodput like every job view: unknown (None) until it reports steps
    assert all(j["goodput"]["ratio"] is None and j["goodput"]["held_s"] >= 0 for j in view["active"])


def test_a_tenant_sees_every_slice_but_only_its_own_jobs_and_usage(plane: ControlPlane) -> None:
    http, admin, tokens, ids = _setup(plane)
    betas = {
        s["name"] for s in http.get("/api/v1/fleet", headers=admin).json()["slices"] if s["tenant"] == "beta"
    }
    resp = http.get("/api/v1/fleet", headers=tokens["alpha"])
    view = resp.json()
    assert view["viewer"] == {"tenant": "alpha", "admin": False}
    assert len(view["slices"]) == 4
    others = [s for s in view["slices"] if s["held_by_other"]]
    assert {s["name"] for s in others} == betas and len(betas) == 2
    assert all(s["holder"] is None and s["tenant"] is None for s in others)
    mine = [s for s in view["slices"] if s["holder"]]
    assert [(s["holder"], s["tenant"]) for s in mine] == [(ids["a-run"], "alpha")]
    assert [j["id"] for j in view["active"]] == [ids["a-run"]]
    # its queued jobs keep their places among everyone's (beta's priority-5 job is ahead of them)
    assert [(j["id"], j["position"]) for j in view["queue"]] == [(ids["a-q1"], 2), (ids["a-q2"], 3)]
    assert view["queued"] == 2
    assert [t["name"] for t in view["tenants"]] == ["alpha"]
    text = resp.text
    for key in ("b-run", "b-v6e", "b-q1"):  # nothing of beta's: no id, no name, no tenant name
        assert ids[key] not in text and f"job {key}" not in text
    assert "beta" not in text


def test_recent_jobs_are_the_callers_newest_finished_first(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        store.tenants.create("alpha", {"v4": 8}, 1.0)
        ids = [
            store.jobs.submit("alpha", JobRequest.build(command=["x"], accelerator_type="v4-16")).id
            for _ in range(3)
        ]
        for job_id in ids:
            store.jobs.request_cancel(job_id)  # a queued job cancelled ends at once
        http = TestClient(create_app(store))
        admin = {"Authorization": f"Bearer {store.tokens.issue(None)}"}
        view = http.get("/api/v1/fleet", headers=admin).json()
        assert [j["id"] for j in view["recent"]] == ids[::-1]
        assert {j["state"] for j in view["recent"]} == {"CANCELLED"} and view["queue"] == []
        assert json.dumps(view)  # JSON all the way down
    finally:
        store.close()


def test_measured_duty_cycles_are_shown_per_chip_and_unmeasured_ones_as_none(plane: ControlPlane) -> None:
    readings = {
        ("tpu-v4-16-0", 1): [ChipReading(chip=c, duty_cycle_percent=10.0 * c) for c in range(3)]
        + [ChipReading(chip=3, hbm_used_bytes=1.0)],  # reported, but no duty cycle
        ("tpu-v6e-8-0", 0): [ChipReading(chip=5, duty_cycle_percent=97.5)],
    }
    plane.app.state.duty_cycles = lambda: duty_cycles(readings)
    plane.start()
    _wait(lambda: len(plane.store.slices.all()) == 4, "the loop lists the slices")
    http = TestClient(plane.app)
    view = http.get("/api/v1/fleet", headers={"Authorization": f"Bearer {plane.admin_token}"}).json()
    hosts = {(s["name"], h["worker_id"]): h["duty_cycle_percent"] for s in view["slices"] for h in s["hosts"]}
    assert hosts[("tpu-v4-16-0", 1)] == [0.0, 10.0, 20.0, None]
    assert hosts[("tpu-v6e-8-0", 0)] == [None] * 5 + [97.5, None, None]
    assert hosts[("tpu-v4-16-0", 0)] is None and hosts[("tpu-v5litepod-16-0", 3)] is None


def test_a_deleted_tenant_leaves_the_view_once_its_jobs_are_gone(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        for name in ("alpha", "gone"):
            store.tenants.create(name, {"v4": 8}, 1.0)
        store.tenants.delete("gone")
        http = TestClient(create_app(store))
        admin = {"Authorization": f"Bearer {store.tokens.issue(None)}"}
        view = http.get("/api/v1/fleet", headers=admin).json()
        assert [(t["name"], t["deleted"]) for t in view["tenants"]] == [("alpha", False)]
    finally:
        store.close()


def test_queue_places_match_a_plain_sort_of_each_slice_types_queue(tmp_path: Path) -> None:
    """Admin and tenant views give every listed job its place among all queued jobs of its type,
    ordered by priority then submission, on a queue mixing types, priorities and tenants."""
    store = Store.open(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        tenants = ("alpha", "beta", "gamma")
        for name in tenants:
            store.tenants.create(name, {"v4": 8}, 1.0)
        shapes, jobs = ("v4-16", "v6e-8", "v4-32"), []
        for i in range(60):
            tenant, shape, prio = tenants[(i * 7) % 3], shapes[(i * 5) % 3], (i * 11) % 4
            req = JobRequest.build(command=["x"], accelerator_type=shape, priority=prio)
            jobs.append((store.jobs.submit(tenant, req).id, tenant, shape, prio, i))
        expected = {}
        for shape in shapes:
            ordered = sorted((j for j in jobs if j[2] == shape), key=lambda j: (-j[3], j[4]))
            expected.update({j[0]: place for place, j in enumerate(ordered, 1)})
        http = TestClient(create_app(store, limits=None))
        for who in (None, *tenants):
            token = store.tokens.issue(who)
            view = http.get("/api/v1/fleet", headers={"Authorization": f"Bearer {token}"}).json()
            mine = [j for j in jobs if who is None or j[1] == who]
            assert view["queued"] == len(mine)
            order = sorted(mine, key=lambda j: (-j[3], j[4]))[:50]  # the head, in queue order
            assert [q["id"] for q in view["queue"]] == [j[0] for j in order], who
            assert {q["id"]: q["position"] for q in view["queue"]} == {j[0]: expected[j[0]] for j in order}
    finally:
        store.close()


def test_the_control_plane_shows_what_its_device_sampler_read(plane: ControlPlane) -> None:
    """ControlPlane wires GET /api/v1/fleet to its sampler (``cp.devices``), read through the
    sampler's reader seam: host 1 of the v4-16 answers, every other host has no endpoint."""
    target = HostTarget("tpu-v4-16-1", 1, "v4-16", "v4", 4, True, Endpoint("device_plugin", "127.0.0.1:9"))
    read = [ChipReading(chip=c, duty_cycle_percent=25.0 * c) for c in range(4)]
    plane.devices.stop()
    plane.devices = DeviceSampler(lambda: [target], reader=lambda endpoint, timeout_s: read)
    assert plane.devices.sample_once() == 1
    plane.start()
    _wait(lambda: len(plane.store.slices.all()) == 4, "the loop lists the slices")
    view = TestClient(plane.app).get(
        "/api/v1/fleet", headers={"Authorization": f"Bearer {plane.admin_token}"}
    )
    hosts = {
        (s["name"], h["worker_id"]): h["duty_cycle_percent"]
        for s in view.json()["slices"]
        for h in s["hosts"]
    }
    assert hosts.pop(("tpu-v4-16-1", 1)) == [0.0, 25.0, 50.0, 75.0]
    assert set(hosts.values()) == {None}
