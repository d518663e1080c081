"""``EmulatedFleet``: a local Ray cluster whose raylets Ray, Ray Train and JAX take for TPU hosts.

One head (no TPU, no CPU) plus one Ray node per emulated host, each in its own session and its
own Ray temp dir, all on this machine with random free ports, so several fleets (and other
people's clusters) coexist. Nodes are started by ``rayhost.py`` with ``ray start``'s flags
(``lean=True``, the default: no ``ray start`` CLI, a stand-in for each host's dashboard agent, no
prestarted workers; ``lean=False`` is plain ``ray start``), hosts ``wave_size`` at a time, each
wave of lean hosts from one launcher that imports Ray once and forks a child per host.
Every operation is recorded in ``state_dir`` (see ``state.py``), so a fleet started by one
process (``tpufleet emulate up``) is inspected, broken and stopped by others::

    with EmulatedFleet("v4-16:2,v6e-4") as fleet:
        ray.init(address=fleet.ray_address)
        fleet.kill_host("tpu-v4-16-0", 1)   # SIGKILL, like a VM vanishing
        fleet.restore("tpu-v4-16-0")        # same slice name and worker id, new Ray node

Ray token authentication is on (see ``auth.py``): ``up`` writes a random token to
``<state_dir>/ray-auth-token`` (0600) and every Ray process of the fleet reads it from there. The
process that runs ``up`` (or calls :meth:`EmulatedFleet.authenticate`) has ``RAY_AUTH_MODE`` and
``RAY_AUTH_TOKEN_PATH`` set in ``os.environ``, so its ``ray.init`` and every subprocess it starts
connect; anyone else exports :meth:`EmulatedFleet.client_env` first.

Failure detection: the head's GCS health-checks raylets every second and declares a node dead
after three failed checks (Ray's defaults are 3 s and 5), so a killed host is noticed in seconds.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from subprocess import Popen
from typing import Any

from tpufleet import catalog
from tpufleet.catalog import SliceType
from tpufleet.contract import RAY_TRAIN_POLL_MIN_S, RAY_TRAIN_POLL_VAR, SLICE_LABEL, WORKER_LABEL
from tpufleet.emulator import auth, deviceplugin, plan, procs, raynodes
from tpufleet.emulator import state as store
from tpufleet.emulator.raynodes import read_nodes
from tpufleet.emulator.state import EmulatedSlice, FleetState, HostRecord
from tpufleet.errors import ClusterError, ConflictError, NotFoundError, SpecError, closest, suggest

log = logging.getLogger(__name__)

# How long a wave of hosts (and each restore or add) has to join: longer than a node's own wait to
# register (rayhost.REGISTER_WAIT_S), so that a node a loaded machine starts slowly fails for its
# own reason first; a few seconds on a quiet machine.
JOIN_WAIT_S = 300.0
# How long ``remove`` asks Ray again to drain a host that refused as busy before it stops it.
IDLE_WAIT_S = 2.0

HEAD_ENV = {
    # GCS failure detection for a killed host: ~3 s instead of ~15 s.
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
    # Ray Train's controller polls its workers every 0.5 s instead of every 2 s. Its controller runs
    # on the driver's node, the head for a Ray job, and reads this from its environment (a driver's
    # own value is propagated to it and wins). Each poll is where a report becomes a recorded
    # checkpoint and where the end of a run is seen: a 4-step JaxTrainer run on v4-16 took 38.5 s
    # end to end with Ray's default and 25.0 s with this.
    RAY_TRAIN_POLL_VAR: str(RAY_TRAIN_POLL_MIN_S),
    # The head's start waits for its dashboard (Ray's job API) up to this long, not Ray's 60 s: on
    # a loaded 2-core CI runner the dashboard, which imports and forks its ten modules, once took
    # longer, and the head (and every host waiting for it) failed. Shorter than JOIN_WAIT_S, so
    # that a dashboard that never comes up fails for its own reason first, and than a test's 300 s.
    "RAY_DASHBOARD_STARTUP_TIMEOUT_S": "180",
}


def _scratch_env(st: FleetState) -> dict[str, str]:
    """``TMPDIR`` for the head's processes: a folder of the fleet's temp dir, which ``down`` removes
    once every PID is gone. What they leave in the system's temp dir when they are ended by a signal
    stays there otherwise: the dashboard's multiprocessing folder (``pymp-*``, its forkserver's
    socket) was left in /tmp by every fleet. Ray's own files go to the ``--temp-dir`` it is given,
    not here. The hosts keep the environment a TPU VM has (no ``TMPDIR``)."""
    scratch = Path(st.temp_dir) / "tmp"
    scratch.mkdir(mode=0o700, exist_ok=True)
    return {"TMPDIR": str(scratch)}


Key = tuple[str, int]  # (slice name, worker id)
Launcher = tuple[Popen[bytes], Path]  # a process that starts hosts, and its log
# Start a wave of hosts (returns their launchers); wait for launchers to exit 0 and hosts to join.
LaunchHosts = Callable[[FleetState, Sequence[tuple[EmulatedSlice, int]]], list[Launcher]]
AwaitHosts = Callable[[FleetState, Sequence[Launcher], list[Key]], None]


def _ray_bin() -> str:
    return str(Path(sys.executable).with_name("ray"))


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def _node_key(node: dict[str, Any]) -> Key | None:
    labels = node.get("Labels") or {}
    if SLICE_LABEL not in labels or WORKER_LABEL not in labels:
        return None
    return labels[SLICE_LABEL], int(labels[WORKER_LABEL])


MIB = 1024 * 1024


def _ray_object_store_minimum() -> int:
    """The least object store Ray starts a node with (bytes); a smaller one fails its ``ray start``."""
    from ray._private import ray_constants

    return int(ray_constants.OBJECT_STORE_MINIMUM_MEMORY_BYTES)


class EmulatedFleet:
    """A fleet of emulated TPU slices; see the module docstring."""

    def __init__(
        self,
        slices: str = "v4-16:2",
        *,
        cpus_per_host: int = 1,
        state_dir: str | os.PathLike[str] | None = None,
        object_store_mb: int = 128,
        log_monitor: bool = True,
        timeout_s: float = JOIN_WAIT_S,
        lean: bool = True,
        wave_size: int = 8,
        temp_root: str = "/tmp",
    ) -> None:
        """``temp_root``: where each start makes the fleet's Ray temp dir (``tpf-*``, removed by
        ``down`` and by a start that fails); short, since Ray's socket paths live under it."""
        self._spec = catalog.parse_slice_list(slices) if slices else []
        plan.check_fits(sum(st.hosts * n for st, n in self._spec), procs.physical_memory(), slices)
        if cpus_per_host < 0:
            raise SpecError(f"--cpus-per-host must be >= 0, got {cpus_per_host}")
        if object_store_mb * MIB < (floor := _ray_object_store_minimum()):
            least = -(-floor // MIB)
            raise SpecError(f"object store of {object_store_mb} MiB a host: Ray needs at least {least} MiB")
        if wave_size < 1:
            raise SpecError(f"wave size must be >= 1, got {wave_size}")
        self.cpus_per_host = cpus_per_host
        self._owns_dir = state_dir is None
        self.state_dir = Path(state_dir) if state_dir else Path(tempfile.mkdtemp(prefix="tpufleet-emu-"))
        self.object_store_bytes = object_store_mb * MIB
        self.log_monitor = log_monitor
        self.timeout_s = timeout_s  # for each wave of hosts (and each restore/add) to join
        self.lean = lean
        self.wave_size = wave_size
        self.temp_root = temp_root

    @classmethod
    def attach(cls, state_dir: str | os.PathLike[str]) -> EmulatedFleet:
        """The fleet a previous ``up`` (maybe in another process) recorded in ``state_dir``."""
        fleet = cls("", state_dir=state_dir)
        fleet._load()
        return fleet

    # -- reading --------------------------------------------------------------------------------

    def _load(self) -> FleetState:
        st = store.load(self.state_dir)
        if st is None:
            raise NotFoundError(
                f"no emulated fleet in {self.state_dir}; start one with `tpufleet emulate up`"
            )
        return st

    @property
    def ray_address(self) -> str:
        return self._load().ray_address

    @property
    def auth_token_path(self) -> Path:
        """The file (0600) holding the Ray auth token of the running fleet."""
        return (self.state_dir / auth.TOKEN_FILE).absolute()

    def client_env(self) -> dict[str, str]:
        """The variables a client process needs before ``ray.init(address=fleet.ray_address)``:
        ``{"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": <auth_token_path>}``."""
        return auth.client_env(self.auth_token_path)

    def authenticate(self) -> EmulatedFleet:
        """Set :meth:`client_env` in this process (for its ``ray.init`` and its subprocesses);
        see :func:`tpufleet.emulator.auth.activate`. ``up`` does this already."""
        self._load()
        auth.activate(self.auth_token_path)
        return self

    @property
    def slice_names(self) -> list[str]:
        return [s.name for s in self._load().slices]

    def _slice(self, st: FleetState, name: str) -> EmulatedSlice:
        rec = st.slice(name)
        if rec is None:
            names = [s.name for s in st.slices]
            raise NotFoundError(f"no slice {name!r} in this fleet{suggest(closest(name, names) or names)}")
        return rec

    def head_alive(self) -> bool:
        st = store.load(self.state_dir)
        return bool(st and st.head and procs.members(st.head))

    def down_hosts(self) -> dict[str, list[int]]:
        """``{slice: [worker ids]}`` of hosts this fleet killed or preempted and has not restored
        (from the state file alone; no Ray call)."""
        st = self._load()
        down = {s.name: [h.worker_id for h in s.hosts if h.session is None] for s in st.slices}
        return {name: workers for name, workers in down.items() if workers}

    def pids(self) -> list[int]:
        """Every live process this fleet started (head, hosts, and what Ray started for them)."""
        st = store.load(self.state_dir)
        return procs.alive(st.sessions()) if st else []

    def status(self) -> dict[str, Any]:
        """``{ray_address, state_dir, slices: [{name, accelerator_type, topology, hosts: [...]}]}``."""
        st = self._load()
        nodes = []
        if st.head and procs.members(st.head):
            auth.activate(self.auth_token_path)
            nodes = read_nodes(st.ray_address)
        found: dict[Key, dict[str, Any]] = {}
        node: dict[str, Any] | None
        for node in nodes:
            key = _node_key(node)
            if key and (key not in found or node.get("Alive")):
                found[key] = node  # an alive node wins over the dead ones it replaced
        slices = []
        for rec in st.slices:
            hosts = []
            for h in rec.hosts:
                node = found.get((rec.name, h.worker_id))
                hosts.append(
                    {
                        "worker_id": h.worker_id,
                        "node_id": node.get("NodeID") if node else None,
                        "alive": bool(node and node.get("Alive")),
                    }
                )
            st_type = catalog.slice_type(rec.accelerator_type)
            slices.append(
                {
                    "name": rec.name,
                    "accelerator_type": rec.accelerator_type,
                    "topology": str(st_type.topology),
                    "hosts": hosts,
                }
            )
        return {"ray_address": st.ray_address, "state_dir": str(self.state_dir), "slices": slices}

    # -- starting -------------------------------------------------------------------------------

    def _node_env(self) -> dict[str, str]:
        """What every node's launch gets, the head's too: the caller's clean environment,
        ``plan.NODE_ENV`` and the fleet's Ray token."""
        return plan.clean_base_env(os.environ) | plan.NODE_ENV | auth.server_env(self.auth_token_path)

    def _hosts_env(self, st: FleetState) -> dict[str, str]:
        """What every host's launch gets, whichever host: :meth:`_node_env`, lean, no prestarted
        workers, the shared JAX compilation cache when ``TPUFLEET_EMULATOR_JAX_CACHE`` names
        one (``plan.jax_cache_env``), and the hosts' ``sitecustomize`` (``plan.site_env``)."""
        lean = plan.LEAN_HOST_ENV if st.lean else {}
        return (
            self._node_env()
            | lean
            | plan.jax_cache_env(os.environ.get(plan.JAX_CACHE_VAR))
            | plan.site_env(os.environ.get("PYTHONPATH"))
        )

    def _host_start(
        self, st: FleetState, rec: EmulatedSlice, worker: int, runtime_env_port: int
    ) -> tuple[HostRecord, list[str], dict[str, str], Path]:
        """One host's launch: its record (given a new temp dir), command line, whole environment, log.
        ``runtime_env_port``: where its own runtime env agent listens (no port file to wait for);
        0 when it uses the head's."""
        stype = catalog.slice_type(rec.accelerator_type)
        env = (
            self._hosts_env(st)
            | plan.host_envs(rec.name, stype, st.address)[worker]
            | deviceplugin.host_env(st.address)  # TPU_DEVICE_PLUGIN_ADDR, served by a thread on the host
        )
        host = next(h for h in rec.hosts if h.worker_id == worker)
        host.temp_dir = f"{st.temp_dir}/h{st.next_host_seq}"
        st.next_host_seq += 1
        where = (st.address, st.ray_address, stype, st.cpus_per_host, host.temp_dir)
        what = (*where, st.object_store_bytes, st.log_monitor and not st.host_logs_on_head)
        shared = st.heads_runtime_env  # the head's agent serves this host (docs/emulator.md)
        ports = plan.AgentPorts(runtime_env=st.runtime_env_port if shared else runtime_env_port)
        if st.lean:
            argv = plan.lean_host_argv(sys.executable, *what, ports=ports, heads_runtime_env=shared)
        else:
            argv = plan.host_argv(_ray_bin(), *what, ports=ports)
        return host, argv, env, self.state_dir / "logs" / f"{rec.name}-w{worker}.log"

    def _launch_hosts(
        self, st: FleetState, hosts: Sequence[tuple[EmulatedSlice, int]]
    ) -> list[tuple[Popen[bytes], Path]]:
        """Start ``hosts`` and record each one's session; returns the launchers to await.

        Lean hosts start from one launcher (``rayhost.py --group``: Ray's modules imported once,
        a forked child per host, each its own session); a plain ``ray start`` host, or a lone
        host, from a launcher of its own. Returns once every host's session is known."""
        # drawn together: no two hosts of a wave get the same; none for hosts that use the head's agent
        ports = [0] * len(hosts) if st.heads_runtime_env else procs.free_ports(len(hosts))
        starts = [self._host_start(st, rec, w, port) for (rec, w), port in zip(hosts, ports, strict=True)]
        if not st.lean or len(hosts) < 2:
            launched = []
            for host, argv, env, log in starts:
                proc, host.session = procs.spawn(argv, env, log)
                launched.append((proc, log))
            return launched
        group_log = self.state_dir / "logs" / f"group-{st.next_host_seq}.log"
        launcher = [sys.executable, "-P", plan.RAYHOST_SCRIPT, "--group"]
        flags = [(argv[3:], env, log) for _, argv, env, log in starts]  # lean_host_argv: python -P script ...
        group, reported = procs.spawn_group(launcher, self._hosts_env(st), group_log, flags, self.timeout_s)
        for (host, *_), found in zip(starts, reported, strict=True):
            host.session = found
        return [(group, group_log)]

    @staticmethod
    def _new_slice(st: FleetState, stype: SliceType, name: str) -> EmulatedSlice:
        rec = EmulatedSlice(name, stype.accelerator_type, [HostRecord(w, None) for w in range(stype.hosts)])
        st.slices.append(rec)
        return rec

    def _launch_slice(self, st: FleetState, stype: SliceType, name: str) -> list[tuple[Popen[bytes], Path]]:
        rec = self._new_slice(st, stype, name)
        return self._launch_hosts(st, [(rec, w) for w in range(stype.hosts)])

    def up(self) -> EmulatedFleet:
        """Start the head and every host; return once every host has joined Ray."""
        with store.locked(self.state_dir):
            old = store.load(self.state_dir)
            if old and old.head and procs.members(old.head):
                raise ConflictError(
                    f"an emulated fleet already runs from {self.state_dir} (Ray at {old.ray_address}); "
                    "stop it with `tpufleet emulate down` or use another --state-dir"
                )
            if old:  # a fleet whose head died: end its surviving hosts, or nothing would ever stop them
                procs.kill_sessions(old.sessions())
                shutil.rmtree(old.temp_dir, ignore_errors=True)
            st = self._new_state()
            try:
                auth.write_token(self.auth_token_path, self._token_for_new_fleet())
                head = self._launch_head(st)
                for stype, count in self._spec:
                    taken = [s.name for s in st.slices]
                    for name in plan.next_slice_names(taken, stype.accelerator_type, count):
                        self._new_slice(st, stype, name)
                store.save(self.state_dir, st)
                auth.activate(self.auth_token_path)  # this process talks to the fleet from now on
                self._start_in_waves(st, head)
            except BaseException:  # a fleet that did not come up leaves nothing behind, as `down` does
                procs.kill_sessions(st.sessions())
                store.remove(self.state_dir)
                self._drop_token()
                shutil.rmtree(st.temp_dir, ignore_errors=True)
                raise
        return self

    def _start_in_waves(
        self,
        st: FleetState,
        head: Launcher,
        *,
        launch: LaunchHosts | None = None,
        wait: AwaitHosts | None = None,
    ) -> None:
        """Start every host of ``st``, ``wave_size`` at a time, each wave once the last has joined.

        Ray gives a starting node 30 s to register with the GCS (``ray._private.node``, fixed), and
        on a small machine dozens of hosts starting at once starve each other past it ("The current
        node timed out during startup"); waves bound the contention, so any fleet size comes up.
        ``launch`` and ``wait`` start a wave and wait for it (``_launch_hosts`` and ``_await``
        unless given: a test gives its own to see the waves without starting a process).
        """
        launch = launch or self._launch_hosts
        wait = wait or self._await
        hosts = [(rec, h.worker_id) for rec in st.slices for h in rec.hosts]
        launchers = [head]
        for i in range(0, len(hosts), self.wave_size):
            wave = hosts[i : i + self.wave_size]
            launchers += launch(st, wave)
            store.save(self.state_dir, st)
            wait(st, launchers, [(rec.name, worker) for rec, worker in wave])
            launchers = []  # those of earlier waves exited 0 (checked by wait)
        if launchers:  # a fleet without hosts: the head alone
            wait(st, launchers, [])

    @staticmethod
    def _token_for_new_fleet() -> str:
        """A new random token, unless this process is connected to Ray with a token already: Ray
        holds one token per process, so a fleet started from there shares it (or the caller could
        not talk to both)."""
        import ray

        if ray.is_initialized() and (token := auth.active_token()):
            return token
        return auth.new_token()

    def _drop_token(self) -> None:
        auth.deactivate(self.auth_token_path)
        self.auth_token_path.unlink(missing_ok=True)

    def _new_state(self) -> FleetState:
        import ray.util

        ray_util: Any = ray.util
        gcs, dashboard = procs.free_ports(2)
        return FleetState(
            fleet_id=uuid.uuid4().hex[:12],
            address=ray_util.get_node_ip_address(),
            gcs_port=gcs,
            dashboard_port=dashboard,
            temp_dir=tempfile.mkdtemp(prefix="tpf-", dir=self.temp_root),
            cpus_per_host=self.cpus_per_host,
            object_store_bytes=self.object_store_bytes,
            log_monitor=self.log_monitor,
            lean=self.lean,
        )

    def _launch_head(self, st: FleetState) -> tuple[Popen[bytes], Path]:
        where = (st.address, st.gcs_port, st.dashboard_port)
        # drawn together, so all differ, and none is the head's GCS or dashboard port (a restarted
        # head keeps the ports another process drew, which nothing listens on yet)
        *agents, client_port = procs.free_ports(5, exclude=(st.gcs_port, st.dashboard_port))
        ports = plan.AgentPorts(*agents)  # the raylet waits for no agent's port file
        if st.lean:
            lean = (sys.executable, *where, st.temp_dir, st.object_store_bytes)
            argv = plan.lean_head_argv(*lean, ports=ports, host_logs=st.log_monitor)
            st.runtime_env_port = ports.runtime_env  # every lean host's runtime env agent
            st.host_logs_on_head = st.log_monitor  # and its log monitor every lean host's
        else:
            head = (_ray_bin(), *where, client_port, st.temp_dir, st.object_store_bytes)
            argv = plan.head_argv(*head, ports=ports)
        log = self.state_dir / "logs" / "head.log"
        proc, st.head = procs.spawn(argv, self._node_env() | HEAD_ENV | _scratch_env(st), log)
        return proc, log

    def _await(self, st: FleetState, launchers: Sequence[tuple[Popen[bytes], Path]], keys: list[Key]) -> None:
        """Wait until every launcher exited 0 and every host in ``keys`` is alive in Ray."""
        deadline = time.monotonic() + self.timeout_s
        missing = set(keys)
        while True:
            for proc, log in launchers:
                if proc.poll() not in (None, 0):
                    raise ClusterError(f"`ray start` failed (exit {proc.returncode}); {log}:\n{_tail(log)}")
            if missing:
                missing -= self._alive_keys(st)
            if not missing and all(proc.poll() == 0 for proc, _ in launchers):
                return
            if time.monotonic() > deadline:
                hosts = ", ".join(f"{s}/{w}" for s, w in sorted(missing)) or "(launchers still running)"
                raise ClusterError(f"hosts did not join within {self.timeout_s:.0f}s: {hosts}")
            time.sleep(0.2)

    def _alive_keys(self, st: FleetState) -> set[Key]:
        auth.activate(self.auth_token_path)
        try:
            nodes = read_nodes(st.ray_address)
        except ClusterError:
            return set()  # the GCS is still starting
        return {k for n in nodes if n.get("Alive") and (k := _node_key(n))}

    def _await_gone(self, st: FleetState, keys: set[Key]) -> None:
        deadline = time.monotonic() + self.timeout_s
        while keys & self._alive_keys(st):
            if time.monotonic() > deadline:
                raise ClusterError(f"Ray still reports {sorted(keys)} alive after {self.timeout_s:.0f}s")
            time.sleep(0.2)

    # -- breaking and repairing -------------------------------------------------------------------

    def _kill(self, st: FleetState, hosts: Sequence[HostRecord], where: str) -> None:
        sessions = [h.session for h in hosts if h.session]
        left = procs.kill_sessions(sessions)
        if left:
            raise ClusterError(f"could not end processes {left} of {where}")
        for h in hosts:
            h.session = None
        store.save(self.state_dir, st)

    def _scale_in(self, st: FleetState, slice_name: str) -> None:
        """Have Ray end the live hosts of ``slice_name`` as an autoscaler does (see :meth:`remove`):
        each drained as idle, and one still busy after ``IDLE_WAIT_S`` stopped (``raynodes.stop``).
        A host refuses the idle drain while work is on it; work just given back (a control plane's
        idle runner, killed asynchronously) is gone within that wait, as it would be before an
        autoscaler's next try. Best effort: with the head down, the hosts are simply ended."""
        if not (st.head and procs.members(st.head)):
            return
        try:
            auth.activate(self.auth_token_path)
            nodes = raynodes.alive_slice_nodes(st.ray_address, slice_name)
            why = f"{slice_name} removed from the emulated fleet (scaled in)"
            deadline = time.monotonic() + IDLE_WAIT_S
            while nodes:
                refused = raynodes.drain(
                    st.ray_address, nodes, "DRAIN_NODE_REASON_IDLE_TERMINATION", why, timeout_s=5.0
                )
                nodes = sorted(refused)
                if not nodes or time.monotonic() >= deadline:
                    break
                time.sleep(0.1)
            if nodes:
                log.debug("stopping busy hosts %s of %s (%s)", nodes, slice_name, refused)
                raynodes.stop(st.ray_address, nodes)
        except Exception as err:  # Ray's GCS client raises its own errors; nothing here may stop a removal
            log.debug("could not drain %s before removing it: %s", slice_name, err)

    def kill_host(self, slice_name: str, worker_id: int, *, wait: bool = True) -> None:
        """SIGKILL every process of one host at once, like a VM that crashed; with ``wait``,
        return once Ray has declared the node dead."""
        with store.locked(self.state_dir):
            st = self._load()
            rec = self._slice(st, slice_name)
            host = next((h for h in rec.hosts if h.worker_id == worker_id), None)
            if host is None:
                ids = ", ".join(str(h.worker_id) for h in rec.hosts)
                raise NotFoundError(f"{slice_name} has no worker {worker_id}; its workers are {ids}")
            if host.session is None:
                raise ConflictError(f"{slice_name}/{worker_id} is already down; `restore {slice_name}`")
            self._kill(st, [host], f"{slice_name}/{worker_id}")
        if wait:
            self._await_gone(st, {(slice_name, worker_id)})

    def preempt(self, slice_name: str, *, wait: bool = True) -> None:
        """Remove every host of a slice at once, as a spot preemption does."""
        with store.locked(self.state_dir):
            st = self._load()
            rec = self._slice(st, slice_name)
            self._kill(st, rec.hosts, slice_name)
        if wait:
            self._await_gone(st, {(slice_name, h.worker_id) for h in rec.hosts})

    def await_gone(self, slice_name: str) -> None:
        """Return once Ray has declared every host of ``slice_name`` dead."""
        st = self._load()
        rec = self._slice(st, slice_name)
        self._await_gone(st, {(slice_name, h.worker_id) for h in rec.hosts})

    def restore(self, slice_name: str) -> list[int]:
        """Bring back the missing hosts of a slice with the same name and worker ids; returns them."""
        with store.locked(self.state_dir):
            st = self._load()
            rec = self._slice(st, slice_name)
            for h in rec.hosts:  # a host whose processes all died on their own is missing too
                if h.session and not procs.members(h.session):
                    h.session = None
            missing = [h.worker_id for h in rec.hosts if h.session is None]
            self._await_gone(st, {(slice_name, w) for w in missing})
            launchers = self._launch_hosts(st, [(rec, w) for w in missing])
            store.save(self.state_dir, st)
            self._await(st, launchers, [(slice_name, w) for w in missing])
        return missing

    def kill_head(self) -> None:
        """SIGKILL every process of the head (its GCS above all) at once, like a head VM that crashed.

        Ray keeps no copy of the GCS here, so the cluster is gone with it: the hosts' raylets give
        up on it after ``gcs_rpc_server_reconnect_timeout_s`` and exit; ``restart`` brings the fleet
        back in place."""
        with store.locked(self.state_dir):
            st = self._load()
            if st.head is None or not procs.members(st.head):
                raise ConflictError(
                    f"the head of the fleet in {self.state_dir} is already down; `restart` it"
                )
            left = procs.kill_sessions([st.head])
            if left:
                raise ClusterError(f"could not end processes {left} of the head")
            st.head = None
            store.save(self.state_dir, st)
        raynodes.forget()  # this process's connections to the old GCS

    def restart(self) -> None:
        """Bring back a fleet whose head died, in place: end what is left of its hosts, start the head
        again at the same GCS address (clients keep their ``ray_address``) and every host of every
        slice with the same names and worker ids; return once they have all joined.

        It is a new Ray cluster: the old one's placement groups, actors and jobs are gone."""
        with store.locked(self.state_dir):
            st = self._load()
            if st.head is not None and procs.members(st.head):
                raise ConflictError(f"the head of the fleet in {self.state_dir} runs; nothing to restart")
            left = procs.kill_sessions(st.sessions())
            if left:
                raise ClusterError(f"processes {left} of the old fleet would not die")
            for rec in st.slices:
                for h in rec.hosts:
                    h.session = None
            shutil.rmtree(st.temp_dir, ignore_errors=True)
            st.temp_dir = tempfile.mkdtemp(prefix="tpf-", dir=Path(st.temp_dir).parent)  # where up made it
            head = self._launch_head(st)
            store.save(self.state_dir, st)
            raynodes.forget()
            auth.activate(self.auth_token_path)
            self._start_in_waves(st, head)

    def add(self, accelerator_type: str, name: str | None = None, *, wait: bool = True) -> str:
        """Add one slice of ``accelerator_type`` (named ``name``, default the next
        ``tpu-<type>-<i>``); returns its name once every host has joined, or at once without
        ``wait`` (a provider then watches Ray for the hosts)."""
        stype = catalog.slice_type(accelerator_type)
        with store.locked(self.state_dir):
            st = self._load()
            if name is None:
                (name,) = plan.next_slice_names([s.name for s in st.slices], stype.accelerator_type, 1)
            elif st.slice(name) is not None:
                raise ConflictError(f"the fleet already has a slice named {name!r}")
            hosts = sum(len(s.hosts) for s in st.slices) + stype.hosts
            plan.check_fits(hosts, procs.physical_memory(), stype.accelerator_type, adding=True)
            launchers = self._launch_slice(st, stype, name)
            store.save(self.state_dir, st)
            if wait:
                self._await(st, launchers, [(name, w) for w in range(stype.hosts)])
        return name

    def remove(self, slice_name: str, *, wait: bool = True) -> None:
        """End every host of a slice and forget it (a deleted slice, unlike a preempted one, is
        never restored); with ``wait``, return once Ray has declared its nodes dead.

        Ended as Ray's autoscaler (v2) ends a node: Ray is asked to drain each host as idle first,
        and a host it will not drain (busy: tasks or actors run there) is stopped as the
        autoscaler stops a node it ends for another cause, so Ray records every death as meant
        (``AUTOSCALER_DRAIN_IDLE``, or ``EXPECTED_TERMINATION`` for a busy one, whose work ends
        with it) and the doctor and the control plane see the slice gone, not broken."""
        with store.locked(self.state_dir):
            st = self._load()
            rec = self._slice(st, slice_name)
            self._scale_in(st, slice_name)
            self._kill(st, rec.hosts, slice_name)
            st.slices.remove(rec)
            store.save(self.state_dir, st)
        if wait:
            self._await_gone(st, {(slice_name, h.worker_id) for h in rec.hosts})

    def down(self, grace_s: float = 2.0) -> None:
        """Stop everything the fleet started (SIGTERM, then SIGKILL after ``grace_s``), by PID."""
        with store.locked(self.state_dir):
            st = store.load(self.state_dir)
            if st is None:
                self._drop_token()
                return
            left = procs.kill_sessions(st.sessions(), grace_s=grace_s)
            if left:
                raise ClusterError(f"processes {left} of the emulated fleet would not die")
            shutil.rmtree(st.temp_dir, ignore_errors=True)
            store.remove(self.state_dir)
            self._drop_token()
        if self._owns_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> EmulatedFleet:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()
