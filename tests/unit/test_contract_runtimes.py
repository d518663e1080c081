"""The contract libtpu, JAX and PyTorch/XLA read: an emulated host of each slice type has the worker
count, chips per host, bounds and worker addresses a real host of that type has.

REAL holds what a real host of each type has, with where each value was seen:

- v4-8, v4-16: torch_xla's own tests (pytorch/xla ``test/pjrt/test_experimental_tpu.py``) use a
  v4-16 TPU VM's metadata ``tpu-env`` (``CHIPS_PER_HOST_BOUNDS: '2,2,1'``, ``HOST_BOUNDS: '1,1,2'``)
  and a v4-8's (``TPU_PROCESS_BOUNDS: '1,1,1'``, ``TPU_CHIPS_PER_PROCESS_BOUNDS: '2,2,1'``).
- v4-256: a v4-256 TPU VM's ``tpu-env`` as torch_xla read it (``TOPOLOGY: '4x4x8'``,
  ``HOST_BOUNDS: '2,2,8'``, ``CHIPS_PER_HOST_BOUNDS: '2,2,1'``; penghao-wu/cambrian ``test_tpu.py``).
- v6e-16: a GKE v6e-16 pod's environment as printed by AI-Hypercomputer/torchprime's system check
  (``TPU_ACCELERATOR_TYPE=v6e-16``, ``TPU_TOPOLOGY=4x4``, ``TPU_HOST_BOUNDS=2,2,1``,
  ``TPU_CHIPS_PER_HOST_BOUNDS=2,2,1``, ``TPU_SKIP_MDS_QUERY=true``, four ``TPU_WORKER_HOSTNAMES``).
- v5litepod-4: a GKE v5litepod-4 pod's (``TPU_TOPOLOGY=2x2``, ``TPU_HOST_BOUNDS=1,1,1``,
  ``TPU_CHIPS_PER_HOST_BOUNDS=2,2,1``).
- v5litepod-16: Google's v5e page (cloud.google.com/tpu/docs/v5e: 4x4 on four ``ct5lp-hightpu-4t``
  hosts of 4 chips) and a v5litepod-16 ``tpu-env`` with ``CHIPS_PER_HOST_BOUNDS: '2,2,1'``
  (marin ``iris`` tests); ``HOST_BOUNDS`` 2,2,1 as on the v6e-16 above (same 4x4 of 2x2 hosts).
- v5p-16: Google's v5p page (2x2x2 on two ``ct5p-hightpu-4t`` hosts of 4 chips): as v4-16.
- single-host 8-chip (v5litepod-8, v6e-8: 2x4 on one ``-8t`` host) and 1-chip types: the host holds
  the whole topology, so ``TPU_HOST_BOUNDS`` is 1,1,1 (Ray's ``TPU_SINGLE_HOST_BOUNDS``) and the chips
  per host are the topology.
"""

from __future__ import annotations

import ast
import importlib.util
import math
import os
import re
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torchreq

from tpufleet import catalog, contract
from tpufleet.emulator import plan


class Real(NamedTuple):
    accelerator_type: str
    topology: str
    hosts: int
    chips_per_host: int
    host_bounds: str
    chips_per_host_bounds: str


REAL = [
    Real("v4-8", "2x2x1", 1, 4, "1,1,1", "2,2,1"),
    Real("v4-16", "2x2x2", 2, 4, "1,1,2", "2,2,1"),
    Real("v4-256", "4x4x8", 32, 4, "2,2,8", "2,2,1"),
    Real("v5p-16", "2x2x2", 2, 4, "1,1,2", "2,2,1"),
    Real("v5litepod-1", "1x1", 1, 1, "1,1,1", "1,1,1"),
    Real("v5litepod-4", "2x2", 1, 4, "1,1,1", "2,2,1"),
    Real("v5litepod-8", "2x4", 1, 8, "1,1,1", "2,4,1"),
    Real("v5litepod-16", "4x4", 4, 4, "2,2,1", "2,2,1"),
    Real("v6e-8", "2x4", 1, 8, "1,1,1", "2,4,1"),
    Real("v6e-16", "4x4", 4, 4, "2,2,1", "2,2,1"),
]
MULTI_HOST = [r for r in REAL if r.accelerator_type in ("v4-16", "v5litepod-16", "v6e-16", "v5p-16")]


def _emulated_hosts(real: Real) -> list[dict[str, str]]:
    return plan.host_envs(
        f"tpu-{real.accelerator_type}-0", catalog.slice_type(real.accelerator_type), "10.1.2.3"
    )


@pytest.mark.parametrize("real", REAL, ids=lambda r: r.accelerator_type)
def test_an_emulated_host_has_the_bounds_and_shape_of_a_real_host(real: Real) -> None:
    envs = _emulated_hosts(real)
    assert len(envs) == real.hosts
    for worker, env in enumerate(envs):
        assert env["TPU_ACCELERATOR_TYPE"] == real.accelerator_type
        assert env["TPU_TOPOLOGY"] == real.topology
        assert env["TPU_WORKER_ID"] == str(worker)
        assert env["TPU_HOST_BOUNDS"] == real.host_bounds
        assert env["TPU_CHIPS_PER_HOST_BOUNDS"] == real.chips_per_host_bounds
        # no metadata server on an emulated host: libtpu and torch_xla read the variables, as on GKE
        assert env["TPU_SKIP_MDS_QUERY"] == "true"
        # never the per-process bounds: torch_xla's xmp.spawn sets them per process (setdefault)
        assert not {"TPU_PROCESS_BOUNDS", "TPU_CHIPS_PER_PROCESS_BOUNDS", "CLOUD_TPU_TASK_ID"} & env.keys()
        chips = math.prod(int(d) for d in env["TPU_CHIPS_PER_HOST_BOUNDS"].split(","))
        assert chips == real.chips_per_host
        assert env["XLA_FLAGS"] == f"--xla_force_host_platform_device_count={chips}"
        hosts = math.prod(int(d) for d in env["TPU_HOST_BOUNDS"].split(","))
        assert hosts == real.hosts
        if real.hosts > 1:
            assert env["TPU_WORKER_HOSTNAMES"].split(",") == ["10.1.2.3"] * real.hosts
        else:
            assert "TPU_WORKER_HOSTNAMES" not in env  # as the webhook does on a single-host slice


def test_every_catalog_slice_type_has_bounds_that_multiply_to_its_hosts_and_chips() -> None:
    for st in catalog.all_slice_types():
        assert math.prod(st.host_bounds) == st.hosts, st
        assert math.prod(st.chips_per_host_bounds) == st.chips_per_host, st
        assert math.prod(st.host_bounds) * math.prod(st.chips_per_host_bounds) == st.chips, st


def test_a_real_hosts_worker_addresses_are_the_slices_in_worker_order() -> None:
    st = catalog.slice_type("v6e-16")
    addresses = [f"10.0.0.{i}" for i in range(4)]
    env = contract.host_env("train-0", st, 2, addresses)
    assert env["TPU_WORKER_HOSTNAMES"] == "10.0.0.0,10.0.0.1,10.0.0.2,10.0.0.3"
    assert (env["TPU_HOST_BOUNDS"], env["TPU_CHIPS_PER_HOST_BOUNDS"]) == ("2,2,1", "2,2,1")
    # the per-attempt contract leaves TPU_SKIP_MDS_QUERY to the host: a GCE TPU VM answers metadata
    assert "TPU_SKIP_MDS_QUERY" not in env


# -- torch_xla's own discovery functions, on an emulated host -------------------------------------
# torch_xla/_internal/tpu.py imports torch and torch_xla at its top, so its functions are taken out of
# the installed file (ast) and run against a copy of the host's environment: torch_xla's own code, no
# torch, no global state touched. Skipped where torch_xla is not installed.

_TPU_FUNCS = {
    "TpuEnv",
    "MeshShape",
    "_using_env_vars",
    "build_tpu_env_from_vars",
    "get_tpu_env",
    "version",
    "worker_id",
    "get_worker_ips",
    "num_tpu_workers",
    "configure_topology",
}


def _defs(path: Path, names: set[str]) -> ast.Module:
    tree = ast.parse(path.read_text(), str(path))
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name in names]
    assert {n.name for n in defs} == names, f"{path} changed: looked for {sorted(names)}"
    body: list[ast.stmt] = list(defs)
    return ast.Module(body=body, type_ignores=[])


def _torch_xla_tpu(environ: dict[str, str]) -> dict[str, Any]:
    """torch_xla's TPU discovery functions, reading and writing ``environ``."""
    torchreq.require("torch_xla")  # its discovery code is what these tests run
    spec = importlib.util.find_spec("torch_xla")  # finds the package without importing it (or torch)
    assert spec is not None and spec.submodule_search_locations
    root = Path(next(iter(spec.submodule_search_locations)))
    fake_os = types.SimpleNamespace(environ=environ, path=os.path, getenv=environ.get)
    xenv = types.SimpleNamespace()
    exec(compile((root / "core" / "xla_env_vars.py").read_text(), "xla_env_vars.py", "exec"), vars(xenv))
    xu = types.SimpleNamespace()
    vars(xu).update(os=fake_os)
    exec(compile(_defs(root / "utils" / "utils.py", {"getenv_as"}), "utils.py", "exec"), vars(xu))

    def no_metadata(key: str) -> str:
        raise AssertionError(f"torch_xla asked the metadata server for {key!r}: TPU_SKIP_MDS_QUERY unset")

    ns: dict[str, Any] = {
        "os": fake_os,
        "re": re,
        "functools": __import__("functools"),
        "operator": __import__("operator"),
        "NamedTuple": NamedTuple,
        "Optional": __import__("typing").Optional,
        "List": list,
        "TypedDict": __import__("typing").TypedDict,
        "requests": types.SimpleNamespace(HTTPError=type("HTTPError", (Exception,), {})),
        "xu": xu,
        "xenv": xenv,
        "_get_metadata": no_metadata,
    }
    path = root / "_internal" / "tpu.py"
    exec(compile(_defs(path, _TPU_FUNCS), str(path), "exec"), ns)
    return ns


@pytest.mark.parametrize("real", MULTI_HOST, ids=lambda r: r.accelerator_type)
def test_torch_xlas_own_discovery_finds_the_real_slice_on_an_emulated_host(real: Real) -> None:
    envs = _emulated_hosts(real)
    for worker, host in enumerate(envs):
        env = dict(host)
        tpu = _torch_xla_tpu(env)
        found = tpu["get_tpu_env"]()
        assert found == {
            "ACCELERATOR_TYPE": real.accelerator_type,
            "TPU_PROCESS_BOUNDS": real.host_bounds,
            "TPU_CHIPS_PER_PROCESS_BOUNDS": real.chips_per_host_bounds,
            "WORKER_ID": str(worker),
        }
        assert tpu["worker_id"]() == worker
        assert tpu["num_tpu_workers"]() == real.hosts
        assert tpu["get_worker_ips"]() == ["10.1.2.3"] * real.hosts
        assert tpu["version"]() == int(real.accelerator_type[1])
        # xmp.spawn on this host: one process per chip; torch_xla's own arithmetic gives each its
        # global task id and the per-chip process grid of the whole slice
        configure: Callable[[int, int], None] = tpu["configure_topology"]
        configure(1, real.chips_per_host)
        per_chip = [
            h * c for h, c in zip(_dims(real.host_bounds), _dims(real.chips_per_host_bounds), strict=True)
        ]
        assert env["TPU_PROCESS_BOUNDS"] == ",".join(map(str, per_chip))
        assert env["CLOUD_TPU_TASK_ID"] == str(worker * real.chips_per_host + 1)
        assert len(env["TPU_PROCESS_ADDRESSES"].split(",")) == real.hosts * real.chips_per_host


def _dims(bounds: str) -> list[int]:
    return [int(d) for d in bounds.split(",")]


def test_torch_xla_on_a_single_host_slice_sees_one_worker_on_localhost() -> None:
    (host,) = _emulated_hosts(REAL[0])  # v4-8
    env = dict(host)
    tpu = _torch_xla_tpu(env)
    assert tpu["get_worker_ips"]() == ["localhost"]
    assert tpu["num_tpu_workers"]() == 1
    assert tpu["get_tpu_env"]()["TPU_PROCESS_BOUNDS"] == "1,1,1"
