"""The ``tpufleet`` command. Thin: parse, call, print.

Each command family lives in its own module and registers itself on ``app``:
``catalog`` (TPU facts), ``emulate``/``doctor`` (local fleet), ``render``/``lint``/``up``/``down``/``attach``
(configs), the control-plane client and server commands, and ``db`` (schema migrations). ``main``
turns every :class:`~tpufleet.errors.TpufleetError` into a one- or two-line message and its exit code.
"""

from __future__ import annotations

import sys

from tpufleet.cli._app import app, console_err
from tpufleet.errors import TpufleetError

# Command modules register themselves on import; keep this list in the order of `tpufleet --help`.
from tpufleet.cli import catalog as _catalog  # noqa: F401  isort: skip
from tpufleet.cli import emulate as _emulate  # noqa: F401  isort: skip
from tpufleet.cli import config as _config  # noqa: F401  isort: skip
from tpufleet.cli import control as _control  # noqa: F401  isort: skip
from tpufleet.cli import cost as _cost  # noqa: F401  isort: skip
from tpufleet.cli import tenants as _tenants  # noqa: F401  isort: skip
from tpufleet.cli import top as _top  # noqa: F401  isort: skip
from tpufleet.cli import db as _db  # noqa: F401  isort: skip
from tpufleet.cli import demo as _demo  # noqa: F401  isort: skip
from tpufleet.cli import chaos as _chaos  # noqa: F401  isort: skip

__all__ = ["app", "main"]


def main(argv: list[str] | None = None) -> None:
    """Entry point: usage errors exit 2 (Click), user errors exit 2 with one line, no traceback."""
    try:
        app(args=argv, prog_name="tpufleet")
    except TpufleetError as err:
        console_err.print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True, markup=True)
        sys.exit(err.exit_code)
