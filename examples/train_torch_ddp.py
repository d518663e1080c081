"""Train a small PyTorch model data-parallel (DDP) over every host of every slice of a job, with
checkpoints and resume.

Run on every host, SPMD style::

    tpufleet submit --type v4-16 [--num-slices 2] --working-dir examples -- python train_torch_ddp.py

``tpufleet.runtime.initialize_torch()`` starts ``torch.distributed`` from the host contract: one
process per host (holding all of its chips), ranks over every host of every slice; the ``xla``
backend through torch_xla on real TPUs (the model on the XLA device), ``gloo`` on the emulator's
CPUs, where PyTorch/XLA cannot synchronise processes. Each rank trains on its own synthetic data and
starts from its own random weights: DistributedDataParallel copies rank 0's weights to every rank
and averages the gradients, so every rank ends with the same parameters. Beside it each rank trains
an unsynchronised copy (``alone``) on the same data: its parameters differ between ranks, which
shows the data did.

Every ``--checkpoint-every`` steps rank 0 writes the models, the optimizers and the step to
``$TPUFLEET_CHECKPOINT_DIR`` (atomically); on start every rank resumes from it, so an attempt that
lost a host continues where the last one left off. Rank 0 reports its steps to tpufleet (goodput).
The last line of every host's output is a JSON summary: rank, world, step, the step it resumed
from, and digests of both models' parameters.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from tpufleet import runtime

IN, HIDDEN = 16, 32


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1))


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s data for ``step``: its own, and the same again after a resume."""
    gen = torch.Generator().manual_seed(rank * 1_000_003 + step)
    x = torch.randn(32, IN, generator=gen)
    return x, torch.tanh(x.sum(dim=1, keepdim=True) / 4)


def digest(model: torch.nn.Module) -> str:
    flat = torch.cat([p.detach().cpu().flatten() for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep per step (to be seen running)")
    args = parser.parse_args()

    runtime.initialize_torch()
    rank, world = dist.get_rank(), dist.get_world_size()
    if runtime.is_emulated():
        device = torch.device("cpu")
    else:
        import torch_xla

        device = torch_xla.device()
    model, alone = make_model(1000 + rank).to(device), make_model(1000 + rank).to(device)
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's weights to every rank
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (ddp, alone)]

    ckpt_dir = Path(os.environ.get("TPUFLEET_CHECKPOINT_DIR", "checkpoints"))
    ckpt = ckpt_dir / "ddp.pt"
    start = 0
    if ckpt.exists():
        state = torch.load(ckpt, map_location="cpu")
        model.load_state_dict(state["model"])
        alone.load_state_dict(state["alone"][rank])
        for opt, saved in zip(opts, state["opts"], strict=True):
            opt.load_state_dict(saved)
        start = state["step"]
        print(f"rank {rank}: resumed from step {start}", flush=True)

    losses = [torch.tensor(0.0)]
    for step in range(start + 1, args.steps + 1):
        x, y = (t.to(device) for t in batch(rank, step))
        losses = []
        for m, opt in zip((ddp, alone), opts, strict=True):
            opt.zero_grad()
            losses.append(torch.nn.functional.mse_loss(m(x), y))
            losses[-1].backward()
            opt.step()
        runtime.report_step(step)
        if step % args.checkpoint_every == 0 or step == args.steps:
            # every rank's unsynchronised copy, gathered to rank 0 with the rest
            alones: list[dict[str, torch.Tensor] | None] = [None] * world
            dist.all_gather_object(alones, {k: v.cpu() for k, v in alone.state_dict().items()})
            if rank == 0:
                ckpt_dir.mkdir(parents=True, exist_ok=True)
                state = {
                    "step": step,
                    "model": {k: v.cpu() for k, v in model.state_dict().items()},
                    "alone": alones,
                    "opts": [opt.state_dict() for opt in opts],
                }
                torch.save(state, ckpt.with_suffix(".tmp"))
                os.replace(ckpt.with_suffix(".tmp"), ckpt)
                print(f"saved step {step}", flush=True)
            dist.barrier()
        time.sleep(args.step_seconds)
    summary = {
        "rank": rank,
        "world": world,
        "step": args.steps,
        "resumed_from": start,
        "loss": round(float(losses[0].detach()), 6),
        "params": digest(model),
        "alone": digest(alone),
    }
    print(json.dumps(summary), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
