"""RayExecutor on the shared emulated fleet: lost hosts, a restarted control plane, cold slices."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from _executor_helpers import (
    JOB_ROOT,
    TENANT,
    finished,
    full_log,
    pid_alive,
    procs_with,
    spec,
    token,
    v4_slices,
    wait_for,
)
from ray.util.placement_group import placement_group

from tpufleet.control.cluster.protocol import AttemptSpec, HostState
from tpufleet.control.ray.client import RayExecutor
from tpufleet.control.ray.jobs import fence_name
from tpufleet.control.ray.warmpool import SLICE_LABEL, WORKER_LABEL
from tpufleet.host.runner import NAMESPACE, pool_runner_name

pytestmark = pytest.mark.integration


SLEEP = "import time; print('PID', flush=True); time.sleep(300)"  # a jailed job has its own pids


@pytest.fixture(scope="module")
def cluster(ray_client: object) -> Iterator[RayExecutor]:
    c = RayExecutor()
    c.wait_warm([s.name for s in v4_slices(c, 2)])
    yield c
    c.release_all()


@pytest.fixture(autouse=True)
def _stop_leftovers(cluster: RayExecutor) -> Iterator[None]:
    """A test that fails half-way must not leave its attempt holding a slice for the next one."""
    yield
    for job_id, attempt in cluster.running_attempts():
        cluster.stop(job_id, attempt, grace_s=1)


def _running(cluster: RayExecutor, s: AttemptSpec, slice_name: str, worker: int) -> None:
    def probe() -> str:
        return cluster.read_logs(s.job_id, s.attempt, slice_name, worker, 0).data

    wait_for("the process", lambda: "PID" in probe())


def _our_actor_names() -> set[str]:
    return {r["name"] for r in ray.util.list_named_actors(all_namespaces=True) if r["namespace"] == NAMESPACE}


# Deadlines of the launching process (the test's own timeout is 300 s): a poll that never reads every
# host RUNNING gives up after LAUNCH_POLL_S and prints what it saw; a hang anywhere else (ray.init,
# launch, the diagnosis itself) dumps every thread's stack and exits at LAUNCH_HANG_S.
LAUNCH_POLL_S = 60.0
LAUNCH_HANG_S = 120.0


def _launch_from_a_control_plane_that_then_exits(slice_name: str, job: str, attempt: int, tok: str) -> None:
    """Another process's executor launches ``SLEEP`` (tagged ``tok``) on every host of the slice,
    waits until all run, and exits: what a control plane that was killed leaves behind. Past its
    deadline it prints why (each host's state, start answer, runner, log and Ray node) and the test
    fails with that."""
    script = textwrap.dedent(
        f"""
        import faulthandler, sys, time
        faulthandler.dump_traceback_later({LAUNCH_HANG_S}, exit=True)
        import ray
        from tpufleet.control.cluster.protocol import AttemptSpec
        from tpufleet.control.ray.client import RayExecutor
        from tpufleet.inventory import SLICE_NAME, WORKER_ID
        t0 = time.monotonic()
        c = RayExecutor.connect({ray.get_runtime_context().gcs_address!r})
        c.inventory()
        cmd = ({sys.executable!r}, "-c", {SLEEP!r}, {tok!r})
        where = dict(tenant={TENANT!r}, job_root={JOB_ROOT!r})
        c.launch(AttemptSpec({job!r}, {attempt}, ({slice_name!r},), "v4-16", cmd, **where))
        launched = time.monotonic()
        polls = 0
        while not (st := c.poll({job!r}, {attempt})).all_running:
            polls += 1
            if time.monotonic() - launched > {LAUNCH_POLL_S}:
                break
            time.sleep(0.05)
        else:
            sys.exit(0)
        print(f"not every host RUNNING {LAUNCH_POLL_S:.0f} s after launch ({{polls}} polls; "
              f"connect and launch took {{launched - t0:.1f}} s)")
        print("last poll:", [(h.slice, h.worker_id, h.state.name, h.exit_code, h.detail) for h in st.hosts])

        def answer(ref):
            try:
                return ray.get(ref, timeout=5)
            except Exception as err:
                return f"{{type(err).__name__}}: {{' '.join(str(err).split())[:600]}}"

        for h in c._attempts[({job!r}, {attempt})].hosts:
            print(f"host {{h.slice}}/{{h.worker_id}} node {{h.node_id}}")
            print("  start ->", answer(h.started) if h.started is not None else None)
            print("  ping ->", answer(h.runner.ping.remote()))
            print("  assignments ->", answer(h.runner.assignments.remote()))
            print("  report ->", answer(h.runner.report.remote({job!r}, {attempt})))
            try:
                print("  log:", repr(c.read_logs({job!r}, {attempt}, h.slice, h.worker_id, 0).data[-1500:]))
            except Exception as err:
                print("  log: unreadable:", err)
        for n in ray.nodes():
            labels = n.get("Labels") or {{}}
            if labels.get(SLICE_NAME) == {slice_name!r}:
                print(f"ray node {{n['NodeID']}} worker {{labels.get(WORKER_ID)}} Alive={{n['Alive']}} "
                      f"{{n.get('DeathReasonMessage') or ''}}")
        print("inventory:", [s for s in c.inventory() if s.name == {slice_name!r}])
        sys.stdout.flush()
        sys.exit(1)
        """
    )
    try:  # a loaded 2-core machine
        out = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=LAUNCH_HANG_S + 30
        )
        code, said = out.returncode, out.stdout + out.stderr
    except subprocess.TimeoutExpired as exc:
        code, said = None, _text(exc.stdout) + _text(exc.stderr)
    assert code == 0, (
        f"the launching control plane exited {code}; job processes alive: {procs_with(tok)}\n{said}"
    )


def _text(out: bytes | str | None) -> str:
    return out.decode(errors="replace") if isinstance(out, bytes) else out or ""


def test_runners_are_found_again_by_a_restarted_control_plane(cluster: RayExecutor) -> None:
    victim = v4_slices(cluster, 1)[0]
    job = f"restart-{os.getpid()}"
    tok = token()
    _launch_from_a_control_plane_that_then_exits(victim.name, job, 3, tok)
    fresh = RayExecutor()
    assert (job, 3) in fresh.running_attempts()  # a pure read...
    assert (job, 3) in fresh.adopt()  # ...and the explicit take-over that lets poll reach it
    status = fresh.poll(job, 3)
    assert [(h.slice, h.worker_id, h.state) for h in status.hosts] == [
        (victim.name, w, HostState.RUNNING) for w in range(victim.expected_hosts)
    ]
    s = AttemptSpec(job, 3, (victim.name,), "v4-16", ())
    for w in range(victim.expected_hosts):
        _running(fresh, s, victim.name, w)
    pids = procs_with(tok)
    assert len(pids) == victim.expected_hosts and all(pid_alive(p) for p in pids)
    fresh.stop(job, 3, grace_s=1)
    assert not any(pid_alive(p) for p in pids)
    assert (job, 3) not in RayExecutor().running_attempts()
    # The slice goes back to the warm pool with its runners alive (not released as if broken), so
    # the service's final log read after stop still reaches every host.
    pool = {pool_runner_name(victim.name, w) for w in range(victim.expected_hosts)}
    assert pool <= _our_actor_names()
    assert all("PID" in full_log(fresh, s, victim.name, w) for w in range(victim.expected_hosts))


def test_a_restarted_control_plane_removes_the_ray_job_fence_a_killed_one_left(cluster: RayExecutor) -> None:
    """A Ray job's fence is a detached group (control/ray/jobs.py), so it outlives a killed control
    plane; left there it holds its slice's head resource for good (found by tpufleet chaos). The
    next control plane's ``adopt`` takes it over by name and removes it: no Ray job holds the slice."""
    victim = v4_slices(cluster, 1)[0]
    name = fence_name(victim.name)
    placement_group(  # what the killed control plane's window left on a slice of the type
        bundles=[{f"TPU-{victim.accelerator_type}-head": 1}],
        bundle_label_selector=[{SLICE_LABEL: victim.name, WORKER_LABEL: "0"}],
        name=name,
        lifetime="detached",
    )
    assert name in _live_pg_names()
    RayExecutor().adopt()
    assert name not in _live_pg_names()


def _live_pg_names() -> list[str]:
    rows = ray.util.placement_group_table().values()
    return [r.get("name") or "" for r in rows if r.get("state") != "REMOVED"]


def test_a_killed_host_is_lost_and_its_slice_broken_until_restored(cluster: RayExecutor, fleet: Any) -> None:
    victim = v4_slices(cluster, 2)[1]
    tok = token()
    s = spec([victim], SLEEP + f"  # {tok}")
    cluster.launch(s)
    for w in range(victim.expected_hosts):
        _running(cluster, s, victim.name, w)
    assert len(procs_with(tok)) == 2
    fleet.kill_host(victim.name, 1)
    try:
        status = wait_for(
            "host 1 to be lost", lambda: (st := cluster.poll(s.job_id, s.attempt)).failure and st, 120
        )
        by_worker = {h.worker_id: h.state for h in status.hosts}
        assert by_worker == {0: HostState.RUNNING, 1: HostState.LOST}
        assert status.failure == f"host {victim.name}/1 was lost"
        broken = next(x for x in cluster.inventory() if x.name == victim.name)
        assert not broken.intact and any("worker 1" in p for p in broken.problems), broken
        wait_for("the lost host's process to die with it", lambda: len(procs_with(tok)) == 1, 30)
        cluster.stop(s.job_id, s.attempt, grace_s=1)
        assert procs_with(tok) == []
    finally:
        fleet.restore(victim.name)
    wait_for("the slice to be intact again", lambda: _intact(cluster, victim.name), 120, every_s=0.5)
    cluster.wait_warm([victim.name], timeout_s=120)  # re-reserved by the pool on the new host
    again = spec([victim], "print('back')")
    cluster.launch(again)
    assert wait_for("a job on the restored slice", lambda: finished(cluster, again)).succeeded
    cluster.stop(again.job_id, again.attempt)


def test_a_host_that_died_while_the_control_plane_was_down_is_lost_and_its_slice_comes_back(
    cluster: RayExecutor, fleet: Any
) -> None:
    """Adopted without a runner (its node died meanwhile): poll says LOST, stop ends the attempt
    and frees the slice, so the next launch there is not refused as held (found by tpufleet chaos)."""
    victim = v4_slices(cluster, 2)[1]
    job, tok = f"died-{os.getpid()}", token()
    _launch_from_a_control_plane_that_then_exits(victim.name, job, 1, tok)
    dead_node = victim.hosts[1].node_id
    fleet.kill_host(victim.name, 1)
    try:
        wait_for(
            "the node to be dead",
            lambda: not any(n["NodeID"] == dead_node and n["Alive"] for n in ray.nodes()),
        )
        fresh = RayExecutor()
        assert (job, 1) in fresh.adopt()
        status = wait_for("host 1 lost", lambda: (st := fresh.poll(job, 1)).failure and st, 60)
        assert {h.worker_id: h.state for h in status.hosts}[1] == HostState.LOST
        fresh.stop(job, 1, grace_s=1)
        assert procs_with(tok) == []
        assert (job, 1) not in fresh.running_attempts()
    finally:
        fleet.restore(victim.name)
    wait_for("the slice to be intact again", lambda: _intact(fresh, victim.name), 120, every_s=0.5)
    try:
        fresh.wait_warm([victim.name], timeout_s=120)
        again = spec([victim], "print('back')")
        fresh.launch(again)  # not refused: the dead attempt no longer holds the slice
        assert wait_for("a job on the slice", lambda: finished(fresh, again)).succeeded
        fresh.stop(again.job_id, again.attempt)
    finally:
        fresh.release_all()  # its reservation of the slice, so this module's executor can make its own


def _intact(cluster: RayExecutor, name: str) -> bool:
    return any(x.name == name and x.intact for x in cluster.inventory())


def test_an_uploaded_package_on_a_cold_slice(cluster: RayExecutor) -> None:
    victim = v4_slices(cluster, 1)[0]
    cluster.release([victim.name])  # out of the pool: launch reserves it on the spot
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("hello.py", "import os\nprint('hello from', os.environ['TPU_WORKER_ID'], os.getcwd())\n")
    s = spec([victim], "", package=buf.getvalue())
    s = AttemptSpec(**{**s.__dict__, "command": (sys.executable, "hello.py")})
    cluster.launch(s)
    status = wait_for("the job", lambda: finished(cluster, s), 120)
    assert status.succeeded, [full_log(cluster, s, victim.name, w) for w in range(victim.expected_hosts)]
    assert not {n for n in _our_actor_names() if n.startswith(f"tpufleet:{s.job_id}:")}  # pool runners
    cluster.stop(s.job_id, s.attempt)
    for w in range(victim.expected_hosts):  # logs outlive the attempt
        said = full_log(cluster, s, victim.name, w).split()
        assert said[:3] == ["hello", "from", str(w)] and said[3].endswith(f"/{victim.name}-{w}/wd")
    cluster.warm([victim.name])
