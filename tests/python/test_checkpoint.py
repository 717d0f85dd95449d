"""Activation checkpointing (torch.utils.checkpoint) on openreg: the
recomputation in backward must draw the random numbers the forward drew, so
a checkpointed model trains bit for bit as the unchecked one, as on CPU.

checkpoint saves the device RNG state only when the device module says it
is initialized (Note [torch.openreg._initialized]); these tests fail
silently-different gradients if it does not."""

import pytest
import torch
from torch.utils.checkpoint import checkpoint

STEPS = 4


class DropoutBlocks(torch.nn.Module):
    """Two checkpointable blocks, each with a dropout, and a head."""

    def __init__(self):
        super().__init__()
        self.block1 = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.5))
        self.block2 = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Dropout(0.3), torch.nn.Tanh())
        self.head = torch.nn.Linear(32, 1)

    def forward(self, x, checkpoint_kwargs=None):
        for block in (self.block1, self.block2):
            x = block(x) if checkpoint_kwargs is None else checkpoint(block, x, **checkpoint_kwargs)
        return self.head(x)


def train(device, checkpoint_kwargs):
    """Parameters and gradients after STEPS SGD steps, and the next draw of
    the device's default generator (checkpoint must leave it where the
    unchecked run leaves it)."""
    torch.manual_seed(0)
    model = DropoutBlocks().to(device)
    inputs = torch.randn(STEPS, 8, 16).to(device)
    targets = torch.randn(STEPS, 8, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1)
    for x, target in zip(inputs, targets):
        optimizer.zero_grad()
        x = x.clone().requires_grad_()
        loss = torch.nn.functional.mse_loss(model(x, checkpoint_kwargs), target)
        loss.backward()
        optimizer.step()
    grads = [p.grad.cpu() for p in model.parameters()] + [x.grad.cpu()]
    params = [p.detach().cpu() for p in model.parameters()]
    next_draw = torch.rand(4, device=device).cpu()
    return grads, params, next_draw


def identical(a, b):
    grads_a, params_a, draw_a = a
    grads_b, params_b, draw_b = b
    return (
        all(torch.equal(x, y) for x, y in zip(grads_a + params_a, grads_b + params_b))
        and torch.equal(draw_a, draw_b)
    )


CHECKPOINT_MODES = [
    pytest.param({"use_reentrant": True}, id="reentrant"),
    pytest.param({"use_reentrant": False}, id="non-reentrant"),
    pytest.param({"use_reentrant": True, "preserve_rng_state": True}, id="reentrant-preserve"),
    pytest.param({"use_reentrant": False, "preserve_rng_state": True}, id="non-reentrant-preserve"),
]


@pytest.mark.parametrize("device", ["cpu", "openreg:0", "openreg:1"])
@pytest.mark.parametrize("checkpoint_kwargs", CHECKPOINT_MODES)
def test_checkpointed_training_is_bit_identical(device, checkpoint_kwargs):
    assert identical(train(device, None), train(device, checkpoint_kwargs))


@pytest.mark.parametrize("device", ["cpu", "openreg:0"])
@pytest.mark.parametrize("use_reentrant", [True, False])
def test_without_preserved_rng_state_the_recomputation_draws_anew(device, use_reentrant):
    # As on CPU: preserve_rng_state=False is the documented way to skip the
    # restore, and a dropout then gets a fresh mask in the recomputation.
    unchecked = train(device, None)
    checked = train(device, {"use_reentrant": use_reentrant, "preserve_rng_state": False})
    assert not identical(unchecked, checked)


def test_device_module_reports_initialized_as_torch_cuda_does():
    # What checkpoint reads (getattr(torch.cuda, "_initialized", False)).
    torch.ones(1, device="openreg")
    assert torch.openreg._initialized is True
    assert torch.openreg._initialized == torch.openreg.is_initialized()
