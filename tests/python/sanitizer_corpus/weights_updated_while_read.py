"""Write after read: after a training step's backward on the default
stream, the current weights are evaluated on a side stream (a Linear model
on a validation batch) while the default stream goes on with
``optimizer.step()``. The step writes the weights that the side stream's
Linears may still be reading, with no ordering between them: a write after
read. (The program does wait for the side stream, but only after the step,
to read the evaluation's result: too late for the weights.)

Fix: ``main.wait_stream(side)`` before ``optimizer.step()``.
"""

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import DEV, check, prepare, reference

EXPECTED = "write_after_read"


def _train_then_step(model, opt, x, y, x_val, evaluate):
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    predictions = evaluate(model, x_val)
    opt.step()
    return predictions


def _program(fixed: bool) -> None:
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    reference_model = copy.deepcopy(model)
    x_cpu, x_val_cpu, y_cpu = torch.randn(16, 32), torch.randn(16, 32), torch.randint(0, 10, (16,))

    def evaluate_cpu(m, x_val):
        with torch.no_grad():
            return m(x_val).argmax(1)

    ref_opt = torch.optim.SGD(reference_model.parameters(), lr=0.1)
    expected = _train_then_step(reference_model, ref_opt, reference(x_cpu), y_cpu, reference(x_val_cpu), evaluate_cpu)

    model.to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    main = torch.openreg.current_stream()
    side = torch.Stream(device=DEV)

    def evaluate_on_side(m, x_val):
        side.wait_stream(main)  # x_val and the weights come from the default stream
        with torch.openreg.stream(side), torch.no_grad():
            predictions = m(x_val).argmax(1)
        if fixed:
            main.wait_stream(side)  # before the step overwrites the weights
        return predictions

    predictions = _train_then_step(model, opt, prepare(x_cpu), y_cpu.to(DEV), prepare(x_val_cpu), evaluate_on_side)
    main.wait_stream(side)  # for the predictions (in the buggy version: after the step, too late)
    predictions.record_stream(main)
    predictions = predictions.cpu()
    weights = [p.detach().cpu() for p in model.parameters()]
    if fixed:
        assert torch.equal(predictions, expected), (predictions, expected)
        for got, want in zip(weights, reference_model.parameters()):
            check(got, want.detach())


def buggy() -> None:
    _program(fixed=False)


def fixed() -> None:
    _program(fixed=True)
