"""Slice groups in the store: what was asked of a provider, where it stands, and how it was used.

``SliceGroups(store)`` is the table ``slice_groups`` (``schema.SliceGroupRow``) as the API, the CLI
and the provisioning loop (``control/loop/provisioner.py``) see it. A group is ``count`` physical slices
of one accelerator type, spot or not, shared or private to a tenant; the slice manager
(``tpufleet slice create``) makes ``manual`` groups, the autoscaler ``autoscaler`` groups of one
slice each. Utilization is measured, never estimated: from the attempts the store recorded
(``attempts.admitted_at``/``ended_at`` and their slices) over the time each slice was up.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import func, select

from tpufleet import catalog
from tpufleet.control.store.database import Database
from tpufleet.control.store.loopwrites import LEFT
from tpufleet.control.store.tables import AttemptRow, JobRow, SliceGroupRow, SliceRow, TenantRow
from tpufleet.errors import ConflictError, NotFoundError, SpecError, closest, suggest, unknown_field

__all__ = ["AUTOSCALER", "GROUP_NAME", "MANUAL", "REQUESTED", "GroupRecord", "SliceGroups"]

GROUP_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")
MANUAL, AUTOSCALER = "manual", "autoscaler"
REQUESTED = "REQUESTED"  # stored, not yet seen by the provider
MAX_COUNT = 64


@dataclass(frozen=True)
class GroupRecord:
    name: str
    accelerator_type: str
    count: int
    spot: bool
    tenant: str | None
    origin: str
    pool: str | None
    for_job: str | None
    state: str
    message: str | None
    slices: tuple[dict[str, Any], ...]
    created_at: float
    delete_requested_at: float | None
    force: bool
    deleted_at: float | None

    @property
    def slice_names(self) -> list[str]:
        return [str(s["name"]) for s in self.slices]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["slices"] = [dict(s) for s in self.slices]
        out["deleting"] = self.delete_requested_at is not None
        return out


def _record(row: SliceGroupRow) -> GroupRecord:
    return GroupRecord(
        name=row.name,
        accelerator_type=row.accelerator_type,
        count=row.count,
        spot=row.spot,
        tenant=row.tenant,
        origin=row.origin,
        pool=row.pool,
        for_job=row.for_job,
        state=row.state,
        message=row.message,
        slices=tuple(dict(s) for s in row.slices or ()),
        created_at=row.created_at,
        delete_requested_at=row.delete_requested_at,
        force=row.force,
        deleted_at=row.deleted_at,
    )


CONFIG_KEYS = ("tpu_type", "generation", "topology", "num_slices", "preemptible")


@dataclass(frozen=True)
class SliceConfig:
    accelerator_type: str
    count: int
    spot: bool


def slice_config(config: Mapping[str, Any]) -> SliceConfig:
    """``{"tpu_type": "v4-8", "num_slices": 2, "preemptible": True}`` (or ``generation`` +
    ``topology`` instead of ``tpu_type``) as a checked value; an unknown key is a SpecError naming
    the closest valid key."""
    if not isinstance(config, Mapping):
        raise SpecError(f"a slice config is a mapping of {', '.join(CONFIG_KEYS)}", field="config")
    for key in config:
        if key not in CONFIG_KEYS:
            raise SpecError(unknown_field(key, CONFIG_KEYS, "key"), field="config")
    tpu_type, gen, topo = config.get("tpu_type"), config.get("generation"), config.get("topology")
    if tpu_type is not None and (gen is not None or topo is not None):
        raise SpecError("give tpu_type (v4-8) or generation + topology (v4, 2x2x1), not both", field="config")
    if tpu_type is None and (gen is None or topo is None):
        raise SpecError(
            "give tpu_type (e.g. v4-8), or generation and topology (e.g. v4, 2x2x1)", field="config"
        )
    for key, value in (("tpu_type", tpu_type), ("generation", gen), ("topology", topo)):
        if value is not None and not isinstance(value, str):
            raise SpecError(f"{key} must be a string, got {value!r}", field=key)
    st = catalog.slice_type(tpu_type) if tpu_type is not None else catalog.find(str(gen), str(topo))
    count = config.get("num_slices", 1)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
        raise SpecError(f"must be a whole number from 1 to {MAX_COUNT}, got {count!r}", field="num_slices")
    spot = config.get("preemptible", False)
    if not isinstance(spot, bool):
        raise SpecError(f"must be true or false, got {spot!r}", field="preemptible")
    return SliceConfig(st.accelerator_type, count, spot)


def parse_window(text: str | float) -> float:
    """Seconds from ``600``, ``"90s"``, ``"10m"``, ``"2h"`` or ``"1d"``."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        seconds = float(text)
    else:
        found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", str(text))
        if not found:
            raise SpecError(f"{str(text)[:40]!r} is not a window; e.g. 90s, 10m, 2h, 1d", field="window")
        seconds = float(found.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[found.group(2)]
    if not 0 < seconds <= 366 * 86400:
        raise SpecError(f"the window must be above 0 and at most a year, got {text!r}", field="window")
    return seconds


def check_name(name: str) -> str:
    if not isinstance(name, str) or not GROUP_NAME.fullmatch(name):
        raise SpecError(
            f"{str(name)[:80]!r} is not a slice group name: a lower-case letter, then letters, digits "
            "and '-', at most 40 characters, e.g. train-v4",
            field="name",
        )
    return name


class SliceGroups:
    def __init__(self, store: Database) -> None:
        self.store = store

    def create(
        self,
        name: str,
        accelerator_type: str,
        count: int = 1,
        *,
        spot: bool = False,
        tenant: str | None = None,
        origin: str = MANUAL,
        pool: str | None = None,
        for_job: str | None = None,
    ) -> GroupRecord:
        """Store a new group (REQUESTED); the provisioning loop asks the provider for it."""
        check_name(name)
        st = catalog.slice_type(accelerator_type)  # SpecError naming the closest types
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
            raise SpecError(
                f"count must be a whole number from 1 to {MAX_COUNT}, got {count!r}", field="count"
            )
        now = self.store.clock()
        with self.store.tx() as s:
            if tenant is not None and s.get(TenantRow, tenant) is None:
                names = s.scalars(select(TenantRow.name)).all()
                raise NotFoundError(f"tenant {tenant!r} not found{suggest(closest(tenant, names))}")
            old = s.get(SliceGroupRow, name)
            if old is not None and old.deleted_at is None:
                raise ConflictError(f"slice group {name!r} already exists ({old.state}); delete it first")
            if old is not None:
                s.delete(old)
                s.flush()
            row = SliceGroupRow(
                name=name,
                accelerator_type=st.accelerator_type,
                count=count,
                spot=bool(spot),
                tenant=tenant,
                origin=origin,
                pool=pool,
                for_job=for_job,
                state=REQUESTED,
                message="asking the provider",
                slices=[],
                created_at=now,
                updated_at=now,
                delete_requested_at=None,
                force=False,
                deleted_at=None,
            )
            s.add(row)
            why = f" for job {for_job}" if for_job else f" for pool {pool}" if pool else ""
            what = f"{count} x {st.accelerator_type}{' spot' if spot else ''}"
            self.store.add_event(s, f"slice group {name}: {what} requested{why}", kind="slice-group")
            return _record(row)

    def get(self, name: str) -> GroupRecord:
        with self.store.tx() as s:
            row = s.get(SliceGroupRow, name) if isinstance(name, str) and len(name) <= 63 else None
            if row is None or row.deleted_at is not None:
                names = s.scalars(select(SliceGroupRow.name).where(SliceGroupRow.deleted_at.is_(None))).all()
                raise NotFoundError(
                    f"slice group {str(name)[:80]!r} not found{suggest(closest(str(name), names))}; "
                    "list them with `tpufleet slices`"
                )
            return _record(row)

    def all(self, *, include_deleted: bool = False) -> list[GroupRecord]:
        query = select(SliceGroupRow).order_by(SliceGroupRow.created_at, SliceGroupRow.name)
        if not include_deleted:
            query = query.where(SliceGroupRow.deleted_at.is_(None))
        with self.store.tx() as s:
            return [_record(r) for r in s.scalars(query)]

    def deleted_since(self, since: float) -> list[GroupRecord]:
        """Groups deleted at or after ``since`` (their slice names may still be listed by Ray)."""
        query = select(SliceGroupRow).where(SliceGroupRow.deleted_at >= since)
        with self.store.tx() as s:
            return [_record(r) for r in s.scalars(query)]

    def count(self, pool: str) -> int:
        """Groups ever made for ``pool`` (deleted ones too): the autoscaler numbers its groups on."""
        with self.store.tx() as s:
            return int(s.scalar(select(func.count()).where(SliceGroupRow.pool == pool)) or 0)

    def request_delete(self, name: str, *, force: bool = False, provider: bool = True) -> GroupRecord:
        """Mark the group for deletion: the loop drains it (waits for the holder, or with ``force``
        preempts it) and then asks the provider to delete it. ``provider=False`` (a control plane
        serving without one): a group no provider ever made (``REQUESTED``, no slices) is removed at
        once, as nothing would ever make or delete it."""
        self.get(name)
        with self.store.tx() as s:
            row = s.get(SliceGroupRow, name)
            assert row is not None
            if not provider and row.state == REQUESTED and not row.slices:
                row.deleted_at = row.updated_at = self.store.clock()
                row.delete_requested_at = row.delete_requested_at or row.deleted_at
                row.state, row.message = "DELETED", "no provider had made it"
                self.store.add_event(
                    s, f"slice group {name}: deleted (no provider had made it)", kind="slice-group"
                )
                return _record(row)
            row.force = row.force or force
            if row.delete_requested_at is None:
                row.delete_requested_at = self.store.clock()
                self.store.add_event(
                    s,
                    f"slice group {name}: delete requested{' (force)' if force else ''}",
                    kind="slice-group",
                )
            row.updated_at = self.store.clock()
            return _record(row)

    # -- what the provisioning loop writes ---------------------------------------------------------
    def set_state(self, name: str, state: str, message: str, slices: list[str]) -> GroupRecord | None:
        """Record what the provider said; new physical slices get their ``up_at``."""
        now = self.store.clock()
        with self.store.tx() as s:
            row = s.get(SliceGroupRow, name)
            if row is None or row.deleted_at is not None:
                return None
            known = {str(x["name"]): dict(x) for x in row.slices or ()}
            for slice_name in slices:
                known.setdefault(slice_name, {"name": slice_name, "up_at": now})
            listed = sorted(known.values(), key=lambda x: str(x["name"]))
            if (row.state, row.message or "", row.slices) != (state, message, listed):
                if row.state != state:
                    what = f"slice group {name}: {state}" + (f" ({message})" if message else "")
                    self.store.add_event(s, what, kind="slice-group")
                row.state, row.message, row.slices, row.updated_at = state, message, listed, now
            return _record(row)

    def slice_down(self, name: str, slice_name: str) -> None:
        """A physical slice of the group went away (preempted): it stops counting from now."""
        now = self.store.clock()
        with self.store.tx() as s:
            row = s.get(SliceGroupRow, name)
            if row is None:
                return
            listed = [dict(x) for x in row.slices or ()]
            for x in listed:
                if x["name"] == slice_name and "down_at" not in x:
                    x["down_at"] = now
            row.slices = listed

    def mark_deleted(self, name: str) -> list[str]:
        """The provider no longer has the group: it and its slices are gone; returns the slices
        still held (they leave the table once their holder's attempt ended)."""
        now = self.store.clock()
        with self.store.tx() as s:
            row = s.get(SliceGroupRow, name)
            if row is None or row.deleted_at is not None:
                return []
            row.deleted_at = row.updated_at = now
            row.state = "DELETED"
            row.slices = [{**x, "down_at": x.get("down_at", now)} for x in row.slices or ()]
            self.store.add_event(s, f"slice group {name}: deleted", kind="slice-group")
        return self.forget_slices([str(x["name"]) for x in row.slices])

    def forget_slices(self, names: list[str]) -> list[str]:
        """Take deleted groups' slices out of the slices table; returns those still held (their
        holder's attempt is still ending: try again later)."""
        with self.store.tx() as s:
            held = []
            for slice_row in s.scalars(select(SliceRow).where(SliceRow.name.in_(names))):
                if slice_row.holder is None:
                    s.delete(slice_row)
                    self.store.add_event(s, LEFT, slice=slice_row.name, kind="slice")
                else:
                    held.append(slice_row.name)
            return held

    # -- utilization --------------------------------------------------------------------------------
    def utilization(self, name: str, window_s: float) -> dict[str, Any]:
        """Held fraction of the group's slices over the last ``window_s`` seconds, and who held them,
        from the attempts the store recorded (an attempt holds its slices from admission to its end)."""
        if not window_s > 0:
            raise SpecError(f"the window must be above 0 seconds, got {window_s!r}", field="window")
        group = self.get(name)
        now = self.store.clock()
        start = now - window_s
        up: dict[str, tuple[float, float]] = {}
        for x in group.slices:
            lo, hi = max(start, float(x["up_at"])), min(now, float(x.get("down_at", now)))
            if hi > lo:
                up[str(x["name"])] = (lo, hi)
        held: dict[str, float] = defaultdict(float)
        holders: dict[tuple[str, str], float] = defaultdict(float)
        with self.store.tx() as s:
            rows = s.execute(
                select(AttemptRow, JobRow.tenant)
                .join(JobRow, JobRow.id == AttemptRow.job_id)
                .where(AttemptRow.admitted_at <= now)
                .where((AttemptRow.ended_at.is_(None)) | (AttemptRow.ended_at >= start))
            ).all()
        for attempt, tenant in rows:
            for slice_name in attempt.slices or ():
                if slice_name not in up:
                    continue
                lo, hi = up[slice_name]
                a_lo = max(lo, attempt.admitted_at)
                a_hi = min(hi, attempt.ended_at if attempt.ended_at is not None else now)
                if a_hi > a_lo:
                    held[slice_name] += a_hi - a_lo
                    holders[(tenant, attempt.job_id)] += a_hi - a_lo
        total = sum(hi - lo for lo, hi in up.values())
        return {
            "name": group.name,
            "window_s": window_s,
            "slice_seconds": round(total, 3),
            "held_seconds": round(sum(held.values()), 3),
            "utilization": round(sum(held.values()) / total, 4) if total > 0 else 0.0,
            "slices": [
                {
                    "name": n,
                    "up_seconds": round(hi - lo, 3),
                    "held_seconds": round(held[n], 3),
                    "utilization": round(held[n] / (hi - lo), 4),
                }
                for n, (lo, hi) in sorted(up.items())
            ],
            "holders": [
                {"tenant": t, "job": j, "seconds": round(sec, 3), "fraction": round(sec / total, 4)}
                for (t, j), sec in sorted(holders.items(), key=lambda kv: -kv[1])
            ],
            "device_metrics": None,  # from the observability readers, where they are wired in
        }
