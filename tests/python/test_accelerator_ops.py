"""Ops PyTorch runs only on accelerators (Note [Accelerator-only ops] in
cpp/ops/accelerator_ops.cpp): the fused RNN cells behind nn.LSTM/nn.GRU,
SyncBatchNorm's statistics, _fused_dropout, _masked_scale and the out_dtype
matmuls, each equal to CPU (or to CUDA's formula where CPU has none)."""

import copy

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

TOL = dict(rtol=1e-5, atol=1e-5)


def _forward_backward(module, inputs, device):
    module = copy.deepcopy(module).to(device)
    inputs = [x.detach().to(device).requires_grad_(x.is_floating_point()) for x in inputs]
    out = module(*inputs)
    flat = [t for t in (out if isinstance(out, tuple) else (out,)) for t in (t if isinstance(t, tuple) else (t,))]
    loss = sum((t.data if hasattr(t, "batch_sizes") else t).square().sum() for t in flat)
    loss.backward()
    grads = [p.grad.cpu() for p in module.parameters()] + [x.grad.cpu() for x in inputs if x.grad is not None]
    values = [(t.data if hasattr(t, "batch_sizes") else t).detach().cpu() for t in flat]
    return values, grads


def _assert_same_as_cpu(module, *inputs):
    cpu = _forward_backward(module, inputs, "cpu")
    dev = _forward_backward(module, inputs, "openreg")
    torch.testing.assert_close(dev, cpu, **TOL)


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU])
@pytest.mark.parametrize(
    "config",
    [
        dict(num_layers=1),
        dict(num_layers=2, bidirectional=True),
        dict(num_layers=2, batch_first=True),
        dict(num_layers=1, bias=False),
        dict(num_layers=3, bidirectional=True, batch_first=True),
    ],
)
def test_rnn_forward_and_backward_as_on_cpu(kind, config):
    torch.manual_seed(0)
    rnn = kind(5, 7, **config)
    shape = (3, 4, 5) if config.get("batch_first") else (4, 3, 5)
    _assert_same_as_cpu(rnn, torch.randn(shape))


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU])
def test_rnn_with_initial_state(kind):
    torch.manual_seed(1)
    rnn = kind(4, 6, num_layers=2, bidirectional=True)
    x, h0 = torch.randn(5, 2, 4), torch.randn(4, 2, 6)
    if kind is nn.LSTM:
        c0 = torch.randn(4, 2, 6)

        class WithState(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = rnn

            def forward(self, x, h, c):
                return self.rnn(x, (h, c))

        _assert_same_as_cpu(WithState(), x, h0, c0)
    else:
        _assert_same_as_cpu(rnn, x, h0)


def test_lstm_with_projections():
    torch.manual_seed(2)
    _assert_same_as_cpu(nn.LSTM(4, 6, proj_size=3, num_layers=2), torch.randn(5, 2, 4))


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU])
def test_rnn_on_packed_sequences(kind):
    torch.manual_seed(3)
    rnn = kind(3, 5, num_layers=2, bidirectional=True)
    lengths = torch.tensor([6, 4, 1])
    padded = torch.randn(6, 3, 3)

    def run(device):
        model = copy.deepcopy(rnn).to(device)
        x = padded.to(device).requires_grad_()
        packed = pack_padded_sequence(x, lengths, enforce_sorted=True)
        out, _ = model(packed)
        unpacked, out_lengths = pad_packed_sequence(out)
        unpacked.square().sum().backward()
        return unpacked.detach().cpu(), out_lengths, x.grad.cpu(), [p.grad.cpu() for p in model.parameters()]

    torch.testing.assert_close(run("openreg"), run("cpu"), **TOL)


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU])
def test_rnn_dropout_between_layers_is_reproducible_and_trains(kind):
    rnn = kind(4, 5, num_layers=3, dropout=0.5).to("openreg")
    x = torch.randn(6, 2, 4, device="openreg")
    torch.openreg.manual_seed(7)
    first, _ = rnn(x)
    torch.openreg.manual_seed(7)
    again, _ = rnn(x)
    assert torch.equal(first.cpu(), again.cpu())
    torch.openreg.manual_seed(8)
    other, _ = rnn(x)
    assert not torch.equal(first.cpu(), other.cpu())
    rnn.eval()  # no dropout: as on CPU
    cpu_rnn = copy.deepcopy(rnn).cpu()
    torch.testing.assert_close(rnn(x)[0].cpu(), cpu_rnn(x.cpu())[0], **TOL)
    first.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in rnn.parameters())


@pytest.mark.parametrize("kind", [nn.LSTMCell, nn.GRUCell])
@pytest.mark.parametrize("bias", [True, False])
def test_rnn_cells_as_on_cpu(kind, bias):
    torch.manual_seed(4)
    cell = kind(5, 3, bias=bias)
    _assert_same_as_cpu(cell, torch.randn(4, 5))
    _assert_same_as_cpu(cell, torch.randn(5))  # unbatched


def test_lstm_training_steps_match_cpu():
    torch.manual_seed(5)
    lstm, head = nn.LSTM(3, 8, num_layers=2, batch_first=True), nn.Linear(8, 1)
    x, y = torch.randn(4, 7, 3), torch.randn(4, 1)

    def train(device):
        l, h = copy.deepcopy(lstm).to(device), copy.deepcopy(head).to(device)
        opt = torch.optim.Adam(list(l.parameters()) + list(h.parameters()), lr=0.01)
        losses = []
        for _ in range(5):
            opt.zero_grad()
            out, _ = l(x.to(device))
            loss = nn.functional.mse_loss(h(out[:, -1]), y.to(device))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    torch.testing.assert_close(train("openreg"), train("cpu"), rtol=1e-4, atol=1e-5)


def test_half_lstm_computes_in_float():
    torch.manual_seed(6)
    rnn = nn.LSTM(4, 4)
    x = torch.randn(3, 2, 4)
    out = copy.deepcopy(rnn).half().to("openreg")(x.half().to("openreg"))[0]
    reference = rnn.half().float()(x)[0]
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float().cpu(), reference, rtol=1e-2, atol=2e-3)


def test_fused_dropout_keeps_with_probability_p_and_scales():
    x = torch.randn(10000, device="openreg")
    torch.openreg.manual_seed(3)
    out, mask = torch._fused_dropout(x, 0.8)
    assert mask.dtype == torch.uint8
    kept = mask.float().mean().item()
    assert 0.77 < kept < 0.83
    torch.testing.assert_close(out.cpu(), x.cpu() * mask.cpu() / 0.8)
    torch.openreg.manual_seed(3)
    assert torch.equal(torch._fused_dropout(x, 0.8)[1].cpu(), mask.cpu())
    xg = x.clone().requires_grad_()
    out, mask = torch._fused_dropout(xg, 0.5)
    out.sum().backward()
    torch.testing.assert_close(xg.grad.cpu(), mask.cpu().float() / 0.5)


def test_masked_scale():
    x = torch.randn(6, device="openreg")
    mask = torch.tensor([1, 0, 1, 1, 0, 0], dtype=torch.uint8, device="openreg")
    torch.testing.assert_close(torch._masked_scale(x, mask, 2.5).cpu(), x.cpu() * mask.cpu() * 2.5)
    with pytest.raises(RuntimeError, match="mask must be uint8"):
        torch._masked_scale(x, mask.bool(), 2.0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_out_dtype_matmuls(dtype):
    a, b = torch.randn(3, 4, dtype=dtype), torch.randn(4, 5, dtype=dtype)
    c = torch.randn(3, 5)
    ba, bb = torch.randn(2, 3, 4, dtype=dtype), torch.randn(2, 4, 5, dtype=dtype)
    bc = torch.randn(2, 3, 5)
    dev = lambda t: t.to("openreg")  # noqa: E731
    f32 = torch.float32
    cases = [
        (torch.mm(dev(a), dev(b), out_dtype=f32), a.float() @ b.float()),
        (torch.bmm(dev(ba), dev(bb), out_dtype=f32), ba.float() @ bb.float()),
        (torch.addmm(dev(c), dev(a), dev(b), out_dtype=f32, beta=0.5, alpha=2), 0.5 * c + 2 * (a.float() @ b.float())),
        (torch.baddbmm(dev(bc), dev(ba), dev(bb), out_dtype=f32), bc + ba.float() @ bb.float()),
    ]
    for got, want in cases:
        assert got.dtype == f32 and got.device.type == "openreg"
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)
    out = torch.empty(3, 5, device="openreg")
    torch.mm(dev(a), dev(b), out_dtype=f32, out=out)
    torch.testing.assert_close(out.cpu(), a.float() @ b.float(), rtol=1e-4, atol=1e-4)


def test_out_dtype_matmul_refuses_other_dtypes_as_cuda():
    a = torch.randn(2, 2, device="openreg")
    with pytest.raises(RuntimeError, match="out_dtype must be the same as input dtype or fp32 for fp16/bf16 inputs"):
        torch.mm(a, a, out_dtype=torch.float16)


def _cpu_stats(x, eps):
    dims = [0] + list(range(2, x.dim()))
    var, mean = torch.var_mean(x, dims, correction=0)
    return mean, (var + eps).rsqrt()


def test_sync_batch_norm_statistics_match_batch_norm():
    """The statistics ops, composed as SyncBatchNorm composes them for one
    process, give batch_norm's training forward and backward."""
    torch.manual_seed(8)
    x = torch.randn(4, 3, 5, 5)
    weight, bias = torch.randn(3), torch.randn(3)
    eps, momentum = 1e-5, 0.1
    running_mean, running_var = torch.zeros(3), torch.ones(3)
    dev = lambda t: t.to("openreg")  # noqa: E731

    mean, invstd = torch.batch_norm_stats(dev(x), eps)
    want_mean, want_invstd = _cpu_stats(x, eps)
    torch.testing.assert_close((mean.cpu(), invstd.cpu()), (want_mean, want_invstd), **TOL)

    rm, rv = dev(running_mean), dev(running_var)
    count = torch.full((1,), x.numel() // 3, device="openreg", dtype=torch.float32)
    g_mean, g_invstd = torch.batch_norm_gather_stats_with_counts(
        dev(x), mean.unsqueeze(0), invstd.unsqueeze(0), rm, rv, momentum, eps, count)
    ref_rm, ref_rv = running_mean.clone(), running_var.clone()
    xr = x.clone().requires_grad_()
    wr, br = weight.clone().requires_grad_(), bias.clone().requires_grad_()
    ref = nn.functional.batch_norm(xr, ref_rm, ref_rv, wr, br, training=True, momentum=momentum, eps=eps)
    torch.testing.assert_close((g_mean.cpu(), g_invstd.cpu()), (want_mean, want_invstd), **TOL)
    torch.testing.assert_close((rm.cpu(), rv.cpu()), (ref_rm, ref_rv), **TOL)

    out = torch.batch_norm_elemt(dev(x), dev(weight), dev(bias), g_mean, g_invstd, eps)
    torch.testing.assert_close(out.cpu(), ref.detach(), **TOL)

    grad_out = torch.randn_like(ref)
    ref.backward(grad_out)
    sum_dy, sum_dy_xmu, grad_weight, grad_bias = torch.batch_norm_backward_reduce(
        dev(grad_out), dev(x), g_mean, g_invstd, dev(weight), True, True, True)
    torch.testing.assert_close((grad_weight.cpu(), grad_bias.cpu()), (wr.grad, br.grad), **TOL)
    grad_in = torch.batch_norm_backward_elemt(
        dev(grad_out), dev(x), g_mean, g_invstd, dev(weight), sum_dy, sum_dy_xmu, count.int())
    torch.testing.assert_close(grad_in.cpu(), xr.grad, **TOL)


def test_batch_norm_gather_stats_combines_processes():
    """Two "processes" of different batch sizes combine into the statistics
    of their concatenation."""
    torch.manual_seed(9)
    a, b = torch.randn(3, 2, 4), torch.randn(5, 2, 4)
    eps = 1e-5
    stats = [torch.batch_norm_stats(t.to("openreg"), eps) for t in (a, b)]
    means = torch.stack([m for m, _ in stats])
    invstds = torch.stack([s for _, s in stats])
    counts = torch.tensor([3 * 4, 5 * 4], dtype=torch.float32, device="openreg")
    rm, rv = torch.zeros(2, device="openreg"), torch.ones(2, device="openreg")
    mean, invstd = torch.batch_norm_gather_stats_with_counts(a.to("openreg"), means, invstds, rm, rv, 0.5, eps, counts)
    both = torch.cat([a, b])
    want_mean, want_invstd = _cpu_stats(both, eps)
    torch.testing.assert_close((mean.cpu(), invstd.cpu()), (want_mean, want_invstd), **TOL)
    unbiased = torch.var(both, [0, 2], correction=1)
    torch.testing.assert_close(rv.cpu(), 0.5 + 0.5 * unbiased, **TOL)
    same_count = torch.batch_norm_gather_stats(a.to("openreg"), means[:1], invstds[:1], None, None, 0.1, eps, 12)
    torch.testing.assert_close(same_count[0].cpu(), means[0].cpu(), **TOL)
