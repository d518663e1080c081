"""The chaos soak behind ``tpufleet chaos``: a seeded stream of jobs on an emulated fleet while hosts die,
slices are preempted (with and without notice) and come back, and the control plane is SIGKILLed
and restarted on the same store; then what the system promised is checked (docs/reliability.md).

One module per concern:

- ``plan``: the configuration and the seeded plan (jobs, fault times); pure.
- ``hostjob``: the program every job runs on each of its hosts (markers with heartbeats, so two
  attempts of one job that ran at the same time show), started by path; ``raydriver``: a Ray job's
  driver, which reserves its slices with ``SlicePlacementGroup`` as Ray Train does and runs the
  host program in one task per host.
- ``server``: the control plane as processes (the soak's own ``tpufleet serve``, or someone else's),
  killed and started again; ``faults``: the fault thread; ``soak``: the driver (:class:`Soak`).
- ``verdict``: what the markers, the store, Ray and ``/proc`` say afterwards, and :func:`passed`.
- ``leaders`` (``--replicas N``): N ``serve`` replicas on one PostgreSQL database and the leader
  faults done to them; ``fencing``: the leader verdict, from the fencing tokens the store's records
  carry (``overlapping_leaders``).
"""

from tpufleet.chaos.plan import (
    DAMAGE,
    FAULT_KINDS,
    HEAD_KILL,
    HOSTJOB,
    RAYDRIVER,
    TENANTS,
    ChaosConfig,
    Event,
    PlannedJob,
    parse_slices,
    plan_faults,
    plan_jobs,
)
from tpufleet.chaos.server import ExternalServer
from tpufleet.chaos.soak import Soak
from tpufleet.chaos.verdict import TERMINAL, double_runs, overlaps, passed, procs_with, read_markers

__all__ = [
    "DAMAGE",
    "FAULT_KINDS",
    "HEAD_KILL",
    "HOSTJOB",
    "RAYDRIVER",
    "TENANTS",
    "TERMINAL",
    "ChaosConfig",
    "Event",
    "ExternalServer",
    "PlannedJob",
    "Soak",
    "double_runs",
    "overlaps",
    "parse_slices",
    "passed",
    "plan_faults",
    "plan_jobs",
    "procs_with",
    "read_markers",
]
