"""``tpufleet render``, ``lint`` and ``up|down|attach`` through the real entry point."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from spec_builders import EXAMPLE, REPO

from tpufleet.cli.config import default_gce_dir, launcher_argv, run_launcher
from tpufleet.errors import InputError

BAD = REPO / "examples" / "bad-raycluster.yaml"
# google-auth never probes a metadata server from a test: NO_GCE_CHECK must be lowercase "true" for
# google-auth 2.63 to skip the probe, and both metadata addresses point at a closed local port.
NO_CLOUD = {"NO_GCE_CHECK": "true", "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9"}


def no_credentials_env(home: Path) -> dict[str, str]:
    """This environment without any Google credentials: an empty HOME and gcloud config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "CLOUDSDK_"))}
    return {**env, **NO_CLOUD, "HOME": str(home), "CLOUDSDK_CONFIG": str(home / "gcloud")}


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpufleet", *args], capture_output=True, text=True, timeout=120, env=env
    )


def test_render_kuberay_to_stdout_is_multi_document_yaml():
    out = run("render", str(EXAMPLE), "--target", "kuberay")
    assert out.returncode == 0, out.stderr
    docs = list(yaml.safe_load_all(out.stdout))
    assert [d["kind"] for d in docs] == [
        "ServiceAccount",
        "NetworkPolicy",
        "RayCluster",
        "PodMonitor",
        "PrometheusRule",
    ]
    assert "&id" not in out.stdout  # no YAML anchors for kubectl readers


def test_render_to_a_directory_writes_one_file_per_object_and_says_so(tmp_path):
    out = run("render", str(EXAMPLE), "-o", str(tmp_path / "k"), "--rayjob", "python train.py", "--check")
    assert out.returncode == 0, out.stderr
    files = sorted(p.name for p in (tmp_path / "k").iterdir())
    assert files == [
        "networkpolicy-research-fleet-ray.yaml",
        "podmonitor-research-fleet-ray.yaml",
        "prometheusrule-research-fleet-ray.yaml",
        "rayjob-research-fleet-job.yaml",
        "serviceaccount-ray-tpu.yaml",
    ]
    for name in files:
        assert f"wrote {tmp_path / 'k' / name}" in out.stdout
    job = yaml.safe_load((tmp_path / "k" / "rayjob-research-fleet-job.yaml").read_text())
    assert job["spec"]["entrypoint"] == "python train.py"


def test_render_gce_with_rays_check(tmp_path):
    out = run("render", str(EXAMPLE), "--target", "gce", "-o", str(tmp_path), "--check")
    assert out.returncode == 0, out.stderr
    # what passed, and no stray Ray `INFO util.py` line from its validation
    assert out.stderr.splitlines() == [
        "check passed: Ray's cluster launcher accepts the rendered config (its validate_config)"
    ]
    config = yaml.safe_load((tmp_path / "research-fleet-gce.yaml").read_text())
    assert config["provider"]["type"] == "gcp"
    assert "wrote" in out.stdout and "research-fleet-gce.yaml" in out.stdout


def test_rendered_files_lint_clean_through_the_cli(tmp_path):
    assert run("render", str(EXAMPLE), "-o", str(tmp_path)).returncode == 0
    out = run("lint", *map(str, sorted(tmp_path.iterdir())))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == ""


def test_lint_text_and_json_and_exit_codes(tmp_path):
    text = run("lint", str(BAD))
    assert text.returncode == 1
    codes = {line.split(": ")[1].split()[0] for line in text.stdout.splitlines()}
    assert codes == {f"TPF{n:03d}" for n in range(1, 11)}
    first = text.stdout.splitlines()[0]
    assert first.startswith(f"{BAD}:3:1: TPF001 ")
    js = run("lint", str(BAD), "--format", "json")
    assert js.returncode == 1
    findings = json.loads(js.stdout)
    assert set(findings[0]) == {"file", "line", "column", "code", "severity", "path", "message"}
    assert any(
        f["path"] == "spec.workerGroupSpecs[0].template.spec.nodeSelector.cloud.google.com/gke-tpu"
        for f in findings
    )
    missing = run("lint", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr and "Traceback" not in missing.stderr
    (tmp_path / "broken.yaml").write_text("kind: RayCluster\nspec: [\n")
    broken = run("lint", str(tmp_path / "broken.yaml"))
    assert broken.returncode == 2 and "not valid YAML" in broken.stderr


def test_lint_falls_back_to_structural_rules_without_crds(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "TPUFLEET_KUBERAY_CRDS": str(tmp_path / "absent")}
    out = run("lint", str(BAD), "--format", "json", env=env)
    assert out.returncode == 1
    assert "packaged structural rules" in out.stderr
    assert any(f["code"] == "TPF009" and "utilizationThreshold" in f["path"] for f in json.loads(out.stdout))


def test_spec_errors_are_one_line_exit_2(tmp_path):
    bad = tmp_path / "fleet.yaml"
    bad.write_text(EXAMPLE.read_text().replace("type: v4-16", "typ: v4-16"))
    out = run("render", str(bad))
    assert out.returncode == 2
    assert f"{bad}:9: pools[0].typ: unknown field 'typ'; did you mean type?" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("action", "yes", "tail"),
    [
        ("up", True, ["up", "CONFIG", "--yes"]),
        ("down", False, ["down", "CONFIG"]),
        ("attach", True, ["attach", "CONFIG"]),
    ],
)
def test_up_down_attach_run_ray_on_the_rendered_file(tmp_path, action, yes, tail):
    calls: list[list[str]] = []

    def runner(argv: list[str]) -> int:
        calls.append(argv)
        return 3

    path, argv, rc = run_launcher(action, EXAMPLE, tmp_path, yes=yes, runner=runner, credentials=lambda: None)
    assert rc == 3 and calls == [argv]
    assert path == tmp_path / "research-fleet-gce.yaml"
    assert Path(argv[0]).name == "ray"
    assert argv[1:] == [str(path) if t == "CONFIG" else t for t in tail]
    assert yaml.safe_load(path.read_text())["cluster_name"] == "research-fleet"


def test_launcher_prefers_the_venvs_ray():
    argv = launcher_argv("up", Path("c.yaml"))
    local = Path(sys.executable).with_name("ray")
    assert argv[0] == (str(local) if local.exists() else "ray")
    assert shutil.which(argv[0]) or Path(argv[0]).exists()


def test_up_refuses_kuberay_target():
    out = run("up", str(EXAMPLE), "--target", "kuberay")
    assert out.returncode == 2 and "kubectl apply" in out.stderr


def test_an_output_path_that_is_a_file_is_one_line_exit_2(tmp_path):
    (tmp_path / "taken").write_text("x")
    out = run("render", str(EXAMPLE), "-o", str(tmp_path / "taken"))
    assert out.returncode == 2 and "cannot write the output there" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("action", ["up", "down", "attach"])
def test_launcher_without_google_credentials_is_one_line_exit_2_before_ray_runs(tmp_path, action):
    env = no_credentials_env(tmp_path / "home")
    out = subprocess.run(
        [sys.executable, "-m", "tpufleet", action, str(EXAMPLE), "--target", "gce"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert (
        "no Google Cloud credentials" in out.stderr and "gcloud auth application-default login" in out.stderr
    )
    assert f"for `ray {action}`" in out.stderr  # `down` once spoke of credentials for `ray up`
    assert "Traceback" not in out.stderr and "ray" not in out.stdout
    assert [p.name for p in tmp_path.iterdir()] == []  # nothing written: not in the cwd, not in HOME


def test_the_credentials_check_runs_before_ray_and_nothing_is_written(tmp_path):
    calls: list[list[str]] = []

    def no_credentials() -> None:
        raise InputError("no Google Cloud credentials")

    with pytest.raises(InputError):
        run_launcher("up", EXAMPLE, tmp_path / "out", runner=calls.append, credentials=no_credentials)  # type: ignore[arg-type]
    assert calls == [] and not (tmp_path / "out").exists()


def test_the_rendered_launcher_config_goes_to_a_state_dir_not_the_working_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("TPUFLEET_GCE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_gce_dir() == tmp_path / ".cache" / "tpufleet" / "gce"
    monkeypatch.setenv("TPUFLEET_GCE_DIR", str(tmp_path / "gce"))
    assert default_gce_dir() == tmp_path / "gce"
