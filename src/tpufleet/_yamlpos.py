"""YAML with line numbers: parse documents and remember where every key and list item starts.

Shared by the fleet spec loader and the manifest linter so both can point at ``file:line:col``.
A path is a tuple of mapping keys (str) and list indices (int), the same shape as a pydantic
error ``loc``; positions are 1-based ``(line, column)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from tpufleet.errors import InputError

__all__ = ["Document", "Path", "dotted", "load_documents"]

Path = tuple[str | int, ...]

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class Document:
    """One YAML document: its data and where each path starts in the file."""

    data: Any
    positions: dict[Path, tuple[int, int]] = field(hash=False)
    start: tuple[int, int] = (1, 1)

    def where(self, path: Sequence[str | int]) -> tuple[int, int]:
        """The position of ``path``, or of its nearest ancestor that exists in the file."""
        probe = tuple(path)
        while probe:
            if probe in self.positions:
                return self.positions[probe]
            probe = probe[:-1]
        return self.start


def _mark(node: yaml.Node) -> tuple[int, int]:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


def _walk(node: yaml.Node, path: Path, out: dict[Path, tuple[int, int]]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode):
                continue
            sub = (*path, str(key.value))
            out.setdefault(sub, _mark(key))
            _walk(value, sub, out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            sub = (*path, index)
            out.setdefault(sub, _mark(item))
            _walk(item, sub, out)


def load_documents(text: str, file: str = "<input>") -> list[Document]:
    """Every document in ``text`` with positions; empty documents are skipped.

    Raises :class:`InputError` naming the file, line and column when the YAML does not parse.
    """
    try:
        nodes = list(yaml.compose_all(text, Loader=_Loader))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark else file
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise InputError(f"{where}: not valid YAML: {problem}") from None
    docs: list[Document] = []
    for node in nodes:
        if node is None:
            continue
        constructor = yaml.constructor.SafeConstructor()
        try:
            data = constructor.construct_document(node)
        except yaml.YAMLError as err:
            raise InputError(f"{file}:{_mark(node)[0]}: not valid YAML: {err}") from None
        positions: dict[Path, tuple[int, int]] = {}
        _walk(node, (), positions)
        docs.append(Document(data, positions, _mark(node)))
    return docs


def dotted(path: Sequence[str | int]) -> str:
    """``("spec", "workerGroupSpecs", 0, "template")`` -> ``spec.workerGroupSpecs[0].template``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out
