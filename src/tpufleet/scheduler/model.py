"""The scheduler's vocabulary: typed ids, states, views of the world, decisions and "does not fit".

Everything here is a frozen value. The control plane builds a ``Snapshot`` from its store, hands it
to ``policy.decide`` and writes the returned decisions before acting on them (Kueue's cycle:
snapshot, simulate, then write). Nothing in this module reads a clock, does I/O or imports Ray.

``NotFit`` is a ranked value, not an exception: it says why a queued job waits, is shown on the job
(``tpufleet job ID``), in the API and as a metric label, so ``NotFitCode`` values are stable
UPPER_SNAKE strings. A lower ``rank`` is the more important reason (``most_important``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from typing import NewType, TypeAlias

from tpufleet.catalog import SliceType, slice_type
from tpufleet.errors import SpecError
from tpufleet.scheduler.lifecycle import ACTIVE_STATES, TERMINAL_STATES, JobState, SliceState

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
    "expand",
    "lookup_type",
    "most_important",
]

JobId = NewType("JobId", str)
TenantName = NewType("TenantName", str)
SliceName = NewType("SliceName", str)


@dataclass(frozen=True)
class TenantView:
    """A tenant: nominal quota in chips per generation (catalog names, e.g. ``v4``, ``v6e``) and a weight.

    Generation aliases (``v5litepod``, ``v7x``) are accepted and normalised by the policy; a
    generation missing from ``quota`` has a nominal quota of 0 (the tenant may only borrow it).
    ``preemption``: whether the tenant's higher-priority jobs may preempt its own lower-priority
    ones (``lower_priority``, the default, as Kueue's ``withinClusterQueue: LowerPriority``) or
    ``never``.
    """

    name: TenantName
    quota: Mapping[str, int] = field(default_factory=dict, hash=False)
    weight: float = 1.0
    preemption: str = "lower_priority"


@dataclass(frozen=True)
class SliceView:
    name: SliceName
    accelerator_type: str  # GCE naming, e.g. "v4-16"
    state: SliceState
    holder: JobId | None = None


@dataclass(frozen=True, slots=True)
class JobView:
    """A job as the policy sees it.

    ``seq`` is the submission order (a monotonically increasing integer the store assigns; no
    clocks). ``admit_seq`` is the order of the job's current admission (the store assigns the next
    integer when it writes an ``Admit``); victims of preemption are chosen most recently admitted
    first, and ``seq`` stands in for it when it is ``None``. ``head_of_line`` feeds the previous
    cycle's ``Wait.head_of_line`` back, so a job that started collecting slices keeps its
    reservation although the fair-share order of its tenant changes as others' jobs finish; the
    policy stays correct without it, but a large job may then wait longer.
    """

    id: JobId
    tenant: TenantName
    accelerator_type: str
    num_slices: int
    priority: int
    seq: int
    state: JobState
    slices: tuple[SliceName, ...] = ()  # held while ADMITTED / STARTING / RUNNING
    borrowing: bool = False  # admitted beyond its tenant's quota
    preempting: bool = False  # a preemption was decided and is in progress; slices not free yet
    admit_seq: int | None = None
    head_of_line: bool = False  # the job's last Wait had head_of_line=True (the store keeps it)
    # Being preempted for a higher-priority job of its own tenant: its chips are on their way back to
    # the tenant, so they no longer count against the tenant's quota when the policy tests who fits.
    yielding: bool = False


@dataclass(frozen=True)
class Snapshot:
    """The world at the start of one scheduling cycle. Only non-terminal jobs matter."""

    tenants: Sequence[TenantView] = ()
    slices: Sequence[SliceView] = ()
    jobs: Sequence[JobView] = ()


class NotFitCode(StrEnum):
    """Why a queued job waits. Stable strings: they are API values and metric labels."""

    UNKNOWN_SLICE_TYPE = "UNKNOWN_SLICE_TYPE"  # not a TPU accelerator type at all
    INVALID_NUM_SLICES = "INVALID_NUM_SLICES"  # num_slices < 1
    NO_SUCH_SLICES_IN_FLEET = "NO_SUCH_SLICES_IN_FLEET"  # fleet has fewer slices of the type (any state)
    UNKNOWN_TENANT = "UNKNOWN_TENANT"  # the job's tenant is not in the snapshot
    NOT_ENOUGH_INTACT_SLICES = "NOT_ENOUGH_INTACT_SLICES"  # enough slices exist but some are broken/draining
    WAITING_FOR_PREEMPTION = "WAITING_FOR_PREEMPTION"  # borrowers are being preempted to make room
    QUOTA_EXCEEDED_NO_BORROWING = "QUOTA_EXCEEDED_NO_BORROWING"  # beyond quota and no idle capacity to borrow
    RESERVED_FOR_HEAD_OF_LINE = "RESERVED_FOR_HEAD_OF_LINE"  # would fit, but the free slices are reserved
    LOWER_PRIORITY_THAN_HEAD = "LOWER_PRIORITY_THAN_HEAD"  # behind a higher-priority job first in line
    WAITING_FOR_FREE_SLICES = "WAITING_FOR_FREE_SLICES"  # in quota; the slices are held by running jobs
    PROVISIONING = "PROVISIONING"  # a provider is making the slices it waits for (the autoscaler asked)
    WAITING_FOR_CAPACITY = "WAITING_FOR_CAPACITY"  # asked for, but the provider has no capacity now


_RANKS: dict[NotFitCode, int] = {code: rank for rank, code in enumerate(NotFitCode)}
_PERMANENT = frozenset(
    {NotFitCode.UNKNOWN_SLICE_TYPE, NotFitCode.INVALID_NUM_SLICES, NotFitCode.NO_SUCH_SLICES_IN_FLEET}
)


@dataclass(frozen=True, order=True, slots=True)
class NotFit:
    """A reason a job does not fit now: a stable ``code`` and a human ``message``.

    Ordered by ``rank`` (declaration order of ``NotFitCode``): the smaller, the more important,
    so ``min(reasons)`` is the one to show.
    """

    rank: int = field(init=False, repr=False)
    code: NotFitCode
    message: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "rank", _RANKS[self.code])

    @property
    def permanent(self) -> bool:
        """True when waiting cannot help unless the job or the fleet changes."""
        return self.code in _PERMANENT

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code.value, "message": self.message}

    def __str__(self) -> str:
        return f"{self.code.value}: {self.message}"


def most_important(reasons: Iterable[NotFit]) -> NotFit:
    """The reason to show among several (lowest rank); raises ValueError when there is none."""
    return min(reasons)


@dataclass(frozen=True, slots=True)
class Admit:
    job: JobId
    slices: tuple[SliceName, ...]
    borrowing: bool


@dataclass(frozen=True, slots=True)
class Preempt:
    job: JobId  # the victim: a running borrower, or a lower-priority job of the same tenant
    for_job: JobId  # the job that needs its slices (or its tenant's quota)
    reason: str
    within_tenant: bool = False  # priority preemption inside a tenant (not a reclaim of borrowed chips)


@dataclass(frozen=True, slots=True)
class Wait:
    """The job stays queued for ``reason``.

    ``head_of_line`` is True when the job holds its slice type's head-of-line reservation; the
    store keeps it and passes it back as ``JobView.head_of_line`` in the next snapshot.
    """

    job: JobId
    reason: NotFit
    head_of_line: bool = False


@dataclass(frozen=True, slots=True)
class Waits:
    """Jobs alike (one tenant, type, size and priority, in the policy's order) that all wait for
    ``reason``: one decision for a run of them, where ``decide`` makes a ``Wait`` per job.

    A cycle over 100,000 queued jobs has a few dozen runs: ``policy.decide_runs`` hands them out
    this way so that the control plane compares and writes reasons a run at a time. None of them
    holds the head of line (a type has one head, and it gets a ``Wait`` of its own).
    """

    jobs: tuple[JobView, ...]
    reason: NotFit

    def each(self) -> list[Wait]:
        """``[Wait(j.id, self.reason) for j in self.jobs]``, built at half the cost.

        The frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``; this
        sets the same slots through their descriptors, which is all that ``__init__`` does (there
        is no ``__post_init__``), so the result compares, hashes and prints the same.
        """
        new, job, why, head, reason = object.__new__, _WAIT_JOB, _WAIT_REASON, _WAIT_HEAD, self.reason

        def one(view: JobView) -> Wait:
            w = new(Wait)
            job(w, view.id)
            why(w, reason)
            head(w, False)
            return w

        return list(map(one, self.jobs))


_WAIT_JOB = Wait.__dict__["job"].__set__  # the slots' descriptors
_WAIT_REASON = Wait.__dict__["reason"].__set__
_WAIT_HEAD = Wait.__dict__["head_of_line"].__set__

Decision: TypeAlias = Admit | Preempt | Wait
RunDecision: TypeAlias = Admit | Preempt | Wait | Waits  # what ``policy.decide_runs`` hands out


def expand(decisions: Iterable[RunDecision]) -> list[Decision]:
    """The decisions with every ``Waits`` run as one ``Wait`` per job, in place (order kept)."""
    out: list[Decision] = []
    for d in decisions:
        if type(d) is Waits:
            out.extend(d.each())
        else:
            out.append(d)  # type: ignore[arg-type]
    return out


@cache
def lookup_type(accelerator_type: str) -> SliceType | None:
    """The catalog's slice type for a GCE accelerator type, or None when it is not one (cached)."""
    try:
        return slice_type(accelerator_type)
    except SpecError:
        return None
