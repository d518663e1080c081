"""runtime.distributed_args: coordinator, process count and id from the host contract."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tpufleet.runtime import DistributedArgs, distributed_args, is_emulated

TWO = "10.0.0.1,10.0.0.2"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, DistributedArgs("127.0.0.1:8482", 1, 0)),
        ({"TPU_WORKER_HOSTNAMES": TWO, "TPU_WORKER_ID": "1"}, DistributedArgs("10.0.0.1:8482", 2, 1)),
        (
            {"TPU_WORKER_HOSTNAMES": TWO, "TPU_WORKER_ID": "1", "TPUFLEET_JAX_COORDINATOR_PORT": "5000"},
            DistributedArgs("10.0.0.1:5000", 2, 1),
        ),
        (
            {"TPU_WORKER_HOSTNAMES": TWO, "JAX_COORDINATOR_PORT": "7000"},
            DistributedArgs("10.0.0.1:7000", 2, 0),
        ),
        (
            {
                "TPU_WORKER_HOSTNAMES": TWO,
                "TPU_WORKER_ID": "1",
                "MEGASCALE_COORDINATOR_ADDRESS": "10.9.9.9",
                "MEGASCALE_NUM_SLICES": "3",
                "MEGASCALE_SLICE_ID": "2",
            },
            DistributedArgs("10.9.9.9:8482", 6, 5),
        ),
        (  # one slice: a stale MEGASCALE_COORDINATOR_ADDRESS is ignored
            {"TPU_WORKER_HOSTNAMES": TWO, "MEGASCALE_COORDINATOR_ADDRESS": "10.9.9.9:8081"},
            DistributedArgs("10.0.0.1:8482", 2, 0),
        ),
        (
            {
                "MEGASCALE_COORDINATOR_ADDRESS": "10.9.9.9:8081",
                "MEGASCALE_NUM_SLICES": "2",
                "MEGASCALE_SLICE_ID": "1",
            },
            DistributedArgs("10.9.9.9:8482", 2, 1),
        ),
    ],
)
def test_distributed_args(env: dict[str, str], expected: DistributedArgs) -> None:
    assert distributed_args(env) == expected


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TPU_WORKER_HOSTNAMES": TWO, "TPU_WORKER_ID": "2"}, "TPU_WORKER_ID=2 but TPU_WORKER_HOSTNAMES"),
        ({"MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "2"}, "MEGASCALE_SLICE_ID=2 but"),
        ({"TPU_WORKER_ID": "one"}, "TPU_WORKER_ID='one' is not a whole number"),
        # multi-slice without the coordinator: each slice would wait on its own host 0 forever
        (
            {"TPU_WORKER_HOSTNAMES": TWO, "MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "1"},
            "MEGASCALE_COORDINATOR_ADDRESS is not set",
        ),
    ],
)
def test_inconsistent_contracts_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        distributed_args(env)


def test_is_emulated_reads_the_marker() -> None:
    assert is_emulated({"TPUFLEET_EMULATED": "1"}) and not is_emulated({})


def test_runtime_imports_without_jax() -> None:
    code = "import sys, tpufleet.runtime; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
