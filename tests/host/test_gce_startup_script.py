"""The GCE provider's startup script on a TPU VM (``--provider gce``, docs/provisioning.md): run by
bash against a local metadata server, with ``python3`` and ``ray`` replaced by shims that record
what they were asked, it exports the host contract from the metadata and joins Ray, and marks the
host a GCE VM (``TPUFLEET_GCE_VM=1``: its runners watch the metadata server's notices)."""

from __future__ import annotations

import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

from guards import HANG_GUARD_S

from tpufleet.provision.gce import startup_script


class _Metadata(BaseHTTPRequestHandler):
    """The TPU VM metadata server's instance attributes of worker 1 of a v4-16 slice."""

    ATTRS: ClassVar[dict[str, str]] = {
        "instance-id": "train-0",
        "agent-worker-number": "1",
        "accelerator-type": "v4-16",
        "tpu-env": "ACCELERATOR_TYPE: 'v4-16'\nTOPOLOGY: '2x2x2'\nWORKER_ID: '1'\n",
        "worker-network-endpoints": "unknown:unknown:10.0.0.2,unknown:unknown:10.0.0.3",
    }

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        key = self.path.rsplit("/", 1)[-1]
        ok = self.headers.get("Metadata-Flavor") == "Google" and key in self.ATTRS
        raw = self.ATTRS[key].encode() if ok else b"forbidden or unknown"
        self.send_response(200 if ok else 403)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


def test_startup_script_exports_the_host_contract_from_metadata_and_joins_ray(tmp_path: Any) -> None:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Metadata)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("python3", "ray"):  # record what would be installed and started
        shim = bin_dir / tool
        record = f'echo "$*" >> {tmp_path}/{tool}.args\nenv | grep ^TPU_ | sort >> {tmp_path}/{tool}.env\n'
        shim.write_text(f"#!/bin/bash\n{record}")
        shim.chmod(0o755)
    profile = tmp_path / "tpufleet.sh"
    script = startup_script(
        "10.0.0.1:6379",
        "2.60.0",
        metadata_url=f"http://127.0.0.1:{srv.server_address[1]}/computeMetadata/v1/instance/attributes",
        profile=str(profile),
    )
    try:
        done = subprocess.run(
            ["bash", "-c", script],
            env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
        )
    finally:
        srv.shutdown()
        srv.server_close()
    assert done.returncode == 0, done.stderr
    contract = {
        "TPU_NAME": "train-0",
        "TPU_WORKER_ID": "1",
        "TPU_ACCELERATOR_TYPE": "v4-16",
        "TPU_TOPOLOGY": "2x2x2",
        "TPU_WORKER_HOSTNAMES": "10.0.0.2,10.0.0.3",
    }
    assert (tmp_path / "ray.env").read_text().splitlines() == [
        f"{k}={v}" for k, v in sorted(contract.items())
    ]
    assert (tmp_path / "ray.args").read_text() == "start --address=10.0.0.1:6379\n"
    assert (tmp_path / "python3.args").read_text() == "-m pip install -q ray[default]==2.60.0 jax[tpu]\n"
    exported = subprocess.run(
        ["bash", "-c", f". {profile} && env | grep ^TPU_ | sort"], capture_output=True, text=True, env={}
    ).stdout
    assert exported.splitlines() == [f"{k}={v}" for k, v in sorted(contract.items())]
    # ... and says it is a GCE VM, so the host's runners watch its preemption and maintenance notices
    marker = subprocess.run(
        ["bash", "-c", f". {profile} && echo $TPUFLEET_GCE_VM"], capture_output=True, text=True, env={}
    ).stdout
    assert marker == "1\n"
