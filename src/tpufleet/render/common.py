"""Names every renderer shares: the fleet's pod labels and the Ray ports."""

from __future__ import annotations

from typing import Any

from tpufleet.spec import FleetSpec

__all__ = ["FLEET_LABEL", "HEAD_PORTS", "METRICS_PORT", "WORKER_PORTS", "Obj", "meta", "pod_labels"]

Obj = dict[str, Any]

FLEET_LABEL = "tpufleet.dev/fleet"
METRICS_PORT = 8080
# KubeRay's own port names: it builds the head Service from the head container's ports.
HEAD_PORTS = {"gcs-server": 6379, "dashboard": 8265, "client": 10001, "metrics": METRICS_PORT}
# 8081: the multi-slice (Megascale) coordinator port of DESIGN.md's host contract.
WORKER_PORTS = {"metrics": METRICS_PORT, "mxla": 8081}


def pod_labels(spec: FleetSpec) -> dict[str, str]:
    """Labels on every pod of the fleet; the NetworkPolicy and PodMonitor select on them."""
    return {FLEET_LABEL: spec.name, "app.kubernetes.io/managed-by": "tpufleet"}


def meta(spec: FleetSpec, name: str) -> Obj:
    return {"name": name, "namespace": spec.namespace, "labels": pod_labels(spec)}
