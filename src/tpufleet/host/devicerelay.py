"""A GCE TPU VM's device numbers for the control plane: libtpu's metric service, relayed over HTTP.

On GKE every TPU host has the TPU device plugin (``$TPU_DEVICE_PLUGIN_ADDR``), which the control
plane's sampler reads over the network. A GCE TPU VM has no device plugin; its numbers come from
libtpu's runtime metric service on ``localhost:8431`` (what ``tpu-info`` reads), which answers local
callers only. The relay bridges the two: on a TPU host with no ``TPU_DEVICE_PLUGIN_ADDR`` (neither
GKE nor the emulator), the host's runner actor starts it (:func:`serve_from_env`), and it serves
``http://<Ray node IP>:<port>/metrics``. Every scrape reads libtpu (``tpudevice.read_libtpu``, each
call with a :data:`READ_TIMEOUT_S` timeout) and answers the GKE device plugin's families
(``duty_cycle``, ``memory_used``, ``memory_total``, ``memory_bandwidth_utilization`` where libtpu
gave it, each with its ``_node`` twin; labels ``accelerator_id``, ``make``, ``model``,
``tpu_topology``), rendered by the same code as the emulated plugin's page
(``tpudevice.render_device_plugin``) and never marked emulated. A failed read answers ``503`` with
one line saying why, so the control plane counts the source as down and tries again later; a host
where libtpu is not (yet) running is read again at the next scrape, never fatal to the runner.
libtpu's service lives in the program that uses the TPU (tpu-info too needs a running JAX or
PyTorch/XLA workload), so between jobs the page is a 503 and the control plane counts the chips
idle, which they are.

The address is published where the control plane already looks for device plugins: Ray's internal
KV under ``tpufleet:device-plugin:<node id>`` (``tpudevice.publish``), so nothing on the
control plane's side tells a relay from a plugin.

The port: ``$TPUFLEET_DEVICE_RELAY_PORT`` when set (a number; ``0`` for any free port; ``off`` for
no relay), else :data:`RELAY_PORT` (8432, next to libtpu's 8431), or any free port when another
program holds 8432. The control plane must be able to reach that port on the hosts (a firewall
rule from the control plane's machine to the TPU VMs). Several runners of one host (a warm one and
a job's own) share one relay: the first to bind the port serves it and writes it down in the Ray
node's session directory (``tpufleet/device-relay.port``, under a file lock); the others publish the
same address and try to bind it every few seconds, so the relay moves to another runner of the
host when its runner ends.

Cheap: no process of its own, one daemon thread (plus the HTTP server's short-lived request
threads), no work between scrapes; ``grpc`` is imported only when libtpu is read.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.server
import logging
import os
import socket
import threading
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpufleet import catalog, contract
from tpufleet.tpudevice import (
    ADDR_VAR,
    LIBTPU_ADDR,
    ChipReading,
    DeviceReadError,
    page_handler,
    publish,
    read_libtpu,
    render_device_plugin,
)

__all__ = [
    "PORT_VAR",
    "READ_TIMEOUT_S",
    "RELAY_PORT",
    "HostFacts",
    "Node",
    "Relay",
    "serve_from_env",
    "start",
]

log = logging.getLogger(__name__)

RELAY_PORT = 8432
PORT_VAR = "TPUFLEET_DEVICE_RELAY_PORT"
READ_TIMEOUT_S = 1.0  # per libtpu call: well inside the control plane's 2 s read of the page
_PORT_FILE = "device-relay.port"
_LOCK_FILE = "device-relay.lock"

# Ray's TPU node labels (inventory.py reads the same ones).
_SLICE_LABEL, _WORKER_LABEL = contract.SLICE_LABEL, contract.WORKER_LABEL
_TOPOLOGY_LABEL = "ray.io/tpu-topology"
_POD_TYPE_LABEL = "ray.io/tpu-pod-type"

Reader = Callable[[str, float], list[ChipReading]]


@dataclass(frozen=True)
class HostFacts:
    """What the page says about the host besides libtpu's numbers (labels and chip ids)."""

    slice_name: str = ""
    worker_id: int = 0
    accelerator_type: str = ""
    topology: str = ""

    @classmethod
    def from_host(cls, env: Mapping[str, str], labels: Mapping[str, str]) -> HostFacts | None:
        """From the host contract's variables, else Ray's TPU node labels; None for no TPU host."""
        slice_name = env.get("TPU_NAME") or labels.get(_SLICE_LABEL, "")
        acc = env.get("TPU_ACCELERATOR_TYPE") or labels.get(_POD_TYPE_LABEL, "")
        if not (slice_name or acc):
            return None
        worker = env.get("TPU_WORKER_ID") or labels.get(_WORKER_LABEL, "0")
        topology = env.get("TPU_TOPOLOGY") or labels.get(_TOPOLOGY_LABEL, "")
        return cls(slice_name, int(worker) if worker.isdigit() else 0, acc, topology)

    def model_and_topology(self) -> tuple[str, str]:
        """The device plugin's ``model`` (GKE's accelerator name) and ``tpu_topology``."""
        try:
            st = catalog.slice_type(self.accelerator_type)
        except Exception:  # an unknown type: say nothing rather than something made up
            return "", self.topology
        return st.generation.gke_accelerator, self.topology or str(st.topology)


@dataclass
class Relay:
    """One host's relay; see the module docstring. ``port`` is fixed once :func:`start` returns."""

    host: str
    facts: HostFacts
    libtpu: str = LIBTPU_ADDR
    timeout_s: float = READ_TIMEOUT_S
    reader: Reader = read_libtpu
    port: int = 0
    serving: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _closed: threading.Event = field(default_factory=threading.Event)

    @property
    def address(self) -> str:
        """``host:port`` as ``TPU_DEVICE_PLUGIN_ADDR`` spells it (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def page(self) -> tuple[int, str]:
        """(HTTP status, body) of one scrape: libtpu read now, rendered; 503 and why on failure."""
        try:
            chips = self.reader(self.libtpu, self.timeout_s)
        except DeviceReadError as err:
            return 503, f"{err}\n"
        except Exception as err:  # e.g. grpc or tpu-info missing on the host: say so, stay up
            return 503, f"libtpu at {self.libtpu}: {type(err).__name__}: {err}\n"
        if not chips:
            return 503, f"libtpu at {self.libtpu} reports no chips\n"
        model, topology = self.facts.model_and_topology()
        lines = render_device_plugin(
            chips,
            id_prefix=str(zlib.crc32(self.facts.slice_name.encode())),  # one id per slice
            first_index=self.facts.worker_id * len(chips),
            model=model,
            topology=topology,
        )
        return 200, "\n".join(lines) + "\n"

    def close(self, wait_s: float = 5.0) -> None:
        """Stop serving (or standing by) and close the port; waits up to ``wait_s`` for the thread."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(wait_s)

    def _run(self, server: http.server.ThreadingHTTPServer | None, retry_s: float) -> None:
        while server is None and not self._closed.wait(retry_s):  # standby: another runner serves
            server = _bind(self.host, self.port, self)
        if server is None:
            return
        self.serving.set()
        log.info("TPU device relay (libtpu at %s) on %s", self.libtpu, self.address)
        server.timeout = 0.5  # how soon close() is noticed, as serve_forever's poll
        try:
            while not self._closed.is_set():
                server.handle_request()
        finally:
            server.server_close()
            self.serving.clear()


class _Server6(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6


def _bind(host: str, port: int, relay: Relay) -> http.server.ThreadingHTTPServer | None:
    kind = _Server6 if ":" in host else http.server.ThreadingHTTPServer  # a node IP may be IPv6
    try:
        server = kind((host, port), page_handler(relay.page))
    except OSError:
        return None
    server.daemon_threads = True
    return server


@contextlib.contextmanager
def _host_lock(state_dir: Path | None) -> Iterator[None]:
    if state_dir is None:
        yield
        return
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / _LOCK_FILE, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _remembered(state_dir: Path | None) -> int | None:
    if state_dir is None:
        return None
    try:
        text = (state_dir / _PORT_FILE).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and 0 < int(text) < 65536 else None


def start(
    host: str,
    facts: HostFacts,
    *,
    port: int | None = None,
    default_port: int = RELAY_PORT,
    state_dir: Path | None = None,
    libtpu: str = LIBTPU_ADDR,
    timeout_s: float = READ_TIMEOUT_S,
    retry_s: float = 5.0,
    reader: Reader = read_libtpu,
) -> Relay:
    """Start a relay on ``host`` and return it once its port is settled (serving, or standing by
    while another runner of the host serves that port; see the module docstring).

    ``port``: a fixed port (the operator's), 0 for any free one, None for ``default_port`` or, when
    another program holds that, any free one. ``state_dir`` (shared by the host's runners) keeps
    the port the host's relay uses, so later runners stand by on it rather than pick another.
    """
    relay = Relay(host, facts, libtpu=libtpu, timeout_s=timeout_s, reader=reader)
    with _host_lock(state_dir):
        remembered = _remembered(state_dir)
        if port:
            want = port
        elif remembered is not None:
            want = remembered
        else:
            want = default_port if port is None else 0
        server = _bind(host, want, relay)
        if server is None and not port and remembered is None and want != 0:
            server = _bind(host, 0, relay)  # another program holds the default port
        if server is not None:
            want = server.server_address[1]
            if state_dir is not None:
                (state_dir / _PORT_FILE).write_text(f"{want}\n")
    relay.port = want
    if server is None:
        log.info("TPU device relay port %s is held (another runner of the host?); standing by", want)
    relay._thread = threading.Thread(
        target=relay._run, args=(server, retry_s), name="tpu-device-relay", daemon=True
    )
    relay._thread.start()
    return relay


@dataclass(frozen=True)
class Node:
    """This process's Ray node: where the relay listens, under which key it publishes, its labels."""

    ip: str
    node_id: str
    labels: Mapping[str, str] = field(default_factory=dict)
    state_dir: Path | None = None


def _ray_node() -> Node | None:
    import ray

    if not ray.is_initialized():
        return None
    ctx = ray.get_runtime_context()
    node_id = ctx.get_node_id()
    labels: Mapping[str, str] = {}
    with contextlib.suppress(Exception):
        raw: Mapping[str, object] = ctx.get_node_labels()  # str values (typed as lists in places)
        labels = {k: v[0] if isinstance(v, list) and v else str(v) for k, v in raw.items()}
    state_dir = None
    with contextlib.suppress(Exception):
        ray_node: Any = ray._private.worker.global_worker.node
        session = ray_node.get_session_dir_path()
        state_dir = Path(session) / "tpufleet"
    ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    return Node(ip, node_id, labels, state_dir)


_started = threading.Lock()
_running: list[Relay] = []


def serve_from_env(
    environ: Mapping[str, str] | None = None,
    *,
    node: Node | None = None,
    put: Callable[[str, str], object] | None = None,
    libtpu: str = LIBTPU_ADDR,
    running: list[Relay] | None = None,
) -> Relay | None:
    """On a GCE TPU host (a TPU host with no ``TPU_DEVICE_PLUGIN_ADDR``, not emulated), start the
    relay in this process (once) and publish its address; returns it, else None. ``node`` defaults
    to this process's Ray node (None without Ray) and ``put`` to Ray's KV; ``running`` (the relays
    this process serves, which make it once per process) is there for tests. Never raises: the
    runner that calls it must come up whatever the host has."""
    try:
        env = dict(os.environ if environ is None else environ)
        if ADDR_VAR in env or env.get("TPUFLEET_EMULATED") == "1":
            return None  # GKE's plugin or the emulator's serves this host
        setting = env.get(PORT_VAR, "").strip()
        if setting.lower() == "off":
            return None
        if setting and not (setting.isdigit() and int(setting) < 65536):
            log.warning("%s=%r is not a port (0-65535, or off); no TPU device relay", PORT_VAR, setting)
            return None
        relays = _running if running is None else running
        with _started:
            if relays:
                return relays[0]
            node = node or _ray_node()
            if node is None:
                return None
            facts = HostFacts.from_host(env, node.labels)
            if facts is None:
                return None  # not a TPU host
            relay = start(
                node.ip,
                facts,
                port=int(setting) if setting else None,
                state_dir=node.state_dir,
                libtpu=libtpu,
            )
            relays.append(relay)
        publish(relay.address, node.node_id, put)
        return relay
    except Exception as err:
        log.warning("no TPU device relay on this host: %s", err)
        return None
