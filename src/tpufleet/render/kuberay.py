"""A fleet spec as KubeRay objects: the RayCluster (or a RayJob wrapping it) and its ServiceAccount.

One worker group per pool, counted in slices: ``replicas``/``minReplicas``/``maxReplicas`` are
slices and ``numOfHosts`` is the hosts of one slice, so KubeRay creates and deletes whole slices.
Each worker pod asks for ``google.com/tpu`` = chips per host (requests = limits) and selects its
node pool by ``cloud.google.com/gke-tpu-accelerator`` and ``cloud.google.com/gke-tpu-topology``;
the GKE TPU webhook (ai-on-gke ``kuberay-tpu-webhook``) then injects ``TPU_WORKER_ID``,
``TPU_WORKER_HOSTNAMES`` and ``TPU_NAME`` per replica, so nothing here hard-codes them.
"""

from __future__ import annotations

import copy
from typing import Any

from tpufleet.render.common import HEAD_PORTS, METRICS_PORT, WORKER_PORTS, Obj, meta, pod_labels
from tpufleet.render.observability import render_network_policy, render_pod_monitor, render_rules
from tpufleet.spec import FleetSpec, PoolSpec

__all__ = [
    "node_selector",
    "render_kuberay",
    "render_provider_rbac",
    "render_raycluster",
    "render_rayjob",
    "render_service_account",
]


def _ports(ports: dict[str, int]) -> list[Obj]:
    return [{"name": name, "containerPort": port} for name, port in ports.items()]


def _resources(values: dict[str, Any]) -> Obj:
    return {"requests": dict(values), "limits": dict(values)}


def _pod_spec(spec: FleetSpec, container: Obj, selector: dict[str, str] | None = None) -> Obj:
    pod: Obj = {}
    if spec.service_account:
        pod["serviceAccountName"] = spec.service_account.name
    if selector:
        pod["nodeSelector"] = selector
    pod["containers"] = [container]
    return pod


def _head_group(spec: FleetSpec) -> Obj:
    container = {
        "name": "ray-head",
        "image": spec.ray.image_ref,
        "ports": _ports(HEAD_PORTS),
        "resources": _resources({"cpu": spec.head.cpu, "memory": spec.head.memory}),
    }
    return {
        # num-cpus 0: no tasks on the head; the TPU hosts do the work.
        "rayStartParams": {
            "dashboard-host": "0.0.0.0",
            "num-cpus": "0",
            "metrics-export-port": str(METRICS_PORT),
        },
        "template": {"metadata": {"labels": pod_labels(spec)}, "spec": _pod_spec(spec, container)},
    }


def node_selector(pool: PoolSpec) -> dict[str, str]:
    st = pool.slice_type
    selector = {
        "cloud.google.com/gke-tpu-accelerator": st.gke_accelerator,
        "cloud.google.com/gke-tpu-topology": str(st.topology),
    }
    if pool.spot:
        selector["cloud.google.com/gke-spot"] = "true"
    return selector


def _worker_group(spec: FleetSpec, pool: PoolSpec) -> Obj:
    st = pool.slice_type
    resources: dict[str, Any] = {"google.com/tpu": st.chips_per_host}
    if pool.cpu:
        resources["cpu"] = pool.cpu
    if pool.memory:
        resources["memory"] = pool.memory
    container = {
        "name": "ray-worker",
        "image": spec.ray.image_ref,
        "ports": _ports(WORKER_PORTS),
        "resources": _resources(resources),
    }
    labels = {**pod_labels(spec), "tpufleet.dev/pool": pool.name}
    return {
        "groupName": pool.name,
        "replicas": pool.slices,
        "minReplicas": pool.min_count,
        "maxReplicas": pool.max_count,
        "numOfHosts": st.hosts,
        "rayStartParams": {"metrics-export-port": str(METRICS_PORT)},
        "template": {
            "metadata": {"labels": labels},
            "spec": _pod_spec(spec, container, node_selector(pool)),
        },
    }


def _cluster_spec(spec: FleetSpec) -> Obj:
    out: Obj = {"rayVersion": spec.ray.version}
    if spec.autoscaling.enabled:
        out["enableInTreeAutoscaling"] = True
        out["autoscalerOptions"] = {
            "version": "v2",
            "idleTimeoutSeconds": spec.autoscaling.idle_timeout_s,
            "upscalingMode": spec.autoscaling.upscaling,
        }
    out["headGroupSpec"] = _head_group(spec)
    out["workerGroupSpecs"] = [_worker_group(spec, pool) for pool in spec.pools]
    return out


def render_raycluster(spec: FleetSpec) -> Obj:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": meta(spec, spec.name),
        "spec": _cluster_spec(spec),
    }


def render_rayjob(spec: FleetSpec, entrypoint: str) -> Obj:
    """A RayJob that brings the fleet's cluster up, runs ``entrypoint`` and tears the cluster down.

    The submitter pod carries the fleet label so the NetworkPolicy lets it reach the dashboard.
    """
    submitter = {"name": "ray-job-submitter", "image": spec.ray.image_ref}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": meta(spec, f"{spec.name}-job"),
        "spec": {
            "entrypoint": entrypoint,
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 600,
            "rayClusterSpec": _cluster_spec(spec),
            "submitterPodTemplate": {
                "metadata": {"labels": pod_labels(spec)},
                "spec": {**_pod_spec(spec, submitter), "restartPolicy": "Never"},
            },
        },
    }


def render_service_account(spec: FleetSpec) -> Obj | None:
    sa = spec.service_account
    if sa is None:
        return None
    metadata = meta(spec, sa.name)
    if sa.gcp_service_account:
        # GKE Workload Identity: pods running as this KSA act as the Google service account.
        metadata["annotations"] = {"iam.gke.io/gcp-service-account": sa.gcp_service_account}
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata}


def render_provider_rbac(spec: FleetSpec) -> list[Obj]:
    """What ``tpufleet serve --provider kuberay`` needs (provision/kuberay.py): a ServiceAccount for
    the control plane, a Role that may read and patch this fleet's RayCluster (replicas and
    scaleStrategy.workersToDelete) and read its pods, and the RoleBinding between them."""
    name = f"{spec.name}-tpufleet-control-plane"
    rules = [
        {
            "apiGroups": ["ray.io"],
            "resources": ["rayclusters"],
            "resourceNames": [spec.name],
            "verbs": ["get", "patch"],
        },
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    ]
    subject = {"kind": "ServiceAccount", "name": name, "namespace": spec.namespace}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(spec, name)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta(spec, name),
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta(spec, name),
            "subjects": [subject],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        },
    ]


def render_kuberay(
    spec: FleetSpec, rayjob_entrypoint: str | None = None, *, provider_rbac: bool = False
) -> list[Obj]:
    """Every object for ``--target kuberay``, in the order ``kubectl apply`` should see them;
    ``provider_rbac`` adds :func:`render_provider_rbac`'s objects first."""
    objects: list[Obj | None] = [
        *(render_provider_rbac(spec) if provider_rbac else []),
        render_service_account(spec),
        render_network_policy(spec) if spec.network_policy.enabled else None,
        render_rayjob(spec, rayjob_entrypoint) if rayjob_entrypoint else render_raycluster(spec),
    ]
    if spec.monitoring.enabled:
        objects += [render_pod_monitor(spec), render_rules(spec)]
    return [copy.deepcopy(o) for o in objects if o is not None]
