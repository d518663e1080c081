"""What an emulated host costs: its own processes, measured with psutil (PSS), stay under a bound.

A regression guard, not the goal (bench/emulator_start.py measures a fresh fleet, workers
included). An emulated host used to run ~250 MiB PSS before any task (a full dashboard agent,
prestarted workers), then ~80 MiB of its own (raylet, runtime-env agent, log monitor, the agent's
stand-in); a lean one now runs ~15 MiB of its own (its raylet and two stand-ins: the head's
runtime env agent and log monitor serve every host) plus the workers its tasks left. Those are
bounded apart from the host: on the session's shared fleet they are what earlier tests ran (a
worker that ran a JAX program holds ~150 MiB, and with it a host's total once went past a bound on
the total, 309 MiB against 300, with its own processes at 113 MiB).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict

import psutil
import pytest
import ray
from _executor_helpers import wait_for

from tpufleet.emulator import EmulatedFleet, procs
from tpufleet.emulator import state as store
from tpufleet.emulator.procs import Session

pytestmark = pytest.mark.integration

HOST_OWN_PSS_BOUND = 64 << 20  # the host's own processes: everything but Ray's workers


def _commands(session: Session) -> list[tuple[int, str]]:
    """Each live process of a fleet session, with its command line (as Ray retitles it)."""
    found = []
    for pid in procs.members(session):
        with contextlib.suppress(psutil.Error):
            found.append((pid, " ".join(psutil.Process(pid).cmdline())))
    return found


def test_every_emulated_host_stays_under_the_memory_bound_and_runs_no_agent_or_log_monitor(
    fleet: EmulatedFleet, ray_client: object
) -> None:
    @ray.remote(num_cpus=0)
    def where() -> str:
        import os

        return f"{os.environ['TPU_NAME']}/{os.environ['TPU_WORKER_ID']}"

    hosts = [
        (n["NodeID"], n["Labels"])
        for n in ray.nodes()
        if n["Alive"] and "ray.io/tpu-slice-name" in n["Labels"]
    ]
    strategy = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy
    ran = ray.get(
        [where.options(scheduling_strategy=strategy(node, soft=False)).remote() for node, _ in hosts]
    )
    assert sorted(ran) == sorted(
        f"{lb['ray.io/tpu-slice-name']}/{lb['ray.io/tpu-worker-id']}" for _, lb in hosts
    )

    st = store.load(fleet.state_dir)
    assert st is not None
    measured = {}
    each: dict[str, list[str]] = {}  # every process, for the message when a bound is broken
    for rec in st.slices:
        for h in rec.hosts:
            assert h.session is not None
            by_component: dict[str, int] = defaultdict(int)
            mems = procs.memory(procs.members(h.session))
            for mem in mems:
                by_component[mem.component] += mem.pss
            measured[f"{rec.name}/{h.worker_id}"] = dict(by_component)
            each[f"{rec.name}/{h.worker_id}"] = [f"{m.pid} {m.component} {m.pss >> 20} MiB" for m in mems]
    assert len(measured) == len(hosts) == 5
    # the lean head's dashboard runs a process for each module it loads (plan.DASHBOARD_MODULES), no other
    assert st.head is not None and st.lean
    titles = [command for _, command in _commands(st.head)]
    modules = sorted(t.split()[0] for t in titles if t.startswith("ray-dashboard-"))
    assert modules == ["ray-dashboard-JobHead-0", "ray-dashboard-NodeHead-0", "ray-dashboard-StateHead-0"], (
        titles
    )
    # the head runs the one runtime env agent and the one log monitor of the fleet
    head_parts = {procs.component(command) for _, command in _commands(st.head)}
    assert {"runtime env agent", "log monitor", "dashboard agent"} <= head_parts, head_parts
    for host, parts in measured.items():
        assert parts.get("raylet", 0) > 0 and parts.get("worker", 0) > 0, (host, parts)  # the task ran there
        for agent in ("dashboard agent", "runtime env agent"):
            assert agent not in parts and parts.get(f"{agent} stand-in", 0) > 0, (host, agent, parts)
        assert "log monitor" not in parts, (host, parts)
        assert sum(v for k, v in parts.items() if k != "worker") < HOST_OWN_PSS_BOUND, (
            host,
            {k: f"{v / 2**20:.0f} MiB" for k, v in parts.items()},
            each[host],
        )

    # the workers the tasks left idle end once idle for 30 s (plan.LEAN_HOST_ENV), instead of each
    # costing its host ~0.55 CPU-s a minute for good
    def idle_workers() -> list[str]:
        found = []
        for rec in st.slices:
            for h in rec.hosts:
                assert h.session is not None
                idle = [pid for pid, command in _commands(h.session) if command.startswith("ray::IDLE")]
                found += [f"{rec.name}/{h.worker_id}: {pid}" for pid in idle]
        return found

    assert idle_workers(), "the tasks above left no idle worker to wait for"
    wait_for("the idle workers to end", lambda: not idle_workers(), 120, every_s=2)
