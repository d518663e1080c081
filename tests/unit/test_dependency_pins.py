"""The pins pyproject.toml declares are the ones `make` installs: every dependency and every extra is
pinned exactly, at the same version, in requirements.lock or (the ``torch`` extra's closure, which
`make test` adds) requirements-torch.lock, and no package is pinned in both lock files."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).parents[2]


def _pin(spec: str) -> tuple[str, str | None]:
    """A requirement's canonical name, and its version if it is pinned exactly (one ``==``), else None."""
    req = Requirement(spec)
    exact = [s.version for s in req.specifier if s.operator == "=="]
    return canonicalize_name(req.name), exact[0] if len(req.specifier) == 1 and exact else None


def _lock(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = _pin(line)
            assert version, f"{path.name}: {line!r} is not pinned exactly"
            pins[name] = version
    return pins


def test_every_declared_dependency_is_locked_at_its_pin() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base, torch = _lock(ROOT / "requirements.lock"), _lock(ROOT / "requirements-torch.lock")
    assert not set(base) & set(torch), "pinned in both lock files"
    declared = [*project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        declared += extra
    assert any(_pin(s)[0] == "torch-xla" for s in declared)
    locked = base | torch
    for spec in declared:
        name, version = _pin(spec)
        assert version, f"pyproject.toml: {spec!r} is not pinned exactly"
        assert locked.get(name) == version, f"{spec}: locked {locked.get(name)}"
