"""The RayCluster linter: manifests in, findings out. Pure (no Ray); only ``crds`` reads files."""

from tpufleet.lint.findings import RULES, Finding, Rule
from tpufleet.lint.runner import format_json, format_text, has_errors, lint_objects, lint_text

__all__ = [
    "RULES",
    "Finding",
    "Rule",
    "format_json",
    "format_text",
    "has_errors",
    "lint_objects",
    "lint_text",
]
