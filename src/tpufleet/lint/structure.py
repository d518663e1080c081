"""The packaged structural rules: a small hand-written subset of KubeRay v1.7.0's CRD schemas.

Used by rule TPF009 when KubeRay's CRD files are not at hand. It has the same shape as an
``openAPIV3Schema`` and checks the top of each object: the field names of the spec, the head and
worker groups and ``autoscalerOptions`` (including ``resources``, which is Kubernetes resource
requirements and nothing else), the enums and the integer/boolean fields. Pod templates and nested
option blocks are left open (``type: object``); the full CRD checks them when given.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FALLBACK"]

STR: dict[str, Any] = {"type": "string"}
INT: dict[str, Any] = {"type": "integer"}
BOOL: dict[str, Any] = {"type": "boolean"}
NUM: dict[str, Any] = {"type": "number"}
OPEN: dict[str, Any] = {"type": "object"}  # open: not checked further
STR_MAP: dict[str, Any] = {"type": "object", "additionalProperties": STR}
QUANTITIES: dict[str, Any] = {"type": "object", "additionalProperties": {"anyOf": [INT, STR]}}


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    return out


_AUTOSCALER = _obj(
    {
        "args": {"type": "array"},
        "command": {"type": "array"},
        "env": {"type": "array"},
        "envFrom": {"type": "array"},
        "idleTimeoutSeconds": INT,
        "image": STR,
        "imagePullPolicy": STR,
        "resources": _obj({"claims": {"type": "array"}, "limits": QUANTITIES, "requests": QUANTITIES}),
        "securityContext": OPEN,
        "upscalingMode": {"type": "string", "enum": ["Default", "Aggressive", "Conservative"]},
        "version": {"type": "string", "enum": ["v1", "v2"]},
        "volumeMounts": {"type": "array"},
    }
)

_HEAD = _obj(
    {
        "enableIngress": BOOL,
        "headService": OPEN,
        "ingressOptions": OPEN,
        "labels": STR_MAP,
        "rayStartParams": STR_MAP,
        "resources": STR_MAP,
        "serviceType": STR,
        "template": OPEN,
    },
    ["template"],
)

_WORKER = _obj(
    {
        "groupName": STR,
        "idleTimeoutSeconds": INT,
        "labels": STR_MAP,
        "maxReplicas": INT,
        "minReplicas": INT,
        "numOfHosts": INT,
        "priority": INT,
        "rayStartParams": STR_MAP,
        "replicas": INT,
        "resources": STR_MAP,
        "scaleStrategy": OPEN,
        "suspend": BOOL,
        "template": OPEN,
    },
    ["groupName", "template"],  # minReplicas/maxReplicas are required but defaulted by the server
)

_CLUSTER_SPEC = _obj(
    {
        "authOptions": OPEN,
        "autoscalerOptions": _AUTOSCALER,
        "enableInTreeAutoscaling": BOOL,
        "gcsFaultToleranceOptions": OPEN,
        "headGroupSpec": _HEAD,
        "headServiceAnnotations": STR_MAP,
        "historyServerOptions": OPEN,
        "managedBy": STR,
        "networkPolicy": OPEN,
        "rayVersion": STR,
        "suspend": BOOL,
        "tlsOptions": OPEN,
        "upgradeStrategy": OPEN,
        "workerGroupSpecs": {"type": "array", "items": _WORKER},
    },
    ["headGroupSpec"],
)

_JOB_SPEC = _obj(
    {
        "activeDeadlineSeconds": INT,
        "backoffLimit": INT,
        "clusterSelector": STR_MAP,
        "deletionStrategy": OPEN,
        "entrypoint": STR,
        "entrypointNumCpus": NUM,
        "entrypointNumGpus": NUM,
        "entrypointResources": STR,
        "jobId": STR,
        "managedBy": STR,
        "metadata": OPEN,
        "preRunningDeadlineSeconds": INT,
        "rayClusterSpec": _CLUSTER_SPEC,
        "runtimeEnvYAML": STR,
        "shutdownAfterJobFinishes": BOOL,
        "submissionMode": STR,
        "submitterConfig": OPEN,
        "submitterPodTemplate": OPEN,
        "suspend": BOOL,
        "ttlSecondsAfterFinished": INT,
    }
)

_SERVICE_SPEC = _obj(
    {
        "deploymentUnhealthySecondThreshold": INT,
        "excludeHeadPodFromServeSvc": BOOL,
        "managedBy": STR,
        "rayClusterConfig": _CLUSTER_SPEC,
        "rayClusterDeletionDelaySeconds": INT,
        "serveConfigV2": STR,
        "serveService": OPEN,
        "serviceUnhealthySecondThreshold": INT,
        "suspend": BOOL,
        "upgradeStrategy": OPEN,
    },
    ["rayClusterConfig"],
)


def _top(spec: dict[str, Any]) -> dict[str, Any]:
    return _obj({"apiVersion": STR, "kind": STR, "metadata": OPEN, "spec": spec, "status": OPEN})


FALLBACK: dict[str, dict[str, Any]] = {
    "RayCluster": _top(_CLUSTER_SPEC),
    "RayJob": _top(_JOB_SPEC),
    "RayService": _top(_SERVICE_SPEC),
}
