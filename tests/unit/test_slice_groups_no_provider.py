"""Slice groups on a control plane without a provider (``tpufleet serve`` without ``--provider``):
``slice create`` is refused with the fix, in one line, exit 2, and nothing is stored (it used to
stay ``REQUESTED: asking the provider`` for ever); deleting a group that no provider ever made
removes it at once (it used to stay ``REQUESTED (deleting)``). With a provider both go on as before."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from tpufleet.api.app import create_app
from tpufleet.api.server import ControlPlane
from tpufleet.cli import command
from tpufleet.cli.common import Seams
from tpufleet.control.cluster.memory import MemoryCluster
from tpufleet.control.loop.service import ServiceConfig
from tpufleet.control.store.facade import Store
from tpufleet.control.store.slicegroups import SliceGroups
from tpufleet.errors import ConflictError, NotFoundError, SpecError
from tpufleet.provision.memory import MemoryProvider


@pytest.fixture
def plane(
    tmp_path: Path, db_url: str, ids: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[ControlPlane]:
    monkeypatch.setenv("TPUFLEET_STATE_DIR", str(tmp_path / "nowhere"))
    cp = ControlPlane(
        MemoryCluster.of("v4-8"), state_dir=tmp_path / "state", db_url=db_url, new_id=ids,
        config=ServiceConfig(stop_threads=0),
    )  # fmt: skip
    yield cp
    cp.close()


def slice_cli(cp: ControlPlane, *args: str):  # type: ignore[no-untyped-def]
    extra = ["--token", cp.admin_token, "--server", "http://testserver"]
    with TestClient(cp.app) as http:
        return CliRunner().invoke(command(), ["slice", *args, *extra], obj=Seams(http=http))


def test_slice_create_without_a_provider_is_refused_naming_serve_provider(plane: ControlPlane) -> None:
    result = slice_cli(plane, "create", "grp1", "--type", "v4-8", "--count", "1")
    err = result.exception
    assert isinstance(err, ConflictError) and err.exit_code == 2, result.output
    assert "no provider" in str(err) and "`tpufleet serve --provider " in str(err)
    assert "\n" not in str(err)
    assert SliceGroups(plane.store).all() == []  # nothing stored that would wait for ever


def test_the_api_answers_409_without_a_provider_and_201_with_one(store: Store) -> None:
    body = {"name": "grp1", "config": {"tpu_type": "v4-8", "num_slices": 1}}
    headers = {"Authorization": f"Bearer {store.tokens.issue()}"}
    bare = TestClient(create_app(store), headers=headers).post("/api/v1/slice-groups", json=body)
    assert bare.status_code == 409 and "tpufleet serve --provider" in bare.json()["error"]
    made = TestClient(create_app(store, provider="memory"), headers=headers)
    assert made.post("/api/v1/slice-groups", json=body).status_code == 201


def test_deleting_a_group_no_provider_made_removes_it_at_once(plane: ControlPlane) -> None:
    groups = SliceGroups(plane.store)
    groups.create("grp1", "v4-8", 1)  # stored before refusals (or by a plane with a provider, since gone)
    groups.request_delete("grp1")  # and once asked to delete: REQUESTED (deleting), for ever
    result = slice_cli(plane, "delete", "grp1")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "grp1 deleted (no provider had made it)"
    assert [g.name for g in groups.all()] == []
    assert isinstance(slice_cli(plane, "utilization", "grp1").exception, NotFoundError)


def test_with_a_provider_a_delete_still_goes_through_the_loop(store: Store) -> None:
    groups = SliceGroups(store)
    groups.create("grp1", "v4-8", 1)
    http = TestClient(
        create_app(store, provider=MemoryProvider().kind),
        headers={"Authorization": f"Bearer {store.tokens.issue()}"},
    )
    gone = http.delete("/api/v1/slice-groups/grp1").json()
    assert (gone["state"], gone["deleting"]) == ("REQUESTED", True)  # the provisioner deletes it
    assert [g.name for g in groups.all()] == ["grp1"]


def test_slice_create_count_0_names_the_count_flag(plane: ControlPlane) -> None:
    err = slice_cli(plane, "create", "grp1", "--type", "v4-8", "--count", "0").exception
    assert isinstance(err, SpecError)
    assert str(err) == "--count: must be a whole number from 1 to 64, got 0"
    assert "num_slices" not in str(err)
