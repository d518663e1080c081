"""``fleet_view(store, who)``: the whole fleet in one read, as the fleet page and ``tpufleet top`` draw it.

One JSON-ready dict (``GET /api/v1/fleet``)::

    viewer   {"tenant", "admin"}
    slices   every slice with its hosts, each host with ``chips`` (the catalog's chips per host) and
             ``duty_cycle_percent`` (a list with one entry per chip, None for a chip its device source
             did not report; the whole list None when the host reported nothing fresh); the
             holder's ``tenant`` when the caller may see the holder, ``held_by_other`` otherwise
    queue    the first ``queue_limit`` queued jobs the caller may see, in queue order, each with
             ``position``: its place among every tenant's queued jobs of its slice type, ordered as
             the policy orders them before fair share (priority, the head of line, then submission)
    queued   how many queued jobs the caller may see (the queue list may be shorter)
    active   the caller's jobs that hold slices (ADMITTED, STARTING, RUNNING)
    recent   the caller's last ``recent_limit`` finished jobs, newest first
    tenants  each tenant the caller may see (the admin: all; a tenant: itself) with ``quota`` and
             ``held`` chips per generation, ``borrowing`` chips (held beyond quota), and job counts;
             a deleted tenant only while it still has jobs (``deleted`` true)

A tenant's token sees every slice (as ``GET /slices`` shows it) but only its own jobs and tenant;
a slice held by another tenant's job says ``held_by_other`` and names neither the job nor the
tenant. Numbers that are not measured are None, never 0. Reads only; the answer's size does not
grow with the queue (``bench/fleetview.py`` times a read at 10,000 and 100,000 queued jobs) nor
with what a tenant stored: every job in it is a listed job (``control/store/listing.py``: no env, no
working_dir, the command cut to 256 characters; its env is never read), at most ``queue_limit``
queued, one per slice active and ``recent_limit`` finished, a few KiB each at most.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import func, select

from tpufleet import catalog
from tpufleet.control.store import values as r
from tpufleet.control.store.database import Database
from tpufleet.control.store.listing import job_item, lean
from tpufleet.control.store.slices import slice_record
from tpufleet.control.store.tables import JobRow, SliceRow, TenantRow

QUEUE_LIMIT = 50
RECENT_LIMIT = 10
_HIDDEN_FIELDS = ("working_dir",)  # not drawn; kept out of a payload polled every second


Duty = Mapping[tuple[str, int], Mapping[int, float]]  # (slice, worker id) -> chip -> duty cycle %


def duty_cycles(readings: Mapping[tuple[str, int], Iterable[Any]]) -> dict[tuple[str, int], dict[int, float]]:
    """``{(slice, worker_id): {chip: percent}}`` from a device sampler's fresh readings (objects with
    ``chip`` and ``duty_cycle_percent``, e.g. ``observe.tpumetrics.ChipReading``); a chip whose
    reading has no duty cycle is left out (shown as not measured)."""
    out: dict[tuple[str, int], dict[int, float]] = {}
    for key, chips in readings.items():
        got = {int(c.chip): float(c.duty_cycle_percent) for c in chips if c.duty_cycle_percent is not None}
        if got:
            out[key] = got
    return out


def fleet_view(
    store: Database,
    who: r.Principal,
    *,
    duty: Duty | None = None,
    queue_limit: int = QUEUE_LIMIT,
    recent_limit: int = RECENT_LIMIT,
) -> dict[str, Any]:
    """The view for ``who``; ``duty``: the measured duty cycles (:func:`duty_cycles`), none by default."""
    scope = who.tenant  # None: the admin sees everything
    with store.tx() as s:
        slice_rows = list(s.scalars(select(SliceRow).order_by(SliceRow.name)))
        active = list(
            s.scalars(
                lean(select(JobRow).where(JobRow.state.in_(r.ACTIVE)).order_by(JobRow.admit_seq, JobRow.seq))
            )
        )
        queue = _queue(s, scope, queue_limit)
        queued = _count(s, scope, (r.QUEUED,))
        recent_q = lean(select(JobRow).where(JobRow.state.in_(r.TERMINAL)))
        if scope is not None:
            recent_q = recent_q.where(JobRow.tenant == scope)
        recent = list(
            s.scalars(recent_q.order_by(JobRow.finished_at.desc(), JobRow.seq.desc()).limit(recent_limit))
        )
        tenant_q = select(TenantRow).order_by(TenantRow.name)
        if scope is not None:
            tenant_q = tenant_q.where(TenantRow.name == scope)
        tenants = list(s.scalars(tenant_q))
        counts = _counts_by_tenant(s, [t.name for t in tenants])
    owner = {j.id: j.tenant for j in active}
    visible = [j for j in active if scope is None or j.tenant == scope]
    return {
        "viewer": {"tenant": who.tenant, "admin": who.admin},
        "at": store.clock(),
        "slices": [_slice(x, owner, scope, duty or {}) for x in slice_rows],
        "queued": queued,
        "queue": [{**_job(j), "position": pos} for j, pos in queue],
        "active": [_job(j) for j in visible],
        "recent": [_job(j) for j in recent],
        "tenants": _tenants(tenants, slice_rows, owner, active, counts),
    }


def _job(row: JobRow) -> dict[str, Any]:
    d = job_item(row)  # no env or attempts, the command cut (control/store/listing.py)
    for key in _HIDDEN_FIELDS:
        d.pop(key, None)
    return d


def _queue(s: Any, scope: str | None, limit: int) -> list[tuple[JobRow, int]]:
    """The first ``limit`` queued jobs of ``scope`` in queue order, with their position among
    every queued job of their slice type. The head is one top-N query. For the admin it is the
    whole queue's head, so positions are counted along it; for a tenant, one windowed query ranks
    the queued jobs of the slice types its head has (``bench/fleetview.py`` times both)."""
    order = (JobRow.priority.desc(), JobRow.head_of_line.desc(), JobRow.seq)
    query = lean(select(JobRow).where(JobRow.state == r.QUEUED))
    if scope is not None:
        query = query.where(JobRow.tenant == scope)
    head = list(s.scalars(query.order_by(*order).limit(limit)))
    if scope is None:
        seen: dict[str, int] = defaultdict(int)
        out = []
        for job in head:
            seen[job.accelerator_type] += 1
            out.append((job, seen[job.accelerator_type]))
        return out
    if not head:
        return []
    ranked = (
        select(
            JobRow.seq.label("seq"),
            func.row_number().over(partition_by=JobRow.accelerator_type, order_by=order).label("position"),
        )
        .where(JobRow.state == r.QUEUED, JobRow.accelerator_type.in_({j.accelerator_type for j in head}))
        .subquery()
    )
    wanted = [j.seq for j in head]
    positions = dict(s.execute(select(ranked.c.seq, ranked.c.position).where(ranked.c.seq.in_(wanted))).all())
    # read in two statements: under READ COMMITTED a job admitted in between has no position; it left
    return [(job, int(positions[job.seq])) for job in head if job.seq in positions]


def _count(s: Any, scope: str | None, states: tuple[str, ...]) -> int:
    query = select(func.count()).select_from(JobRow).where(JobRow.state.in_(states))
    if scope is not None:
        query = query.where(JobRow.tenant == scope)
    return int(s.scalar(query) or 0)


def _counts_by_tenant(s: Any, names: list[str]) -> dict[str, dict[str, int]]:
    """Queued and running jobs of each tenant named (only those that have some): one small query
    per tenant on the (tenant, state) index, which beats one GROUP BY over the whole queue."""
    out: dict[str, dict[str, int]] = {}
    for name in names:
        query = select(JobRow.state, func.count()).where(
            JobRow.tenant == name, JobRow.state.in_((r.QUEUED, *r.ACTIVE))
        )
        for state, n in s.execute(query.group_by(JobRow.state)):
            row = out.setdefault(name, {"queued": 0, "running": 0})
            row["queued" if state == r.QUEUED else "running"] += int(n)
    return out


def _shape(accelerator_type: str) -> catalog.SliceType | None:
    try:
        return catalog.slice_type(accelerator_type)
    except Exception:  # a slice of a type this catalog does not know: drawn without chips
        return None


def _slice(row: SliceRow, owner: dict[str, str], scope: str | None, duty: Duty) -> dict[str, Any]:
    d = slice_record(row).to_dict()
    st = _shape(row.accelerator_type)
    holder_tenant = owner.get(row.holder) if row.holder else None
    visible = scope is None or holder_tenant == scope
    d["generation"] = st.gen_name if st else None
    d["chips"] = st.chips if st else None
    d["chips_per_host"] = st.chips_per_host if st else None
    d["holder"] = row.holder if visible else None
    d["tenant"] = holder_tenant if visible else None
    d["held_by_other"] = bool(row.holder) and not visible
    hosts = sorted(row.hosts or (), key=lambda h: int(h.get("worker_id", 0)))
    d["hosts"] = [_host(row.name, h, st.chips_per_host if st else 0, duty) for h in hosts]
    return d


def _host(slice_name: str, h: dict[str, Any], chips: int, duty: Duty) -> dict[str, Any]:
    measured = duty.get((slice_name, int(h.get("worker_id", 0))))
    return {
        "worker_id": h.get("worker_id"),
        "address": h.get("address"),
        "alive": bool(h.get("alive")),
        "chips": chips or None,
        # one number per chip where the host's device source gave one; None: nothing measured
        "duty_cycle_percent": [measured.get(c) for c in range(chips)] if measured else None,
    }


def _tenants(
    tenants: list[TenantRow],
    slices: list[SliceRow],
    owner: dict[str, str],
    active: list[JobRow],
    counts: dict[str, dict[str, int]],
) -> list[dict[str, Any]]:
    held: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for x in slices:
        tenant = owner.get(x.holder) if x.holder else None
        st = _shape(x.accelerator_type)
        if tenant is not None and st is not None:
            held[tenant][st.gen_name] += st.chips
    borrowing_jobs = {j.tenant for j in active if j.borrowing}
    out = []
    for t in tenants:
        quota = {gen: int(n) for gen, n in sorted((t.quota or {}).items())}
        mine = dict(sorted(held[t.name].items()))
        deleted = t.deleted_at is not None
        if deleted and not mine and t.name not in counts:
            continue  # a deleted tenant is shown only while its last jobs still stop
        out.append(
            {
                "name": t.name,
                "weight": t.weight,
                "quota": quota,
                "held": mine,
                "borrowing": {g: n - quota.get(g, 0) for g, n in mine.items() if n > quota.get(g, 0)},
                "has_borrowing_jobs": t.name in borrowing_jobs,
                "deleted": deleted,
                **counts.get(t.name, {"queued": 0, "running": 0}),
            }
        )
    return out
