"""Leadership of one replica: the lease kept (``control/store/lease.py``) and the loop's fence.

:class:`Leadership` runs a thread that, every ``renew_s``, renews the lease while this replica
leads, or tries to take it while it stands by. The service (``control/loop/service.py``) reads
:attr:`Leadership.term` before each cycle: a new term makes it start over as a restarted control
plane does (kept state forgotten, ``reconcile`` with the cluster), no term makes it stand by.

:meth:`Leadership.check` is the fence of the loop's store (``Store.fenced``): every transaction
the loop, its executor actions and its provisioner begin is checked against :attr:`acting`, the
term the loop's kept state belongs to; a refused one raises ``FencedError`` and counts in
:attr:`refused`, and the service ends that term (:meth:`deposed`): this replica stands by until
it takes the lease again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from sqlalchemy import Connection

from tpufleet.control.store.facade import FenceStamp
from tpufleet.control.store.lease import FencedError, Lease

__all__ = ["FencedError", "Leadership"]

log = logging.getLogger(__name__)


class Leadership:
    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.replica = lease.replica
        self.acting: int | None = None  # the term the loop acts in (set by the service)
        self.refused = 0  # transactions of the loop refused by the fence (a deposed term's)
        self.fenced: int | None = None  # the last term whose transaction the fence refused
        self.last_error: str | None = None  # the lease's last failure (the database did not answer)
        self.on_change: list[Callable[[], None]] = []  # called when this replica leads or stops leading
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what the service and the API read ---------------------------------------------------------
    @property
    def term(self) -> int | None:
        """The fencing token of the term this replica holds; None: it stands by."""
        return self.lease.token

    @property
    def since(self) -> float | None:
        return self.lease.since

    def leader(self) -> str | None:
        """The replica that holds a live lease (this one or another); None: none does now."""
        if self.lease.token is not None:
            return self.replica
        state = self.lease.read()
        return state.holder if state is not None and state.live else None

    # -- the fence ---------------------------------------------------------------------------------
    def check(self, conn: Connection) -> FenceStamp:
        """The loop's fence: raises ``FencedError`` unless the lease still has the acting term;
        else the stamp the transaction's writes carry. Takes no lock (it runs inside the loop's
        transaction, which may hold the lease row): the service calls :meth:`deposed` once the
        transaction is over."""
        term = self.acting
        try:
            return self.lease.check(conn, term)
        except FencedError as err:
            self.refused += 1
            self.fenced = term
            log.warning("%s", err)
            raise

    def deposed(self, term: int | None) -> None:
        """The loop's term ``term`` is over here (fenced, or the lease lost): an audit event says
        so, with the writes the fence refused (written through the API's store: it is a record,
        not the loop's state)."""
        with self._lock:
            if term is not None and self.lease.token == term:
                self.lease.step_down()
        self.acting = None
        try:
            self.lease.record_end(term, self.refused)
        except Exception as err:  # the database is gone: the log says it
            log.warning("term %s of replica %s is over (not recorded: %s)", term, self.replica, err)

    # -- the thread --------------------------------------------------------------------------------
    def step(self) -> None:
        """Renew the lease while leading, else try to take it; callbacks when that changed."""
        with self._lock:
            before = self.lease.token
            try:
                self.lease.acquire()  # renews when held
                self.last_error = None
            except Exception as err:  # the database did not answer: try again next step
                self.last_error = f"{type(err).__name__}: {err}"
                log.warning("the leader lease could not be kept or taken: %s", self.last_error)
            after = self.lease.token
        if after != before:
            if after is not None:
                log.warning("replica %s leads (fencing token %s)", self.replica, after)
            else:
                log.warning("replica %s lost the lease: standing by", self.replica)
            for call in self.on_change:
                call()

    def start(self) -> None:
        if self._thread is None:
            self.step()
            self._thread = threading.Thread(target=self._run, name="tpufleet-lease", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._halt.wait(self.lease.renew_s):
            self.step()

    def stop(self) -> None:
        """Stop keeping the lease and hand it over at once (SIGTERM, an upgrade): a standby takes
        over at its next poll instead of after the lease's expiry."""
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=self.lease.renew_s + 5)
            self._thread = None
        with self._lock:
            try:
                self.lease.release()
            except Exception as err:  # the database is gone: the lease expires on its own
                log.warning("could not hand over the lease: %s", err)
