"""One remembered CLI context, like kubectl's: where the local fleet and control plane run.

``tpufleet emulate up`` records the emulator's state dir and Ray address; ``tpufleet serve``
records its URL, state dir, admin token *path* and Ray address. Later commands use these unless a
flag or a ``TPUFLEET_*`` variable says otherwise (flag > variable > context > built-in default).
``tpufleet context [--json]`` shows the file and what it holds; ``--clear`` forgets it all,
``--server URL`` switches to another control plane, ``--use STATE_DIR`` to the ``serve`` running
from that state dir (its lock names its URL: ``api/serving.py``).

The file (``client/context.py`` reads and writes it) is ``$TPUFLEET_CONFIG``, else
``$XDG_CONFIG_HOME/tpufleet/config.yaml``, else ``~/.config/tpufleet/config.yaml``: YAML, mode 0600,
written atomically. It holds paths and addresses, never a secret: tokens stay in their own 0600 files.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Annotated, Any

import typer

from tpufleet.cli._app import app, console, print_json
from tpufleet.client.context import Context, config_path, load
from tpufleet.client.context import save as _save
from tpufleet.errors import InputError

__all__ = ["Context", "config_path", "forget", "load", "remember", "switch_server", "use_state_dir"]


def remember(**values: str | None) -> Context:
    """Merge ``values`` into the context file and return the new context."""
    ctx = replace(load(), **values)
    _save(ctx)
    return ctx


def forget(*names: str) -> Context:
    """Clear the named entries (e.g. the Ray address once the fleet is down)."""
    return remember(**dict.fromkeys(names))


def _rows(ctx: Context) -> dict[str, Any]:
    return {"config": str(config_path()), **asdict(ctx)}


@app.command("context")
def context_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
    clear: Annotated[
        bool, typer.Option("--clear", help="Forget everything remembered (the file is emptied).")
    ] = False,
    server: Annotated[
        str | None,
        typer.Option(
            "--server",
            metavar="URL",
            help="Remember URL as the control plane (http:// if no scheme); forgets the admin token "
            "file remembered for another server.",
            show_default=False,
        ),
    ] = None,
    use: Annotated[
        Path | None,
        typer.Option(
            "--use",
            metavar="STATE_DIR",
            help="Remember the `tpufleet serve` running from STATE_DIR (its URL and admin token file).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Show the remembered context: where `emulate up` and `serve` run (flags and TPUFLEET_* win).
    --clear, --server or --use change it first."""
    if sum((clear, server is not None, use is not None)) > 1:
        raise InputError("give one of --clear, --server URL, --use STATE_DIR")
    if clear:
        _save(Context())
    elif server is not None:
        switch_server(server)
    elif use is not None:
        use_state_dir(use)
    rows = _rows(load())
    if as_json:
        print_json(rows)
        return
    for key, value in rows.items():
        console.print(f"[bold]{key:>18}[/]  {value if value is not None else '-'}", highlight=False)


def switch_server(text: str) -> Context:
    """Remember ``text`` (normalized, see ``client.http.server_url``) as the server; the state dir and
    admin token file remembered for another server are forgotten (that token is not this one's)."""
    from tpufleet.client.http import server_url

    url = server_url(text)
    ctx = load()
    if ctx.server == url:
        return ctx
    return remember(server=url, server_state_dir=None, admin_token_path=None)


def use_state_dir(state_dir: Path) -> Context:
    """Remember the serve that holds ``state_dir`` (or ``state_dir/sandbox``, where ``serve
    --sandbox`` keeps its state) now, its lock naming its URL, with its admin token file; an
    InputError when no serve runs from there."""
    from tpufleet.api.serving import ADMIN_TOKEN_FILE, holder

    where = state_dir.expanduser().resolve()
    who = holder(where)
    if who is None and holder(where / "sandbox") is not None:  # `serve --sandbox` under the default
        where = where / "sandbox"
        who = holder(where)
    if who is None:
        raise InputError(
            f"no tpufleet serve runs from {where}: start one (`tpufleet serve --state-dir {where}`), "
            "or give --server URL"
        )
    if not who.url:
        raise InputError(f"{who} runs from {where} but has not bound its port yet: try again in a moment")
    token = where / ADMIN_TOKEN_FILE
    return remember(
        server=who.url,
        server_state_dir=str(where),
        admin_token_path=str(token) if token.is_file() else None,
    )
