"""The fleet's slices as the API sees them: list, drain, undrain; composed into
:class:`~tpufleet.control.store.facade.Store` as ``store.slices``. The loop keeps them in step
with the cluster (``loopwrites.Transitions.sync_slices``); a slice's state follows from its
columns (:func:`state_of`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select

from tpufleet.control.store import values as r
from tpufleet.control.store.database import Database, key_like
from tpufleet.control.store.tables import SliceRow
from tpufleet.errors import NotFoundError, closest, suggest

__all__ = ["SliceStore", "slice_record", "slice_state", "state_of"]


class SliceStore:
    """The slices in the database ``db``."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def all(self) -> list[r.SliceRecord]:
        with self._db.tx() as s:  # columns, no ORM objects: the loop reads every slice each cycle
            return [slice_record(x) for x in s.execute(select(*SliceRow.__table__.c).order_by(SliceRow.name))]

    def set_draining(self, name: str, draining: bool, *, actor: str | None = None) -> r.SliceRecord:
        """Drain a slice (no new job is placed on it; its holder runs to the end) or undrain it."""
        with self._db.tx() as s:
            row = s.get(SliceRow, name) if key_like(name) else None
            if row is None:
                names = s.scalars(select(SliceRow.name)).all()
                raise NotFoundError(f"slice {name!r} not found{suggest(closest(name, names))}")
            row.draining = draining
            row.state = slice_state(row)
            row.updated_at = self._db.clock()
            self._db.add_event(s, "drain" if draining else "undrain", slice=name, kind="slice", actor=actor)
            return slice_record(row)


def slice_state(row: SliceRow) -> str:
    """BROKEN when not intact, DRAINING when the admin drains it, HELD when an attempt holds it."""
    return state_of(row.problems, row.draining, row.holder)


def state_of(problems: Sequence[str] | None, draining: bool, holder: str | None) -> str:
    """:func:`slice_state` from a slice's columns."""
    if problems:
        return r.BROKEN
    if draining:
        return r.DRAINING
    return r.HELD if holder else r.FREE


def slice_record(x: Any) -> r.SliceRecord:
    """A slice as the store hands it out, from its row (an ORM object or a row of its columns)."""
    return r.SliceRecord(
        name=x.name,
        accelerator_type=x.accelerator_type,
        topology=x.topology,
        state=x.state,
        holder=x.holder,
        hosts=tuple(x.hosts or ()),
        problems=tuple(x.problems or ()),
        draining=x.draining,
    )
