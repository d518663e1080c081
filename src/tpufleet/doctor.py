"""``tpufleet doctor``: TPU health of any live Ray cluster, emulated or real.

Two sources, checked separately so each finding says where it came from:

1. the node table (:mod:`tpufleet.inventory`): slices per type, hosts missing or dead, duplicate or
   out-of-range worker ids, a missing worker 0, chips that do not add up to the topology;
2. one probe task per alive TPU host, pinned to its node (``num_cpus=0`` and no ``TPU``, so a busy
   host still answers): the JAX devices it sees and its host contract (``TPU_WORKER_HOSTNAMES``
   must list as many hosts as the slice has; ``TPU_WORKER_ID`` must match the node's label; JAX
   must see at least one device per chip of the host).

``check`` returns a :class:`Report`; it is healthy when there are no findings (exit 0, else 1).
A slice that ended on purpose (every host drained for a preemption or as idle, or stopped:
``SliceInfo.gone``) is not checked: the report lists it as gone, with why.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tpufleet.errors import ClusterError
from tpufleet.fleet import SliceInfo
from tpufleet.inventory import discover, resolve_address

__all__ = ["HealthFinding", "Probe", "Report", "check", "findings_for"]


@dataclass(frozen=True)
class Probe:
    """What one host reported about itself."""

    slice: str
    worker_id: int
    node_id: str
    platform: str = ""
    devices: int = 0
    env: dict[str, str] = field(default_factory=dict)
    error: str = ""


@dataclass(frozen=True)
class HealthFinding:
    slice: str
    message: str


@dataclass(frozen=True)
class Report:
    ray_address: str | None
    slices: tuple[SliceInfo, ...]
    probes: tuple[Probe, ...]
    findings: tuple[HealthFinding, ...]
    gone: tuple[tuple[str, str], ...] = ()  # (slice, why): ended on purpose, not checked

    @property
    def healthy(self) -> bool:
        return not self.findings

    def by_type(self) -> dict[str, dict[str, int]]:
        """``{accelerator_type: {"slices": n, "intact": k}}``."""
        total = Counter(s.accelerator_type for s in self.slices)
        intact = Counter(s.accelerator_type for s in self.slices if s.intact)
        return {t: {"slices": total[t], "intact": intact[t]} for t in sorted(total)}

    def to_dict(self) -> dict[str, Any]:
        return {
            "ray_address": self.ray_address,
            "healthy": self.healthy,
            "types": self.by_type(),
            "slices": [
                {
                    "name": s.name,
                    "accelerator_type": s.accelerator_type,
                    "topology": s.topology,
                    "intact": s.intact,
                    "problems": list(s.problems),
                    "hosts": [asdict(h) for h in s.hosts],
                }
                for s in self.slices
            ],
            "probes": [asdict(p) for p in self.probes],
            "findings": [asdict(f) for f in self.findings],
            "gone": [{"slice": name, "why": why} for name, why in self.gone],
        }


def _probe_findings(info: SliceInfo, probe: Probe) -> list[str]:
    where = f"worker {probe.worker_id}"
    if probe.error:
        return [f"{where}: probe failed: {probe.error}"]
    out = []
    hostnames = [h for h in probe.env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]
    if hostnames and len(hostnames) != info.expected_hosts:
        out.append(
            f"{where}: TPU_WORKER_HOSTNAMES lists {len(hostnames)} hosts, "
            f"the slice ({info.accelerator_type}) has {info.expected_hosts}"
        )
    env_worker = probe.env.get("TPU_WORKER_ID")
    if env_worker is not None and env_worker != str(probe.worker_id):
        out.append(f"{where}: TPU_WORKER_ID is {env_worker} but Ray labels the node worker {probe.worker_id}")
    chips = info.chips_per_host
    if probe.devices == 0:
        out.append(f"{where}: JAX sees no devices")
    elif probe.devices < chips:  # more is fine: a tpu7x chip is two JAX devices
        out.append(f"{where}: JAX sees {probe.devices} devices, the host has {chips} chips")
    return out


def findings_for(slices: Sequence[SliceInfo], probes: Sequence[Probe]) -> list[HealthFinding]:
    """Every reason a slice is not healthy: node-table problems first, then probe results."""
    out = [HealthFinding(s.name, p) for s in slices for p in s.problems]
    info = {s.name: s for s in slices}
    for probe in probes:
        if probe.slice in info:
            out += [HealthFinding(probe.slice, m) for m in _probe_findings(info[probe.slice], probe)]
    return out


def _probe_fn() -> Any:
    """The probe task, self-contained (no tpufleet import) so it runs on hosts without tpufleet."""

    def probe() -> dict[str, Any]:
        import os

        env = {k: v for k, v in os.environ.items() if k.startswith(("TPU_", "MEGASCALE_"))}
        try:
            import jax

            devices = jax.local_devices()
            return {"platform": devices[0].platform if devices else "", "devices": len(devices), "env": env}
        except Exception as err:  # the probe reports, the doctor judges
            return {"env": env, "error": f"{type(err).__name__}: {err}"}

    return probe


def _run_probes(slices: Sequence[SliceInfo], timeout_s: float) -> list[Probe]:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task: Any = ray.remote(num_cpus=0, max_retries=0)(_probe_fn())
    pending = {}
    for s in slices:
        for h in s.hosts:
            if h.alive and h.node_id:
                strategy = NodeAffinitySchedulingStrategy(node_id=h.node_id, soft=False)
                pending[(s.name, h.worker_id, h.node_id)] = task.options(
                    scheduling_strategy=strategy
                ).remote()
    ready, _ = ray.wait(list(pending.values()), num_returns=len(pending), timeout=timeout_s)
    done = set(ready)
    probes = []
    for (name, worker, node), ref in pending.items():
        if ref not in done:
            probes.append(Probe(name, worker, node, error=f"no answer within {timeout_s:.0f}s"))
            ray.cancel(ref, force=True)
            continue
        try:
            probes.append(Probe(name, worker, node, **ray.get(ref)))
        except Exception as err:
            probes.append(Probe(name, worker, node, error=f"{type(err).__name__}: {err}"))
    return probes


def check(ray_address: str | None = None, *, probe: bool = True, timeout_s: float = 60.0) -> Report:
    """Check the cluster at ``ray_address`` (see :func:`tpufleet.inventory.resolve_address`)."""
    address = resolve_address(ray_address)
    found = discover(address)
    gone = {s.name: s.gone for s in found if s.gone}
    slices = [s for s in found if not s.gone]
    probes: list[Probe] = []
    if probe and any(h.alive for s in slices for h in s.hosts):
        import ray

        started = not ray.is_initialized()
        connected = None if started else ray.get_runtime_context().gcs_address
        if connected and address and connected != address:
            raise ClusterError(f"this process is connected to {connected}, not {address}; cannot probe")
        if started:
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
        try:
            probes = _run_probes(slices, timeout_s)
        finally:
            if started:
                ray.shutdown()
    return Report(
        address, tuple(slices), tuple(probes), tuple(findings_for(slices, probes)), tuple(gone.items())
    )
