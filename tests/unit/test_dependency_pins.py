"""The pins pyproject.toml declares are the ones `make` installs: every dependency and every extra is
pinned exactly, at the same version, in requirements.lock or (the ``torch`` extra's closure, which
`make test` adds) requirements-torch.lock, and no package is pinned in both lock files."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _name(spec: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[\[=<>!~ ]", spec, maxsplit=1)[0]).lower()


def _lock(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep, f"{path.name}: {line!r} is not pinned exactly"
            pins[_name(name)] = version
    return pins


def test_every_declared_dependency_is_locked_at_its_pin() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base, torch = _lock(ROOT / "requirements.lock"), _lock(ROOT / "requirements-torch.lock")
    assert not set(base) & set(torch), "pinned in both lock files"
    declared = [*project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        declared += extra
    assert any(_name(s) == "torch-xla" for s in declared)
    locked = base | torch
    for spec in declared:
        name, version = _name(spec), spec.rpartition("==")[2]
        assert "==" in spec, f"pyproject.toml: {spec!r} is not pinned exactly"
        assert locked.get(name) == version, f"{spec}: locked {locked.get(name)}"
