"""The ``tpufleet`` command. Thin: parse, call, print.

Each command family lives in its own module and registers itself on ``app``: ``catalog`` (TPU
facts), ``emulate``/``doctor`` (local fleet), ``render``/``lint``/``up``/``down``/``attach``
(configs: ``config.py``), ``serve`` (the control plane), its client commands one module per noun
(``tenants``, ``submit``, ``jobs``, ``slices``, ``status``, ``cost``, ``tokens``, ``events``, ``top``;
what they share is ``common.py``), ``db`` (schema migrations), ``demo`` and ``chaos``. ``main``
turns every :class:`~tpufleet.errors.TpufleetError` into a one- or two-line message and its exit code.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import typer.main

from tpufleet.cli._app import app, console_err
from tpufleet.errors import TpufleetError

# Command modules register themselves on import; keep this list in the order of `tpufleet --help`.
from tpufleet.cli import catalog as _catalog  # noqa: F401  isort: skip
from tpufleet.cli import emulate as _emulate  # noqa: F401  isort: skip
from tpufleet.cli import config as _config  # noqa: F401  isort: skip
from tpufleet.cli import serve as _serve  # noqa: F401  isort: skip
from tpufleet.cli import tenants as _tenants  # noqa: F401  isort: skip
from tpufleet.cli import submit as _submit  # noqa: F401  isort: skip
from tpufleet.cli import jobs as _jobs  # noqa: F401  isort: skip
from tpufleet.cli import slices as _slices  # noqa: F401  isort: skip
from tpufleet.cli import status as _status  # noqa: F401  isort: skip
from tpufleet.cli import cost as _cost  # noqa: F401  isort: skip
from tpufleet.cli import tokens as _tokens  # noqa: F401  isort: skip
from tpufleet.cli import events as _events  # noqa: F401  isort: skip
from tpufleet.cli import top as _top  # noqa: F401  isort: skip
from tpufleet.cli import db as _db  # noqa: F401  isort: skip
from tpufleet.cli import demo as _demo  # noqa: F401  isort: skip
from tpufleet.cli import chaos as _chaos  # noqa: F401  isort: skip

__all__ = ["app", "command", "main"]


@functools.cache
def command() -> Callable[..., Any]:
    """The Click command tree Typer builds from ``app`` (with Typer's own copy of Click), built
    once per process: ``app(...)`` rebuilds it at every call (~50 ms), which an in-process caller
    (the tests, a shell that runs many commands) pays each time. ``app`` has pretty exceptions
    off, so calling this is what calling ``app`` does."""
    return typer.main.get_command(app)


def main(argv: list[str] | None = None) -> None:
    """Entry point: usage errors exit 2 (Click), user errors exit 2 with one line, no traceback."""
    try:
        command()(args=argv, prog_name="tpufleet")
    except TpufleetError as err:
        console_err.print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True, markup=True)
        sys.exit(err.exit_code)
