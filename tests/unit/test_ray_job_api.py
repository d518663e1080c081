"""Ray's job submission API served by tpufleet (``/ray``, issue 33) without Ray: the translation of
a Ray submission into a tpufleet Ray job (``api/raysubmit.py``), Ray's JobStatus of each job state,
and the routes in process (``api/rayjobs.py``) over a real store. ``tests/host/test_ray_job_cli.py``
drives the same routes with Ray's own CLI and ``JobSubmissionClient``."""

from __future__ import annotations

import asyncio
import io
import os
import zipfile
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketDenialResponse

from tpufleet.api import rayjobs, raysubmit
from tpufleet.api.app import create_app
from tpufleet.api.raysubmit import JobSubmitBody, translate
from tpufleet.control.store.facade import Store
from tpufleet.control.store.values import DEFAULT_LIMITS, JobRecord, Limits
from tpufleet.errors import NotFoundError, SpecError

RAY = Limits(ray_jobs=True)
ONE = {"entrypoint_resources": {"TPU-v4-16-head": 1}}


def _translate(**body: Any) -> raysubmit.Translated:
    return translate(
        JobSubmitBody(**{"entrypoint": "python train.py", **body}),
        package_of={"gcs://_ray_pkg_abc.zip": "sha256:" + "a" * 64}.get,
        example=lambda: "v6e-16",
        new_id=lambda: "raysubmit_X",
    )


# -- in: a Ray submission as a tpufleet Ray job ---------------------------------------------------
@pytest.mark.parametrize(
    ("body", "shape"),
    [
        ({"entrypoint_resources": {"TPU-v4-16-head": 2}}, ("v4-16", 2)),
        ({"entrypoint_resources": {"TPU-v5litepod-16-head": 1, "TPU": 4}}, ("v5litepod-16", 1)),
        ({"metadata": {"tpufleet.accelerator_type": "v6e-16", "tpufleet.num_slices": "3"}}, ("v6e-16", 3)),
        (
            {
                "entrypoint_resources": {"TPU-v4-32-head": 1},
                "metadata": {"tpufleet.accelerator_type": "v4-32"},
            },
            ("v4-32", 1),
        ),
    ],
)
def test_the_slices_come_from_the_head_resource_or_the_metadata(body: dict[str, Any], shape: tuple) -> None:
    got = _translate(**body)
    assert (got.fields["accelerator_type"], got.fields["num_slices"]) == shape
    assert got.fields["kind"] == "ray" and got.submission_id == "raysubmit_X"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({}, 'names no TPU slice: give entrypoint_resources {"TPU-v6e-16-head": 1}'),
        ({"entrypoint_resources": {"TPU-v4-17-head": 1}}, "closest: TPU-v4-16-head, TPU-v4-32-head"),
        ({"entrypoint_resources": {"GPU": 1}}, "'GPU' is not a TPU slice head"),
        (
            {"entrypoint_resources": {"TPU-v4-16-head": 1, "TPU-v4-32-head": 1}},
            "a job runs on slices of one type",
        ),
        ({"entrypoint_resources": {"TPU-v4-16-head": 1.5}}, "'1.5' is not a whole number"),
        ({"metadata": {"tpufleet.accelerator_type": "v4-17"}}, "closest: v4-16, v4-32"),
        (
            {
                "entrypoint_resources": {"TPU-v4-16-head": 1},
                "metadata": {"tpufleet.accelerator_type": "v4-32"},
            },
            "names v4-16 but metadata tpufleet.accelerator_type v4-32",
        ),
        ({"metadata": {"tpufleet.acelerator_type": "v4-16"}}, "is not a tpufleet key"),
        ({**ONE, "runtime_env": {"working_dir": "/etc"}}, "is a path, which the control plane never reads"),
        ({**ONE, "runtime_env": {"pip": ["torch"]}}, "'pip' is not supported by tpufleet"),
        ({"entrypoint_num_gpus": 1}, "no GPUs"),
        ({"submission_id": "a/b"}, "is not a submission id"),
    ],
)
def test_a_submission_tpufleet_cannot_run_is_refused_in_one_line(body: dict[str, Any], says: str) -> None:
    with pytest.raises(SpecError) as err:
        _translate(**body)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_the_working_dir_is_the_tenants_uploaded_package_and_env_vars_are_its_env() -> None:
    got = _translate(
        entrypoint_resources={"TPU-v4-16-head": 1},
        runtime_env={"working_dir": "gcs://_ray_pkg_abc.zip", "env_vars": {"A": "1"}, "excludes": ["x"]},
        metadata={"tpufleet.priority": "5", "tpufleet.max_retries": "0", "tpufleet.name": "n", "team": "t"},
    )
    assert got.fields["working_dir"] == "sha256:" + "a" * 64 and got.fields["env"] == {"A": "1"}
    assert (got.fields["priority"], got.fields["max_retries"], got.fields["name"]) == (5, 0, "n")
    assert got.metadata["team"] == "t" and got.runtime_env["working_dir"] == "gcs://_ray_pkg_abc.zip"
    with pytest.raises(NotFoundError, match="was not uploaded by this tenant"):
        _translate(
            entrypoint_resources={"TPU-v4-16-head": 1}, runtime_env={"working_dir": "gcs://_ray_pkg_x.zip"}
        )


@pytest.mark.parametrize(
    ("entrypoint", "command"),
    [
        ("python train.py --lr=0.1", ["python", "train.py", "--lr=0.1"]),
        ("python a.py && echo done", ["sh", "-c", "python a.py && echo done"]),
        ("FOO=1 python a.py", ["sh", "-c", "FOO=1 python a.py"]),
        ("echo 'a b'", ["sh", "-c", "echo 'a b'"]),
    ],
)
def test_the_entrypoint_keeps_its_shell_meaning(entrypoint: str, command: list[str]) -> None:
    assert raysubmit.command_of(entrypoint) == command


def _job(state: str, **fields: Any) -> JobRecord:
    base: dict[str, Any] = dict(
        id="j1", name="n", tenant="a", state=state, attempt=1, slices=("tpu-v4-16-0",), reason=None,
        reason_code=None, accelerator_type="v4-16", num_slices=1, priority=0, max_retries=2, failures=0,
        command=("python",), env={}, working_dir=None, borrowing=False, preempting=False,
        cancel_requested=False, exit_code=None, seq=1, submitted_at=1.0, admitted_at=None,
        started_at=None, finished_at=None,
    )  # fmt: skip
    return JobRecord(**{**base, **fields})


@pytest.mark.parametrize(
    ("state", "fields", "status", "says"),
    [
        (
            "QUEUED",
            {"reason_code": "no_capacity", "reason": "no free v4-16 slice"},
            "PENDING",
            "no free v4-16",
        ),
        ("ADMITTED", {}, "PENDING", "admitted on tpu-v4-16-0"),
        ("STARTING", {}, "PENDING", "starting on tpu-v4-16-0"),
        ("RUNNING", {}, "RUNNING", "running on tpu-v4-16-0"),
        ("SUCCEEDED", {"exit_code": 0}, "SUCCEEDED", "Job finished successfully"),
        ("FAILED", {"exit_code": 3, "reason_code": "exit", "reason": "exit code 3"}, "FAILED", "exit code 3"),
        ("CANCELLED", {}, "STOPPED", "Job was intentionally stopped"),
    ],
)
def test_rays_status_is_the_lifecycle_mapped_honestly(
    state: str, fields: dict[str, Any], status: str, says: str
) -> None:
    got, message = raysubmit.ray_status(_job(state, **fields))
    assert got == status and says in message and "tpufleet job j1" in message


# -- the routes, in process ------------------------------------------------------------------------
def _api(store: Store, limits: Limits = RAY) -> tuple[TestClient, dict[str, str], dict[str, str]]:
    http = TestClient(create_app(store, limits=limits))
    admin = {"Authorization": f"Bearer {store.tokens.issue()}"}
    tokens = []
    for name in ("team-a", "team-b"):
        made = http.post("/api/v1/tenants", json={"name": name, "quota": {"v4": 8}}, headers=admin)
        tokens.append({"Authorization": f"Bearer {made.json()['token']}"})
    return http, tokens[0], tokens[1]


SUBMIT = {"entrypoint": "python train.py", "entrypoint_resources": {"TPU-v4-16-head": 1}}


def test_no_token_is_401_and_a_wrong_one_403_each_naming_what_to_set(store: Store) -> None:
    http, _, _ = _api(store)
    missing = http.get("/ray/api/version")
    assert (
        missing.status_code == 401 and "RAY_JOB_HEADERS" in missing.text and "RAY_AUTH_TOKEN" in missing.text
    )
    wrong = http.get("/ray/api/version", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 403 and "RAY_JOB_HEADERS" in wrong.text
    ray_header = http.get("/ray/api/version", headers={"X-Ray-Authorization": "Bearer nope"})
    assert ray_header.status_code == 403


def test_without_ray_jobs_enabled_every_route_says_how_to_enable_them(store: Store) -> None:
    http, a, _ = _api(store, DEFAULT_LIMITS)
    got = http.get("/ray/api/version", headers=a)
    assert got.status_code == 404 and "serve --allow-ray-jobs" in got.text


def test_a_submission_is_a_tpufleet_ray_job_seen_and_stopped_by_its_tenant_only(store: Store) -> None:
    http, a, b = _api(store)
    assert http.get("/ray/api/version", headers=a).json()["ray_version"] == raysubmit.RAY_VERSION
    got = http.post("/ray/api/jobs/", json={**SUBMIT, "submission_id": "mine"}, headers=a)
    assert got.status_code == 200 and got.json() == {"job_id": "mine", "submission_id": "mine"}
    again = http.post("/ray/api/jobs/", json={**SUBMIT, "submission_id": "mine"}, headers=a)
    assert again.status_code == 400 and "Job with submission_id mine already exists" in again.text
    info = http.get("/ray/api/jobs/mine", headers=a).json()
    assert (
        info["status"] == "PENDING"
        and info["type"] == "SUBMISSION"
        and info["entrypoint"] == "python train.py"
    )
    job = http.get(f"/api/v1/jobs/{info['job_id']}", headers=a).json()
    assert (job["kind"], job["accelerator_type"], job["name"], job["command"]) == (
        "ray", "v4-16", "mine", ["python", "train.py"],
    )  # fmt: skip
    assert http.get("/ray/api/jobs/mine", headers=b).status_code == 404
    assert http.post("/ray/api/jobs/mine/stop", headers=b).status_code == 404
    assert http.get("/ray/api/jobs/", headers=b).json() == []
    assert [j["submission_id"] for j in http.get("/ray/api/jobs/", headers=a).json()] == ["mine"]
    refused = http.delete("/ray/api/jobs/mine", headers=a)
    assert refused.status_code == 400 and "non-terminal" in refused.text
    assert http.post("/ray/api/jobs/mine/stop", headers=a).json() == {"stopped": True}
    assert http.get("/ray/api/jobs/mine", headers=a).json()["status"] == "STOPPED"
    assert http.post("/ray/api/jobs/mine/stop", headers=a).json() == {"stopped": False}
    assert http.get("/ray/api/jobs/mine/logs", headers=a).json() == {"logs": ""}
    with http.websocket_connect("/ray/api/jobs/mine/logs/tail", headers=a) as ws:
        assert ws.receive()["type"] == "websocket.close"  # ended before it ran: nothing to follow
    assert http.delete("/ray/api/jobs/mine", headers=a).json() == {"deleted": True}
    assert http.get("/ray/api/jobs/mine", headers=a).status_code == 404
    assert http.get(f"/api/v1/jobs/{info['job_id']}", headers=a).json()["state"] == "CANCELLED"


def test_a_package_ray_uploads_becomes_the_tenants_package_and_the_jobs_working_dir(store: Store) -> None:
    http, a, b = _api(store)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("train.py", "print('hi')\n")
    path = "/ray/api/packages/gcs/_ray_pkg_0123abcd.zip"
    assert http.get(path, headers=a).status_code == 404
    assert http.put(path, content=buf.getvalue(), headers=a).status_code == 200
    assert http.get(path, headers=a).status_code == 200 and http.get(path, headers=b).status_code == 404
    env = {"working_dir": "gcs://_ray_pkg_0123abcd.zip"}
    got = http.post("/ray/api/jobs/", json={**SUBMIT, "runtime_env": env}, headers=a)
    job_id = http.get(f"/ray/api/jobs/{got.json()['submission_id']}", headers=a).json()["job_id"]
    assert http.get(f"/api/v1/jobs/{job_id}", headers=a).json()["working_dir"].startswith("sha256:")
    theirs = http.post("/ray/api/jobs/", json={**SUBMIT, "runtime_env": env}, headers=b)
    assert theirs.status_code == 404 and "was not uploaded by this tenant" in theirs.text
    bad = http.put(path, content=b"not a zip", headers=a)
    assert bad.status_code == 400 and "zip" in bad.text


def test_every_ray_route_authenticates_through_the_apis_one_guard() -> None:
    routes = [r for r in rayjobs.router.routes if isinstance(r, APIRoute)]
    assert len(routes) == 10
    assert all(rayjobs.caller in {d.call for d in r.dependant.dependencies} for r in routes)


class GoneSocket:
    """A WebSocket (Starlette's interface) whose client has gone: what the tail must notice."""

    def __init__(self, app: Any) -> None:
        self.app, self.sent = app, []

    async def receive(self) -> dict[str, Any]:
        return {"type": "websocket.disconnect", "code": 1000}

    async def send_text(self, text: str) -> None:
        self.sent.append(text)


def test_a_log_tail_ends_when_its_client_goes_while_the_job_still_waits(store: Store) -> None:
    http, a, _ = _api(store)
    http.app.state.ray_tail_poll_s = 0.01  # type: ignore[attr-defined]
    http.post("/ray/api/jobs/", json={**SUBMIT, "submission_id": "waits"}, headers=a)
    job_id = http.get("/ray/api/jobs/waits", headers=a).json()["job_id"]
    follow = rayjobs.follow_until_gone(GoneSocket(http.app), store, job_id, "team-a")  # type: ignore[arg-type]
    assert asyncio.run(asyncio.wait_for(follow, timeout=60)) is False  # gone, not followed to the end
    assert http.get("/ray/api/jobs/waits", headers=a).json()["status"] == "PENDING"


def test_a_ray_package_upload_has_the_package_cap_not_the_json_one(store: Store) -> None:
    http, a, _ = _api(store, Limits(ray_jobs=True, max_body_bytes=1024, max_package_bytes=64 * 1024))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("data.bin", os.urandom(8 * 1024))  # incompressible: the zip is over 8 KiB
    path = "/ray/api/packages/gcs/_ray_pkg_big.zip"
    assert http.put(path, content=buf.getvalue(), headers=a).status_code == 200
    assert http.put(path, content=b"x" * (65 * 1024), headers=a).status_code == 413


def test_the_admin_submits_for_a_tenant_named_in_the_metadata_and_sees_every_submission(store: Store) -> None:
    http, a, _ = _api(store)
    admin = {"Authorization": f"Bearer {store.tokens.issue()}"}
    nobody = http.post("/ray/api/jobs/", json=SUBMIT, headers=admin)
    assert nobody.status_code == 400 and '"tpufleet.tenant": "NAME"' in nobody.text
    body = {**SUBMIT, "submission_id": "for-a", "metadata": {"tpufleet.tenant": "team-a"}}
    assert http.post("/ray/api/jobs/", json=body, headers=admin).status_code == 200
    assert [j["submission_id"] for j in http.get("/ray/api/jobs/", headers=a).json()] == ["for-a"]
    assert [j["submission_id"] for j in http.get("/ray/api/jobs/", headers=admin).json()] == ["for-a"]
    theirs = http.post("/ray/api/jobs/", json={**body, "submission_id": "x"}, headers=a)
    assert theirs.status_code == 200  # its own tenant named: allowed
    other = {**SUBMIT, "metadata": {"tpufleet.tenant": "team-b"}}
    assert http.post("/ray/api/jobs/", json=other, headers=a).status_code == 403


def test_a_log_tail_of_another_tenants_job_is_refused_before_the_upgrade(store: Store) -> None:
    http, a, b = _api(store)
    http.post("/ray/api/jobs/", json={**SUBMIT, "submission_id": "mine"}, headers=a)
    with (
        pytest.raises(WebSocketDenialResponse) as denied,
        http.websocket_connect("/ray/api/jobs/mine/logs/tail", headers=b),
    ):
        pass
    assert denied.value.status_code == 404 and "does not exist" in denied.value.text
