"""The live fleet page in a real headless Chromium, and ``tpufleet top``, against a real server.

``tpufleet serve --sandbox`` runs as a process (no Ray); the page is driven by Playwright through
Debian's ``chromium`` (``executable_path``: no browser is ever downloaded). The tests skip with the
reason when chromium or Playwright is missing, unless ``TPUFLEET_REQUIRE_CHROMIUM`` is set (as
``make test`` does; ``scripts/ensure-test-services.sh`` installs it). Proven here: the page asks for
a token and keeps it out of URLs, shows the slices as hosts and chips and a running job, updates
when the job ends without a reload, shows why a job waits, a job's hosts, attempts and logs, renders
a hostile job name as text, isolates names and reasons from the text around them (bidi), draws
each host's log header as an element a job's own lines cannot imitate, and a tenant's token sees
only its own jobs; ``top --once`` prints a frame with the same facts.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tpufleet.api.server import ControlPlane
from tpufleet.control.cluster.memory import MemoryCluster, Script
from tpufleet.control.loop.service import ServiceConfig
from tpufleet.control.store.fleetview import duty_cycles
from tpufleet.emulator import procs
from tpufleet.observe.tpumetrics import ChipReading

pytestmark = pytest.mark.e2e

HOSTILE = '<img src=x onerror="window.__pwned=1">'
NO_CLOUD = {"NO_GCE_CHECK": "true", "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9"}
HINT = "install Debian's chromium (scripts/ensure-test-services.sh) and playwright (pip, dev extras)"


def _free_port() -> int:
    return procs.free_port()  # below the ephemeral range: nobody takes it meanwhile


@dataclass
class Server:
    url: str
    admin: str
    tokens: dict[str, str]

    def submit(self, tenant: str, **body: Any) -> str:
        headers = {"Authorization": f"Bearer {self.tokens[tenant]}"}
        resp = httpx.post(f"{self.url}/api/v1/jobs", json=body, headers=headers, timeout=10)
        assert resp.status_code == 201, resp.text
        return str(resp.json()["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.admin}"}
        return dict(httpx.get(f"{self.url}/api/v1/jobs/{job_id}", headers=headers, timeout=10).json())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``tpufleet serve --sandbox v4-16:2,v6e-8:1`` as a process, stopped by its PID; two tenants."""
    tmp = tmp_path_factory.mktemp("fleet-page")
    port = _free_port()
    env = {**os.environ, **NO_CLOUD, "TPUFLEET_CONFIG": str(tmp / "ctx.yaml")}
    cmd = [sys.executable, "-m", "tpufleet", "serve", "--sandbox", "v4-16:2,v6e-8:1", "--job-seconds", "1"]
    cmd += ["--state-dir", str(tmp / "cp"), "--port", str(port)]
    log = open(tmp / "serve.log", "w")  # noqa: SIM115  closed below
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp / "serve.log").read_text()
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (tmp / "serve.log").read_text()
            time.sleep(0.2)
        admin = (tmp / "cp" / "admin-token").read_text().strip()
        tokens = {}
        for name, quota in (("research", {"v4": 16}), ("prod", {"v6e": 8})):
            resp = httpx.post(
                f"{url}/api/v1/tenants",
                json={"name": name, "quota": quota},
                headers={"Authorization": f"Bearer {admin}"},
                timeout=10,
            )
            assert resp.status_code == 201, resp.text
            tokens[name] = resp.json()["token"]
        yield Server(url, admin, tokens)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None  # type: ignore[assignment]
    if chromium is None or sync_playwright is None:
        why = f"chromium {'not on PATH' if chromium is None else 'found'}, playwright " + (
            "missing" if sync_playwright is None else "installed"
        )
        if os.environ.get("TPUFLEET_REQUIRE_CHROMIUM"):
            pytest.fail(
                f"Chromium required (TPUFLEET_REQUIRE_CHROMIUM is set, as in make test): {why}; {HINT}"
            )
        pytest.skip(f"Chromium SKIPPED: {why}; {HINT}")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium)
        try:
            yield b
        finally:
            b.close()


def _sign_in(page: Any, url: str, token: str) -> None:
    page.goto(url + "/")
    page.wait_for_selector("#login-form", state="visible")
    assert page.locator("#fleet").is_hidden()
    page.fill("#token", token)
    page.click("#login-form button[type=submit]")
    page.wait_for_selector(".slice[data-slice]")


def test_the_page_shows_the_fleet_a_running_job_and_updates_when_it_ends(
    server: Server, browser: Any
) -> None:
    context = browser.new_context()
    page = context.new_page()
    urls: list[str] = []
    page.on("request", lambda req: urls.append(req.url))
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))

    _sign_in(page, server.url, server.admin)
    assert page.evaluate("sessionStorage.getItem('tpufleet.token')") == server.admin
    assert page.evaluate("localStorage.length") == 0 and context.cookies() == []
    page.evaluate("window.__same_document = true")  # gone if the page reloads or navigates

    # every slice, drawn as its hosts and chips (v4-16: 2 hosts x 4 chips; v6e-8: 1 host x 8)
    assert sorted(page.locator(".slice").evaluate_all("els => els.map(e => e.dataset.slice)")) == [
        "tpu-v4-16-0",
        "tpu-v4-16-1",
        "tpu-v6e-8-0",
    ]
    v4 = page.locator('.slice[data-slice="tpu-v4-16-0"]')
    assert v4.locator(".host").count() == 2 and v4.locator(".chip").count() == 8
    assert page.locator('.slice[data-slice="tpu-v6e-8-0"] .chip').count() == 8
    assert page.locator("#viewer").inner_text() == "admin: the whole fleet"

    # a job that cannot fit: the queue says why it waits
    waiting = server.submit("research", command=["python", "big.py"], accelerator_type="v4-16", num_slices=3)
    row = page.locator(f'#queue tr[data-job="{waiting}"]')
    row.wait_for(timeout=15_000)
    # "waiting for the next cycle" until the loop has stored why (a loaded CI run saw the row first)
    why = page.locator(f'#queue tr[data-job="{waiting}"]', has_text="NO_SUCH_SLICES_IN_FLEET")
    why.wait_for(timeout=15_000)

    # a running job with a hostile name, on one v4-16
    env = {"TPUFLEET_SANDBOX_SECONDS": "10"}
    job = server.submit(
        "research", command=["python", "train.py"], accelerator_type="v4-16", name=HOSTILE, env=env
    )
    running = page.locator(f'#active tr[data-job="{job}"]')
    running.wait_for(timeout=15_000)
    held = page.locator(f'.slice[data-holder="{job}"]')
    held.wait_for(timeout=15_000)
    assert held.get_attribute("data-state") == "HELD" and held.locator(".chip.tenant").count() == 8
    assert running.locator(".job-name bdi").text_content() == HOSTILE  # shown as text
    assert page.evaluate("document.querySelectorAll('img').length") == 0
    assert page.evaluate("window.__pwned") is None
    usage = page.locator('#tenants tr[data-tenant="research"]').inner_text()
    assert "8 / 16" in usage

    # the job's hosts, attempts and live logs
    running.locator(".job-name").click()
    page.wait_for_selector("#job:not([hidden])")
    page.locator("#job-title", has_text=HOSTILE).wait_for(timeout=10_000)  # the id at once, then the name
    assert page.locator("#job-title").text_content() == f"{job} · {HOSTILE}"
    page.locator("#job-attempts tr[data-attempt='1']").wait_for(timeout=10_000)
    assert page.locator("#job-hosts .host").count() == 2
    # locators, not wait_for_function: the page's CSP forbids the eval that one polls with
    page.locator("#job-logs", has_text="running 10 s").wait_for(timeout=10_000)

    # the job ends: the page moves it to Finished and frees its slice, without a reload
    page.locator(f'#recent tr[data-job="{job}"][data-state="SUCCEEDED"]').wait_for(timeout=30_000)
    running.wait_for(state="detached", timeout=10_000)
    held.wait_for(state="detached", timeout=10_000)  # its slice is free again
    page.locator("#job-logs-note", has_text="complete").wait_for(timeout=10_000)
    assert "sandbox: exit 0" in page.locator("#job-logs").text_content()
    assert page.evaluate("window.__same_document") is True
    assert server.job(job)["state"] == "SUCCEEDED"

    assert not errors, errors
    assert urls and not [u for u in urls if server.admin in u], "the token must never be in a URL"
    page.click("#signout")
    assert page.evaluate("sessionStorage.getItem('tpufleet.token')") is None
    assert page.locator("#login-form").is_visible()
    context.close()


def test_a_tenant_token_sees_the_slices_but_not_another_tenants_job(server: Server, browser: Any) -> None:
    env = {"TPUFLEET_SANDBOX_SECONDS": "30"}
    theirs = server.submit(
        "research", command=["python", "x.py"], accelerator_type="v4-16", name="secret-run", env=env
    )
    deadline = time.monotonic() + 15
    while server.job(theirs)["state"] != "RUNNING":
        assert time.monotonic() < deadline, server.job(theirs)
        time.sleep(0.2)
    held_slice = server.job(theirs)["slices"][0]
    context = browser.new_context()
    page = context.new_page()
    _sign_in(page, server.url, server.admin)  # first the admin, then sign out and in again in the same page
    page.locator('#tenants tr[data-tenant="research"]').wait_for(timeout=10_000)
    page.click("#signout")
    page.fill("#token", server.tokens["prod"])
    page.click("#login-form button[type=submit]")
    page.locator("#viewer", has_text="tenant prod").wait_for(timeout=10_000)
    page.wait_for_timeout(1500)  # a poll or two: nothing the admin saw may come back
    assert page.locator("#viewer").inner_text() == "tenant prod"
    assert page.locator(".slice").count() == 3
    other = page.locator(f'.slice[data-slice="{held_slice}"]')
    assert other.get_attribute("data-holder") == "" and other.locator(".chip.other").count() == 8
    body = page.locator("body").inner_text()
    assert "secret-run" not in body and theirs not in body and "research" not in body
    assert [
        r for r in page.locator("#tenants tbody tr").evaluate_all("rs => rs.map(r => r.dataset.tenant)")
    ] == ["prod"]
    context.close()
    httpx.post(
        f"{server.url}/api/v1/jobs/{theirs}/cancel",
        headers={"Authorization": f"Bearer {server.admin}"},
        timeout=10,
    )


def test_a_failing_job_shows_each_attempt_and_why_it_ended(server: Server, browser: Any) -> None:
    env = {"TPUFLEET_SANDBOX_SECONDS": "1", "TPUFLEET_SANDBOX_EXIT": "3"}
    job = server.submit(
        "research",
        command=["python", "bad.py"],
        accelerator_type="v4-16",
        name="exits-3",
        env=env,
        max_retries=1,
    )
    page = browser.new_page()
    _sign_in(page, server.url, server.admin)
    finished = page.locator(f'#recent tr[data-job="{job}"][data-state="FAILED"]')
    finished.wait_for(timeout=30_000)
    finished.locator(".job-name").click()
    attempts = page.locator("#job-attempts tbody tr[data-attempt]")
    page.locator("#job-attempts tr[data-attempt='2']").wait_for(timeout=10_000)
    assert attempts.count() == 2
    assert [attempts.nth(i).locator(".badge").text_content() for i in range(2)] == ["FAILED", "FAILED"]
    page.locator("#job-logs", has_text="sandbox: exit 3").wait_for(timeout=10_000)
    assert "attempt 2" in page.locator("#job-logs-note").text_content()
    assert server.job(job)["state"] == "FAILED"
    page.close()


def test_a_bad_token_is_refused_on_the_page(server: Server, browser: Any) -> None:
    page = browser.new_page()
    page.goto(server.url + "/")
    page.fill("#token", "not-a-token")
    page.click("#login-form button[type=submit]")
    page.locator("#login-error", has_text="not accepted").wait_for(timeout=10_000)
    assert page.locator("#fleet").is_hidden()
    assert page.evaluate("sessionStorage.getItem('tpufleet.token')") is None
    page.close()


# -- tpufleet top ---------------------------------------------------------------------------------
def _top(server: Server, token: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **NO_CLOUD, "TPUFLEET_TOKEN": token, "TPUFLEET_SERVER": server.url}
    cmd = [sys.executable, "-m", "tpufleet", "top", "--once"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


def test_top_once_prints_one_frame_of_the_fleet(server: Server) -> None:
    env = {"TPUFLEET_SANDBOX_SECONDS": "30"}
    job = server.submit(
        "research", command=["python", "t.py"], accelerator_type="v4-16", name="top-run", env=env
    )
    deadline = time.monotonic() + 15
    while server.job(job)["state"] != "RUNNING":
        assert time.monotonic() < deadline, server.job(job)
        time.sleep(0.2)
    held = server.job(job)["slices"][0]
    server.submit("prod", command=["python", "big.py"], accelerator_type="v6e-8", num_slices=2)
    # earlier tests' research jobs may still be stopping: wait until only this one holds chips
    while _held(server, "research") != {"v4": 8}:
        assert time.monotonic() < deadline + 30, _held(server, "research")
        time.sleep(0.2)
    try:
        out = _top(server, server.admin)
        assert out.returncode == 0, out.stderr
        frame = out.stdout
        assert "admin: the whole fleet" in frame
        rows = {line.split()[0]: line for line in frame.splitlines() if line.strip().startswith("tpu-")}
        assert sorted(rows) == ["tpu-v4-16-0", "tpu-v4-16-1", "tpu-v6e-8-0"]
        assert "HELD" in rows[held] and f"research {job}" in rows[held]
        assert re.search(r"■{4} ■{4}", rows[held])  # two hosts of four chips
        assert "■" * 8 in rows["tpu-v6e-8-0"] and "FREE" in rows["tpu-v6e-8-0"]
        assert re.search(rf"{job}\s+top-run\s+research\s+RUNNING\s+{held}", frame)
        assert re.search(r"research\s+v4 8/16", frame)
        assert re.search(r"2 x v6e-8\s+0\s+NO_SUCH_SLICES_IN_FLEET", frame)  # the queue says why it waits
        mine = _top(server, server.tokens["prod"])
        assert mine.returncode == 0, mine.stderr
        assert "tenant prod" in mine.stdout and "top-run" not in mine.stdout and job not in mine.stdout
        assert re.search(rf"{held}\s.*another tenant", mine.stdout)
    finally:
        httpx.post(
            f"{server.url}/api/v1/jobs/{job}/cancel",
            headers={"Authorization": f"Bearer {server.admin}"},
            timeout=10,
        )


def _held(server: Server, tenant: str) -> dict[str, int]:
    headers = {"Authorization": f"Bearer {server.admin}"}
    view = httpx.get(f"{server.url}/api/v1/fleet", headers=headers, timeout=10).json()
    return dict(next(t["held"] for t in view["tenants"] if t["name"] == tenant))


def test_top_with_a_bad_token_says_so_in_one_line(server: Server) -> None:
    out = _top(server, "not-a-token")
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") <= 1 and "error:" in out.stderr


def test_chips_are_shaded_by_their_measured_duty_cycle(browser: Any, tmp_path: Path) -> None:
    """A control plane in this process over a sandbox v4-16, its duty cycles given as a device
    sampler's readings of host 0 (host 1 reports nothing): busier chips are drawn darker, and the
    silent host's chips say "—" instead of a number."""
    cluster = MemoryCluster.sandbox("v4-16:1", job_seconds=300)
    cp = ControlPlane(cluster, state_dir=tmp_path / "cp", config=ServiceConfig(interval_s=0.05))
    percents = (5.0, 35.0, 65.0, 95.0)
    readings = {
        ("tpu-v4-16-0", 0): [ChipReading(chip=c, duty_cycle_percent=p) for c, p in enumerate(percents)]
    }
    cp.app.state.duty_cycles = lambda: duty_cycles(readings)
    try:
        url = cp.start_http()
        admin = {"Authorization": f"Bearer {cp.admin_token}"}
        token = httpx.post(
            f"{url}/api/v1/tenants", json={"name": "research", "quota": {"v4": 8}}, headers=admin
        )
        job = httpx.post(
            f"{url}/api/v1/jobs",
            json={"command": ["python", "t.py"], "accelerator_type": "v4-16"},
            headers={"Authorization": f"Bearer {token.json()['token']}"},
        ).json()["id"]
        page = browser.new_page()
        _sign_in(page, url, cp.admin_token)
        held = page.locator(f'.slice[data-holder="{job}"]')
        held.wait_for(timeout=15_000)
        busy, silent = (
            held.locator(".host").nth(0).locator(".chip"),
            held.locator(".host").nth(1).locator(".chip"),
        )
        assert busy.count() == 4 and silent.count() == 4
        assert [busy.nth(i).get_attribute("title").split("\n")[-1] for i in range(4)] == [
            f"duty cycle {p:.0f} %" for p in percents
        ]
        assert all(silent.nth(i).get_attribute("title").endswith("duty cycle —") for i in range(4))
        assert held.locator(".chip.measured").count() == 4  # only host 0's
        lightness = [
            _lightness(busy.nth(i).evaluate("e => getComputedStyle(e).backgroundColor")) for i in range(4)
        ]
        assert lightness == sorted(lightness, reverse=True) and lightness[0] - lightness[3] > 0.3, lightness
        page.close()
    finally:
        cp.close()


def _lightness(css: str) -> float:
    """HSL lightness (0..1) of an ``rgb(r, g, b)`` computed colour."""
    r, g, b = (int(x) / 255 for x in re.findall(r"\d+", css)[:3])
    return (max(r, g, b) + min(r, g, b)) / 2


FAKE_HEADER = "== tpu-v4-16-0 worker 1 =="  # what today's log view printed between two hosts' output


def test_a_jobs_own_lines_cannot_draw_a_host_header_and_names_are_isolated(
    browser: Any, tmp_path: Path
) -> None:
    """Today the log view was one text with "== <slice> worker <n> ==" lines between hosts: a job
    printing that line drew a header that looked real. Names and reasons were not bidi-isolated."""
    output = "step 1 on {TPU_WORKER_ID}\n" + FAKE_HEADER + "\nforged line\n"
    cluster = MemoryCluster.of("v4-16:1", script=lambda spec: Script(exit_after=None, output=output))
    cp = ControlPlane(cluster, state_dir=tmp_path / "cp", config=ServiceConfig(interval_s=0.05))
    try:
        url = cp.start_http()
        admin = {"Authorization": f"Bearer {cp.admin_token}"}
        token = httpx.post(
            f"{url}/api/v1/tenants", json={"name": "research", "quota": {"v4": 8}}, headers=admin
        ).json()["token"]
        body = {
            "command": ["python", "t.py"],
            "accelerator_type": "v4-16",
            "name": "\u05e9\u05dc\u05d5\u05dd 2",
        }
        job = httpx.post(f"{url}/api/v1/jobs", json=body, headers={"Authorization": f"Bearer {token}"})
        job_id = job.json()["id"]
        page = browser.new_page()
        _sign_in(page, url, cp.admin_token)
        row = page.locator(f'#active tr[data-job="{job_id}"]')
        row.wait_for(timeout=15_000)
        isolated = "els => els.map(e => e.tagName + ' ' + getComputedStyle(e).unicodeBidi)"
        assert row.locator("bdi").evaluate_all(isolated) == ["BDI isolate", "BDI isolate"]  # name, tenant
        row.locator(".job-name").click()
        page.locator("#job-logs .log-text", has_text="forged line").first.wait_for(timeout=15_000)
        page.locator("#job-logs .log-host").nth(1).wait_for(timeout=15_000)
        # The title is drawn again at each refresh: an element read while it is replaced has no
        # computed style (''), so wait for a drawn title whose one name is isolated (fails on timeout).
        page.wait_for_function(
            """() => {
                const els = [...document.querySelectorAll('#job-title bdi')];
                return els.length === 1 && els[0].isConnected
                    && getComputedStyle(els[0]).unicodeBidi === 'isolate';
            }""",
            timeout=15_000,
        )
        headers = page.locator("#job-logs .log-host")
        assert headers.all_text_contents() == ["tpu-v4-16-0 worker 0", "tpu-v4-16-0 worker 1"]
        texts = page.locator("#job-logs .log-text")
        assert texts.count() == 2
        assert all(FAKE_HEADER in t for t in texts.all_text_contents())  # the job's line, as its text
        assert page.locator("#job-logs > *").count() == 4  # nothing the job wrote became an element
        style = "e => [getComputedStyle(e).fontWeight, getComputedStyle(e).backgroundColor]"
        assert headers.nth(1).evaluate(style) != texts.nth(0).evaluate(style)  # drawn unlike any output
        page.close()
    finally:
        cp.close()
