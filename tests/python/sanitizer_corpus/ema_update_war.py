"""Write after read on an EMA model: after a training step, an exponential
moving average of the weights is updated on a side stream
(``ema_param.lerp_(param, 0.1)``) while the default stream evaluates the
EMA model. The side stream waited for the default stream *before* the
evaluation was launched, so nothing orders the EMA update's writes after
the evaluation's reads of the same weights: a write after read.

Fix: make the side stream wait for the default stream after the
evaluation is launched (``side.wait_stream(main)`` right before the
update).
"""

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import DEV, check, prepare, reference

EXPECTED = "write_after_read"


def _train_eval_update(model, ema, opt, x, y, x_val, hook, update_context):
    """One training step, an evaluation of the EMA model, the EMA update;
    ``hook(point)`` runs at "after_step", "before_update" and "after_update"."""
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
    hook("after_step")
    with torch.no_grad():
        predictions = ema(x_val).argmax(1)
        hook("before_update")
        with update_context:
            for ema_p, p in zip(ema.parameters(), model.parameters()):
                ema_p.lerp_(p, 0.1)
        hook("after_update")
    return predictions


def _program(fixed: bool) -> None:
    torch.manual_seed(19)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    ema = copy.deepcopy(model)
    ref_model, ref_ema = copy.deepcopy(model), copy.deepcopy(model)
    x_cpu, x_val_cpu, y_cpu = torch.randn(16, 32), torch.randn(16, 32), torch.randint(0, 10, (16,))
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1)
    expected = _train_eval_update(
        ref_model, ref_ema, ref_opt, reference(x_cpu), y_cpu, reference(x_val_cpu), lambda point: None, torch.no_grad()
    )

    model.to(DEV), ema.to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    main = torch.openreg.current_stream()
    side = torch.Stream(device=DEV)
    x, x_val, y = prepare(x_cpu), prepare(x_val_cpu), y_cpu.to(DEV)

    def hook(point):
        # The update reads the stepped weights and writes the EMA weights:
        # the buggy version orders it after the step only, not after the
        # evaluation that reads the EMA weights.
        if point == ("before_update" if fixed else "after_step"):
            side.wait_stream(main)
        elif point == "after_update":
            main.wait_stream(side)

    predictions = _train_eval_update(model, ema, opt, x, y, x_val, hook, torch.openreg.stream(side))
    got = predictions.cpu()
    ema_weights = [p.detach().cpu() for p in ema.parameters()]
    if fixed:
        assert torch.equal(got, expected), (got, expected)
        for w, want in zip(ema_weights, ref_ema.parameters()):
            check(w, want.detach())


def buggy() -> None:
    _program(fixed=False)


def fixed() -> None:
    _program(fixed=True)
