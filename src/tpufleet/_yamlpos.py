"""YAML with line numbers: parse documents and remember where every key and list item starts.

Shared by the fleet spec loader and the manifest linter so both can point at ``file:line:col``.
A path is a tuple of mapping keys (str) and list indices (int), the same shape as a pydantic
error ``loc``; positions are 1-based ``(line, column)``.

Every reader goes through here, so the limits hold for ``lint``, ``render`` and ``serve --fleet``
alike: a file of at most ``MAX_YAML_CHARS`` characters (10 MiB; :func:`read_yaml` reads no more),
nested at most ``MAX_YAML_DEPTH`` levels, and at most ``MAX_YAML_NODES`` nodes per document once its
aliases are expanded (an alias bomb of a few hundred bytes expands to billions). Past any, one
:class:`InputError` line (exit 2).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from tpufleet.errors import InputError

__all__ = [
    "MAX_YAML_CHARS",
    "MAX_YAML_DEPTH",
    "MAX_YAML_NODES",
    "Document",
    "Path",
    "dotted",
    "load_documents",
    "read_yaml",
]

Path = tuple[str | int, ...]
MAX_YAML_CHARS = 10 * 1024 * 1024  # a file; real manifests and fleet specs are a few KiB
MAX_YAML_NODES = 100_000  # per document, aliases expanded: KubeRay manifests have a few hundred
MAX_YAML_DEPTH = 200  # mappings and lists inside each other: a Kubernetes manifest nests about 15

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


def _measure(text: str, file: str) -> None:
    """Refuse, from the parser's events and before anything is built, YAML nested past
    ``MAX_YAML_DEPTH``, a document past ``MAX_YAML_NODES`` nodes with its aliases expanded (an alias
    counts as the size of the node it names), or an alias inside the node it names. Stops at the
    first event past a limit, so an alias bomb or a deep nest costs no more than its prefix."""
    sizes: dict[str, int] = {}  # anchor -> nodes it stands for
    stack: list[tuple[str | None, list[int]]] = []  # open collections: anchor, [nodes so far]
    total = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.DocumentStartEvent):
            sizes, total = {}, 0
            continue
        if isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent):
            stack.append((event.anchor, [1]))
            if len(stack) > MAX_YAML_DEPTH:
                raise InputError(
                    f"{_at(file, event)}: YAML nested over {MAX_YAML_DEPTH} levels deep (the limit)"
                )
            added = 1
        elif isinstance(event, yaml.SequenceEndEvent | yaml.MappingEndEvent):
            anchor, (size,) = stack.pop()
            if anchor is not None:
                sizes[anchor] = size
            if stack:
                stack[-1][1][0] += size
            continue
        elif isinstance(event, yaml.AliasEvent):
            if any(anchor == event.anchor for anchor, _ in stack):
                raise InputError(f"{_at(file, event)}: a YAML alias inside the node it names (a loop)")
            added = sizes.get(str(event.anchor), 1)  # an unknown anchor: the composer says so
        elif isinstance(event, yaml.ScalarEvent):
            added = 1
            if event.anchor is not None:
                sizes[event.anchor] = 1
        else:
            continue
        if stack and not isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent):
            stack[-1][1][0] += added
        total += added
        if total > MAX_YAML_NODES:
            raise InputError(
                f"{_at(file, event)}: with its aliases expanded this YAML has over {MAX_YAML_NODES:,} "
                "nodes (the limit); write repeated parts out or use fewer aliases"
            )


def _at(file: str, event: yaml.Event) -> str:
    mark = event.start_mark
    return f"{file}:{mark.line + 1}" if mark is not None else file


def read_yaml(path: str | os.PathLike[str]) -> str:
    """The text of a YAML file, reading at most ``MAX_YAML_CHARS`` (+1) characters; InputError past
    that. OSError and UnicodeDecodeError are the caller's to word."""
    with open(path, encoding="utf-8") as f:
        text = f.read(MAX_YAML_CHARS + 1)
    _check_size(text, str(path))
    return text


def _check_size(text: str, file: str) -> None:
    if len(text) > MAX_YAML_CHARS:
        raise InputError(
            f"{file}: over {MAX_YAML_CHARS:,} characters (the limit for a YAML file); split it up"
        )


def load_documents(text: str, file: str = "<input>") -> list[Document]:
    """Every document in ``text`` with positions; empty documents are skipped.

    Raises :class:`InputError` naming the file, line and column when the YAML does not parse, and
    when it is past the size or the expanded-node limit.
    """
    _check_size(text, file)
    try:
        _measure(text, file)
        nodes = list(yaml.compose_all(text, Loader=_Loader))
    except yaml.YAMLError as err:
        raise InputError(f"{_place(err, file)}: not valid YAML: {_problem(err)}") from None
    docs: list[Document] = []
    for node in nodes:
        if node is None:
            continue
        constructor = yaml.constructor.SafeConstructor()
        try:
            data = constructor.construct_document(node)
        except yaml.YAMLError as err:  # a tag the safe loader does not build (!!python/object...)
            raise InputError(f"{_place(err, file, node)}: not valid YAML: {_problem(err)}") from None
        positions: dict[Path, tuple[int, int]] = {}
        _walk(node, (), positions)
        docs.append(Document(data, positions, _mark(node)))
    return docs


def _place(err: yaml.YAMLError, file: str, node: yaml.Node | None = None) -> str:
    """``file:line:column`` of what ``err`` is about: its problem's mark, else ``node``'s line."""
    mark = getattr(err, "problem_mark", None)
    if mark is not None:
        return f"{file}:{mark.line + 1}:{mark.column + 1}"
    return f"{file}:{_mark(node)[0]}" if node is not None else file


def _problem(err: yaml.YAMLError) -> str:
    """What ``err`` says, on one line (PyYAML adds the mark on lines of its own)."""
    return getattr(err, "problem", None) or str(err).splitlines()[0]


def dotted(path: Sequence[str | int]) -> str:
    """``("spec", "workerGroupSpecs", 0, "template")`` -> ``spec.workerGroupSpecs[0].template``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out
