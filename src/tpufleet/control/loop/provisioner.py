"""The provisioning loop: provider states in, autoscaler and slice-manager actions out, once a cycle.

``Provisioner`` sits between the scheduling loop and a :class:`~tpufleet.provision.base.Provider`.
The service takes it as a collaborator (``Service(provisioner=...)``, which ``ControlPlane`` builds
from a provider and a ``ProvisionConfig``): each cycle it runs :meth:`Provisioner.step` on the
cycle's snapshot (1 to 4: the provider's I/O and the store writes it causes), then
:meth:`Provisioner.decide` (5 and 6, pure): the policy on an adjusted snapshot, then the reasons of
jobs waiting on slices being made:

1. **Poll.** Every group's provider state goes into the store (``slice_groups``); a group the
   provider no longer has, after a delete, is marked deleted and its free slices leave the table.
   They never come back: :meth:`Provisioner.retired` names the slices of every deleted group, and
   the service's inventory (``Transitions.sync_slices``) never discovers one again from what Ray
   still lists of its hosts (dying, or dead and kept in Ray's node table).
2. **Spot notices.** A physical slice with a ``preempt_deadline`` ends its holder's attempt at once
   (``StopKind.SPOT``: every process gets SIGTERM, the checkpoint signal; the job is requeued
   without using a retry, reason ``PREEMPTED_BY_PROVIDER``), and no new job is placed on it.
3. **Deletes.** A group whose delete was asked drains: no new job is placed on its slices; with
   ``force`` its holders are preempted (``StopKind.PREEMPT``: SIGTERM, grace, requeue); once none
   holds a slice, the provider is asked to delete it, never in the step that first saw the request:
   between the two, the service gives the group's slices back to the cluster (:meth:`closing`: the
   warm pool's reservation and idle runners), so the hosts are idle when the provider ends them and
   Ray can drain them as an autoscaler's scale-in does (a meant death, not a crash).
4. **Autoscale.** ``scheduler.autoscale.plan`` on the snapshot, the fleet spec's pools and the
   autoscaler's groups; its ``Create``\\ s become groups ``<pool>-<n>`` asked of the provider, its
   ``Delete``\\ s delete requests (carried out as 3 says, from the next step on).
5. **Policy.** Slices being deleted or noticed are shown to the policy as ``DRAINING``; a private
   group's slices are offered only to its tenant's jobs (a first pass with those jobs alone, whose
   admissions count against the tenant's quota like any other).
6. **Reasons.** A job the autoscaler is making slices for waits ``PROVISIONING`` (or
   ``WAITING_FOR_CAPACITY`` when the provider has none), with the provider's own message.

A provider error never ends the cycle: it is logged and shown on the groups it concerns.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tpufleet.control.store import slicegroups as g
from tpufleet.control.store.facade import Store
from tpufleet.control.store.loopwrites import Transitions
from tpufleet.control.store.slicegroups import SliceGroups
from tpufleet.provision.base import GroupState, GroupStatus, Provider, SliceRequest
from tpufleet.scheduler.autoscale import Create, Delete, Managed, Phase, Plan, PoolView, ScaleSnapshot, plan
from tpufleet.scheduler.lifecycle import StopKind
from tpufleet.scheduler.model import (
    Admit,
    JobId,
    JobState,
    NotFit,
    NotFitCode,
    RunDecision,
    SliceName,
    SliceState,
    Snapshot,
    TenantName,
    Wait,
    Waits,
)

log = logging.getLogger(__name__)
# Deleted groups are read whole once, then each cycle those deleted since the last read less this
# much (a margin for clocks: another replica may have written the deletion).
REREAD_S = 3600.0

Decide = Callable[[Snapshot], Sequence[RunDecision]]

_PHASES = {
    g.REQUESTED: Phase.PENDING,
    GroupState.WAITING_FOR_RESOURCES: Phase.PENDING,
    GroupState.PROVISIONING: Phase.PENDING,
    GroupState.ACTIVE: Phase.READY,
    GroupState.FAILED: Phase.FAILED,
    GroupState.SUSPENDED: Phase.GONE,
    GroupState.DELETING: Phase.DELETING,
}


@dataclass(frozen=True)
class ProvisionConfig:
    pools: tuple[PoolView, ...] = ()
    initial: tuple[tuple[str, int], ...] = ()  # (pool, slices) made on the first cycle
    idle_timeout_s: float = 60.0
    retry_after_s: float = 10.0
    borrowing: bool = True  # borrowers may make slices out of quota other tenants leave unused
    autoscale: bool = True  # False: only the slice manager's groups, no Create/Delete of its own


class Provisioner:
    def __init__(self, store: Store, provider: Provider, config: ProvisionConfig | None = None) -> None:
        self.store = store
        self.provider = provider
        self.config = config or ProvisionConfig()
        self.groups = SliceGroups(store)
        self.tr = Transitions(store)
        self.clock = store.clock
        self._status: dict[str, GroupStatus] = {}
        self._since: dict[str, tuple[str, float]] = {}  # group -> (state, since)
        self._idle: dict[str, float] = {}  # physical slice -> free since
        self._asked: set[str] = set()  # groups given to the provider by this process
        self._deleting: set[str] = set()
        self._closing: dict[str, tuple[str, ...]] = {}  # group -> slices: its delete asked, seen by a step
        self._noticed: set[str] = set()  # physical slices with a preemption notice
        self._orphans: set[str] = set()  # slices of deleted groups still held when the group went
        self._gone: set[str] = set()  # slices of every deleted group (some maybe made again since)
        self._gone_read: float | None = None  # when deleted groups were last read
        self._retired: frozenset[str] = frozenset()  # _gone less the slices of live groups
        self._private: dict[SliceName, TenantName] = {}
        self._plan: Plan | None = None
        self._bootstrapped = False

    # -- the service's collaborator ---------------------------------------------------------------
    def decide(self, policy: Decide, snapshot: Snapshot) -> list[RunDecision]:
        """5 and 6 on the snapshot of this cycle, after :meth:`step`: pure (no provider call, no
        write): the policy on the slices left open, and the reasons of jobs waiting on slices being
        made."""
        return self.rewrite(self.place(policy, snapshot))

    def close(self) -> None:
        self.provider.close()

    # -- 1 to 4 ------------------------------------------------------------------------------------
    def step(self, snapshot: Snapshot) -> None:
        now = self.clock()
        self._poll(now)
        records = self.groups.all()
        self._private = {
            SliceName(name): TenantName(r.tenant) for r in records if r.tenant for name in r.slice_names
        }
        live = {n for r in records for n in r.slice_names}
        self._retired = frozenset(self._gone - live)
        self._spot_notices(snapshot)
        seen = self._closing
        self._closing = {r.name: tuple(r.slice_names) for r in records if r.delete_requested_at is not None}
        self._drain_deletes(snapshot, [r for r in records if r.name in seen])
        self._ask(records)
        if self.config.autoscale:
            self._autoscale(self._closed(snapshot), records, now)

    def closing(self) -> frozenset[str]:
        """The slices of groups whose delete was asked (as of the last step) and of deleted ones
        (:meth:`retired`): the service takes them out of its warm pool before the provider is asked
        to delete them (3 above), and keeps them out."""
        return self._retired.union(*self._closing.values())

    def retired(self) -> frozenset[str]:
        """The slices of every deleted group, less those of live groups (a group made again under an
        old name): never discovered again from Ray's node table, and never offered to the policy.
        The service reads it before its inventory each cycle."""
        since = 0.0 if self._gone_read is None else self._gone_read - REREAD_S
        self._gone_read = self.clock()
        self._gone.update(n for r in self.groups.deleted_since(since) for n in r.slice_names)
        live = {n for r in self.groups.all() for n in r.slice_names}
        self._retired = frozenset(self._gone - live)
        return self._retired

    def _poll(self, now: float) -> None:
        if self._orphans:
            self._orphans = set(self.groups.forget_slices(sorted(self._orphans)))
        try:
            statuses = {s.name: s for s in self.provider.poll()}
        except Exception as err:
            log.warning("the provider could not be polled: %s", err)
            return
        self._status = statuses
        for record in self.groups.all():
            status = statuses.get(record.name)
            if status is None:
                if record.name in self._deleting or (
                    record.delete_requested_at and record.name in self._asked
                ):
                    self._orphans.update(self.groups.mark_deleted(record.name))
                    self._gone.update(record.slice_names)
                    self._deleting.discard(record.name)
                continue
            self._asked.add(record.name)
            self.groups.set_state(
                record.name, str(status.state), status.message, [p.name for p in status.slices]
            )
            for p in status.slices:
                if any(str(h) == "PREEMPTED" for h in p.hosts):
                    self.groups.slice_down(record.name, p.name)
            state = str(status.state)
            if self._since.get(record.name, ("", 0.0))[0] != state:
                self._since[record.name] = (state, now)

    def _spot_notices(self, snapshot: Snapshot) -> None:
        holders = {v.name: v.holder for v in snapshot.slices if v.holder}
        self._noticed = set()
        for status in self._status.values():
            for p in status.slices:
                if p.preempt_deadline is None:
                    continue
                self._noticed.add(p.name)
                job = holders.get(SliceName(p.name))
                if job is not None:
                    left = max(0.0, p.preempt_deadline - self.clock())
                    why = f"the provider preempts spot slice {p.name} in {left:.0f} s ({status.name})"
                    self.tr.begin_stop(job, StopKind.SPOT, why)

    def _drain_deletes(self, snapshot: Snapshot, records: list[g.GroupRecord]) -> None:
        holders = {v.name: v.holder for v in snapshot.slices if v.holder}
        for record in records:
            if record.delete_requested_at is None or record.name in self._deleting:
                continue
            held = {holders[SliceName(n)] for n in record.slice_names if SliceName(n) in holders}
            if held and record.force:
                for job in sorted(held):
                    why = f"slice group {record.name} is being deleted (force)"
                    self.tr.begin_stop(job, StopKind.PREEMPT, why)
            if held:
                continue
            self._delete(record.name, record.force)

    def _delete(self, name: str, force: bool) -> None:
        try:
            self.provider.delete(name, force=force)
            self._deleting.add(name)
        except Exception as err:
            log.warning("provider delete of %s failed: %s", name, err)
            self.groups.set_state(name, "FAILED", f"delete failed: {err}", [])

    def _ask(self, records: list[g.GroupRecord]) -> None:
        """Give the provider every stored group it does not know yet (creates are idempotent)."""
        for record in records:
            if record.name in self._asked or record.name in self._status or record.delete_requested_at:
                continue
            request = SliceRequest(
                record.name, record.accelerator_type, record.count, record.spot, record.tenant
            )
            try:
                self.provider.create(request)
                self._asked.add(record.name)
            except Exception as err:  # not asked again: a manual group stays FAILED until deleted
                self._asked.add(record.name)
                log.warning("provider create of %s failed: %s", record.name, err)
                self.groups.set_state(record.name, str(GroupState.FAILED), f"create failed: {err}", [])
                self._since[record.name] = (str(GroupState.FAILED), self.clock())

    def _autoscale(self, snapshot: Snapshot, records: list[g.GroupRecord], now: float) -> None:
        held = {v.name for v in snapshot.slices if v.holder or v.state is SliceState.HELD}
        for v in snapshot.slices:
            if v.name in held:
                self._idle.pop(v.name, None)
            else:
                self._idle.setdefault(v.name, now)
        managed = []
        for r in records:
            if r.origin != g.AUTOSCALER or r.pool is None:
                continue
            state, since = self._since.get(r.name, (r.state, r.created_at))
            phase = (
                Phase.DELETING if r.delete_requested_at or r.name in self._deleting else _PHASES.get(state)
            )
            if phase is None:
                continue
            name = r.slice_names[0] if r.slice_names else None
            if name in self._noticed:
                phase = Phase.GONE
            idle = now - self._idle[name] if name is not None and name in self._idle else None
            managed.append(
                Managed(
                    r.name,
                    r.pool,
                    phase,
                    SliceName(name) if name else None,
                    r.spot,
                    now - since,
                    idle,
                    JobId(r.for_job) if r.for_job else None,
                )
            )
        scale = ScaleSnapshot(
            snapshot,
            self.config.pools,
            managed,
            idle_timeout_s=self.config.idle_timeout_s,
            retry_after_s=self.config.retry_after_s,
            private=self._private,
            borrowing=self.config.borrowing,
        )
        result = plan(scale)
        made: dict[JobId, list[str]] = {}
        for action in self._bootstrap(records) + result.actions:
            if isinstance(action, Delete):
                log.info("autoscaler: delete %s (%s)", action.group, action.reason)
                self.groups.request_delete(action.group)
                names = next((r.slice_names for r in records if r.name == action.group), [])
                self._closing[action.group] = tuple(names)
            else:
                name = self._create(action)
                if name and action.for_job:
                    made.setdefault(action.for_job, []).append(name)
        if made:  # what the provider says of the new requests, for the waiting jobs' reasons
            try:
                self._status = {st.name: st for st in self.provider.poll()}
            except Exception as err:
                log.warning("the provider could not be polled: %s", err)
        waiting = {job: (*groups_, *made.get(job, ())) for job, groups_ in result.waiting.items()}
        self._plan = replace(result, waiting=waiting)

    def _bootstrap(self, records: list[g.GroupRecord]) -> list[Create]:
        """The pools' ``slices`` count on the very first cycle of a fresh store."""
        if self._bootstrapped:
            return []
        self._bootstrapped = True
        if any(r.origin == g.AUTOSCALER for r in self.groups.all(include_deleted=True)):
            return []
        pools = {p.name: p for p in self.config.pools}
        return [
            Create(pool, pools[pool].accelerator_type, pools[pool].spot)
            for pool, count in self.config.initial
            if pool in pools
            for _ in range(count)
        ]

    def _create(self, action: Create) -> str | None:
        serial = 1 + self.groups.count(action.pool)
        name = f"{action.pool}-{serial}"
        while True:
            try:
                self.groups.get(name)
            except Exception:
                break
            serial += 1
            name = f"{action.pool}-{serial}"
        try:
            self.groups.create(
                name,
                action.accelerator_type,
                1,
                spot=action.spot,
                origin=g.AUTOSCALER,
                pool=action.pool,
                for_job=action.for_job,
            )
        except Exception as err:
            log.warning("could not record slice group %s: %s", name, err)
            return None
        self._ask([self.groups.get(name)])
        return name

    # -- 5. the policy on an adjusted snapshot -------------------------------------------------------
    def _closed(self, snapshot: Snapshot) -> Snapshot:
        """Free slices that are noticed for preemption or whose group is being deleted, as DRAINING."""
        closed = self._noticed | self.closing()
        slices = [
            replace(v, state=SliceState.DRAINING) if v.name in closed and v.state is SliceState.FREE else v
            for v in snapshot.slices
        ]
        return replace(snapshot, slices=slices)

    def place(self, inner: Decide, snapshot: Snapshot) -> list[RunDecision]:
        slices = list(self._closed(snapshot).slices)
        if not self._private:
            return list(inner(replace(snapshot, slices=slices)))
        active = [j for j in snapshot.jobs if j.state is not JobState.QUEUED]
        queued = [j for j in snapshot.jobs if j.state is JobState.QUEUED]
        decisions: list[RunDecision] = []
        admitted: set[JobId] = set()
        for tenant in sorted(set(self._private.values())):
            own = [v for v in slices if self._private.get(v.name) == tenant]
            mine = [j for j in queued if j.tenant == tenant]
            if not own or not mine:
                continue
            for d in inner(replace(snapshot, slices=own, jobs=[*active, *mine])):
                if isinstance(d, Admit):
                    decisions.append(d)
                    admitted.add(d.job)
        shared = [v for v in slices if v.name not in self._private]
        rest = [j for j in queued if j.id not in admitted]
        decisions += inner(replace(snapshot, slices=shared, jobs=[*active, *rest]))
        return decisions

    # -- 6. reasons ----------------------------------------------------------------------------------
    def rewrite(self, decisions: list[RunDecision]) -> list[RunDecision]:
        waiting = self._plan.waiting if self._plan else {}
        if not waiting:
            return decisions
        out: list[RunDecision] = []
        for d in decisions:
            if isinstance(d, Waits) and not waiting.keys().isdisjoint(j.id for j in d.jobs):
                out.extend(self.rewrite(d.each()))  # type: ignore[arg-type]  # a run with such jobs
                continue
            if isinstance(d, Wait) and d.job in waiting:
                reason = self._reason(waiting[d.job])
                if reason is not None:
                    d = Wait(d.job, reason, d.head_of_line)
            out.append(d)
        return out

    def _reason(self, names: tuple[str, ...]) -> NotFit | None:
        if not names:
            return None
        parts = []
        capacity = False
        for name in names:
            status = self._status.get(name)
            state = str(status.state) if status else g.REQUESTED
            message = status.message if status else "asked of the provider"
            capacity = capacity or state == GroupState.WAITING_FOR_RESOURCES
            parts.append(f"{name} {state}" + (f": {message}" if message else ""))
        code = NotFitCode.WAITING_FOR_CAPACITY if capacity else NotFitCode.PROVISIONING
        kind = self.provider.kind
        return NotFit(code, f"waiting for slices the {kind} provider is making: {'; '.join(parts)}"[:2000])
