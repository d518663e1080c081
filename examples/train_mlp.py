"""Train a small MLP data-parallel over every chip of its slice(s), with checkpoints and resume.

Run on every host of a slice, SPMD style (``tpufleet submit --type v4-16 -- python examples/train_mlp.py``).
Each host feeds its share of a synthetic regression batch; gradients are averaged over all devices
of all hosts by XLA (a cross-host all-reduce: ICI/DCN on real TPUs, gloo on the emulator). The loss
is printed every step, and process 0 reports it to tpufleet (``tpufleet.runtime.report_step``, for
goodput). Every ``--checkpoint-every`` steps process 0 writes parameters and the step to
``$TPUFLEET_CHECKPOINT_DIR`` (atomically); on start every process resumes from the newest
checkpoint, so a preempted or failed attempt continues where it left off.

Outside tpufleet (no ``TPU_WORKER_ID``) it runs as one process on the local devices.
"""

from __future__ import annotations

import argparse
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

IN, HIDDEN, OUT = 32, 64, 1


def init_params(key: jax.Array) -> dict[str, jax.Array]:
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (IN, HIDDEN)) * (1.0 / np.sqrt(IN)),
        "b1": jnp.zeros(HIDDEN),
        "w2": jax.random.normal(k2, (HIDDEN, OUT)) * (1.0 / np.sqrt(HIDDEN)),
        "b2": jnp.zeros(OUT),
    }


def loss_fn(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] + params["b2"] - y) ** 2)


def synthetic_batch(step: int, rows: int, first_row: int) -> tuple[np.ndarray, np.ndarray]:
    """This process's rows of the global batch for ``step``: the same global data on any topology."""
    rng = np.random.default_rng(step)
    true_w = np.random.default_rng(0).normal(size=(IN, OUT)).astype(np.float32)
    x = rng.normal(size=(first_row + rows, IN)).astype(np.float32)[first_row:]
    return x, np.tanh(x @ true_w)


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    found = sorted(ckpt_dir.glob("step-*.pkl"), key=lambda p: int(p.stem.split("-")[1]))
    return found[-1] if found else None


def save_checkpoint(ckpt_dir: Path, step: int, params: dict[str, jax.Array]) -> Path:
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"step-{step}.pkl"
    tmp = final.with_suffix(".tmp")
    host = {k: np.asarray(jax.device_get(v)) for k, v in params.items()}
    tmp.write_bytes(pickle.dumps({"step": step, "params": host}))
    os.replace(tmp, final)  # atomic: a reader sees a whole checkpoint or none
    return final


def _step_reporter() -> Callable[[int], None]:
    """``tpufleet.runtime.report_step`` when tpufleet is importable, else a no-op (run anywhere)."""
    try:
        from tpufleet.runtime import report_step
    except ImportError:
        return lambda step: None
    return report_step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--batch-per-device", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step (demo pacing)")
    args = ap.parse_args()

    report_step = _step_reporter()
    if os.environ.get("TPU_WORKER_ID") is not None:
        from tpufleet.runtime import initialize_jax

        initialize_jax()
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))  # preemption: checkpoint, then exit

    pid, nproc = jax.process_index(), jax.process_count()
    devices = np.array(jax.devices())
    mesh = Mesh(devices, ("data",))
    replicated, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    local_rows = args.batch_per_device * jax.local_device_count()
    global_rows = local_rows * nproc

    ckpt_dir = Path(os.environ.get("TPUFLEET_CHECKPOINT_DIR", "./checkpoints"))
    start, params = 0, init_params(jax.random.PRNGKey(0))
    if (ckpt := latest_checkpoint(ckpt_dir)) is not None:
        state = pickle.loads(ckpt.read_bytes())
        start, params = state["step"], {k: jnp.asarray(v) for k, v in state["params"].items()}
        print(f"[{pid}] resumed from {ckpt.name} (step {start})", flush=True)
    params = jax.device_put(params, replicated)

    @jax.jit
    def train_step(p, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        return jax.tree.map(lambda a, g: a - args.lr * g, p, grads), loss

    print(
        f"[{pid}] {nproc} process(es), {jax.device_count()} devices, global batch {global_rows}, "
        f"attempt {os.environ.get('TPUFLEET_ATTEMPT', '-')}",
        flush=True,
    )
    step = start
    for step in range(start + 1, args.steps + 1):
        x, y = synthetic_batch(step, local_rows, pid * local_rows)
        gx = jax.make_array_from_process_local_data(sharded, x, (global_rows, IN))
        gy = jax.make_array_from_process_local_data(sharded, y, (global_rows, OUT))
        params, loss = train_step(params, gx, gy)
        print(f"[{pid}] step {step} loss {float(loss):.5f}", flush=True)
        report_step(step)  # goodput: process 0 tells tpufleet how far it got (cheap; no-op elsewhere)
        if (step % args.checkpoint_every == 0 or step == args.steps or stop["now"]) and pid == 0:
            print(f"[{pid}] checkpoint {save_checkpoint(ckpt_dir, step, params).name}", flush=True)
        if stop["now"]:
            print(f"[{pid}] stopping at step {step} on SIGTERM", flush=True)
            return 143
        time.sleep(args.step_time)
    print(f"[{pid}] done at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
