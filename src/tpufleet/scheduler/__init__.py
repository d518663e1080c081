"""Scheduling model and policy: pure Python, no Ray, no I/O, no clock reads.

The control plane builds a ``Snapshot`` (tenants, slices, non-terminal jobs), calls ``decide`` once
per cycle, writes the decisions (``Admit``, ``Preempt``, ``Wait``) and only then acts on them.
``simulate.Simulation`` drives the same function on a fake clock for tests and benchmarks.
"""

from tpufleet.scheduler.model import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    Admit,
    Decision,
    JobId,
    JobState,
    JobView,
    NotFit,
    NotFitCode,
    Preempt,
    SliceName,
    SliceState,
    SliceView,
    Snapshot,
    TenantName,
    TenantView,
    Wait,
    most_important,
)
from tpufleet.scheduler.policy import decide

__all__ = [
    "ACTIVE_STATES",
    "TERMINAL_STATES",
    "Admit",
    "Decision",
    "JobId",
    "JobState",
    "JobView",
    "NotFit",
    "NotFitCode",
    "Preempt",
    "SliceName",
    "SliceState",
    "SliceView",
    "Snapshot",
    "TenantName",
    "TenantView",
    "Wait",
    "decide",
    "most_important",
]
