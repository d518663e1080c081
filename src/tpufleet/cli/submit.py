"""``tpufleet submit``: queue one job (its ``--working-dir`` packed and uploaded from here) or many
at once from a JSONL file (``--batch``), all or none."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from tpufleet.cli._app import app, console_err, option_names, print_json
from tpufleet.cli.common import ERRORS, JsonOpt, ServerOpt, TokenOpt, make_client, safe, seams
from tpufleet.client.http import DEFAULT_SERVER, Client
from tpufleet.control.store.values import Limits
from tpufleet.errors import InputError, SpecError, TpufleetError


class SubmitCommand(TyperCommand):
    """``submit`` as Click parses it, except for one slip: a command given without ``--`` whose own
    options (``python -c ...``, ``train.py --steps 3``) Click would call unknown options of submit.
    That is a :class:`SpecError` with the corrected command line; an unknown option before any
    command word (a misspelled option of submit) keeps Click's own message."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # Any: the Context of typer's own Click
        found = _forgotten_dashes(args, option_names(self, ctx))
        if found is not None:
            bad, fixed = found
            line = shlex.join([*ctx.command_path.split(), *_masked(fixed)])
            raise SpecError(f"{bad} is not an option of submit: the command goes after --, as in {line}")
        return super().parse_args(ctx, args)


def _forgotten_dashes(args: list[str], known: dict[str, bool]) -> tuple[str, list[str]] | None:
    """The first unknown option in ``args`` and ``args`` with ``--`` put before the first command
    word, when that option comes after the word (``--type v4-16 python -c x``); None when there is
    no unknown option, or it comes before any word (a misspelled option of submit). ``known``: each
    option name of submit, True for one that takes no value."""
    word = None
    i = 0
    while i < len(args) and args[i] != "--":
        token = args[i]
        if token.startswith("-") and token != "-":
            name = token.partition("=")[0] if token.startswith("--") else token[:2]
            if name not in known:
                if word is None:
                    return None  # Click's own message: submit has no such option
                return name, [*args[:word], "--", *args[word:]]
            takes_value = not known[name] and "=" not in token and name == token
            i += 2 if takes_value else 1
            continue
        if word is None:
            word = i
        i += 1
    return None


def _masked(args: list[str]) -> list[str]:
    """``args`` with a ``--token`` value shown as ``TOKEN``: an error line never repeats a secret."""
    out = list(args)
    for i, token in enumerate(out):
        if token == "--":
            break
        if token == "--token" and i + 1 < len(out):
            out[i + 1] = "TOKEN"
        elif token.startswith("--token="):
            out[i] = "--token=TOKEN"
    return out


@app.command("submit", epilog=ERRORS, cls=SubmitCommand)
def submit_cmd(
    ctx: typer.Context,
    command: Annotated[
        list[str] | None, typer.Argument(help="The command run on every host, after --.", show_default=False)
    ] = None,
    accelerator_type: Annotated[
        str | None, typer.Option("--type", help="Slice type, e.g. v4-16, v6e-16.", show_default=False)
    ] = None,
    num_slices: Annotated[int, typer.Option("--num-slices", help="Slices (multi-slice when > 1).")] = 1,
    priority: Annotated[int, typer.Option(help="Higher runs first.")] = 0,
    max_retries: Annotated[
        int | None,
        typer.Option(
            "--max-retries",
            help="Retries after failures (default 2); a command not found or not executable on every "
            "host (exit 127 or 126) is not retried.",
        ),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Job name (default: from the command).")] = None,
    env: Annotated[list[str], typer.Option("--env", help="KEY=VALUE for every host; repeatable.")] = [],  # noqa: B006
    working_dir: Annotated[
        str | None,
        typer.Option(
            "--working-dir",
            help="A local directory, packed (without .git, __pycache__, .venv) and uploaded, or a URL "
            "the server allows; shipped to every host.",
        ),
    ] = None,
    tenant: Annotated[str | None, typer.Option(help="With the admin token: submit for this tenant.")] = None,
    ray: Annotated[
        bool,
        typer.Option(
            "--ray",
            help="A Ray job: the command runs once, as a Ray driver through Ray's job submission; Ray "
            "Train's JaxTrainer lands on the slices admitted (docs/ray-jobs.md).",
        ),
    ] = False,
    batch: Annotated[
        Path | None,
        typer.Option(
            "--batch",
            metavar="FILE.jsonl",
            help="Queue many jobs at once, all or none: one JSON job body per line, the fields of "
            'POST /api/v1/jobs (e.g. {"command": ["python", "t.py"], "accelerator_type": "v4-16"}); '
            'at most 10,000 lines. Prints one id per line ({"ids": [...]} with --json).',
            show_default=False,
        ),
    ] = None,
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = None,
) -> None:
    """Queue a job: `tpufleet submit --type v4-16 -- python train.py`. Prints the job id.

    The command goes after `--`. A fleet with no slice of the type (and no pool that could make
    one) gets a warning on stderr; the job is queued anyway.

    Many jobs: `tpufleet submit --batch jobs.jsonl`; a bad line exits 2 naming the line."""
    if batch is not None:
        flags = (command, accelerator_type, name, working_dir, max_retries, env, ray)
        if any(flags) or (num_slices, priority) != (1, 0):
            raise SpecError("give --batch FILE.jsonl (job fields on each line) or one job's flags, not both")
        _submit_batch(make_client(ctx, server, token), batch, tenant, as_json)
        return
    if not command or not accelerator_type:
        raise SpecError(
            "give the slice type and the command, e.g. tpufleet submit --type v4-16 -- python train.py "
            "(or --batch FILE.jsonl)"
        )
    client = make_client(ctx, server, token)
    wd = _upload_working_dir(client, working_dir, tenant, seams(ctx).limits) if working_dir else None
    job = client.submit(
        command,
        accelerator_type,
        num_slices=num_slices,
        priority=priority,
        max_retries=max_retries,
        name=name,
        env=_kv(env, "--env"),
        working_dir=wd,
        tenant=tenant,
        kind="ray" if ray else "spmd",
    )
    for warning in job.get("warnings") or ():  # queued all the same: stdout keeps just the id
        console_err.print(f"warning: {safe(warning)}", highlight=False, markup=False)
    if as_json:
        print_json({"id": job["id"]})
    else:
        typer.echo(job["id"])


def _submit_batch(client: Client, path: Path, tenant: str | None, as_json: bool) -> None:
    """Read the JSONL file, send it as one batch, print the ids; errors name the file and line."""
    from tpufleet.api.limits import MAX_BATCH_JOBS

    bodies, lines = read_batch(path, tenant)
    if len(bodies) > MAX_BATCH_JOBS:
        raise SpecError(f"{len(bodies):,} jobs; at most {MAX_BATCH_JOBS:,} in one batch", file=str(path))
    try:
        answer = client.submit_batch_answer(bodies)
    except TpufleetError as err:
        found = re.match(r"jobs\[(\d+)\][.:]? ?(.*)", str(err))
        if found is None or int(found.group(1)) >= len(lines):
            raise
        line, rest = lines[int(found.group(1))], found.group(2)
        if isinstance(err, SpecError):
            raise SpecError(rest, file=str(path), line=line) from None
        raise type(err)(f"{path}:{line}: {rest}") from None
    ids = [str(i) for i in answer["ids"]]
    for warning in answer.get("warnings") or ():  # queued all the same: stdout keeps just the ids
        where = _lines_of(path, [lines[i] for i in warning["jobs"] if 0 <= i < len(lines)])
        console_err.print(f"warning: {safe(where + str(warning['message']))}", highlight=False, markup=False)
    if as_json:
        print_json({"ids": ids})
    else:
        typer.echo("\n".join(ids))


def _lines_of(path: Path, lines: list[int], shown: int = 5) -> str:
    """``jobs.jsonl:3: `` for one line, ``jobs.jsonl lines 1, 4, 7 and 12 more: `` for several."""
    if len(lines) == 1:
        return f"{path}:{lines[0]}: "
    more = f" and {len(lines) - shown} more" if len(lines) > shown else ""
    return f"{path} lines {', '.join(map(str, lines[:shown]))}{more}: " if lines else f"{path}: "


def read_batch(path: Path, tenant: str | None = None) -> tuple[list[dict[str, Any]], list[int]]:
    """The job bodies of a JSONL file (blank lines skipped) and the line number of each; ``tenant``
    fills in bodies that name none. A line that is not a JSON object is a SpecError naming it."""
    from tpufleet.api.limits import MAX_BATCH_BODY_BYTES

    try:  # at most what one batch request may carry: /dev/zero was read until memory ran out
        with path.open(encoding="utf-8") as f:
            text = f.read(MAX_BATCH_BODY_BYTES + 1)
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: cannot read it ({err})") from None
    if len(text) > MAX_BATCH_BODY_BYTES:
        raise SpecError(
            f"over {MAX_BATCH_BODY_BYTES >> 20} MiB, what one batch may carry; split it into several files",
            file=str(path),
        )
    bodies: list[dict[str, Any]] = []
    lines: list[int] = []
    for n, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            body = json.loads(raw)
        except ValueError as err:
            raise SpecError(f"not JSON ({err})", file=str(path), line=n) from None
        if not isinstance(body, dict):
            raise SpecError("each line is one job body, a JSON object", file=str(path), line=n)
        if tenant and "tenant" not in body:
            body["tenant"] = tenant
        bodies.append(body)
        lines.append(n)
    if not bodies:
        raise SpecError("no jobs in the file (one JSON job body per line)", file=str(path))
    return bodies, lines


def _upload_working_dir(client: Client, working_dir: str, tenant: str | None, limits: Limits) -> str:
    """A ``scheme://`` URL as it is; a directory packed here (refused over ``limits``' package cap
    before any upload) and uploaded, its package id."""
    if "://" in working_dir:
        return working_dir
    path = Path(working_dir)
    if not path.is_dir():
        raise SpecError(f"{working_dir} is not a directory", field="--working-dir")
    from rich.progress import Progress

    with Progress(console=console_err, transient=True, disable=not console_err.is_terminal) as bar:
        task = bar.add_task(f"packing {path}", total=None)
        data = _pack(path, limits, lambda done, total: bar.update(task, completed=done, total=total))
        bar.update(task, description=f"uploading {len(data):,} bytes")
        return client.upload_package(data, tenant=tenant)


def _pack(path: Path, limits: Limits, progress: Any) -> bytes:
    from tpufleet.control.store import packages

    return packages.pack(path, limits, progress=progress)


def _kv(values: list[str], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SpecError(f"{item!r} is not KEY=VALUE", field=what)
        out[key.strip()] = value
    return out
