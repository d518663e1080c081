"""The fleet spec: the issue's example loads, every generation resolves, and every mistake is located."""

from __future__ import annotations

import os

import pytest
import yaml
from spec_builders import EXAMPLE, GENERATION_CASES, load_fleet, pool, spec_dict

from tpufleet.errors import InputError, SpecError
from tpufleet.spec import load_spec, read_spec


def test_the_issue_example_loads_with_its_values():
    spec = read_spec(EXAMPLE)
    assert (spec.name, spec.namespace, spec.ray.version) == ("research-fleet", "ml", "2.60.0")
    v4, v6e = spec.pools
    assert (v4.slice_type.accelerator_type, v4.min_count, v4.slices, v4.max_count) == ("v4-16", 1, 2, 4)
    assert (v6e.slice_type.accelerator_type, v6e.min_count, v6e.max_count, v6e.spot) == ("v6e-16", 1, 1, True)
    assert spec.autoscaling.upscaling == "Conservative" and spec.autoscaling.idle_timeout_s == 600
    assert [(t.name, t.quota, t.weight) for t in spec.tenants] == [
        ("research", {"v4": 32}, 2.0),
        ("prod", {"v6e": 16}, 1.0),
    ]
    assert spec.service_account is not None and spec.service_account.name == "ray-tpu"


@pytest.mark.parametrize("case", GENERATION_CASES, ids=lambda c: c.id)
def test_every_generation_resolves_through_the_catalog(case):
    (p,) = load_fleet([pool("p", **case.pool)]).pools
    st = p.slice_type
    assert (st.gke_accelerator, str(st.topology), st.chips_per_host, st.hosts) == (
        case.accelerator,
        case.topology,
        case.chips_per_host,
        case.hosts,
    )


def _text(**over):
    return yaml.safe_dump(spec_dict(**over), sort_keys=False)


# (what to change, expected line, expected field, words the message must contain)
ERRORS = [
    (
        {"pools": [{"name": "p", "typ": "v4-16"}]},
        5,
        "pools[0].typ",
        ["unknown field 'typ'", "did you mean type"],
    ),
    ({"nmae": "x"}, 12, "nmae", ["did you mean name"]),
    (
        {"pools": [pool("p", type="v4-17")]},
        5,
        "pools[0].type",
        ["v4-17 is not a v4 slice size", "v4-16, v4-32"],
    ),
    (
        {"pools": [pool("p", generation="v6e", topology="3x3")]},
        6,
        "pools[0].topology",
        ["not a v6e topology"],
    ),
    (
        {"pools": [pool("p", generation="v7", topology="2x2")]},
        5,
        "pools[0].generation",
        ["not a TPU generation"],
    ),
    (
        {"pools": [pool("p", generation="v6e", topology="2x4", machine_type="ct6e-standard-1t")]},
        7,
        "pools[0].machine_type",
        ["cannot run", "ct6e-standard-8t or ct6e-standard-4t"],
    ),
    ({"pools": [pool("p", generation="v6e")]}, 4, "pools[0].topology", ["generation + topology"]),
    ({"pools": [pool("p", type="v4-16", topology="2x2x2")]}, 5, "pools[0].type", ["not both"]),
    ({"pools": [pool("p", type="v4-16", slices=2, max_slices=1)]}, 7, "pools[0].max_slices", ["2 <= 1"]),
    # a billion slices rendered and linted clean; KubeRay's replicas are an int32 the API server checks
    (
        {"pools": [pool("p", type="v4-16", slices=2, max_slices=10**9)]},
        7,
        "pools[0].max_slices",
        ["less than or equal to 100000", "got 1000000000"],
    ),
    (
        {"pools": [pool("p", type="v4-16", slices=1, min_slices=0, max_slices=3)]},
        7,
        "pools[0].min_slices",
        ["autoscaling.enabled is false"],
    ),
    ({"pools": [pool("P_1", type="v4-16")]}, 4, "pools[0].name", ["DNS-1123", "'p-1'"]),
    ({"pools": [pool("p", type="v4-16"), pool("p", type="v5p-8")]}, 6, "pools[1].name", ["used twice"]),
    ({"namespace": "ML"}, 2, "namespace", ["not a valid name"]),
    ({"head": {"cpu": 4, "memory": "16GB"}}, 14, "head.memory", ["did you mean 16Gi"]),
    ({"head": {"cpu": "four"}}, 13, "head.cpu", ["Kubernetes cpu quantity"]),
    ({"tenants": [{"name": "t", "quota": {"v5p": 8}}]}, 15, "tenants[0].quota.v5p", ["no pool offers v5p"]),
    ({"tenants": [{"name": "t", "quota": {"v44": 8}}]}, 15, "tenants[0].quota.v44", ["not a TPU generation"]),
    ({"autoscaling": {"upscaling": "Slow"}}, 13, "autoscaling.upscaling", ["Conservative"]),
    (
        {"service_account": {"name": "sa", "gcp_service_account": "me@gmail.com"}},
        8,
        "service_account.gcp_service_account",
        ["not a Google service account"],
    ),
    ({"ray": {"version": "latest"}}, 13, "ray.version", ["not a Ray release"]),
    ({"name": "1fleet"}, 1, "name", ["cannot name a RayCluster", "DNS-1035"]),
    (
        {"network_policy": {"operator_namespace": "Kube Ray"}},
        13,
        "network_policy.operator_namespace",
        ["'kube-ray'"],
    ),
    ({"monitoring": {"namespace": "mon_1"}}, 13, "monitoring.namespace", ["not a valid name"]),
    ({"name": "f" * 44}, 1, "name", ["at most 43 characters"]),
]


@pytest.mark.parametrize(("over", "line", "field", "words"), ERRORS, ids=[e[2] for e in ERRORS])
def test_errors_name_file_line_and_field(over, line, field, words):
    text = _text(**over)
    with pytest.raises(SpecError) as info:
        load_spec(text, "fleet.yaml")
    err = info.value
    assert (err.file, err.field) == ("fleet.yaml", field), str(err)
    assert err.line == line, f"{err} (text:\n{text})"
    assert str(err).startswith(f"fleet.yaml:{line}: {field}: ")
    for word in words:
        assert word in str(err)


def test_quota_accepts_generation_aliases_and_weights_must_be_positive():
    spec = load_fleet(tenants=[{"name": "t", "quota": {"v4": 16}, "weight": 0.5}])
    assert spec.tenants[0].quota == {"v4": 16}
    with pytest.raises(SpecError, match=r"tenants\[0\].weight"):
        load_fleet(tenants=[{"name": "t", "weight": 0}])


def test_not_yaml_and_not_a_mapping_are_input_errors(tmp_path):
    with pytest.raises(InputError, match=r"f.yaml:2:5: not valid YAML: mapping values are not allowed"):
        load_spec("name: a\nb: c: d\n", "f.yaml")
    with pytest.raises(SpecError, match="one YAML mapping"):
        load_spec("- a\n- b\n", "f.yaml")
    with pytest.raises(InputError, match="cannot read"):
        read_spec(tmp_path / "missing.yaml")


def test_a_tag_the_safe_loader_refuses_is_one_line_at_its_own_line_and_never_runs() -> None:
    marker = "/tmp/tpufleet-yaml-tag-ran"
    text = f'name: x\npools: !!python/object/apply:os.system ["touch {marker}"]\n'
    with pytest.raises(InputError) as err:
        load_spec(text, "evil.yaml")
    said = str(err.value)  # was two lines (PyYAML's own mark) at line 1, the document's
    assert said.startswith("evil.yaml:2:8: not valid YAML: could not determine a constructor for the tag")
    assert "\n" not in said
    assert not os.path.exists(marker)


def test_the_longest_fleet_name_fits_kuberays_limits():
    spec = load_fleet(name="f" * 43)
    assert len(spec.name) == 43 and len(f"{spec.name}-job") == 47  # KubeRay's RayJob name limit


def test_two_typos_are_both_shown_each_on_its_line():
    text = EXAMPLE.read_text().replace("type: v4-16", "typ: v4-16").replace("weight: 2", "wieght: 2")
    with pytest.raises(SpecError) as info:
        load_spec(text, "fleet.yaml")
    assert str(info.value).splitlines() == [
        "fleet.yaml:9: pools[0].typ: unknown field 'typ'; did you mean type?",
        "fleet.yaml:13: tenants[0].wieght: unknown field 'wieght'; did you mean weight?",
    ]  # once: the first, then "(and 1 more problem)"
    assert (info.value.line, info.value.field) == (9, "pools[0].typ")


def test_past_five_problems_the_rest_are_counted():
    pools = [{"name": f"p{i}", "typ": "v4-8"} for i in range(7)]
    with pytest.raises(SpecError) as info:
        load_spec(yaml.safe_dump({"name": "f", "pools": pools}), "fleet.yaml")
    lines = str(info.value).splitlines()
    assert len(lines) == 6 and lines[-1] == "(and 2 more problems)"
