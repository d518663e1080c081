"""What the fleet was used for, read from the store: attempts with their jobs, counts, quotas.

The reads behind ``GET /metrics``, ``GET /api/v1/cost`` and the goodput on job views
(``observe/``). Each is one query; none changes anything. The ones a scrape makes every time are
cheap at 100,000 jobs: counts grouped in SQL (``jobs`` has an index on tenant and state), jobs that
hold slices (indexed by state), and attempts admitted or ended after a time (indexed, see revision
0006), so the metrics never read every attempt again after their first scrape.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, and_, bindparam, func, or_, select
from sqlalchemy.orm import aliased

from tpufleet.control.store import values as r
from tpufleet.control.store.database import Database
from tpufleet.control.store.tables import AttemptRow, EventRow, JobRow, SliceGroupRow, SliceRow, TenantRow

__all__ = ["Usage", "UsageAttempt"]

SPOT, ON_DEMAND = "spot", "on_demand"


@dataclass(frozen=True)
class UsageAttempt:
    """One attempt with what cost and goodput need of its job."""

    job_id: str
    attempt: int
    tenant: str
    job_name: str
    job_state: str
    accelerator_type: str
    num_slices: int
    slices: tuple[str, ...]
    state: str  # the attempt's: ADMITTED ... or how it ended (SUCCEEDED, FAILED, PREEMPTED, ...)
    message: str | None
    exit_codes: tuple[dict[str, Any], ...]
    admitted_at: float
    ended_at: float | None
    first_step: int | None
    first_step_at: float | None
    last_step: int | None
    last_step_at: float | None
    waited_from: float | None  # since when it waited: the job's submission, or the previous attempt's end


_Prev = aliased(AttemptRow)
_COLUMNS = (
    AttemptRow.job_id,
    AttemptRow.attempt,
    JobRow.tenant,
    JobRow.name,
    JobRow.state.label("job_state"),
    JobRow.accelerator_type,
    JobRow.num_slices,
    AttemptRow.slices,
    AttemptRow.state,
    AttemptRow.message,
    AttemptRow.exit_codes,
    AttemptRow.admitted_at,
    AttemptRow.ended_at,
    AttemptRow.first_step,
    AttemptRow.first_step_at,
    AttemptRow.last_step,
    AttemptRow.last_step_at,
    JobRow.submitted_at,
    _Prev.ended_at.label("prev_ended_at"),
)


_LEAN = {"message", "exit_codes", "submitted_at", "prev_ended_at"}  # what cost does not need


def _query(lean: bool = False) -> Select[Any]:
    if lean:  # 2-3 times faster to read: no JSON of host codes, no join to the previous attempt
        return select(*(c for c in _COLUMNS if c.key not in _LEAN)).join(
            JobRow, JobRow.id == AttemptRow.job_id
        )
    return (
        select(*_COLUMNS)
        .join(JobRow, JobRow.id == AttemptRow.job_id)
        .outerjoin(_Prev, and_(_Prev.job_id == AttemptRow.job_id, _Prev.attempt == AttemptRow.attempt - 1))
    )


def _attempt(row: Any) -> UsageAttempt:
    mapping = row._mapping
    if "message" not in mapping:  # a lean row (``_query(lean=True)``)
        return UsageAttempt(
            row.job_id, row.attempt, row.tenant, row.name, row.job_state, row.accelerator_type,
            row.num_slices, tuple(row.slices or ()), row.state, None, (), row.admitted_at, row.ended_at,
            row.first_step, row.first_step_at, row.last_step, row.last_step_at, None,
        )  # fmt: skip
    return UsageAttempt(
        job_id=row.job_id,
        attempt=row.attempt,
        tenant=row.tenant,
        job_name=row.name,
        job_state=row.job_state,
        accelerator_type=row.accelerator_type,
        num_slices=row.num_slices,
        slices=tuple(row.slices or ()),
        state=row.state,
        message=row.message,
        exit_codes=tuple(row.exit_codes or ()),
        admitted_at=row.admitted_at,
        ended_at=row.ended_at,
        first_step=row.first_step,
        first_step_at=row.first_step_at,
        last_step=row.last_step,
        last_step_at=row.last_step_at,
        waited_from=row.submitted_at if row.attempt == 1 else row.prev_ended_at,
    )


# has_slices: built once (every submit asks; building a statement costs more than running it)
_SOME_SLICES = (
    select(SliceRow.name).where(SliceRow.accelerator_type == bindparam("type")).limit(bindparam("n"))
)


class Usage:
    """Reads over a :class:`Store` (thread-safe: one transaction per call)."""

    def __init__(self, store: Database) -> None:
        self.store = store
        self.clock = store.clock

    def attempts(
        self,
        *,
        tenant: str | None = None,
        since: float | None = None,
        job_ids: Iterable[str] | None = None,
        lean: bool = False,
    ) -> list[UsageAttempt]:
        """Attempts (of ``tenant``, of ``job_ids``) that held slices at some time after ``since``;
        ``lean``: without ``message``, ``exit_codes`` and ``waited_from`` (what cost and goodput
        need, read faster)."""
        query = _query(lean)
        if tenant is not None:
            query = query.where(JobRow.tenant == tenant)
        if since is not None:
            query = query.where(or_(AttemptRow.ended_at.is_(None), AttemptRow.ended_at >= since))
        ids = None if job_ids is None else sorted(set(job_ids))
        out: list[UsageAttempt] = []
        with self.store.tx() as s:
            for chunk in [None] if ids is None else [ids[i : i + 2000] for i in range(0, len(ids), 2000)]:
                q = query if chunk is None else query.where(AttemptRow.job_id.in_(chunk))
                out += [_attempt(row) for row in s.execute(q.order_by(AttemptRow.job_id, AttemptRow.attempt))]
        return out

    def every_attempt(self, batch: int = 5000) -> Iterator[UsageAttempt]:
        """All attempts, streamed (a metrics collector's first scrape)."""
        with self.store.tx() as s:
            for row in s.execute(_query().execution_options(yield_per=batch)):
                yield _attempt(row)

    def admitted_since(self, t: float) -> list[UsageAttempt]:
        with self.store.tx() as s:
            return [_attempt(row) for row in s.execute(_query().where(AttemptRow.admitted_at >= t))]

    def ended_since(self, t: float) -> list[UsageAttempt]:
        with self.store.tx() as s:
            return [_attempt(row) for row in s.execute(_query().where(AttemptRow.ended_at >= t))]

    def open_attempts(self) -> list[UsageAttempt]:
        """The current attempt of every job that holds slices (ADMITTED, STARTING, RUNNING)."""
        query = _query().where(JobRow.state.in_(r.ACTIVE), AttemptRow.attempt == JobRow.attempt)
        with self.store.tx() as s:
            return [_attempt(row) for row in s.execute(query)]

    def holding_attempts(self) -> list[UsageAttempt]:
        """Every attempt (the earlier ones too) of the jobs that hold slices now: what the goodput
        gauge needs, read through the state index without walking the queue."""
        with self.store.tx() as s:
            ids = list(s.scalars(select(JobRow.id).where(JobRow.state.in_(r.ACTIVE))))
        return self.attempts(job_ids=ids) if ids else []

    def last_event(self) -> int:
        """The newest event id: every change to a job or slice writes one (a cache key)."""
        with self.store.tx() as s:
            return int(s.scalar(select(func.max(EventRow.id))) or 0)

    def job_counts(self) -> list[tuple[str, str, int]]:
        """(tenant, state, jobs), grouped in SQL."""
        query = select(JobRow.tenant, JobRow.state, func.count()).group_by(JobRow.tenant, JobRow.state)
        with self.store.tx() as s:
            return [(t, st, int(n)) for t, st, n in s.execute(query)]

    def slice_counts(self) -> list[tuple[str, str, int]]:
        """(accelerator type, state, slices)."""
        query = select(SliceRow.accelerator_type, SliceRow.state, func.count()).group_by(
            SliceRow.accelerator_type, SliceRow.state
        )
        with self.store.tx() as s:
            return [(a, st, int(n)) for a, st, n in s.execute(query)]

    def has_slices(self, accelerator_type: str, n: int) -> bool:
        """Whether the fleet has at least ``n`` slices of ``accelerator_type``, in any state: reads
        at most ``n`` of them (every submit asks; a fleet has thousands)."""
        with self.store.tx() as s:
            return len(s.scalars(_SOME_SLICES, {"type": accelerator_type, "n": n}).all()) >= n

    def quotas(self) -> dict[str, dict[str, int]]:
        """Every tenant's nominal quota, chips per generation."""
        with self.store.tx() as s:
            return {
                name: dict(quota or {}) for name, quota in s.execute(select(TenantRow.name, TenantRow.quota))
            }

    def slice_pricing(self) -> dict[str, str]:
        """``spot`` or ``on_demand`` of every slice a provider made, by physical slice name: spot
        when its slice group asked for spot (``tpufleet slice create --spot``, a pool with
        ``spot: true``). Deleted groups count too (their attempts were paid at that price). A slice
        in no group (one Ray already had) is on-demand: callers read a missing name so."""
        out: dict[str, str] = {}
        with self.store.tx() as s:
            for spot, slices in s.execute(select(SliceGroupRow.spot, SliceGroupRow.slices)):
                for x in slices or ():
                    if isinstance(x, dict) and "name" in x:
                        out[str(x["name"])] = SPOT if spot else ON_DEMAND
        return out
