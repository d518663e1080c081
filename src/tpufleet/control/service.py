"""The scheduling loop: inventory -> snapshot -> policy -> write decisions -> act -> poll -> transitions.

One cycle (:meth:`Service.run_once`):

1. **Inventory.** Slices from the cluster; one that is not intact turns ``BROKEN``. An attempt
   holding a broken slice is ended on every host and requeued while retries remain: the broken
   slice stays quarantined and the job resumes elsewhere. Cancel requests are picked up here.
2. **Decide and write.** ``decide(snapshot)``; admissions, preemptions and wait reasons are
   written to the store before anything is done about them.
3. **Act.** Admitted jobs are launched (``STARTING``); running ones are polled (``RUNNING`` when
   every host runs). Any ending (success, a failed or lost host, preemption, cancel) is first
   written as the job's ``stop_kind``, then ``stop`` ends every process of the attempt, and only
   then the job moves on (``SUCCEEDED``, ``FAILED``, ``CANCELLED``, or ``QUEUED`` with
   ``attempt + 1``) and its slices come free.
4. **Logs.** Every host's new output is copied into the store, so logs outlive the job.

Because every decision is in the store before it is acted on, a control plane killed at any point
restarts (:meth:`Service.reconcile`), finds its running attempts again through
``running_attempts()``, re-issues unfinished stops, stops orphans, and loses no job.

``stop`` may block for the grace period (the Ray executor waits until the processes are gone), so
stops run on a small thread pool by default and the loop goes on; ``stop_threads=0`` runs them
inline (deterministic tests).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tpufleet.control import records as r
from tpufleet.control.cluster import AttemptSpec, AttemptStatus, ClusterClient, HostState
from tpufleet.control.store import Store
from tpufleet.control.transitions import ActiveJob, Transitions
from tpufleet.errors import NotFoundError, TpufleetError
from tpufleet.scheduler.model import Admit, Decision, Preempt, Snapshot, Wait

log = logging.getLogger(__name__)

Decide = Callable[[Snapshot], Sequence[Decision]]
Key = tuple[str, int]


@dataclass(frozen=True)
class ServiceConfig:
    interval_s: float = 0.5  # between cycles, unless woken (submit, cancel)
    busy_interval_s: float = 0.05  # while an attempt is starting or being stopped
    preempt_grace_s: float = 30.0  # SIGTERM (the checkpoint signal) to SIGKILL for a preempted attempt
    cancel_grace_s: float = 10.0
    fail_grace_s: float = 5.0  # for the surviving hosts of a failed attempt
    stop_threads: int = 4  # 0: stop inline
    final_log_reads: int = 20  # reads per host to collect the last output of an ended attempt


class Service:
    def __init__(
        self,
        store: Store,
        cluster: ClusterClient,
        *,
        state_dir: str | Path,
        decide: Decide | None = None,
        config: ServiceConfig | None = None,
    ) -> None:
        self.store = store
        self.cluster = cluster
        self.tr = Transitions(store)
        self.decide = decide or _policy()
        self.state_dir = Path(state_dir)
        self.config = config or ServiceConfig()
        self.cycles = 0
        self.last_error: str | None = None
        self._reconciled = False
        self._stops: dict[Key, Future[None]] = {}
        self._status: dict[Key, AttemptStatus] = {}
        self._released: set[str] = set()
        self._busy = False
        self._pool = ThreadPoolExecutor(self.config.stop_threads) if self.config.stop_threads else None
        self._wake = threading.Event()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the cycle ----------------------------------------------------------------------------
    def run_once(self) -> list[Decision]:
        if not self._reconciled:
            self.reconcile()
        self._sync()
        decisions = self._schedule()
        active = self.tr.active_jobs()
        for job in active:
            self._act(job)
        self._busy = bool(self._stops) or any(j.state != r.RUNNING or j.stop_kind for j in active)
        self._pull_logs()
        self.cycles += 1
        return decisions

    def reconcile(self) -> None:
        """After a (re)start: adopt launched attempts, fail vanished ones, stop orphans."""
        running = set(self.cluster.running_attempts())
        active = self.tr.active_jobs()
        for job in active:
            key = (job.id, job.attempt)
            if job.stop_kind is not None:
                continue  # the stop is issued again by _act
            if job.state == r.ADMITTED and key in running:
                self._adopt_launch(job)
            elif job.state in (r.STARTING, r.RUNNING) and key not in running:
                self.tr.begin_stop(job.id, "fail", "its processes were gone when the control plane restarted")
        for job_id, attempt in sorted(running - {(j.id, j.attempt) for j in active}):
            log.warning("stopping orphan attempt %s of job %s", attempt, job_id)
            self._run_stop((job_id, attempt), self.config.cancel_grace_s)
        self._reconciled = True

    def _adopt_launch(self, job: ActiveJob) -> None:
        """A launch the previous control plane began but never recorded: adopt it when every host
        got it; when it was cut short (hosts missing), end it and requeue without using a retry,
        since the job did nothing wrong."""
        try:
            lost = any(h.state is HostState.LOST for h in self.cluster.poll(job.id, job.attempt).hosts)
        except NotFoundError:
            lost = True
        if lost:
            message = "the control plane restarted while launching this attempt; requeued"
            self.tr.begin_stop(job.id, "interrupted", message)
        else:
            self.tr.launched(job.id, job.attempt)

    def _sync(self) -> None:
        self.tr.sync_slices(self.cluster.inventory())
        slices = self.store.slices()
        broken = {s.name: s for s in slices if s.state == r.BROKEN}
        for job in self.tr.active_jobs():
            if job.cancel_requested:
                self.tr.begin_stop(job.id, "cancel", "cancelled by request")
            for name in job.slices:
                if name in broken:
                    problems = "; ".join(broken[name].problems)
                    self.tr.begin_stop(job.id, "fail", f"slice {name} is broken ({problems})")
        self._pool_draining(slices)

    def _schedule(self) -> list[Decision]:
        snapshot, reasons = self.tr.snapshot()
        decisions = list(self.decide(snapshot))
        waits = []
        for d in decisions:
            if isinstance(d, Admit):
                if not self.tr.admit(d):
                    log.warning("dropped admission of %s on %s: no longer applies", d.job, d.slices)
            elif isinstance(d, Preempt):
                self.tr.preempt(d)
            elif isinstance(d, Wait):
                waits.append(d)
        self.tr.wait_reasons(waits, reasons)
        return decisions

    def _act(self, job: ActiveJob) -> None:
        if job.stop_kind is not None:
            self._stopping(job)
        elif job.state == r.ADMITTED:
            self._launch(job)
        else:
            self._poll(job)

    # -- act ----------------------------------------------------------------------------------
    def _launch(self, job: ActiveJob) -> None:
        ckpt = self.state_dir / "checkpoints" / job.id
        ckpt.mkdir(parents=True, exist_ok=True)
        spec = AttemptSpec(
            job_id=job.id,
            attempt=job.attempt,
            slices=job.slices,
            accelerator_type=job.accelerator_type,
            command=job.command,
            env=job.env,
            working_dir=job.working_dir,
            checkpoint_dir=str(ckpt),
        )
        try:
            self.cluster.launch(spec)
        except TpufleetError as err:
            if self.tr.begin_stop(job.id, "fail", f"launch failed: {err}"):
                self._stopping(job, "fail")
            return
        self.tr.launched(job.id, job.attempt)

    def _poll(self, job: ActiveJob) -> None:
        key = (job.id, job.attempt)
        try:
            status: AttemptStatus | None = self.cluster.poll(job.id, job.attempt)
        except NotFoundError:
            status = None
        except TpufleetError as err:
            log.warning("poll of %s attempt %s failed: %s", job.id, job.attempt, err)
            return
        if status is None or not status.hosts:
            failure: str | None = "its processes are gone (no runners found)"
        else:
            self._status[key] = status
            failure = status.failure
        if failure is not None:
            if self.tr.begin_stop(job.id, "fail", failure):
                self._stopping(job, "fail")
        elif status is not None and status.succeeded:
            if self.tr.begin_stop(job.id, "success", "every host exited with code 0"):
                self._stopping(job, "success")
        elif status is not None and status.all_running and job.state == r.STARTING:
            self.tr.running(job.id, job.attempt)

    def _stopping(self, job: ActiveJob, kind: str | None = None) -> None:
        """Issue the stop (once per process lifetime), and finish the attempt when it returned."""
        key = (job.id, job.attempt)
        kind = kind or job.stop_kind
        future = self._stops.get(key)
        if future is None:
            grace = {"preempt": self.config.preempt_grace_s, "cancel": self.config.cancel_grace_s}
            future = self._stops[key] = self._run_stop(key, grace.get(kind or "", self.config.fail_grace_s))
        if not future.done():
            return
        del self._stops[key]
        if future.exception() is not None:
            log.warning("stop of %s attempt %s failed, retrying: %s", job.id, job.attempt, future.exception())
            return
        self._drain_logs(job.id, job.attempt)
        self.tr.finish(job.id, job.attempt, self._status.pop(key, None))

    def _run_stop(self, key: Key, grace_s: float) -> Future[None]:
        if self._pool is not None:
            return self._pool.submit(self.cluster.stop, key[0], key[1], grace_s)
        future: Future[None] = Future()
        try:
            self.cluster.stop(key[0], key[1], grace_s)
            future.set_result(None)
        except Exception as err:  # reported through the future, as on the pool
            future.set_exception(err)
        return future

    def _pool_draining(self, slices: list[r.SliceRecord]) -> None:
        """Tell a cluster with a warm pool (RayCluster) to give drained free slices back, and to
        take them again when undrained."""
        drained = {s.name for s in slices if s.draining and s.holder is None}
        release = getattr(self.cluster, "release", None)
        warm = getattr(self.cluster, "warm", None)
        try:
            if release is not None and drained - self._released:
                release(sorted(drained - self._released))
            if warm is not None and self._released - drained:
                warm(sorted(self._released - drained))
            self._released = drained
        except TpufleetError as err:
            log.warning("could not update the warm pool for drained slices: %s", err)

    # -- logs ---------------------------------------------------------------------------------
    def _pull_logs(self) -> None:
        for job in self.tr.active_jobs():
            if job.state in (r.STARTING, r.RUNNING) and job.stop_kind is None:
                self._read_logs(job.id, job.attempt, reads=1)

    def _drain_logs(self, job_id: str, attempt: int) -> None:
        self._read_logs(job_id, attempt, reads=self.config.final_log_reads)

    def _read_logs(self, job_id: str, attempt: int, reads: int) -> None:
        for cur in self.tr.cursors(job_id, attempt):
            offset, complete = cur.offset, cur.complete
            for _ in range(reads if not complete else 0):
                try:
                    chunk = self.cluster.read_logs(job_id, attempt, cur.slice, cur.worker_id, offset)
                except TpufleetError as err:
                    log.info("logs of %s/%s host %s: %s", job_id, attempt, cur.host, err)
                    break
                if chunk.data or chunk.complete != complete or chunk.next_offset != offset:
                    self.tr.append_log(
                        job_id, attempt, cur.host, chunk.data, chunk.next_offset, chunk.complete
                    )
                offset, complete = chunk.next_offset, chunk.complete
                if complete or not chunk.data:
                    break

    # -- the loop thread ----------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="tpufleet-scheduler", daemon=True)
            self._thread.start()

    def wake(self) -> None:
        """Run the next cycle now (after a submit or cancel)."""
        self._wake.set()

    def close(self, timeout_s: float = 30.0) -> None:
        self._halt.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> None:
        while not self._halt.is_set():
            try:
                self.run_once()
                self.last_error = None
            except Exception as err:  # the loop must survive a bad cycle; the next one retries
                self.last_error = f"{type(err).__name__}: {err}"
                log.exception("scheduling cycle failed")
            self._wake.wait(self.config.busy_interval_s if self._busy else self.config.interval_s)
            self._wake.clear()


def _policy() -> Decide:
    from tpufleet.scheduler.policy import decide

    return decide
