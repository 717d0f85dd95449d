"""nn.Module conversions keep every Parameter object, as CPU<->CUDA do
(Note [Shallow copies between CPU and openreg] in cpp/ops/ops.cpp): tied weights
stay tied, lazy modules stay lazy, optimizers built before the move see the
moved tensors, and training matches CPU step for step."""

import copy

import pytest
import torch
from torch import nn


def test_cpu_and_openreg_tensors_are_shallow_copy_compatible():
    cpu, dev = torch.randn(3), torch.randn(3, device="openreg")
    assert torch._has_compatible_shallow_copy_type(cpu, dev)
    assert torch._has_compatible_shallow_copy_type(dev, cpu)
    assert torch._has_compatible_shallow_copy_type(dev, torch.randn(2, device="openreg:1"))
    assert not torch._has_compatible_shallow_copy_type(dev, torch.randn(2, 2).to_sparse())
    p = nn.Parameter(torch.randn(4))
    p.data = torch.zeros(4, device="openreg:1")
    assert p.device == torch.device("openreg:1") and isinstance(p, nn.Parameter)
    assert p.tolist() == [0.0] * 4


class TiedLM(nn.Module):
    """A language model whose output projection shares the input embedding."""

    def __init__(self, vocab=11, dim=6):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.hidden = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, vocab, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, tokens):
        return self.out(torch.tanh(self.hidden(self.embed(tokens))))


@pytest.mark.parametrize("move", ["to", "openreg_method", "to_index"])
def test_module_move_keeps_parameter_objects(move):
    model = TiedLM()
    before = {name: id(p) for name, p in model.named_parameters(remove_duplicate=False)}
    moved = {"to": lambda m: m.to("openreg"), "openreg_method": lambda m: m.openreg(1),
             "to_index": lambda m: m.to(torch.device("openreg", 1))}[move](model)
    assert moved is model
    after = {name: id(p) for name, p in model.named_parameters(remove_duplicate=False)}
    assert before == after
    assert model.out.weight is model.embed.weight
    assert all(p.device.type == "openreg" for p in model.parameters())


def _train(model, device, steps=5, optimizer_before_move=False):
    torch.manual_seed(0)
    tokens = torch.randint(0, 11, (8, 5))
    targets = torch.randint(0, 11, (8, 5))
    if optimizer_before_move:
        opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
        model.to(device)
    else:
        model.to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        logits = model(tokens.to(device))
        loss = nn.functional.cross_entropy(logits.reshape(-1, 11), targets.to(device).reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.cpu() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("optimizer_before_move", [False, True])
def test_tied_weights_train_as_on_cpu(optimizer_before_move):
    torch.manual_seed(1)
    model = TiedLM()
    cpu_losses, cpu_state = _train(copy.deepcopy(model), "cpu", optimizer_before_move=optimizer_before_move)
    dev_losses, dev_state = _train(model, "openreg", optimizer_before_move=optimizer_before_move)
    torch.testing.assert_close(dev_losses, cpu_losses)
    for name in cpu_state:
        torch.testing.assert_close(dev_state[name], cpu_state[name], msg=name)
    # The loss went down: the optimizer stepped the moved parameters.
    assert dev_losses[-1] < dev_losses[0]


@pytest.mark.parametrize("make", [lambda: nn.LazyLinear(3), lambda: nn.LazyConv2d(4, 3), lambda: nn.LazyConv1d(2, 1),
                                  lambda: nn.LazyBatchNorm1d()])
def test_lazy_module_moved_before_its_first_forward(make):
    module = make()
    module.to("openreg")
    shapes = {nn.LazyLinear: (2, 5), nn.LazyConv2d: (1, 2, 6, 6), nn.LazyConv1d: (2, 3, 7), nn.LazyBatchNorm1d: (4, 3)}
    x = torch.randn(shapes[type(module)])
    reference = make()
    out = module(x.to("openreg"))
    expected = reference(x)
    assert out.shape == expected.shape and out.device.type == "openreg"
    assert not any(isinstance(p, nn.parameter.UninitializedParameter) for p in module.parameters())
    for p_dev, p_cpu in zip(module.parameters(), reference.parameters()):
        assert p_dev.device.type == "openreg" and p_dev.shape == p_cpu.shape


def test_half_on_the_device_and_back_keeps_parameters():
    model = nn.Linear(4, 3).to("openreg")
    weight = model.weight
    model.half()
    assert model.weight is weight and weight.dtype == torch.float16 and weight.device.type == "openreg"
    model.float().cpu()
    assert model.weight is weight and weight.device.type == "cpu" and weight.dtype == torch.float32


def test_load_state_dict_copies_into_the_device_parameters():
    model = nn.Linear(4, 3).to("openreg")
    weight = model.weight
    source = nn.Linear(4, 3)
    model.load_state_dict(source.state_dict(), assign=False)
    assert model.weight is weight and weight.device.type == "openreg"
    torch.testing.assert_close(weight.cpu(), source.weight)


def test_overwrite_module_params_on_conversion_still_makes_new_parameters():
    model = nn.Linear(4, 3)
    weight = model.weight
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        model.to("openreg")
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(False)
    assert model.weight is not weight and model.weight.device.type == "openreg"
    torch.testing.assert_close(model.weight.cpu(), weight.detach())


def test_gradients_move_with_their_parameters():
    model = nn.Linear(3, 2)
    model(torch.randn(4, 3)).sum().backward()
    grad = model.weight.grad.clone()
    model.to("openreg")
    assert model.weight.grad.device.type == "openreg"
    torch.testing.assert_close(model.weight.grad.cpu(), grad)
