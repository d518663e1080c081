"""Take docs/img/fleet-page.png: a real screenshot of the fleet page over a running fleet.

By default it starts ``tpufleet serve --sandbox`` (no Ray) in a temporary state dir, makes two
tenants, submits a few jobs (running, waiting for quota, too big for the fleet, finished), signs the
page in with the admin token in Debian's headless chromium (Playwright, ``executable_path``; no
browser download), opens one running job and saves the page. With ``--emulator`` it starts an
emulated fleet instead (Ray: run it under ``flock /tmp/tpufleet-ray.lock``), whose hosts serve
device metrics measured from their own work, and runs jobs that keep some hosts busy and others
idle, so the chips are shaded by real duty cycles. Not a test: run it by hand when the page changes::

    .venv/bin/python scripts/fleet_page_screenshot.py [-o docs/img/fleet-page.png] [--emulator]
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
from typing import Any

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
    jobs: list[tuple[str, dict[str, Any]]] = [
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


BURN = (  # busy on the hosts whose worker id is listed, idle on the others, for 10 minutes
    "import os, time\n"
    "end = time.time() + 600\n"
    "busy = os.environ['TPU_WORKER_ID'] in os.environ.get('BUSY_WORKERS', '0').split(',')\n"
    "while time.time() < end:\n"
    "    if not busy:\n"
    "        time.sleep(1)\n"
)


def _populate_emulated(url: str, admin: str) -> None:
    def post(path: str, body: dict[str, object], token: str) -> dict[str, object]:
        resp = httpx.post(url + path, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        resp.raise_for_status()
        return dict(resp.json())

    research = str(
        post("/api/v1/tenants", {"name": "research", "quota": {"v6e": 4, "v4": 8}}, admin)["token"]
    )
    prod = str(post("/api/v1/tenants", {"name": "prod", "quota": {"v4": 8}}, admin)["token"])
    jobs: list[tuple[str, dict[str, Any]]] = [
        (research, {"name": "mlp-v6e", "accelerator_type": "v6e-4", "env": {"BUSY_WORKERS": "0"}}),
        (prod, {"name": "ranker-train", "accelerator_type": "v4-16", "env": {"BUSY_WORKERS": "0"}}),
        (research, {"name": "sweep-lr-3e-4", "accelerator_type": "v4-16"}),  # waits: quota, nothing idle
        (prod, {"name": "ranker-4x", "accelerator_type": "v4-16", "num_slices": 4}),  # more than the fleet
    ]
    for token, body in jobs:
        post("/api/v1/jobs", {"command": ["python", "-c", BURN], **body}, token)


def _serve(tmp: Path, port: int, emulator: bool) -> subprocess.Popen[bytes]:
    env = {**os.environ, **NO_CLOUD, "TPUFLEET_CONFIG": str(tmp / "ctx.yaml")}
    tpufleet = [sys.executable, "-m", "tpufleet"]
    if emulator:
        up = [*tpufleet, "emulate", "up", "--slices", "v4-16,v6e-4", "--state-dir", str(tmp / "fleet")]
        subprocess.run(up, env=env, check=True, stdout=subprocess.DEVNULL)
        cmd = [*tpufleet, "serve", "--emulator-dir", str(tmp / "fleet")]
    else:
        cmd = [*tpufleet, "serve", "--sandbox", "v4-16:3,v4-32:1,v6e-8:2"]
    cmd += ["--state-dir", str(tmp / "cp"), "--port", str(port)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=ROOT / "docs" / "img" / "fleet-page.png")
    parser.add_argument(
        "--emulator", action="store_true", help="an emulated Ray fleet with measured duty cycles"
    )
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("chromium not found: run scripts/ensure-test-services.sh (Debian's chromium)")
    with tempfile.TemporaryDirectory(prefix="tpufleet-shot-") as name:
        tmp, port = Path(name), _free_port()
        url = f"http://127.0.0.1:{port}"
        proc = _serve(tmp, port, args.emulator)
        try:
            _wait_healthy(url, proc)
            admin = (tmp / "cp" / "admin-token").read_text().strip()
            (_populate_emulated if args.emulator else _populate)(url, admin)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium)
                page = browser.new_page(viewport={"width": 1400, "height": 900}, device_scale_factor=1)
                page.goto(url + "/")
                page.fill("#token", admin)
                page.click("#login-form button[type=submit]")
                page.wait_for_selector("#active tr[data-job]")
                if args.emulator:  # the device sampler reads every host every 10 s
                    page.locator(".chip.measured").first.wait_for(timeout=60_000)
                    page.wait_for_timeout(12_000)
                shown = "ranker-train" if args.emulator else "llama-sft"
                page.locator("#active .job-name", has_text=shown).click()
                page.locator("#job-logs-note", has_text="attempt").wait_for()
                page.wait_for_timeout(1500)
                args.output.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(args.output), full_page=True)
                browser.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            if args.emulator:
                down = [
                    sys.executable,
                    "-m",
                    "tpufleet",
                    "emulate",
                    "down",
                    "--state-dir",
                    str(tmp / "fleet"),
                ]
                subprocess.run(down, env={**os.environ, **NO_CLOUD}, check=False, stdout=subprocess.DEVNULL)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
