"""`tpufleet demo --chaos` end to end: the main job, as a user runs it, on its own emulated fleet.

It starts eight emulated hosts, the control plane and three training jobs, kills a host of the
multi-slice job half-way, and must finish with every job SUCCEEDED, the multi-slice job on its
second attempt (resumed from a checkpoint) and the loss going down.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(600)  # as long as the demo itself may take (its subprocess's limit below)
def test_demo_with_chaos_recovers_and_trains(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "tpufleet", "demo", "--chaos", "--steps", "12", "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "chaos: killed host 1 of" in out.stdout
    rows = {r["name"]: r for r in json.loads((tmp_path / "summary.json").read_text())}
    assert set(rows) == {"mlp-v6e", "mlp-multislice", "mlp-v4-waits", "jaxtrainer-ray"}
    assert all(r["state"] == "SUCCEEDED" for r in rows.values()), rows
    multi = rows["mlp-multislice"]
    assert multi["attempt"] == 2 and len(multi["slices"]) == 2
    ray = rows.pop("jaxtrainer-ray")  # the Ray job: JaxTrainer over Ray Data, on a v4-16 it was admitted
    assert ray["losses"] and ray["losses"][-1] < ray["losses"][0], ray
    assert ray["slices"][0].startswith("tpu-v4-16-"), ray
    for r in rows.values():
        assert r["losses"] and r["losses"][-1] < r["losses"][0], r
        # train_mlp reports its steps: goodput is known, and below 1 (start-up, JAX compiling)
        assert 0 < r["goodput"]["ratio"] < 1 and r["dollars"] > 0, r
    assert "utilization:" in out.stdout and "cost at list prices: $" in out.stdout
    # the waiting job ran on a v4-16 only after the multi-slice job had let go of one
    assert rows["mlp-v4-waits"]["slices"][0].startswith("tpu-v4-16-")
    # `down` ran to the end: it removes the fleet's state only after every PID it started is gone
    assert not (tmp_path / "fleet" / "fleet.json").exists()
