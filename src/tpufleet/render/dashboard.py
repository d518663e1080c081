"""A Grafana dashboard over the control plane's ``tpufleet_*`` metrics (``--target observability``).

Plain dashboard JSON (Grafana's schema version 39, importable through the UI or a provisioning
folder): a Prometheus data-source variable and a tenant filter, then three rows: the fleet (TPU
utilization as chip-time used over chip-time paid for, slices and hosts, queue and admission
wait), the TPUs (duty cycle, TensorCore utilization and HBM per slice, which hosts' device sources
answer) and the tenants (chips held against quota, dollars per hour, chip-hours, goodput per job).
Every expression names only metrics the control plane exports (a test checks it against the
collectors).
"""

from __future__ import annotations

from typing import Any

from tpufleet.render.common import Obj
from tpufleet.spec import FleetSpec

__all__ = ["render_dashboard"]

_DS = {"type": "prometheus", "uid": "${datasource}"}
_T = 'tenant=~"$tenant"'
_RATE = "$__rate_interval"


def _panel(title: str, kind: str, unit: str, targets: list[tuple[str, str]], description: str = "") -> Obj:
    return {
        "title": title,
        "type": kind,
        "description": description,
        "datasource": _DS,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": _DS, "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def _row(title: str) -> Obj:
    return {"title": title, "type": "row", "collapsed": False, "panels": []}


def _fleet() -> list[Obj]:
    return [
        _row("Fleet"),
        _panel(
            "TPU utilization (chip-time used / paid for)",
            "stat",
            "percentunit",
            [("avg(tpufleet_tpu_duty_cycle_percent) / 100", "fleet")],
            "Average duty cycle over every chip of the inventory; chips that report nothing count as idle.",
        ),
        _panel("Slices by state", "timeseries", "short", [("sum by (state) (tpufleet_slices)", "{{state}}")]),
        _panel(
            "Hosts down",
            "stat",
            "short",
            [("count(tpufleet_host_up == 0) or vector(0)", "down")],
        ),
        _panel(
            "Jobs by state",
            "timeseries",
            "short",
            [(f"sum by (state) (tpufleet_jobs{{{_T}}})", "{{state}}")],
        ),
        _panel(
            "Admission wait (p50, p90)",
            "timeseries",
            "s",
            [
                (
                    f"histogram_quantile({q}, sum by (le) "
                    f"(rate(tpufleet_admission_wait_seconds_bucket{{{_T}}}[{_RATE}])))",
                    f"p{int(q * 100)}",
                )
                for q in (0.5, 0.9)
            ],
        ),
        _panel(
            "Attempts ended per hour, by reason",
            "timeseries",
            "short",
            [(f"sum by (reason) (increase(tpufleet_attempts_ended_total{{{_T}}}[1h]))", "{{reason}}")],
        ),
        _panel(
            "Scheduling cycle (p99)",
            "timeseries",
            "s",
            [
                (
                    "histogram_quantile(0.99, sum by (le) "
                    f"(rate(tpufleet_scheduling_cycle_seconds_bucket[{_RATE}])))",
                    "p99",
                )
            ],
        ),
    ]


def _tpus() -> list[Obj]:
    return [
        _row("TPUs"),
        _panel(
            "Duty cycle per slice",
            "timeseries",
            "percent",
            [(f"avg by (slice, tenant) (tpufleet_tpu_duty_cycle_percent{{{_T}}})", "{{slice}} {{tenant}}")],
        ),
        _panel(
            "TensorCore utilization per slice",
            "timeseries",
            "percent",
            [(f"avg by (slice) (tpufleet_tpu_tensorcore_utilization_percent{{{_T}}})", "{{slice}}")],
        ),
        _panel(
            "HBM used per slice",
            "timeseries",
            "percentunit",
            [
                (
                    f"sum by (slice) (tpufleet_tpu_hbm_used_bytes{{{_T}}}) / "
                    f"sum by (slice) (tpufleet_tpu_hbm_total_bytes{{{_T}}})",
                    "{{slice}}",
                )
            ],
        ),
        _panel(
            "Hosts whose device metrics answer",
            "timeseries",
            "short",
            [
                (
                    "sum by (source, emulated) (tpufleet_tpu_metrics_source_up)",
                    "{{source}} emulated={{emulated}}",
                )
            ],
        ),
        _panel(
            "Jobs on slices",
            "table",
            "short",
            [(f"tpufleet_job_slice_info{{{_T}}}", "{{job}} {{slice}}")],
        ),
    ]


def _tenants() -> list[Obj]:
    return [
        _row("Tenants"),
        _panel(
            "Chips held and quota",
            "timeseries",
            "short",
            [
                (
                    f"sum by (tenant, generation) (tpufleet_tenant_chips_held{{{_T}}})",
                    "{{tenant}} {{generation}} held",
                ),
                (
                    f"sum by (tenant, generation) (tpufleet_tenant_chips_quota{{{_T}}})",
                    "{{tenant}} {{generation}} quota",
                ),
            ],
        ),
        _panel(
            "Cost per hour",
            "timeseries",
            "currencyUSD",
            [
                (
                    f"sum by (tenant, pricing) (rate(tpufleet_cost_dollars_total{{{_T}}}[{_RATE}])) * 3600",
                    "{{tenant}} {{pricing}}",
                )
            ],
        ),
        _panel(
            "Chip-hours, last 24 h",
            "bargauge",
            "short",
            [(f"sum by (tenant) (increase(tpufleet_chip_seconds_total{{{_T}}}[24h])) / 3600", "{{tenant}}")],
        ),
        _panel(
            "Goodput per job",
            "timeseries",
            "percentunit",
            [(f"tpufleet_job_goodput_ratio{{{_T}}}", "{{tenant}} {{job}}")],
        ),
    ]


def _layout(panels: list[Obj]) -> list[Obj]:
    """Grid positions: a row spans 24 columns; panels go three to a line, 8 wide and 8 high."""
    y, x = 0, 0
    for pid, panel in enumerate(panels, start=1):
        panel["id"] = pid
        if panel["type"] == "row":
            y += 8 if x else 0
            panel["gridPos"] = {"h": 1, "w": 24, "x": 0, "y": y}
            y, x = y + 1, 0
            continue
        panel["gridPos"] = {"h": 8, "w": 8, "x": x, "y": y}
        x += 8
        if x >= 24:
            y, x = y + 8, 0
    return panels


def render_dashboard(spec: FleetSpec) -> dict[str, Any]:
    """The Grafana dashboard JSON of one fleet (uid ``tpufleet-<fleet name>``)."""
    return {
        "uid": f"tpufleet-{spec.name}"[:40],
        "title": f"tpufleet: {spec.name}",
        "tags": ["tpufleet", "tpu", "ray"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {
            "list": [
                {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"},
                {
                    "name": "tenant",
                    "label": "Tenant",
                    "type": "query",
                    "datasource": _DS,
                    "query": {"query": "label_values(tpufleet_jobs, tenant)", "refId": "tenants"},
                    "definition": "label_values(tpufleet_jobs, tenant)",
                    "includeAll": True,
                    "multi": True,
                    "allValue": ".*",
                    "current": {"text": "All", "value": "$__all"},
                    "refresh": 2,
                },
            ]
        },
        "annotations": {"list": []},
        "panels": _layout([*_fleet(), *_tpus(), *_tenants()]),
    }
