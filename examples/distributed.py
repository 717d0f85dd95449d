"""Data-parallel training on openreg devices, one process per device.

    torchrun --nproc-per-node 2 examples/distributed.py

Each process trains a small model with DistributedDataParallel on
``openreg:<local rank>``; gradients are averaged by gloo directly in device
memory (torch_openreg's c10d backend, chosen by ``init_process_group()``
without a backend). At the end every rank holds the same parameters.
"""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import torch_openreg  # noqa: F401  (plain `import torch` autoloads it too)


def main() -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("openreg", local_rank)
    torch.openreg.set_device(device)
    dist.init_process_group()  # picks openreg's backend (gloo underneath)
    rank, world_size = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same initial model everywhere (DDP broadcasts it anyway)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(device)
    model = DistributedDataParallel(model, device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    torch.manual_seed(1 + rank)  # each rank its own data
    for step in range(50):
        inputs = torch.randn(32, 16, device=device)
        targets = inputs.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 10 == 0 and rank == 0:
            print(f"step {step:2d}  loss {loss.item():.4f}")

    # The ranks agree: compare a checksum of the parameters.
    checksum = torch.stack([p.detach().sum() for p in model.parameters()]).sum().reshape(1)
    checksums = [torch.empty_like(checksum) for _ in range(world_size)]
    dist.all_gather(checksums, checksum)
    if rank == 0:
        values = [c.item() for c in checksums]
        print(f"parameter checksums per rank: {values}")
        assert all(v == values[0] for v in values), "ranks diverged"
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
