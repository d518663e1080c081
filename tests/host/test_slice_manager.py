"""The slice manager against a real ``tpufleet serve --sandbox none --fleet SPEC --provider memory``
process: Python (``from tpufleet import SliceManager``) and the CLI create, measure and delete slice
groups; the fleet spec's pool autoscales from zero for a queued job; bad input is one line, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import planes
import pytest
from click.testing import CliRunner
from guards import HANG_GUARD_S

from tpufleet import SliceManager
from tpufleet.cli import command
from tpufleet.client.http import Client
from tpufleet.control.store.slicegroups import slice_config
from tpufleet.errors import NotFoundError, SpecError

SPEC = """\
name: demo
autoscaling:
  enabled: true
  idle_timeout_s: 3
pools:
  - name: v4
    type: v4-8
    slices: 0
    min_slices: 0
    max_slices: 2
tenants:
  - name: team-a
    quota: {v4: 16}
"""


def _until(what: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = what()
        if got:
            return got
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    tmp = tmp_path_factory.mktemp("slice-manager")
    (tmp / "fleet.yaml").write_text(SPEC)
    serve = planes.ServeProcess(
        tmp, "--sandbox", "none", "--fleet", str(tmp / "fleet.yaml"), "--provider", "memory",
        "--job-seconds", "2", "--state-dir", str(tmp / "state"),
    )  # fmt: skip
    try:
        token = (tmp / "state" / "admin-token").read_text().strip()
        yield serve.url, token, tmp
    finally:
        out = serve.stop()
        assert "Traceback" not in out, out
        assert "a sandbox fleet (none: no slice yet; jobs run 2 s" in out, out


def test_python_create_measure_delete_round_trip(served: tuple[str, str, Path]) -> None:
    url, token, _ = served
    sm = SliceManager(server=url, token=token)
    group = sm.create_slice("py-train", {"tpu_type": "v4-8", "num_slices": 2, "preemptible": True}, wait=True)
    assert (group["state"], group["count"], group["spot"]) == ("ACTIVE", 2, True)
    assert [s["name"] for s in group["slices"]] == ["py-train-0", "py-train-1"]
    assert "py-train" in [g["name"] for g in sm.list_slices()]
    _until(lambda: all(s["state"] == "FREE" for s in sm.get_slice("py-train")["slices"]))
    tenant = Client(url, token).request("GET", "/api/v1/tenants")
    assert [t["name"] for t in tenant] == ["team-a"]  # from the fleet spec
    job = Client(url, token).submit(["python", "t.py"], "v4-8", num_slices=2, tenant="team-a")
    _until(lambda: Client(url, token).job(job["id"])["state"] == "SUCCEEDED", 60)
    used = sm.get_slice_utilization("py-train", window="10m")
    assert used["held_seconds"] > 0 and used["holders"][0]["job"] == job["id"]
    assert used["holders"][0]["tenant"] == "team-a"
    assert 0 < used["utilization"] < 1
    sm.delete_slice("py-train")
    _until(lambda: "py-train" not in [g["name"] for g in sm.list_slices()])
    with pytest.raises(NotFoundError, match="py-train"):
        sm.get_slice("py-train")


def test_unknown_config_keys_name_the_closest_before_anything_is_sent() -> None:
    with pytest.raises(SpecError, match="unknown key 'num_slice'; did you mean num_slices"):
        SliceManager(server="http://127.0.0.1:9", token="x").create_slice(
            "g", {"tpu_type": "v4-8", "num_slice": 2}
        )
    assert slice_config({"generation": "v4", "topology": "2x2x1"}).accelerator_type == "v4-8"
    with pytest.raises(SpecError, match="not both"):
        slice_config({"tpu_type": "v4-8", "generation": "v4"})


def test_cli_create_utilization_delete(served: tuple[str, str, Path]) -> None:
    url, token, tmp = served
    env = {"TPUFLEET_SERVER": url, "TPUFLEET_TOKEN": token, "TPUFLEET_CONFIG": str(tmp / "cli.yaml")}
    run = CliRunner(env=env)
    made = run.invoke(command(), ["slice", "create", "cli-g", "--type", "v4-8", "--wait", "--json"])
    assert made.exit_code == 0, made.output
    assert json.loads(made.output)["state"] == "ACTIVE"
    listed = _until(  # the loop's next cycle puts the new slice in the fleet's table
        lambda: [
            s
            for s in json.loads(run.invoke(command(), ["slices", "--json"]).output)
            if s["name"] == "cli-g-0"
        ]
    )
    assert listed[0]["group"] == "cli-g"
    shown = run.invoke(command(), ["slices"], terminal_width=200)
    assert shown.exit_code == 0 and "slice groups" in shown.output and "cli-g-0" in shown.output
    used = run.invoke(command(), ["slice", "utilization", "cli-g", "--window", "5m", "--json"])
    assert used.exit_code == 0 and json.loads(used.output)["name"] == "cli-g"
    bad = run.invoke(command(), ["slice", "utilization", "cli-g", "--window", "ten"])
    assert isinstance(bad.exception, SpecError) and bad.exception.exit_code == 2
    gone = run.invoke(command(), ["slice", "delete", "cli-g"])
    assert gone.exit_code == 0 and "cli-g" in gone.output
    _until(lambda: "cli-g" not in run.invoke(command(), ["slices"], terminal_width=200).output)


def test_a_pool_with_min_zero_autoscales_for_a_job_and_back(served: tuple[str, str, Path]) -> None:
    url, token, _ = served
    client = Client(url, token)
    job = client.submit(["python", "t.py"], "v4-8", tenant="team-a")["id"]
    waiting = _until(lambda: (j := client.job(job))["reason_code"] == "PROVISIONING" and j)
    assert "memory provider is making" in waiting["reason"]
    _until(lambda: client.job(job)["state"] == "SUCCEEDED")
    sm = SliceManager(server=url, token=token)
    auto = [g for g in sm.list_slices() if g["origin"] == "autoscaler"]
    assert auto and auto[0]["for_job"] == job
    _until(lambda: not [g for g in sm.list_slices() if g["origin"] == "autoscaler"], 60)  # idle 3 s


def test_provider_flags_are_checked_in_one_line(tmp_path: Path) -> None:
    env = os.environ | {"TPUFLEET_CONFIG": str(tmp_path / "c.yaml"), "TPUFLEET_STATE_DIR": str(tmp_path)}
    for flags, says in (
        (["--provider", "memory"], "--provider memory goes with --sandbox"),
        (["--sandbox", "none", "--provider", "cloud"], "'cloud' is not a provider"),
        (["--provider", "gce"], "--provider gce needs --fleet SPEC"),
    ):
        out = subprocess.run(
            [sys.executable, "-m", "tpufleet", "serve", *flags],
            env=env,
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
        )
        assert out.returncode == 2 and says in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_defaults_come_from_what_serve_remembered(
    served: tuple[str, str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _, tmp = served
    monkeypatch.delenv("TPUFLEET_SERVER", raising=False)
    monkeypatch.delenv("TPUFLEET_TOKEN", raising=False)
    monkeypatch.setenv("TPUFLEET_CONFIG", str(tmp / "config.yaml"))  # the context serve wrote
    monkeypatch.setenv("TPUFLEET_STATE_DIR", str(tmp / "nowhere"))
    sm = SliceManager()
    assert sm.client.server == url
    assert isinstance(sm.list_slices(), list)  # the admin token serve remembered
