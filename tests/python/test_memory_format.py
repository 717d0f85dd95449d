"""Results, and gradients, laid out as CPU and CUDA lay them out for
channels_last and channels_last_3d inputs and weights (Note [Memory format
of results] in cpp/ops/result_format.h): openreg's own pointwise kernels
follow TensorIterator's stride rule, its convolutions cuDNN's suggested
format, the fallback CPU's results. Strides are compared along the dims of
more than one element (any stride describes a dim of one); the sweeps over
op_db and module_db (--memory-formats in test_opinfo_parity.py and
test_module_parity.py) cover the rest."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_openreg  # noqa: F401

DEV = "openreg"
CL = torch.channels_last
CL3D = torch.channels_last_3d


def layout(t: torch.Tensor) -> tuple:
    return tuple((d, stride) for d, (size, stride) in enumerate(zip(t.shape, t.stride())) if size > 1)


def leaves(*tensors):
    return [t.detach().clone(memory_format=torch.preserve_format).requires_grad_() for t in tensors]


def check(fn, *cpu_args, formats=None):
    """fn on CPU and on openreg: equal values and layouts, forward and (for
    float inputs) the inputs' gradients, for an output gradient with the
    output's strides. `formats` names the memory format each layout must
    be (CUDA's), beside CPU's."""
    cpu = leaves(*cpu_args)
    dev = [t.detach().to(DEV).requires_grad_() for t in cpu]
    for c, d in zip(cpu, dev):
        assert layout(d) == layout(c)  # moving keeps the layout
    want, got = fn(*cpu), fn(*dev)
    assert layout(got) == layout(want), f"forward: {got.stride()}, want {want.stride()}"
    torch.testing.assert_close(got.cpu(), want)
    if formats:
        assert got.is_contiguous(memory_format=formats[0])
    grad = torch.empty_like(want).copy_(torch.randn(want.shape, generator=torch.Generator().manual_seed(0)))
    want_grads = torch.autograd.grad(want, cpu, grad)
    got_grads = torch.autograd.grad(got, dev, grad.to(DEV))
    for i, (g, w) in enumerate(zip(got_grads, want_grads)):
        assert layout(g) == layout(w), f"gradient {i}: {g.stride()}, want {w.stride()}"
        torch.testing.assert_close(g.cpu(), w, rtol=1e-4, atol=1e-4)
        if formats:
            assert g.is_contiguous(memory_format=formats[i + 1])


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


def x4(cl=True):
    x = torch.randn(2, 3, 8, 8)
    return x.contiguous(memory_format=CL) if cl else x


def test_sub_of_a_channels_last_tensor_is_channels_last():
    check(lambda x: x - x, x4())


def test_tanhshrink_is_channels_last():
    check(lambda x: x - torch.tanh(x), x4(), formats=(CL, CL))


def test_binary_ops_follow_tensor_iterator_rule():
    """The first operand's layout wins where operands disagree; a
    broadcast operand counts only along its dims (TensorIterator's
    reorder_dimensions)."""
    for op in (torch.add, torch.sub, torch.mul, torch.div):
        check(op, x4(), x4(cl=False))
        check(op, x4(cl=False), x4())
        check(op, x4(), torch.randn(3, 1, 1))
        check(op, torch.randn(1, 3, 1, 8), x4())
        check(op, x4().permute(0, 2, 1, 3), torch.randn(8, 3, 8))


def test_binary_op_with_a_cpu_scalar_is_channels_last():
    check(lambda x: x * torch.tensor(2.0), x4(), formats=(CL, CL))


def test_lp_pool2d_is_channels_last():
    check(lambda x: F.lp_pool2d(x, 2, 2), x4(), formats=(CL, CL))


def test_rms_norm_and_normalize_are_channels_last():
    check(lambda x: F.rms_norm(x, [8]), x4(), formats=(CL, CL))
    check(lambda x: F.normalize(x), x4(), formats=(CL, CL))


def test_conv2d_with_a_channels_last_weight_is_channels_last():
    """cuDNN's (and CPU's) rule: the input's or the weight's channels-last
    format makes the output, and both gradients, channels-last."""
    w = torch.randn(4, 3, 3, 3).contiguous(memory_format=CL)
    check(lambda x, w: F.conv2d(x, w), x4(cl=False), w, formats=(CL, CL, CL))
    check(lambda x, w: F.conv2d(x, w), x4(), torch.randn(4, 3, 3, 3), formats=(CL, CL, CL))


def test_unbatched_conv2d_with_a_channels_last_weight():
    w = torch.randn(4, 3, 3, 3).contiguous(memory_format=CL)
    check(lambda x, w: F.conv2d(x, w), x4()[0], w)
    check(lambda x, w: F.conv2d(x, w), x4(cl=False)[0], w)


def test_unbatched_conv_transpose2d_of_a_channels_last_input():
    check(lambda x, w: F.conv_transpose2d(x, w), x4()[0], torch.randn(3, 4, 3, 3))


def test_conv3d_is_channels_last_3d():
    x = torch.randn(2, 3, 4, 5, 6).contiguous(memory_format=CL3D)
    check(lambda x, w: F.conv3d(x, w), x, torch.randn(4, 3, 3, 3, 3), formats=(CL3D, CL3D, CL3D))


def test_float64_convolution_is_contiguous_as_with_cudnn():
    """CUDA runs float64 convolutions in NCHW whatever the formats
    (cudnn_conv_suggest_memory_format in aten/src/ATen/native/ConvUtils.h:
    NHWC is disabled for float64), where CPU's slow kernel keeps
    channels_last: openreg is CUDA's."""
    x, w = leaves(x4().double(), torch.randn(4, 3, 3, 3, dtype=torch.float64))
    dx, dw = (t.detach().to(DEV).requires_grad_() for t in (x, w))
    want, got = F.conv2d(x, w), F.conv2d(dx, dw)
    assert want.is_contiguous(memory_format=CL)  # CPU's
    assert got.is_contiguous() and not got.is_contiguous(memory_format=CL)
    torch.testing.assert_close(got.cpu(), want)
    grads = torch.autograd.grad(got, (dx, dw), torch.ones_like(got))
    assert all(g.is_contiguous() for g in grads)


def test_max_pool3d_of_an_unbatched_channels_last_3d_input():
    y = torch.randn(1, 2, 4, 6, 6).contiguous(memory_format=CL3D).squeeze(0)
    check(lambda x: F.max_pool3d(x, 2), y)


@pytest.mark.parametrize("p", [0.0, 0.5])
def test_dropouts_keep_channels_last(p):
    """Strides only where values are random."""
    x = torch.randn(2, 3, 4, 5, 6).contiguous(memory_format=CL3D)
    for fn in (lambda t: F.dropout3d(t, p), lambda t: F.feature_alpha_dropout(t, p, training=True)):
        want, got = fn(x), fn(x.to(DEV))
        assert layout(got) == layout(want)


def test_channels_last_modules():
    """Channels-last modules as a user of AMP-era vision models writes
    them: model and input converted, forward and backward."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Tanhshrink(), nn.LPPool2d(2, 2), nn.Conv2d(8, 4, 1))
    model = model.to(memory_format=CL)
    x = x4()
    on_device = copy.deepcopy(model).to(DEV)
    want, got = model(x), on_device(x.to(DEV))
    assert layout(got) == layout(want) and got.is_contiguous(memory_format=CL)
    want.sum().backward()
    got.sum().backward()
    for (name, p), q in zip(model.named_parameters(), on_device.parameters()):
        assert layout(q.grad) == layout(p.grad), name


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "queued"])
def test_planned_results_keep_cpu_layout(busy):
    """A call whose results were planned from the op's Meta kernel (Note
    [Meta results]: from the second call of the same arguments' geometry
    on, or behind queued work) keeps the CPU kernel's layout where the Meta
    kernel lays results out otherwise (these give contiguous results for
    channels_last inputs; CPU's kernels keep channels_last), and is still
    queued without a wait."""
    x = torch.randn(1, 18, 4, 6).contiguous(memory_format=CL)
    pooled, indices = F.max_pool2d(x, 2, return_indices=True)
    cases = {
        "pixel_shuffle": (lambda t: F.pixel_shuffle(t, 3), (x,)),
        "channel_shuffle": (lambda t: F.channel_shuffle(t, 3), (x,)),
        "replication_pad2d": (lambda t: F.pad(t, (-1, 1, 0, 1), mode="replicate"), (x,)),
        "max_unpool2d": (lambda t, i: F.max_unpool2d(t, i, 2), (pooled, indices)),
    }
    for name, (fn, args) in cases.items():
        want = fn(*args)
        for call in range(3):
            moved = [a.to(DEV) for a in args]
            if busy:
                torch.openreg._sleep(200)
            got = fn(*moved)
            if busy and call > 0:  # the plan, laid out as CPU's results, is used without a wait
                assert not torch.openreg.current_stream().query(), f"{name}, call {call}: the host waited"
            assert layout(got) == layout(want), f"{name}, call {call}: {got.stride()}, want {want.stride()}"
            torch.testing.assert_close(got.cpu(), want)
