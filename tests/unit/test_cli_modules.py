"""The CLI's shape: one module per noun, what they share in ``cli/common.py`` under public names, and
``tpufleet --help`` in the order ``cli/__init__.py`` imports them (tests/unit/test_architecture.py
finds any import cycle, these modules' included)."""

from __future__ import annotations

import ast
from pathlib import Path

import typer
from typer.core import TyperGroup

import tpufleet.cli
from tpufleet.cli import app

CLI = Path(tpufleet.cli.__file__).parent


def private_imports(source: str) -> list[str]:
    """``from tpufleet.cli.x import _y`` and ``x._y`` where ``x`` is a CLI module this source imported."""
    found: list[str] = []
    modules: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tpufleet.cli"):
            for alias in node.names:
                if node.module == "tpufleet.cli":
                    modules.add(alias.asname or alias.name)  # a module of the package
                elif alias.name.startswith("_"):
                    found.append(f"{node.module}.{alias.name}")
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in modules:
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_the_private_import_finder_finds_them() -> None:
    source = (
        "from tpufleet.cli.common import cell, _hidden\nfrom tpufleet.cli import context\n"
        "context._save(1)\ncontext.load()\nfrom tpufleet.cli import serve as _serve\n"
    )
    assert private_imports(source) == ["tpufleet.cli.common._hidden", "context._save"]


def test_no_cli_module_uses_another_ones_private_names() -> None:
    found = {p.name: private_imports(p.read_text()) for p in sorted(CLI.glob("*.py"))}
    assert {name: names for name, names in found.items() if names} == {}


def test_tpufleet_help_lists_the_commands_in_their_order() -> None:
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    ctx = typer.Context(root)
    assert root.list_commands(ctx) == [
        *("catalog", "context", "doctor", "render", "lint", "up", "down", "attach", "serve"),
        *("tenants", "submit", "jobs", "job", "logs", "cancel", "slices", "status", "cost", "tokens"),
        *("events", "top", "demo", "chaos", "emulate", "tenant", "slice", "token", "db"),
    ]
    groups = {name: root.get_command(ctx, name) for name in ("tenant", "slice", "token")}
    assert {name: g.list_commands(ctx) for name, g in groups.items() if isinstance(g, TyperGroup)} == {
        "tenant": ["create", "update", "show", "delete"],
        "slice": ["drain", "undrain", "create", "delete", "utilization"],
        "token": ["create", "revoke", "rotate-admin"],
    }
