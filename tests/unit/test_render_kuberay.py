"""``render --target kuberay``: right numbers per generation, valid against KubeRay CRDs and Kubernetes."""

from __future__ import annotations

import importlib

import jsonschema
import kubernetes_validate
import pytest
from spec_builders import EXAMPLE, GENERATION_CASES, all_generations, crds_or_skip, load_fleet, pool

from tpufleet.render.kuberay import render_kuberay, render_raycluster, render_rayjob
from tpufleet.spec import read_spec


def _by_kind(objects):
    return {o["kind"]: o for o in objects}


@pytest.mark.parametrize("case", GENERATION_CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("spot", [False, True])
def test_one_worker_group_per_pool_counted_in_slices(case, spot):
    spec = load_fleet([pool("tpu", **case.pool, slices=2, spot=spot)])
    (group,) = render_raycluster(spec)["spec"]["workerGroupSpecs"]
    assert (group["groupName"], group["replicas"], group["minReplicas"], group["maxReplicas"]) == (
        "tpu",
        2,
        2,
        2,
    )
    assert group["numOfHosts"] == case.hosts
    (container,) = group["template"]["spec"]["containers"]
    res = container["resources"]
    assert res["requests"]["google.com/tpu"] == res["limits"]["google.com/tpu"] == case.chips_per_host
    expected = {
        "cloud.google.com/gke-tpu-accelerator": case.accelerator,
        "cloud.google.com/gke-tpu-topology": case.topology,
    }
    if spot:
        expected["cloud.google.com/gke-spot"] = "true"
    assert group["template"]["spec"]["nodeSelector"] == expected
    assert not any(e.get("name", "").startswith("TPU_") for e in container.get("env", []))


def test_the_example_renders_the_issue_objects():
    objects = render_kuberay(read_spec(EXAMPLE))
    assert [o["kind"] for o in objects] == [
        "ServiceAccount",
        "NetworkPolicy",
        "RayCluster",
        "PodMonitor",
        "PrometheusRule",
    ]
    kinds = _by_kind(objects)
    sa = kinds["ServiceAccount"]["metadata"]
    assert sa["annotations"] == {
        "iam.gke.io/gcp-service-account": "ray-tpu@my-project.iam.gserviceaccount.com"
    }
    cluster = kinds["RayCluster"]["spec"]
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["autoscalerOptions"] == {
        "version": "v2",
        "idleTimeoutSeconds": 600,
        "upscalingMode": "Conservative",
    }
    ports = {
        p["name"]: p["containerPort"]
        for p in cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]
    }
    assert {"gcs-server": 6379, "dashboard": 8265, "client": 10001}.items() <= ports.items()
    v4, v6e = cluster["workerGroupSpecs"]
    assert (v4["replicas"], v4["minReplicas"], v4["maxReplicas"], v4["numOfHosts"]) == (2, 1, 4, 2)
    assert (v6e["replicas"], v6e["numOfHosts"]) == (1, 4)
    assert v6e["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
    assert "cloud.google.com/gke-spot" not in v4["template"]["spec"]["nodeSelector"]
    for kind in ("PodMonitor", "PrometheusRule"):
        assert kinds[kind]["apiVersion"] == "monitoring.coreos.com/v1"


def test_network_policy_admits_only_the_fleet_monitoring_and_the_operator():
    policy = _by_kind(render_kuberay(read_spec(EXAMPLE)))["NetworkPolicy"]["spec"]
    assert policy["podSelector"] == {"matchLabels": {"tpufleet.dev/fleet": "research-fleet"}}
    assert policy["policyTypes"] == ["Ingress"]
    own, monitoring, operator = policy["ingress"]
    assert own == {"from": [{"podSelector": {"matchLabels": {"tpufleet.dev/fleet": "research-fleet"}}}]}
    assert monitoring["ports"] == [{"protocol": "TCP", "port": 8080}]
    assert monitoring["from"][0]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "ml"}
    }
    assert operator["ports"] == [{"protocol": "TCP", "port": 8265}]
    # the labels the kuberay-operator Helm chart puts on its pod, in the namespace the spec names
    assert operator["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "default"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "kuberay-operator"}},
        }
    ]
    assert monitoring["from"][0]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}


def test_optional_objects_follow_the_spec():
    spec = load_fleet(service_account=None)
    assert [o["kind"] for o in render_kuberay(spec)] == ["RayCluster"]
    cluster = render_raycluster(spec)["spec"]
    assert "enableInTreeAutoscaling" not in cluster and "autoscalerOptions" not in cluster
    assert "serviceAccountName" not in cluster["headGroupSpec"]["template"]["spec"]


def test_rayjob_wraps_the_cluster():
    objects = render_kuberay(read_spec(EXAMPLE), "python train.py --steps 10")
    kinds = _by_kind(objects)
    assert "RayCluster" not in kinds
    job = kinds["RayJob"]["spec"]
    assert job["entrypoint"] == "python train.py --steps 10"
    assert job["rayClusterSpec"] == render_raycluster(read_spec(EXAMPLE))["spec"]
    assert job["submitterPodTemplate"]["metadata"]["labels"]["tpufleet.dev/fleet"] == "research-fleet"


def test_ray_start_params_are_options_of_ray_start():
    scripts = importlib.import_module("ray.scripts.scripts")
    accepted = {opt[2:] for param in scripts.start.params for opt in param.opts if opt.startswith("--")}
    cluster = render_raycluster(all_generations())["spec"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        assert set(group["rayStartParams"]) <= accepted, group["rayStartParams"]
        assert all(isinstance(v, str) for v in group["rayStartParams"].values())


def _crd_validate(schemas, obj):
    schema = schemas(obj["kind"], "v1")
    jsonschema.Draft7Validator(schema).validate(obj)  # raises with the path on failure


def test_every_generation_and_multi_pool_validates_against_the_kuberay_crds():
    schemas = crds_or_skip()
    multi = all_generations()
    singles = [load_fleet([pool("tpu", **c.pool)], autoscaling={"enabled": True}) for c in GENERATION_CASES]
    for spec in [multi, *singles]:
        _crd_validate(schemas, render_raycluster(spec))
        _crd_validate(schemas, render_rayjob(spec, "python -c 'import jax'"))


def test_crd_validation_really_rejects(monkeypatch):
    schemas = crds_or_skip()
    bad = render_raycluster(all_generations())
    bad["spec"]["autoscalerOptions"] = {"upscalingMode": "Slow"}
    with pytest.raises(jsonschema.ValidationError, match="Slow"):
        _crd_validate(schemas, bad)


def test_core_objects_validate_against_kubernetes_schemas():
    version = kubernetes_validate.latest_version()
    objects = render_kuberay(all_generations())
    core = [o for o in objects if o["kind"] in ("ServiceAccount", "NetworkPolicy")]
    assert len(core) == 2
    for obj in core:
        kubernetes_validate.validate(obj, version, strict=True)
    broken = dict(core[1], spec={**core[1]["spec"], "policyTypes": "Ingress"})
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)


def test_pod_templates_validate_as_kubernetes_pod_specs():
    version = kubernetes_validate.latest_version()
    cluster = render_raycluster(all_generations())["spec"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, **group["template"]}
        kubernetes_validate.validate(pod, version, strict=True)
