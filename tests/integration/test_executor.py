"""RayExecutor on the shared emulated fleet: the contract, exits, stop, logs."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from _executor_helpers import (
    PRINT_ENV,
    env_of,
    finished,
    flag,
    full_log,
    pid_alive,
    procs_with,
    spec,
    token,
    v4_slices,
    wait_for,
)

from tpufleet.control.cluster.protocol import AttemptStatus, HostState
from tpufleet.control.ray.client import RayExecutor
from tpufleet.host.runlimits import PROCESS_REASON, RunLimits

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(ray_client: object) -> Iterator[RayExecutor]:
    c = RayExecutor()
    c.wait_warm([s.name for s in v4_slices(c, 2)])
    yield c
    c.release_all()  # give every slice back to Ray for the other tests on the shared fleet


@pytest.fixture(autouse=True)
def _stop_leftovers(cluster: RayExecutor) -> Iterator[None]:
    """A test that fails half-way must not leave its attempt holding a slice for the next one."""
    yield
    for job_id, attempt in cluster.running_attempts():
        cluster.stop(job_id, attempt, grace_s=1)


@pytest.mark.parametrize("num_slices", [1, 2])
def test_job_succeeds_with_the_contract_on_every_host(cluster: RayExecutor, num_slices: int) -> None:
    slices = v4_slices(cluster, num_slices)
    s = spec(slices, PRINT_ENV, env={"FOO": "bar", "TPU_NAME": "not-the-slice"})
    cluster.launch(s)
    status = wait_for("the job to end", lambda: finished(cluster, s))
    assert status.succeeded, status
    envs = {(h.slice, h.worker_id): env_of(full_log(cluster, s, h.slice, h.worker_id)) for h in status.hosts}
    assert sorted(envs) == [(x.name, w) for x in slices for w in range(x.expected_hosts)]
    coordinator = slices[0].hosts[0].address
    for slice_id, x in enumerate(slices):
        for w in range(x.expected_hosts):
            env = envs[(x.name, w)]
            assert env["TPU_NAME"] == x.name  # the host's own value wins over the user's
            assert env["TPU_WORKER_ID"] == str(w)
            assert env["TPU_ACCELERATOR_TYPE"] == "v4-16" and env["TPU_TOPOLOGY"] == "2x2x2"
            assert len(env["TPU_WORKER_HOSTNAMES"].split(",")) == x.expected_hosts
            assert (env["TPUFLEET_JOB_ID"], env["TPUFLEET_ATTEMPT"]) == (s.job_id, "1")
            assert env["TPUFLEET_CHECKPOINT_DIR"] == s.checkpoint_dir
            assert env["FOO"] == "bar"
            assert "TPU_VISIBLE_CHIPS" not in env  # the process owns every chip of its host
            if num_slices == 1:
                assert not any(k.startswith("MEGASCALE_") for k in env)
            else:
                assert env["MEGASCALE_COORDINATOR_ADDRESS"] == coordinator
                assert (env["MEGASCALE_NUM_SLICES"], env["MEGASCALE_SLICE_ID"]) == ("2", str(slice_id))
    for var in ("MEGASCALE_PORT", "TPUFLEET_JAX_COORDINATOR_PORT"):
        assert len({e.get(var) for e in envs.values()}) == 1, f"{var} differs between hosts"
    assert re.fullmatch(r"\d+", next(iter(envs.values()))["TPUFLEET_JAX_COORDINATOR_PORT"])
    cluster.stop(s.job_id, s.attempt, grace_s=1)


def test_a_failing_host_shows_in_poll_while_the_others_run(cluster: RayExecutor) -> None:
    slices = v4_slices(cluster, 1)
    code = "import os, sys, time\nif os.environ['TPU_WORKER_ID'] == '1': sys.exit(7)\ntime.sleep(300)"
    s = spec(slices, code)
    cluster.launch(s)
    try:
        seen = []  # every poll until the failure shows: no host may ever look LOST on the way
        status = wait_for("host 1 to exit", lambda: _record(seen, cluster.poll(s.job_id, s.attempt)))
        assert not [h for st in seen for h in st.hosts if h.state is HostState.LOST], seen
        by_worker = {h.worker_id: h for h in status.hosts}
        assert (by_worker[1].state, by_worker[1].exit_code) == (HostState.EXITED, 7)
        assert by_worker[0].state is HostState.RUNNING  # ending the attempt is the service's call
        assert "exited with code 7" in (status.failure or "")
    finally:
        cluster.stop(s.job_id, s.attempt, grace_s=1)
    after = cluster.poll(s.job_id, s.attempt)
    assert all(h.state is HostState.EXITED for h in after.hosts)


def test_a_host_past_its_process_limit_fails_the_attempt_saying_so(cluster: RayExecutor) -> None:
    slices = v4_slices(cluster, 1)
    code = (
        "import os, time\n"
        "if os.environ['TPU_WORKER_ID'] == '1':\n"
        "    for i in range(200):\n"
        "        try:\n"
        "            if os.fork() == 0: time.sleep(90.41); os._exit(0)\n"
        "        except OSError: time.sleep(300)  # refused: it would go on, were it not ended\n"
        "time.sleep(300)"
    )
    s = spec(slices, code, limits=RunLimits(processes=40))
    cluster.launch(s)
    try:
        status = wait_for("host 1 to be ended", lambda: _record([], cluster.poll(s.job_id, s.attempt)))
        assert status.failure == f"host {slices[0].name}/1 exited with code -9: " + PROCESS_REASON.format(
            n=40
        )
        assert "exceeded its process limit" in full_log(cluster, s, slices[0].name, 1)
    finally:
        cluster.stop(s.job_id, s.attempt, grace_s=1)
    assert procs_with("90.41") == []


def _record(seen: list[AttemptStatus], status: AttemptStatus) -> AttemptStatus | None:
    seen.append(status)
    return status if status.failure else None


def test_stop_ends_every_process_and_frees_the_slice(cluster: RayExecutor) -> None:
    slices = v4_slices(cluster, 1)
    # The process and a child both ignore SIGTERM, so only the SIGKILL of the group ends them.
    tok = token()
    code = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', {tok!r}])\n"
        "print('PIDS', flush=True)\n"
        "time.sleep(300)"
    )
    s = spec(slices, code + f"  # {tok}")
    cluster.launch(s)
    for w in range(slices[0].expected_hosts):
        wait_for("the processes", lambda w=w: "PIDS" in _peek(cluster, s, slices[0].name, w))
    pids = procs_with(tok)
    assert len(pids) == 2 * slices[0].expected_hosts and all(pid_alive(p) for p in pids)
    cluster.stop(s.job_id, s.attempt, grace_s=0.5)
    assert [p for p in pids if pid_alive(p)] == [] and procs_with(tok) == []
    assert s.job_id not in {job for job, _ in cluster.running_attempts()}
    again = spec(slices, "print('again')")  # the slice is free again, straight from the pool
    cluster.launch(again)
    assert wait_for("the next job", lambda: finished(cluster, again)).succeeded
    cluster.stop(again.job_id, again.attempt)
    cluster.stop(s.job_id, s.attempt)  # idempotent


def _peek(cluster: RayExecutor, s: object, slice_name: str, worker: int) -> str:
    return cluster.read_logs(s.job_id, s.attempt, slice_name, worker, 0).data  # type: ignore[attr-defined]


def test_logs_are_complete_and_readable_while_running(cluster: RayExecutor) -> None:
    slices = v4_slices(cluster, 1)
    go = flag(token())
    code = (
        "import os, sys, time\n"
        "print('start', flush=True)\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
        "for i in range(60000):\n"
        "    print(f'out {i} é'); print(f'err {i}', file=sys.stderr)\n"
        "print('end')"
    )
    s = spec(slices, code)
    cluster.launch(s)
    wait_for("output while it runs", lambda: "start" in _peek(cluster, s, slices[0].name, 1))
    assert not cluster.read_logs(s.job_id, s.attempt, slices[0].name, 1, 0).complete
    go.touch()
    log = full_log(cluster, s, slices[0].name, 1)  # more than one 1 MiB chunk
    lines = log.splitlines()
    assert len(log.encode()) > 1 << 20
    assert [x for x in lines if x.startswith("out ")] == [f"out {i} é" for i in range(60000)]
    assert [x for x in lines if x.startswith("err ")] == [f"err {i}" for i in range(60000)]
    assert (lines[0], lines[-1]) == ("start", "end")
    cluster.stop(s.job_id, s.attempt)


# Writes 1 MiB a step into its checkpoint directory (on worker 0), up to 64 MiB.
FLOOD = (
    "import os, time\n"
    "ckpt = os.environ['TPUFLEET_CHECKPOINT_DIR']\n"
    "for i in range(64 if os.environ['TPU_WORKER_ID'] == '0' else 0):\n"
    "    open(os.path.join(ckpt, f'part-{i}'), 'wb').write(os.urandom(1 << 20)); time.sleep(0.05)\n"
    "time.sleep(300)\n"
)


def test_a_host_ends_a_run_over_its_tenants_checkpoint_quota_and_says_why(cluster: RayExecutor) -> None:
    slices = v4_slices(cluster, 1)
    s = spec(slices, FLOOD, checkpoint_quota=4 << 20, checkpoint_check_s=0.2)
    cluster.launch(s)
    try:
        status = wait_for("a host to end the run", lambda: _failed(cluster.poll(s.job_id, s.attempt)))
        assert "checkpoint quota exceeded: tenant 'itest' uses " in (status.failure or ""), status
        assert status.disk is not None and status.disk.bytes > 4 << 20
    finally:
        cluster.stop(s.job_id, s.attempt, grace_s=1)
    done = cluster.remove_job_files(s.job_root, s.tenant, [s.job_id])
    assert done.removed[s.job_id] > 4 << 20 and done.disk is not None
    assert not Path(s.checkpoint_dir).exists()
    assert not (Path(s.job_root) / s.tenant / ".runs" / s.job_id).exists()  # no empty run dirs left


def _failed(status: AttemptStatus) -> AttemptStatus | None:
    return status if status.failure else None
