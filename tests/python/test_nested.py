"""Nested tensors on openreg as on CPU (Note [Nested tensors] in
cpp/ops/fallback.cpp): the ops of PyTorch's nested-tensor tutorial, autograd,
copies in both directions, and nn.TransformerEncoder's fast path, which
turns a padded batch into nested tensors."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

warnings.filterwarnings("ignore", message=".*nested tensors is in prototype stage.*")


def _nested(device, dtype=torch.float32):
    torch.manual_seed(0)
    parts = [torch.randn(2, 6, dtype=dtype), torch.randn(5, 6, dtype=dtype), torch.randn(1, 6, dtype=dtype)]
    return torch.nested.nested_tensor(parts, device=device)


def _dense(t):
    # Padded first: .cpu() of a non-contiguous nested tensor raises, on CUDA too.
    return (t.to_padded_tensor(0.0) if t.is_nested else t).cpu()


OPS = {
    "add_scalar": lambda nt: nt + 1,
    "add_nested": lambda nt: nt + nt * 2,
    "relu": lambda nt: torch.relu(nt),
    "gelu": lambda nt: F.gelu(nt),
    "softmax": lambda nt: nt.softmax(-1),
    "layer_norm": lambda nt: F.layer_norm(nt, (6,), torch.ones(6, device=nt.device), torch.zeros(6, device=nt.device)),
    "linear": lambda nt: F.linear(nt, torch.ones(4, 6, device=nt.device), torch.ones(4, device=nt.device)),
    "bmm": lambda nt: torch.matmul(nt, nt.transpose(-1, -2)),
    "to_padded": lambda nt: torch.nested.to_padded_tensor(nt, -1.0),
    "to_padded_sized": lambda nt: nt.to_padded_tensor(0.0, (3, 6, 8)),
    "unbind": lambda nt: nt.unbind()[1],
    "clone": lambda nt: nt.clone(),
    "mul_": lambda nt: nt.clone().mul_(3),
    "dropout_eval": lambda nt: F.dropout(nt, 0.5, training=False),
    "transpose_reshape": lambda nt: nt.reshape(3, -1, 2, 3).transpose(1, 2).contiguous(),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_nested_op_as_on_cpu(name):
    fn = OPS[name]
    got, want = fn(_nested("openreg")), fn(_nested("cpu"))
    assert got.device.type == "openreg" and got.is_nested == want.is_nested
    torch.testing.assert_close(_dense(got), _dense(want))


def test_the_readme_example_runs():
    nt = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], device="openreg")
    out = nt + 1
    assert out.is_nested and out.device == torch.device("openreg:0")
    assert [t.shape for t in out.unbind()] == [(2, 3), (4, 3)]


def test_copies_between_host_and_device_keep_the_structure():
    host = _nested("cpu")
    dev = host.to("openreg:1")
    assert dev.is_nested and dev.device == torch.device("openreg:1")
    back = dev.cpu()
    assert back.is_nested and back.device.type == "cpu"
    torch.testing.assert_close(_dense(back), _dense(host))
    target = torch.nested.nested_tensor([torch.zeros(2, 6), torch.zeros(5, 6), torch.zeros(1, 6)], device="openreg")
    target.copy_(_nested("openreg") * 2)
    torch.testing.assert_close(_dense(target), _dense(host * 2))


def test_copies_between_openreg_devices():
    nt = _nested("openreg:0")
    moved = nt.to("openreg:1")
    assert moved.is_nested and moved.device == torch.device("openreg:1")
    torch.testing.assert_close(_dense(moved), _dense(nt))


def test_nested_autograd_as_on_cpu():
    def grads(device):
        torch.manual_seed(1)
        a = torch.randn(2, 4, device=device, requires_grad=True)
        b = torch.randn(3, 4, device=device, requires_grad=True)
        nt = torch.nested.as_nested_tensor([a, b])
        out = F.linear(nt.softmax(-1) * 2, torch.ones(5, 4, device=device))
        out.to_padded_tensor(0.0).square().sum().backward()
        return a.grad.cpu(), b.grad.cpu()

    torch.testing.assert_close(grads("openreg"), grads("cpu"))


def test_nested_attention_as_on_cpu():
    def attend(device):
        torch.manual_seed(2)
        lengths = [3, 5]
        q = torch.nested.nested_tensor([torch.randn(2, n, 8) for n in lengths], device=device)
        k = torch.nested.nested_tensor([torch.randn(2, n, 8) for n in lengths], device=device)
        v = torch.nested.nested_tensor([torch.randn(2, n, 8) for n in lengths], device=device)
        return F.scaled_dot_product_attention(q, k, v)

    torch.testing.assert_close(_dense(attend("openreg")), _dense(attend("cpu")), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_fast_path_with_padding_mask(norm_first):
    """In eval mode with a key padding mask, the encoder packs the batch
    into nested tensors (_nested_tensor_from_mask) as on CUDA."""
    torch.manual_seed(3)
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, norm_first=norm_first)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=not norm_first).eval()
    x = torch.randn(3, 5, 8)
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] + [True] * 4])
    with torch.no_grad():
        want = encoder(x, src_key_padding_mask=mask)
        encoder.to("openreg")
        got = encoder(x.to("openreg"), src_key_padding_mask=mask.to("openreg"))
    assert got.device.type == "openreg"
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


def test_jagged_layout_as_on_cpu():
    def jagged(device):
        torch.manual_seed(4)
        nt = torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)], layout=torch.jagged, device=device)
        return (nt.relu() + 1).sum(-1).to_padded_tensor(0.0)

    torch.testing.assert_close(jagged("openreg").cpu(), jagged("cpu"))
