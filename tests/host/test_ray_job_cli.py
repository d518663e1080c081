"""Ray's own ``ray job`` CLI and ``JobSubmissionClient`` (the pinned Ray's) against ``tpufleet serve
--sandbox --allow-ray-jobs`` at ``http://HOST:PORT/ray`` (issue 33), run as a user runs them: submit
with ``--working-dir`` and ``--entrypoint-resources``, status while queued behind another tenant
(the message says why), stop, follow the logs, list (only the caller's), delete; and the refusals:
no TPU shape, an impossible one, a path as working_dir, another tenant's job, no token.

The sandbox executes nothing (a Ray job's hosts each "run" for TPUFLEET_SANDBOX_SECONDS and write a
line naming their slice; the driver's log is host 0's), which is all these API tests need; the
server runs with no Ray importable, as ``tpufleet serve --sandbox`` does."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import planes
import pytest
import ray
import raycli
from ray.exceptions import AuthenticationError
from ray.job_submission import JobSubmissionClient

from tpufleet.api import raysubmit

SHORT = json.dumps({"env_vars": {"TPUFLEET_SANDBOX_SECONDS": "1"}})


@dataclass
class Plane:
    url: str  # the control plane; Ray's job API is at url + "/ray"
    admin: str
    tokens: dict[str, str]


def _no_ray_env(tmp_path: Path) -> dict[str, str]:
    fake = tmp_path / "noray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('the sandbox must not import ray')\n")
    return os.environ | {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(fake.parent), os.environ.get("PYTHONPATH")]))
    }


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Plane]:
    serve = planes.ServeProcess(
        tmp_path, "--sandbox", "v4-16:2", "--allow-ray-jobs", env=_no_ray_env(tmp_path)
    )
    try:
        admin = (tmp_path / "home" / "sandbox" / "admin-token").read_text().strip()
        tokens = {}
        for name, chips in (("team-a", 16), ("team-b", 8)):
            made = httpx.post(
                f"{serve.url}/api/v1/tenants",
                json={"name": name, "quota": {"v4": chips}},
                headers={"Authorization": f"Bearer {admin}"},
            )
            tokens[name] = made.json()["token"]
        yield Plane(serve.url, admin, tokens)
    finally:
        out = serve.stop()
        assert "Traceback" not in out, out


def ray_job(
    plane: Plane, tenant: str | None, *args: str, env: dict[str, str] | None = None, wait: bool = True
) -> Any:
    """``ray job ARGS --address URL/ray`` as a user types it, with the tenant's token in
    RAY_JOB_HEADERS (or ``env``'s): run to its end, or only started (``wait=False``)."""
    given = raycli.bearer(plane.tokens[tenant]) if tenant is not None else {}
    cmd = [*args[:1], "--address", f"{plane.url}/ray", *args[1:]]
    return raycli.ray_job(cmd, given | (env or {}), wait=wait)


def client(plane: Plane, tenant: str) -> JobSubmissionClient:
    return JobSubmissionClient(
        f"{plane.url}/ray", headers={"Authorization": f"Bearer {plane.tokens[tenant]}"}
    )


def wait_for(what: str, probe: Callable[[], Any], timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (got := probe()):
        assert time.monotonic() < deadline, f"{what} within {timeout_s:g} s"
        time.sleep(0.2)
    return got


def tpufleet_job(plane: Plane, tenant: str, job_id: str) -> dict[str, Any]:
    got = httpx.get(
        f"{plane.url}/api/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {plane.tokens[tenant]}"}
    )
    return dict(got.json())


def test_ray_job_cli_queues_follows_stops_and_deletes_and_refuses_what_it_cannot_run(
    plane: Plane, tmp_path: Path
) -> None:
    """Ray's CLI runs three times (each start of it costs about 2 s of CPU): a submit that waits,
    queued behind another tenant and following the log to the end; a stop; a delete. The rest
    through ``JobSubmissionClient``, Ray's API of the same requests."""
    a, b = client(plane, "team-a"), client(plane, "team-b")
    assert a.get_version() == raysubmit.JOBS_API_VERSION and ray.__version__ == raysubmit.RAY_VERSION
    a.submit_job(
        entrypoint="python long.py",
        submission_id="a-long",
        entrypoint_resources={"TPU-v4-16-head": 2},
        runtime_env={"env_vars": {"TPUFLEET_SANDBOX_SECONDS": "600"}},
    )
    wait_for("a-long to run", lambda: a.get_job_status("a-long") == "RUNNING")
    a_job = tpufleet_job(plane, "team-a", a.get_job_info("a-long").job_id)
    assert a_job["kind"] == "ray" and len(a_job["slices"]) == 2 and a_job["name"] == "a-long"

    # team-b submits with the CLI (its code uploaded, Ray's token auth): it waits behind team-a,
    # says why, and follows the log
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('training')\n")
    waiting = ray_job(
        plane, None, "submit", "--submission-id", "b-train", "--working-dir", str(code),
        "--entrypoint-resources", '{"TPU-v4-16-head": 1}', "--runtime-env-json", SHORT,
        "--", "python", "train.py",
        env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": plane.tokens["team-b"]}, wait=False,
    )  # fmt: skip
    try:
        queued = wait_for("b-train to wait, saying why", lambda: _info(b, "b-train"))
        assert queued.status == "PENDING" and "queued (tpufleet job" in queued.message
        assert queued.runtime_env["working_dir"].startswith("gcs://_ray_pkg_")
        assert tpufleet_job(plane, "team-b", queued.job_id)["working_dir"].startswith("sha256:")

        # team-b can neither see nor stop team-a's job; team-a stops it; team-b's runs on its own slice
        with pytest.raises(RuntimeError, match="does not exist"):
            b.get_job_status("a-long")
        with pytest.raises(RuntimeError, match="does not exist"):
            b.stop_job("a-long")
        stopped = ray_job(plane, "team-a", "stop", "a-long")
        assert stopped.returncode == 0 and a.get_job_status("a-long") == "STOPPED", stopped.stderr
        out, err = waiting.communicate(timeout=120)
        assert waiting.returncode == 0 and "succeeded" in out + err, out + err
    finally:
        if waiting.poll() is None:  # the test failed first: end the CLI it started
            waiting.kill()
            waiting.communicate()
    b_job = tpufleet_job(plane, "team-b", queued.job_id)
    assert b_job["state"] == "SUCCEEDED" and len(b_job["slices"]) == 1 and b_job["kind"] == "ray"
    assert f"sandbox: {b_job['slices'][0]}/0 running" in out  # the driver's log, followed
    assert f"sandbox: {b_job['slices'][0]}/0 running" in b.get_job_logs("b-train")
    assert "".join(asyncio.run(_tail(b, "b-train"))) == b.get_job_logs("b-train")  # logs -f of an ended job
    assert [j.submission_id for j in b.list_jobs()] == ["b-train"]  # not team-a's
    deleted = ray_job(plane, "team-b", "delete", "b-train")
    assert deleted.returncode == 0 and b.list_jobs() == [], deleted.stderr
    assert tpufleet_job(plane, "team-b", queued.job_id)["state"] == "SUCCEEDED"  # still a tpufleet job

    # refusals, each in one line saying what would be right
    with pytest.raises(
        RuntimeError, match=r'names no TPU slice: give entrypoint_resources \{"TPU-v4-16-head": 1\}'
    ):
        b.submit_job(entrypoint="python t.py")
    with pytest.raises(RuntimeError, match="TPU-v4-17-head is not a TPU slice; closest: TPU-v4-16-head"):
        b.submit_job(entrypoint="python t.py", entrypoint_resources={"TPU-v4-17-head": 1})
    raw = httpx.post(
        f"{plane.url}/ray/api/jobs/",
        json={
            "entrypoint": "python t.py",
            "entrypoint_resources": {"TPU-v4-16-head": 1},
            "runtime_env": {"working_dir": "/etc"},
        },
        headers={"Authorization": f"Bearer {plane.tokens['team-b']}"},
    )
    assert raw.status_code == 400 and "is a path, which the control plane never reads" in raw.text
    with pytest.raises(AuthenticationError, match="RAY_JOB_HEADERS"):
        JobSubmissionClient(f"{plane.url}/ray")


async def _tail(client: JobSubmissionClient, submission_id: str) -> list[str]:
    return [lines async for lines in client.tail_job_logs(submission_id)]


def _info(client: JobSubmissionClient, submission_id: str) -> Any:
    """The job's details once its message says why it waits (``queued (...): CODE: why``)."""
    try:
        info = client.get_job_info(submission_id)
    except RuntimeError:  # not submitted yet
        return None
    return info if "): " in (info.message or "") else None
