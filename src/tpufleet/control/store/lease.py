"""The leader lease of the replicas on one database, and the fencing of the loop's writes.

Any number of ``tpufleet serve`` processes (replicas) may share one PostgreSQL database; the one
that holds the lease (the leader) runs the loop. The lease is one row, ``leader_lease`` (id 1):
``holder`` (a replica id, ``hostname:pid:random``), ``token`` (the fencing token), ``expires_at``
and ``since``. Every change of it is ONE conditional statement, timed by the database's own clock
(``clock_timestamp()`` on PostgreSQL, ``julianday('now')`` on SQLite), so replicas whose clocks
disagree still agree on who leads:

- **acquire**: ``UPDATE ... SET holder = me, token = token + 1, expires_at = now + lease_s, since = now
  WHERE expires_at < now`` (the row is inserted with token 1 by the first replica ever to lead);
- **renew**: ``UPDATE ... SET expires_at = now + lease_s WHERE holder = me AND token = mine``;
- **release** (SIGTERM, a handover): ``UPDATE ... SET expires_at = now - 1 WHERE holder = me AND
  token = mine``: a standby takes over at its next poll instead of waiting for expiry.

**Fencing.** :meth:`Lease.check` runs first in each transaction of the loop (``Store.fenced``): it
reads the row ``FOR SHARE`` on PostgreSQL (a row lock held to the transaction's end, so a takeover's
UPDATE waits for a write that passed the check to commit, and any write after the takeover sees
the new token; a transaction left idle for a lease length, its replica paused, is ended by the
server, so it never holds a takeover up for longer) and raises :class:`FencedError` when the token
is no longer the one the loop's term began with: the transaction rolls back and nothing of it is
written. SQLite has one replica only (``serve`` locks the database file), so there the check is a
plain read.

A leader acquires, renews every ``renew_s`` and is fenced within ``lease_s`` of its last renewal;
a standby polls every ``renew_s``: it takes over at most ``lease_s + renew_s`` after the leader's
last renewal (its death), at once after a release.
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, text
from sqlalchemy.exc import IntegrityError

from tpufleet.control.store.database import Database, FenceStamp

__all__ = ["LEASE_S", "RENEW_S", "FencedError", "Lease", "LeaseState", "replica_id"]

LEASE_S = 5.0  # a leader that has not renewed for this long may be replaced
RENEW_S = 1.0  # a leader renews, and a standby polls, this often
_ROW = 1


class FencedError(Exception):
    """A write of the loop was refused: the lease's fencing token is no longer this replica's term
    (another replica took over). Nothing of the transaction was written; the replica stops acting
    and becomes a standby. Not a user's error: never shown as one."""


def replica_id() -> str:
    """``hostname:pid:random``: unique per process, and says where the process runs."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


@dataclass(frozen=True)
class LeaseState:
    """The lease row as read, with the database's clock at the read (``now``)."""

    holder: str | None
    token: int
    expires_at: float
    since: float
    now: float

    @property
    def live(self) -> bool:
        return self.holder is not None and self.expires_at >= self.now


# A transaction that holds the lease row (the fence's share lock, a renewal's update) must not hold
# it for ever when its replica is paused (SIGSTOP, a long GC) or cut off mid-transaction: that
# would keep every standby from taking over. PostgreSQL ends such a session once it sat idle in its
# transaction for a lease length (the rows it locked come free; the replica's next write finds
# itself deposed). SET LOCAL: only the lease's and the loop's transactions, never the API's.
_IDLE_LIMIT = "set_config('idle_in_transaction_session_timeout', :idle, true)"


def _idle_limit(conn: Connection, ms: str) -> None:
    if conn.dialect.name == "postgresql":
        conn.execute(text(f"SELECT {_IDLE_LIMIT}"), {"idle": ms})


def _now(conn: Connection) -> str:
    """The database's clock, in seconds since the epoch, as SQL."""
    if conn.dialect.name == "postgresql":
        return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"
    return "((julianday('now') - 2440587.5) * 86400.0)"


class Lease:
    """One replica's side of the lease on ``store``'s database (no I/O in the constructor)."""

    def __init__(
        self,
        store: Database,
        replica: str | None = None,
        *,
        lease_s: float = LEASE_S,
        renew_s: float = RENEW_S,
    ) -> None:
        if not 0 < renew_s < lease_s:
            raise ValueError(f"renew_s ({renew_s}) must be above 0 and below lease_s ({lease_s})")
        self.store = store
        self.replica = replica or replica_id()
        self.lease_s = lease_s
        self.renew_s = renew_s
        self.token: int | None = None  # the token of the term this replica holds; None: standby
        self.since: float | None = None  # when this term began (database clock)

    def _idle_ms(self) -> str:
        return str(max(1, int(self.lease_s * 1000)))

    # -- the lease -----------------------------------------------------------------------------
    def acquire(self) -> bool:
        """Take the lease when it is free or expired (a new term: token + 1, an audit event).
        True when this replica leads now (already held: renewed instead)."""
        if self.token is not None:
            return self.renew()
        try:
            return self._acquire()
        except IntegrityError:  # the first row, inserted by another replica at the same time
            return False

    def _acquire(self) -> bool:
        with self.store.tx() as s:
            conn = s.connection()
            _idle_limit(conn, self._idle_ms())
            now = _now(conn)
            taken = conn.execute(
                text(
                    f"UPDATE leader_lease SET holder = :me, token = token + 1, expires_at = {now} + :len, "
                    f"since = {now} WHERE id = :id AND expires_at < {now}"
                ),
                {"me": self.replica, "len": self.lease_s, "id": _ROW},
            ).rowcount
            if not taken and self._first(conn):
                taken = 1
            if not taken:
                return False
            token, since, took = conn.execute(
                text(f"SELECT token, since, {now} FROM leader_lease WHERE id = :id"), {"id": _ROW}
            ).one()
            # The term's first stamped write: the database's clock once the UPDATE above holds the
            # row (after the deposed term's last fenced write committed), never ``since``, which
            # the UPDATE may have computed before it waited for that write's share lock.
            self.store.add_event(
                s,
                f"replica {self.replica} leads (fencing token {token})",
                kind="leader",
                actor=self.replica,
                stamp=FenceStamp(int(token), float(took)),
            )
        self.token, self.since = int(token), float(since)
        return True

    def _first(self, conn: Connection) -> bool:
        """Insert the row as the first leader ever (token 1); False when it exists."""
        if conn.execute(text("SELECT 1 FROM leader_lease WHERE id = :id"), {"id": _ROW}).first():
            return False
        now = _now(conn)
        conn.execute(
            text(
                "INSERT INTO leader_lease (id, holder, token, expires_at, since) "
                f"VALUES (:id, :me, 1, {now} + :len, {now})"
            ),
            {"id": _ROW, "me": self.replica, "len": self.lease_s},
        )  # another replica's insert first: an IntegrityError, and this acquisition fails (acquire)
        return True

    def renew(self) -> bool:
        """Extend this replica's term; False (and standby now) when the lease was taken over."""
        if self.token is None:
            return False
        with self.store.tx() as s:
            conn = s.connection()
            _idle_limit(conn, self._idle_ms())
            now = _now(conn)
            kept = conn.execute(
                text(
                    f"UPDATE leader_lease SET expires_at = {now} + :len "
                    "WHERE id = :id AND holder = :me AND token = :tok"
                ),
                {"len": self.lease_s, "id": _ROW, "me": self.replica, "tok": self.token},
            ).rowcount
        if not kept:
            self.token = self.since = None
        return bool(kept)

    def release(self) -> bool:
        """Hand the lease over at once (it expires now); True when this replica held it."""
        if self.token is None:
            return False
        with self.store.tx() as s:
            conn = s.connection()
            _idle_limit(conn, self._idle_ms())
            done = conn.execute(
                text(
                    f"UPDATE leader_lease SET expires_at = {_now(conn)} - 1 "
                    "WHERE id = :id AND holder = :me AND token = :tok"
                ),
                {"id": _ROW, "me": self.replica, "tok": self.token},
            ).rowcount
            if done:
                self.store.add_event(
                    s,
                    f"replica {self.replica} hands over the lease (fencing token {self.token})",
                    kind="leader",
                    actor=self.replica,
                )
        self.token = self.since = None
        return bool(done)

    def record_end(self, token: int | None, refused: int) -> None:
        """An audit event: this replica's term ``token`` is over (fenced, or the lease lost), with
        how many of its loop's transactions the fence refused. Written unfenced: a record, not
        the loop's state."""
        what = f"replica {self.replica} stopped leading (fencing token {token}); writes refused: {refused}"
        with self.store.tx() as s:
            self.store.add_event(s, what, kind="leader", actor=self.replica)

    def step_down(self) -> None:
        """Forget this replica's term without a write (it was fenced: another leads)."""
        self.token = self.since = None

    def read(self) -> LeaseState | None:
        """The lease row and the database's clock; None when no replica ever led."""
        with self.store.tx() as s:
            conn = s.connection()
            row = conn.execute(
                text(
                    f"SELECT holder, token, expires_at, since, {_now(conn)} FROM leader_lease WHERE id = :id"
                ),
                {"id": _ROW},
            ).first()
        if row is None:
            return None
        return LeaseState(row[0], int(row[1]), float(row[2]), float(row[3]), float(row[4]))

    # -- fencing -------------------------------------------------------------------------------
    def check(self, conn: Connection, token: int | None) -> FenceStamp:
        """Fence a transaction of term ``token``: raise :class:`FencedError` unless the lease still
        has that token (see the module docstring); else the stamp its writes carry (the token and
        the database's clock at the check). Runs first in the transaction; on PostgreSQL it also
        bounds how long the transaction may sit idle (:func:`_idle_limit`)."""
        if conn.dialect.name == "postgresql":
            query = f"SELECT token, {_now(conn)}, {_IDLE_LIMIT} FROM leader_lease WHERE id = :id FOR SHARE"
        else:
            query = f"SELECT token, {_now(conn)} FROM leader_lease WHERE id = :id"
        row: Any = conn.execute(text(query), {"id": _ROW, "idle": self._idle_ms()}).first()
        have = None if row is None else row[0]
        if token is None or have != token:
            raise FencedError(
                f"replica {self.replica} may not write: the lease's fencing token is {have}, "
                f"this replica's term is {token}"
            )
        return FenceStamp(int(have), float(row[1]))
