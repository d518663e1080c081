"""``--provider gce`` through the real ``google-cloud-tpu`` client (REST transport, anonymous
credentials) against a local HTTP server that answers as the Cloud TPU API v2 does
(https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources and
.../projects.locations.nodes; fields in docs/provisioning.md). Every request the provider sends is
recorded and asserted exactly."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import gce_api
import pytest
from gce_api import ALT, PARENT, QRS, FakeTpuApi

from tpufleet.provision.base import GroupState, HostHealth, SliceRequest
from tpufleet.provision.gce import GROUP_LABEL, GceConfig, GceProvider, make_client, startup_script

os.environ.setdefault("NO_GCE_CHECK", "True")
os.environ.setdefault("GCE_METADATA_HOST", "127.0.0.1:9")


@pytest.fixture
def api() -> Iterator[FakeTpuApi]:
    with gce_api.running() as srv:
        yield srv


@pytest.fixture
def provider(api: FakeTpuApi) -> Iterator[GceProvider]:
    p = gce_api.provider(api)
    yield p
    p.close()


def _node(accelerator_type: str, runtime: str, group: str) -> dict[str, Any]:
    return {
        "acceleratorType": accelerator_type,
        "runtimeVersion": runtime,
        "labels": {GROUP_LABEL: group},
        "metadata": {"startup-script": startup_script("10.0.0.1:6379", "2.60.0")},
    }


def _state(p: GceProvider, name: str) -> Any:
    return next(g for g in p.poll() if g.name == name)


def test_create_sends_one_queued_resource_with_one_node(api: FakeTpuApi, provider: GceProvider) -> None:
    provider.create(SliceRequest("train", "v4-16"))
    assert api.mutations() == [
        (
            "POST",
            QRS,
            {"queuedResourceId": ["train"], **ALT},
            {
                "tpu": {
                    "nodeSpec": [
                        {
                            "parent": PARENT,
                            "nodeId": "train-0",
                            "node": _node("v4-16", "tpu-ubuntu2204-base", "train"),
                        }
                    ]
                }
            },
        )
    ]
    provider.create(SliceRequest("train", "v4-16"))  # idempotent: nothing more is sent
    assert len(api.mutations()) == 1
    assert _state(provider, "train").state is GroupState.WAITING_FOR_RESOURCES


def test_scale_up_is_a_spot_multislice_queued_resource(api: FakeTpuApi, provider: GceProvider) -> None:
    provider.create(SliceRequest("burst", "v5litepod-16", count=3, spot=True))
    ((method, path, query, body),) = api.mutations()
    assert (method, path, query) == ("POST", QRS, {"queuedResourceId": ["burst"], **ALT})
    assert body == {
        "tpu": {
            "nodeSpec": [
                {
                    "parent": PARENT,
                    "multisliceParams": {"nodeCount": 3, "nodeIdPrefix": "burst"},
                    "node": _node("v5litepod-16", "v2-alpha-tpuv5-lite", "burst"),
                }
            ]
        },
        "spot": {},
    }


def test_states_follow_the_queued_resource_and_its_nodes(api: FakeTpuApi, provider: GceProvider) -> None:
    provider.create(SliceRequest("g", "v4-16", count=2))
    api.set_state("g", "WAITING_FOR_RESOURCES")
    g = _state(provider, "g")
    assert g.state is GroupState.WAITING_FOR_RESOURCES and "waiting for 2 x v4-16" in g.message
    api.set_state("g", "PROVISIONING")
    api.make_nodes("g", hosts=2, state="CREATING", health="HEALTH_UNSPECIFIED")
    assert _state(provider, "g").state is GroupState.PROVISIONING
    api.set_state("g", "ACTIVE")
    api.make_nodes("g", hosts=2)
    api.nodes["g-1"]["state"] = "REPAIRING"
    g = _state(provider, "g")
    assert g.state is GroupState.ACTIVE
    assert [(s.name, s.hosts) for s in g.slices] == [
        ("g-0", (HostHealth.READY, HostHealth.READY)),
        ("g-1", (HostHealth.REPAIRING, HostHealth.REPAIRING)),
    ]


def test_failed_queued_resource_carries_the_api_error(api: FakeTpuApi, provider: GceProvider) -> None:
    provider.create(SliceRequest("g", "v4-8"))
    api.set_state("g", "FAILED", failedData={"error": {"code": 8, "message": "quota TPUV4 exceeded"}})
    g = _state(provider, "g")
    assert (g.state, g.message) == (GroupState.FAILED, "quota TPUV4 exceeded")


def test_preempted_nodes_are_deleted_and_the_group_stays_suspended(
    api: FakeTpuApi, provider: GceProvider
) -> None:
    provider.create(SliceRequest("spot", "v4-16", spot=True))
    api.set_state("spot", "ACTIVE")
    api.make_nodes("spot", hosts=2)
    assert provider.reclaim() == []
    api.nodes["spot-0"]["state"] = "PREEMPTED"
    g = _state(provider, "spot")
    assert g.state is GroupState.SUSPENDED and "preempted" in g.message
    assert g.slices[0].hosts == (HostHealth.PREEMPTED, HostHealth.PREEMPTED)
    assert g.slices[0].preempt_deadline is not None
    before = len(api.mutations())
    assert provider.reclaim() == ["spot"]
    assert api.mutations()[before:] == [("DELETE", f"{QRS}/spot", {"force": ["true"], **ALT}, None)]
    del api.qrs["spot"], api.nodes["spot-0"]  # the API finished deleting
    assert provider.reclaim() == []  # once only
    assert _state(provider, "spot").state is GroupState.SUSPENDED
    provider.delete("spot")  # the manager's delete: nothing left to send
    assert len(api.mutations()) == before + 1
    assert [g.name for g in provider.poll()] == []


def test_a_hosts_notice_is_the_slices_preempt_deadline_until_the_api_shows_the_preemption(
    api: FakeTpuApi,
) -> None:
    config = GceConfig(project="proj", zone="us-central2-b", ray_address="10.0.0.1:6379")
    noticed: dict[str, float] = {}
    broken = [False]

    def notices() -> dict[str, float]:  # what the hosts' runners published (host/notices.py)
        if broken[0]:
            raise ConnectionError("Ray's GCS is away")
        return noticed

    clock = iter(float(t) for t in range(1000, 2000))
    p = GceProvider(
        config,
        client=make_client(api.endpoint, anonymous=True),
        clock=lambda: next(clock),
        reclaim_interval_s=0,
        notices=notices,
    )
    p.create(SliceRequest("spot", "v4-16", count=2, spot=True))
    api.set_state("spot", "ACTIVE")
    api.make_nodes("spot", hosts=2)
    assert [s.preempt_deadline for s in _state(p, "spot").slices] == [None, None]
    noticed.update({"spot-1": 1030.0, "other-0": 5.0})
    g = _state(p, "spot")
    assert g.state is GroupState.ACTIVE  # the API knows nothing yet
    assert [(s.name, s.hosts[0], s.preempt_deadline) for s in g.slices] == [
        ("spot-0", HostHealth.READY, None),
        ("spot-1", HostHealth.READY, 1030.0),
    ]
    api.nodes["spot-1"]["createTime"] = "2023-11-14T22:13:20.500Z"  # made 0.5 s after 1700000000
    noticed["spot-1"] = 1_700_000_000.0  # a notice that ran out before this node was made: an old one's
    assert [s.preempt_deadline for s in _state(p, "spot").slices] == [None, None]
    noticed["spot-1"] = 1_700_000_030.0
    assert [s.preempt_deadline for s in _state(p, "spot").slices] == [None, 1_700_000_030.0]
    broken[0] = True  # the notices cannot be read: the API's states still are
    assert [s.preempt_deadline for s in _state(p, "spot").slices] == [None, None]
    broken[0] = False
    api.nodes["spot-1"]["state"] = "PREEMPTED"  # once it happened, the API's moment counts
    g = _state(p, "spot")
    assert g.state is GroupState.SUSPENDED and g.slices[1].hosts[0] is HostHealth.PREEMPTED
    assert g.slices[1].preempt_deadline is not None and g.slices[1].preempt_deadline < 1030.0
    p.close()


def test_scale_down_and_delete_send_force_deletes(api: FakeTpuApi, provider: GceProvider) -> None:
    provider.create(SliceRequest("a", "v4-8"))
    provider.create(SliceRequest("b", "v4-8", count=2))
    for qr in ("a", "b"):
        api.set_state(qr, "ACTIVE")
    before = len(api.mutations())
    provider.delete("a")  # scale down: one group of the pool goes
    assert api.mutations()[before:] == [("DELETE", f"{QRS}/a", {"force": ["true"], **ALT}, None)]
    assert _state(provider, "a").state is GroupState.DELETING
    del api.qrs["a"]
    assert [g.name for g in provider.poll()] == ["b"]
    provider.delete("b")
    provider.delete("b")  # the second is sent again: the API answers the same operation kind
    assert [r[:3] for r in api.mutations()[before + 1 :]] == [
        ("DELETE", f"{QRS}/b", {"force": ["true"], **ALT})
    ] * 2
    del api.qrs["b"]
    assert provider.poll() == []


def test_unreachable_api_reports_every_group_failed_with_the_reason(api: FakeTpuApi) -> None:
    config = GceConfig(project="proj", zone="us-central2-b", ray_address="10.0.0.1:6379")
    p = GceProvider(config, client=make_client(api.endpoint, anonymous=True), reclaim_interval_s=0)
    p.create(SliceRequest("g", "v4-8"))
    api.shutdown()
    api.server_close()
    (g,) = p.poll()
    assert g.state is GroupState.FAILED and "Cloud TPU API unreachable" in g.message


def test_delete_of_a_group_made_before_a_restart_reaches_the_api(
    api: FakeTpuApi, provider: GceProvider
) -> None:
    api.qrs["old"] = {"name": f"{PARENT}/queuedResources/old", "state": {"state": "ACTIVE"}}
    provider.delete("old")
    assert api.mutations() == [("DELETE", f"{QRS}/old", {"force": ["true"], **ALT}, None)]
    provider.delete("never-made")  # 404: nothing to do
    assert provider.poll() == []


def test_config_from_the_fleet_spec() -> None:
    from spec_builders import load_fleet

    from tpufleet.errors import SpecError
    from tpufleet.provision.gce import config_from_spec

    config = config_from_spec(load_fleet(), "10.0.0.1:6379")
    assert (config.project, config.zone, config.ray_version) == ("my-project", "us-east5-b", "2.60.0")
    assert config.service_account == "ray-tpu@my-project.iam.gserviceaccount.com"
    assert config.parent == "projects/my-project/locations/us-east5-b"
    with pytest.raises(SpecError, match="--provider gce needs a gce section"):
        config_from_spec(load_fleet(gce=None), "10.0.0.1:6379")


def test_no_credentials_is_one_line_naming_the_fix(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from tpufleet.errors import InputError

    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(InputError, match="gcloud auth application-default login") as err:
        make_client()
    assert "\n" not in str(err.value)
