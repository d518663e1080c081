"""pytest imports test modules by their file name (rootdir-relative, no packages): two test files
of the same name in tests/unit, tests/integration and tests/e2e make the whole run fail to collect
("import file mismatch"), although each passes on its own. Caught here, by name, in a second."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_file_name() -> None:
    names = Counter(
        p.name for p in TESTS.rglob("*.py") if p.name != "__init__.py" and p.name != "conftest.py"
    )
    twice = sorted(name for name, n in names.items() if n > 1)
    assert twice == [], f"rename one of each: {twice}"
