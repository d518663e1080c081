"""``tpufleet catalog`` through the real console script entry point."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from guards import HANG_GUARD_S

from tpufleet import catalog as cat


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpufleet", *args], capture_output=True, text=True, timeout=HANG_GUARD_S
    )


def test_json_covers_all_generations_one_row_per_type_topology_machine():
    out = run("catalog", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert len(rows) == len(cat.all_slice_types())
    assert {r["generation"] for r in rows} == {"v4", "v5e", "v5p", "v6e", "tpu7x"}
    v4_16 = [r for r in rows if r["accelerator_type"] == "v4-16"]
    assert v4_16 == [cat.slice_type("v4-16").to_dict()]
    assert v4_16[0]["hosts"] == 2 and v4_16[0]["topology"] == "2x2x2"


def test_one_by_generation_and_topology():
    out = run("catalog", "--generation", "v6e", "--topology", "4x4", "--json")
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)
    assert (row["accelerator_type"], row["hosts"], row["machine_type"]) == ("v6e-16", 4, "ct6e-standard-4t")


def test_table_names_the_type():
    out = run("catalog", "v5litepod-8")
    assert out.returncode == 0
    assert "v5litepod-8" in out.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["catalog", "v4-17"], "v4-17 is not a v4 slice size; closest: v4-16, v4-32"),
        (["catalog", "--generation", "v6e", "--topology", "3x3"], "3x3 is not a v6e topology"),
        (["catalog", "--generation", "v10"], "not a TPU generation"),
    ],
)
def test_unknown_input_is_one_line_exit_2(args, message):
    out = run(*args)
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) <= 2


def test_the_cli_starts_without_the_server_side_libraries() -> None:
    """Every `tpufleet` command pays for what the CLI imports before it parses its arguments: the
    store (SQLAlchemy, Alembic), Ray and JAX load only in the commands that use them."""
    import subprocess
    import sys

    heavy = ("ray", "jax", "sqlalchemy", "alembic", "fastapi", "uvicorn", "numpy")
    code = f"import sys, tpufleet.cli; print(' '.join(m for m in {heavy!r} if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == ""
