"""The control plane's store: one database, and its parts by concern.

``Store(url)`` is a :class:`~tpufleet.control.store.database.Database` (the engine, a transaction
per call, the leader's fence, the journal of events) that composes what reads and writes it:

- ``store.jobs`` (:class:`~tpufleet.control.store.jobs.JobStore`): queue, read, cancel, logs;
- ``store.tenants`` (:class:`~tpufleet.control.store.tenants.TenantStore`): create, update, delete;
- ``store.tokens`` (:class:`~tpufleet.control.store.tokens.TokenStore`): issue, authenticate, revoke;
- ``store.packages`` (:class:`~tpufleet.control.store.packagestore.PackageStore`): working directories;
- ``store.slices`` (:class:`~tpufleet.control.store.slices.SliceStore`): list, drain;
- ``store.ray`` (:class:`~tpufleet.control.store.raysubmissions.RaySubmissions`): Ray's job API.

The scheduling loop's compare-and-set writes (``loopwrites.Transitions``) and the read models
(``usage``, ``fleetview``, ``listing``, ``slicegroups``) take the database itself.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from tpufleet.control.store import values as r
from tpufleet.control.store.database import Clock, Database, FenceStamp, new_job_id
from tpufleet.control.store.jobs import JobStore
from tpufleet.control.store.packagestore import PackageStore
from tpufleet.control.store.raysubmissions import RaySubmissions
from tpufleet.control.store.slices import SliceStore
from tpufleet.control.store.tables import JobRow, SliceRow
from tpufleet.control.store.tenants import TenantStore
from tpufleet.control.store.tokens import TokenStore

# Clock, FenceStamp and new_job_id: the database's, which callers of the store import from here
__all__ = ["Clock", "FenceStamp", "Store", "new_job_id"]


class Store(Database):
    """The database with its parts (see the module docstring). Thread-safe: one transaction per
    call. ``Store(url)`` does no I/O; :meth:`open` checks (and by default upgrades) the schema."""

    jobs: JobStore
    tenants: TenantStore
    tokens: TokenStore
    packages: PackageStore
    slices: SliceStore
    ray: RaySubmissions

    def _compose(self) -> None:
        """The parts, over this database (again on a :meth:`fenced` view: they write through its fence)."""
        self.packages = PackageStore(self)
        self.jobs = JobStore(self)
        self.tenants = TenantStore(self, self.jobs)
        self.tokens = TokenStore(self)
        self.slices = SliceStore(self)
        self.ray = RaySubmissions(self, self.jobs, self.packages)

    def counts(self) -> dict[str, Any]:
        """Queued and running jobs, and slices by state (``GET /api/v1/status``)."""
        with self.tx() as s:
            jobs = {st: n for st, n in s.execute(select(JobRow.state, func.count()).group_by(JobRow.state))}
            slices = {
                st: n for st, n in s.execute(select(SliceRow.state, func.count()).group_by(SliceRow.state))
            }
        return {
            "queued": jobs.get(r.QUEUED, 0),
            "running": sum(jobs.get(st, 0) for st in r.ACTIVE),
            "slices": slices,
        }
