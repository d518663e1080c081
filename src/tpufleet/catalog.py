"""TPU facts as value types: generations, topologies and the slice types built from them.

This module is the single source of truth for what a TPU slice is. Everything else (the emulator,
the renderers, the linter, the scheduler) asks it instead of parsing names.

Sources, per generation (Google Cloud documentation):

- v4: https://cloud.google.com/tpu/docs/v4 and https://cloud.google.com/tpu/docs/types-topologies
  ("AxBxC with A<=B<=C, all <= 4 or all multiples of 4"; 4,096-chip pod; 2 TensorCores, 32 GiB
  HBM2 and 275 bf16 TFLOP/s per chip; GKE: ``tpu-v4-podslice`` on ``ct4p-hightpu-4t``).
- v5e: https://cloud.google.com/tpu/docs/v5e (1 TensorCore, 16 GiB, 197 TFLOP/s per chip;
  topologies 1x1 .. 16x16; GKE: ``tpu-v5-lite-podslice`` on ``ct5lp-hightpu-1t/4t/8t``).
- v5p: https://cloud.google.com/tpu/docs/v5p (2 TensorCores, 95 GiB, 459 TFLOP/s per chip;
  8,960-chip pod, 16x20x28; GKE: ``tpu-v5p-slice`` on ``ct5p-hightpu-4t``).
- v6e (Trillium): https://cloud.google.com/tpu/docs/v6e (1 TensorCore, 32 GiB, 918 TFLOP/s per
  chip; topologies 1x1 .. 16x16; GKE: ``tpu-v6e-slice`` on ``ct6e-standard-1t/4t/8t``).
- tpu7x (Ironwood): https://cloud.google.com/tpu/docs/tpu7x (2 TensorCores, 192 GiB HBM3E,
  2,307 bf16 TFLOP/s per chip; 9,216-chip superpod; GKE: ``tpu7x`` on ``tpu7x-standard-1t/4t``).

vCPUs per host (``Generation.host_vcpus``, by machine type), from the "VM types" / system
architecture tables of the same pages and Compute Engine's TPU machine types
(https://cloud.google.com/compute/docs/tpus/tpu-machines): v4 ``ct4p-hightpu-4t`` 240; v5e
``ct5lp-hightpu-1t/4t/8t`` 24/112/224; v5p ``ct5p-hightpu-4t`` 208; v6e ``ct6e-standard-1t/4t/8t``
44/180/180; tpu7x ``tpu7x-standard-4t`` 224 (``-1t`` not listed there: unknown here).

GCE accelerator types count TensorCores for v4, v5p and tpu7x (``v4-16`` is 8 chips) and chips for
v5e and v6e (``v6e-16`` is 16 chips). GKE and Ray call v5e ``v5litepod``; Ray calls tpu7x ``v7x``.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache

from tpufleet.errors import SpecError, closest, suggest

__all__ = [
    "GENERATIONS",
    "MAX_SLICE_COUNT",
    "RUNTIME_VERSIONS",
    "Generation",
    "SliceType",
    "Topology",
    "all_slice_types",
    "find",
    "from_gke",
    "generation",
    "parse_slice_list",
    "slice_type",
]


# TPU software (runtime) versions for JAX/PyTorch, per generation (what ``render --target gce``
# writes and ``lint`` checks a launcher config's runtimeVersion against):
# https://cloud.google.com/tpu/docs/runtimes (v4, v5e, v5p, v6e) and
# https://cloud.google.com/tpu/docs/tpu7x (Ironwood: "--version=v2-alpha-tpu7-ubuntu2404").
RUNTIME_VERSIONS: dict[str, str] = {
    "v4": "tpu-ubuntu2204-base",
    "v5e": "v2-alpha-tpuv5-lite",
    "v5p": "v2-alpha-tpuv5",
    "v6e": "v2-alpha-tpuv6e",
    "tpu7x": "v2-alpha-tpu7-ubuntu2404",
}


@dataclass(frozen=True, order=True)
class Topology:
    """A chip grid such as ``2x2x2`` (3-D: v4, v5p, tpu7x) or ``4x4`` (2-D: v5e, v6e)."""

    dims: tuple[int, ...]

    @classmethod
    def parse(cls, text: str) -> Topology:
        cleaned = str(text).strip().lower()
        if not re.fullmatch(r"[1-9]\d*(x[1-9]\d*){1,2}", cleaned):
            raise SpecError(
                f"{text!r} is not a topology; expected AxB or AxBxC, e.g. 4x4 or 2x2x2",
                field="topology",
                value=text,
                locate=False,
            )
        return cls(tuple(int(d) for d in cleaned.split("x")))

    @property
    def chips(self) -> int:
        return math.prod(self.dims)

    @property
    def rank(self) -> int:
        return len(self.dims)

    def __str__(self) -> str:
        return "x".join(str(d) for d in self.dims)


@dataclass(frozen=True)
class Generation:
    """One TPU generation and the hardware facts that do not depend on the slice size."""

    name: str  # tpufleet's and Google's marketing name: v4, v5e, v5p, v6e, tpu7x
    gce_prefix: str  # accelerator-type prefix on GCE: v4, v5litepod, v5p, v6e, tpu7x
    ray_name: str  # what Ray's TPU helpers call it: v4, v5litepod, v5p, v6e, v7x
    cores_per_chip: int
    hbm_gib_per_chip: int
    peak_bf16_tflops_per_chip: float
    gke_accelerator: str  # node label cloud.google.com/gke-tpu-accelerator
    machine_types: dict[int, str] = field(hash=False, compare=False)  # chips per host -> machine type
    topologies: tuple[Topology, ...] = field(hash=False, compare=False)
    doc_url: str = field(default="", compare=False)
    # vCPUs of one host (TPU VM), by chips per host; sources in the module docstring
    host_vcpus: dict[int, int] = field(default_factory=dict, hash=False, compare=False)

    @property
    def size_counts_cores(self) -> bool:
        """GCE accelerator types count TensorCores (v4, v5p, tpu7x) rather than chips (v5e, v6e)."""
        return self.cores_per_chip == 2

    @property
    def ray_accelerator_type(self) -> str:
        """The Ray accelerator resource/label value, e.g. ``TPU-V4``, ``TPU-V6E``, ``TPU-V7X``."""
        return f"TPU-{self.ray_name.upper()}"

    def size_of(self, chips: int) -> int:
        return chips * self.cores_per_chip if self.size_counts_cores else chips

    def accelerator_type(self, chips: int) -> str:
        return f"{self.gce_prefix}-{self.size_of(chips)}"


def _cubes(max_dims: tuple[int, int, int], max_chips: int) -> tuple[Topology, ...]:
    """Every 3-D topology AxBxC with A<=B<=C, each a multiple of 4, within the pod's bounds.

    Google's rule for v4/v5p/tpu7x slices of 64 chips and more; the small shapes below 4x4x4 are
    listed by hand in ``_SMALL_3D`` because they follow the "all dims <= 4" branch of the rule.
    """
    steps = [range(4, m + 1, 4) for m in max_dims]
    shapes = {tuple(sorted(dims)) for dims in itertools.product(*steps) if math.prod(dims) <= max_chips}
    return tuple(Topology(s) for s in sorted(shapes, key=lambda d: (math.prod(d), d)))


_SMALL_3D = tuple(Topology.parse(t) for t in ("2x2x1", "2x2x2", "2x2x4", "2x4x4"))
_FLAT = tuple(Topology.parse(t) for t in ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"))

GENERATIONS: tuple[Generation, ...] = (
    Generation(
        "v4",
        "v4",
        "v4",
        2,
        32,
        275.0,
        "tpu-v4-podslice",
        {4: "ct4p-hightpu-4t"},
        _SMALL_3D + _cubes((16, 16, 16), 4096),
        "https://cloud.google.com/tpu/docs/v4",
        {4: 240},
    ),
    Generation(
        "v5e",
        "v5litepod",
        "v5litepod",
        1,
        16,
        197.0,
        "tpu-v5-lite-podslice",
        {1: "ct5lp-hightpu-1t", 4: "ct5lp-hightpu-4t", 8: "ct5lp-hightpu-8t"},
        _FLAT,
        "https://cloud.google.com/tpu/docs/v5e",
        {1: 24, 4: 112, 8: 224},
    ),
    Generation(
        "v5p",
        "v5p",
        "v5p",
        2,
        95,
        459.0,
        "tpu-v5p-slice",
        {4: "ct5p-hightpu-4t"},
        _SMALL_3D + _cubes((16, 20, 28), 8960),
        "https://cloud.google.com/tpu/docs/v5p",
        {4: 208},
    ),
    Generation(
        "v6e",
        "v6e",
        "v6e",
        1,
        32,
        918.0,
        "tpu-v6e-slice",
        {1: "ct6e-standard-1t", 4: "ct6e-standard-4t", 8: "ct6e-standard-8t"},
        _FLAT,
        "https://cloud.google.com/tpu/docs/v6e",
        {1: 44, 4: 180, 8: 180},
    ),
    Generation(
        "tpu7x",
        "tpu7x",
        "v7x",
        2,
        192,
        2307.0,
        "tpu7x",
        {1: "tpu7x-standard-1t", 4: "tpu7x-standard-4t"},
        (Topology.parse("1x1x1"), *_SMALL_3D, *_cubes((16, 24, 24), 9216)),
        "https://cloud.google.com/tpu/docs/tpu7x",
        {4: 224},
    ),
)

_ALIASES = {
    "v5litepod": "v5e",
    "v5lite": "v5e",
    "v5-lite": "v5e",
    "v7x": "tpu7x",
    "ironwood": "tpu7x",
    "trillium": "v6e",
    "tpu-v4": "v4",
    "tpu-v5e": "v5e",
    "tpu-v5p": "v5p",
    "tpu-v6e": "v6e",
    "tpu-v7x": "tpu7x",
    "tpu-v5litepod": "v5e",
}


def generation(name: str) -> Generation:
    """A generation by any of its names: ``v5e``, ``v5litepod``, ``TPU-V6E``, ``tpu7x``, ``v7x``."""
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    for gen in GENERATIONS:
        if gen.name == key:
            return gen
    names = [g.name for g in GENERATIONS]
    raise SpecError(
        f"{name!r} is not a TPU generation; valid: {', '.join(names)}",
        field="generation",
        value=name,
        choices=names,
        locate=False,
    )


@dataclass(frozen=True, order=True)
class SliceType:
    """One kind of slice: a generation, a topology and the host shape it runs on."""

    generation: Generation = field(compare=False)
    topology: Topology
    chips_per_host: int
    gen_name: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "gen_name", self.generation.name)

    @property
    def accelerator_type(self) -> str:
        return self.generation.accelerator_type(self.topology.chips)

    @property
    def chips(self) -> int:
        return self.topology.chips

    @property
    def hosts(self) -> int:
        return self.chips // self.chips_per_host

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1

    @property
    def machine_type(self) -> str:
        return self.generation.machine_types[self.chips_per_host]

    @property
    def chips_per_host_bounds(self) -> tuple[int, int, int]:
        """The chip grid of one host, x,y,z (``TPU_CHIPS_PER_HOST_BOUNDS``; GCE metadata ``tpu-env``
        ``CHIPS_PER_HOST_BOUNDS``): 1 chip ``1,1,1``, 4 chips ``2,2,1``, 8 chips (v5e/v6e) ``2,4,1``.
        A single-host slice's host holds the whole topology."""
        if not self.multi_host:
            return _bounds(self.topology.dims)
        return {1: (1, 1, 1), 4: (2, 2, 1), 8: (2, 4, 1)}[self.chips_per_host]

    @property
    def host_bounds(self) -> tuple[int, int, int]:
        """The grid of hosts, x,y,z (``TPU_HOST_BOUNDS``; ``tpu-env`` ``HOST_BOUNDS``): the topology
        divided by :attr:`chips_per_host_bounds`, e.g. ``1,1,2`` for v4-16 (2x2x2), ``2,2,1`` for
        v6e-16 (4x4), ``2,2,8`` for v4-256 (4x4x8)."""
        per_host = self.chips_per_host_bounds
        return _bounds(tuple(d // c for d, c in zip(_bounds(self.topology.dims), per_host, strict=True)))

    @property
    def vcpus_per_host(self) -> int | None:
        """Logical CPUs of one host of this slice (its machine type's vCPUs), None where not
        published (the emulator then uses its own default)."""
        return self.generation.host_vcpus.get(self.chips_per_host)

    @property
    def gke_accelerator(self) -> str:
        return self.generation.gke_accelerator

    @property
    def hbm_gib(self) -> int:
        return self.chips * self.generation.hbm_gib_per_chip

    @property
    def peak_bf16_tflops(self) -> float:
        return self.chips * self.generation.peak_bf16_tflops_per_chip

    @property
    def tensorcores(self) -> int:
        return self.chips * self.generation.cores_per_chip

    def to_dict(self) -> dict[str, object]:
        return {
            "accelerator_type": self.accelerator_type,
            "generation": self.generation.name,
            "topology": str(self.topology),
            "chips": self.chips,
            "hosts": self.hosts,
            "chips_per_host": self.chips_per_host,
            "tensorcores": self.tensorcores,
            "gke_accelerator": self.gke_accelerator,
            "machine_type": self.machine_type,
            "hbm_gib": self.hbm_gib,
            "peak_bf16_tflops": self.peak_bf16_tflops,
            "ray_accelerator_type": self.generation.ray_accelerator_type,
        }

    def __str__(self) -> str:
        return f"{self.accelerator_type} ({self.topology}, {self.hosts}x{self.machine_type})"


def _bounds(dims: tuple[int, ...]) -> tuple[int, int, int]:
    """A 2-D or 3-D grid as libtpu's x,y,z bounds (a 2-D topology has z = 1)."""
    x, y, z = (*dims, 1, 1)[:3]
    return (x, y, z)


def _host_shapes(gen: Generation, topo: Topology) -> list[int]:
    """Chips per host that GKE offers for this topology, the default (single-host when possible) first."""
    chips = topo.chips
    if chips in gen.machine_types and chips <= max(gen.machine_types):
        shapes = [chips]  # a single host holds the whole slice (1x1, 2x2, 2x4 on v5e/v6e; 2x2x1)
        if chips > 4 and 4 in gen.machine_types:
            shapes.append(4)  # 2x4 on v5e/v6e also runs as two 4-chip hosts
        return shapes
    return [4]


@cache
def all_slice_types() -> tuple[SliceType, ...]:
    """Every slice type of every generation, ordered by generation, then size."""
    return tuple(
        SliceType(gen, topo, cph)
        for gen in GENERATIONS
        for topo in gen.topologies
        for cph in _host_shapes(gen, topo)
    )


def _of(gen: Generation) -> Iterator[SliceType]:
    return (st for st in all_slice_types() if st.generation.name == gen.name)


def _cubeness(st: SliceType) -> tuple[int, int, int]:
    """Google's default shape for a chip count is the most cube-like; single-host shapes first."""
    return (max(st.topology.dims), -min(st.topology.dims), st.hosts)


def slice_type(accelerator_type: str) -> SliceType:
    """Look a slice type up by its GCE accelerator type, e.g. ``v4-16`` or ``v5litepod-16``.

    Where several topologies have the same size, the most cube-like one is Google's default; where
    a topology has several host shapes (``v6e-8``), the single-host one is.
    """
    text = str(accelerator_type).strip().lower()
    if text.startswith("tpu-"):
        text = text[4:]
    match = re.fullmatch(r"([a-z0-9]+?)-(\d+)", text)
    if not match:
        raise SpecError(
            f"{accelerator_type!r} is not an accelerator type; expected <generation>-<size>, "
            "e.g. v4-16, v5litepod-8, v6e-16, tpu7x-8",
            field="accelerator_type",
            value=accelerator_type,
            locate=False,
        )
    gen = generation(match.group(1))
    size = int(match.group(2))
    candidates = [st for st in _of(gen) if gen.size_of(st.chips) == size]
    if candidates:
        return min(candidates, key=_cubeness)
    sizes = sorted({gen.size_of(st.chips) for st in _of(gen)})
    lower = [s for s in sizes if s < size][-1:]
    higher = [s for s in sizes if s > size][:1]
    near = [f"{gen.gce_prefix}-{s}" for s in lower + higher]
    raise SpecError(
        f"{accelerator_type} is not a {gen.name} slice size{suggest(near)}",
        field="accelerator_type",
        value=accelerator_type,
        choices=near,
        locate=False,
    )


def find(gen_name: str, topology: str | Topology, machine_type: str | None = None) -> SliceType:
    """Look a slice type up by generation and topology, and machine type where it is ambiguous."""
    gen = generation(gen_name)
    topo = topology if isinstance(topology, Topology) else Topology.parse(topology)
    # 4x2x2 and 2x2x4 name the same 3-D slice shape; 2-D shapes keep their orientation.
    same = (lambda t: sorted(t.dims) == sorted(topo.dims)) if topo.rank == 3 else (lambda t: t == topo)
    matches = [st for st in _of(gen) if st.topology.rank == topo.rank and same(st.topology)]
    if not matches:
        by_size = sorted(gen.topologies, key=lambda t: (t.rank != topo.rank, abs(t.chips - topo.chips)))
        near = [str(t) for t in by_size[:3]]
        raise SpecError(
            f"{topo} is not a {gen.name} topology{suggest(near)}",
            field="topology",
            value=str(topo),
            choices=near,
            locate=False,
        )
    if machine_type is None:
        return min(matches, key=_cubeness)
    for st in matches:
        if st.machine_type == machine_type:
            return st
    valid_mt = [st.machine_type for st in matches]
    raise SpecError(
        f"{machine_type} cannot run a {gen.name} {topo} slice; use {' or '.join(valid_mt)}",
        field="machine_type",
        value=machine_type,
        choices=valid_mt,
        locate=False,
    )


def from_gke(accelerator_label: str, topology: str, machine_type: str | None = None) -> SliceType:
    """Look a slice type up by the GKE node selectors a worker group uses."""
    for gen in GENERATIONS:
        if gen.gke_accelerator == accelerator_label:
            return find(gen.name, topology, machine_type)
    labels = [g.gke_accelerator for g in GENERATIONS]
    near = closest(accelerator_label, labels) or labels
    raise SpecError(
        f"{accelerator_label!r} is not a GKE TPU accelerator{suggest(near)}",
        field="accelerator",
        value=accelerator_label,
        choices=near,
        locate=False,
    )


MAX_SLICE_COUNT = 100_000  # slices of one type (a slice list, a spec's pool): more than any fleet holds
_COUNT_DIGITS = len(str(MAX_SLICE_COUNT))


def parse_slice_list(text: str) -> list[tuple[SliceType, int]]:
    """Parse ``v4-16:2,v6e-16`` (type, optional count) as the CLI and specs write it."""
    out: list[tuple[SliceType, int]] = []
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        name, _, count = part.partition(":")
        # ASCII digits only, few of them: str.isdigit() also takes '²' (which int() refuses) and
        # 5,000 nines (past int()'s 4,300-digit limit), each a ValueError instead of this line.
        if count and not (
            count.isascii()
            and count.isdigit()
            and len(count) <= _COUNT_DIGITS
            and 1 <= int(count) <= MAX_SLICE_COUNT
        ):
            shown = part if len(part) <= 40 else f"{part[:40]}..."
            raise SpecError(
                f"{shown!r}: the count after ':' must be a whole number from 1 to {MAX_SLICE_COUNT:,}, "
                "e.g. v4-16:2",
                field="slices",
                value=shown,
                locate=False,
            )
        out.append((slice_type(name), int(count or 1)))
    if not out:
        raise SpecError(
            "no slices given; expected a list such as v4-16:2,v6e-16:1", field="slices", locate=False
        )
    return out
