"""The ``tpufleet`` CLI run in this process, through its real entry point ``tpufleet.cli.main``."""

from __future__ import annotations

import pytest

from tpufleet.cli import main


def tpufleet(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the CLI's entry point in-process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = 0
    try:
        main(list(args))
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
