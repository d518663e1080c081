"""``tpufleet lint`` on Ray cluster-launcher configs (GCE TPU VMs): each TPU node-type mistake is
found on its line, clean configs (and ``render --target gce`` output) are clean, and a generation
the catalog does not know (v2, v3) is reported as not checked, never as wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from tpufleet.cli import command
from tpufleet.lint.runner import lint_file

REPO = Path(__file__).resolve().parents[2]

# A head VM and two TPU node types, in the shape of Ray's GCP TPU examples (our own YAML).
CLEAN = """\
cluster_name: tpu-research
max_workers: 6
provider:
  type: gcp
  region: us-central2
  availability_zone: us-central2-b
  project_id: my-project
available_node_types:
  ray_head_default:
    resources: {"CPU": 2}
    node_config:
      machineType: n2-standard-4
  ray_tpu_pod:
    min_workers: 0
    max_workers: 2
    resources: {"TPU": 4}
    node_config:
      acceleratorType: v4-16
      runtimeVersion: tpu-ubuntu2204-base
  ray_tpu_cube:
    min_workers: 1
    max_workers: 4
    resources: {"TPU": 4}
    node_config:
      acceleratorConfig:
        type: V4
        topology: 2x2x2
      runtimeVersion: tpu-ubuntu2204-base
head_node_type: ray_head_default
"""


def lint(text: str) -> list[tuple[int, str, str]]:
    findings, why = lint_file(text, "c.yaml")
    assert why is None
    return [(f.line, f.code, f.message) for f in findings]


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_a_clean_launcher_config_is_clean() -> None:
    assert lint(CLEAN) == []


@pytest.mark.parametrize(
    ("old", "new", "code", "says"),
    [
        ("acceleratorType: v4-16", "acceleratorType: v4-12", "TPF011", "v4-12 is not a v4 slice size"),
        ("acceleratorType: v4-16", "acceleratorType: v9-16", "TPF011", "v9"),
        ("topology: 2x2x2", "topology: 2x2x3", "TPF011", "2x2x3 is not a v4 topology"),
        ("type: V4", "type: TPUV4", "TPF011", "'TPUV4' is not a TPU type"),
        (
            "runtimeVersion: tpu-ubuntu2204-base\n  ray_tpu_cube",
            "runtimeVersion: v2-alpha-tpuv6e\n  ray_tpu_cube",
            "TPF012",
            "v2-alpha-tpuv6e is the v6e TPU software",
        ),
        (
            'resources: {"TPU": 4}\n    node_config:\n      acceleratorType',
            'resources: {"TPU": 16}\n    node_config:\n      acceleratorType',
            "TPF013",
            "has 4 chips",
        ),
        ("max_workers: 4", "max_workers: 0", "TPF014", "max_workers 0 is below min_workers 1"),
        ("max_workers: 2", "max_workers: 9", "TPF014", "exceeds the cluster's max_workers 6"),
    ],
    ids=[
        "bad-size",
        "bad-generation",
        "bad-topology",
        "bad-config-type",
        "runtime",
        "resources",
        "max-below-min",
        "max-above-cluster",
    ],
)
def test_each_tpu_mistake_is_found_on_its_line(old: str, new: str, code: str, says: str) -> None:
    assert old in CLEAN
    text = CLEAN.replace(old, new, 1)
    found = lint(text)
    assert len(found) == 1, found
    line, got, message = found[0]
    assert got == code and says in message
    assert line == line_of(text, new.splitlines()[0].strip())


def test_both_accelerator_type_and_config_is_an_error() -> None:
    text = CLEAN.replace(
        "      acceleratorType: v4-16\n",
        "      acceleratorType: v4-16\n      acceleratorConfig: {type: V4, topology: 2x2x2}\n",
    )
    assert [(c, "both set" in m) for _, c, m in lint(text)] == [("TPF011", True)]


def test_a_missing_runtime_version_is_an_error() -> None:
    text = CLEAN.replace(
        "      acceleratorType: v4-16\n      runtimeVersion: tpu-ubuntu2204-base\n",
        "      acceleratorType: v4-16\n",
    )
    assert [c for _, c, _ in lint(text)] == ["TPF012"]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("acceleratorType: v4-16", "acceleratorType: v3-8"),
        ("acceleratorType: v4-16", "acceleratorType: v2-32"),
        ("type: V4", "type: V3"),
    ],
)
def test_a_generation_the_catalog_does_not_know_is_not_checked_never_wrong(
    tmp_path: Path, old: str, new: str
) -> None:
    text = CLEAN.replace(old, new, 1)
    findings, _ = lint_file(text, "c.yaml")
    assert [(f.code, f.severity) for f in findings] == [("TPF015", "info")]
    assert "not checked" in findings[0].message
    assert findings[0].line == line_of(text, new.strip())
    path = tmp_path / "launcher.yaml"
    path.write_text(text)
    result = CliRunner().invoke(command(), ["lint", "--structural", str(path)])
    assert result.exit_code == 0, result.output  # an info finding is no error


def test_the_cli_counts_a_launcher_config_as_checked(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(CLEAN.replace("max_workers: 4", "max_workers: 0"))
    result = CliRunner().invoke(command(), ["lint", "--structural", str(path)])
    assert result.exit_code == 1
    assert f"{path}:{line_of(path.read_text(), 'max_workers: 0')}:" in result.output
    assert "nothing checked" not in result.output
    path.write_text(CLEAN)
    assert CliRunner().invoke(command(), ["lint", "--structural", str(path)]).exit_code == 0


def test_render_target_gce_output_lints_clean(tmp_path: Path) -> None:
    rendered = CliRunner().invoke(
        command(), ["render", str(REPO / "examples" / "fleet.yaml"), "--target", "gce"]
    )
    assert rendered.exit_code == 0, rendered.output
    assert "acceleratorType" in rendered.stdout
    path = tmp_path / "gce.yaml"
    path.write_text(rendered.stdout)
    result = CliRunner().invoke(command(), ["lint", "--structural", str(path)])
    assert result.exit_code == 0, result.output
    assert "0 finding(s)" in result.output


def test_ray_examples_shape_a_tpu_token_and_an_older_v4_runtime_lint_clean() -> None:
    """Ray's GCP TPU pod examples claim {"TPU": 1} as a scheduling token and use an older v4
    image; neither is wrong. More chips than a host has is."""
    text = CLEAN.replace('{"TPU": 4}', '{"TPU": 1}').replace("tpu-ubuntu2204-base", "tpu-vm-v4-base")
    assert lint(text) == []
    assert [c for _, c, _ in lint(CLEAN.replace('{"TPU": 4}', '{"TPU": 0}', 1))] == ["TPF013"]
