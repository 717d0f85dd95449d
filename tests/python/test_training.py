"""Autograd and torch.optim on openreg:1: a small MLP and a small CNN
(conv, batchnorm, relu, maxpool, linear) train for several steps and match
the same training on the CPU within 1e-5. Nothing touches openreg:0 (the
current device) meanwhile."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

DEV = "openreg:1"
STEPS = 6
TOL = 1e-5


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 4))


def _cnn():
    torch.manual_seed(1)
    # No bias before BatchNorm: BatchNorm cancels it, so its gradient is zero
    # but for rounding, which depends on how many threads a reduction uses
    # (device kernels off the main thread use one: Note [Kernel threads]),
    # and Adam scales that noise up to a full step of lr.
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1, bias=False),
        nn.BatchNorm2d(6),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 4, 3, stride=1, padding=0, bias=False),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 2 * 2, 5),
    )


def _train(model, device, x, y, make_opt, loss_fn):
    model = model.to(device)
    opt = make_opt(model.parameters())
    x, y = x.to(device), y.to(device)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return model, opt, [l.item() for l in losses]


def _compare(make_model, x, y, make_opt, loss_fn):
    base = make_model()
    torch.openreg.synchronize(0)
    before0 = torch.openreg.memory_allocated(0)
    torch.openreg.reset_peak_memory_stats(0)
    cpu_model, _, cpu_losses = _train(copy.deepcopy(base), "cpu", x, y, make_opt, loss_fn)
    dev_model, dev_opt, dev_losses = _train(copy.deepcopy(base), DEV, x, y, make_opt, loss_fn)

    assert len(set(cpu_losses)) > 1, "the loss should change while training"
    for step, (c, d) in enumerate(zip(cpu_losses, dev_losses)):
        assert abs(c - d) <= TOL, (step, c, d)
    cpu_state, dev_state = cpu_model.state_dict(), dev_model.state_dict()
    assert cpu_state.keys() == dev_state.keys()
    for name in cpu_state:
        d = dev_state[name]
        assert d.device == torch.device(DEV), name
        torch.testing.assert_close(d.cpu(), cpu_state[name], rtol=0, atol=TOL, msg=name)
    for p in dev_model.parameters():
        assert p.grad is not None and p.grad.device == torch.device(DEV)
    for state in dev_opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                assert v.device == torch.device(DEV)
    # The current device (openreg:0) was never used.
    assert torch.openreg.memory_allocated(0) == before0
    assert torch.openreg.max_memory_allocated(0) == before0
    return dev_model


OPTIMIZERS = {
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-4),
    "adam": lambda params: torch.optim.Adam(params, lr=0.01),
    "adamw_foreach": lambda params: torch.optim.AdamW(params, lr=0.01, foreach=True),
    "adam_single_tensor": lambda params: torch.optim.Adam(params, lr=0.01, foreach=False),
}


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_mlp_trains_like_on_cpu(opt, exact_memory):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(32, 10, generator=g)
    y = torch.randn(32, 4, generator=g)
    _compare(_mlp, x, y, OPTIMIZERS[opt], F.mse_loss)


@pytest.mark.parametrize("opt", ["sgd_momentum", "adam"])
def test_cnn_trains_like_on_cpu(opt, exact_memory):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(8, 3, 8, 8, generator=g)
    y = torch.randint(0, 5, (8,), generator=g)
    model = _compare(_cnn, x, y, OPTIMIZERS[opt], F.cross_entropy)
    bn = model[1]
    assert bn.num_batches_tracked.item() == STEPS
    assert bn.running_mean.device == torch.device(DEV)


def test_cnn_eval_mode_matches_cpu():
    g = torch.Generator().manual_seed(5)
    model = _cnn()
    for _ in range(2):  # give batchnorm some running statistics
        model(torch.randn(4, 3, 8, 8, generator=g))
    model.eval()
    x = torch.randn(3, 3, 8, 8, generator=g)
    dev_model = copy.deepcopy(model).to(DEV)
    with torch.no_grad():
        torch.testing.assert_close(dev_model(x.to(DEV)).cpu(), model(x), rtol=0, atol=TOL)


def test_autograd_gradients_match_cpu():
    g = torch.Generator().manual_seed(6)
    a = torch.randn(4, 5, generator=g)
    b = torch.randn(5, 3, generator=g)

    def run(device):
        x = a.to(device).detach().requires_grad_()
        w = b.to(device).detach().requires_grad_()
        out = (torch.sigmoid(x @ w) * 3).log_softmax(dim=1)
        loss = out[:, 0].sum() + (x ** 2).mean() + w.abs().sum()
        loss.backward()
        return loss.detach(), x.grad, w.grad

    cpu = run("cpu")
    dev = run(DEV)
    for c, d in zip(cpu, dev):
        assert d.device == torch.device(DEV)
        torch.testing.assert_close(d.cpu(), c, rtol=0, atol=TOL)
    # torch.autograd.grad on the device, with a second-order term.
    x = a.to(DEV).requires_grad_()
    (gx,) = torch.autograd.grad((x ** 3).sum(), x, create_graph=True)
    (ggx,) = torch.autograd.grad(gx.sum(), x)
    torch.testing.assert_close(gx.detach().cpu(), 3 * a ** 2, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ggx.cpu(), 6 * a, rtol=1e-6, atol=1e-6)


def test_gradient_accumulates_across_backward_calls():
    w = torch.ones(3, device=DEV, requires_grad=True)
    (w * 2).sum().backward()
    (w * 3).sum().backward()
    assert w.grad.tolist() == [5.0, 5.0, 5.0]
    w.grad = None
    (w ** 2).sum().backward()
    assert w.grad.tolist() == [2.0, 2.0, 2.0]
