"""runtime.initialize_torch without PyTorch, or on a TPU host without torch_xla: one line saying
what to install. ``sys.modules`` entries set to None make an import fail as if the package were
absent, whether or not it is installed here."""

from __future__ import annotations

import sys
import types

import pytest

from tpufleet.runtime import TORCH_INSTALL, initialize_torch


def test_without_torch_it_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "torch.distributed", None)
    with pytest.raises(ImportError) as err:
        initialize_torch({"TPUFLEET_EMULATED": "1"})
    assert (
        str(err.value)
        == "initialize_torch needs PyTorch, which is not installed: pip install 'tpufleet[torch]'"
    )
    assert "\n" not in str(err.value) and TORCH_INSTALL in str(err.value)


def test_on_a_tpu_host_without_torch_xla_it_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    # a torch without torch_xla: the host is not emulated, so the xla backend is what it needs
    torch, distributed = types.ModuleType("torch"), types.ModuleType("torch.distributed")
    torch.distributed = distributed  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", distributed)
    monkeypatch.setitem(sys.modules, "torch_xla", None)
    with pytest.raises(
        ImportError, match=r"^initialize_torch on a TPU host needs torch_xla, .*tpufleet\[torch\]'$"
    ):
        initialize_torch({})
