"""What the linter reports: rules with stable codes, and findings located by file, line and path."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

__all__ = ["RULES", "Finding", "Rule", "Severity"]

Severity = Literal["error", "warning", "info"]


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    severity: Severity
    summary: str


# Stable codes: never renumber; a retired rule keeps its code reserved. docs/lint.md documents each.
RULES: dict[str, Rule] = {
    r.code: r
    for r in (
        Rule("TPF001", "deprecated-api-version", "error", "apiVersion ray.io/v1alpha1 (or another non-v1)"),
        Rule("TPF002", "non-tpu-node-selector", "error", "a node selector that is not a GKE TPU label"),
        Rule("TPF003", "missing-tpu-selector", "error", "a TPU group without accelerator/topology selector"),
        Rule("TPF004", "unknown-tpu-shape", "error", "an accelerator/topology pair that does not exist"),
        Rule("TPF005", "tpu-chips-per-host", "error", "google.com/tpu is not a chips-per-host value"),
        Rule("TPF006", "tpu-requests-limits", "error", "google.com/tpu requests differ from limits"),
        Rule("TPF007", "num-of-hosts", "error", "numOfHosts missing or not topology chips / chips per host"),
        Rule(
            "TPF008", "webhook-owned-env", "error", "hard-coded TPU_WORKER_HOSTNAMES/TPU_WORKER_ID/TPU_NAME"
        ),
        Rule("TPF009", "crd-schema", "error", "a field the CRD does not define, or a value it rejects"),
        Rule("TPF010", "ray-start-param", "error", "a rayStartParams key that `ray start` does not accept"),
        # Ray cluster-launcher configs (GCE): tpufleet.lint.launcher
        Rule(
            "TPF011",
            "launcher-tpu-shape",
            "error",
            "an acceleratorType/acceleratorConfig that does not exist",
        ),
        Rule("TPF012", "launcher-runtime-version", "error", "no runtimeVersion, or another generation's"),
        Rule("TPF013", "launcher-tpu-resources", "error", "resources.TPU above the chips of one host"),
        Rule(
            "TPF014", "launcher-max-workers", "error", "max_workers below min_workers or above the cluster's"
        ),
        Rule(
            "TPF015",
            "launcher-tpu-not-checked",
            "info",
            "a TPU generation the catalog does not know (v2, v3)",
        ),
    )
}


@dataclass(frozen=True, order=True)
class Finding:
    file: str
    line: int
    column: int
    code: str
    severity: Severity
    path: str  # dotted: spec.workerGroupSpecs[0].template.spec.nodeSelector
    message: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def text(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.code} {self.message}"
