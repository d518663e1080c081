"""The emulated hosts' ``sitecustomize`` (``emulator/hostsite``), in Python processes started as a
host starts them (``plan.site_env`` on ``PYTHONPATH``), over a stand-in ``torch_xla`` with the two
functions it watches (the real one is imported by the PyTorch tests of tests/integration)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from guards import HANG_GUARD_S

from tpufleet.emulator import plan

NOTE = "PyTorch/XLA runs on this emulated host's CPU (PJRT_DEVICE=CPU)"
PROGRAM = """
import torch_xla.core.xla_model as xm
for _ in range(2):
    print(xm.optimizer_step("opt"), xm.rendezvous("tag"), flush=True)
print(xm.optimizer_step.__wrapped__ is not None if hasattr(xm.optimizer_step, "__wrapped__") else "bare")
"""


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    """A ``torch_xla`` package whose ``xla_model`` returns what it was given, and another
    ``sitecustomize`` after ours on the path, which must still run."""
    pkg = tmp_path / "lib" / "torch_xla" / "core"
    pkg.mkdir(parents=True)
    (tmp_path / "lib" / "torch_xla" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    stand_in_xm = "def optimizer_step(o):\n    return o\n\n\ndef rendezvous(t):\n    return t\n"
    (pkg / "xla_model.py").write_text(stand_in_xm)
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITE_RAN'] = 'yes'\n")
    return tmp_path


def _run(stand_in: Path, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(stand_in / "lib"), str(stand_in / "other")])
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "MEGASCALE_"))}
    return subprocess.run(
        [sys.executable, "-c", code],
        env=clean | plan.site_env(path) | env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )


def test_a_job_of_several_processes_is_warned_once_per_function_that_cannot_synchronise(
    stand_in: Path,
) -> None:
    run = _run(stand_in, PROGRAM, TPU_WORKER_HOSTNAMES="h,h", MEGASCALE_NUM_SLICES="2")
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[:2] == ["opt tag", "opt tag"]  # the functions still do their work
    err = run.stderr.splitlines()
    assert sum(NOTE in line for line in err) == 1, run.stderr
    for name in ("optimizer_step", "rendezvous"):
        (said,) = [line for line in err if f"xm.{name} does not synchronise" in line]
        assert "this job's 4 processes" in said and "initialize_torch()" in said


def test_a_single_process_job_gets_the_note_and_no_warning(stand_in: Path) -> None:
    run = _run(stand_in, PROGRAM)  # no TPU_WORKER_HOSTNAMES: one host, as on a single-host slice
    assert run.returncode == 0, run.stderr
    assert NOTE in run.stderr and "does not synchronise" not in run.stderr
    assert run.stdout.splitlines()[-1] == "bare"  # nothing wrapped


def test_a_program_without_pytorch_xla_hears_nothing_and_the_next_sitecustomize_still_runs(
    stand_in: Path,
) -> None:
    code = "import os; print(os.environ.get('OTHER_SITE_RAN'))"
    run = _run(stand_in, code, TPU_WORKER_HOSTNAMES="h,h")
    assert (run.returncode, run.stdout.strip(), run.stderr) == (0, "yes", "")
