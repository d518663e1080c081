"""tpufleet: run a shared fleet of Google Cloud TPU slices on Ray.

The public API is small on purpose; import submodules for the rest.
"""

import importlib
from typing import Any

from tpufleet.catalog import SliceType, Topology, find, from_gke, generation, slice_type
from tpufleet.errors import TpufleetError

__version__ = "0.1.0"

__all__ = [
    "SliceManager",
    "SliceType",
    "Topology",
    "TpufleetError",
    "__version__",
    "find",
    "from_gke",
    "generation",
    "slice_type",
]


def __getattr__(name: str) -> Any:
    """``SliceManager`` is imported on first use: it brings the HTTP client, which ``import
    tpufleet`` (on a TPU host, in a job) does not need; and code of every layer imports this package,
    so the API layer is reached by name, not by an import statement."""
    if name == "SliceManager":
        return importlib.import_module("tpufleet.client.slicemanager").SliceManager
    raise AttributeError(f"module 'tpufleet' has no attribute {name!r}")
