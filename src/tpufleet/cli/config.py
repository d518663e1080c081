"""``tpufleet render``, ``tpufleet lint`` and ``tpufleet up|down|attach``: configs in, YAML out.

Thin: read the files, call the pure spec/render/lint layers, write YAML. The only Ray import is
in ``render --check --target gce`` (Ray's own launcher validation), and ``up|down|attach`` run the
``ray`` command through an injectable runner so their command lines are testable.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import yaml

from tpufleet._yamlpos import read_yaml
from tpufleet.cli._app import app, console_err
from tpufleet.errors import InputError, SpecError

if TYPE_CHECKING:
    from tpufleet.lint.crds import SchemaSource
    from tpufleet.spec import FleetSpec

# The render, lint and spec layers (pydantic models, JSON schemas: ~0.1 s of imports) are imported
# by the commands that use them, not by every `tpufleet` command at start-up.

__all__ = [
    "RayRunner",
    "default_gce_dir",
    "dump_yaml",
    "google_credentials",
    "launcher_argv",
    "run_launcher",
    "write_objects",
]

RayRunner = Callable[[list[str]], int]


class Target(StrEnum):
    kuberay = "kuberay"
    gce = "gce"
    observability = "observability"


class Format(StrEnum):
    text = "text"
    json = "json"


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True  # plain YAML for humans and kubectl: no &id001 anchors


def dump_yaml(objects: list[dict[str, Any]]) -> str:
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


def _file_name(obj: dict[str, Any]) -> str:
    return f"{str(obj['kind']).lower()}-{obj['metadata']['name']}.yaml"


def write_objects(objects: list[dict[str, Any]], out_dir: Path, single: str | None = None) -> list[Path]:
    """One file per object (or all in ``single``); returns the paths written. Raises InputError when
    ``out_dir`` cannot be made or written (a file of that name, no permission)."""
    try:
        return _write(objects, out_dir, single)
    except OSError as err:
        raise InputError(f"{out_dir}: cannot write the output there: {err.strerror or err}") from None


def _write(objects: list[dict[str, Any]], out_dir: Path, single: str | None) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    if single:
        path = out_dir / single
        path.write_text(dump_yaml(objects), encoding="utf-8")
        return [path]
    paths = []
    for obj in objects:
        path = out_dir / _file_name(obj)
        path.write_text(dump_yaml([obj]), encoding="utf-8")
        paths.append(path)
    return paths


def _render(
    spec: FleetSpec, target: Target, rayjob: str | None, provider_rbac: bool = False
) -> list[dict[str, Any]]:
    from tpufleet.render.kuberay import render_kuberay
    from tpufleet.render.launcher import render_launcher

    if target is Target.gce:
        if rayjob or provider_rbac:
            raise SpecError("--rayjob and --provider-rbac need --target kuberay")
        return [render_launcher(spec)]
    return render_kuberay(spec, rayjob, provider_rbac=provider_rbac)


def _check(objects: list[dict[str, Any]], target: Target) -> str:
    """Validate the rendered objects; returns what was checked, or raises SpecError."""
    from tpufleet.lint.runner import RAY_KINDS, lint_objects

    if target is Target.gce:
        from ray.autoscaler._private.util import prepare_config, validate_config

        quiet = logging.getLogger("ray.autoscaler")  # prepare_config logs its defaults at INFO
        level = quiet.level
        quiet.setLevel(logging.WARNING)
        try:
            validate_config(prepare_config(copy.deepcopy(objects[0])))
        except Exception as err:  # Ray raises ValueError or jsonschema errors
            raise SpecError(f"Ray's launcher validation rejects the rendered config: {err}") from None
        finally:
            quiet.setLevel(level)
        return "check passed: Ray's cluster launcher accepts the rendered config (its validate_config)"
    schemas = _schemas(None, structural=False)
    findings = lint_objects(objects, schemas)
    if findings:
        raise SpecError(f"the rendered objects do not lint clean: {findings[0].code} {findings[0].message}")
    checked = ", ".join(f"{o['kind']} {o['metadata']['name']}" for o in objects if o.get("kind") in RAY_KINDS)
    rules = "KubeRay's CRDs" if schemas is not None else "the packaged structural rules"
    return f"check passed: {checked}: no lint finding (tpufleet lint's TPU rules and {rules})"


@app.command("render")
def render_cmd(
    spec_file: Annotated[Path, typer.Argument(help="The fleet spec (YAML).", metavar="SPEC")],
    target: Annotated[
        Target,
        typer.Option(
            help="kuberay: GKE objects; gce: a `ray up` config; observability: alert rules "
            "(PrometheusRule and a plain rules file) and a Grafana dashboard."
        ),
    ] = Target.kuberay,
    out: Annotated[
        Path | None, typer.Option("-o", "--out", help="Write files here instead of stdout.")
    ] = None,
    rayjob: Annotated[
        str | None, typer.Option("--rayjob", help="Wrap the cluster in a RayJob running ENTRYPOINT.")
    ] = None,
    check: Annotated[bool, typer.Option(help="Validate the result (CRDs / Ray's launcher).")] = False,
    provider_rbac: Annotated[
        bool,
        typer.Option(
            "--provider-rbac",
            help="Also the ServiceAccount, Role and RoleBinding `tpufleet serve --provider kuberay` "
            "needs (get/patch this RayCluster, list its pods); see docs/provisioning.md.",
        ),
    ] = False,
) -> None:
    """Render a fleet spec as KubeRay objects, a Ray cluster-launcher config for GCE TPU VMs, or
    the fleet's alert rules and Grafana dashboard."""
    from tpufleet.spec import read_spec

    spec = read_spec(spec_file)
    if target is Target.observability:
        _render_observability(spec, out, rayjob, check)
        return
    objects = _render(spec, target, rayjob, provider_rbac)
    passed = _check(objects, target) if check else None
    if out is None:
        typer.echo(dump_yaml(objects), nl=False)
    else:
        single = f"{spec.name}-gce.yaml" if target is Target.gce else None
        for path, obj in zip(write_objects(objects, out, single), objects, strict=False):
            what = (
                "Ray cluster launcher config"
                if target is Target.gce
                else f"{obj['kind']} {obj['metadata']['name']}"
            )
            typer.echo(f"wrote {path} ({what})")
    if passed:  # on stderr: stdout may be the YAML
        console_err.print(passed, highlight=False, markup=False)


def _render_observability(spec: FleetSpec, out: Path | None, rayjob: str | None, check: bool) -> None:
    """PrometheusRule + plain rules file + dashboard JSON; stdout gets the PrometheusRule alone."""
    from tpufleet.render.observability import render_observability

    if rayjob or check:
        raise SpecError("--rayjob and --check need --target kuberay or gce, not observability")
    files = render_observability(spec)
    if out is None:
        rule = next(obj for name, obj in files.items() if name.startswith("prometheusrule-"))
        typer.echo(dump_yaml([rule]), nl=False)
        console_err.print("note: -o DIR also writes the plain rules file and the Grafana dashboard")
        return
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, obj in files.items():
            path = out / name
            text = json.dumps(obj, indent=2) + "\n" if name.endswith(".json") else dump_yaml([obj])
            path.write_text(text, encoding="utf-8")
            typer.echo(f"wrote {path}")
    except OSError as err:
        raise InputError(f"{out}: cannot write the output there: {err.strerror or err}") from None


def _schemas(crds: Path | None, structural: bool) -> SchemaSource | None:
    from tpufleet.lint.crds import find_crd_dir, load_crd_schemas

    if structural:
        return None
    directory = crds or find_crd_dir()
    if directory is None:
        console_err.print("note: KubeRay CRDs not found; checking with the packaged structural rules")
        return None
    if not (directory / "ray.io_rayclusters.yaml").is_file():
        raise InputError(f"{directory}: no KubeRay CRD files (ray.io_rayclusters.yaml, ...)")
    return load_crd_schemas(directory)


@app.command("lint")
def lint_cmd(
    files: Annotated[list[Path], typer.Argument(help="RayCluster/RayJob/RayService YAML, `ray up` configs.")],
    fmt: Annotated[
        Format, typer.Option("--format", help="text: file:line:col: CODE message; json.")
    ] = Format.text,
    crds: Annotated[
        Path | None, typer.Option(help="KubeRay CRD directory (default: ../shared/kuberay).")
    ] = None,
    structural: Annotated[
        bool, typer.Option(help="Use the packaged structural rules, not the CRDs.")
    ] = False,
) -> None:
    """Lint hand-written Ray YAML (RayCluster, RayJob, RayService, `ray up` on GCE) for TPU mistakes.

    Exit codes: 0 clean (warnings at most), 1 error findings, 2 a file that cannot be read or is
    not YAML, or no RayCluster, RayJob or RayService document in any file (nothing was checked).
    A `ray up` config counts as a checked document.
    Each file without one is named on stderr, with what it holds instead."""
    from tpufleet.lint.runner import format_json, format_text, has_errors, lint_file

    schemas = _schemas(crds, structural)
    findings = []
    unchecked = []
    for path in files:
        try:
            text = read_yaml(path)
        except (OSError, UnicodeDecodeError) as err:
            raise InputError(f"{path}: cannot read: {getattr(err, 'strerror', None) or err}") from None
        found, why = lint_file(text, str(path), schemas)
        findings += found
        unchecked += [why] if why else []
    if fmt is Format.json:
        typer.echo(format_json(findings))
    elif findings:
        typer.echo(format_text(findings))
    nothing = len(unchecked) == len(files)  # the run checked nothing at all: exit 2
    for why in unchecked:
        console_err.print(f"{'error' if nothing else 'note'}: {why}", highlight=False, markup=False)
    errors = sum(1 for f in findings if f.severity == "error")
    summary = f"{len(files)} file(s), {len(findings)} finding(s), {errors} error(s)"
    if unchecked:
        summary += f", nothing checked in {len(unchecked)} file(s)"
    console_err.print(summary, highlight=False)
    if nothing:
        raise typer.Exit(2)
    if has_errors(findings):
        raise typer.Exit(1)


# --- the Ray cluster launcher on GCE -----------------------------------------------------------


def launcher_argv(action: str, config: Path, yes: bool = False) -> list[str]:
    """The ``ray`` command line for ``up``/``down``/``attach`` on a rendered config."""
    local = Path(sys.executable).with_name("ray")
    argv = [str(local) if local.exists() else "ray", action, str(config)]
    if yes and action in ("up", "down"):
        argv.append("--yes")
    return argv


def _subprocess_runner(argv: list[str]) -> int:
    return subprocess.call(argv)  # interactive: ray up asks, ray attach opens a shell


def default_gce_dir() -> Path:
    """Where ``up``/``down``/``attach`` keep the rendered config (``ray down`` needs the same file):
    ``$TPUFLEET_GCE_DIR``, else ``~/.cache/tpufleet/gce``; never the working directory."""
    return Path(os.environ.get("TPUFLEET_GCE_DIR") or Path("~/.cache/tpufleet/gce").expanduser())


def google_credentials(action: str = "up") -> None:
    """Application Default Credentials as ``ray <action>`` on GCP will look for them, or an
    InputError that names ``ray <action>``.

    Reads ``$GOOGLE_APPLICATION_CREDENTIALS`` and gcloud's ADC file; on a GCE VM, the metadata
    server. Also fails, in one line, when the launcher's client libraries are missing.
    """
    try:
        import google.auth
        import google_auth_httplib2  # noqa: F401  Ray's GCP launcher imports both
        import googleapiclient  # noqa: F401
    except ImportError as err:
        raise InputError(
            f"`ray {action}` on GCE needs the Google API client ({err.name} is not installed); "
            "reinstall with `make venv` (requirements.lock pins it)"
        ) from None
    from google.auth.exceptions import GoogleAuthError

    try:
        google.auth.default()
    except GoogleAuthError as err:
        cause = str(err).split(". ")[0].rstrip(".")
        raise InputError(
            f"no Google Cloud credentials for `ray {action}` ({cause}): run `gcloud auth application-default "
            "login`, or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file"
        ) from None


def run_launcher(
    action: str,
    spec_file: Path,
    out_dir: Path,
    yes: bool = False,
    runner: RayRunner = _subprocess_runner,
    credentials: Callable[[], None] | None = None,
) -> tuple[Path, list[str], int]:
    """Render the spec for GCE into ``out_dir`` and run ``ray <action>`` on it, once ``credentials``
    (default: :func:`google_credentials` for ``ray <action>``) says Ray's launcher can reach the
    project."""
    from tpufleet.render.launcher import render_launcher
    from tpufleet.spec import read_spec

    spec = read_spec(spec_file)
    config = render_launcher(spec)
    if not str(config["provider"].get("project_id") or "").strip():
        raise SpecError("gce.project_id is empty; set the Google Cloud project the TPU VMs go in")
    if credentials is None:
        google_credentials(action)
    else:
        credentials()
    (path,) = write_objects([config], out_dir, f"{spec.name}-gce.yaml")
    argv = launcher_argv(action, path, yes)
    return path, argv, runner(argv)


def _launcher_command(action: str, doc: str) -> None:
    def command(
        spec_file: Annotated[Path, typer.Argument(help="The fleet spec (YAML).", metavar="SPEC")],
        target: Annotated[
            Target, typer.Option(help="Only gce: KubeRay objects go through kubectl.")
        ] = Target.gce,
        out: Annotated[
            Path | None,
            typer.Option(
                "-o",
                "--out",
                help="Where the rendered config goes (default $TPUFLEET_GCE_DIR or ~/.cache/tpufleet/gce).",
            ),
        ] = None,
        yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    ) -> None:
        if target is not Target.gce:
            raise SpecError(
                f"`tpufleet {action}` drives the GCE launcher; for GKE use "
                "`tpufleet render SPEC --target kuberay -o DIR` and `kubectl apply -f DIR`"
            )
        path, argv, rc = run_launcher(action, spec_file, out or default_gce_dir(), yes)
        console_err.print(f"rendered {path}; ran: {' '.join(argv)}", highlight=False)
        if rc:
            raise typer.Exit(rc)

    command.__doc__ = doc
    app.command(action)(command)


_launcher_command("up", "Render the spec for GCE and run `ray up` on it (creates or updates the TPU VMs).")
_launcher_command("down", "Render the spec for GCE and run `ray down` on it (deletes the cluster).")
_launcher_command("attach", "Render the spec for GCE and run `ray attach` on it (a shell on the head).")
