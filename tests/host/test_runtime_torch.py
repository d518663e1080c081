"""runtime.initialize_torch on emulated hosts: one process per host, with the environment the
executor gives each host of an attempt (``contract.attempt_envs`` over the emulator's host
variables), no Ray. DDP over both hosts of a v4-16 and over two v4-16 slices: every rank ends with
the same parameters although each trained on its own data from its own initial weights.

Needs PyTorch (the ``torch`` extra, which ``make test`` installs): see tests/support/torchreq.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
import torchreq

from tpufleet import catalog, contract
from tpufleet.emulator import plan, procs
from tpufleet.runtime import PORT_VAR

torchreq.require("torch")

WORKER = r"""
import json, torch, torch.distributed as dist
from tpufleet.runtime import initialize_torch

args = initialize_torch()
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(1000 + rank)  # other initial weights on every rank: DDP starts them from rank 0's
model, alone = torch.nn.Linear(8, 1), torch.nn.Linear(8, 1)
alone.load_state_dict(model.state_dict())  # the same start, trained without synchronising
ddp = torch.nn.parallel.DistributedDataParallel(model)
opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (ddp, alone)]
data = torch.Generator().manual_seed(rank)  # other data on every rank
for _ in range(5):
    x = torch.randn(16, 8, generator=data)
    y = x.sum(1, keepdim=True)
    for m, opt in zip((ddp, alone), opts):
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
total = torch.tensor([float(rank)])
dist.all_reduce(total)
flat = lambda m: [v for p in m.parameters() for v in p.detach().flatten().tolist()]
print(json.dumps({"rank": rank, "world": world, "args": list(vars(args).values()), "sum": total.item(),
                  "ddp": flat(model), "alone": flat(alone)}))
dist.destroy_process_group()
"""


def _free_port() -> int:
    return procs.free_port()  # below the ephemeral range: nobody takes it meanwhile


def _run_job(slices: list[tuple[str, str]], user_env: dict[str, str]) -> list[dict[str, Any]]:
    """Run WORKER on every host of ``slices`` ((name, accelerator type)) as the executor would."""
    layout = [
        (name, catalog.slice_type(t), ["127.0.0.1"] * catalog.slice_type(t).hosts) for name, t in slices
    ]
    envs = contract.attempt_envs("j1", 1, "/nonexistent", layout, extra={PORT_VAR: str(_free_port())})
    types = [st for _, st, _ in layout for _ in range(st.hosts)]
    base = plan.clean_base_env(os.environ)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER],
            env={**base, **user_env, **host, **plan.emulator_env(st), **attempt},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for (host, attempt), st in zip(envs, types, strict=True)
    ]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=180)
            assert p.returncode == 0, err[-2000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


@pytest.mark.parametrize(
    ("slices", "own_port"),
    [
        ([("tpu-v4-16-0", "v4-16")], True),  # both hosts of one slice, at the job's own MASTER_PORT
        ([("tpu-v4-16-0", "v4-16"), ("tpu-v4-16-1", "v4-16")], False),  # two slices: MEGASCALE_*
    ],
    ids=["v4-16", "v4-16x2"],
)
def test_ddp_over_every_host_of_every_slice_keeps_the_replicas_identical(
    slices: list[tuple[str, str]], own_port: bool
) -> None:
    master_port = _free_port() if own_port else None
    results = _run_job(slices, {"MASTER_PORT": str(master_port)} if master_port else {})
    world = len(results)
    assert world == 2 * len(slices)
    # host w of slice s is rank s * hosts + w, in a world of every host, as initialize_jax counts
    assert [(r["rank"], r["world"], r["args"][1:]) for r in results] == [
        (i, world, [world, i]) for i in range(world)
    ]
    masters = {r["args"][0] for r in results}
    assert len(masters) == 1 and masters.pop().startswith("127.0.0.1:")  # host 0 of slice 0
    if master_port:
        assert results[0]["args"][0] == f"127.0.0.1:{master_port}"
    assert {r["sum"] for r in results} == {float(sum(range(world)))}
    assert all(r["ddp"] == results[0]["ddp"] for r in results)
    # ... which only the all-reduce did: trained alone on their own data, the replicas drift apart
    assert len({tuple(r["alone"]) for r in results}) == world
