"""The shared emulated fleet as Ray sees it: labels, ray.util.tpu, failure injection, doctor."""

from __future__ import annotations

import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import ray
from _executor_helpers import procs_with
from ray.util import tpu

from tpufleet import doctor, inventory
from tpufleet.emulator import EmulatedFleet, plan, procs
from tpufleet.emulator import state as store
from tpufleet.emulator.state import EmulatedSlice, FleetState, HostRecord
from tpufleet.errors import ClusterError

pytestmark = pytest.mark.integration

V4 = ("2x2x2", "TPU-V4")


def _until(what: str, probe: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _alive_tpu_nodes() -> list[dict[str, Any]]:
    return [n for n in ray.nodes() if n["Alive"] and "ray.io/tpu-slice-name" in n["Labels"]]


def test_hosts_carry_the_labels_and_resources_ray_derives_on_real_tpus(ray_client: object) -> None:
    nodes = _alive_tpu_nodes()
    got = {(n["Labels"]["ray.io/tpu-slice-name"], n["Labels"]["ray.io/tpu-worker-id"]): n for n in nodes}
    assert sorted(got) == [
        ("tpu-v4-16-0", "0"),
        ("tpu-v4-16-0", "1"),
        ("tpu-v4-16-1", "0"),
        ("tpu-v4-16-1", "1"),
        ("tpu-v6e-4-0", "0"),
    ]
    w0 = got[("tpu-v4-16-0", "0")]
    assert {k: v for k, v in w0["Labels"].items() if k != "ray.io/node-id"} == {
        "ray.io/accelerator-type": "TPU-V4",
        "ray.io/tpu-slice-name": "tpu-v4-16-0",
        "ray.io/tpu-worker-id": "0",
        "ray.io/tpu-topology": "2x2x2",
        "ray.io/tpu-pod-type": "v4-16",
    }
    assert w0["Resources"]["TPU"] == 4
    assert w0["Resources"]["TPU-v4-16-head"] == 1
    assert w0["Resources"]["tpu-v4-16-0"] == 1
    assert w0["Resources"]["accelerator_type:TPU-V4"] == 1
    assert "TPU-v4-16-head" not in got[("tpu-v4-16-0", "1")]["Resources"]
    assert got[("tpu-v6e-4-0", "0")]["Labels"]["ray.io/tpu-pod-type"] == "v6e-4"
    head = next(n for n in ray.nodes() if n["Alive"] and "node:__internal_head__" in n["Resources"])
    assert "TPU" not in head["Resources"] and head["Resources"].get("CPU", 0) == 0


def test_the_nodes_ray_settings_reach_their_workers_and_train_polls_every_half_second(
    ray_client: object,
) -> None:
    """Ray Train's controller runs on its driver's node (a Ray job's: the head) and reads its poll
    interval from the environment it inherits there (docs/emulator.md); every node's workers see
    the settings the emulator gives all nodes (plan.NODE_ENV)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0)
    class EnvReader:  # defined here, so it travels by value (test modules are not importable there)
        def get(self, name: str) -> str | None:
            import os

            return os.environ.get(name)

    head = next(n for n in ray.nodes() if n["Alive"] and "node:__internal_head__" in n["Resources"])
    on_head = NodeAffinitySchedulingStrategy(head["NodeID"], soft=False)
    host = next(n for n in ray.nodes() if n["Alive"] and n["Resources"].get("TPU"))
    on_host = NodeAffinitySchedulingStrategy(host["NodeID"], soft=False)
    reader = EnvReader.options(scheduling_strategy=on_head).remote()  # type: ignore[attr-defined]
    other = EnvReader.options(scheduling_strategy=on_host).remote()  # type: ignore[attr-defined]
    try:
        assert ray.get(reader.get.remote("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"), timeout=60) == "0.5"
        # The head's start waited for its dashboard longer than Ray's 60 s (a loaded CI runner).
        assert ray.get(reader.get.remote("RAY_DASHBOARD_STARTUP_TIMEOUT_S"), timeout=60) == "180"
        # Every node without Ray's OOM killer, and with the log monitor's slower file scan (plan.NODE_ENV).
        for node in (reader, other):
            got = {k: ray.get(node.get.remote(k), timeout=60) for k in plan.NODE_ENV}
            assert got == plan.NODE_ENV
    finally:
        ray.kill(reader)
        ray.kill(other)


def test_what_a_task_prints_on_a_host_reaches_the_driver_from_that_host(
    ray_client: object, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each host's log monitor (a fork of its launcher, see emulator/rayhost.py) publishes what
    the workers of that host print: their logs are in the host's own temp dir, which no other
    node's log monitor reads."""

    @ray.remote(num_cpus=0)
    def say(line: str) -> None:
        print(line, flush=True)

    def line(n: dict[str, Any]) -> str:
        # letters only: Ray's driver folds lines that differ only in digits into one
        labels = n["Labels"]
        name = "".join(chr(ord("a") + int(c)) if c.isdigit() else c for c in labels["ray.io/tpu-slice-name"])
        return f"tpufleet-log-probe {name} worker {'abcdefgh'[int(labels['ray.io/tpu-worker-id'])]}"

    strategy = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy
    nodes = _alive_tpu_nodes()
    assert len(nodes) == 5
    pinned = [say.options(scheduling_strategy=strategy(n["NodeID"], soft=False)) for n in nodes]
    ray.get([task.remote(line(n)) for task, n in zip(pinned, nodes, strict=True)])
    seen = ""

    def arrived() -> bool:
        nonlocal seen
        seen += capsys.readouterr().out
        return all(line(n) in seen for n in nodes)

    _until("every host's line at the driver", arrived, timeout_s=30)


def test_inventory_reads_every_slice_intact(ray_client: object) -> None:
    # Ray keeps the dead nodes of slices other tests made and ended on purpose (a spot slice
    # drained and deleted): they are gone, not the fleet's.
    slices = {s.name: s for s in inventory.discover() if not s.gone}
    assert sorted(slices) == ["tpu-v4-16-0", "tpu-v4-16-1", "tpu-v6e-4-0"]
    assert all(s.intact for s in slices.values()), [s.problems for s in slices.values()]
    assert slices["tpu-v4-16-1"].expected_hosts == 2
    assert [h.worker_id for h in slices["tpu-v4-16-1"].hosts] == [0, 1]
    assert (slices["tpu-v6e-4-0"].accelerator_type, slices["tpu-v6e-4-0"].topology) == ("v6e-4", "2x2")


def test_ray_util_tpu_counts_reserves_and_runs_on_slices(ray_client: object) -> None:
    assert tpu.get_num_tpu_slices(*V4) == 2
    assert tpu.get_num_tpu_slices("2x2", "TPU-V6E") == 1
    assert tpu.get_num_ready_tpu_slices(*V4) == 2

    @ray.remote
    def where() -> tuple[str, str, int]:
        import os

        import jax

        return os.environ["TPU_NAME"], os.environ["TPU_WORKER_ID"], jax.local_device_count()

    handle = tpu.slice_placement_group(topology="2x2x2", accelerator_version="v4")
    try:
        results = ray.get(tpu.run_on_slice(where, tpu_slice=handle), timeout=120)
        assert len({name for name, _, _ in results}) == 1  # one whole slice
        assert sorted(w for _, w, _ in results) == ["0", "1"]
        assert {devices for _, _, devices in results} == {4}
        # Not asserted: get_num_ready_tpu_slices == 1 while held. Ray 2.60 reads a node whose TPUs are
        # all reserved as idle (the absent "TPU" key defaults to the total), on real TPUs as here.
    finally:
        handle.shutdown()


def test_kill_host_breaks_the_slice_for_ray_and_doctor_until_restore(
    fleet: EmulatedFleet, ray_client: object
) -> None:
    assert doctor.check().healthy
    fleet.kill_host("tpu-v4-16-1", 1)  # returns once Ray has declared the node dead
    assert tpu.get_num_tpu_slices(*V4) == 1
    status = {s["name"]: s for s in fleet.status()["slices"]}
    assert [h["alive"] for h in status["tpu-v4-16-1"]["hosts"]] == [True, False]

    report = doctor.check()
    assert not report.healthy
    assert {f.slice for f in report.findings} == {"tpu-v4-16-1"}
    assert any("worker 1" in f.message and "dead" in f.message for f in report.findings)
    assert report.by_type()["v4-16"] == {"slices": 2, "intact": 1}

    assert fleet.restore("tpu-v4-16-1") == [1]
    assert tpu.get_num_tpu_slices(*V4) == 2
    assert doctor.check().healthy


def test_preempt_removes_every_host_of_the_slice(fleet: EmulatedFleet, ray_client: object) -> None:
    fleet.preempt("tpu-v6e-4-0")
    assert tpu.get_num_tpu_slices("2x2", "TPU-V6E") == 0
    assert fleet.down_hosts() == {"tpu-v6e-4-0": [0]}
    # _heal_fleet restores it after the test


def test_context_manager_ends_the_survivors_of_a_stale_fleet_and_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``up`` over a state whose head died ends the hosts that outlived it; ``with`` stops by PID,
    and nothing its processes wrote is left in the caller's temp dir (``TMPDIR``)."""
    state_dir = tmp_path / "stale"
    system_tmp = tmp_path / "system-tmp"  # what /tmp is to a fleet started from a shell
    system_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(system_tmp))
    sleeper, session = procs.spawn(
        [sys.executable, "-c", "import time; time.sleep(120)"], {}, tmp_path / "log"
    )
    stale = FleetState("old", "127.0.0.1", 1, 2, str(tmp_path / "gone"), 0, 1 << 27, False, head=None)
    stale.slices.append(EmulatedSlice("tpu-v5litepod-1-0", "v5litepod-1", [HostRecord(0, session)]))
    store.save(state_dir, stale)
    try:
        with EmulatedFleet("", state_dir=state_dir) as f:  # a head alone: the cheapest fleet
            assert sleeper.wait(timeout=20) == -signal.SIGKILL
            pids = f.pids()
            assert pids and f.slice_names == []
    finally:
        sleeper.kill()  # only matters when up() left it running
    assert [p for p in pids if (info := procs._stat(p)) is not None and info.state != "Z"] == []
    assert store.load(state_dir) is None
    assert sorted(p.name for p in system_tmp.iterdir()) == []  # the dashboard's pymp-* was left here


def test_a_fleet_that_does_not_come_up_leaves_nothing_behind(tmp_path: Path) -> None:
    """A start that fails (its one host given no time to join) ends every process it started and
    removes its state, its token and its Ray temp dir, as ``down`` does: a failed start left a
    ``/tmp/tpf-*`` directory behind each time."""
    root = Path(tempfile.mkdtemp(prefix="t", dir="/tmp"))  # short: Ray's socket paths go under it
    state_dir = tmp_path / "fleet"
    try:
        fleet = EmulatedFleet("v5litepod-1", state_dir=state_dir, timeout_s=0.01, temp_root=str(root))
        with pytest.raises(ClusterError):
            fleet.up()
        assert list(root.iterdir()) == []
        assert procs_with(str(root)) == []  # no process of its head or host is left
        assert store.load(state_dir) is None and not fleet.auth_token_path.exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)
