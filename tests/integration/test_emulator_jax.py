"""Real multi-process JAX on the emulated fleet: Ray Train's JaxTrainer and examples/spmd_hello.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray
from ray.util import tpu

from tpufleet.contract import megascale_env
from tpufleet.emulator import EmulatedFleet
from tpufleet.emulator.plan import JAX_CACHE_VAR
from tpufleet.emulator.procs import free_ports

pytestmark = pytest.mark.integration

# Test modules are not importable on Ray workers: ship this module's functions by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

HELLO = Path(__file__).parents[2] / "examples" / "spmd_hello.py"


def _psum_loop() -> dict[str, object]:
    import os

    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((jax.device_count(),), ("i",))
    local = np.full((jax.local_device_count(),), jax.process_index() + 1, np.float32)
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("i")), local)
    psum = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P()))
    total = float(psum(x).addressable_data(0)[0])
    cache = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    return {"psum": total, "devices": jax.device_count(), "processes": jax.process_count(), "cache": cache}


def test_jax_trainer_runs_a_cross_host_psum_on_one_v4_slice(ray_client: object, tmp_path: Path) -> None:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.v2.jax import JaxTrainer

    trainer = JaxTrainer(
        train_loop_per_worker=_psum_loop,
        scaling_config=ScalingConfig(
            use_tpu=True, num_workers=2, topology="2x2x2", accelerator_type="TPU-V4"
        ),
        run_config=RunConfig(storage_path=str(tmp_path), name="psum"),
    )
    result = trainer.fit()
    # 2 processes x 4 CPU devices; process p contributes p+1 on each of its devices: 4*1 + 4*2.
    # The session's JAX compilation cache (tests/conftest.py), which every host shares; none on a
    # fleet of your own (TPUFLEET_TEST_FLEET_DIR) started without one.
    cache = os.environ.get(JAX_CACHE_VAR)
    assert result.return_value == {"psum": 12.0, "devices": 8, "processes": 2, "cache": cache}
    if "TPUFLEET_TEST_FLEET_DIR" not in os.environ:
        assert cache and [p for p in Path(cache).iterdir() if p.name.startswith("jit_")], "nothing cached"


@ray.remote
def _hello(script: str, names: list[str], coordinator: str, port: int) -> dict[str, object]:
    """One host: the contract is already in the environment; multi-slice adds MEGASCALE_*."""
    import os

    slice_id = names.index(os.environ["TPU_NAME"])
    env = dict(os.environ) | megascale_env(coordinator, len(names), slice_id)
    env["TPUFLEET_JAX_COORDINATOR_PORT"] = str(port)
    run = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=180)
    lines = [x for x in run.stdout.splitlines() if x.startswith("{")]
    return {"rc": run.returncode, "out": json.loads(lines[-1]) if lines else None, "err": run.stderr[-2000:]}


@pytest.mark.parametrize("num_slices", [1, 2])
def test_spmd_hello_on_every_host_of_one_and_two_slices(
    fleet: EmulatedFleet, ray_client: object, num_slices: int
) -> None:
    handle = tpu.slice_placement_group(topology="2x2x2", accelerator_version="v4", num_slices=num_slices)
    try:
        ray.get(handle.placement_group.ready(), timeout=120)
        names = sorted({sel["ray.io/tpu-slice-name"] for sel in handle.bundle_label_selector})
        address = fleet.status()["ray_address"].rsplit(":", 1)[0]
        (port,) = free_ports(1)
        refs = tpu.run_on_slice(_hello, str(HELLO), names, address, port, tpu_slice=handle)
        results = ray.get(refs, timeout=300)
    finally:
        handle.shutdown()
    assert len(names) == num_slices
    assert all(r["rc"] == 0 for r in results), [r["err"] for r in results]
    outs = [r["out"] for r in results]
    assert sorted(o["process_index"] for o in outs) == list(range(2 * num_slices))
    assert {(o["process_count"], o["devices"], o["local_devices"]) for o in outs} == {
        (2 * num_slices, 8 * num_slices, 4)
    }
    assert {o["sum"] for o in outs} == {outs[0]["expected"]}
