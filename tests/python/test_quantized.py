"""Quantized tensors on openreg where CUDA has them (Note [Quantized
tensors] in cpp/ops/fallback.cpp): per-tensor and per-channel quantize and
dequantize, int_repr, the quantization parameters, views and copies, equal
to CPU."""

import pytest
import torch


def _per_tensor(device, dtype=torch.qint8):
    torch.manual_seed(0)
    return torch.quantize_per_tensor(torch.randn(4, 6).to(device), 0.1, 3 if dtype != torch.qint32 else 0, dtype)


def _per_channel(device, axis=0):
    torch.manual_seed(0)
    x = torch.randn(4, 6).to(device)
    n = x.size(axis)
    scales = torch.linspace(0.05, 0.2, n, dtype=torch.float64).to(device)
    zero_points = torch.arange(n).to(device)
    return torch.quantize_per_channel(x, scales, zero_points, axis, torch.quint8)


def _plain(t):
    """What a quantized tensor holds, as CPU tensors."""
    if isinstance(t, torch.Tensor) and t.is_quantized:
        return t.int_repr().cpu(), t.dequantize().cpu()
    return t.cpu() if isinstance(t, torch.Tensor) else t


@pytest.mark.parametrize("dtype", [torch.qint8, torch.quint8, torch.qint32])
def test_per_tensor_quantization_as_on_cpu(dtype):
    q, want = _per_tensor("openreg", dtype), _per_tensor("cpu", dtype)
    assert q.is_quantized and q.device.type == "openreg" and q.dtype == dtype
    assert q.qscheme() == torch.per_tensor_affine
    assert (q.q_scale(), q.q_zero_point()) == (want.q_scale(), want.q_zero_point())
    torch.testing.assert_close(_plain(q), _plain(want))
    assert q.int_repr().device.type == "openreg" and q.dequantize().device.type == "openreg"


@pytest.mark.parametrize("axis", [0, 1])
def test_per_channel_quantization_as_on_cpu(axis):
    q, want = _per_channel("openreg", axis), _per_channel("cpu", axis)
    assert q.qscheme() == torch.per_channel_affine and q.q_per_channel_axis() == axis
    scales = q.q_per_channel_scales()
    assert scales.device.type == "openreg"  # as CUDA keeps them
    torch.testing.assert_close(scales.cpu(), want.q_per_channel_scales())
    torch.testing.assert_close(q.q_per_channel_zero_points().cpu(), want.q_per_channel_zero_points())
    torch.testing.assert_close(_plain(q), _plain(want))


VIEWS_AND_OPS = {
    "flatten": lambda q: q.flatten(),
    "ravel": lambda q: q.ravel(),
    "flip": lambda q: q.flip(0),
    "view": lambda q: q.view(2, 12),
    "transpose": lambda q: q.t(),
    "select": lambda q: q[1],
    "slice": lambda q: q[:, 1:4],
    "clone": lambda q: q.clone(),
    "contiguous": lambda q: q.t().contiguous(),
    "cat": lambda q: torch.cat([q, q]),
    "relu": lambda q: torch.relu(q),
}


@pytest.mark.parametrize("name", sorted(VIEWS_AND_OPS))
def test_views_and_ops_of_quantized_tensors(name):
    fn = VIEWS_AND_OPS[name]
    got, want = fn(_per_tensor("openreg")), fn(_per_tensor("cpu"))
    assert got.is_quantized and got.device.type == "openreg"
    torch.testing.assert_close(_plain(got), _plain(want))


def test_a_view_shares_the_device_memory():
    q = _per_tensor("openreg")
    flat = q.flatten()
    assert flat.data_ptr() == q.data_ptr()
    assert q.flip(0).data_ptr() != q.data_ptr()


def test_copies_between_host_and_device():
    host = _per_channel("cpu")
    dev = host.to("openreg:1")
    assert dev.is_quantized and dev.device == torch.device("openreg:1")
    back = dev.cpu()
    assert back.is_quantized and back.device.type == "cpu" and back.qscheme() == torch.per_channel_affine
    torch.testing.assert_close(_plain(back), _plain(host))
    torch.testing.assert_close(_plain(dev), _plain(host))


@pytest.mark.parametrize("make", [_per_tensor, _per_channel])
def test_copies_between_openreg_devices(make):
    q = make("openreg:0")
    moved = q.to("openreg:1")
    assert moved.is_quantized and moved.device == torch.device("openreg:1") and moved.qscheme() == q.qscheme()
    torch.testing.assert_close(_plain(moved), _plain(q))
