"""Scheduling model and policy: pure Python, no Ray, no I/O, no clock reads.

The control plane builds a ``Snapshot`` (tenants, slices, non-terminal jobs), calls ``decide`` once
per cycle, writes the decisions (``Admit``, ``Preempt``, ``Wait``) and only then acts on them;
``decide_runs`` is the same cycle with jobs alike that wait for one reason as one ``Waits`` run.
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
    RunDecision,
    SliceName,
    SliceState,
    SliceView,
    Snapshot,
    TenantName,
    TenantView,
    Wait,
    Waits,
    expand,
    most_important,
)
from tpufleet.scheduler.policy import decide, decide_runs

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
    "RunDecision",
    "SliceName",
    "SliceState",
    "SliceView",
    "Snapshot",
    "TenantName",
    "TenantView",
    "Wait",
    "Waits",
    "decide",
    "decide_runs",
    "expand",
    "most_important",
]
