"""A pinned-batch prefetcher (the DataLoader recipe: batches pinned with
``.pin_memory()``, copied with ``non_blocking=True`` on a side stream while
the model trains on the previous batch) that forgets
``torch.openreg.current_stream().wait_stream(self.stream)`` when handing a
batch over: the training step on the default stream reads a batch whose
copy is not ordered before it (a race). Without ``record_stream`` its
memory, allocated on the copy stream, is also reused by the next prefetch
while the training step may still read it.

Fix: the recipe's ``next()``: the current stream waits for the copy
stream, and each handed-over tensor gets ``record_stream(current)``.
"""

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import DEV, check


class Prefetcher:
    def __init__(self, batches, fixed: bool):
        self.batches = iter(batches)
        self.fixed = fixed
        self.stream = torch.Stream(device=DEV)
        self.preload()

    def preload(self):
        try:
            x, y = next(self.batches)
        except StopIteration:
            self.next_batch = None
            return
        with torch.openreg.stream(self.stream):
            self.next_batch = (x.to(DEV, non_blocking=True), y.to(DEV, non_blocking=True))

    def next(self):
        current = torch.openreg.current_stream()
        if self.fixed:
            current.wait_stream(self.stream)
        batch = self.next_batch
        if batch is not None and self.fixed:
            for t in batch:
                t.record_stream(current)
        self.preload()
        return batch


EXPECTED = "race"


def _train(model, opt, batches):
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)  # regression targets: a label read too early is no index error
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def _program(fixed: bool) -> None:
    torch.manual_seed(15)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    reference_model = copy.deepcopy(model)
    batches = [(torch.randn(8, 16), torch.randn(8, 2)) for _ in range(4)]
    expected = _train(reference_model, torch.optim.SGD(reference_model.parameters(), lr=0.1), batches)

    pinned = [(x.pin_memory(), y.pin_memory()) for x, y in batches]
    model.to(DEV)
    prefetcher = Prefetcher(pinned, fixed)

    def device_batches():
        batch = prefetcher.next()
        while batch is not None:
            yield batch
            batch = prefetcher.next()

    losses = _train(model, torch.optim.SGD(model.parameters(), lr=0.1), device_batches()).cpu()
    if fixed:
        check(losses, expected)


def buggy() -> None:
    _program(fixed=False)


def fixed() -> None:
    _program(fixed=True)
