"""YAML a hostile file cannot use against its reader (issue 28): an alias bomb and a file past the
size limit end as one line, exit 2, in ``lint`` and ``render`` (``serve --fleet`` reads its spec
with the same ``read_spec``), instead of gigabytes of memory and a MemoryError traceback."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tracemalloc
from itertools import pairwise
from pathlib import Path

import pytest
from spec_builders import EXAMPLE

from tpufleet._yamlpos import load_documents
from tpufleet.errors import InputError
from tpufleet.spec import read_spec

NO_CLOUD = {"NO_GCE_CHECK": "true", "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9"}
LIMIT = 10 * 1024 * 1024  # characters in a YAML file (docs/lint.md)
CAP = 2 << 30  # the child's address space: on today's code the bomb ends there instead of at 3.9 GB


def bomb(levels: int = 9, width: int = 9, key: str = "bomb") -> str:
    """``levels`` lists of ``width`` aliases of the list before: width**levels nodes expanded."""
    names = [chr(ord("a") + i) for i in range(levels)]
    lines = [f"{key}:", f"  {names[0]}: &{names[0]} [{', '.join(['x'] * width)}]"]
    for prev, name in pairwise(names):
        lines.append(f"  {name}: &{name} [{', '.join([f'*{prev}'] * width)}]")
    return "\n".join(lines) + "\n"


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


def tpufleet(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **NO_CLOUD}
    return subprocess.run(
        [sys.executable, "-m", "tpufleet", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        preexec_fn=_limited,
    )


def one_line_exit_2(out: subprocess.CompletedProcess[str], says: str) -> None:
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr and says in out.stderr, out.stderr[-2000:]
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_the_9x9_alias_bomb_is_refused_by_lint_in_one_line(tmp_path: Path) -> None:
    """566 bytes: today 3.9 GB and a MemoryError traceback, exit 1."""
    path = tmp_path / "bomb.yaml"
    path.write_text("apiVersion: ray.io/v1\nkind: RayCluster\nmetadata:\n  name: x\n" + bomb(key="spec"))
    assert len(path.read_bytes()) < 600
    one_line_exit_2(tpufleet("lint", "--structural", str(path)), "over 100,000 nodes (the limit)")


def test_an_alias_bomb_in_a_fleet_spec_is_refused_by_render(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(EXAMPLE.read_text() + bomb(key="x-bomb"))
    one_line_exit_2(tpufleet("render", str(path), "--target", "kuberay"), "over 100,000 nodes")


def test_a_yaml_file_past_the_size_limit_is_refused(tmp_path: Path) -> None:
    """Today a 50 MB YAML took 44 s and 1.5 GB; nothing capped it."""
    path = tmp_path / "big.yaml"
    line = "# " + "x" * 1021 + "\n"
    path.write_text("kind: RayCluster\n" + line * (LIMIT // len(line) + 1))
    one_line_exit_2(tpufleet("lint", "--structural", str(path)), "over 10,485,760 characters")
    with pytest.raises(InputError, match="over 10,485,760 characters"):
        read_spec(path)


def test_the_alias_check_costs_no_more_than_the_file() -> None:
    text = bomb(levels=12, width=9)  # 282 billion nodes expanded; line 7 (9**6) is past the limit
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match="<input>:7: with its aliases expanded"):
            load_documents(text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20


def test_an_alias_inside_the_node_it_names_is_refused() -> None:
    with pytest.raises(InputError, match="a YAML alias inside the node it names"):
        load_documents("a: &a [1, *a]\n")


def test_aliases_within_the_limit_still_load_with_positions() -> None:
    text = bomb(levels=3, width=9)  # 9 + 81 + 729 nodes: a manifest's worth
    (doc,) = load_documents(text)
    assert len(doc.data["bomb"]["c"]) == 9 and doc.where(("bomb", "c")) == (4, 3)


def test_yaml_nested_past_the_limit_is_refused_before_it_is_built() -> None:
    """Today 5,000 nested lists were a RecursionError traceback (and 100,000 hang libyaml)."""
    with pytest.raises(InputError, match="<input>:1: YAML nested over 200 levels deep"):
        load_documents("[" * 5000 + "]" * 5000)
    load_documents("[" * 150 + "]" * 150)  # deep, but within the limit


def test_a_large_document_without_aliases_is_refused_at_the_node_limit() -> None:
    item = "- {name: worker, image: 'rayproject/ray:2.9', resources: {limits: {google.com/tpu: 4}}}\n"
    with pytest.raises(InputError, match="over 100,000 nodes"):
        load_documents(item * 20_000)  # 9 nodes an item
    assert len(load_documents(item * 1000)[0].data) == 1000
