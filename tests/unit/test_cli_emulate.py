"""``tpufleet emulate`` and ``tpufleet doctor``: user errors are one line and exit 2, and start nothing.

In-process through Typer's CliRunner (``tpufleet.cli.main`` prints ``str(error)`` and exits with
``error.exit_code``); none of these inputs gets as far as starting Ray.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from tpufleet.cli import command
from tpufleet.errors import TpufleetError


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["emulate", "up", "--slices", "v4-17"], "v4-17 is not a v4 slice size; closest: v4-16, v4-32"),
        (["emulate", "up", "--slices", "v4-16:0"], "the count after ':' must be a whole number from 1 to"),
        (["emulate", "up", "--slices", ""], "--slices is empty"),
        # more hosts than this machine's memory holds at a raylet's least: refused before anything starts
        (
            ["emulate", "up", "--slices", "v4-8:100000"],
            "'v4-8:100000' is 100,000 emulated hosts; this machine's",
        ),
        (["emulate", "up", "--cpus-per-host", "-1"], "--cpus-per-host must be >= 0, got -1"),
        (["emulate", "status"], "no emulated fleet in"),
        (["emulate", "kill-host", "tpu-v4-16-0", "1"], "no emulated fleet in"),
        (["emulate", "restore", "tpu-v4-16-0"], "no emulated fleet in"),
        (["doctor"], "no cluster to check: no emulated fleet runs from"),
        (["doctor", "--ray-address", "foo"], "--ray-address 'foo' is not a GCS address host:port"),
        (["doctor", "--ray-address", "10.0.0.1:99999"], "is not a GCS address host:port"),
        (["doctor", "--ray-address", "ray://10.0.0.1:10001"], "is a Ray Client or URL address"),
    ],
)
def test_user_errors_exit_2_with_the_reason(
    args: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    result = CliRunner().invoke(command(), [*args, "--state-dir", str(tmp_path / "none")])
    assert isinstance(result.exception, TpufleetError), (result.output, result.exception)
    assert result.exception.exit_code == 2
    assert message in str(result.exception)
    assert not (tmp_path / "none" / "fleet.json").exists()


def test_doctor_names_a_bad_ray_address_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    result = CliRunner().invoke(command(), ["doctor", "--state-dir", str(tmp_path)])
    assert isinstance(result.exception, TpufleetError) and result.exception.exit_code == 2
    assert "RAY_ADDRESS 'auto' is not a GCS address host:port" in str(result.exception)
