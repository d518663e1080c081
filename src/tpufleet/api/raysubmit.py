"""Ray's job submission, in tpufleet's words and back: pure, no I/O (``api/rayjobs.py`` serves it).

**In.** A body of Ray 2.60's ``JobSubmitRequest`` becomes the fields of a tpufleet Ray job
(:func:`translate`, then ``JobRequest.build``, the one path into the store):

- the slices: ``entrypoint_resources`` naming a slice head as Ray does (``{"TPU-v4-16-head": 2}``:
  two v4-16 slices; a ``TPU`` count beside it is ignored: the admitted slices' chips are the job's),
  or the metadata keys ``tpufleet.accelerator_type`` and ``tpufleet.num_slices``; no shape, two
  shapes or an unknown one is a one-line refusal with the closest valid head;
- ``tpufleet.priority``, ``tpufleet.max_retries``, ``tpufleet.name`` (default: the submission id)
  and, with the admin token, ``tpufleet.tenant``; any other ``tpufleet.`` key is refused (a typo
  would be silently ignored otherwise); other metadata is kept and shown back;
- ``runtime_env``: ``working_dir`` (a package the tenant uploaded through the package API, which is
  what ``ray job submit --working-dir DIR`` does, or a URL the operator allows; never a path),
  ``env_vars`` (the job's ``env``, same rules), ``excludes`` (already applied by the client's
  upload) and ``config`` (Ray's setup options, ignored); any other key (``pip``, ``py_modules``,
  ``conda``, ...) is refused, naming these;
- the entrypoint: a plain command line is split into the job's command; one with shell syntax runs
  as ``sh -c ENTRYPOINT``, as Ray's job supervisor runs it through a shell;
- ``entrypoint_num_cpus`` and ``entrypoint_memory`` are ignored (the driver runs on the Ray head,
  not on a TPU host); GPUs and label selectors are refused.

**Out.** :func:`details` is Ray's ``JobDetails`` of a job; :func:`ray_status` maps the lifecycle
onto Ray's ``JobStatus``: ``PENDING`` while queued, admitted or starting (the message says why it
waits, as ``tpufleet job`` does), ``RUNNING``, ``SUCCEEDED``, ``FAILED``, ``STOPPED`` for a cancel.
"""

from __future__ import annotations

import re
import secrets
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tpufleet import catalog
from tpufleet.control.store.raysubmissions import RaySubmission
from tpufleet.control.store.values import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED, TERMINAL
from tpufleet.errors import NotFoundError, SpecError

__all__ = [
    "META_KEYS",
    "RAY_VERSION",
    "JobSubmitBody",
    "Translated",
    "details",
    "new_submission_id",
    "ray_status",
    "translate",
]

RAY_VERSION = "2.60.0"  # the pinned Ray (pyproject.toml) whose job API this serves
JOBS_API_VERSION = "4"  # Ray's CURRENT_VERSION of the job API (dashboard/modules/version.py)
META = "tpufleet."
META_KEYS = ("accelerator_type", "num_slices", "priority", "max_retries", "name", "tenant")
HEAD = re.compile(r"TPU-(.+)-head")
SUBMISSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@+-]{0,127}")
RAY_PACKAGE = re.compile(r"_ray_pkg_[0-9A-Za-z_-]{1,100}\.zip")
RUNTIME_ENV_KEYS = ("working_dir", "env_vars", "excludes", "config")
SHELL_SYNTAX = set("|&;<>()$`\\\"'*?[]#~!{}\n")
MAX_METADATA = 64  # keys
MAX_METADATA_BYTES = 64 * 1024  # keys and values together


class JobSubmitBody(BaseModel):
    """Ray's ``JobSubmitRequest`` (dashboard/modules/job/common.py): a field it lacks is a 422, as
    Ray refuses one (a TypeError there)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    entrypoint: str = Field(description="the shell command of the driver, e.g. 'python train.py'")
    submission_id: str | None = Field(None, description="default: raysubmit_<16 characters>")
    job_id: str | None = Field(None, description="deprecated by Ray: submission_id")
    runtime_env: dict[str, Any] | None = Field(None, description="working_dir, env_vars, excludes")
    metadata: dict[str, str] | None = Field(None, description="tpufleet.* keys choose the slices")
    entrypoint_num_cpus: int | float | None = Field(None, description="ignored: the driver runs on the head")
    entrypoint_num_gpus: int | float | None = Field(None, description="refused unless 0")
    entrypoint_memory: int | None = Field(None, description="ignored: the driver runs on the head")
    entrypoint_resources: dict[str, int | float] | None = Field(
        None, description='the slices: {"TPU-<accelerator type>-head": <number of slices>}'
    )
    entrypoint_label_selector: dict[str, str] | None = Field(None, description="refused unless empty")


@dataclass(frozen=True)
class Translated:
    """A Ray submission as a tpufleet Ray job: ``fields`` for ``JobRequest.build``, and what Ray's
    clients read back (``entrypoint``, ``metadata``, ``runtime_env``)."""

    submission_id: str
    fields: dict[str, Any]
    entrypoint: str
    metadata: dict[str, str] = field(default_factory=dict)
    runtime_env: dict[str, Any] = field(default_factory=dict)


def new_submission_id(draw: Callable[[int], str] | None = None) -> str:
    """``raysubmit_`` and 16 characters, as Ray makes them (no I, l, o, O, 0)."""
    alphabet = "".join(c for c in string.ascii_letters + string.digits if c not in "IloO0")
    text = draw(16) if draw else "".join(secrets.choice(alphabet) for _ in range(16))
    return f"raysubmit_{text}"


def translate(
    body: JobSubmitBody,
    *,
    package_of: Callable[[str], str | None],
    example: Callable[[], str] = lambda: "v4-16",
    new_id: Callable[[], str] = new_submission_id,
) -> Translated:
    """``body`` as a tpufleet Ray job. ``package_of(uri)``: the caller's package id uploaded under a
    ``gcs://_ray_pkg_...zip`` URI (None: none); ``example()``: the slice type a refusal of the
    shape suggests (one the fleet has), read only for a refusal. Raises a one-line ``SpecError``
    or ``NotFoundError``."""
    sid = body.submission_id or body.job_id or new_id()
    if not SUBMISSION_ID.fullmatch(sid):
        raise SpecError(
            f"{sid[:60]!r} is not a submission id here: 1 to 128 letters, digits and _.:@+- "
            "(starting with a letter or digit)",
            field="submission_id",
        )
    metadata = _metadata(body.metadata or {})
    _check_resources_fields(body)
    accelerator_type, num_slices = _shape(body.entrypoint_resources or {}, metadata, example)
    env, working_dir = _runtime_env(body.runtime_env or {}, package_of)
    fields: dict[str, Any] = {
        "command": command_of(body.entrypoint),
        "accelerator_type": accelerator_type,
        "num_slices": num_slices,
        "name": metadata.get(META + "name") or sid,
        "env": env,
        "working_dir": working_dir,
        "kind": "ray",
    }
    for key in ("priority", "max_retries"):
        if META + key in metadata:
            fields[key] = _whole(metadata[META + key], f"metadata.{META}{key}")
    return Translated(
        submission_id=sid,
        fields=fields,
        entrypoint=body.entrypoint,
        metadata=metadata,
        runtime_env=dict(body.runtime_env or {}),
    )


def command_of(entrypoint: str) -> list[str]:
    """The job's command for Ray's entrypoint (a shell command line): its words when it is a plain
    command line, else ``sh -c ENTRYPOINT`` (pipes, ``&&``, quotes, variables keep their meaning)."""
    if not isinstance(entrypoint, str) or not entrypoint.strip():
        raise SpecError("a job needs an entrypoint, e.g. python train.py", field="entrypoint")
    words = entrypoint.split()
    if SHELL_SYNTAX.isdisjoint(entrypoint) and "=" not in words[0]:  # FOO=1 cmd: a shell assignment
        return words
    return ["sh", "-c", entrypoint]


def _metadata(metadata: Mapping[str, str]) -> dict[str, str]:
    if len(metadata) > MAX_METADATA:
        raise SpecError(f"{len(metadata)} keys; at most {MAX_METADATA}", field="metadata")
    size = sum(len(k.encode()) + len(v.encode()) for k, v in metadata.items())
    if size > MAX_METADATA_BYTES:
        raise SpecError(f"{size:,} bytes; at most {MAX_METADATA_BYTES:,}", field="metadata")
    known = [META + k for k in META_KEYS]
    for key in metadata:
        if key.startswith(META) and key not in known:
            near = [k for k in known if k.startswith(key[: len(META) + 3])] or list(known)
            raise SpecError(
                f"{key[:60]!r} is not a tpufleet key; use one of {', '.join(near)}", field="metadata"
            )
    return dict(metadata)


def _check_resources_fields(body: JobSubmitBody) -> None:
    if body.entrypoint_num_gpus:
        raise SpecError(
            "a TPU fleet has no GPUs; name TPU slices in entrypoint_resources", field="entrypoint_num_gpus"
        )
    if body.entrypoint_label_selector:
        raise SpecError(
            "not supported: tpufleet places the job on the slices it admits "
            "(name them in entrypoint_resources)",
            field="entrypoint_label_selector",
        )


def _shape(
    resources: Mapping[str, float], metadata: Mapping[str, str], example: Callable[[], str]
) -> tuple[str, int]:
    """(accelerator type, number of slices) from the resources and the metadata, which must agree."""
    heads: dict[str, float] = {}
    for key, amount in resources.items():
        if key == "TPU":
            continue
        match = HEAD.fullmatch(key)
        if match is None:
            shape = example()
            raise SpecError(
                f"{key[:60]!r} is not a TPU slice head; name the slices as Ray does, e.g. "
                f'{{"TPU-{shape}-head": 1}} for one {shape} slice',
                field="entrypoint_resources",
            )
        heads[_head_type(match.group(1), key)] = amount
    if len(heads) > 1:
        raise SpecError(
            f"names {len(heads)} slice types ({', '.join(sorted(heads))}); a job runs on slices of one type",
            field="entrypoint_resources",
        )
    wanted = metadata.get(META + "accelerator_type")
    if wanted is not None:
        wanted = _meta_type(wanted)
    count = metadata.get(META + "num_slices")
    n = _whole(count, f"metadata.{META}num_slices") if count is not None else None
    if heads:
        ((head_type, amount),) = heads.items()
        if wanted is not None and wanted != head_type:
            raise SpecError(
                f"entrypoint_resources names {head_type} but metadata {META}accelerator_type "
                f"{wanted}; give one",
                field="entrypoint_resources",
            )
        slices = _whole(amount, f"entrypoint_resources.TPU-{head_type}-head")
        if n is not None and n != slices:
            raise SpecError(
                f"entrypoint_resources asks for {slices} slices but metadata {META}num_slices {n}; give one",
                field="entrypoint_resources",
            )
        return head_type, slices
    if wanted is None:
        shape = example()
        raise SpecError(
            f"the submission names no TPU slice: give entrypoint_resources "
            f'{{"TPU-{shape}-head": 1}} (one {shape} slice; ray job submit --entrypoint-resources) '
            f"or metadata {META}accelerator_type={shape}",
            field="entrypoint_resources",
        )
    return wanted, 1 if n is None else n


def _head_type(text: str, key: str) -> str:
    try:
        return catalog.slice_type(text).accelerator_type
    except SpecError as err:
        near = [f"TPU-{c}-head" for c in err.choices]
        hint = f"; closest: {', '.join(near)}" if near else f" ({err})"
        raise SpecError(f"{key[:60]} is not a TPU slice{hint}", field="entrypoint_resources") from None


def _meta_type(text: str) -> str:
    try:
        return catalog.slice_type(text).accelerator_type
    except SpecError as err:
        raise SpecError(str(err), field=f"metadata.{META}accelerator_type") from None


def _whole(value: object, where: str) -> int:
    if isinstance(value, bool):
        raise SpecError(f"{value!r} is not a whole number", field=where)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if re.fullmatch(r"-?\d{1,9}", text):
        return int(text)
    raise SpecError(f"{str(value)[:40]!r} is not a whole number", field=where)


def _runtime_env(
    env: Mapping[str, Any], package_of: Callable[[str], str | None]
) -> tuple[dict[str, str], str | None]:
    """The job's ``env`` and ``working_dir`` from a runtime_env (see the module's docstring)."""
    for key in env:
        if key not in RUNTIME_ENV_KEYS:
            raise SpecError(
                f"{str(key)[:40]!r} is not supported by tpufleet; a runtime_env may give "
                f"{', '.join(RUNTIME_ENV_KEYS)} (ship modules and requirements in the working_dir)",
                field="runtime_env",
            )
    variables = env.get("env_vars") or {}
    if not isinstance(variables, dict):
        raise SpecError("must be an object of NAME: value strings", field="runtime_env.env_vars")
    return dict(variables), _working_dir(env.get("working_dir"), package_of)


def _working_dir(value: object, package_of: Callable[[str], str | None]) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise SpecError(f"must be a string, got {type(value).__name__}", field="runtime_env.working_dir")
    if value.startswith("gcs://"):
        name = value.removeprefix("gcs://")
        package = package_of(value) if RAY_PACKAGE.fullmatch(name) else None
        if package is None:
            raise NotFoundError(
                f"runtime_env.working_dir: package {value[:80]} was not uploaded by this tenant; give "
                "ray job submit --working-dir DIR (the client uploads it)"
            )
        return package
    if "://" not in value:
        shown = value if len(value) <= 60 else value[:57] + "..."
        raise SpecError(
            f"{shown!r} is a path, which the control plane never reads; give a local directory to "
            "ray job submit --working-dir DIR (the client uploads it) or an allowed URL",
            field="runtime_env.working_dir",
        )
    return value  # a URL: JobRequest.build checks it against serve --allow-working-dir-url


# -- out ---------------------------------------------------------------------------------------
def ray_status(job: Any) -> tuple[str, str]:
    """Ray's ``JobStatus`` of a tpufleet job and its message (``job``: a ``JobRecord``)."""
    where = f"tpufleet job {job.id}, attempt {job.attempt}"
    if job.state == QUEUED:
        why = f": {job.reason_code}: {job.reason}" if job.reason else ""
        return "PENDING", f"queued ({where}){why}"
    if job.state == RUNNING:
        stopping = "; stopping" if job.cancel_requested else ""
        return "RUNNING", f"running on {', '.join(job.slices)} ({where}){stopping}"
    if job.state == SUCCEEDED:
        return "SUCCEEDED", f"Job finished successfully ({where})."
    if job.state == CANCELLED:
        return "STOPPED", f"Job was intentionally stopped ({where})."
    if job.state == FAILED:
        why = f"{job.reason_code}: {job.reason}" if job.reason else f"exit code {job.exit_code}"
        return "FAILED", f"{why} ({where})"
    return "PENDING", f"{job.state.lower()} on {', '.join(job.slices)} ({where})"  # ADMITTED, STARTING


def details(sub: RaySubmission) -> dict[str, Any]:
    """Ray's ``JobDetails`` (dashboard/modules/job/pydantic_models.py) of a submission; ``job_id``
    is the tpufleet job id (``tpufleet job ID``)."""
    job = sub.job
    status, message = ray_status(job)
    ended = job.state in TERMINAL
    failed_by_exit = status == "FAILED" and job.exit_code not in (None, 0)
    return {
        "type": "SUBMISSION",
        "job_id": job.id,
        "submission_id": sub.submission_id,
        "driver_info": None,
        "status": status,
        "entrypoint": sub.entrypoint,
        "message": message,
        "error_type": "JOB_ENTRYPOINT_COMMAND_ERROR" if failed_by_exit else None,
        "start_time": int(job.submitted_at * 1000),
        "end_time": int(job.finished_at * 1000) if ended and job.finished_at else None,
        "metadata": sub.metadata,
        "runtime_env": sub.runtime_env,
        "driver_agent_http_address": None,
        "driver_node_id": None,
        "driver_exit_code": job.exit_code if ended else None,
    }
