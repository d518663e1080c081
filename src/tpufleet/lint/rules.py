"""The TPU rules: what the GKE TPU webhook, the scheduler and ``ray start`` would reject at run time.

Each rule is a function ``(group) -> problems``; a problem is ``(code, path, message)`` where the
message says what is wrong and what would be right. The TPU facts come from :mod:`tpufleet.catalog`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tpufleet import catalog as cat
from tpufleet._yamlpos import Path
from tpufleet.errors import SpecError, closest
from tpufleet.lint.ray_start_params import RAY_START_PARAMS

__all__ = ["GROUP_RULES", "Group", "Problem", "api_version_problems", "groups_of"]

Problem = tuple[str, Path, str]

ACCEL = "cloud.google.com/gke-tpu-accelerator"
TOPO = "cloud.google.com/gke-tpu-topology"
TPU = "google.com/tpu"
WEBHOOK_ENV = ("TPU_WORKER_HOSTNAMES", "TPU_WORKER_ID", "TPU_NAME")


@dataclass(frozen=True)
class Group:
    """One head or worker group of a RayCluster spec, wherever that spec sits in the document."""

    path: Path
    data: dict[str, Any]
    worker: bool

    @property
    def pod(self) -> dict[str, Any]:
        template = self.data.get("template")
        spec = template.get("spec") if isinstance(template, dict) else None
        return spec if isinstance(spec, dict) else {}

    @property
    def pod_path(self) -> Path:
        return (*self.path, "template", "spec")

    @property
    def selector(self) -> dict[str, Any]:
        sel = self.pod.get("nodeSelector")
        return sel if isinstance(sel, dict) else {}

    def containers(self) -> Iterator[tuple[Path, dict[str, Any]]]:
        for key in ("initContainers", "containers"):
            items = self.pod.get(key)
            for i, c in enumerate(items if isinstance(items, list) else []):
                if isinstance(c, dict):
                    yield (*self.pod_path, key, i), c

    def tpu_values(self) -> list[tuple[Path, Any, Any]]:
        """``(container path, requests value, limits value)`` for containers that mention google.com/tpu."""
        out = []
        for path, c in self.containers():
            res = c.get("resources")
            res = res if isinstance(res, dict) else {}
            req = res["requests"].get(TPU) if isinstance(res.get("requests"), dict) else None
            lim = res["limits"].get(TPU) if isinstance(res.get("limits"), dict) else None
            if req is not None or lim is not None:
                out.append((path, req, lim))
        return out

    def pod_chips(self, prefer_limits: bool = False) -> tuple[Path, int] | None:
        """The pod's ``google.com/tpu`` count as the GKE TPU webhook and the scheduler see it: summed over
        the (non-init) containers, each container's requests or else its limits (``prefer_limits``:
        the other way round, the reading TPF006's fix may choose); None when no container asks or a
        value is not an integer. The path is the first asking container's."""
        total, first = 0, None
        for path, req, lim in self.tpu_values():
            if path[-2] != "containers":
                continue
            one, other = (lim, req) if prefer_limits else (req, lim)
            chips = _int(one if one is not None else other)
            if chips is None:
                return None
            total += chips
            first = first or path
        return (first, total) if first else None

    @property
    def is_tpu(self) -> bool:
        return bool(self.tpu_values()) or any(
            str(k).startswith("cloud.google.com/gke-tpu") for k in self.selector
        )


def groups_of(cluster_spec: Any, base: Path) -> list[Group]:
    """The head and worker groups of the RayCluster spec found at ``base``."""
    if not isinstance(cluster_spec, dict):
        return []
    out = []
    head = cluster_spec.get("headGroupSpec")
    if isinstance(head, dict):
        out.append(Group((*base, "headGroupSpec"), head, worker=False))
    workers = cluster_spec.get("workerGroupSpecs")
    for i, group in enumerate(workers if isinstance(workers, list) else []):
        if isinstance(group, dict):
            out.append(Group((*base, "workerGroupSpecs", i), group, worker=True))
    return out


def api_version_problems(doc: dict[str, Any]) -> Iterator[Problem]:
    version = str(doc.get("apiVersion", ""))
    if version.startswith("ray.io/") and version != "ray.io/v1":
        yield (
            "TPF001",
            ("apiVersion",),
            (
                f"apiVersion {version} is deprecated (KubeRay stores and reconciles ray.io/v1 only); "
                "use apiVersion: ray.io/v1"
            ),
        )


def _int(value: Any) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None


def _shapes(group: Group) -> list[cat.SliceType]:
    """Every slice type the group's selectors allow (one per host shape), or [] if unknown."""
    acc, topo = group.selector.get(ACCEL), group.selector.get(TOPO)
    if not acc or not topo:
        return []
    try:
        default = cat.from_gke(str(acc), str(topo))
    except SpecError:
        return []
    gen = default.generation
    shapes = []
    for mt in gen.machine_types.values():
        try:
            shapes.append(cat.find(gen.name, default.topology, mt))
        except SpecError:
            continue
    return sorted(shapes, key=lambda st: st != default)


def _selector_labels(group: Group) -> Iterator[Problem]:
    at = (*group.pod_path, "nodeSelector")
    for key, value in group.selector.items():
        key = str(key)
        if key.startswith("cloud.google.com/gke-tpu") and key not in (ACCEL, TOPO):
            yield (
                "TPF002",
                (*at, key),
                (
                    f"{key} is not a GKE TPU node label; GKE labels TPU nodes with {ACCEL} "
                    f"(e.g. tpu-v4-podslice) and {TOPO} (e.g. 2x2x2): select on both instead"
                ),
            )
        elif key == "cloud.google.com/gke-accelerator" and "tpu" in str(value).lower():
            yield (
                "TPF002",
                (*at, key),
                (f"{key} is the GPU label; for TPUs select {ACCEL}: {value} and {TOPO} instead"),
            )


def _selector_presence(group: Group) -> Iterator[Problem]:
    if not group.is_tpu:
        return
    at = (*group.pod_path, "nodeSelector")
    for key, example in ((ACCEL, "tpu-v6e-slice"), (TOPO, "4x4")):
        if key not in group.selector:
            yield (
                "TPF003",
                (*at, key),
                (
                    f"TPU group without the {key} node selector; the pods cannot land on a TPU node pool. "
                    f"Add {key}: <value> (e.g. {example})"
                ),
            )
    if group.selector.get(ACCEL) and not group.tpu_values():
        yield (
            "TPF003",
            (*group.pod_path, "containers"),
            (
                f"the group selects TPU nodes but no container requests {TPU}; "
                f"set resources.requests and limits {TPU}: <chips per host>"
            ),
        )


def _shape_exists(group: Group) -> Iterator[Problem]:
    acc, topo = group.selector.get(ACCEL), group.selector.get(TOPO)
    if not acc or not topo:
        return
    try:
        cat.from_gke(str(acc), str(topo))
    except SpecError as err:
        key = TOPO if "topology" in err.message else ACCEL
        yield "TPF004", (*group.pod_path, "nodeSelector", key), f"{acc} with topology {topo}: {err.message}"


def _chips_per_host(group: Group) -> Iterator[Problem]:
    """Per pod, not per container: a tpu7x pod may split its chips over one container per chiplet."""
    shapes = _shapes(group)
    acc = str(group.selector.get(ACCEL, ""))
    gen = next((g for g in cat.GENERATIONS if g.gke_accelerator == acc), None)
    if gen is None:
        return
    valid = sorted({st.chips_per_host for st in shapes}) if shapes else sorted(gen.machine_types)
    where = f"{gen.name} {shapes[0].topology}" if shapes else gen.name
    use = f"use {' or '.join(map(str, valid))} (one pod per TPU VM host, all of its chips)"
    asking = [(p, r, lim) for p, r, lim in group.tpu_values() if p[-2] == "containers"]
    pod = group.pod_chips()
    if len(asking) > 1 and pod is not None:
        if pod[1] not in valid:
            yield (
                "TPF005",
                (*group.pod_path, "containers"),
                f"the containers ask for {pod[1]} {TPU} in all, not a chips-per-host value of {where}; {use}",
            )
        return
    for path, req, lim in group.tpu_values():
        for kind, value in (("requests", req), ("limits", lim)):
            if value is not None and _int(value) not in valid:
                yield (
                    "TPF005",
                    (*path, "resources", kind, TPU),
                    f"{TPU}: {value} is not a chips-per-host value of {where}; {use}",
                )


def _requests_limits(group: Group) -> Iterator[Problem]:
    for path, req, lim in group.tpu_values():
        if req is not None and lim is None:
            yield (
                "TPF006",
                (*path, "resources", "limits"),
                (
                    f"{TPU} requests {req} without limits; extended resources need limits: "
                    f"set limits {TPU}: {req}"
                ),
            )
        elif req is not None and _int(req) != _int(lim):
            yield (  # at the limits: TPF005 reports a bad requests value on the requests line
                "TPF006",
                (*path, "resources", "limits", TPU),
                (
                    f"{TPU} limits ({lim}) differ from requests ({req}); TPU chips cannot be shared: "
                    f"set both to the chips per host"
                ),
            )


def _num_of_hosts(group: Group) -> Iterator[Problem]:
    shapes = _shapes(group)
    if not group.worker or not shapes:
        return
    # Requests and limits that differ (TPF006) give two readings of the chips per host; numOfHosts
    # that fits either one is left to TPF006, so the two findings never ask for opposite fixes.
    readings = [group.pod_chips(), group.pod_chips(prefer_limits=True)]
    fits = [
        next((st for st in shapes if st.chips_per_host == (pod[1] if pod else 0)), shapes[0])
        for pod in readings
    ]
    shape = fits[0]
    expected = shape.hosts
    have = group.data.get("numOfHosts")
    if have is None and all(st.hosts == 1 for st in fits):
        return
    if have is None or all(_int(have) != st.hosts for st in fits):
        what = "missing" if have is None else f"{have}"
        yield (
            "TPF007",
            (*group.path, "numOfHosts"),
            (
                f"numOfHosts is {what} but a {shape.accelerator_type} slice ({shape.topology}, "
                f"{shape.chips_per_host} chips per host) has {expected} hosts; set numOfHosts: {expected} "
                "(the TPU webhook rejects a group whose pods do not fill the topology)"
            ),
        )


def _webhook_env(group: Group) -> Iterator[Problem]:
    for path, container in group.containers():
        env = container.get("env")
        for i, var in enumerate(env if isinstance(env, list) else []):
            name = var.get("name") if isinstance(var, dict) else None
            if name in WEBHOOK_ENV:
                yield (
                    "TPF008",
                    (*path, "env", i),
                    (
                        f"{name} is hard-coded; the GKE TPU webhook sets it per pod (a fixed value is wrong "
                        "for every replica after the first): remove it and install the webhook"
                    ),
                )


# Keys `ray start` has but KubeRay v1.7's validation rejects (the RayCluster is never reconciled).
KUBERAY_REJECTS = {
    "labels": "KubeRay rejects rayStartParams['labels']; put the labels in the group's labels field",
    "redis-username": "KubeRay rejects redis-username here; use gcsFaultToleranceOptions.redisUsername",
}
_RESOURCE_PARAMS = ("num-cpus", "num-gpus", "memory", "resources")


def _ray_start_params(group: Group) -> Iterator[Problem]:
    params = group.data.get("rayStartParams")
    params = params if isinstance(params, dict) else {}
    at = (*group.path, "rayStartParams")
    for key in params:
        name = str(key)
        if name in KUBERAY_REJECTS:
            yield "TPF010", (*at, name), f"rayStartParams key {name!r}: {KUBERAY_REJECTS[name]}"
            continue
        if name in RAY_START_PARAMS:
            continue
        if name in ("num-tpus", "num_tpus"):
            hint = 'Ray detects TPU chips itself; to override, use resources: \'"{\\"TPU\\": 4}"\''
        else:
            near = closest(name.replace("_", "-").lstrip("-"), sorted(RAY_START_PARAMS))
            hint = f"did you mean {' or '.join(near)}?" if near else "see `ray start --help`"
        yield (
            "TPF010",
            (*at, name),
            (f"rayStartParams key {name!r} is not a `ray start` option (the pod would crash-loop); {hint}"),
        )
    both = [k for k in _RESOURCE_PARAMS if params.get(k)]
    if both and group.data.get("resources"):
        yield (
            "TPF010",
            (*at, both[0]),
            (
                f"rayStartParams {both[0]!r} and the group's resources field both set Ray resources; "
                "KubeRay rejects the RayCluster: use only one of them"
            ),
        )


GROUP_RULES: tuple[Callable[[Group], Iterator[Problem]], ...] = (
    _selector_labels,
    _selector_presence,
    _shape_exists,
    _chips_per_host,
    _requests_limits,
    _num_of_hosts,
    _webhook_env,
    _ray_start_params,
)
