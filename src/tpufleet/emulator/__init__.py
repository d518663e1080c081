"""A local Ray cluster whose raylets look like TPU hosts to Ray, Ray Train and JAX.

``EmulatedFleet`` starts, breaks (``kill_host``, ``preempt``), repairs (``restore``, ``add``) and
stops (``down``) it; ``plan`` holds the pure parts (names, environments, command lines).
"""

from tpufleet.emulator.cluster import EmulatedFleet

__all__ = ["EmulatedFleet"]
