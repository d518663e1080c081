"""Run by every Python process on an emulated host: the emulator puts this folder first on the hosts'
``PYTHONPATH`` (``plan.site_env``). It only watches for PyTorch/XLA, so it costs a program that does
not import it one dictionary look-up per import.

When a program imports ``torch_xla.core.xla_model`` it says once, in the program's output (stderr,
which the job's log keeps), that PyTorch/XLA runs here on the host's CPU, one device per process.
When the job has more than one process (hosts of every slice), it also warns the first time the
program calls ``xm.optimizer_step`` or ``xm.rendezvous``: on CPUs PyTorch/XLA has no collectives
across processes, so these synchronise nothing and every host would train alone, without an error.
``tpufleet.runtime.initialize_torch()`` is what synchronises on the emulator (``torch.distributed``
over gloo). Then any other ``sitecustomize`` on the path runs, as it would have without this one.

Nothing from tpufleet is imported here: this runs before the program's own imports, in every Ray
worker and job process of the host.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType
from typing import Any

WATCHED = "torch_xla.core.xla_model"
NOTE = (
    "tpufleet emulator: PyTorch/XLA runs on this emulated host's CPU (PJRT_DEVICE=CPU), one device per "
    "process (more than one hangs, pytorch/xla#9089), and has no collectives across processes."
)
WARNING = (
    "tpufleet emulator: warning: xm.{name} does not synchronise across emulated hosts: PyTorch/XLA "
    "has no collectives across CPU processes, so each of this job's {world} processes goes on alone. "
    "Call tpufleet.runtime.initialize_torch() and synchronise with torch.distributed (gloo here, "
    "e.g. DistributedDataParallel)."
)


def job_processes(environ: Any = os.environ) -> int:
    """The job's processes: its slice's hosts times its slices (one process per host)."""
    hosts = len([h for h in environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]) or 1
    try:
        slices = max(1, int(environ.get("MEGASCALE_NUM_SLICES", "1")))
    except ValueError:
        slices = 1
    return hosts * slices


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _warn_once(xm: ModuleType, name: str, world: int) -> None:
    inner = getattr(xm, name, None)
    if inner is None:
        return
    said: list[bool] = []

    @functools.wraps(inner)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not said:
            said.append(True)
            _say(WARNING.format(name=name, world=world))
        return inner(*args, **kwargs)

    setattr(xm, name, wrapper)


def watched(xm: ModuleType) -> None:
    """What this module does to ``torch_xla.core.xla_model`` once it is loaded."""
    _say(NOTE)
    world = job_processes()
    if world > 1:
        for name in ("optimizer_step", "rendezvous"):
            _warn_once(xm, name, world)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        try:
            watched(module)
        except Exception as exc:  # never break the program over a note
            _say(f"tpufleet emulator: could not watch PyTorch/XLA: {exc!r}")


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != WATCHED:
            return None
        sys.meta_path.remove(self)  # once: the module is loaded at most once per process
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec: importlib.machinery.ModuleSpec | None = find(name, path, target) if find else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


def _chain() -> None:
    """Run the next ``sitecustomize`` on ``sys.path``, as Python would have without this one."""
    here = os.path.dirname(os.path.abspath(__file__))
    mine = sys.modules.pop(__name__, None)
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        import sitecustomize  # noqa: F401  (another one, if there is one)
    except ModuleNotFoundError as exc:
        if exc.name != "sitecustomize":
            raise
        if mine is not None:
            sys.modules[__name__] = mine
    finally:
        sys.path[:] = saved


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
_chain()
