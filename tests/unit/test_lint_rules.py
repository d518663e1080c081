"""Every lint rule against its documented wrong and right example, with the CRDs and without them."""

from __future__ import annotations

import importlib
import re

import pytest
import yaml
from spec_builders import GENERATION_CASES, REPO, all_generations, crds_or_skip, load_fleet, pool

from tpufleet.cli.config import dump_yaml
from tpufleet.lint.findings import RULES
from tpufleet.lint.ray_start_params import RAY_START_PARAMS, RAY_VERSION
from tpufleet.lint.runner import fallback_schemas, lint_text
from tpufleet.render.kuberay import render_kuberay

DOC = REPO / "docs" / "lint.md"


def documented_examples() -> dict[str, tuple[str, str]]:
    """``{code: (wrong yaml, right yaml)}`` parsed from docs/lint.md."""
    text = DOC.read_text(encoding="utf-8")
    out = {}
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        code = section.split()[0]
        wrong = re.search(r"Wrong:\s*```yaml\n(.*?)```", section, re.S)
        right = re.search(r"Right:\s*```yaml\n(.*?)```", section, re.S)
        assert wrong and right, f"{code}: docs/lint.md needs a Wrong: and a Right: yaml block"
        out[code] = (wrong.group(1), right.group(1))
    return out


EXAMPLES = documented_examples()


def _source(kind):
    return crds_or_skip() if kind == "crd" else fallback_schemas


def test_every_rule_is_documented_with_examples():
    assert sorted(EXAMPLES) == sorted(RULES)


@pytest.mark.parametrize("schemas", ["crd", "structural"])
@pytest.mark.parametrize("code", sorted(RULES))
def test_wrong_example_is_flagged_and_right_one_is_clean(code, schemas):
    source = _source(schemas)
    wrong, right = EXAMPLES[code]
    flagged = lint_text(wrong, f"{code}-wrong.yaml", source)
    assert {f.code for f in flagged} == {code}, [f.text() for f in flagged]  # its own rule, no other
    assert all(f.severity == RULES[code].severity for f in flagged)  # TPF015 is info
    assert lint_text(right, f"{code}-right.yaml", source) == []


@pytest.mark.parametrize("schemas", ["crd", "structural"])
def test_everything_render_produces_lints_clean(schemas):
    source = _source(schemas)
    specs = [all_generations(), *(load_fleet([pool("tpu", **c.pool)]) for c in GENERATION_CASES)]
    for spec in specs:
        for rayjob in (None, "python train.py"):
            text = dump_yaml(render_kuberay(spec, rayjob))
            assert lint_text(text, "rendered.yaml", source) == [], spec.pools


def test_findings_carry_file_line_column_and_dotted_path():
    wrong = EXAMPLES["TPF002"][0]
    (finding,) = [f for f in lint_text(wrong, "w.yaml") if f.code == "TPF002"]
    line = 1 + next(
        i for i, text in enumerate(wrong.splitlines()) if "gke-tpu: 'true'" in text or "gke-tpu:" in text
    )
    assert (finding.file, finding.line) == ("w.yaml", line)
    assert finding.column > 1
    assert finding.path == "spec.workerGroupSpecs[0].template.spec.nodeSelector.cloud.google.com/gke-tpu"
    assert finding.text().startswith(f"w.yaml:{line}:{finding.column}: TPF002 ")
    assert set(finding.as_dict()) == {"file", "line", "column", "code", "severity", "path", "message"}


def test_multi_document_files_rayjob_and_rayservice():
    cluster = yaml.safe_load(EXAMPLES["TPF007"][0])
    job = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "j"},
        "spec": {"entrypoint": "python x.py", "rayClusterSpec": cluster["spec"]},
    }
    service = {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": "s"},
        "spec": {"rayClusterConfig": cluster["spec"]},
    }
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"numOfHosts": "x"}}
    text = dump_yaml([other, job, service])
    found = [(f.code, f.path) for f in lint_text(text, "multi.yaml")]
    assert found == [
        ("TPF007", "spec.rayClusterSpec.workerGroupSpecs[0].numOfHosts"),
        ("TPF007", "spec.rayClusterConfig.workerGroupSpecs[0].numOfHosts"),
    ]
    job_line = text[: text.index("kind: RayJob")].count("\n") + 1
    service_line = text[: text.index("kind: RayService")].count("\n") + 1
    first, second = (f.line for f in lint_text(text, "multi.yaml"))
    assert job_line < first < service_line < second


def test_structural_fallback_catches_unknown_fields_and_bad_enums():
    right = yaml.safe_load(EXAMPLES["TPF009"][1])
    right["spec"]["autoscalerOptions"]["upscalingMode"] = "Slow"
    right["spec"]["workerGroupSpecs"][0]["numOfHost"] = 2
    found = {f.path: f.message for f in lint_text(dump_yaml([right]), "x.yaml")}
    assert "Slow" in found["spec.autoscalerOptions.upscalingMode"]
    assert "did you mean numOfHosts" in found["spec.workerGroupSpecs[0].numOfHost"]


def test_crd_checks_reach_inside_pod_templates():
    source = crds_or_skip()
    doc = yaml.safe_load(EXAMPLES["TPF007"][1])
    doc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resource"] = {}
    (finding,) = lint_text(dump_yaml([doc]), "x.yaml", source)
    assert (finding.code, finding.path) == (
        "TPF009",
        "spec.workerGroupSpecs[0].template.spec.containers[0].resource",
    )
    assert "did you mean resources" in finding.message


def test_packaged_ray_start_params_match_the_installed_ray():
    ray = importlib.import_module("ray")
    scripts = importlib.import_module("ray.scripts.scripts")
    accepted = {opt[2:] for param in scripts.start.params for opt in param.opts if opt.startswith("--")}
    assert ray.__version__ == RAY_VERSION
    missing, extra = sorted(accepted - RAY_START_PARAMS), sorted(RAY_START_PARAMS - accepted)
    assert not missing and not extra, (
        f"update src/tpufleet/lint/ray_start_params.py for Ray {ray.__version__}: add {missing}, drop {extra}"
    )


GOOD = REPO / "examples" / "good-raycluster.yaml"

# One tpu7x host (2x2x1, 4 chips) whose chips are split over two containers, one per chiplet: the
# layout the GKE TPU webhook supports for Ironwood. The pod asks for 4 chips in all.
TPU7X_SPLIT = """
apiVersion: ray.io/v1
kind: RayCluster
metadata: {name: tpu7x-split}
spec:
  headGroupSpec:
    template:
      spec:
        containers: [{name: ray-head, image: 'rayproject/ray:2.60.0-py311'}]
  workerGroupSpecs:
  - groupName: tpu7x
    replicas: 1
    minReplicas: 1
    maxReplicas: 1
    numOfHosts: 1
    template:
      spec:
        nodeSelector: {cloud.google.com/gke-tpu-accelerator: tpu7x, cloud.google.com/gke-tpu-topology: 2x2x1}
        containers:
        - name: ray-worker-0
          image: rayproject/ray:2.60.0-py311
          resources: {requests: {google.com/tpu: CHIPS}, limits: {google.com/tpu: CHIPS}}
        - name: ray-worker-1
          image: rayproject/ray:2.60.0-py311
          resources: {requests: {google.com/tpu: CHIPS}, limits: {google.com/tpu: CHIPS}}
"""


@pytest.mark.parametrize("schemas", ["crd", "structural"])
def test_a_realistic_hand_written_multislice_cluster_lints_clean(schemas):
    text = GOOD.read_text(encoding="utf-8")
    assert lint_text(text, str(GOOD), _source(schemas)) == []
    # and it is the kind of manifest the rules look at: break one fact and the right rule fires
    broken = text.replace("numOfHosts: 4", "numOfHosts: 2")
    assert [f.code for f in lint_text(broken, "b.yaml", _source(schemas))] == ["TPF007"]


@pytest.mark.parametrize(("chips", "codes"), [("2", []), ("4", ["TPF005"])])
def test_chips_per_host_counts_the_pod_not_each_container(chips, codes):
    found = lint_text(TPU7X_SPLIT.replace("CHIPS", chips), "split.yaml", fallback_schemas)
    assert [f.code for f in found] == codes, [f.text() for f in found]
    if codes:
        assert "8 google.com/tpu in all" in found[0].message and "use 4" in found[0].message
        assert found[0].path == "spec.workerGroupSpecs[0].template.spec.containers"


@pytest.mark.parametrize(
    ("change", "path", "words"),
    [
        ({"rayStartParams": {"labels": "a=b"}}, "rayStartParams.labels", "group's labels field"),
        ({"rayStartParams": {"redis-username": "u"}}, "rayStartParams.redis-username", "gcsFaultTolerance"),
        (
            {"rayStartParams": {"num-cpus": "8"}, "resources": {"CPU": "8"}},
            "rayStartParams.num-cpus",
            "KubeRay rejects",
        ),
    ],
)
def test_ray_start_params_that_kuberay_itself_rejects(change, path, words):
    doc = yaml.safe_load(EXAMPLES["TPF010"][1])
    doc["spec"]["workerGroupSpecs"][0].update(change)
    found = lint_text(dump_yaml([doc]), "x.yaml", fallback_schemas)
    assert [(f.code, f.path) for f in found] == [("TPF010", f"spec.workerGroupSpecs[0].{path}")]
    assert words in found[0].message


BAD = REPO / "examples" / "bad-raycluster.yaml"


@pytest.mark.parametrize("schemas", ["crd", "structural"])
def test_bad_example_has_exactly_one_finding_per_marked_line(schemas):
    text = BAD.read_text(encoding="utf-8")
    marked = {
        n: m.group(1)
        for n, line in enumerate(text.splitlines(), 1)
        if (m := re.search(r"# wrong: (TPF\d{3})", line))
    }
    found = [(f.line, f.code) for f in lint_text(text, str(BAD), _source(schemas))]
    assert sorted(found) == sorted(marked.items()), [f"{line}: {code}" for line, code in found]
    kuberay = [c for c, r in RULES.items() if not r.name.startswith("launcher-")]  # not `ray up` configs
    assert sorted(marked.values()) == sorted(kuberay)  # one mistake per rule


@pytest.mark.parametrize("schemas", ["crd", "structural"])
def test_a_v1alpha1_object_gets_tpf001_and_no_schema_noise(schemas):
    """The v1alpha1 schema has no numOfHosts and requires rayStartParams: checking the old object
    against it would add TPF009s that TPF001's fix (apiVersion: ray.io/v1) removes."""
    doc = yaml.safe_load(EXAMPLES["TPF007"][1])  # a clean multi-host v1 cluster
    del doc["spec"]["workerGroupSpecs"][0]["rayStartParams"]
    doc["apiVersion"] = "ray.io/v1alpha1"
    found = lint_text(dump_yaml([doc]), "old.yaml", _source(schemas))
    assert [f.code for f in found] == ["TPF001"], [f.text() for f in found]


def test_requests_and_limits_that_differ_do_not_set_off_a_host_count_that_contradicts_them():
    """requests 4 / limits 8 on a v6e 2x4: 8 chips per host is one host, 4 is two. numOfHosts 1 fits
    the limits, so only TPF006 speaks; numOfHosts 3 fits neither, so TPF007 speaks too."""
    doc = yaml.safe_load(EXAMPLES["TPF006"][0])
    assert [f.code for f in lint_text(dump_yaml([doc]), "x.yaml")] == ["TPF006"]
    doc["spec"]["workerGroupSpecs"][0]["numOfHosts"] = 3
    assert sorted(f.code for f in lint_text(dump_yaml([doc]), "x.yaml")) == ["TPF006", "TPF007"]


@pytest.mark.parametrize("schemas", ["crd", "structural"])
def test_no_finding_calls_a_field_unknown_where_another_asks_to_set_it(schemas):
    texts = [BAD.read_text(encoding="utf-8"), *(wrong for wrong, _ in EXAMPLES.values())]
    for text in texts:
        found = lint_text(text, "x.yaml", _source(schemas))
        unknown = {f.path for f in found if f.code == "TPF009" and "is not a field" in f.message}
        others = {f.path for f in found if f.code != "TPF009"}
        assert not unknown & others, [f.text() for f in found]
