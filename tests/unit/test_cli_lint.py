"""``tpufleet lint`` on files it checks nothing in, and ``render --check`` saying what passed, in
process. A Deployment, the fleet spec itself or an empty file used to be ``1 file(s), 0 finding(s),
0 error(s)``, exit 0: now each such file is named with what it holds, and a run that checked
nothing exits 2 (1 stays "error findings", 0 "clean")."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from spec_builders import EXAMPLE, REPO

from tpufleet.cli import command
from tpufleet.lint.runner import lint_file

GOOD = REPO / "examples" / "good-raycluster.yaml"
BAD = REPO / "examples" / "bad-raycluster.yaml"
DEPLOYMENT = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n"


def tpufleet(*args: str) -> Result:
    return CliRunner().invoke(command(), list(args))


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (DEPLOYMENT, "no RayCluster, RayJob or RayService document (found Deployment): nothing checked"),
        ("", "no YAML document in it: nothing checked (lint checks RayCluster, RayJob and RayService"),
        ("# only a comment\n---\n", "no YAML document in it: nothing checked"),
        (EXAMPLE.read_text(), "a tpufleet fleet spec: nothing checked"),
        ("a: 1\n", "no RayCluster, RayJob or RayService document (no document has a kind): nothing checked"),
    ],
    ids=["deployment", "empty", "comment", "fleet-spec", "no-kind"],
)
def test_a_file_with_nothing_to_check_is_named_and_the_run_exits_2(
    tmp_path: Path, text: str, says: str
) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(text)
    result = tpufleet("lint", str(path), "--structural")
    assert result.exit_code == 2, result.output
    assert f"error: {path}: {says}" in result.stderr
    assert "nothing checked in 1 file(s)" in result.stderr and result.stdout == ""


def test_the_fleet_spec_is_pointed_at_render_check(tmp_path: Path) -> None:
    result = tpufleet("lint", str(EXAMPLE), "--structural")
    assert f"check a fleet spec with `tpufleet render {EXAMPLE} --check`" in result.stderr


def test_beside_a_checked_file_one_with_nothing_is_a_note_and_the_exit_is_the_findings(
    tmp_path: Path,
) -> None:
    (tmp_path / "dep.yaml").write_text(DEPLOYMENT)
    clean = tpufleet("lint", str(GOOD), str(tmp_path / "dep.yaml"), "--structural")
    assert clean.exit_code == 0, clean.output
    assert f"note: {tmp_path / 'dep.yaml'}: no RayCluster" in clean.stderr
    bad = tpufleet("lint", str(BAD), str(tmp_path / "dep.yaml"), "--structural", "--format", "json")
    assert bad.exit_code == 1 and bad.stdout.startswith("[")


def test_lint_file_says_nothing_when_it_checked_something() -> None:
    findings, why = lint_file(GOOD.read_text(), str(GOOD))
    assert (findings, why) == ([], None)


def test_the_exit_codes_are_in_the_help() -> None:
    page = " ".join(tpufleet("lint", "--help").stdout.split())
    assert "Exit codes: 0 clean (warnings at most), 1 error findings, 2 a file" in page
    assert "no RayCluster, RayJob or RayService document in any file (nothing was checked)" in page


def test_render_check_says_what_it_checked_and_that_it_passed(tmp_path: Path) -> None:
    no_crds = {"TPUFLEET_KUBERAY_CRDS": str(tmp_path / "absent")}  # the packaged rules: quick
    wrote = CliRunner(env=no_crds).invoke(command(), ["render", str(EXAMPLE), "--check", "-o", str(tmp_path)])
    assert wrote.exit_code == 0, wrote.output
    assert wrote.stderr.splitlines()[-1] == (
        "check passed: RayCluster research-fleet: no lint finding "
        "(tpufleet lint's TPU rules and the packaged structural rules)"
    )
    job = CliRunner(env=no_crds).invoke(
        command(), ["render", str(EXAMPLE), "--check", "--rayjob", "python t.py"]
    )
    assert "check passed: RayJob research-fleet-job: no lint finding" in job.stderr
    assert "check passed" not in job.stdout  # stdout is the YAML alone
    plain = tpufleet("render", str(EXAMPLE), "-o", str(tmp_path / "plain"))
    assert "check passed" not in plain.output
