"""The fleet spec: a short YAML file describing pools of TPU slices, tenants and add-ons.

``load_spec(text, file)`` parses and validates it and returns a :class:`FleetSpec`; ``read_spec(path)``
is the thin file-reading wrapper. Every problem raises :class:`~tpufleet.errors.SpecError` with the
file, line and dotted field (``pools[0].type``), and a "did you mean" where one helps. Pydantic checks
shapes and types (unknown fields are errors); :func:`_semantic_problems` checks what needs the
catalog or several fields at once.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator
from functools import cache
from pathlib import Path as FilePath
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from tpufleet import catalog as cat
from tpufleet._yamlpos import Document, Path, dotted, load_documents, read_yaml
from tpufleet.errors import InputError, SpecError, closest, suggest, unknown_field

__all__ = [
    "AutoscalingSpec",
    "FleetSpec",
    "GceSpec",
    "HeadSpec",
    "MonitoringSpec",
    "NetworkPolicySpec",
    "PoolSpec",
    "PriceSpec",
    "RaySpec",
    "ServiceAccountSpec",
    "TenantSpec",
    "load_spec",
    "read_spec",
]

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# KubeRay v1.7 admits a RayCluster name only as a DNS-1035 label of <= 53 characters and a RayJob name of
# <= 47; the RayJob is "<name>-job", so a fleet name has at most 43.
FLEET_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,41}[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
QUANTITY = re.compile(r"^(\d+(\.\d*)?|\.\d+)([KMGTPE]i|[numkMGTPE])?$")
GSA = re.compile(r"^[a-z][-a-z0-9]{4,28}[a-z0-9]@[-a-z0-9.]+\.gserviceaccount\.com$")
_GEN_NAMES = [g.name for g in cat.GENERATIONS]
RAY_VERSION = re.compile(r"^\d+\.\d+\.\d+$")


def _to_str(value: Any) -> Any:
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


Quantity = Annotated[str, BeforeValidator(_to_str)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RaySpec(_Model):
    version: str = "2.60.0"
    image: str | None = None

    @property
    def image_ref(self) -> str:
        return self.image or f"rayproject/ray:{self.version}-py311"


class HeadSpec(_Model):
    cpu: Quantity = "4"
    memory: Quantity = "16Gi"


class PoolSpec(_Model):
    name: str
    type: str | None = None
    generation: str | None = None
    topology: str | None = None
    machine_type: str | None = None
    # At most cat.MAX_SLICE_COUNT, as in a slice list: a billion slices rendered into a RayCluster
    # that lint passed, and past 2**31 the API server refuses KubeRay's int32 replicas at apply time.
    slices: int = Field(default=1, ge=0, le=cat.MAX_SLICE_COUNT)
    min_slices: int | None = Field(default=None, ge=0, le=cat.MAX_SLICE_COUNT)
    max_slices: int | None = Field(default=None, ge=0, le=cat.MAX_SLICE_COUNT)
    spot: bool = False
    # tpufleet's autoscaler (`serve --fleet`) keeps this many slices of the type free beyond the
    # queue's demand, so arriving jobs need not wait for a slice to be made
    spare_slices: int = Field(default=0, ge=0, le=cat.MAX_SLICE_COUNT)
    cpu: Quantity | None = None  # per host (pod / TPU VM), requests = limits
    memory: Quantity | None = None

    @property
    def slice_type(self) -> cat.SliceType:
        return _resolve(self.type, self.generation, self.topology, self.machine_type)

    @property
    def min_count(self) -> int:
        return self.slices if self.min_slices is None else self.min_slices

    @property
    def max_count(self) -> int:
        return self.slices if self.max_slices is None else self.max_slices


class AutoscalingSpec(_Model):
    enabled: bool = False
    idle_timeout_s: int = Field(default=60, ge=0)
    upscaling: Literal["Conservative", "Default", "Aggressive"] = "Default"
    # Jobs beyond their tenant's quota may make slices out of quota the other tenants leave unused
    # (tpufleet's own autoscaler, `serve --fleet`; KubeRay's autoscaler knows no tenants).
    borrowing: bool = True


class TenantSpec(_Model):
    name: str
    quota: dict[str, int] = Field(default_factory=dict)  # generation -> chips
    weight: float = Field(default=1.0, gt=0)


class MonitoringSpec(_Model):
    enabled: bool = False
    namespace: str | None = None  # where Prometheus runs; default: the fleet's namespace
    prometheus_labels: dict[str, str] = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "prometheus"}
    )


class NetworkPolicySpec(_Model):
    enabled: bool = False
    operator_namespace: str = "default"  # where kuberay-operator runs; it calls the dashboard port


class ServiceAccountSpec(_Model):
    name: str
    gcp_service_account: str | None = None


class GceSpec(_Model):
    project_id: str
    zone: str
    head_machine_type: str = "n2-standard-8"
    disk_size_gb: int = Field(default=100, ge=10)

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]


class PriceSpec(_Model):
    """One generation's prices in USD per chip-hour (``pricing.py``); a field not given keeps the
    shipped value, and a price nobody gives stays unknown (never zero)."""

    on_demand: float | None = Field(default=None, ge=0)
    spot: float | None = Field(default=None, ge=0)
    source: str | None = None
    date: str | None = None
    region: str | None = None


class FleetSpec(_Model):
    name: str
    namespace: str = "default"
    ray: RaySpec = Field(default_factory=RaySpec)
    head: HeadSpec = Field(default_factory=HeadSpec)
    pools: list[PoolSpec] = Field(min_length=1)
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    tenants: list[TenantSpec] = Field(default_factory=list)
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec)
    network_policy: NetworkPolicySpec = Field(default_factory=NetworkPolicySpec)
    service_account: ServiceAccountSpec | None = None
    gce: GceSpec | None = None
    pricing: dict[str, PriceSpec] = Field(default_factory=dict)  # generation -> prices (pricing.py)


@cache
def _resolve(
    type_: str | None, generation: str | None, topology: str | None, machine_type: str | None
) -> cat.SliceType:
    if type_:
        st = cat.slice_type(type_)
        return cat.find(st.generation.name, st.topology, machine_type) if machine_type else st
    if generation and topology:
        return cat.find(generation, topology, machine_type)
    raise SpecError("a pool names its slice by type (v4-16) or by generation + topology (v6e, 4x4)")


# --- loading ----------------------------------------------------------------------------------


def read_spec(path: str | FilePath) -> FleetSpec:
    """Read and validate a spec file; an unreadable file is an :class:`InputError`."""
    try:
        text = read_yaml(path)
    except (OSError, UnicodeDecodeError) as err:
        why = getattr(err, "strerror", None) or err
        raise InputError(f"{path}: cannot read the fleet spec: {why}") from None
    return load_spec(text, str(path))


def load_spec(text: str, file: str = "<spec>") -> FleetSpec:
    """Parse and validate a fleet spec; its problems raise one :class:`SpecError`, located at the
    first, one line per problem."""
    docs = load_documents(text, file)
    if len(docs) != 1 or not isinstance(docs[0].data, dict):
        raise SpecError("a fleet spec is one YAML mapping with name, pools, ...", file=file, line=1)
    doc = docs[0]
    try:
        spec = FleetSpec.model_validate(doc.data)
    except ValidationError as err:
        problems = [_from_pydantic(e) for e in err.errors()]
        _raise_problems(problems, doc, file)
        raise  # unreachable: _raise_problems always raises
    _raise_problems(list(_semantic_problems(spec)), doc, file)
    return spec


SHOWN_PROBLEMS = 5  # a spec's problems listed in one error, one line each; past it, how many more


def _raise_problems(problems: list[tuple[Path, str]], doc: Document, file: str) -> None:
    """The spec's problems as one SpecError, located at the first (its ``file``, ``line`` and
    ``field``), each problem on its own line (at most ``SHOWN_PROBLEMS``, then how many more)."""
    if not problems:
        return
    errors = [
        SpecError(message, file=file, line=doc.where(path)[0], field=dotted(path) or None)
        for path, message in problems[:SHOWN_PROBLEMS]
    ]
    first, rest = errors[0], [str(e) for e in errors[1:]]
    if len(problems) > SHOWN_PROBLEMS:
        more = len(problems) - SHOWN_PROBLEMS
        rest.append(f"(and {more} more problem{'s' if more > 1 else ''})")
    if rest:
        first.message = "\n".join([first.message, *rest])
        first.args = (first.message,)
    raise first


def _from_pydantic(error: Any) -> tuple[Path, str]:
    loc: Path = tuple(error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        return loc, unknown_field(loc[-1], _model_at(loc[:-1]).model_fields)
    if kind == "missing":
        return loc, "required field is missing"
    return loc, f"{error['msg']} (got {error.get('input')!r})"


def _model_at(loc: Path) -> type[BaseModel]:
    """The pydantic model that validates the mapping at ``loc`` (for the list of valid fields)."""
    model: type[BaseModel] = FleetSpec
    for part in loc:
        if isinstance(part, int) or part not in model.model_fields:
            continue  # a list index, or a key of a mapping such as pricing.v4
        annotation = model.model_fields[part].annotation
        for candidate in (annotation, *typing.get_args(annotation)):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                model = candidate
                break
    return model


# --- semantic checks --------------------------------------------------------------------------


def _semantic_problems(spec: FleetSpec) -> Iterator[tuple[Path, str]]:
    yield from _names(spec)
    yield from _pools(spec)
    yield from _tenants(spec)
    for gen_name in spec.pricing:
        if gen_name not in _GEN_NAMES and not _is_generation(gen_name):
            yield (
                ("pricing", gen_name),
                f"{gen_name!r} is not a TPU generation{suggest(closest(gen_name, _GEN_NAMES) or _GEN_NAMES)}",
            )
    if spec.ray.version and not RAY_VERSION.match(spec.ray.version):
        yield ("ray", "version"), f"{spec.ray.version!r} is not a Ray release such as 2.60.0"
    for field in ("cpu", "memory"):
        yield from _quantity(("head", field), getattr(spec.head, field), field)
    sa = spec.service_account
    if sa and not DNS_SUBDOMAIN.match(sa.name):
        yield ("service_account", "name"), f"{sa.name!r} is not a valid Kubernetes name (DNS-1123 subdomain)"
    if sa and sa.gcp_service_account and not GSA.match(sa.gcp_service_account):
        yield (
            ("service_account", "gcp_service_account"),
            f"{sa.gcp_service_account!r} is not a Google service account email "
            "such as ray-tpu@my-project.iam.gserviceaccount.com",
        )


def _names(spec: FleetSpec) -> Iterator[tuple[Path, str]]:
    named: list[tuple[Path, str]] = [(("name",), spec.name), (("namespace",), spec.namespace)]
    named += [(("pools", i, "name"), p.name) for i, p in enumerate(spec.pools)]
    named += [(("tenants", i, "name"), t.name) for i, t in enumerate(spec.tenants)]
    if spec.monitoring.namespace is not None:  # both land in NetworkPolicy namespace selectors
        named.append((("monitoring", "namespace"), spec.monitoring.namespace))
    named.append((("network_policy", "operator_namespace"), spec.network_policy.operator_namespace))
    if not FLEET_NAME.match(spec.name) and DNS_LABEL.match(spec.name):
        yield (
            ("name",),
            (
                f"{spec.name!r} cannot name a RayCluster: KubeRay wants a DNS-1035 label (starting with a "
                "letter) of at most 43 characters here, as the RayJob is <name>-job and may have 47"
            ),
        )
    for path, value in named:
        if not DNS_LABEL.match(value):
            fixed = re.sub(r"[^a-z0-9-]+", "-", value.lower()).strip("-")[:63] or "a"
            yield (
                path,
                (
                    f"{value!r} is not a valid name: lower-case letters, digits and '-', at most 63 "
                    f"characters, starting and ending with a letter or digit (DNS-1123 label); e.g. {fixed!r}"
                ),
            )
    lists: tuple[tuple[str, list[str]], ...] = (
        ("pools", [p.name for p in spec.pools]),
        ("tenants", [t.name for t in spec.tenants]),
    )
    for key, names in lists:
        for i, name in enumerate(names):
            if name in names[:i]:
                yield (key, i, "name"), f"{name!r} is used twice; {key[:-1]} names must be unique"


def _pools(spec: FleetSpec) -> Iterator[tuple[Path, str]]:
    for i, pool in enumerate(spec.pools):
        at: Path = ("pools", i)
        if pool.type and (pool.generation or pool.topology):
            yield (*at, "type"), "give either type (v4-16) or generation + topology (v4, 2x2x2), not both"
            continue
        if not pool.type and not (pool.generation and pool.topology):
            missing = "topology" if pool.generation else "generation" if pool.topology else "type"
            yield (*at, missing), "a pool needs type (v4-16) or generation + topology (v6e, 4x4)"
            continue
        try:
            pool.slice_type  # noqa: B018  resolves through the catalog, raising SpecError
        except SpecError as err:
            bad = "type" if pool.type else "machine_type" if " cannot run " in err.message else "topology"
            if pool.generation and "generation" in err.message:
                bad = "generation"
            yield (*at, bad), err.message
            continue
        yield from _pool_counts(spec, pool, at)
        for field in ("cpu", "memory"):
            yield from _quantity((*at, field), getattr(pool, field), field)


def _pool_counts(spec: FleetSpec, pool: PoolSpec, at: Path) -> Iterator[tuple[Path, str]]:
    lo, n, hi = pool.min_count, pool.slices, pool.max_count
    if not lo <= n <= hi:
        field = "min_slices" if lo > n else "max_slices"
        yield (*at, field), f"need min_slices <= slices <= max_slices; got {lo} <= {n} <= {hi}"
    elif hi < 1:
        yield (*at, "max_slices"), "max_slices must be at least 1, or the pool can never hold a slice"
    elif lo != hi and not spec.autoscaling.enabled:
        yield (
            (*at, "min_slices"),
            (
                f"min_slices ({lo}) and max_slices ({hi}) differ but autoscaling.enabled is false; "
                "enable autoscaling or drop min_slices/max_slices"
            ),
        )


def _tenants(spec: FleetSpec) -> Iterator[tuple[Path, str]]:
    all_resolve = all(_resolves(p) for p in spec.pools)  # else the pool's own error comes first
    offered = sorted({p.slice_type.generation.name for p in spec.pools if _resolves(p)})
    for i, tenant in enumerate(spec.tenants):
        for gen_name, chips in tenant.quota.items():
            at: Path = ("tenants", i, "quota", gen_name)
            try:
                gen = cat.generation(gen_name)
            except SpecError:
                near = closest(gen_name, [g.name for g in cat.GENERATIONS])
                yield (
                    at,
                    f"{gen_name!r} is not a TPU generation{suggest(near or _GEN_NAMES)}",
                )
                continue
            if all_resolve and gen.name not in offered:
                yield (
                    at,
                    f"no pool offers {gen.name}; quota generations must be among the pools' "
                    f"({', '.join(offered)})",
                )
            elif chips < 0:
                yield at, f"quota is counted in chips and must be >= 0; got {chips}"


def _is_generation(name: str) -> bool:
    try:
        cat.generation(name)
    except SpecError:
        return False
    return True


def _resolves(pool: PoolSpec) -> bool:
    try:
        pool.slice_type  # noqa: B018
    except SpecError:
        return False
    return True


def _quantity(path: Path, value: str | None, kind: str) -> Iterator[tuple[Path, str]]:
    if value is None:
        return
    if not QUANTITY.match(value) or float(re.sub(r"[^\d.]", "", value) or 0) <= 0:
        example = "16Gi (or 16G)" if kind == "memory" else "4 (or 500m)"
        fixed = re.sub(r"^(\d+(?:\.\d+)?)\s*([KMGTPE])i?B$", r"\1\2i", value.strip(), flags=re.I)
        hint = f"; did you mean {fixed}?" if fixed != value and QUANTITY.match(fixed) else f"; e.g. {example}"
        yield path, f"{value!r} is not a positive Kubernetes {kind} quantity{hint}"
