"""Take docs/img/fleet-page.png: a real screenshot of the fleet page over a running sandbox fleet.

Starts ``tpufleet serve --sandbox`` (no Ray) in a temporary state dir, makes two tenants, submits a
few jobs (running, waiting for quota, too big for the fleet, finished), signs the page in with the
admin token in Debian's headless chromium (Playwright, ``executable_path``; no browser download),
opens one running job and saves the page. Not a test: run it by hand when the page changes::

    .venv/bin/python scripts/fleet_page_screenshot.py [-o docs/img/fleet-page.png]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
NO_CLOUD = {"NO_GCE_CHECK": "true", "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"serve exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("serve did not answer /healthz within 60 s")
        time.sleep(0.2)


def _populate(url: str, admin: str) -> None:
    def post(path: str, body: dict[str, object], token: str) -> dict[str, object]:
        resp = httpx.post(url + path, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        resp.raise_for_status()
        return dict(resp.json())

    research = str(
        post("/api/v1/tenants", {"name": "research", "quota": {"v6e": 16, "v4": 8}}, admin)["token"]
    )
    prod = str(post("/api/v1/tenants", {"name": "prod", "quota": {"v4": 16}}, admin)["token"])
    quick = {"TPUFLEET_SANDBOX_SECONDS": "1"}
    post(
        "/api/v1/jobs",
        {"command": ["python", "eval.py"], "accelerator_type": "v4-16", "name": "eval-ckpt-41", "env": quick},
        prod,
    )
    time.sleep(3)  # that one finishes; the rest stay
    long = {"TPUFLEET_SANDBOX_SECONDS": "3600"}
    jobs = [
        (research, {"name": "mlp-v6e", "accelerator_type": "v6e-8", "num_slices": 2}),
        (research, {"name": "llama-sft", "accelerator_type": "v4-16"}),
        (prod, {"name": "ranker-train", "accelerator_type": "v4-16"}),
        (research, {"name": "sweep-lr-3e-4", "accelerator_type": "v4-16"}),
        (prod, {"name": "ranker-big", "accelerator_type": "v4-32"}),
        (research, {"name": "mlp-v6e-ablation", "accelerator_type": "v6e-8"}),  # waits for a free v6e-8
        (
            prod,
            {"name": "ranker-4x", "accelerator_type": "v4-16", "num_slices": 4},
        ),  # more than the fleet has
        (prod, {"name": "ranker-urgent", "accelerator_type": "v4-32", "priority": 10}),
    ]
    for token, body in jobs:
        post("/api/v1/jobs", {"command": ["python", "train.py"], "env": long, **body}, token)
        time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=ROOT / "docs" / "img" / "fleet-page.png")
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("chromium not found: run scripts/ensure-test-services.sh (Debian's chromium)")
    with tempfile.TemporaryDirectory(prefix="tpufleet-shot-") as tmp:
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        env = {**os.environ, **NO_CLOUD, "TPUFLEET_CONFIG": str(Path(tmp) / "ctx.yaml")}
        cmd = [sys.executable, "-m", "tpufleet", "serve", "--sandbox", "v4-16:3,v4-32:1,v6e-8:2"]
        cmd += ["--state-dir", str(Path(tmp) / "cp"), "--port", str(port)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_healthy(url, proc)
            admin = (Path(tmp) / "cp" / "admin-token").read_text().strip()
            _populate(url, admin)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium)
                page = browser.new_page(viewport={"width": 1400, "height": 900}, device_scale_factor=1)
                page.goto(url + "/")
                page.fill("#token", admin)
                page.click("#login-form button[type=submit]")
                page.wait_for_selector("#active tr[data-job]")
                page.locator("#active .job-name", has_text="llama-sft").click()
                page.locator("#job-logs", has_text="sandbox:").wait_for()
                page.wait_for_timeout(1500)
                args.output.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(args.output), full_page=True)
                browser.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
