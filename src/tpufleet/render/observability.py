"""The fleet's fences and gauges: NetworkPolicy, PodMonitor and PrometheusRules.

The NetworkPolicy admits, to every pod of the fleet, only (1) the fleet's own pods (head, workers,
RayJob submitter) on any port, (2) Prometheus pods of the monitoring namespace on the metrics port,
and (3) the KubeRay operator on the dashboard port (it submits RayJobs and reads job status there).
Egress stays open: hosts pull images, checkpoints and datasets.

Two sets of alerts: :func:`render_rules` (what the Ray scrape alone shows, for the KubeRay target)
and :func:`render_fleet_rules` (the control plane's ``tpufleet_*`` metrics: queue, slices, TPU
device numbers, quota, goodput; ``--target observability``, with :func:`plain_rules` for a
Prometheus that is not run by prometheus-operator). Thresholds are :class:`Thresholds`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpufleet.render.common import FLEET_LABEL, HEAD_PORTS, METRICS_PORT, Obj, meta
from tpufleet.render.dashboard import render_dashboard
from tpufleet.spec import FleetSpec

__all__ = [
    "FLEET_UTILIZATION",
    "Thresholds",
    "plain_rules",
    "render_fleet_rules",
    "render_network_policy",
    "render_observability",
    "render_pod_monitor",
    "render_rules",
]

_NS = "kubernetes.io/metadata.name"  # set by Kubernetes on every namespace (1.22+)


def render_network_policy(spec: FleetSpec) -> Obj:
    fleet = {"matchLabels": {FLEET_LABEL: spec.name}}
    monitoring_ns = spec.monitoring.namespace or spec.namespace
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta(spec, f"{spec.name}-ray"),
        "spec": {
            "podSelector": fleet,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": fleet}]},
                {
                    "from": [
                        {
                            "namespaceSelector": {"matchLabels": {_NS: monitoring_ns}},
                            "podSelector": {"matchLabels": dict(spec.monitoring.prometheus_labels)},
                        }
                    ],
                    "ports": [{"protocol": "TCP", "port": METRICS_PORT}],
                },
                {
                    "from": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {_NS: spec.network_policy.operator_namespace}
                            },
                            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "kuberay-operator"}},
                        }
                    ],
                    "ports": [{"protocol": "TCP", "port": HEAD_PORTS["dashboard"]}],
                },
            ],
        },
    }


def render_pod_monitor(spec: FleetSpec) -> Obj:
    """Scrape Ray's metrics port (``metrics-export-port``) on the head and every TPU host."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": meta(spec, f"{spec.name}-ray"),
        "spec": {
            "selector": {"matchLabels": {FLEET_LABEL: spec.name}},
            "namespaceSelector": {"matchNames": [spec.namespace]},
            "podMetricsEndpoints": [{"port": "metrics", "interval": "30s"}],
            "podTargetLabels": [FLEET_LABEL, "tpufleet.dev/pool", "ray.io/group", "ray.io/node-type"],
        },
    }


def render_rules(spec: FleetSpec) -> Obj:
    """Alerts that need nothing but the scrape: a host that stops answering, a head that is gone."""
    job = f"{spec.namespace}/{spec.name}-ray"  # prometheus-operator's job label for a PodMonitor
    sel = f'job="{job}"'
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": meta(spec, f"{spec.name}-ray"),
        "spec": {
            "groups": [
                {
                    "name": f"{spec.name}.ray",
                    "rules": [
                        {
                            "alert": "RayHeadDown",
                            "expr": f'sum(up{{{sel}, ray_io_node_type="head"}}) < 1',
                            "for": "5m",
                            "labels": {"severity": "critical"},
                            "annotations": {
                                "summary": f"Ray head of fleet {spec.name} is not being scraped",
                                "description": "No head pod answers on the metrics port; no job can start.",
                            },
                        },
                        {
                            "alert": "RayTpuHostDown",
                            "expr": f'up{{{sel}, ray_io_node_type="worker"}} == 0',
                            "for": "10m",
                            "labels": {"severity": "warning"},
                            "annotations": {
                                "summary": f"A TPU host of fleet {spec.name} stopped answering",
                                "description": (
                                    "Pod {{ $labels.pod }} of group {{ $labels.ray_io_group }} is down; "
                                    "its whole "
                                    "slice is broken until KubeRay replaces it."
                                ),
                            },
                        },
                    ],
                }
            ]
        },
    }


# -- the control plane's metrics -------------------------------------------------------------------

#: Recording rule: chip-time used over chip-time paid for (every chip of the inventory has a duty
#: cycle series; one whose host reports nothing is 0, so it counts as idle).
FLEET_UTILIZATION = "tpufleet:tpu_duty_cycle:fleet_ratio"


@dataclass(frozen=True)
class Thresholds:
    """When the fleet alerts fire (durations in Prometheus syntax)."""

    queued_without_admission: str = "30m"  # a tenant has queued jobs and none was admitted for this long
    admission_wait_p90_s: int = 3600
    slice_broken_for: str = "10m"
    provisioning_for: str = "30m"
    held_duty_cycle_percent: int = 10  # a held slice busier than this is working
    held_idle_for: str = "30m"
    hbm_full_ratio: float = 0.95
    host_down_for: str = "5m"
    borrowing_for: str = "1h"
    goodput_ratio: float = 0.5
    goodput_for: str = "1h"


def _alert(name: str, expr: str, for_: str, severity: str, summary: str, description: str) -> Obj:
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity},
        "annotations": {"summary": summary, "description": description},
    }


def _fleet_alerts(spec: FleetSpec, t: Thresholds) -> list[Obj]:
    fleet = spec.name
    return [
        _alert(
            "TpufleetJobsWaitingTooLong",
            'sum by (tenant) (tpufleet_jobs{state="QUEUED"}) > 0 unless on (tenant) '
            "sum by (tenant) "
            f"(increase(tpufleet_admission_wait_seconds_count[{t.queued_without_admission}])) > 0",
            t.queued_without_admission,
            "warning",
            f"Tenant {{{{ $labels.tenant }}}} has jobs queued on fleet {fleet} and none was admitted",
            "{{ $value }} job(s) wait and none of this tenant's jobs was admitted for "
            f"{t.queued_without_admission}: `tpufleet jobs` shows each job's reason.",
        ),
        _alert(
            "TpufleetAdmissionWaitHigh",
            "histogram_quantile(0.9, sum by (tenant, le) "
            f"(rate(tpufleet_admission_wait_seconds_bucket[1h]))) > {t.admission_wait_p90_s}",
            "15m",
            "warning",
            f"Jobs of tenant {{{{ $labels.tenant }}}} wait long for slices on fleet {fleet}",
            'The 90th percentile of the wait from submission to admission is {{ printf "%.0f" $value }}s '
            f"(more than {t.admission_wait_p90_s}s) over the last hour.",
        ),
        _alert(
            "TpufleetSliceBroken",
            'sum by (accelerator_type) (tpufleet_slices{state="BROKEN"}) > 0',
            t.slice_broken_for,
            "warning",
            f"{{{{ $value }}}} {{{{ $labels.accelerator_type }}}} slice(s) of fleet {fleet} are broken",
            "A host of the slice is missing or dead, so no job can use the slice; "
            "`tpufleet slices` names it.",
        ),
        _alert(
            "TpufleetSliceProvisioningTooLong",
            'sum by (accelerator_type) (tpufleet_slices{state="PROVISIONING"}) > 0',
            t.provisioning_for,
            "warning",
            f"{{{{ $labels.accelerator_type }}}} slices of fleet {fleet} "
            f"provisioning for {t.provisioning_for}",
            "The provider has not delivered the slice: capacity may be short in the zone.",
        ),
        _alert(
            "TpufleetHeldSliceIdle",
            "avg by (slice) (tpufleet_tpu_duty_cycle_percent) * on (slice) group_left (job, tenant) "
            f"tpufleet_job_slice_info < {t.held_duty_cycle_percent}",
            t.held_idle_for,
            "warning",
            "Slice {{ $labels.slice }} is held by job {{ $labels.job }} but its TPUs are idle",
            'Average duty cycle {{ printf "%.1f" $value }}% '
            f"(under {t.held_duty_cycle_percent}%) for "
            f"{t.held_idle_for}; chips that report nothing count as idle.",
        ),
        _alert(
            "TpufleetHbmNearlyFull",
            f"tpufleet_tpu_hbm_used_bytes / tpufleet_tpu_hbm_total_bytes > {t.hbm_full_ratio}",
            "10m",
            "warning",
            "HBM of chip {{ $labels.chip }} on {{ $labels.slice }}/{{ $labels.host }} is nearly full",
            "{{ $value | humanizePercentage }} of the chip's HBM is allocated; the next allocation "
            "may fail with out-of-memory.",
        ),
        _alert(
            "TpufleetHostDown",
            "tpufleet_host_up == 0",
            t.host_down_for,
            "critical",
            f"TPU host {{{{ $labels.slice }}}}/{{{{ $labels.host }}}} of fleet {fleet} is down",
            "The host is missing or dead in Ray; its whole slice is broken until it comes back.",
        ),
        _alert(
            "TpufleetTenantOverQuota",
            "sum by (tenant, generation) (tpufleet_tenant_chips_held) > "
            "sum by (tenant, generation) (tpufleet_tenant_chips_quota)",
            t.borrowing_for,
            "info",
            "Tenant {{ $labels.tenant }} holds more {{ $labels.generation }} chips than its quota",
            f"It has been borrowing idle capacity for {t.borrowing_for}; its borrowing jobs are "
            "preempted when another tenant needs its own quota back.",
        ),
        _alert(
            "TpufleetLowGoodput",
            f"tpufleet_job_goodput_ratio < {t.goodput_ratio}",
            t.goodput_for,
            "warning",
            "Job {{ $labels.job }} of tenant {{ $labels.tenant }} spends most of its slice time unproductive",
            "Goodput {{ $value | humanizePercentage }}: start-up, redone steps, recovery or idle time "
            "outweigh training; `tpufleet cost` splits the badput.",
        ),
    ]


def render_fleet_rules(spec: FleetSpec, thresholds: Thresholds | None = None) -> Obj:
    """A PrometheusRule over the control plane's ``tpufleet_*`` metrics (see the module docstring)."""
    t = thresholds or Thresholds()
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": meta(spec, f"{spec.name}-tpufleet"),
        "spec": {
            "groups": [
                {
                    "name": f"{spec.name}.tpufleet.records",
                    "rules": [
                        {
                            "record": FLEET_UTILIZATION,
                            "expr": "sum(tpufleet_tpu_duty_cycle_percent) "
                            "/ count(tpufleet_tpu_duty_cycle_percent) / 100",
                        }
                    ],
                },
                {"name": f"{spec.name}.tpufleet", "rules": _fleet_alerts(spec, t)},
            ]
        },
    }


def plain_rules(rule: Obj) -> Obj:
    """The groups of a PrometheusRule as a Prometheus rules file (``rule_files:``)."""
    return {"groups": rule["spec"]["groups"]}


def render_observability(spec: FleetSpec, thresholds: Thresholds | None = None) -> dict[str, Obj]:
    """``--target observability``: file name -> content. The PrometheusRule (for
    prometheus-operator), the same groups as a plain rules file, and the Grafana dashboard."""
    rule = render_fleet_rules(spec, thresholds)
    return {
        f"prometheusrule-{rule['metadata']['name']}.yaml": rule,
        f"{spec.name}-tpufleet-rules.yml": plain_rules(rule),
        f"{spec.name}-tpufleet-dashboard.json": render_dashboard(spec),
    }
