"""Rule TPF009: check a Ray object against a structural OpenAPI v3 schema, as the API server would.

Two things are reported: values the schema rejects (types, enums, patterns, required fields; via
``jsonschema``) and fields it does not define. The second is what the API server silently prunes
(a structural schema drops unknown fields), so a ``utilizationThreshold`` under
``autoscalerOptions.resources`` is accepted by ``kubectl apply`` and then does nothing.

The schema is KubeRay's CRD (``spec.versions[name].schema.openAPIV3Schema``) when the caller has
it, else :data:`tpufleet.lint.structure.FALLBACK` - a small packaged subset of the same shape.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jsonschema

from tpufleet._yamlpos import Path, dotted
from tpufleet.errors import closest

__all__ = ["schema_problems"]

_PRESERVE = "x-kubernetes-preserve-unknown-fields"


def _unknown_fields(data: Any, schema: dict[str, Any], path: Path) -> Iterator[tuple[Path, str]]:
    if isinstance(data, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        if isinstance(props, dict) and not extra and not schema.get(_PRESERVE):
            for key in data:
                if key not in props:
                    near = closest(str(key), list(props))
                    hint = (
                        f"did you mean {' or '.join(near)}?" if near else f"it has {', '.join(sorted(props))}"
                    )
                    where = dotted(path) or "the object"
                    yield (
                        (*path, str(key)),
                        f"{key!r} is not a field of {where} in the CRD (it would be dropped); {hint}",
                    )
        for key, value in data.items():
            sub = props.get(key) if isinstance(props, dict) else None
            if sub is None and isinstance(extra, dict):
                sub = extra
            if isinstance(sub, dict):
                yield from _unknown_fields(value, sub, (*path, str(key)))
    elif isinstance(data, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(data):
            yield from _unknown_fields(item, schema["items"], (*path, i))


def _short(message: str) -> str:
    return message if len(message) <= 160 else message[:157] + "..."


def _value_errors(data: Any, schema: dict[str, Any]) -> Iterator[tuple[Path, str]]:
    validator = jsonschema.Draft7Validator(schema)
    for err in validator.iter_errors(data):
        if err.validator == "additionalProperties":
            continue  # reported by _unknown_fields with a "did you mean"
        path: Path = tuple(err.absolute_path)
        if err.validator == "required":
            missing = str(err.message).split("'")[1] if "'" in err.message else ""
            prop = (err.schema.get("properties") or {}).get(missing) if isinstance(err.schema, dict) else None
            if isinstance(prop, dict) and "default" in prop:
                continue  # the API server fills defaulted fields in before it validates
            path = (*path, missing) if missing else path
        yield path, f"the CRD rejects this value: {_short(err.message)}"


def schema_problems(data: Any, schema: dict[str, Any]) -> Iterator[tuple[str, Path, str]]:
    """``("TPF009", path, message)`` for every unknown field and every rejected value."""
    seen: set[Path] = set()
    for path, message in (*_unknown_fields(data, schema, ()), *_value_errors(data, schema)):
        if path not in seen:
            seen.add(path)
            yield "TPF009", path, message
