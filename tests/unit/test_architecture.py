"""The shape of the code, checked: no import cycle between modules, no store transaction outside the store.

import-linter (``make test``'s lint step) keeps the layers: data flows down, the rooms inside
``control/`` (loop above the store and the Ray client, both above the cluster seam), ``host/`` free of
the control plane. Layers alone allow a cycle between two modules of one layer or one room (before the
redesign the store imported its tenant mixin, which imported the store back; ``api/app.py`` and
``api/slicegroups.py`` imported each other); the graph test here finds any. Imports under
``TYPE_CHECKING`` count: a cycle of types is still two modules that cannot be read apart.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp

SRC = Path(__file__).resolve().parents[2] / "src" / "tpufleet"
STORE = SRC / "control" / "store"
TRANSACTIONS = {"tx", "tx_unsynced"}


def cycles(imports: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of two or more modules (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(imports):
        if root in index:
            continue
        work = [(root, iter(sorted(imports[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(imports.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_the_cycle_finder_finds_a_cycle_and_nothing_else() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = grimp.build_graph("tpufleet", exclude_type_checking_imports=False)
    imports = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert cycles(imports) == [], "import cycles (break each by moving what both need below them)"


def _transactions_opened(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in TRANSACTIONS
    ]


def test_only_the_store_opens_a_transaction() -> None:
    """Every read and write of the database is a named method of the store package; the loop, the
    API and the CLI call those, so what runs in one transaction is decided in one place."""
    outside = {
        f"{path.relative_to(SRC)}:{line}"
        for path in SRC.rglob("*.py")
        if STORE not in path.parents
        for line in _transactions_opened(path)
    }
    assert outside == set()


def test_the_transaction_check_sees_a_transaction() -> None:
    opened = [line for path in STORE.rglob("*.py") for line in _transactions_opened(path)]
    assert len(opened) > 10, "the store opens its transactions: the check must see them"
