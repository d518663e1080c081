"""The guides' Ray Train ``TorchTrainer``, made to run under tpufleet: data-parallel PyTorch on the slices
tpufleet admitted, one Train worker per host, with checkpoints that the next attempt restores.

A Ray job (``tpufleet submit --ray --type v4-16 --working-dir examples -- python train_torchtrainer.py``):
this script is the driver; it runs once, on the Ray head. What changed from the guide's program
(docs/pytorch.md says why):

- ``ScalingConfig`` comes from ``tpufleet.runtime.torch_scaling_config()``: one worker per host of
  every admitted slice, each placed on its host by Ray's TPU node labels. It asks Ray for no ``TPU``
  resource: in Ray 2.60 a Torch worker holding TPU chips gets TorchTPU's device manager
  (``torch_tpu``), which fails without TorchTPU. No chip mask (``TPU_VISIBLE_CHIPS``) is set, so the
  worker's process drives all of its host's chips, as PyTorch/XLA wants; the slice is the job's
  anyway (tpufleet admits whole slices). The guide's ``num_workers=4,
  resources_per_worker={"TPU": 1}`` asks for four one-chip workers, which Ray Train V2 refuses
  without ``use_tpu=True``.
- ``DistributedDataParallel`` over ``gloo`` (TorchTrainer's default without ``use_tpu``)
  synchronises the workers, not ``xm.optimizer_step``: on the emulator PyTorch/XLA has no
  collectives across processes. Each worker trains on its own data; every worker prints a digest of
  its parameters at the end, the same on all of them.
- ``RunConfig`` from ``tpufleet.runtime.run_config()`` and ``handle_stop_signal()``, as in
  ``train_jaxtrainer.py``: an attempt after a preemption or a lost host restores the newest
  checkpoint.

Each worker prints ``worker <rank> on <TPU_NAME>/<TPU_WORKER_ID>, <backend>, <world> ranks,
TPU_VISIBLE_CHIPS=<its chip mask or unset>``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

IN, HIDDEN = 16, 32


def train_loop(config: dict[str, Any]) -> None:
    """One Train worker, on one TPU host."""
    import torch
    import torch.distributed as dist
    from ray import train
    from torch.nn.parallel import DistributedDataParallel

    rank, world = train.get_context().get_world_rank(), train.get_context().get_world_size()
    mask = os.environ.get("TPU_VISIBLE_CHIPS", "unset")
    print(
        f"worker {rank} on {os.environ.get('TPU_NAME')}/{os.environ.get('TPU_WORKER_ID')}, "
        f"{dist.get_backend()}, {world} ranks, TPU_VISIBLE_CHIPS={mask}",
        flush=True,
    )
    torch.manual_seed(1000 + rank)  # its own start: DDP gives every worker rank 0's
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1))
    step = 0
    restored = train.get_checkpoint()
    if restored is not None:
        with restored.as_directory() as where:
            state = torch.load(Path(where) / "model.pt", map_location="cpu")
        model.load_state_dict(state["model"])
        step = state["step"]
        print(f"worker {rank} restored step {step} from {restored.path}", flush=True)
    model = DistributedDataParallel(model)  # on the host's CPU; rank 0's weights to every worker
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    while step < config["steps"]:
        step += 1
        gen = torch.Generator().manual_seed(rank * 1_000_003 + step)  # its own data
        x = torch.randn(32, IN, generator=gen)
        y = torch.tanh(x.sum(dim=1, keepdim=True) / 4)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        metrics = {"step": step, "loss": float(loss.detach())}
        if step % config["checkpoint_every"] == 0 or step == config["steps"]:
            with tempfile.TemporaryDirectory() as where:
                checkpoint = None
                if rank == 0:
                    torch.save({"step": step, "model": model.module.state_dict()}, Path(where) / "model.pt")
                    checkpoint = train.Checkpoint.from_directory(where)
                    print(f"checkpoint at step {step}", flush=True)
                train.report(metrics, checkpoint=checkpoint)
        else:
            train.report(metrics)
        time.sleep(config["step_time"])
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    print(f"worker {rank} params {hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--checkpoint-every", type=int, default=5)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step (demo pacing)")
    args = ap.parse_args()

    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from tpufleet import runtime

    ray.init()  # a Ray job's driver: joins the cluster it was submitted to
    runtime.handle_stop_signal()
    if os.environ.get("TPUFLEET_JOB_KIND") == "ray":
        scaling, run = runtime.torch_scaling_config(), runtime.run_config()
    else:  # outside tpufleet: two workers wherever Ray puts them
        scaling = ScalingConfig(num_workers=2)
        run = RunConfig(storage_path=tempfile.mkdtemp(prefix="torchtrainer-"), name="ddp")
    config = {k: getattr(args, k) for k in ("steps", "checkpoint_every", "lr", "step_time")}
    trainer = TorchTrainer(
        train_loop,
        train_loop_config=config,
        scaling_config=scaling,
        run_config=run,
    )
    result = trainer.fit()
    checkpoint = str(result.checkpoint.path) if result.checkpoint else None
    final = {"metrics": result.metrics, "checkpoint": checkpoint}
    print("RESULT " + json.dumps(final), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
