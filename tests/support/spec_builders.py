"""Fixture builders for fleet-spec, render and lint tests: small specs, one pool per generation.

    spec = load_fleet(pools=[pool("v4-train", type="v4-16")], monitoring={"enabled": True})

``GENERATION_CASES`` is the table every render/lint test walks: one pool per generation (and the
two-host v6e 2x4 case), with the facts the output must carry, written out by hand from Google's
documentation rather than computed by the catalog under test.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tpufleet.lint.crds import SchemaSource, find_crd_dir, load_crd_schemas
from tpufleet.spec import FleetSpec, load_spec

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "fleet.yaml"


@dataclass(frozen=True)
class Case:
    pool: dict[str, Any]
    accelerator: str  # cloud.google.com/gke-tpu-accelerator
    topology: str
    chips_per_host: int
    hosts: int
    gce_type: str  # GCE acceleratorType (GCE's own host shape)
    gce_chips_per_host: int
    runtime: str

    @property
    def id(self) -> str:
        return "-".join(str(v) for k, v in self.pool.items() if k != "name")


GENERATION_CASES = [
    Case({"type": "v4-16"}, "tpu-v4-podslice", "2x2x2", 4, 2, "v4-16", 4, "tpu-ubuntu2204-base"),
    Case(
        {"generation": "v5e", "topology": "4x4"},
        "tpu-v5-lite-podslice",
        "4x4",
        4,
        4,
        "v5litepod-16",
        4,
        "v2-alpha-tpuv5-lite",
    ),
    Case({"type": "v5p-8"}, "tpu-v5p-slice", "2x2x1", 4, 1, "v5p-8", 4, "v2-alpha-tpuv5"),
    Case({"type": "v6e-8"}, "tpu-v6e-slice", "2x4", 8, 1, "v6e-8", 8, "v2-alpha-tpuv6e"),
    Case(
        {"generation": "v6e", "topology": "2x4", "machine_type": "ct6e-standard-4t"},
        "tpu-v6e-slice",
        "2x4",
        4,
        2,
        "v6e-8",
        8,
        "v2-alpha-tpuv6e",
    ),
    Case(
        {"generation": "v6e", "topology": "4x4"}, "tpu-v6e-slice", "4x4", 4, 4, "v6e-16", 4, "v2-alpha-tpuv6e"
    ),
    Case({"type": "tpu7x-16"}, "tpu7x", "2x2x2", 4, 2, "tpu7x-16", 4, "v2-alpha-tpu7-ubuntu2404"),
]


def pool(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, **fields}


def spec_dict(pools: list[dict[str, Any]] | None = None, **over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "fleet",
        "namespace": "ml",
        "pools": pools if pools is not None else [pool("p", type="v4-16")],
        "service_account": {
            "name": "ray-tpu",
            "gcp_service_account": "ray-tpu@my-project.iam.gserviceaccount.com",
        },
        "gce": {"project_id": "my-project", "zone": "us-east5-b"},
    }
    base.update(over)
    return base


def load_fleet(pools: list[dict[str, Any]] | None = None, **over: Any) -> FleetSpec:
    return load_spec(yaml.safe_dump(spec_dict(pools, **over), sort_keys=False), "test.yaml")


def all_generations(**over: Any) -> FleetSpec:
    """One multi-pool fleet with every case of GENERATION_CASES, monitoring and policy on."""
    pools = [pool(f"p{i}", **c.pool) for i, c in enumerate(GENERATION_CASES)]
    over.setdefault("monitoring", {"enabled": True})
    over.setdefault("network_policy", {"enabled": True})
    return load_fleet(pools, **over)


def crds_or_skip() -> SchemaSource:
    """KubeRay's CRDs from ../shared/kuberay; a loud skip (never a silent pass) when they are absent."""
    directory = find_crd_dir()
    if directory is None:
        pytest.skip(
            "KubeRay CRD schemas NOT FOUND (expected ../shared/kuberay/ray.io_*.yaml next to the repository, "
            "or $TPUFLEET_KUBERAY_CRDS): CRD validation was NOT run"
        )
    return load_crd_schemas(directory)
