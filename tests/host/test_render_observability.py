"""``render --target observability``: the alert rules pass ``promtool check rules`` and fire on the
input series of ``data/promtool/fleet_rules_test.yml`` (``promtool test rules``); the dashboard is
well-formed Grafana JSON whose expressions name only metrics the control plane's collectors export.

promtool comes with Debian's ``prometheus`` package (``scripts/ensure-test-services.sh``); without
it these tests skip with the reason, except under ``make test`` (``TPUFLEET_REQUIRE_PROMETHEUS=1``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from spec_builders import EXAMPLE

from tpufleet.observe.device import DeviceCollector, DeviceSampler
from tpufleet.render.dashboard import render_dashboard
from tpufleet.render.observability import FLEET_UTILIZATION, plain_rules, render_fleet_rules
from tpufleet.spec import read_spec

PROMTOOL_TESTS = Path(__file__).parent / "data" / "promtool" / "fleet_rules_test.yml"
HINT = "run scripts/ensure-test-services.sh as root (apt-get install prometheus)"


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("TPUFLEET_REQUIRE_PROMETHEUS"):
            pytest.fail(f"promtool required (TPUFLEET_REQUIRE_PROMETHEUS is set, as in make test); {HINT}")
        pytest.skip(f"promtool not installed; {HINT}")
    return path


def _render_cli(out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tpufleet",
            "render",
            str(EXAMPLE),
            "--target",
            "observability",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_writes_rule_rules_file_and_dashboard(tmp_path: Path, promtool: str) -> None:
    proc = _render_cli(tmp_path)
    assert proc.returncode == 0, proc.stderr
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "prometheusrule-research-fleet-tpufleet.yaml",
        "research-fleet-tpufleet-dashboard.json",
        "research-fleet-tpufleet-rules.yml",
    ]
    rule = yaml.safe_load((tmp_path / names[0]).read_text())
    assert rule["kind"] == "PrometheusRule" and rule["apiVersion"] == "monitoring.coreos.com/v1"
    plain = yaml.safe_load((tmp_path / names[2]).read_text())
    assert plain == {"groups": rule["spec"]["groups"]}
    check = subprocess.run(
        [promtool, "check", "rules", str(tmp_path / names[2])], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 10 rules found" in check.stdout
    json.loads((tmp_path / names[1]).read_text())


def _promtool_test(promtool: str, rules: dict, where: Path) -> subprocess.CompletedProcess[str]:
    (where / "rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    shutil.copy(PROMTOOL_TESTS, where / "tests.yml")
    return subprocess.run([promtool, "test", "rules", "tests.yml"], cwd=where, capture_output=True, text=True)


def test_every_alert_fires_on_its_input_series_and_not_on_its_neighbours(
    tmp_path: Path, promtool: str
) -> None:
    rules = plain_rules(render_fleet_rules(read_spec(EXAMPLE)))
    proc = _promtool_test(promtool, rules, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tested = set(re.findall(r"alertname: (\w+)", PROMTOOL_TESTS.read_text()))
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert alerts == tested  # no alert without a unit test
    assert FLEET_UTILIZATION in PROMTOOL_TESTS.read_text()


def test_the_unit_tests_catch_a_wrong_rule(tmp_path: Path, promtool: str) -> None:
    rules = plain_rules(render_fleet_rules(read_spec(EXAMPLE)))
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "TpufleetHostDown":
                rule["expr"] = "tpufleet_host_up == 1"  # inverted
    proc = _promtool_test(promtool, rules, tmp_path)
    assert proc.returncode != 0
    assert "TpufleetHostDown" in proc.stdout + proc.stderr


def test_bad_flags_for_the_observability_target_are_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tpufleet", "render", str(EXAMPLE), "--target", "observability", "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "--check" in proc.stderr and "Traceback" not in proc.stderr


# -- the dashboard -----------------------------------------------------------------------------------

_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


def _base(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def test_dashboard_is_well_formed() -> None:
    dash = render_dashboard(read_spec(EXAMPLE))
    assert dash["uid"] == "tpufleet-research-fleet" and dash["schemaVersion"] >= 36
    panels = dash["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert variables == {"datasource", "tenant"}
    cells = set()
    for p in panels:
        pos = p["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24 and pos["h"] > 0
        for dx in range(pos["w"]):
            for dy in range(pos["h"]):
                cell = (pos["x"] + dx, pos["y"] + dy)
                assert cell not in cells, f"panel {p['title']!r} overlaps another"
                cells.add(cell)
        if p["type"] == "row":
            continue
        assert p["targets"], p["title"]
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])
        for t in p["targets"]:
            assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]
            for var in re.findall(r"\$(\w+)", t["expr"]):
                assert var in variables | {"__rate_interval"}, var


def test_dashboard_device_panels_name_metrics_the_device_collector_exports() -> None:
    dash = render_dashboard(read_spec(EXAMPLE))
    used = {
        _base(n)
        for p in dash["panels"]
        for t in p.get("targets", [])
        for n in re.findall(r"tpufleet_\w+", t["expr"])
    }
    device = {_base(f.name) for f in DeviceCollector(DeviceSampler(list)).describe()}
    assert {n for n in used if n.startswith(("tpufleet_tpu_", "tpufleet_host_"))} <= device
    assert "tpufleet_tpu_duty_cycle_percent" in used


def exported_names(tmp_path: Path) -> set[str]:
    """Every family a control plane's registry serves, collected from its real collectors: the
    store's fleet metrics, the cycle histogram and the TPU device collector (as ``ControlPlane``)."""
    from tpufleet.control.store.facade import Store
    from tpufleet.observe import device
    from tpufleet.observe.metrics import cycle_histogram
    from tpufleet.observe.registry import metrics_registry

    store = Store.open(f"sqlite:///{tmp_path / 'metrics.db'}")
    try:
        registry = metrics_registry(store)
        cycle_histogram(registry)
        device.register(registry, list, dict)
        return {_base(family.name) for family in registry.collect()}
    finally:
        store.close()


def test_dashboard_and_alerts_name_only_metrics_the_control_plane_exports(tmp_path: Path) -> None:
    spec = read_spec(EXAMPLE)
    exported = exported_names(tmp_path)
    dash = render_dashboard(spec)
    in_dashboard = {
        n
        for p in dash["panels"]
        for t in p.get("targets", [])
        for n in re.findall(r"tpufleet_\w+", t["expr"])
    }
    rules = plain_rules(render_fleet_rules(spec))
    in_rules = {
        n for g in rules["groups"] for r in g["rules"] for n in re.findall(r"tpufleet_\w+", r["expr"])
    }
    assert {_base(n) for n in in_dashboard | in_rules} <= exported
    assert {"tpufleet_jobs", "tpufleet_job_goodput_ratio", "tpufleet_tpu_hbm_used_bytes"} <= exported
    assert len(in_dashboard) >= 15  # the dashboard covers the fleet, the TPUs and the tenants
