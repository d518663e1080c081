"""The soak's driver: what ``Soak.run`` starts, submits, waits for and stops.

What it starts, it stops by PID: an :class:`~tpufleet.emulator.EmulatedFleet` of its own and
``tpufleet serve`` as a subprocess (``server.py``). Faults run in one background thread
(``faults.py``); the main thread submits jobs (through the REST client, retrying while the server
is down, never twice: a job is named ``chaos-<i>`` and looked up before a retry) and follows them,
then hands what happened to the verdict (``verdict.py``).
"""

from __future__ import annotations

import os
import random
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpufleet.chaos import fencing, verdict
from tpufleet.chaos.faults import Faults
from tpufleet.chaos.leaders import FailoverClient, Replicas
from tpufleet.chaos.plan import TENANTS, ChaosConfig, PlannedJob, parse_slices, plan_faults, plan_jobs
from tpufleet.chaos.server import ControlPlane
from tpufleet.errors import SpecError, TpufleetError
from tpufleet.scheduler.lifecycle import JobKind

SANDBOX_SECONDS = "TPUFLEET_SANDBOX_SECONDS"  # a sandbox job's env: how long its hosts "run"
SUBMIT_GRACE_S = 300.0  # after the window, how long a submit is retried while the server is down (then: lost)
NO_CLOUD = {"NO_GCE_CHECK": "True", "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9"}


def _free_port() -> int:
    """The soak's own control plane listens here across every restart it makes, for minutes: a
    port below the ephemeral range, which nothing else on the machine is given meanwhile (with a
    ``bind(0)`` port, another control plane took it once, and the soak talked to that one)."""
    from tpufleet.emulator import procs

    return procs.free_port()


class Soak:
    """One run; :meth:`run` returns the result object ``tpufleet chaos --json`` prints."""

    def __init__(self, cfg: ChaosConfig, say: Callable[[str], None] = lambda _m: None) -> None:
        if cfg.jobs < 1:
            raise SpecError(f"--jobs must be >= 1, got {cfg.jobs}")
        if cfg.minutes <= 0:
            raise SpecError(f"--minutes must be > 0, got {cfg.minutes:g}")
        self.cfg = cfg
        self.say = say
        self.slices = parse_slices(cfg.slices)  # a bad spec fails here, before anything starts
        rng = random.Random(cfg.seed)
        self.jobs = plan_jobs(cfg, rng)
        self.fault_plan = plan_faults(cfg, rng)
        self.rng = random.Random(cfg.seed + 1)  # targets and delays, drawn as faults happen
        self.token = f"chaos-{uuid.uuid4().hex[:12]}"
        self._tmp = cfg.state_dir is None
        self.dir = Path(cfg.state_dir or tempfile.mkdtemp(prefix="tpufleet-chaos-"))
        self.cp_dir = cfg.server_state_dir or self.dir / "cp"
        self.port = _free_port()
        self.url = (cfg.server or f"http://127.0.0.1:{self.port}").rstrip("/")
        self.fleet: Any = None
        self.server: ControlPlane | Replicas
        if cfg.replicas:
            self.ports = [self.port, *(_free_port() for _ in range(cfg.replicas - 1))]
            urls = [f"http://127.0.0.1:{p}" for p in self.ports]
            self.server = Replicas(urls, self.dir, self._replica_command, cfg.lease_s)
        else:
            self.server = ControlPlane(
                self.url, self.dir, self._serve_command if cfg.server is None else None
            )
        self.faults: Faults | None = None
        self._t0 = 0.0
        self._first_event = 0  # with replicas: the store's events before the soak are not judged

    def _now(self) -> float:
        return time.monotonic() - self._t0

    def _start_fleet(self) -> None:
        from tpufleet.emulator import EmulatedFleet

        if self.cfg.sandbox:
            self.say(f"replicas serve a sandbox fleet {self.cfg.sandbox} each (no Ray)")
            return
        if self.cfg.fleet_dir is not None:
            self.fleet = EmulatedFleet.attach(self.cfg.fleet_dir)
            self.say(f"soaking the emulated fleet in {self.cfg.fleet_dir} (Ray at {self.fleet.ray_address})")
            return
        self.say(f"starting an emulated fleet {self.cfg.slices} in {self.dir / 'fleet'}")
        self.fleet = EmulatedFleet(
            self.cfg.slices, cpus_per_host=self.cfg.cpus_per_host, state_dir=self.dir / "fleet"
        ).up()

    def _serve_command(self) -> tuple[list[str], dict[str, str]]:
        """The soak's own ``tpufleet serve``: its command line and environment, at each start."""
        env = {
            **os.environ,
            **NO_CLOUD,
            **self.fleet.client_env(),
            "TPUFLEET_CONFIG": str(self.dir / "cli-context.yaml"),  # never the user's context
        }
        cmd = [sys.executable, "-m", "tpufleet", "serve", "--ray-address", self.fleet.ray_address]
        cmd += ["--state-dir", str(self.cp_dir), "--port", str(self.port), "--start-timeout", "120"]
        if any(j.kind == JobKind.RAY for j in self.jobs):
            cmd.append("--allow-ray-jobs")
        return cmd, env

    def _replica_dir(self, i: int) -> Path:
        return self.dir / f"cp-{i}"

    def _replica_command(self, i: int) -> tuple[list[str], dict[str, str]]:
        """Replica ``i``'s ``tpufleet serve``: the soak's database, its own state dir and port, and
        (on the emulated fleet) the checkpoint root every replica shares."""
        assert self.cfg.db is not None
        env = {**os.environ, **NO_CLOUD, "TPUFLEET_CONFIG": str(self.dir / f"cli-context-{i}.yaml")}
        cmd = [sys.executable, "-m", "tpufleet", "serve", "--db", self.cfg.db]
        cmd += ["--state-dir", str(self._replica_dir(i)), "--port", str(self.ports[i])]
        cmd += ["--lease-seconds", f"{self.cfg.lease_s:g}"]
        if self.cfg.sandbox:
            return [*cmd, "--sandbox", self.cfg.sandbox], env
        env.update(self.fleet.client_env())
        cmd += ["--ray-address", self.fleet.ray_address, "--start-timeout", "120"]
        cmd += ["--checkpoint-root", str(self._checkpoints())]
        if any(j.kind == JobKind.RAY for j in self.jobs):
            cmd.append("--allow-ray-jobs")
        return cmd, env

    def _checkpoints(self) -> Path:
        """Where the jobs' checkpoint directories (and the hosts' markers) are."""
        return self.dir / "checkpoints" if self.cfg.replicas else self.cp_dir / "checkpoints"

    def _admin(self) -> Any:
        from tpufleet.api.serving import ADMIN_TOKEN_FILE
        from tpufleet.client.http import Client

        if self.cfg.replicas:  # each replica's own admin token: rows of the one database
            servers = [
                (p.url, (self._replica_dir(i) / ADMIN_TOKEN_FILE).read_text().strip())
                for i, p in enumerate(self.server.planes)  # type: ignore[union-attr]
            ]
            return FailoverClient(servers)
        token = self.cfg.token or (self.cp_dir / ADMIN_TOKEN_FILE).read_text().strip()
        return Client(self.url, token, timeout_s=10)

    def _submit(self, admin: Any, job: PlannedJob, uncertain: bool) -> str | None:
        """The job's id once submitted (or found, after a submit whose answer was lost)."""
        if uncertain:
            for j in admin.jobs():
                if j["name"] == job.name:
                    return str(j["id"])
        body = admin.submit(
            job.command(self.token),
            job.accelerator_type,
            env={SANDBOX_SECONDS: f"{job.seconds:g}"} if self.cfg.sandbox else None,
            kind=job.kind,
            num_slices=job.num_slices,
            priority=job.priority,
            max_retries=20,
            name=job.name,
            tenant=job.tenant,
        )
        return str(body["id"])

    def run(self) -> dict[str, Any]:
        started = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_fleet()
            if self.cfg.db is not None:
                self._first_event = fencing.last_event(self.cfg.db)
            if isinstance(self.server, Replicas) or self.cfg.server is None:
                self.server.start()
            else:
                self.server.await_up(None)
            return self._soak(started)
        finally:
            if self.faults is not None:
                self.faults.stop()
            if self.cfg.server is not None and isinstance(self.server, ControlPlane):
                self.server.restart_external()  # leave it as it was found: running
            self.server.kill(signal.SIGTERM)
            if self.fleet is not None and self.cfg.fleet_dir is None:
                self.fleet.down()
            if self._tmp:
                import shutil

                shutil.rmtree(self.dir, ignore_errors=True)

    def _tenants(self, admin: Any) -> None:
        from tpufleet.errors import ConflictError

        generations = sorted({t.rsplit("-", 1)[0] for t, _ in self.slices})
        for tenant, chips in TENANTS.items():
            try:
                admin.create_tenant(tenant, {g: chips for g in generations})
            except ConflictError:  # a control plane soaked before: its tenants are still there
                admin.update_tenant(tenant, quota={g: chips for g in generations})

    def _soak(self, started: float) -> dict[str, Any]:
        admin = self._admin()
        self._tenants(admin)
        self._t0 = time.monotonic()
        faults = self.faults = Faults(
            self.fault_plan,
            fleet=self.fleet,
            server=self.server,
            types=[t for t, _ in self.slices],
            rng=self.rng,
            now=self._now,
            say=self.say,
        )
        faults.start()
        ids, rejected = self._submit_all(admin, faults)
        # the window is over: no new faults; bring every host and the control plane back
        faults.stop(timeout_s=300)
        for name in sorted(self.fleet.down_hosts() if self.fleet is not None else ()):
            try:
                self.fleet.restore(name)
            except TpufleetError as err:
                faults.errors.append(f"final restore {name}: {err}")
        self.server.ensure_up()
        self.say(f"[{self._now():6.1f}s] fault window over; waiting for every job to end")
        self._await_end(admin, ids)
        result = self._result(admin, ids, rejected, faults)
        result["seconds"] = round(time.monotonic() - started, 1)
        admin.close()
        return result

    def _submit_all(self, admin: Any, faults: Faults) -> tuple[dict[int, str], dict[int, str]]:
        """Submit each planned job at its time, through the window; returns ``({index: job id},
        {index: why it was rejected})``. After the window, it goes on while jobs wait to be
        submitted or planned damage to be done (a soak slowed down by its machine does all it
        planned), for at most ``SUBMIT_GRACE_S``."""
        from tpufleet.errors import ClusterError

        window = self.cfg.minutes * 60
        ids: dict[int, str] = {}
        rejected: dict[int, str] = {}
        uncertain: set[int] = set()
        pending = list(self.jobs)

        def more() -> bool:
            now = self._now()
            return now < window or (
                now < window + SUBMIT_GRACE_S and (bool(pending) or faults.damage_left > 0)
            )

        while more():
            while pending and pending[0].at <= self._now():
                job = pending[0]
                try:
                    got = self._submit(admin, job, job.index in uncertain)
                except ClusterError:  # the server is down (or died mid-request): try again later
                    uncertain.add(job.index)
                    break
                except TpufleetError as err:
                    rejected[job.index] = f"rejected: {err}"
                    got = None
                if got is not None:
                    ids[job.index] = got
                    self.say(
                        f"[{self._now():6.1f}s] submitted {job.name} {job.num_slices}x{job.accelerator_type}"
                        + (" (Ray job)" if job.kind == JobKind.RAY else "")
                    )
                pending.pop(0)
            time.sleep(0.2)
        return ids, rejected

    def _await_end(self, admin: Any, ids: dict[int, str]) -> None:
        """Until every submitted job is in a terminal state, or the drain timeout passed."""
        from tpufleet.errors import ClusterError

        deadline = time.monotonic() + self.cfg.drain_timeout_s
        views: dict[str, dict[str, Any]] = {}
        while True:
            try:
                views = {str(j["id"]): j for j in admin.jobs()}
            except ClusterError:
                views = views or {}
            if all(views.get(i, {}).get("state") in verdict.TERMINAL for i in ids.values()):
                return
            if time.monotonic() > deadline:
                return
            time.sleep(1.0)

    def _result(
        self, admin: Any, ids: dict[int, str], rejected: dict[int, str], faults: Faults
    ) -> dict[str, Any]:
        judged = verdict.judge_jobs(self.jobs, ids, rejected, admin.job, self._checkpoints())
        pgs = verdict.leaked_placement_groups(self.fleet, admin) if self.fleet is not None else []
        procs = verdict.leaked_processes(self.token)
        leaders: dict[str, Any] = {}
        if self.cfg.replicas and self.cfg.db is not None:
            leaders = {"replicas": self.cfg.replicas, **fencing.judge(self.cfg.db, self._first_event)}
        return {
            "seed": self.cfg.seed,
            "slices": self.cfg.slices,
            "minutes": self.cfg.minutes,
            "jobs": len(self.jobs),
            "succeeded": len(judged["succeeded"]),
            "ray_jobs": sum(j.kind == JobKind.RAY for j in self.jobs),
            "ray_succeeded": judged["ray_succeeded"],
            "failed": judged["failed"],
            "lost": judged["lost"],
            "double_runs": judged["double_runs"],
            "leaked_placement_groups": pgs,
            "leaked_processes": procs,
            "faults": dict(sorted(faults.counts.items())),
            "fault_errors": faults.errors,
            "fault_log": faults.log,
            "control_plane_starts": self.server.starts,
            "ray_reconnects": verdict.reconnects(self.dir),
            **leaders,
        }
