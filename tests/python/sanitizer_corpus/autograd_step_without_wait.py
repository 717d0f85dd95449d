"""Autograd on a side stream, optimizer step on the default stream: a
training step runs its forward and ``loss.backward()`` inside
``torch.openreg.stream(side)`` (so the backward ops, and the gradient
accumulation, run on the side stream too), and then calls
``optimizer.step()`` on the default stream without waiting: the step reads
gradients whose write is not ordered before the read (a race).

Fix: ``main.wait_stream(side)`` before ``optimizer.step()`` (PyTorch's
documented recipe for using gradients outside the backward's stream
context).
"""

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import DEV, check, prepare, reference

EXPECTED = "race"


def _step(model, opt, x, y, stream_context, before_step):
    opt.zero_grad()
    with stream_context:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
    before_step()
    opt.step()
    return loss


def _program(fixed: bool) -> None:
    torch.manual_seed(14)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    reference_model = copy.deepcopy(model)
    x_cpu, y_cpu = torch.randn(32, 32), torch.randint(0, 10, (32,))
    ref_opt = torch.optim.SGD(reference_model.parameters(), lr=0.05, momentum=0.9)
    expected_loss = _step(reference_model, ref_opt, reference(x_cpu), y_cpu, torch.enable_grad(), lambda: None)

    model.to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    main = torch.openreg.current_stream()
    side = torch.Stream(device=DEV)
    x, y = prepare(x_cpu), y_cpu.to(DEV)
    side.wait_stream(main)  # the forward reads x and the weights
    before_step = (lambda: main.wait_stream(side)) if fixed else (lambda: None)
    loss = _step(model, opt, x, y, torch.openreg.stream(side), before_step)
    main.wait_stream(side)  # for the loss (the buggy step has run by now)
    loss.record_stream(main)
    got_loss = loss.detach().cpu()
    weights = [p.detach().cpu() for p in model.parameters()]
    if fixed:
        check(got_loss, expected_loss.detach())
        for got, want in zip(weights, reference_model.parameters()):
            check(got, want.detach())


def buggy() -> None:
    _program(fixed=False)


def fixed() -> None:
    _program(fixed=True)
