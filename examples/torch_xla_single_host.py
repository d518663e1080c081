"""A single-host PyTorch/XLA training loop, written as for a TPU VM and run unchanged on an emulated one.

    tpufleet submit --type v6e-4 --working-dir examples -- python torch_xla_single_host.py

``xm.xla_device()``, ``pl.MpDeviceLoader`` and ``xm.optimizer_step``, as PyTorch/XLA's own examples
use them: on a TPU host the XLA device is a TPU chip; on an emulated host it is the CPU
(``PJRT_DEVICE=CPU``, which the emulator sets; the job's log says so). One process, one device: on a
single host nothing needs to synchronise. The last line of the output is a JSON summary: the device,
the first and the last epoch's mean loss, and the steps taken.
"""

from __future__ import annotations

import json

import torch
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    device = xm.xla_device()
    torch.manual_seed(0)
    x = torch.randn(512, 16)
    y = (x[:, :4].sum(dim=1) > 0).long()  # a class the first four features decide
    loader = pl.MpDeviceLoader(DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True), device)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    criterion = torch.nn.CrossEntropyLoss()
    model.train()
    means, steps = [], 0
    for _epoch in range(5):
        total = torch.zeros((), device=device)
        for data, target in loader:
            optimizer.zero_grad()
            loss = criterion(model(data), target)
            loss.backward()
            xm.optimizer_step(optimizer)  # all-reduces gradients across replicas (none here), then steps
            total += loss.detach()
            steps += 1
        means.append(round(total.item() / len(loader), 4))
        print(f"epoch {len(means)}: mean loss {means[-1]}", flush=True)
    summary = {"device": str(device), "first": means[0], "last": means[-1], "steps": steps}
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
