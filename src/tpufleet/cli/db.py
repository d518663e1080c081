"""``tpufleet db``: the control plane's database schema (upgrade, current revision).

``serve`` upgrades the schema itself on start; ``db upgrade`` does it alone, e.g. before starting a
new version, or for a PostgreSQL database that several control planes share.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tpufleet.cli._app import app, console, print_json
from tpufleet.errors import InputError

db_app = typer.Typer(help="The control plane's database schema (migrations).", no_args_is_help=True)
app.add_typer(db_app, name="db")

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="The database: sqlite:///PATH or postgresql+psycopg://USER@HOST/DB (default: SQLite in "
        "the state dir, as `serve`).",
    ),
]
StateDirOption = Annotated[
    Path | None,
    typer.Option("--state-dir", help="The control plane's state dir (default ~/.tpufleet, as `serve`)."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def _url(db: str | None, state_dir: Path | None) -> str:
    """The database ``serve`` would use: ``--db``, else ``tpufleet.db`` in the state dir."""
    if db:
        return db  # checked by the store's engine, before any I/O
    from tpufleet.api.serving import default_state_dir

    directory = state_dir or default_state_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # as serve says it
        raise InputError(f"cannot use the state dir {directory}: {err.strerror or err}") from None
    return f"sqlite:///{directory / 'tpufleet.db'}"


@db_app.command("upgrade")
def upgrade_cmd(db: DbOption = None, state_dir: StateDirOption = None, json: JsonOption = False) -> None:
    """Create the schema, or upgrade it to this tpufleet's revision; prints from and to."""
    from tpufleet.control.store.facade import Store

    store = Store(_url(db, state_dir))
    try:
        done = store.upgrade()
    finally:
        store.close()
    if json:
        print_json({"from": done.before, "to": done.after, "action": done.how})
    else:
        console.print(done.describe(), highlight=False)


@db_app.command("current")
def current_cmd(db: DbOption = None, state_dir: StateDirOption = None, json: JsonOption = False) -> None:
    """The database's schema revision and this tpufleet's newest (head); changes nothing."""
    from tpufleet.control.store import migrations
    from tpufleet.control.store.facade import Store

    store = Store(_url(db, state_dir))
    try:
        have = store.schema_revision()
    finally:
        store.close()
    head = migrations.head()
    if have is None:
        state = "none (an empty database, or one from before migrations)"
    elif have == head:
        state = "current"
    elif have in migrations.known():
        state = "older: run `tpufleet db upgrade`"
    else:
        state = "newer than this tpufleet knows"
    if json:
        print_json({"current": have, "head": head})
    else:
        console.print(f"revision {have or 'none'} (head {head}): {state}", highlight=False)
