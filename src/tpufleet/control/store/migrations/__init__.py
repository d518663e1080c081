"""Schema migrations: Alembic revisions that ship in the package, run from code.

There is no ``alembic.ini`` and no ``env.py``: :func:`upgrade` drives Alembic's
``MigrationContext`` over the revisions in ``versions/`` (a plain :class:`ScriptDirectory`), on a
connection of the store's own engine, so ``tpufleet serve`` and ``tpufleet db upgrade`` need nothing
but the database URL.

What :func:`upgrade` does with a database:

- **empty** (none of tpufleet's tables): ``Base.metadata.create_all`` and stamp the head revision
  (``tests/unit/test_migrations.py`` proves that running every revision gives the same schema);
- **at a known revision**: run the revisions after it, in order;
- **pre-migration** (tpufleet's tables, no ``alembic_version``; written before migrations existed):
  stamp the baseline, then upgrade. Revisions of that first round tolerate what a ``create_all`` of
  the time may already have made (the ``packages`` table, the ``log_cursors`` columns);
- **at a revision this code does not know** (a newer tpufleet wrote it): refused with a
  :class:`SchemaError`; nothing is changed.

On PostgreSQL the whole upgrade is one transaction under an advisory lock, so two processes that
open one database at once migrate it once.

Adding a column or table: change ``control/store/tables.py``, add ``versions/rNNNN_<what>.py`` whose
``down_revision`` is the current head, and run ``tests/unit/test_migrations.py``: it compares the
migrated schema with ``Base.metadata`` on SQLite and PostgreSQL and prints the operations missing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from alembic.migration import MigrationContext
from alembic.operations import Operations
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, inspect, text

from tpufleet.control.store.tables import Base
from tpufleet.errors import TpufleetError

__all__ = [
    "BASELINE",
    "Migration",
    "SchemaError",
    "check",
    "current",
    "head",
    "known",
    "upgrade",
]

HERE = Path(__file__).resolve().parent
BASELINE = "0001"
"""The schema that landed before migrations existed (``git show f6094b2:.../schema.py``)."""
BASELINE_TABLES = frozenset(
    {"tenants", "tokens", "jobs", "slices", "attempts", "events", "log_cursors", "log_chunks"}
)
_PG_LOCK_KEY = 0x7470_7566  # "tpuf": pg_advisory_xact_lock key for upgrades


class SchemaError(TpufleetError):
    """The database's schema is one this tpufleet cannot use (newer, or not tpufleet's)."""


@dataclass(frozen=True)
class Migration:
    """What :func:`upgrade` did: the revision before (None: none recorded) and after."""

    before: str | None
    after: str
    how: str  # "created", "upgraded", "stamped and upgraded", "current"

    def describe(self) -> str:
        if self.how == "current":
            return f"schema at revision {self.after} (current); nothing to do"
        if self.how == "created":
            return f"created the schema at revision {self.after}"
        if self.how == "stamped":
            return f"pre-migration schema stamped as revision {self.before}, upgraded to {self.after}"
        return f"upgraded the schema from revision {self.before} to {self.after}"


@functools.cache
def script_directory() -> ScriptDirectory:
    """The package's revisions, read once per process: a new ``ScriptDirectory`` executes every
    revision file again to learn the graph (~30 ms; each ``Store.open`` asked for it three times)."""
    return ScriptDirectory(str(HERE))


def head() -> str:
    rev = script_directory().get_current_head()
    assert rev is not None
    return rev


def current(conn: Connection) -> str | None:
    """The revision recorded in the database (None: no ``alembic_version`` or an empty one)."""
    return MigrationContext.configure(conn).get_current_revision()


def known() -> set[str]:
    """Every revision this code has."""
    return {s.revision for s in script_directory().walk_revisions()}


def check(conn: Connection, where: str) -> None:
    """Raise :class:`SchemaError` unless the database is at the head revision."""
    have, want = current(conn), head()
    if have == want:
        return
    if have is not None and have not in known():
        raise _newer(where, have)
    raise SchemaError(
        f"the database {where} is at schema revision {have or 'none'} and this tpufleet needs {want}; "
        "run `tpufleet db upgrade`"
    )


def _newer(where: str, rev: str) -> SchemaError:
    return SchemaError(
        f"the database {where} is at schema revision {rev}, which this tpufleet does not know "
        f"(its newest is {head()}); a newer tpufleet wrote it: upgrade tpufleet to use it"
    )


def upgrade(engine: Engine, where: str, *, to: str | None = None) -> Migration:
    """Bring the database of ``engine`` to the head revision (see the module docstring).
    ``where`` names the database in errors (a URL without its password). ``to``: stop at that
    revision instead, and build an empty database by running the revisions, not ``create_all``
    (tests use it to check each revision)."""
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
        return _upgrade(conn, where, to)


def _upgrade(conn: Connection, where: str, to: str | None) -> Migration:
    script = script_directory()
    target = to or head()
    ctx = MigrationContext.configure(conn)
    before, how = ctx.get_current_revision(), "upgraded"
    if before is None:
        tables = set(inspect(conn).get_table_names()) & BASELINE_TABLES
        if not tables and to is None:  # an empty database
            Base.metadata.create_all(conn)
            ctx.stamp(script, target)
            return Migration(None, target, "created")
        if tables:  # written before migrations existed
            _check_baseline_tables(tables, where)
            ctx.stamp(script, BASELINE)
            before, how = BASELINE, "stamped"
    if before is not None and before not in known():
        raise _newer(where, before)
    if before == target:
        return Migration(before, target, "current")
    ctx = MigrationContext.configure(
        conn,
        opts={
            "target_metadata": Base.metadata,
            "fn": lambda rev, _ctx: script._upgrade_revs(target, rev),
        },
    )
    with Operations.context(ctx):
        ctx.run_migrations()
    return Migration(before, target, how)


def _check_baseline_tables(tables: set[str], where: str) -> None:
    missing = sorted(BASELINE_TABLES - tables)
    if missing:
        raise SchemaError(
            f"the database {where} has some of tpufleet's tables but not {', '.join(missing)}, and no "
            "schema revision; it is not a tpufleet database this version can upgrade"
        )
