"""Autocast (AMP) on openreg: CUDA's op policy for float16 and bfloat16, the
generic and the ``torch.openreg.amp`` entry points, nesting, the weight cache,
and ``GradScaler("openreg")`` with its inf/NaN checks on the device."""

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

DEV = "openreg"
LOW = [torch.float16, torch.bfloat16]


def _randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype).to(DEV)


# Each op class of CUDA's policy, with openreg float32 (or mixed) inputs.
LOWER_PRECISION_OPS = {
    "mm": lambda: torch.mm(_randn(4, 5), _randn(5, 3)),
    "matmul": lambda: _randn(2, 4, 5) @ _randn(5, 3),
    "bmm": lambda: torch.bmm(_randn(2, 4, 5), _randn(2, 5, 3)),
    "addmm": lambda: torch.addmm(_randn(3), _randn(4, 5), _randn(5, 3)),
    "linear": lambda: F.linear(_randn(4, 5), _randn(3, 5), _randn(3)),
    "conv2d": lambda: F.conv2d(_randn(1, 2, 6, 6), _randn(3, 2, 3, 3)),
    "baddbmm": lambda: torch.baddbmm(_randn(2, 4, 3), _randn(2, 4, 5), _randn(2, 5, 3)),
    "prelu": lambda: F.prelu(_randn(2, 3), _randn(1)),
}
FP32_OPS = {
    "softmax": lambda x: torch.softmax(x, dim=-1),
    "log_softmax": lambda x: F.log_softmax(x, dim=-1),
    "layer_norm": lambda x: F.layer_norm(x, x.shape[-1:]),
    "exp": torch.exp,
    "log1p": lambda x: torch.log1p(x.abs()),
    "pow": lambda x: torch.pow(x, 2),
    "sum": torch.sum,
    "cumsum": lambda x: torch.cumsum(x, 0),
    "norm": lambda x: torch.norm(x),
    "mse_loss": lambda x: F.mse_loss(x, x.detach() * 0.5),
    "logsumexp": lambda x: torch.logsumexp(x, 0),
}


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("name", sorted(LOWER_PRECISION_OPS))
def test_matmul_class_runs_in_lower_precision(dtype, name):
    with torch.autocast(DEV, dtype=dtype):
        out = LOWER_PRECISION_OPS[name]()
    assert out.device.type == DEV
    assert out.dtype == dtype, name


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("name", sorted(FP32_OPS))
def test_fp32_class_runs_in_float32(dtype, name):
    x = _randn(4, 6, dtype=dtype)
    with torch.autocast(DEV, dtype=dtype):
        out = FP32_OPS[name](x)
    assert out.dtype == torch.float32, name
    # The same op in float32 outside autocast: the policy casts the input up
    # and runs the float32 kernel.
    expected = FP32_OPS[name](x.float())
    torch.testing.assert_close(out.cpu(), expected.cpu())


@pytest.mark.parametrize("dtype", LOW)
def test_promote_class_runs_in_the_widest_dtype(dtype):
    with torch.autocast(DEV, dtype=dtype):
        mixed = torch.addcmul(_randn(4), _randn(4, dtype=dtype), _randn(4, dtype=dtype))
        low = torch.addcmul(_randn(4, dtype=dtype), _randn(4, dtype=dtype), _randn(4, dtype=dtype))
        atan = torch.atan2(_randn(4, dtype=dtype), _randn(4))
    assert mixed.dtype == torch.float32
    assert low.dtype == dtype
    assert atan.dtype == torch.float32


@pytest.mark.parametrize("dtype", LOW)
def test_lower_precision_values_match_cpu(dtype):
    torch.manual_seed(0)
    x, w, b = torch.randn(8, 16), torch.randn(4, 16), torch.randn(4)
    with torch.autocast(DEV, dtype=dtype):
        out = F.linear(x.to(DEV), w.to(DEV), b.to(DEV))
    expected = F.linear(x.to(dtype), w.to(dtype), b.to(dtype))
    torch.testing.assert_close(out.cpu(), expected)


def test_other_ops_and_other_devices_are_untouched():
    with torch.autocast(DEV, dtype=torch.float16):
        added = _randn(3) + _randn(3)
        relu = torch.relu(_randn(3))
        cpu_mm = torch.mm(torch.randn(2, 2), torch.randn(2, 2))
        ints = torch.ones(2, 2, dtype=torch.int64, device=DEV)
        # Integers pass through autocast to the device kernel, which refuses
        # an integer mm as CUDA's does (Note [Dtype policy]).
        with pytest.raises(NotImplementedError, match="\"mm_openreg\" not implemented for 'Long'"):
            torch.mm(ints, ints)
        summed = ints + ints
        doubles = torch.mm(_randn(2, 2, dtype=torch.float64), _randn(2, 2, dtype=torch.float64))
    assert added.dtype == relu.dtype == cpu_mm.dtype == torch.float32
    assert summed.dtype == torch.int64
    assert doubles.dtype == torch.float64


def test_default_dtype_is_float16_as_on_cuda():
    assert torch.get_autocast_dtype(DEV) == torch.float16
    with torch.autocast(DEV):
        assert torch.mm(_randn(2, 2), _randn(2, 2)).dtype == torch.float16


def test_nested_and_disabled_regions():
    a, b = _randn(2, 2), _randn(2, 2)
    assert not torch.openreg.is_autocast_enabled()
    with torch.autocast(DEV, dtype=torch.bfloat16):
        assert torch.openreg.is_autocast_enabled()
        assert torch.mm(a, b).dtype == torch.bfloat16
        with torch.autocast(DEV, enabled=False):
            assert not torch.openreg.is_autocast_enabled()
            assert torch.mm(a, b).dtype == torch.float32
        with torch.autocast(DEV, dtype=torch.float16):
            assert torch.mm(a, b).dtype == torch.float16
        assert torch.mm(a, b).dtype == torch.bfloat16
        assert torch.openreg.get_autocast_dtype() == torch.bfloat16
    assert not torch.openreg.is_autocast_enabled()
    assert torch.mm(a, b).dtype == torch.float32
    with torch.autocast(DEV, enabled=False):
        assert torch.mm(a, b).dtype == torch.float32


def test_openreg_amp_module_mirrors_cuda_amp():
    assert set(torch.openreg.get_amp_supported_dtype()) == {torch.float16, torch.bfloat16}
    assert torch.openreg.is_bf16_supported()
    with torch.openreg.amp.autocast(dtype=torch.bfloat16):
        assert torch.is_autocast_enabled(DEV)
        assert torch.mm(_randn(2, 2), _randn(2, 2)).dtype == torch.bfloat16

    class Square(torch.autograd.Function):
        @staticmethod
        @torch.openreg.amp.custom_fwd(cast_inputs=torch.float32)
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch.mm(x, x)

        @staticmethod
        @torch.openreg.amp.custom_bwd
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad @ x.t() + x.t() @ grad

    x = _randn(3, 3, dtype=torch.float16).requires_grad_()
    with torch.autocast(DEV, dtype=torch.float16):
        out = Square.apply(x)
    assert out.dtype == torch.float32  # cast_inputs: the forward ran outside autocast
    out.sum().backward()
    assert x.grad.dtype == torch.float16


def test_unsupported_dtype_warns_and_disables():
    with pytest.warns(UserWarning, match="not supported"):
        region = torch.autocast(DEV, dtype=torch.float32)
    with region:
        assert torch.mm(_randn(2, 2), _randn(2, 2)).dtype == torch.float32


def test_binary_cross_entropy_is_refused_as_on_cuda():
    p = torch.sigmoid(_randn(4))
    target = torch.rand(4).to(DEV)
    with torch.autocast(DEV, dtype=torch.float16):
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(p, target)
        loss = F.binary_cross_entropy_with_logits(_randn(4), target)
    assert loss.dtype == torch.float32


class _CountCasts(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.casts = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default:
            self.casts += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("cache_enabled", [True, False])
def test_weight_cache_casts_a_parameter_once_per_region(cache_enabled):
    weight = nn.Parameter(_randn(4, 4))
    inputs = [_randn(2, 4, dtype=torch.float16) for _ in range(3)]
    with torch.autocast(DEV, dtype=torch.float16, cache_enabled=cache_enabled):
        with _CountCasts() as counter:
            outs = [F.linear(x, weight) for x in inputs]
    assert all(out.dtype == torch.float16 for out in outs)
    # The inputs are float16 already; only the float32 leaf weight is cast.
    assert counter.casts == (1 if cache_enabled else 3)
    sum(out.float().sum() for out in outs).backward()
    assert weight.grad.dtype == torch.float32
    torch.testing.assert_close(weight.grad.cpu(), sum(x.float().sum(0) for x in inputs).cpu().expand(4, 4), atol=1e-2, rtol=1e-2)


def test_mlp_training_step_under_autocast():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(DEV)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _randn(8, 16), torch.randint(0, 4, (8,)).to(DEV)
    with torch.autocast(DEV, dtype=torch.bfloat16):
        logits = model(x)
        loss = F.cross_entropy(logits, y)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    loss.backward()
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())
    optimizer.step()


# --- GradScaler --------------------------------------------------------------


def test_non_finite_check_and_unscale_runs_on_the_device():
    grads = [torch.tensor([2.0, 4.0]), torch.tensor([[8.0]])]
    for bad in (None, float("inf"), float("nan")):
        cpu = [g.clone() for g in grads]
        if bad is not None:
            cpu[1][0, 0] = bad
        dev = [g.to(DEV) for g in cpu]
        found_cpu, found_dev = torch.zeros(1), torch.zeros(1, device=DEV)
        torch._amp_foreach_non_finite_check_and_unscale_(cpu, found_cpu, torch.tensor([0.5]))
        torch._amp_foreach_non_finite_check_and_unscale_(dev, found_dev, torch.tensor([0.5], device=DEV))
        assert found_dev.device.type == DEV
        assert found_dev.item() == found_cpu.item() == (0.0 if bad is None else 1.0)
        for c, d in zip(cpu, dev):
            torch.testing.assert_close(d.cpu(), c, equal_nan=True)


@pytest.mark.parametrize("found_inf", [0.0, 1.0])
def test_update_scale_runs_on_the_device(found_inf):
    results = []
    for device in ("cpu", DEV):
        scale = torch.tensor([1024.0], device=device)
        tracker = torch.tensor([1], dtype=torch.int32, device=device)
        torch._amp_update_scale_(scale, tracker, torch.tensor([found_inf], device=device), 2.0, 0.5, 2)
        results.append((scale.item(), tracker.item()))
    assert results[0] == results[1]
    assert results[1][0] == (2048.0 if found_inf == 0.0 else 512.0)


def _scaled_training(device, steps, poison_step=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler(device, init_scale=256.0, growth_interval=2)
    x, y = torch.randn(5, 6).to(device), torch.randn(5, 2).to(device)
    snapshots = []
    for step in range(steps):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        if step == poison_step:
            model[0].weight.grad[0, 0] = float("inf")
        before = copy.deepcopy([p.detach().cpu() for p in model.parameters()])
        scaler.step(optimizer)
        scaler.update()
        after = [p.detach().cpu().clone() for p in model.parameters()]
        snapshots.append((before, after, scaler.get_scale()))
    return snapshots


def test_grad_scaler_matches_cpu():
    cpu = _scaled_training("cpu", 4)
    dev = _scaled_training(DEV, 4)
    for (_, cpu_after, cpu_scale), (_, dev_after, dev_scale) in zip(cpu, dev):
        assert cpu_scale == dev_scale
        for c, d in zip(cpu_after, dev_after):
            torch.testing.assert_close(d, c, rtol=1e-5, atol=1e-6)
    assert [s for *_, s in dev] == [256.0, 512.0, 512.0, 1024.0]  # grows every 2 good steps


def test_grad_scaler_skips_the_step_on_inf():
    snapshots = _scaled_training(DEV, 3, poison_step=1)
    before, after, scale = snapshots[1]
    for b, a in zip(before, after):
        assert torch.equal(b, a), "the poisoned step must leave the parameters alone"
    assert scale == 128.0  # backed off from 256
    before, after, _ = snapshots[2]
    assert any(not torch.equal(b, a) for b, a in zip(before, after)), "the next step runs again"


def test_openreg_amp_grad_scaler():
    scaler = torch.openreg.amp.GradScaler(init_scale=8.0)
    assert scaler.is_enabled()
    scaled = scaler.scale(torch.ones(2, device=DEV))
    assert scaled.device.type == DEV
    assert scaled.cpu().tolist() == [8.0, 8.0]
