"""PyTorch (the ``torch`` extra) for the tests that run it: skipped with the reason where it is not
installed, except under ``make test`` (``TPUFLEET_REQUIRE_TORCH=1``), which installs it
(requirements-torch.lock) and fails instead, so CI never passes without running them."""

from __future__ import annotations

import importlib.util
import os

import pytest

HINT = "install it with `make torch` (or pip install 'tpufleet[torch]')"


def require(module: str = "torch") -> None:
    """Skip (or, under make test, fail) unless ``module`` (``torch``, ``torch_xla``) is importable."""
    if importlib.util.find_spec(module) is not None:
        return
    if os.environ.get("TPUFLEET_REQUIRE_TORCH"):
        pytest.fail(f"{module} required (TPUFLEET_REQUIRE_TORCH is set, as in make test); {HINT}")
    pytest.skip(f"{module} is not installed: {HINT}", allow_module_level=True)
