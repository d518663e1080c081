"""Batch submission (issue 9, item 4): ``Store.submit_many`` (one transaction, bulk inserts, all or
none), ``POST /api/v1/jobs/batch`` (every item validated first; one bad item is a 400 naming its
index and nothing is stored; the queued cap for the batch as a whole), ``Client.submit_batch`` and
``tpufleet submit --batch FILE.jsonl``. On SQLite and PostgreSQL (the ``store`` fixture)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from test_api import Api

from tpufleet.api.app import create_app
from tpufleet.api.limits import MAX_BATCH_JOBS
from tpufleet.cli import command
from tpufleet.control.store.facade import Store
from tpufleet.control.store.tables import EventRow, JobRow
from tpufleet.control.store.values import JobRequest
from tpufleet.errors import ConflictError, NotFoundError, SpecError, TpufleetError

JOB: dict[str, Any] = {"command": ["python", "t.py"], "accelerator_type": "v4-16"}


def count(store: Store, column: Any) -> int:
    with store.tx() as s:
        return int(s.scalar(select(func.count(column))) or 0)


def req(**fields: Any) -> JobRequest:
    return JobRequest.build(**(JOB | fields))


# -- the store ---------------------------------------------------------------------------------
def test_submit_many_stores_every_job_queued_in_order_with_its_event(store: Store) -> None:
    store.tenants.create("team-a", {"v4": 32})
    store.tenants.create("team-b", {})
    reqs = [req(name=f"j{i}", priority=i) for i in range(5)]
    ids = store.jobs.submit_many(["team-a", "team-b", "team-a", "team-b", "team-a"], reqs)
    jobs = store.jobs.all()
    assert [j.id for j in jobs] == ids and len(set(ids)) == 5
    assert [(j.name, j.priority, j.tenant, j.state, j.attempt) for j in jobs] == [
        (f"j{i}", i, "team-b" if i % 2 else "team-a", "QUEUED", 1) for i in range(5)
    ]
    assert all(e["kind"] == "submit" for i in ids for e in store.events(i))
    assert store.jobs.submit_many("team-a", []) == []


def test_submit_many_draws_ids_again_when_one_is_taken_or_repeated(store: Store) -> None:
    store.tenants.create("team-a", {})
    [first] = store.jobs.submit_many("team-a", [req()])
    drawn = iter([first, "aaaa0001", "aaaa0001", "aaaa0002", "aaaa0003"])
    store.new_id = lambda: next(drawn)
    assert store.jobs.submit_many("team-a", [req(), req(), req()]) == ["aaaa0001", "aaaa0002", "aaaa0003"]


def test_the_queued_cap_applies_to_the_batch_as_a_whole(store: Store) -> None:
    store.tenants.create("team-a", {})
    store.tenants.create("team-b", {})
    store.limits = replace(store.limits, max_queued_per_tenant=4)
    store.jobs.submit_many("team-a", [req(), req()])
    with pytest.raises(ConflictError, match="team-a has 2 queued jobs and the batch adds 3"):
        store.jobs.submit_many(["team-b", "team-a", "team-a", "team-a"], [req()] * 4)
    assert count(store, JobRow.seq) == 2  # nothing of the refused batch, not even team-b's job
    store.jobs.submit_many(["team-b"] * 4 + ["team-a"] * 2, [req()] * 6)  # exactly at the cap: fine
    assert count(store, JobRow.seq) == 8


def test_a_missing_package_or_tenant_stores_nothing(store: Store) -> None:
    store.tenants.create("team-a", {})
    with pytest.raises(NotFoundError, match="package sha256:"):
        store.jobs.submit_many("team-a", [req(), req(working_dir="sha256:" + "0" * 64)])
    with pytest.raises(NotFoundError, match="tenant 'team-c' not found"):
        store.jobs.submit_many(["team-a", "team-c"], [req(), req()])
    assert count(store, JobRow.seq) == count(store, EventRow.job_id) == 0


# -- the API -----------------------------------------------------------------------------------
@pytest.fixture
def api(store: Store) -> Iterator[Api]:
    a = Api(store)
    yield a
    a.http.close()


def batch(api: Api, token: str, jobs: list[dict[str, Any]]) -> Any:
    return api.call("POST", "/jobs/batch", token, json={"jobs": jobs})


def test_a_batch_answers_the_ids_in_order(api: Api) -> None:
    token = api.tenant("team-a", v4=32)
    resp = batch(api, token, [JOB | {"name": f"n{i}"} for i in range(50)])
    assert resp.status_code == 201, resp.text
    ids = resp.json()["ids"]
    listed = api.call("GET", "/jobs", token).json()["items"]
    assert [j["id"] for j in listed] == ids and [j["name"] for j in listed] == [f"n{i}" for i in range(50)]


@pytest.mark.parametrize(
    ("item", "status", "message"),
    [
        ({"num_slices": 0}, 400, "jobs[2].num_slices: must be an integer from 1 to 4096, got 0"),
        ({"num_slices": "2"}, 400, "jobs[2].num_slices: Input should be a valid integer"),
        ({"command": ["python", 1]}, 400, "jobs[2].command[1]: Input should be a valid string"),
        ({"colour": "red"}, 400, "jobs[2].colour: unknown field 'colour'; valid: accelerator_type, command,"),
        ({"num_slice": 2}, 400, "jobs[2].num_slice: unknown field 'num_slice'; did you mean num_slices?"),
        ({"env": {"TPU_NAME": "x"}}, 400, "jobs[2].env: TPU_NAME is set by tpufleet"),
        ({"accelerator_type": "v4-15"}, 400, "jobs[2]"),
        ({"tenant": "team-b"}, 403, "jobs[2]: your token is for tenant 'team-a'"),
    ],
)
def test_one_bad_item_is_named_and_nothing_is_stored(
    api: Api, item: dict[str, Any], status: int, message: str
) -> None:
    token = api.tenant("team-a")
    resp = batch(api, token, [JOB, JOB, JOB | item, JOB])
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error.startswith(message) and "\n" not in error
    assert count(api.store, JobRow.seq) == 0


def test_the_admin_names_each_items_tenant(api: Api) -> None:
    api.tenant("team-a")
    api.tenant("team-b")
    resp = batch(api, api.admin, [JOB | {"tenant": "team-a"}, JOB | {"tenant": "team-b"}])
    assert resp.status_code == 201, resp.text
    assert [j.tenant for j in api.store.jobs.all()] == ["team-a", "team-b"]
    resp = batch(api, api.admin, [JOB | {"tenant": "team-a"}, JOB])
    assert resp.status_code == 400 and resp.json()["error"].startswith("jobs[1].tenant: the admin token")


def test_over_the_cap_the_batch_is_a_409(store: Store) -> None:
    api = Api(store)
    api.http = TestClient(create_app(store, limits=replace(store.limits, max_queued_per_tenant=3)))
    token = api.tenant("team-a")
    assert batch(api, token, [JOB] * 4).status_code == 409
    assert batch(api, token, [JOB] * 3).status_code == 201


def test_a_batch_has_its_own_caps_on_items_and_bytes(api: Api) -> None:
    token = api.tenant("team-a")
    big = JOB | {"env": {f"V{i}": "x" * 4000 for i in range(60)}}  # ~240 KB a job
    single = api.call("POST", "/jobs", token, json=big | {"env": big["env"] | {"W": "x" * 900_000}})
    assert single.status_code == 413  # over 1 MiB: the single route's cap
    resp = batch(api, token, [big] * 8)  # ~2 MB: within the batch's cap
    assert resp.status_code == 201, resp.text[:200]
    resp = batch(api, token, [JOB] * (MAX_BATCH_JOBS + 1))
    assert resp.status_code == 422 and "jobs" in resp.json()["error"]
    assert batch(api, token, []).status_code == 422
    assert count(api.store, JobRow.seq) == 8


# -- the CLI and the client --------------------------------------------------------------------
@pytest.fixture
def cli(api: Api, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[..., Any]:
    monkeypatch.setenv("TPUFLEET_STATE_DIR", str(tmp_path / "nowhere"))
    monkeypatch.setenv("TPUFLEET_CONFIG", str(tmp_path / "config.json"))
    token = api.tenant("team-a", v4=32)

    def run(*args: str) -> Any:
        extra = ["--token", token, "--server", "http://testserver"]
        return CliRunner().invoke(command(), [*args, *extra], obj=api.http)

    return run


def jsonl(tmp_path: Path, *lines: str) -> str:
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_submit_batch_prints_the_ids(cli: Callable[..., Any], api: Api, tmp_path: Path) -> None:
    lines = [json.dumps(JOB | {"name": f"n{i}"}) for i in range(3)]
    result = cli("submit", "--batch", jsonl(tmp_path, lines[0], "", *lines[1:]), "--json")
    assert result.exit_code == 0, result.output
    ids = json.loads(result.stdout)["ids"]
    assert [(j.id, j.name) for j in api.store.jobs.all()] == list(zip(ids, ["n0", "n1", "n2"], strict=True))
    plain = cli("submit", "--batch", jsonl(tmp_path, lines[0]))
    assert plain.exit_code == 0 and plain.stdout.strip() == api.store.jobs.all()[-1].id


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ((json.dumps(JOB), "{not json"), "jobs.jsonl:2: not JSON"),
        ((json.dumps(JOB), "", "[1, 2]"), "jobs.jsonl:3: each line is one job body"),
        ((json.dumps(JOB), "", json.dumps(JOB | {"num_slices": 0})), "jobs.jsonl:3: num_slices: must be"),
        (
            (json.dumps(JOB | {"num_slice": 2}),),  # the suggestion `render` gives a fleet spec's typo
            "jobs.jsonl:1: num_slice: unknown field 'num_slice'; did you mean num_slices?",
        ),
        (("",), "no jobs in the file"),
    ],
)
def test_a_bad_line_exits_2_naming_it(
    cli: Callable[..., Any], api: Api, tmp_path: Path, lines: tuple[str, ...], message: str
) -> None:
    result = cli("submit", "--batch", jsonl(tmp_path, *lines))
    assert isinstance(result.exception, SpecError), result.output
    assert message in str(result.exception) and result.exception.exit_code == 2
    assert count(api.store, JobRow.seq) == 0


def test_batch_and_one_jobs_flags_exclude_each_other(cli: Callable[..., Any], tmp_path: Path) -> None:
    result = cli("submit", "--batch", jsonl(tmp_path, json.dumps(JOB)), "--type", "v4-16")
    assert isinstance(result.exception, SpecError) and "not both" in str(result.exception)
    result = cli("submit", "--type", "v4-16")
    assert isinstance(result.exception, TpufleetError) and "--batch" in str(result.exception)


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_a_batch_file_is_read_only_as_far_as_one_batch_may_carry(cli: Callable[..., Any], api: Api) -> None:
    """`submit --batch /dev/zero` read until memory ran out; past the batch body's cap it is refused."""
    result = cli("submit", "--batch", "/dev/zero")
    assert isinstance(result.exception, SpecError) and result.exception.exit_code == 2
    assert (
        str(result.exception)
        == "/dev/zero: over 32 MiB, what one batch may carry; split it into several files"
    )
    assert count(api.store, JobRow.seq) == 0
