"""Pinned staging buffer refilled too early: batches go to the device
through one pinned staging buffer, ``x.copy_(staging, non_blocking=True)``,
and the loop refills the staging buffer with the next batch
(``staging.copy_(batch)`` on the host) while the previous copy may still
read it. Reported when the host writes the pinned memory.

Fix: record an event after each copy and synchronize it before refilling
the buffer.
"""

import torch
import torch.nn as nn

from _corpus import DEV, check

EXPECTED = "pinned_host_access"


def _program(fixed: bool) -> None:
    torch.manual_seed(11)
    model = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
    batches = [torch.randn(16, 32) for _ in range(4)]
    with torch.no_grad():
        expected = torch.stack([model(b).sum(0) for b in batches])
        model.to(DEV)
        staging = torch.empty(16, 32, pin_memory=True)
        copied = None
        sums = []
        for batch in batches:
            if fixed and copied is not None:
                copied.synchronize()  # the previous copy has read the buffer
            staging.copy_(batch)  # host write into pinned memory
            x = torch.empty(16, 32, device=DEV)
            x.copy_(staging, non_blocking=True)
            copied = torch.Event(device=DEV)
            copied.record()
            sums.append(model(x).sum(0))
        out = torch.stack(sums).cpu()
    if fixed:
        check(out, expected)


def buggy() -> None:
    _program(fixed=False)


def fixed() -> None:
    _program(fixed=True)
