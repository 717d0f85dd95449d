"""The kernels openreg computes with its own loops instead of CPU's
(cpp/ops/batch_norm.cpp, cpp/ops/max_pool.cpp): max pooling equals CPU bit for
bit, batch norm in training equals CPU to rounding (no less accurate), and every
call they do not take (other dtypes, layouts, modes, bad arguments) reaches
CPU's kernel, with CPU's errors."""

import pytest
import torch
import torch.nn.functional as F

DEV = "openreg"

WINDOWS = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=(3, 2), stride=(1, 2), padding=(1, 1), dilation=(2, 1)),
    dict(kernel_size=2, ceil_mode=True),
    dict(kernel_size=4, stride=1, dilation=2, padding=2),
]


def _pooled_input(shape, dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g).to(dtype)
    flat = x.view(-1)
    flat[1::5] = 0.5  # ties: the first maximum's index wins
    flat[::11] = float("nan")  # NaN wins, the last one in the window
    flat[3::13] = float("-inf")
    flat[4::17] = -0.0
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(4, 3, 13, 11), (3, 10, 9)], ids=["batched", "unbatched"])
@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: "-".join(f"{k}{v}" for k, v in w.items()))
def test_max_pool_equals_cpu_bit_for_bit(dtype, shape, window):
    x = _pooled_input(shape, dtype)
    want, want_indices = F.max_pool2d(x, return_indices=True, **window)
    got, got_indices = F.max_pool2d(x.to(DEV), return_indices=True, **window)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(got.cpu().view(torch.int64 if dtype == torch.float64 else torch.int32),
                       want.view(torch.int64 if dtype == torch.float64 else torch.int32))
    assert torch.equal(got_indices.cpu(), want_indices)


def test_max_pool_of_other_layouts_and_dtypes_equals_cpu():
    x = _pooled_input((2, 4, 8, 8), torch.float32)
    for make in (
        lambda t: t.to(memory_format=torch.channels_last),
        lambda t: t.transpose(2, 3),
        lambda t: t.half(),
        lambda t: t[:0],
    ):
        want = F.max_pool2d(make(x), 2, return_indices=True)
        got = F.max_pool2d(make(x.to(DEV)), 2, return_indices=True)
        for g, w in zip(got, want):
            assert g.stride() == w.stride()
            torch.testing.assert_close(g.cpu(), w, equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize(
    "window",
    [
        dict(kernel_size=2, padding=2),
        dict(kernel_size=0),
        dict(kernel_size=30),
        dict(kernel_size=2, stride=0),
        dict(kernel_size=2, dilation=0),
        dict(kernel_size=(2, 2, 2)),
        dict(kernel_size=3, padding=-1),
    ],
    ids=["pad", "zero-kernel", "too-small", "zero-stride", "zero-dilation", "three-ints", "negative-pad"],
)
def test_max_pool_bad_windows_raise_cpus_error(window):
    with pytest.raises(RuntimeError) as cpu:
        F.max_pool2d(torch.randn(1, 1, 8, 8), **window)
    with pytest.raises(RuntimeError) as dev:
        F.max_pool2d(torch.randn(1, 1, 8, 8, device=DEV), **window)
    assert str(dev.value) == str(cpu.value)


def _batch_norm_training(device, dtype, shape):
    g = torch.Generator().manual_seed(1)
    x, probe = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    w, b = torch.randn(shape[1], generator=g), torch.randn(shape[1], generator=g)
    x, w, b = (t.to(device, dtype).requires_grad_() for t in (x, w, b))
    mean = torch.full((shape[1],), 0.5, device=device, dtype=dtype)
    var = torch.full((shape[1],), 2.0, device=device, dtype=dtype)
    y = F.batch_norm(x, mean, var, w, b, training=True, momentum=0.3)
    (y * probe.to(device, dtype)).sum().backward()
    return [t.detach().cpu().double() for t in (y, mean, var, x.grad, w.grad, b.grad)]


@pytest.mark.parametrize("shape", [(8, 3, 5, 7), (16, 5), (4, 6, 33)])
def test_batch_norm_training_is_no_less_accurate_than_cpu(shape):
    exact = _batch_norm_training("cpu", torch.float64, shape)
    cpu = _batch_norm_training("cpu", torch.float32, shape)
    dev = _batch_norm_training(DEV, torch.float32, shape)
    names = ["output", "running_mean", "running_var", "grad_input", "grad_weight", "grad_bias"]
    for name, e, c, d in zip(names, exact, cpu, dev):
        cpu_error = (c - e).abs().max().item()
        dev_error = (d - e).abs().max().item()
        scale = e.abs().max().item()
        assert dev_error <= max(2 * cpu_error, 1e-6 * scale), f"{name}: {dev_error} against CPU's {cpu_error}"
    # In double the two agree to double's rounding.
    for name, c, d in zip(names, exact, _batch_norm_training(DEV, torch.float64, shape)):
        torch.testing.assert_close(d, c, rtol=1e-12, atol=1e-12, msg=name)


def test_batch_norm_calls_openreg_does_not_compute_equal_cpu():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 3, 6, 6, generator=g)
    mean, var = torch.randn(3, generator=g), torch.rand(3, generator=g) + 0.5
    cases = [
        lambda d, t: F.batch_norm(t, mean.to(d), var.to(d), training=False),  # evaluation
        lambda d, t: F.batch_norm(t.half(), None, None, training=True),  # half
        lambda d, t: F.batch_norm(t.to(memory_format=torch.channels_last), mean.to(d).clone(), var.to(d).clone(),
                                  training=True),
    ]
    for case in cases:
        torch.testing.assert_close(case(DEV, x.to(DEV)).cpu(), case("cpu", x))


def test_batch_norm_bad_arguments_raise_cpus_error():
    x = torch.randn(4, 3, 5)
    for args in [dict(running_mean=torch.zeros(4), running_var=torch.ones(4)), dict(running_mean=None, running_var=None,
                                                                                    weight=torch.ones(2))]:
        with pytest.raises(RuntimeError) as cpu:
            F.batch_norm(x, training=True, **args)
        moved = {k: v.to(DEV) if v is not None else None for k, v in args.items()}
        with pytest.raises(RuntimeError) as dev:
            F.batch_norm(x.to(DEV), training=True, **moved)
        assert str(dev.value) == str(cpu.value)


def test_relu_and_its_gradient_compute_as_cpu_on_every_call():
    # relu computes through clamp_min.out and threshold_backward through its
    # grad_input overload once their plans are checked (Note [Out variants]).
    x = torch.tensor([-1.0, 0.0, -0.0, 2.0, float("nan"), float("-inf")]).repeat(2000)
    for _ in range(3):
        leaf = x.to(DEV).requires_grad_()
        y = torch.relu(leaf)
        y.backward(torch.arange(x.numel(), dtype=torch.float32, device=DEV))
        cpu_leaf = x.clone().requires_grad_()
        want = torch.relu(cpu_leaf)
        want.backward(torch.arange(x.numel(), dtype=torch.float32))
        assert torch.equal(y.detach().cpu().view(torch.int32), want.detach().view(torch.int32))
        assert torch.equal(leaf.grad.cpu(), cpu_leaf.grad)
    ints = torch.arange(-6000, 6000)
    for _ in range(3):
        assert torch.equal(torch.relu(ints.to(DEV)).cpu(), torch.relu(ints))
    with pytest.raises(RuntimeError, match="Boolean inputs not supported for relu"):
        torch.relu(torch.ones(3, dtype=torch.bool, device=DEV))
