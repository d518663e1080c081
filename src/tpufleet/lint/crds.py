"""The one place the lint layer reads files: KubeRay's CRD schemas, for rule TPF009.

``find_crd_dir()`` looks for the CRDs (``$TPUFLEET_KUBERAY_CRDS``, then ``../shared/kuberay`` next
to the repository or the working directory); ``load_crd_schemas(dir)`` returns a function
``(kind, version) -> openAPIV3Schema | None`` that reads each CRD file on first use. Both are called by
the CLI and by tests, never by the rules.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import yaml

__all__ = ["CRD_FILES", "SchemaSource", "find_crd_dir", "load_crd_schemas"]

SchemaSource = Callable[[str, str], "dict[str, Any] | None"]

CRD_FILES = {
    "RayCluster": "ray.io_rayclusters.yaml",
    "RayJob": "ray.io_rayjobs.yaml",
    "RayService": "ray.io_rayservices.yaml",
}

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def find_crd_dir() -> Path | None:
    """Where KubeRay's CRD files are, or None; the repository's sibling ``shared/kuberay`` by default."""
    env = os.environ.get("TPUFLEET_KUBERAY_CRDS")
    repo = Path(__file__).resolve().parents[3]  # src/tpufleet/lint/crds.py -> repository root
    candidates = (
        [Path(env)] if env else [repo.parent / "shared" / "kuberay", Path.cwd().parent / "shared" / "kuberay"]
    )
    for directory in candidates:
        if all((directory / name).is_file() for name in CRD_FILES.values()):
            return directory
    return None


@cache
def _load(path: str) -> dict[str, dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        crd = yaml.load(fh, Loader=_Loader)
    return {v["name"]: v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"]}


def load_crd_schemas(directory: str | Path) -> SchemaSource:
    """A schema source over the CRDs in ``directory``; each file is parsed once, when first needed."""

    def source(kind: str, version: str) -> dict[str, Any] | None:
        name = CRD_FILES.get(kind)
        return _load(str(Path(directory) / name)).get(version) if name else None

    return source
