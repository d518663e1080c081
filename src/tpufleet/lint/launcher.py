"""TPU rules for a Ray cluster-launcher config on GCE (the YAML ``ray up`` takes).

A launcher config is a mapping with ``available_node_types`` and a ``provider`` of ``type: gcp``.
Each node type whose ``node_config`` names ``acceleratorType`` or ``acceleratorConfig`` is a TPU
node type. Ray's GCP launcher creates one TPU VM resource per Ray "node" of such a type: for a
multi-host pod slice that one node is the whole slice (its TPU command runner runs the setup and
``ray start`` on every host), so ``min_workers``/``max_workers`` count slices, while ``resources``
is what each host's ``ray start`` advertises (``TPU``: the chips of one host).

The checks: the shape exists in :mod:`tpufleet.catalog` (TPF011); the ``runtimeVersion`` is there
and is not another generation's TPU software (TPF012; the versions are
:data:`tpufleet.catalog.RUNTIME_VERSIONS`, the table ``render --target gce`` writes, which cites
Google's docs); ``resources.TPU`` is at most the chips of one host (TPF013); ``min_workers <= max_workers``
and a node type's ``max_workers`` fits the cluster's ``max_workers`` (TPF014). A generation the
catalog does not know (v2, v3) is reported as not checked (TPF015, info), never as wrong.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tpufleet import catalog as cat
from tpufleet.catalog import RUNTIME_VERSIONS
from tpufleet.errors import SpecError
from tpufleet.lint.rules import Problem

__all__ = ["is_launcher_config", "launcher_problems"]

# acceleratorConfig.type (TPU API AcceleratorConfig.Type) -> tpufleet generation; None: not in the catalog
_CONFIG_TYPES: dict[str, str | None] = {
    "V2": None,
    "V3": None,
    "V4": "v4",
    "V5LITE_POD": "v5e",
    "V5P": "v5p",
    "V6E": "v6e",
}
_UNKNOWN_PREFIXES = ("v2", "v3")


def is_launcher_config(data: Any) -> bool:
    if not isinstance(data, dict) or "kind" in data:
        return False
    provider = data.get("provider")
    return isinstance(data.get("available_node_types"), dict) and isinstance(provider, dict)


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _shape(name: str, config: dict[str, Any]) -> tuple[cat.SliceType | None, Problem | None]:
    base = ("available_node_types", name, "node_config")
    if "acceleratorType" in config and "acceleratorConfig" in config:  # Ray's GCP config refuses both
        return None, (
            "TPF011",
            (*base, "acceleratorConfig"),
            f"node type {name}: acceleratorType and acceleratorConfig are both set; keep one",
        )
    if "acceleratorType" in config:
        path = (*base, "acceleratorType")
        text = str(config["acceleratorType"])
        prefix = text.lower().partition("-")[0]
        if prefix in _UNKNOWN_PREFIXES:
            return None, (
                "TPF015",
                path,
                f"node type {name}: {text} is a TPU generation tpufleet's catalog does not know: not checked",
            )
        try:
            return cat.slice_type(text), None
        except SpecError as err:
            return None, ("TPF011", path, f"node type {name}: {err.message}")
    acc = config.get("acceleratorConfig")
    path = (*base, "acceleratorConfig")
    if not isinstance(acc, dict):
        return None, (
            "TPF011",
            path,
            f"node type {name}: acceleratorConfig must be a mapping {{type: V4, topology: 2x2x2}}",
        )
    kind = str(acc.get("type", ""))
    if kind not in _CONFIG_TYPES:
        types = ", ".join(_CONFIG_TYPES)
        return None, (
            "TPF011",
            (*path, "type"),
            f"node type {name}: acceleratorConfig.type {kind!r} is not a TPU type; expected one of {types}",
        )
    gen = _CONFIG_TYPES[kind]
    if gen is None:
        return None, (
            "TPF015",
            (*path, "type"),
            f"node type {name}: {kind} is a TPU generation tpufleet's catalog does not know: not checked",
        )
    try:
        return cat.find(gen, str(acc.get("topology", ""))), None
    except (SpecError, ValueError) as err:
        message = err.message if isinstance(err, SpecError) else str(err)
        return None, ("TPF011", (*path, "topology"), f"node type {name}: {message}")


def _runtime(name: str, config: dict[str, Any], st: cat.SliceType) -> Iterator[Problem]:
    version = config.get("runtimeVersion")
    gen = st.generation.name
    right = RUNTIME_VERSIONS.get(gen)
    path = ("available_node_types", name, "node_config", "runtimeVersion")
    if version is None:
        yield (
            "TPF012",
            ("available_node_types", name, "node_config"),
            f"node type {name}: no runtimeVersion; a {gen} TPU VM needs one, e.g. {right}",
        )
        return
    others = {v: g for g, v in RUNTIME_VERSIONS.items() if g != gen and v != right}
    if str(version) in others:
        yield (
            "TPF012",
            path,
            f"node type {name}: runtimeVersion {version} is the {others[str(version)]} "
            f"TPU software; a {gen} slice ({st.accelerator_type}) needs a {gen} one, e.g. {right}",
        )


def _resources(name: str, node: dict[str, Any], st: cat.SliceType) -> Iterator[Problem]:
    res = node.get("resources")
    if not isinstance(res, dict) or "TPU" not in res:
        return
    chips = _int(res["TPU"])
    # Fewer is allowed: Ray's own GCP TPU examples claim {"TPU": 1} as a scheduling token.
    if chips is None or not 0 < chips <= st.chips_per_host:
        yield (
            "TPF013",
            ("available_node_types", name, "resources", "TPU"),
            f"node type {name}: resources.TPU is {res['TPU']!r} but a {st.accelerator_type} host has "
            f"{st.chips_per_host} chips (resources are per host); use TPU: {st.chips_per_host}",
        )


def _workers(
    name: str, node: dict[str, Any], st: cat.SliceType, cluster_max: int | None
) -> Iterator[Problem]:
    lo, hi = _int(node.get("min_workers", 0)), _int(node.get("max_workers"))
    pod = f" (one worker is a whole {st.hosts}-host {st.accelerator_type} slice)" if st.multi_host else ""
    if lo is not None and hi is not None and lo > hi:
        yield (
            "TPF014",
            ("available_node_types", name, "max_workers"),
            f"node type {name}: max_workers {hi} is below min_workers {lo}{pod}",
        )
    elif hi is not None and cluster_max is not None and hi > cluster_max:
        yield (
            "TPF014",
            ("available_node_types", name, "max_workers"),
            f"node type {name}: max_workers {hi} exceeds the cluster's max_workers {cluster_max}{pod}; "
            f"the launcher never starts more than {cluster_max}",
        )


def launcher_problems(data: dict[str, Any]) -> Iterator[Problem]:
    cluster_max = _int(data.get("max_workers"))
    for name, node in data["available_node_types"].items():
        if not isinstance(node, dict):
            continue
        config = node.get("node_config")
        if not isinstance(config, dict) or not ({"acceleratorType", "acceleratorConfig"} & config.keys()):
            continue
        st, problem = _shape(str(name), config)
        if problem is not None:
            yield problem
        if st is None:
            continue
        yield from _runtime(str(name), config, st)
        yield from _resources(str(name), node, st)
        yield from _workers(str(name), node, st, cluster_max)
