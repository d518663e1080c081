"""The fleet's fences and gauges: NetworkPolicy, PodMonitor and PrometheusRule.

The NetworkPolicy admits, to every pod of the fleet, only (1) the fleet's own pods (head, workers,
RayJob submitter) on any port, (2) Prometheus pods of the monitoring namespace on the metrics port,
and (3) the KubeRay operator on the dashboard port (it submits RayJobs and reads job status there).
Egress stays open: hosts pull images, checkpoints and datasets.
"""

from __future__ import annotations

from tpufleet.render.common import FLEET_LABEL, HEAD_PORTS, METRICS_PORT, Obj, meta
from tpufleet.spec import FleetSpec

__all__ = ["render_network_policy", "render_pod_monitor", "render_rules"]

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
