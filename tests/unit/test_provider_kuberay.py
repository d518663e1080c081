"""``--provider kuberay`` through the official ``kubernetes`` client against a local HTTP server that
answers as the Kubernetes API does for ``rayclusters.ray.io`` (GET, PATCH with
``application/merge-patch+json`` and resourceVersion checks) and pods (list by label selector).
Every patched RayCluster is validated against KubeRay's CRD schema (../shared/kuberay), as the API
server would; ``reconcile()`` then does what KubeRay >= 1.6 does with RayMultiHostIndexing (one
replica = numOfHosts pods labelled with the replica's name and index; a pod named in
workersToDelete takes its whole replica with it)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import kube_api
import pytest
from kube_api import NS, RC, FakeKubeApi
from spec_builders import load_fleet, pool

from tpufleet.errors import NotFoundError
from tpufleet.provision.base import GroupState, HostHealth, SliceRequest
from tpufleet.provision.kuberay import ANNOTATION, KubeRayConfig, KubeRayProvider, make_api_client
from tpufleet.render.kuberay import render_raycluster


@pytest.fixture
def api() -> Iterator[FakeKubeApi]:
    with kube_api.running() as srv:
        yield srv


@pytest.fixture
def provider(api: FakeKubeApi) -> KubeRayProvider:
    return kube_api.provider(api)


def _group(p: KubeRayProvider, name: str) -> Any:
    return next(g for g in p.poll() if g.name == name)


def _record(**groups: tuple[str, int, bool, str, list[str]]) -> dict[str, str]:
    """The provider's annotation for groups given as (type, count, spot, worker group, replicas)."""
    value = {
        name: {
            "acceleratorType": t,
            "count": n,
            "spot": spot,
            "tenant": None,
            "workerGroup": wg,
            "replicas": rs,
        }
        for name, (t, n, spot, wg, rs) in sorted(groups.items())
    }
    return {ANNOTATION: json.dumps(value, sort_keys=True)}


def _scales(api: FakeKubeApi) -> list[dict[str, Any]]:
    """The bodies of the patches that change workerGroupSpecs (not the annotation-only ones)."""
    return [p[4] for p in api.patches() if "spec" in p[4]]


def _specs_with(api: FakeKubeApi, group: str, **changes: Any) -> list[dict[str, Any]]:
    """The workerGroupSpecs as the provider must send them: every group, one changed."""
    specs = copy.deepcopy(api.cluster["spec"]["workerGroupSpecs"])
    for g in specs:
        if g["groupName"] == group:
            g.update(changes)
    return specs


def test_create_patches_replicas_of_the_matching_worker_group(
    api: FakeKubeApi, provider: KubeRayProvider
) -> None:
    expected = _specs_with(api, "v4spot", replicas=2)
    provider.create(SliceRequest("burst", "v4-16", count=2, spot=True))
    assert api.patches() == [
        (
            "PATCH",
            RC,
            {},
            "application/merge-patch+json",
            {
                "metadata": {
                    "resourceVersion": "100",
                    "annotations": _record(burst=("v4-16", 2, True, "v4spot", [])),
                },
                "spec": {"workerGroupSpecs": expected},
            },
        )
    ]
    assert api.group("v4spot")["replicas"] == 2 and api.group("v4")["replicas"] == 1
    provider.create(SliceRequest("burst", "v4-16", count=2, spot=True))  # idempotent
    assert len(api.patches()) == 1


def test_states_from_pods_waiting_then_active(api: FakeKubeApi, provider: KubeRayProvider) -> None:
    provider.create(SliceRequest("g", "v4-16", spot=True))
    g = _group(provider, "g")
    assert g.state is GroupState.PROVISIONING and "0 of 1 replica(s)" in g.message
    api.reconcile(phase="Pending", ready=False)
    g = _group(provider, "g")
    assert g.state is GroupState.WAITING_FOR_RESOURCES and "Insufficient google.com/tpu" in g.message
    for name in api.replica_pods("v4spot")[next(iter(api.replica_pods("v4spot")))]:
        api.pods[name]["status"] = {
            "phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
        }
    g = _group(provider, "g")
    assert g.state is GroupState.ACTIVE
    assert [(s.name, s.hosts) for s in g.slices] == [("v4spot-0", (HostHealth.READY, HostHealth.READY))]
    assert all(g.name != "v4" for g in provider.poll())  # the pool's own replica belongs to no group


def test_scale_up_then_scale_down_names_a_pod_of_the_replica(
    api: FakeKubeApi, provider: KubeRayProvider
) -> None:
    provider.create(SliceRequest("a", "v6e-8"))
    provider.create(SliceRequest("b", "v6e-8"))  # scale up: one more replica
    assert [b["spec"]["workerGroupSpecs"][2]["replicas"] for b in _scales(api)] == [1, 2]
    assert [b["metadata"]["resourceVersion"] for b in _scales(api)] == ["100", "101"]
    api.reconcile()
    assert {g.name: g.state for g in provider.poll()} == {"a": GroupState.ACTIVE, "b": GroupState.ACTIVE}
    by_index = {
        api.pods[pods[0]]["metadata"]["labels"]["ray.io/worker-group-replica-index"]: r
        for r, pods in api.replica_pods("v6e").items()
    }
    a_replica = by_index[_group(provider, "a").slices[0].name.rsplit("-", 1)[1]]
    b_replica = by_index[_group(provider, "b").slices[0].name.rsplit("-", 1)[1]]
    # The poll recorded which replica is whose, in the provider's annotation only.
    assert api.patches()[-1][4] == {
        "metadata": {
            "annotations": _record(
                a=("v6e-8", 1, False, "v6e", [a_replica]), b=("v6e-8", 1, False, "v6e", [b_replica])
            )
        }
    }
    pod = api.replica_pods("v6e")[a_replica][0]
    expected = _specs_with(api, "v6e", replicas=1, scaleStrategy={"workersToDelete": [pod]})
    provider.delete("a")  # scale down: exactly a's replica goes
    assert api.patches()[-1][4] == {
        "metadata": {
            "resourceVersion": "103",
            "annotations": _record(b=("v6e-8", 1, False, "v6e", [b_replica])),
        },
        "spec": {"workerGroupSpecs": expected},
    }
    assert _group(provider, "a").state is GroupState.DELETING
    api.reconcile()
    assert a_replica not in api.replica_pods("v6e") and len(api.replica_pods("v6e")) == 1
    assert [g.name for g in provider.poll()] == ["b"]
    provider.delete("b")  # delete: the last replica
    api.reconcile()
    assert api.group("v6e")["replicas"] == 0 and api.replica_pods("v6e") == {}
    assert provider.poll() == []


def test_a_concurrent_writer_makes_the_patch_retry_on_the_new_version(
    api: FakeKubeApi, provider: KubeRayProvider
) -> None:
    def ray_autoscaler_writes() -> None:  # another writer, right after our read
        api.group("v4")["replicas"] = 2
        api.bump()

    api.after_get = [None, ray_autoscaler_writes]  # the 2nd GET (the patch's read) goes stale
    provider.create(SliceRequest("g", "v6e-8"))
    assert [b["metadata"]["resourceVersion"] for b in _scales(api)] == ["100", "101"]
    assert [r[0] for r in api.requests if r[1] == RC][1:] == ["GET", "GET", "PATCH", "GET", "PATCH"]
    assert api.group("v6e")["replicas"] == 1
    assert api.group("v4")["replicas"] == 2  # the other writer's change survived


def test_pod_deletion_is_a_notice_then_the_lost_replica_suspends(
    api: FakeKubeApi, provider: KubeRayProvider
) -> None:
    provider.create(SliceRequest("s", "v4-16", spot=True))
    api.reconcile()
    assert _group(provider, "s").state is GroupState.ACTIVE
    ((replica, pods),) = api.replica_pods("v4spot").items()
    deadline = datetime(2026, 11, 30, 20, 0, 30, tzinfo=UTC)
    api.pods[pods[1]]["metadata"]["deletionTimestamp"] = deadline.isoformat().replace("+00:00", "Z")
    g = _group(provider, "s")
    assert g.state is GroupState.ACTIVE and g.slices[0].preempt_deadline == deadline.timestamp()
    for name in pods:  # the node went; KubeRay deleted the incomplete replica
        del api.pods[name]
    g = _group(provider, "s")
    assert g.state is GroupState.SUSPENDED and "v4spot-0 lost" in g.message
    assert [(s.name, s.hosts) for s in g.slices] == [("v4spot-0", (HostHealth.PREEMPTED,))]
    api.reconcile()  # KubeRay keeps replicas: a new replica replaces it
    g = _group(provider, "s")
    assert g.state is GroupState.ACTIVE and [s.name for s in g.slices] == ["v4spot-0"]
    assert replica not in api.replica_pods("v4spot")


def test_no_worker_group_for_the_type_fails_the_group_with_the_choices(
    api: FakeKubeApi, provider: KubeRayProvider
) -> None:
    provider.create(SliceRequest("x", "v5p-8"))
    g = _group(provider, "x")
    assert g.state is GroupState.FAILED and "no worker group for v5p-8" in g.message and "v4spot" in g.message
    assert api.patches() == []


def test_the_crd_really_rejects_a_bad_patch(api: FakeKubeApi) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    custom = client.CustomObjectsApi(make_api_client(api.host))
    bad = {"spec": {"workerGroupSpecs": [{**api.group("v4"), "replicas": "two"}]}}
    with pytest.raises(ApiException) as err:
        custom.patch_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", "fleet", bad)
    assert err.value.status == 422


def test_a_missing_raycluster_is_named(api: FakeKubeApi) -> None:
    with pytest.raises(NotFoundError, match="no RayCluster 'nope' in namespace 'ml'"):
        KubeRayProvider(KubeRayConfig(NS, "nope"), api_client=make_api_client(api.host))


def test_a_restarted_provider_knows_its_groups_from_the_annotation(
    api: FakeKubeApi, provider: KubeRayProvider
) -> None:
    """Before the slice manager creates them again (tests/conformance: then, and a delete, as every
    provider does), the RayCluster's annotation alone tells a new provider which replica is whose."""
    provider.create(SliceRequest("a", "v6e-8"))
    provider.create(SliceRequest("b", "v6e-8", count=2))
    api.reconcile()
    before = {g.name: g.slices for g in provider.poll()}
    again = KubeRayProvider(KubeRayConfig(NS, "fleet"), api_client=make_api_client(api.host))
    assert {g.name: g.slices for g in again.poll()} == before


def test_rendered_rbac_grants_exactly_what_the_provider_calls() -> None:
    import kubernetes_validate

    from tpufleet.render.kuberay import render_kuberay

    spec = load_fleet([pool("v4", type="v4-16")])
    objects = render_kuberay(spec, provider_rbac=True)
    assert [o["kind"] for o in objects] == [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ServiceAccount",
        "RayCluster",
    ]
    sa, role, binding = objects[:3]
    version = kubernetes_validate.latest_version()
    for obj in (sa, role, binding):
        kubernetes_validate.validate(obj, version, strict=True)
    # The provider's calls: GET/PATCH rayclusters/<fleet> (ray.io) and LIST pods, in the fleet's namespace.
    assert role["rules"] == [
        {
            "apiGroups": ["ray.io"],
            "resources": ["rayclusters"],
            "resourceNames": ["fleet"],
            "verbs": ["get", "patch"],
        },
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    ]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NS}
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert [o["kind"] for o in render_kuberay(spec)] == ["ServiceAccount", "RayCluster"]  # opt-in


def test_config_from_the_fleet_spec_names_the_rendered_raycluster() -> None:
    from tpufleet.provision.kuberay import config_from_spec

    spec = load_fleet([pool("v4", type="v4-16")])
    rendered = render_raycluster(spec)["metadata"]
    assert config_from_spec(spec) == KubeRayConfig(rendered["namespace"], rendered["name"])


def test_no_kubernetes_credentials_is_one_line_naming_the_fix(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpufleet.errors import InputError

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(InputError, match="no Kubernetes credentials for --provider kuberay") as err:
        make_api_client()
    assert "\n" not in str(err.value)
