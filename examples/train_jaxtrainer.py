"""Train the MLP of train_mlp.py with Ray Train's JaxTrainer, fed by a Ray Data pipeline.

A Ray job (``tpufleet submit --ray --type v4-16 --working-dir examples -- python train_jaxtrainer.py``):
this script is the driver; it runs once, on the Ray head. Ray Data reads a synthetic table
(``ray.data.range``), maps it to features and targets, and hands each Train worker its own shard
(``get_dataset_shard``); the workers, one per TPU host of the slice tpufleet admitted, train the
model data-parallel (gradients averaged over every device of every host by XLA), report metrics and,
every ``--checkpoint-every`` steps, a checkpoint. Ray Train restores the newest checkpoint when the
run starts again with the same ``RunConfig`` (``tpufleet.runtime.run_config()``: the job's
checkpoint directory and id), so the attempt after a failed or stopped one continues where it left
off. A stop (preemption, cancel) is SIGTERM to this driver: ``tpufleet.runtime.handle_stop_signal()``
keeps it alive a few seconds so that Ray Train records the checkpoints already reported.

``tpufleet.runtime.scaling_config()`` gives the ScalingConfig of the admitted slices (workers,
topology, accelerator type); outside tpufleet the script uses one v4-16 (``2x2x2``).

Each worker prints ``worker <rank> on <TPU_NAME>/<TPU_WORKER_ID>`` (the host it landed on), and the
driver prints the final metrics as one JSON line.

``--data memory`` leaves Ray Data out: each worker makes its own rows of the same table in memory.
The tests that check where Ray Train lands use it, since a Ray Data pipeline starts about a dozen
processes of its own (its coordinator and stats actors, a worker per map task), which cost a
2-core machine more than the training does.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

IN, HIDDEN, OUT = 32, 64, 1


def features(batch: dict[str, Any]) -> dict[str, Any]:
    """The map step: row ids -> (x, y) of a fixed synthetic regression."""
    import numpy as np

    ids = batch["id"]
    x = np.stack([np.random.default_rng(int(i)).normal(size=IN) for i in ids]).astype(np.float32)
    true_w = np.random.default_rng(0).normal(size=(IN, OUT)).astype(np.float32)
    return {"x": x, "y": np.tanh(x @ true_w)}


def train_loop(config: dict[str, Any]) -> None:
    """One Train worker, on one TPU host: data-parallel steps over every device of every worker."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    from ray import train

    rank = train.get_context().get_world_rank()
    print(
        f"worker {rank} on {os.environ.get('TPU_NAME')}/{os.environ.get('TPU_WORKER_ID')} "
        f"({jax.process_count()} processes, {jax.device_count()} devices)",
        flush=True,
    )
    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    local_rows = config["batch_per_device"] * jax.local_device_count()
    global_rows = local_rows * jax.process_count()

    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    params = {
        "w1": jax.random.normal(k1, (IN, HIDDEN)) / np.sqrt(IN),
        "b1": jnp.zeros(HIDDEN),
        "w2": jax.random.normal(k2, (HIDDEN, OUT)) / np.sqrt(HIDDEN),
        "b2": jnp.zeros(OUT),
    }
    step = 0
    restored = train.get_checkpoint()
    if restored is not None:
        with restored.as_directory() as where:
            state = pickle.loads((Path(where) / "state.pkl").read_bytes())
        step, params = state["step"], {k: jnp.asarray(v) for k, v in state["params"].items()}
        print(f"worker {rank} restored step {step} from {restored.path}", flush=True)
    params = jax.device_put(params, replicated)

    def loss_fn(p: Any, x: Any, y: Any) -> Any:
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)

    @jax.jit
    def train_step(p: Any, x: Any, y: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        return jax.tree.map(lambda a, g: a - config["lr"] * g, p, grads), loss

    epoch = _epochs(train, config, rank, local_rows)
    while step < config["steps"]:
        for batch in epoch():
            if step >= config["steps"]:
                break
            step += 1
            gx = jax.make_array_from_process_local_data(sharded, batch["x"], (global_rows, IN))
            gy = jax.make_array_from_process_local_data(sharded, batch["y"], (global_rows, OUT))
            params, loss = train_step(params, gx, gy)
            metrics = {"step": step, "loss": float(loss), "tpu_name": os.environ.get("TPU_NAME", "")}
            if rank == 0:
                print(f"step {step} loss {metrics['loss']:.5f}", flush=True)
            if step % config["checkpoint_every"] == 0 or step == config["steps"]:
                _report_with_checkpoint(train, rank, step, params, metrics)
            else:
                train.report(metrics)
            time.sleep(config["step_time"])


def _epochs(train: Any, config: dict[str, Any], rank: int, local_rows: int) -> Callable[[], Iterable[Any]]:
    """Each call, one pass over this worker's rows: its Ray Data shard, or (``--data memory``) the
    batches :func:`_memory_batches` made once."""
    if config["data"] == "memory":
        mine = _memory_batches(config, rank, local_rows)
        return lambda: mine
    shard = train.get_dataset_shard("train")
    return lambda: shard.iter_batches(batch_size=local_rows, batch_format="numpy", drop_last=True)


def _memory_batches(config: dict[str, Any], rank: int, local_rows: int) -> list[dict[str, Any]]:
    """This worker's share of the table, made here instead of by Ray Data (``--data memory``): the
    rows ``rank, rank + workers, ...``, mapped by ``features``, in batches of ``local_rows``."""
    import numpy as np

    mine = np.arange(rank, config["rows"], config["workers"])
    count = len(mine) // local_rows
    return [features({"id": mine[i * local_rows : (i + 1) * local_rows]}) for i in range(count)]


def _report_with_checkpoint(train: Any, rank: int, step: int, params: Any, metrics: dict[str, Any]) -> None:
    """Every worker reports; worker 0 also hands Ray Train the parameters as a checkpoint, and says
    so first: a stop can end the worker right after Ray Train has taken the checkpoint, so a line
    printed after ``report`` may never be written for a checkpoint the next attempt restores."""
    import jax
    import numpy as np

    host = {k: np.asarray(jax.device_get(v)) for k, v in params.items()}  # every process takes part
    with tempfile.TemporaryDirectory() as where:
        checkpoint = None
        if rank == 0:
            (Path(where) / "state.pkl").write_bytes(pickle.dumps({"step": step, "params": host}))
            checkpoint = train.Checkpoint.from_directory(where)
            print(f"checkpoint at step {step}", flush=True)
        train.report(metrics, checkpoint=checkpoint)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--checkpoint-every", type=int, default=5)
    ap.add_argument("--batch-per-device", type=int, default=4)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument(
        "--blocks",
        type=int,
        default=0,
        help="blocks Ray Data splits the table into (default: one per Train worker; Ray Data's own "
        "default of 200 or more maps a few rows per task and starts a worker per free CPU to do it)",
    )
    ap.add_argument(
        "--data",
        choices=("ray", "memory"),
        default="ray",
        help="ray: a Ray Data pipeline feeds the workers; memory: each worker makes its own rows",
    )
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step (demo pacing)")
    args = ap.parse_args()

    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.v2.jax import JaxTrainer

    from tpufleet import runtime

    ray.init()  # a Ray job's driver: joins the cluster it was submitted to

    # tpufleet stops a Ray job (preemption, cancel, a lost host) with Ray's job stop: SIGTERM here.
    # The handler lives on a few seconds so that Ray Train records the checkpoints the workers have
    # already reported (its controller does so when it next polls them), then dies of the signal.
    runtime.handle_stop_signal()
    if os.environ.get("TPUFLEET_JOB_KIND") == "ray":
        scaling, run = runtime.scaling_config(), runtime.run_config()
    else:
        scaling = ScalingConfig(use_tpu=True, num_workers=2, topology="2x2x2", accelerator_type="TPU-V4")
        run = RunConfig(storage_path=tempfile.mkdtemp(prefix="jaxtrainer-"), name="mlp")
    config = {
        k: getattr(args, k)
        for k in ("steps", "checkpoint_every", "batch_per_device", "lr", "step_time", "rows", "data")
    }
    config["workers"] = scaling.num_workers
    datasets = {}
    if args.data == "ray":
        blocks = args.blocks or scaling.num_workers
        table = ray.data.range(args.rows, override_num_blocks=blocks)
        datasets["train"] = table.map_batches(features, batch_format="numpy")
    trainer = JaxTrainer(
        train_loop,
        train_loop_config=config,
        scaling_config=scaling,
        run_config=run,
        datasets=datasets or None,
    )
    result = trainer.fit()
    final = {
        "metrics": result.metrics,
        "checkpoint": str(result.checkpoint.path) if result.checkpoint else None,
    }
    print("RESULT " + json.dumps(final), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
