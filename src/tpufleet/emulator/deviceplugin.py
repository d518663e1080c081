"""The emulated host's TPU device plugin: the GKE plugin's ``/metrics`` format, with measured numbers.

A real GKE TPU host runs the device plugin; the TPU webhook tells every container where it is
(``TPU_DEVICE_PLUGIN_ADDR=<node IP>:2112``) and Ray's reporter agent and tpufleet's sampler read
it. An emulated host gets its own ``TPU_DEVICE_PLUGIN_ADDR`` (:func:`host_env`, a free port on
the fleet's address) and serves the same families there (``duty_cycle``, ``memory_used``,
``memory_total``, each with its ``_node`` twin, chips indexed across the slice as on real hosts)
plus ``tpufleet_emulated_device_plugin 1``, which says the numbers are an emulator's.

Where the numbers come from (measured, never made up): the job's processes on this host, found
from ``/proc`` as the descendants of this host's raylet that are not Ray's own (the raylet's
agents, idle workers, tpufleet's runner actor), i.e. what the runner started and any Ray actor a
``ray``-kind job placed here. Every :data:`TICK_S` their CPU time is added up (per process, so
one that exits keeps what it used); **duty cycle** = CPU seconds used over wall seconds in the
last :data:`WINDOW_S`, capped at 100 % (the share of time the host's work was busy), the same on
every chip of the host (a job owns all of them). **HBM used** = their resident memory, spread
evenly over the chips; **HBM total** = the generation's HBM per chip (catalog). TensorCore and
bandwidth utilization have no honest stand-in on a CPU and are left out, as on TPU types whose
plugin does not report them.

Cheap: no process of its own. :func:`serve_from_env` starts one daemon thread (an HTTP server)
in a process that already lives on the host; the ``/proc`` scan runs every :data:`TICK_S` only
while something scrapes. A second caller on the same host finds the port taken and tries again
every few seconds, so the plugin moves to another process on the host when its first one dies.
Who calls it: the host's runner actor, which does not import the emulator: :func:`host_env` names
:func:`serve_from_env` in each emulated host's environment (``tpudevice.PAGE_HOOK_VAR``), and the
runner calls the function its host names (``host/devicepage.py``).

Where the control plane finds it: every runner publishes its host's ``TPU_DEVICE_PLUGIN_ADDR`` in
Ray's internal KV (``tpudevice.publish``). Real GKE hosts do the same with the address the TPU
webhook gave them, and GCE TPU VMs with their libtpu relay's (``host/devicerelay.py``), so one
path serves all three. The page itself is rendered by ``tpudevice.render_device_plugin``, shared
with the relay.
"""

from __future__ import annotations

import contextlib
import http.server
import logging
import os
import socket
import sys
import threading
import time
import zlib
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tpufleet import catalog
from tpufleet.tpudevice import (
    ADDR_VAR,
    EMULATED_INFO,
    PAGE_HOOK_VAR,
    ChipReading,
    page_handler,
    render_device_plugin,
    spare_argv,
)

__all__ = [
    "HOOK",
    "TICK_S",
    "WINDOW_S",
    "HostWork",
    "exposition",
    "host_env",
    "job_processes",
    "serve",
    "serve_from_env",
]

log = logging.getLogger(__name__)

HOOK = f"{__name__}:serve_from_env"  # what an emulated host's runner calls (tpudevice.PAGE_HOOK_VAR)
TICK_S = 2.0
WINDOW_S = 10.0
_IDLE_AFTER_S = 60.0  # no scrape for this long: stop scanning /proc until the next one
_CLK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")
_SPARE_CMDLINE = " ".join(spare_argv(sys.executable))  # a runner's, started with this Python
_IDLE_WORKERS = ("ray::IDLE", "ray::HostRunner", "ray::read", "ray::_")


def host_env(address: str) -> dict[str, str]:
    """For one new emulated host: ``TPU_DEVICE_PLUGIN_ADDR`` (a port free now on ``address``) and
    the hook its runner calls to serve the plugin there (:data:`HOOK`)."""
    with socket.socket() as s:
        s.bind((address, 0))
        return {ADDR_VAR: f"{address}:{s.getsockname()[1]}", PAGE_HOOK_VAR: HOOK}


@dataclass(frozen=True)
class _Proc:
    pid: int
    ppid: int
    start: int
    cpu_ticks: int
    rss_pages: int
    argv0: str
    cmdline: str


def _read(pid: int) -> _Proc | None:
    stat = _stat(pid)
    return None if stat is None else _with_cmdline(pid, stat)


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (None: gone, or a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    f = stat[stat.rindex(")") + 2 :].split()
    return None if f[0] == "Z" else f


def _with_cmdline(pid: int, f: list[str]) -> _Proc | None:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    argv0 = cmd[0].decode(errors="replace") if cmd else ""
    text = b" ".join(cmd).decode(errors="replace")
    return _Proc(pid, int(f[1]), int(f[19]), int(f[11]) + int(f[12]), int(f[21]), argv0, text)


def _raylet_of(pid: int) -> int | None:
    """The raylet this process descends from (Ray workers are the raylet's children)."""
    seen = 0
    while pid > 1 and seen < 64:
        proc = _read(pid)
        if proc is None:
            return None
        if Path(proc.argv0).name == "raylet":
            return pid
        pid, seen = proc.ppid, seen + 1
    return None


def _is_ray_worker(p: _Proc) -> bool:
    return p.argv0.startswith("ray::") or "default_worker.py" in p.cmdline


def job_processes(raylet: int, table: list[_Proc]) -> list[_Proc]:
    """The host's work below ``raylet``: what Ray workers started (the runner's jobs) and Ray
    workers busy with a job's actor or task; never the raylet's agents, idle workers, runners or a
    runner's spare."""
    children: dict[int, list[_Proc]] = {}
    for p in table:
        children.setdefault(p.ppid, []).append(p)
    out: list[_Proc] = []
    stack = [(c, False) for c in children.get(raylet, [])]
    while stack:
        proc, under_worker = stack.pop()
        worker = _is_ray_worker(proc)
        if worker:  # counted once titled with a job's actor or task (a new worker is not yet)
            if proc.argv0.startswith("ray::") and not proc.argv0.startswith(_IDLE_WORKERS):
                out.append(proc)
        elif under_worker and proc.cmdline != _SPARE_CMDLINE:  # a spare is no job yet
            out.append(proc)
        stack += [(c, under_worker or worker) for c in children.get(proc.pid, [])]
    return out


@dataclass
class HostWork:
    """Running totals of one host's job processes (see the module docstring)."""

    raylet: int
    busy_s: float = 0.0
    rss_bytes: int = 0
    _cpu: dict[tuple[int, int], int] = field(default_factory=dict)  # (pid, start) -> ticks seen
    _history: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=64))

    def tick(self, now: float, table: list[_Proc] | None = None) -> None:
        procs = job_processes(self.raylet, table if table is not None else _table(below=self.raylet))
        first = not self._history
        seen = {}
        for p in procs:
            key = (p.pid, p.start)
            before = self._cpu.get(key, p.cpu_ticks if first else 0)
            self.busy_s += max(0, p.cpu_ticks - before) / _CLK
            seen[key] = p.cpu_ticks
        self._cpu = seen
        self.rss_bytes = sum(p.rss_pages for p in procs) * _PAGE
        self._history.append((now, self.busy_s))

    def duty_cycle_percent(self, window_s: float = WINDOW_S) -> float:
        """CPU seconds over wall seconds in the last ``window_s`` (0 before two ticks), <= 100."""
        if len(self._history) < 2:
            return 0.0
        now, busy = self._history[-1]
        then, busy_then = next(((t, b) for t, b in self._history if now - t <= window_s), self._history[0])
        if now - then <= 0:
            then, busy_then = self._history[-2]
        return max(0.0, min(100.0, 100.0 * (busy - busy_then) / max(now - then, 1e-9)))


def _table(below: int | None = None) -> list[_Proc]:
    """The processes of this machine, or (``below``) only those descending from that PID: every
    process's ``stat`` is read to know its parent, but the command line (the second read, and
    most of the cost) only of those below it. A host ticks every ``TICK_S`` while it is scraped,
    on a machine where most processes are other hosts' and the tests'."""
    stats: dict[int, list[str]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (f := _stat(int(entry.name))) is not None:
            stats[int(entry.name)] = f
    if below is None:
        wanted = set(stats)
    else:
        children: dict[int, list[int]] = {}
        for pid, f in stats.items():
            children.setdefault(int(f[1]), []).append(pid)
        wanted, stack = set(), [below]
        while stack:
            for child in children.get(stack.pop(), []):
                wanted.add(child)
                stack.append(child)
    return [p for pid in sorted(wanted) if (p := _with_cmdline(pid, stats[pid])) is not None]


def exposition(env: dict[str, str], duty: float, rss_bytes: int) -> str:
    """The device plugin's page for the host described by ``env`` (its host contract)."""
    st = catalog.slice_type(env["TPU_ACCELERATOR_TYPE"])
    chips, worker = st.chips_per_host, int(env.get("TPU_WORKER_ID", "0"))
    total = st.generation.hbm_gib_per_chip * (1 << 30)
    used = min(total, rss_bytes // max(1, chips))
    pod = {"container": "tpufleet-job", "namespace": "tpufleet", "pod": f"{env.get('TPU_NAME', '')}-{worker}"}
    uid = zlib.crc32(env.get("TPU_NAME", "").encode())  # one id per slice, as real accelerator ids
    lines = [
        f"# HELP {EMULATED_INFO} 1: tpufleet's emulator; the numbers are measured from the host's processes",
        f"# TYPE {EMULATED_INFO} gauge",
        f'{EMULATED_INFO}{{slice="{env.get("TPU_NAME", "")}",worker="{worker}"}} 1',
    ]
    readings = [
        ChipReading(
            chip, duty_cycle_percent=float(duty), hbm_used_bytes=float(used), hbm_total_bytes=float(total)
        )
        for chip in range(chips)
    ]
    lines += render_device_plugin(
        readings,
        id_prefix=str(uid),
        first_index=worker * chips,
        model=st.generation.gke_accelerator,
        topology=str(st.topology),
        pod=pod,
    )
    return "\n".join(lines) + "\n"


class _Plugin:
    def __init__(self, env: dict[str, str], work: HostWork, tick_s: float) -> None:
        self.env, self.work, self.tick_s = env, work, tick_s
        self.lock = threading.Lock()
        self.last_scrape = 0.0
        self.wake = threading.Event()

    def page(self) -> str:
        with self.lock:
            self.last_scrape = time.monotonic()
            if not self.work._history:
                self.work.tick(time.monotonic())
            self.wake.set()
            return exposition(self.env, self.work.duty_cycle_percent(), self.work.rss_bytes)

    def ticker(self) -> None:
        while True:
            if time.monotonic() - self.last_scrape > _IDLE_AFTER_S:
                self.wake.clear()
                self.wake.wait()
            with self.lock, contextlib.suppress(Exception):
                self.work.tick(time.monotonic())
            time.sleep(self.tick_s)


_started = threading.Lock()
_running: list[threading.Thread] = []


def serve_from_env(environ: Mapping[str, str] | None = None, retry_s: float = 5.0) -> bool:
    """On an emulated host (``TPUFLEET_EMULATED=1`` with a ``TPU_DEVICE_PLUGIN_ADDR``), start the
    plugin's thread in this process (once per process) for the host whose raylet this process
    descends from; returns whether it was started. Binding is retried every ``retry_s`` while
    another process of the host holds the port. The runner calls this through :data:`HOOK`; the
    address is published by the runner (``tpudevice.publish``), as on any host."""
    env = dict(os.environ if environ is None else environ)
    if env.get("TPUFLEET_EMULATED") != "1" or ADDR_VAR not in env or "TPU_ACCELERATOR_TYPE" not in env:
        return False
    with _started:
        if _running:
            return False
        raylet = _raylet_of(os.getpid())
        if raylet is None:
            return False
        _running.append(serve(env, raylet, retry_s=retry_s))
    return True


def serve(
    env: Mapping[str, str], raylet: int, *, retry_s: float = 5.0, tick_s: float = TICK_S
) -> threading.Thread:
    """Serve the plugin page of the host described by ``env`` (its host contract and
    ``TPU_DEVICE_PLUGIN_ADDR``), measuring the work under ``raylet``, from a daemon thread of this
    process, scanning ``/proc`` every ``tick_s`` while scraped; returns the thread. No once-only
    guard: that is :func:`serve_from_env`'s."""
    plugin = _Plugin(dict(env), HostWork(raylet), tick_s)
    thread = threading.Thread(
        target=_bind_and_serve, args=(plugin, retry_s), name="tpu-device-plugin", daemon=True
    )
    thread.start()
    return thread


def _bind_and_serve(plugin: _Plugin, retry_s: float) -> None:
    host, _, port = plugin.env[ADDR_VAR].rpartition(":")
    handler = page_handler(lambda: (200, plugin.page()))
    while True:
        try:
            server = http.server.ThreadingHTTPServer((host, int(port)), handler)
            break
        except OSError:
            time.sleep(retry_s)
    server.daemon_threads = True
    threading.Thread(target=plugin.ticker, name="tpu-device-plugin-tick", daemon=True).start()
    log.info("emulated TPU device plugin on %s", plugin.env[ADDR_VAR])
    server.serve_forever()
