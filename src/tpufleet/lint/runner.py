"""Run every rule over the Ray objects of a YAML text and report located findings.

``lint_text(text, file, schemas)`` finds each RayCluster, RayJob (``spec.rayClusterSpec``) and
RayService (``spec.rayClusterConfig``) document, runs the TPU rules on its head and worker groups,
(a Ray cluster-launcher config gets :mod:`tpufleet.lint.launcher`'s TPU node-type rules instead),
checks ``apiVersion`` and checks the whole object against the schema source (KubeRay's CRDs, or the
packaged structural subset when ``schemas`` is None). Other kinds are skipped; ``lint_file`` also says
why a text holds nothing to check (empty, a fleet spec, only other kinds). Pure: the caller
reads files; unparsable YAML raises :class:`~tpufleet.errors.InputError`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from tpufleet._yamlpos import Document, Path, dotted, load_documents
from tpufleet.lint.crds import SchemaSource
from tpufleet.lint.findings import RULES, Finding
from tpufleet.lint.launcher import is_launcher_config, launcher_problems
from tpufleet.lint.rules import GROUP_RULES, Problem, api_version_problems, groups_of
from tpufleet.lint.schema import schema_problems
from tpufleet.lint.structure import FALLBACK

__all__ = [
    "RAY_KINDS",
    "fallback_schemas",
    "format_json",
    "format_text",
    "has_errors",
    "lint_file",
    "lint_objects",
    "lint_text",
]

# kind -> where the RayCluster spec sits inside it
RAY_KINDS: dict[str, Path] = {
    "RayCluster": ("spec",),
    "RayJob": ("spec", "rayClusterSpec"),
    "RayService": ("spec", "rayClusterConfig"),
}


def fallback_schemas(kind: str, version: str) -> dict[str, Any] | None:
    """The packaged structural rules (any served version of a kind shares them)."""
    return FALLBACK.get(kind)


def _get(data: Any, path: Path) -> Any:
    for part in path:
        if isinstance(part, int):
            data = data[part] if isinstance(data, list) and part < len(data) else None
        else:
            data = data.get(part) if isinstance(data, dict) else None
    return data


def _problems(data: dict[str, Any], schemas: SchemaSource) -> Iterator[Problem]:
    kind = str(data.get("kind"))
    deprecated = list(api_version_problems(data))
    yield from deprecated
    # A deprecated apiVersion (TPF001) is checked as the ray.io/v1 object TPF001 asks for: its old
    # schema (no numOfHosts, rayStartParams required) would only add findings TPF001's fix removes.
    version = "v1" if deprecated else str(data.get("apiVersion", "ray.io/v1")).rpartition("/")[2]
    schema = schemas(kind, version) or schemas(kind, "v1")
    if schema is not None:
        yield from schema_problems(data, schema)
    base = RAY_KINDS[kind]
    for group in groups_of(_get(data, base), base):
        for rule in GROUP_RULES:
            yield from rule(group)


def _finding(file: str, doc: Document, problem: Problem) -> Finding:
    code, path, message = problem
    line, column = doc.where(path)
    return Finding(file, line, column, code, RULES[code].severity, dotted(path), message)


def lint_text(text: str, file: str = "<input>", schemas: SchemaSource | None = None) -> list[Finding]:
    """Findings for every Ray object in ``text``, in file order."""
    return lint_file(text, file, schemas)[0]


def lint_file(
    text: str, file: str = "<input>", schemas: SchemaSource | None = None
) -> tuple[list[Finding], str | None]:
    """:func:`lint_text`'s findings and, when ``text`` holds no RayCluster, RayJob or RayService
    document nor a Ray cluster-launcher config, why nothing was checked (naming what it holds
    instead); else None."""
    source = schemas or fallback_schemas
    findings: list[Finding] = []
    docs = load_documents(text, file)
    for doc in docs:
        if isinstance(doc.data, dict) and doc.data.get("kind") in RAY_KINDS:
            findings += sorted(_finding(file, doc, p) for p in _problems(doc.data, source))
        elif is_launcher_config(doc.data):
            findings += sorted(_finding(file, doc, p) for p in launcher_problems(doc.data))
    return findings, _unchecked([d.data for d in docs], file)


def _unchecked(docs: list[Any], file: str) -> str | None:
    kinds = [d.get("kind") for d in docs if isinstance(d, dict)]
    if any(kind in RAY_KINDS for kind in kinds) or any(is_launcher_config(d) for d in docs):
        return None
    names = list(RAY_KINDS)
    checks = f"lint checks {', '.join(names[:-1])} and {names[-1]} documents"
    if not [d for d in docs if d is not None]:
        return f"{file}: no YAML document in it: nothing checked ({checks})"
    if any(isinstance(d, dict) and "pools" in d and "kind" not in d for d in docs):
        return (
            f"{file}: a tpufleet fleet spec: nothing checked ({checks}); "
            f"check a fleet spec with `tpufleet render {file} --check`"
        )
    found = sorted({str(k)[:60] for k in kinds if k is not None})
    what = f"found {', '.join(found)}" if found else "no document has a kind"
    return f"{file}: no {', '.join(names[:-1])} or {names[-1]} document ({what}): nothing checked"


def lint_objects(objects: Iterable[dict[str, Any]], schemas: SchemaSource | None = None) -> list[Finding]:
    """Lint objects that are already in memory (what ``render`` returns); lines are 0."""
    source = schemas or fallback_schemas
    out: list[Finding] = []
    for index, obj in enumerate(objects):
        if obj.get("kind") in RAY_KINDS:
            doc = Document(obj, {}, (0, 0))
            out += [_finding(f"<object {index}>", doc, p) for p in _problems(obj, source)]
    return out


def has_errors(findings: Iterable[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)


def format_text(findings: Iterable[Finding]) -> str:
    return "\n".join(f.text() for f in findings)


def format_json(findings: Iterable[Finding]) -> str:
    return json.dumps([f.as_dict() for f in findings], indent=2)
