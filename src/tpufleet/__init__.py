"""tpufleet: run a shared fleet of Google Cloud TPU slices on Ray.

The public API is small on purpose; import submodules for the rest.
"""

from tpufleet.catalog import SliceType, Topology, find, from_gke, generation, slice_type
from tpufleet.errors import TpufleetError

__version__ = "0.1.0"

__all__ = [
    "SliceType",
    "Topology",
    "TpufleetError",
    "__version__",
    "find",
    "from_gke",
    "generation",
    "slice_type",
]
