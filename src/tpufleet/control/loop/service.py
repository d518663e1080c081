"""The scheduling loop: inventory -> act on what ended -> snapshot -> policy -> write -> act -> poll.

One cycle (:meth:`Service.run_once`):

1. **Inventory.** Slices from the cluster; one that is not intact turns ``BROKEN``. An attempt
   holding a broken slice is ended on every host and requeued while retries remain: the broken
   slice stays quarantined and the job resumes elsewhere. Cancel requests are picked up here.
2. **Act.** Every active job's step at its turn: launched ones are marked ``STARTING``; running
   ones are polled (``RUNNING`` when every host runs). Any ending (success, a failed or lost host,
   preemption, cancel, a launch that failed or did not start in time) is first written as the
   job's ``stop_kind``, then ``stop`` ends every process of the attempt, the final state of every
   host and the rest of every host's output are collected, and only then the job moves on
   (``SUCCEEDED``, ``FAILED``, ``CANCELLED``, or ``QUEUED`` with ``attempt + 1``) and its slices
   come free. This comes before the policy, so the slices that came free go to the next jobs in
   this cycle, not the next one (a slice's turnaround is a cycle shorter; a requeued job may be
   admitted again, or get the policy's wait reason, in the cycle that requeued it). What happens
   next to each attempt (here, in step 1 and after a restart) is decided by
   ``scheduler/attempts.py``, purely, and applied here: ``_record`` writes an answer, ``_apply``
   writes it, then acts.
3. **Decide and write.** ``decide(snapshot)``; admissions and preemptions are written to the
   store before anything is done about them.
   The jobs the policy sees are kept in memory between cycles (``SchedState``): only what
   changed since the last cycle is read again.
4. **Act on the decisions.** The jobs just admitted are launched (off the loop's thread), and the
   stops of the jobs just preempted are issued, as in step 2. Then the wait reasons (and
   head-of-line flags) of the jobs that wait are written: no launch waits for those writes.
   The writes are grouped per cycle and per kind (:class:`Writes`): every admission of a cycle in
   one transaction, every stop begun in one, every STARTING and RUNNING mark in one, every ending
   in one (``Transitions.admit_all``, ``begin_stops``, ...). A group is written first; then each
   member that was written is acted on.
5. **Logs.** New output of running attempts is copied into the store (within a time budget per
   cycle), so logs outlive the job. Each host's stored log is capped (``max_log_bytes``): past the
   cap it is marked truncated, never silently cut.
6. **Files.** What the hosts measured of each tenant's checkpoint directory (with their poll
   answers) is stored per tenant; the quota itself is enforced on the hosts. With a retention
   (``checkpoint_retention_s``), finished jobs' checkpoint directories are removed through a host
   every ``retention_check_s`` (``control/loop/tenantfiles.py``), off the loop's thread.

One job's faults stay with that job: any error while launching, polling or stopping one attempt
ends that attempt with the error as its reason, and launches and stops (which may take the grace
period, or unpack a large package) run on a small thread pool so the loop goes on for everyone.
``stats()`` says whether the loop is cycling (``/healthz``, ``GET /api/v1/status``).

Because every decision is in the store before it is acted on (a group's transaction commits before
any of its members is acted on), a control plane killed at any point restarts
(:meth:`Service.reconcile`), finds its running attempts again through ``running_attempts()``,
re-issues unfinished stops, stops orphans, and loses no job.
``stop_threads=0`` runs launches and stops inline (deterministic tests).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tpufleet.control.cluster.protocol import (
    AttemptSpec,
    AttemptStatus,
    ClusterClient,
    HostState,
    HostStatus,
    LogChunk,
    Notifying,
    WarmPool,
)
from tpufleet.control.loop import failpoints
from tpufleet.control.loop.leader import FencedError, Leadership
from tpufleet.control.loop.provisioner import Provisioner
from tpufleet.control.loop.schedstate import SchedState
from tpufleet.control.loop.tenantfiles import TenantFiles
from tpufleet.control.store import values as r
from tpufleet.control.store.facade import Store
from tpufleet.control.store.logs import Cursor, HostOutput
from tpufleet.control.store.loopwrites import ActiveJob, FinalOutput, Stored, Transitions
from tpufleet.errors import NotFoundError, TpufleetError
from tpufleet.host import jobfiles, runlimits
from tpufleet.runtime import StepProgress
from tpufleet.scheduler import attempts
from tpufleet.scheduler.lifecycle import JobKind, JobState, StopKind
from tpufleet.scheduler.model import Admit, Preempt, RunDecision, Snapshot, Wait, Waits

log = logging.getLogger(__name__)

Decide = Callable[[Snapshot], Sequence[RunDecision]]  # ``policy.decide_runs``, or ``decide``
Key = tuple[str, int]
_Stopped = tuple[AttemptStatus | None, FinalOutput | None]  # a stop's final status and held output
# Called with a group's kind ("admit", "preempt", "stop", "launched", "running", "finish") and the
# job ids it wrote, once the group is committed and before any member is acted on (a fault
# injection point: tests kill the control plane there).
AfterWrite = Callable[[str, Sequence[str]], None]
HOLD_CHARS = 1 << 20  # final output held for the attempt's end; stored at once beyond this
FINAL_IDLE_READS = 20  # empty reads in a row (~1 s) after an attempt ended: its stream will not complete


@dataclass(frozen=True)
class ServiceConfig:
    interval_s: float = 0.5  # between cycles, unless woken (submit, cancel)
    busy_interval_s: float = 0.05  # while an attempt is starting or being stopped
    preempt_grace_s: float = 30.0  # SIGTERM (the checkpoint signal) to SIGKILL for a preempted attempt
    cancel_grace_s: float = 10.0
    fail_grace_s: float = 5.0  # for the surviving hosts of a failed attempt
    start_timeout_s: float = 600.0  # admitted to every host RUNNING; longer fails the attempt
    stop_threads: int = 4  # 0: launch and stop inline
    max_log_bytes: int = 64 << 20  # stored output per host and attempt; past it the log is truncated
    log_budget_s: float = 0.2  # time per cycle for copying running attempts' output
    final_log_s: float = 60.0  # time to collect the rest of an ended attempt's output
    stall_after_s: float = 30.0  # no cycle finished for this long: /healthz says stalled
    checkpoint_root: str | None = None  # job files on the hosts; default <state-dir>/checkpoints
    hide: tuple[str, ...] = field(default_factory=tuple)  # more paths a jailed job must not see
    incremental: bool = True  # keep the policy's view in memory (SchedState); False: read it whole
    # wait reasons rewritten (a code or wording that changed; not a job's first, nor a head-of-line
    # flip, which are written at once) per second of cycles, at most a second's worth in one cycle
    reason_rewrites_per_s: float = 4000.0
    progress_write_s: float = 5.0  # a running attempt's reported steps are stored at most this often
    job_process_limit: int = runlimits.DEFAULT_PROCESSES  # tasks (processes, threads) per host run
    job_open_files_limit: int = runlimits.DEFAULT_OPEN_FILES  # open files per host run, all processes
    checkpoint_check_s: float = 5.0  # how often a host measures a running job's tenant directory
    # a finished job's checkpoint directory is removed this long after it ended (serve
    # --checkpoint-retention-days); None: kept until someone removes it
    checkpoint_retention_s: float | None = None
    retention_check_s: float = 600.0  # how often the loop looks for finished jobs' files to remove
    # where this process kills itself as kill -9 would, for crash tests (serve reads TPUFLEET_FAILPOINTS;
    # control/loop/failpoints.py); none by default
    failpoints: frozenset[str] = frozenset()


class RateBudget:
    """So many a second, carried over up to a second's worth: the wait reasons a cycle may rewrite.
    A budget per cycle would cost ten times as much while the loop is busy (a cycle every 50 ms, or
    at each sandbox job's end) as while idle (every 0.5 s), for messages nobody reads faster; in a
    long queue those rewrites were most of a busy loop's time."""

    def __init__(self, per_s: float, now: float) -> None:
        self.per_s, self._at, self._credit = per_s, now, per_s

    def take(self, now: float) -> int:
        """What may be spent now (monotonic seconds): all of it, as whole units."""
        self._credit = min(self.per_s, self._credit + self.per_s * max(0.0, now - self._at))
        self._at = now
        spent = int(self._credit)
        self._credit -= spent
        return spent


class Service:
    def __init__(
        self,
        store: Store,
        cluster: ClusterClient,
        *,
        state_dir: str | Path,
        decide: Decide | None = None,
        config: ServiceConfig | None = None,
        provisioner: Provisioner | None = None,
        after_write: AfterWrite | None = None,
        leadership: Leadership | None = None,
    ) -> None:
        """``leadership``: this process is one of several replicas on one database, and the loop
        runs only while it holds the lease (``store`` is then the fenced one, ``Store.fenced``:
        ``Plane.build`` makes both); None: the only process, always leading."""
        self.store = store
        self.after_write = after_write
        self.cluster = cluster
        self.provisioner = provisioner  # slices made and deleted with a provider (serve --provider)
        self.leadership = leadership
        self.decide = decide or _policy()
        self.state_dir = Path(state_dir)
        self._state_real = str(self.state_dir.resolve())  # hidden from jobs; resolved once, not per launch
        self.config = config or ServiceConfig()
        # absolute: every host resolves it from its own working directory, and refuses a relative one
        self.job_root = self.config.checkpoint_root or str(self.state_dir.absolute() / "checkpoints")
        c = self.config
        self.graces = attempts.Graces(c.preempt_grace_s, c.cancel_grace_s, c.fail_grace_s)
        self.cycles = 0
        self.last_error: str | None = None
        self.pool = cluster if isinstance(cluster, WarmPool) else None  # the Ray client keeps one
        self._cycle_ms: deque[float] = deque(maxlen=100)
        self.cycle_observers: list[Callable[[float], None]] = []  # each cycle's seconds (metrics)
        # the jobs of each group written (the API's long-polled reads); called on the loop's thread
        self.write_observers: list[Callable[[Sequence[str]], None]] = []
        self._pool: ThreadPoolExecutor | None = None
        self._term: int | None = None  # the lease's term the kept state belongs to (with leadership)
        self._fresh()
        self._wake = threading.Event()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        if isinstance(cluster, Notifying):  # hosts started (Ray), hosts ended (the sandbox)
            cluster.notify(self.wake)

    def _fresh(self) -> None:
        """What the loop keeps between cycles, as a process that just started has it: built here
        and again when this replica begins a term as leader, so a takeover starts over exactly
        as a restart does (``reconcile`` at its first cycle)."""
        if self._pool is not None:  # a deposed term's launches and stops are not waited for
            self._pool.shutdown(wait=False, cancel_futures=True)
        self.tr = Transitions(self.store)
        self.state = SchedState(self.tr)  # the jobs the policy sees, kept between cycles
        if self.provisioner is not None and self._term is not None:
            p = self.provisioner
            self.provisioner = Provisioner(p.store, p.provider, p.config)
        self._reconciled = False
        self._launches: dict[Key, Future[None]] = {}
        self._stops: dict[Key, Future[_Stopped]] = {}
        self._slices: list[r.SliceRecord] | None = None  # this cycle's inventory (_sync), for _schedule
        self._streams: dict[Key, list[Cursor]] = {}  # log streams of the stops to issue (_prefetch_streams)
        self._stop_failures: dict[Key, int] = {}
        self._failing: dict[Key, float] = {}  # when a poll first saw the attempt's failure (store clock)
        self._status: dict[Key, AttemptStatus] = {}
        self._peeked: dict[Key, AttemptStatus | None] = {}  # launches looked at before their write (_peek)
        self._placed: set[Key] = set()  # Ray jobs whose placement is on record
        self._released: set[str] = set()
        self._busy = False
        self._log_turn = 0
        self._progress: dict[Key, tuple[StepProgress, float]] = {}  # stored report, when (monotonic)
        self._progress_due: dict[Key, StepProgress] = {}
        self._last_cycle = time.monotonic()
        self._reasons = RateBudget(self.config.reason_rewrites_per_s, self._last_cycle)
        self._pool = ThreadPoolExecutor(self.config.stop_threads) if self.config.stop_threads else None
        self.files = TenantFiles(
            self.store,
            self.cluster,
            self.job_root,
            retention_s=self.config.checkpoint_retention_s,
            check_s=self.config.retention_check_s,
            write_s=self.config.progress_write_s,
            submit=self._submit,
        )

    # -- the cycle ----------------------------------------------------------------------------
    def run_once(self) -> None:
        """One cycle. Its decisions are not handed back: they are gone before the cyclic garbage
        collector resumes, which would otherwise walk (and promote) all 100,000 of them."""
        with _cyclic_gc_paused():
            self._cycle()

    def _cycle(self) -> None:
        started = time.monotonic()
        if not self._reconciled:
            self.reconcile()
        self._sync()
        # Act first: the attempts that ended since the last cycle are written before the policy
        # looks, so their slices go to the next jobs in this cycle rather than the next one.
        active = self.tr.active_jobs()
        if self._act_on(active) and self._slices is not None:
            self._slices = self.tr.slices_again(self._slices)
        moved, waits = self._schedule()
        # Then what the policy just decided: launch the admitted, issue the preempted's stops; and
        # only then why the others wait (no launch waits for those writes).
        decided = self.tr.active_jobs(only=moved) if moved else []
        self._act_on(decided)
        self._store_reasons(*waits)
        self._busy = bool(self._stops or self._launches) or any(
            j.state != r.RUNNING or j.stop_kind for j in (*active, *decided)
        )
        self._pull_logs(active)
        self._store_progress(active)
        self.files.step()
        self.cycles += 1
        self._last_cycle = time.monotonic()
        self._cycle_ms.append((self._last_cycle - started) * 1000)
        for observe in self.cycle_observers:
            observe(self._last_cycle - started)

    def stats(self) -> dict[str, Any]:
        """The loop's health: cycles, the last cycle's and the median cycle's milliseconds (over the
        last 100), seconds since a cycle last finished, and whether the loop is stalled."""
        age = time.monotonic() - self._last_cycle
        running = self._thread is not None and self._thread.is_alive() and self.leads
        return {
            "cycles": self.cycles,
            "cycle_ms_last": round(self._cycle_ms[-1], 3) if self._cycle_ms else None,
            "cycle_ms_p50": round(statistics.median(self._cycle_ms), 3) if self._cycle_ms else None,
            "last_cycle_age_s": round(age, 3),
            "stalled": running and age > self.config.stall_after_s,
            "last_error": self.last_error,
        }

    def reconcile(self) -> None:
        """After a (re)start: adopt launched attempts, fail vanished ones (``attempts.on_restart``,
        written only: every stop is issued at its job's turn), stop orphans."""
        running = set(self.cluster.adopt())
        active = self.tr.active_jobs()
        writes = Writes()
        for job in active:
            step = attempts.on_restart(JobState(job.state), job.stop_kind, (job.id, job.attempt) in running)
            if isinstance(step, attempts.Adopt):
                step = attempts.after_adopt(self._launch_lost(job))
            self._record(job, step, writes)
        self._write_and_act(writes)
        for job_id, attempt in sorted(running - {(j.id, j.attempt) for j in active}):
            log.warning("stopping orphan attempt %s of job %s", attempt, job_id)
            self._run_stop((job_id, attempt), self.config.cancel_grace_s, hold=False)
        self._reconciled = True

    def _launch_lost(self, job: ActiveJob) -> bool:
        """Whether a launch the previous control plane began missed a host (or all of them)."""
        try:
            return any(h.state is HostState.LOST for h in self.cluster.poll(job.id, job.attempt).hosts)
        except NotFoundError:
            return True

    def _sync(self) -> None:
        try:
            if self.pool is not None:
                self.pool.maintain()
        except TpufleetError as err:  # the pool is kept next cycle; the inventory still counts
            log.warning("could not maintain the warm pool: %s", err)
        retired = self.provisioner.retired() if self.provisioner is not None else frozenset()
        slices = self._slices = self.tr.sync_slices(self.cluster.inventory(), retired)
        broken = {s.name: s.problems for s in slices if s.state == r.BROKEN}
        writes = Writes()
        # Only a cancel asked for or a broken slice begins a stop here: the jobs read are those
        # (written now, so the policy sees them; issued at the job's turn).
        holding = {s.holder for s in slices if s.holder and s.name in broken}
        for job in self.tr.active_jobs(cancelling_or=holding):
            self._record(job, attempts.on_inventory(job.cancel_requested, job.slices, broken), writes)
        self._write_and_act(writes)
        self._pool_draining(slices)

    def _act_on(self, jobs: list[ActiveJob]) -> int:
        """Each job's step at its turn, written in groups and then acted on; the endings written."""
        writes = Writes()
        self._prefetch_streams([(j.id, j.attempt) for j in jobs if j.stop_kind])
        for job in jobs:
            self._act_safely(job, writes)
        return self._write_and_act(writes)

    def _schedule(self) -> tuple[set[str], tuple[list[RunDecision], dict[str, Stored]]]:
        """Decide, and write the admissions and preemptions: the jobs they moved (their launches
        and stops are next), and what :meth:`_store_reasons` needs for the jobs that wait."""
        slices, self._slices = self._slices, None  # as the inventory left them this cycle
        snapshot, reasons = (
            self.state.snapshot(slices) if self.config.incremental else self.tr.snapshot(slices)
        )
        if self.provisioner is None:
            decisions = list(self.decide(snapshot))
        else:  # the provider's step (its I/O and writes), then the pure policy on what it leaves open
            self._provision(snapshot)
            decisions = self.provisioner.decide(self.decide, snapshot)
        # Most of them are waits (runs of them as one ``Waits`` each): one pass picks out the rest,
        # and wait_reasons skips them in its own.
        rest = [d for d in decisions if type(d) is not Wait and type(d) is not Waits]
        admits = [d for d in rest if isinstance(d, Admit)]
        admitted = self.tr.admit_all(admits)  # one transaction
        for d, ok in zip(admits, admitted, strict=True):
            if not ok:
                log.warning("dropped admission of %s on %s: no longer applies", d.job, d.slices)
        self._written("admit", [d.job for d, ok in zip(admits, admitted, strict=True) if ok])
        preempts = [d for d in rest if isinstance(d, Preempt)]
        won = self.tr.preempt_all(preempts)  # one transaction; each stop is issued at its job's turn
        self._written("preempt", [d.job for d, ok in zip(preempts, won, strict=True) if ok])
        moved = {d.job for d, ok in zip(admits, admitted, strict=True) if ok}
        return moved | {d.job for d, ok in zip(preempts, won, strict=True) if ok}, (decisions, reasons)

    def _store_reasons(self, decisions: list[RunDecision], reasons: dict[str, Stored]) -> None:
        """Why each waiting job waits (``Transitions.wait_reasons``), and the head-of-line flags the
        policy reads back next cycle."""
        refresh = self._reasons.take(time.monotonic()) if self.config.incremental else None
        self.state.reasons_written(self.tr.wait_reasons(decisions, reasons, refresh=refresh))

    def _provision(self, snapshot: Snapshot) -> None:
        assert self.provisioner is not None
        try:
            self.provisioner.step(snapshot)
        except Exception:  # the queue goes on with what the provider last said
            log.exception("provisioning step failed")

    def _act_safely(self, job: ActiveJob, writes: Writes) -> None:
        """Act on one job; whatever goes wrong ends that job's attempt, never the cycle."""
        try:
            self._act(job, writes)
        except Exception as err:
            self._failed(job, err, writes)

    def _failed(self, job: ActiveJob, err: Exception, writes: Writes) -> None:
        """Acting on ``job`` raised ``err``: its attempt is failed (``attempts.after_error``), written
        with the cycle's stops; once written, the new stop is issued at the job's next turn."""
        log.exception("job %s attempt %s: acting on it failed", job.id, job.attempt, exc_info=err)
        self._record(job, attempts.after_error(f"{type(err).__name__}: {err}"), writes, reissue=True)

    def _act(self, job: ActiveJob, writes: Writes) -> None:
        """Decide (``scheduler.attempts.next_step``), then write and act (:meth:`_apply`)."""
        starting = self._starting_hosts(job)
        now, timeout = self.store.clock(), self.config.start_timeout_s
        self._apply(
            job,
            attempts.next_step(JobState(job.state), job.stop_kind, job.admitted_at, now, timeout, starting),
            writes,
        )

    def _apply(self, job: ActiveJob, step: attempts.Step, writes: Writes) -> None:
        """Carry out one step at the job's turn: write it (:meth:`_record`, into the cycle's
        groups), then act once its group is written (:meth:`_write_and_act`). A stop is written
        before it is issued (``begin_stops`` is a compare-and-set per member: a cancel or
        preemption already on record wins, and nothing is issued)."""
        match step:
            case attempts.BeginStop():
                self._record(job, step, writes, issue=True)
            case attempts.Stopping(kind):
                self._stopping(job, kind, writes)
            case attempts.Launch():
                self._launch(job, writes)
            case attempts.Poll():
                self._poll(job, writes)
            case attempts.MarkLaunched() | attempts.MarkRunning() | attempts.Wait():
                self._record(job, step, writes)
            case attempts.Adopt() | attempts.Finish():  # answers of on_restart and after_stop only
                raise ValueError(f"{step} is not a step at a job's turn")

    def _record(
        self,
        job: ActiveJob,
        step: attempts.Step,
        writes: Writes,
        *,
        issue: bool = False,
        reissue: bool = False,
    ) -> None:
        """Put what a step decides into its group of the cycle's writes, and nothing else: a stop,
        ADMITTED -> STARTING, STARTING -> RUNNING. ``issue``: once written (a stop on record may
        win instead), the stop is issued; ``reissue``: a stop under way is issued again at the
        job's next turn. The steps to act on (:class:`~tpufleet.scheduler.attempts.Stopping`,
        ``Launch``, ``Poll``, ``Adopt``) and ``Finish`` (which needs the hosts' final state,
        :meth:`_stopping`) write nothing here."""
        match step:
            case attempts.BeginStop():
                writes.stops.append(_Stop(job, step, issue, reissue))
            case attempts.MarkLaunched():
                writes.launched.append(job)
            case attempts.MarkRunning():
                writes.running.append(job)

    def _write_and_act(self, writes: Writes) -> int:
        """Write each group of ``writes`` in one transaction, then act on its members that were
        written: begun stops are issued (those that returned at once end their attempts, which
        join the endings), then the STARTING and RUNNING marks, then the endings. A member whose
        action raises fails its attempt, written in the next round. Returns the endings written."""
        ended = 0
        while writes:
            stops, launched, running, ends, placed = (
                writes.stops,
                writes.launched,
                writes.running,
                writes.ends,
                writes.placed,
            )
            writes.stops, writes.launched, writes.running, writes.ends, writes.placed = [], [], [], [], []
            won = self.tr.begin_stops([(x.job.id, x.step.kind, x.step.why) for x in stops])
            self._written("stop", [x.job.id for x, ok in zip(stops, won, strict=True) if ok])
            self._prefetch_streams([x.key for x, ok in zip(stops, won, strict=True) if ok and x.issue])
            for x, ok in zip(stops, won, strict=True):
                if not ok:
                    continue
                if x.reissue:
                    self._stops.pop(x.key, None)  # the new stop is issued at its next turn
                if x.issue:
                    try:
                        self._stopping(x.job, x.step.kind, writes)
                    except Exception as err:
                        self._failed(x.job, err, writes)
            # A launch's hosts are looked at before its STARTING is written: those whose every
            # host already runs are marked RUNNING in that same write, not in a second one.
            keys = [(j.id, j.attempt) for j in launched]
            ran = {key for j, key in zip(launched, keys, strict=True) if self._peek(j)}
            marked = self.tr.launched_all(keys, running=ran)
            self._written("launched", [j.id for j in launched])
            self._written(
                "running",
                [j.id for j, key, ok in zip(launched, keys, marked, strict=True) if ok and key in ran],
            )
            for j, key, ok in zip(launched, keys, marked, strict=True):  # polled at once (that look)
                if ok:
                    self._act_safely(replace(j, state=r.RUNNING if key in ran else r.STARTING), writes)
                self._peeked.pop(key, None)
            self.tr.running_all([(j.id, j.attempt) for j in running])
            self._written("running", [j.id for j in running])
            self.tr.placed_all(placed)
            ends += writes.ends  # the stops just issued that returned at once
            output, writes.ends, writes.output = writes.output, [], {}
            ended += sum(new is not None for new in self.tr.finish_all(ends, output))
            self._written("finish", [j for j, _, _ in ends])
        return ended

    def _written(self, kind: str, job_ids: Sequence[str]) -> None:
        """A group of ``kind`` is in the store; nothing of it has been acted on yet."""
        if job_ids and self.after_write is not None:
            self.after_write(kind, job_ids)
        for observe in self.write_observers if job_ids else ():
            observe(job_ids)
        if job_ids:
            failpoints.reach(self.config.failpoints, f"after-write:{kind}")

    def _starting_hosts(self, job: ActiveJob) -> tuple[str, ...]:
        """The hosts the last poll saw still starting (a start timeout names them)."""
        status = self._status.get((job.id, job.attempt))
        if status is None:
            return ()
        return tuple(f"{h.slice}/{h.worker_id}" for h in status.hosts if h.state is HostState.STARTING)

    # -- act ----------------------------------------------------------------------------------
    def _launch(self, job: ActiveJob, writes: Writes) -> None:
        """Launch off the loop (a package may be large); the job turns STARTING once it returned."""
        key = (job.id, job.attempt)
        future = self._launches.get(key)
        inline = future is None and self._launches_at_once(job)  # marked and polled in this same turn
        if inline:
            self._launches[key] = future = _inline(self._do_launch, job)
        elif future is None:
            self._launches[key] = self._submit(self._do_launch, job)
            future = self._launches[key]
            future.add_done_callback(lambda _: self.wake())  # record it at once, not a cycle later
        if not future.done():
            return
        del self._launches[key]
        err = future.exception()
        what = None if err is None else str(err)
        if err is not None and not isinstance(err, TpufleetError):
            what = f"{type(err).__name__}: {err}"
            log.error("launch of %s attempt %s failed", job.id, job.attempt, exc_info=err)
        step = attempts.after_launch(what)
        self._apply(job, step, writes)
        if isinstance(step, attempts.MarkLaunched) and not inline:
            # poll the hosts next (a Notifying cluster wakes the loop again once they started); an
            # inline launch is polled in this turn already (_write_and_act)
            self.wake()

    def _launches_at_once(self, job: ActiveJob) -> bool:
        """A launch with nothing to read or ship (an SPMD job without a working dir) on slices the
        warm pool holds returns at once (``WarmPool.launches_at_once``): made on the loop's thread,
        it is written and its hosts polled in this turn, not after a hand-off to the pool and a
        wake-up (a cycle) later."""
        return (
            self.pool is not None
            and job.kind == JobKind.SPMD
            and not job.working_dir
            and self.pool.launches_at_once(job.slices)
        )

    def _do_launch(self, job: ActiveJob) -> None:
        self.store.check_fence()  # a deposed leader launches nothing (its admission was written)
        wd = job.working_dir
        package = self.store.packages.get(job.tenant, wd) if wd and r.PACKAGE_ID.fullmatch(wd) else None
        paths = jobfiles.run_paths(self.job_root, job.tenant, job.id, job.attempt, "-")
        self.cluster.launch(
            AttemptSpec(
                job_id=job.id,
                attempt=job.attempt,
                slices=job.slices,
                accelerator_type=job.accelerator_type,
                command=job.command,
                env=job.env,
                tenant=job.tenant,
                job_root=self.job_root,
                checkpoint_dir=str(paths.checkpoint),
                package=package,
                working_dir_url=wd if wd and package is None else None,
                hide=(self._state_real, *self.config.hide),
                limits=runlimits.RunLimits(
                    self.config.job_process_limit, self.config.job_open_files_limit, self.config.max_log_bytes
                ),
                kind=job.kind,
                checkpoint_quota=self.store.limits.checkpoint_quota_bytes,
                checkpoint_check_s=self.config.checkpoint_check_s,
            )
        )
        failpoints.reach(self.config.failpoints, "after-launch", ready=lambda: self._all_started(job))

    def _all_started(self, job: ActiveJob) -> bool:
        """Whether the cluster reports every host of ``job``'s attempt past STARTING."""
        status = self.cluster.poll(job.id, job.attempt)
        return bool(status.hosts) and all(h.state is not HostState.STARTING for h in status.hosts)

    def _peek(self, job: ActiveJob) -> bool:
        """A look at the hosts of a launch whose STARTING is still to be written: True when every
        one already runs. The job's poll right after the write is this look (``_peeked``); a poll
        that fails here is left to that poll, where it fails the attempt as any poll does."""
        self._peeked.pop((job.id, job.attempt), None)
        try:
            status = self._status_of(job)
        except Exception:
            return False
        self._peeked[(job.id, job.attempt)] = status
        return status is not None and status.all_running

    def _status_of(self, job: ActiveJob) -> AttemptStatus | None:
        """What the cluster says of the job's attempt; None for an attempt it does not know."""
        try:
            return self.cluster.poll(job.id, job.attempt)
        except NotFoundError:
            return None

    def _poll(self, job: ActiveJob, writes: Writes) -> None:
        key = (job.id, job.attempt)
        status = self._peeked.pop(key) if key in self._peeked else self._status_of(job)
        present = status is not None and bool(status.hosts)
        if status is not None and present:
            self._status[key] = status
            self._note_placed(key, status, writes)
            if status.progress is not None:
                self._note_progress(key, status.progress)
            if status.disk is not None:
                self.files.measured(job.tenant, status.disk)
        seen = _observed(status, present)
        if seen.failure is None:
            self._failing.pop(key, None)
        else:
            now = self.store.clock()
            seen = replace(seen, failing_s=now - self._failing.setdefault(key, now))
        program = job.command[0] if job.command else ""
        self._apply(job, attempts.after_poll(JobState(job.state), seen, program), writes)

    def _note_progress(self, key: Key, progress: StepProgress) -> None:
        """A report to store: the first one at once (start-up ends there), later ones at most every
        ``progress_write_s``; the attempt's end stores the last one with it (``finish``)."""
        stored = self._progress.get(key)
        if stored is not None and stored[0] == progress:
            return
        if stored is None or time.monotonic() - stored[1] >= self.config.progress_write_s:
            self._progress_due[key] = progress

    def _store_progress(self, active: list[ActiveJob]) -> None:
        due, self._progress_due = self._progress_due, {}
        try:
            self.tr.record_progress([(job, attempt, p) for (job, attempt), p in due.items()])
        except Exception:  # a record, never a reason to stop the loop: the next report is stored
            log.exception("storing the reported steps of %d attempts failed", len(due))
            return
        now = time.monotonic()
        self._progress.update({key: (p, now) for key, p in due.items()})
        live = {(j.id, j.attempt) for j in active}
        for key in [k for k in self._progress if k not in live]:
            del self._progress[key]

    def _note_placed(self, key: Key, status: AttemptStatus, writes: Writes) -> None:
        """A Ray job: say on the job (an event) where Ray placed its trainer, once it is known."""
        if status.placed and key not in self._placed:
            self._placed.add(key)
            writes.placed.append((key[0], key[1], status.placed))

    def _stopping(self, job: ActiveJob, kind: StopKind, writes: Writes) -> None:
        """Issue the stop (once per process lifetime, with its kind's grace), and once it returned
        apply ``attempts.after_stop``: finish the attempt with each host's final state (with the
        cycle's endings), or issue the stop again at the next turn."""
        key = (job.id, job.attempt)
        if key in self._launches and not self._launches[key].done():
            return  # stop once the launch returned, so no host starts after its stop
        self._launches.pop(key, None)
        future = self._stops.get(key)
        if future is None:
            future = self._stops[key] = self._run_stop(key, self.graces.of(kind))
        if not future.done():
            return
        del self._stops[key]
        err = future.exception()
        failures = self._stop_failures.get(key, 0) + (err is not None)
        match attempts.after_stop(kind, None if err is None else str(err), failures):
            case attempts.Finish(_, stop_error):
                if stop_error is not None:
                    log.error(
                        "stop of %s attempt %s failed %s times; ending it anyway: %s", *key, failures, err
                    )
                self._stop_failures.pop(key, None)
                self._failing.pop(key, None)
                after, output = future.result() if err is None else (None, None)
                writes.ends.append((job.id, job.attempt, _final(after, self._status.pop(key, None))))
                if output is not None:
                    writes.output[key] = output
            case _:
                self._stop_failures[key] = failures
                log.warning("stop of %s attempt %s failed (try %s), retrying: %s", *key, failures, err)

    def _prefetch_streams(self, keys: Sequence[Key]) -> None:
        """Read, in one query, the log streams of the attempts whose stops may be issued now (the
        final read of each begins where its stream was stored), instead of one query per stop."""
        keys = [key for key in keys if key not in self._stops]
        self._streams = self.tr.cursors_of(keys) if keys else {}

    def _run_stop(self, key: Key, grace_s: float, *, hold: bool = True) -> Future[_Stopped]:
        return self._submit(self._do_stop, key, grace_s, hold, self._streams.pop(key, None))

    def _do_stop(self, key: Key, grace_s: float, hold: bool, streams: list[Cursor] | None = None) -> _Stopped:
        """End every process, then read every host's final state and the rest of its output.
        ``hold``: the output read last is returned, to be stored with the attempt's end (one
        transaction for a cycle's endings), not in a transaction of its own."""
        self.cluster.stop(key[0], key[1], grace_s)
        failpoints.reach(self.config.failpoints, "after-stop")
        try:
            status: AttemptStatus | None = self.cluster.poll(*key)
        except Exception as err:  # the final state is a record, not a reason to keep the slices
            log.warning("final state of %s attempt %s unknown: %s", *key, err)
            status = None
        output = None
        try:
            deadline = time.monotonic() + self.config.final_log_s
            output = self._read_logs(
                key[0], key[1], deadline=deadline, final=True, cursors=streams, hold=hold
            )
        except Exception:
            log.exception("collecting the last output of %s attempt %s failed", *key)
        return status, output

    def _submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        if self._pool is not None:
            return self._pool.submit(fn, *args)
        return _inline(fn, *args)

    def _pool_draining(self, slices: list[r.SliceRecord]) -> None:
        """Tell the cluster to give drained free slices back, and to take them again when undrained;
        and to give back, held or not, the slices the provider is about to delete (a held one goes
        when its attempt ends), so their hosts are idle when they end."""
        if self.pool is None:
            return
        drained = {s.name for s in slices if s.draining and s.holder is None}
        if self.provisioner is not None:
            drained |= self.provisioner.closing()
        try:
            if drained - self._released:
                self.pool.release(sorted(drained - self._released))
            if self._released - drained:
                self.pool.warm(sorted(self._released - drained))
            self._released = drained
        except TpufleetError as err:
            log.warning("could not update the warm pool for drained slices: %s", err)

    # -- logs ---------------------------------------------------------------------------------
    def _pull_logs(self, active: list[ActiveJob]) -> None:
        """Copy new output of running attempts, jobs in turn, within the budget: in rounds, one
        chunk from each host still being read, the chunks of every job stored in one transaction
        (one per job took a sixth of the loop's time on Kueue's baseline, 86 slices running)."""
        jobs = [
            j
            for j in active
            if j.state in (r.STARTING, r.RUNNING)
            and j.stop_kind is None
            and (j.id, j.attempt) not in self._stops
        ]
        if not jobs:
            return
        start = self._log_turn % len(jobs)
        streams = self.tr.cursors_of((j.id, j.attempt) for j in jobs)
        deadline = time.monotonic() + self.config.log_budget_s  # from here: a slow query spends none of it
        reading: list[tuple[Key, _Reading, LogChunk]] = []
        for i, job in enumerate(jobs[start:] + jobs[:start]):
            if i and time.monotonic() > deadline:
                break
            self._log_turn += 1
            key = (job.id, job.attempt)
            for cur in streams.get(key, ()):
                if not cur.complete and not cur.truncated:
                    reading += self._next_chunk(key, _Reading(cur, cur.offset))
        while reading:
            stored, reading = self._store_chunks(reading), []
            for key, rd in stored:  # more may follow, within the budget
                if not rd.done and time.monotonic() <= deadline:
                    reading += self._next_chunk(key, rd)

    def _next_chunk(self, key: Key, rd: _Reading) -> list[tuple[Key, _Reading, LogChunk]]:
        """The next chunk of ``rd``'s host, when its stream moved; none when it did not, or could
        not be read (it is read again next cycle; the final read says what could not be read)."""
        try:
            chunk = self.cluster.read_logs(*key, rd.cur.slice, rd.cur.worker_id, rd.offset)
        except TpufleetError:
            return []
        except Exception:
            log.exception("copying the output of %s attempt %s failed", *key)
            return []
        return [(key, rd, chunk)] if _moved(chunk, rd.offset) else []

    def _store_chunks(self, reading: list[tuple[Key, _Reading, LogChunk]]) -> list[tuple[Key, _Reading]]:
        """Store each host's chunk in one transaction; the readings, moved on to where the store
        left them. A stream the store no longer has leaves its job's output out, not the others'
        (``append_logs`` stores the rest, then says which); anything else stores nothing this
        cycle, and the next reads the same output again."""
        outputs = [
            HostOutput(*key, rd.cur.host, c.data, c.next_offset, c.complete, rd.offset)
            for key, rd, c in reading
        ]
        try:
            cursors = self.tr.append_logs(outputs, self.config.max_log_bytes)
        except NotFoundError as err:
            log.warning("copying running attempts' output: %s", err)
            return []
        except Exception:
            log.exception("copying running attempts' output failed")
            return []
        return [
            (key, _Reading(cur, cur.offset, done=cur.complete or cur.truncated))
            for (key, _, _), cur in zip(reading, cursors, strict=True)
        ]

    def _read_logs(
        self,
        job_id: str,
        attempt: int,
        *,
        deadline: float,
        final: bool,
        cursors: list[Cursor] | None = None,
        hold: bool = False,
    ) -> FinalOutput | None:
        """Copy each host's new output into the store; ``final``: until the stream is complete
        (the processes are gone), the cap, or the deadline, and say what could not be read.

        In rounds: one chunk is read from each host still being read, and the chunks that moved
        are stored in one transaction. ``hold`` (a final read): what was read is kept, up to
        ``HOLD_CHARS`` (stored in a transaction of its own beyond that), and returned with why
        any host's stream stays incomplete, for the attempt's end to store."""
        reading = [
            _Reading(cur, cur.offset)
            for cur in (self.tr.cursors(job_id, attempt) if cursors is None else cursors)
            if not cur.complete and not cur.truncated
        ]
        hosts = {rd.cur.host: rd for rd in reading}
        held: list[HostOutput] = []
        unread: list[_Reading] = []  # a host whose stream stays incomplete, with why
        while reading:
            moved: list[tuple[_Reading, LogChunk]] = []
            idle: list[_Reading] = []
            for rd in reading:
                if rd.idle >= FINAL_IDLE_READS:
                    rd.note = (
                        "nothing more could be read from this host (it never started, or its output is gone)"
                    )
                elif time.monotonic() > deadline:
                    rd.note = "the rest of this host's output could not be collected in time"
                else:
                    try:
                        chunk = self.cluster.read_logs(
                            job_id, attempt, rd.cur.slice, rd.cur.worker_id, rd.offset
                        )
                    except TpufleetError as err:
                        rd.note = f"the rest of this host's output could not be read: {err}"
                    else:
                        if _moved(chunk, rd.offset):
                            moved.append((rd, chunk))
                        elif final:
                            rd.idle += 1
                            idle.append(rd)
                        continue
                unread.append(rd)
            for rd, chunk in moved:
                held.append(
                    HostOutput(
                        job_id, attempt, rd.cur.host, chunk.data, chunk.next_offset, chunk.complete, rd.offset
                    )
                )
                rd.offset, rd.done, rd.idle = chunk.next_offset, chunk.complete, 0
            if held and (not hold or sum(len(o.data) for o in held) > HOLD_CHARS):
                cursors = self.tr.append_logs(held, self.config.max_log_bytes)
                stored = {o.host: cur for o, cur in zip(held, cursors, strict=True)}  # the last of each host
                held = []
                for host, cur in stored.items():  # the store's word: a stream cut at the cap is done
                    rd = hosts[host]
                    rd.cur, rd.offset, rd.done = cur, cur.offset, cur.complete or cur.truncated
            idle += [rd for rd, chunk in moved if not rd.done and (chunk.data or final)]  # more may follow
            reading = sorted(idle, key=lambda rd: rd.cur.host)
            if any(rd.idle for rd in reading):
                time.sleep(0.05)  # a host had nothing new: read it again in a moment
        notes = [(job_id, attempt, rd.cur.host, rd.note) for rd in unread if rd.note and not rd.done]
        if not final:
            return None
        if hold:
            return FinalOutput(tuple(held), tuple(notes), self.config.max_log_bytes)
        self.tr.close_logs(notes)
        return None

    # -- the loop thread ----------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._last_cycle = time.monotonic()
            self._thread = threading.Thread(target=self._loop, name="tpufleet-scheduler", daemon=True)
            self._thread.start()

    def wake(self) -> None:
        """Run the next cycle now (after a submit or cancel)."""
        self._wake.set()

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the loop; waits at most ``timeout_s`` for a cycle that is under way (a cycle stuck in
        a call to a cluster that went away is left behind: the thread is a daemon)."""
        self._halt.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> None:
        while not self._halt.is_set():
            self.turn()
            self._wake.wait(self.config.busy_interval_s if self._busy else self.config.interval_s)
            self._wake.clear()

    def turn(self) -> bool:
        """One turn of the loop's thread: a cycle, when this replica leads (with ``leadership``:
        a term just begun starts over as a restart does; a fenced cycle ends the term). A bad
        cycle is logged and kept in ``last_error``: the next one retries. True when a cycle ran
        to its end."""
        if not self._begin_term():
            return False
        try:
            self.run_once()
        except FencedError:  # another replica leads: nothing of what the cycle tried was written
            self._deposed()
            return False
        except Exception as err:  # the loop must survive a bad cycle; the next one retries
            self.last_error = f"{type(err).__name__}: {err}"
            log.exception("scheduling cycle failed")
            return False
        self.last_error = None
        return True

    @property
    def leads(self) -> bool:
        """Whether this replica's loop is the one that acts (always, without ``leadership``)."""
        return self.leadership is None or (self._term is not None and self.leadership.term == self._term)

    def _begin_term(self) -> bool:
        """With leadership: whether to cycle now. A term this replica just began starts over
        (:meth:`_fresh`, then ``reconcile``); a term that ended (fenced, or the lease lost)
        stops the loop acting until the next one."""
        lead = self.leadership
        if lead is None:
            return True
        if self._term is not None and lead.fenced == self._term:
            self._deposed()
        term = lead.term
        if term is None:
            if self._term is not None:
                self._deposed()
            return False
        if term != self._term:
            self._term = term
            lead.acting = term
            self._fresh()
            log.warning("leading (fencing token %s): reconciling with the cluster", term)
        return True

    def _deposed(self) -> None:
        """This replica's term is over (a write was fenced, or the lease was lost): stop acting;
        the launches and stops under way are left (the new leader reconciles them)."""
        if self.leadership is None or self._term is None:
            return
        term, self._term = self._term, None
        self.leadership.deposed(term)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._busy = False
        log.warning("no longer leading (term %s is over): standing by", term)


@dataclass
class _Reading:
    """One host's stream while ``Service._read_logs`` copies it: the stored cursor, where the
    cluster's stream is read from, the empty reads in a row, and why it stopped short."""

    cur: Cursor
    offset: int
    done: bool = False  # the stream is complete (or cut at the cap): nothing more is read
    idle: int = 0
    note: str | None = None


@dataclass(frozen=True)
class _Stop:
    """A stop to begin (``attempts.BeginStop``); ``issue``: issue it once written."""

    job: ActiveJob
    step: attempts.BeginStop
    issue: bool = False
    reissue: bool = False

    @property
    def key(self) -> Key:
        return (self.job.id, self.job.attempt)


@dataclass
class Writes:
    """A cycle's writes, grouped by kind; each group is one transaction (``Transitions.*_all``),
    written before any of its members is acted on (:meth:`Service._write_and_act`)."""

    stops: list[_Stop] = field(default_factory=list)
    launched: list[ActiveJob] = field(default_factory=list)  # ADMITTED -> STARTING
    running: list[ActiveJob] = field(default_factory=list)  # STARTING -> RUNNING
    ends: list[tuple[str, int, AttemptStatus | None]] = field(default_factory=list)  # finish
    output: dict[Key, FinalOutput] = field(default_factory=dict)  # stored with the ends
    placed: list[tuple[str, int, Sequence[str]]] = field(default_factory=list)  # Ray's placement

    def __bool__(self) -> bool:
        return bool(self.stops or self.launched or self.running or self.ends or self.placed)


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a cycle.

    A cycle over 100,000 queued jobs allocates several hundred thousand short-lived objects (keys,
    decisions, rows), none of them in reference cycles; each collection they set off also walks
    the kept state's 100,000 long-lived job views, which made up a third of the cycle
    (bench/cycle.py). Resumed while a cycle's 100,000 decisions were still alive (the rest of the
    cycle acts on them), it promoted them to the old generations, which soon set off a full
    collection. Reference counting still frees everything as it goes; collection resumes after
    the cycle, when the decisions are gone.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _inline(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """``fn(*args)`` run now, on this thread, as a done future (what the pool would hand back)."""
    future: Future[Any] = Future()
    try:
        future.set_result(fn(*args))
    except Exception as err:  # reported through the future, as on the pool
        future.set_exception(err)
    return future


def _moved(chunk: LogChunk, offset: int) -> bool:
    """Whether a chunk read from ``offset`` changes what is stored: data, the stream's end, or a
    new offset (output the cluster dropped)."""
    return bool(chunk.data) or chunk.complete or chunk.next_offset != offset


def _observed(status: AttemptStatus | None, present: bool) -> attempts.Observed:
    """What a poll says, as ``attempts.after_poll`` reads it (``failing_s`` is the caller's)."""
    if status is None or not present:
        return attempts.Observed(present=False, interrupted=None if status is None else status.interrupted)
    hosts = status.hosts
    return attempts.Observed(
        present=True,
        interrupted=status.interrupted,
        failure=status.failure,
        succeeded=status.succeeded,
        all_running=status.all_running,
        hosts=len(hosts),
        exited=tuple(
            h.exit_code
            for h in hosts
            if h.state is HostState.EXITED and h.exit_code is not None and not h.detail
        ),
        unfinished=sum(h.state in (HostState.STARTING, HostState.RUNNING) for h in hosts),
    )


def _final(after_stop: AttemptStatus | None, last: AttemptStatus | None) -> AttemptStatus | None:
    """Each host's end as recorded: what the cluster said after the stop, where it still knew the
    host, else the last state seen running (a host that vanished since is LOST)."""
    if after_stop is None or not after_stop.hosts:
        if last is None:
            return None
        lost = [h if h.state is HostState.EXITED else HostStatus(h.slice, h.worker_id, HostState.LOST)
                for h in last.hosts]  # fmt: skip
        return AttemptStatus(last.job_id, last.attempt, tuple(lost), last.progress)
    if after_stop.progress is None and last is not None and last.progress is not None:
        return replace(after_stop, progress=last.progress)
    return after_stop


def _policy() -> Decide:
    from tpufleet.scheduler.policy import decide_runs

    return decide_runs
