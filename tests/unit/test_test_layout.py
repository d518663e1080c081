"""The tests' layout, checked by name and by import in a second.

- pytest imports test modules by their file name (rootdir-relative, no packages): two test files of
  the same name anywhere under tests/ make the whole run fail to collect ("import file mismatch"),
  although each passes on its own.
- Tests sit in a folder that says their kind, which says how ``make test`` runs them: tests/unit
  (pure: no process, no Ray; on three workers), tests/host (start, scan or kill the host's processes),
  tests/conformance (the same tests against every implementation of a seam), tests/integration (the
  shared emulated Ray fleet), tests/e2e (a fleet or browser of their own); helpers in tests/support.
- A tests/unit file that starts a process or Ray belongs in tests/host: beside the unit tests' other
  worker, a process it starts is one that a host test's scan or sweep never expected.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
KINDS = {"unit", "host", "conformance", "integration", "e2e", "support"}
# Modules whose import means a process or a Ray cluster: not in tests/unit.
PROCESSES = {"subprocess", "multiprocessing", "ray", "tpufleet.emulator.fleet"}


def test_no_two_test_modules_share_a_file_name() -> None:
    names = Counter(
        p.name for p in TESTS.rglob("*.py") if p.name != "__init__.py" and p.name != "conftest.py"
    )
    twice = sorted(name for name, n in names.items() if n > 1)
    assert twice == [], f"rename one of each: {twice}"


def test_every_test_module_sits_in_the_folder_of_its_kind() -> None:
    misplaced = sorted(
        str(p.relative_to(TESTS))
        for p in TESTS.rglob("test_*.py")
        if p.relative_to(TESTS).parts[0] not in KINDS - {"support"}
    )
    assert misplaced == [], f"move into tests/{{{','.join(sorted(KINDS))}}}: {misplaced}"
    assert sorted(p.name for p in (TESTS / "support").glob("test_*.py")) == []
    assert sorted(
        p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))
    ) == sorted(KINDS)


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def test_unit_tests_start_no_process_and_no_ray() -> None:
    offenders = {}
    for path in sorted((TESTS / "unit").glob("*.py")):
        hits = {
            name for name in _imports(path) if any(name == m or name.startswith(m + ".") for m in PROCESSES)
        }
        hits |= {"tpufleet.emulator.EmulatedFleet"} & _imports(path)
        if hits:
            offenders[path.name] = sorted(hits)
    assert offenders == {}, f"these start processes or Ray: move them to tests/host ({offenders})"
