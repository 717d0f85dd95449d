"""Fused scaled dot product attention on openreg: the OVERRIDEABLE backend,
chosen by torch._fused_sdp_choice and implemented forward and backward with
the CPU's fused kernel (Note [Fused attention] in
cpp/frontends/attention.cpp)."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

DEV = "openreg"


def _qkv(b=2, h=4, l=8, s=8, e=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, l, e, generator=g, dtype=dtype)
    k = torch.randn(b, h, s, e, generator=g, dtype=dtype)
    v = torch.randn(b, h, s, e, generator=g, dtype=dtype)
    return q, k, v


def _choice(q, k, v, **kwargs):
    return SDPBackend(torch._fused_sdp_choice(q.to(DEV), k.to(DEV), v.to(DEV), **kwargs))


MASKS = {
    "none": lambda l, s: None,
    "bool_2d": lambda l, s: torch.rand(l, s, generator=torch.Generator().manual_seed(1)) > 0.3,
    "float_4d": lambda l, s: torch.randn(2, 1, l, s, generator=torch.Generator().manual_seed(2)),
}


@pytest.mark.parametrize("mask", sorted(MASKS))
def test_choice_is_overrideable_for_what_the_fused_kernel_runs(mask):
    q, k, v = _qkv(l=8, s=12)
    attn_mask = MASKS[mask](8, 12)
    assert _choice(q, k, v, attn_mask=None if attn_mask is None else attn_mask.to(DEV)) == SDPBackend.OVERRIDEABLE
    assert _choice(q, k, v, is_causal=True) == SDPBackend.OVERRIDEABLE


def test_choice_falls_back_to_math_as_on_cuda():
    q, k, v = _qkv()
    assert _choice(q, k, v, dropout_p=0.1) == SDPBackend.MATH
    assert _choice(q, k[:, :2], v[:, :2], enable_gqa=True) == SDPBackend.MATH
    assert _choice(q.to(torch.int64), k.to(torch.int64), v.to(torch.int64)) == SDPBackend.MATH
    assert _choice(q[0], k[0], v[0]) == SDPBackend.MATH  # 3-D
    grad_mask = torch.zeros(8, 8, device=DEV, requires_grad=True)
    assert _choice(q, k, v, attn_mask=grad_mask) == SDPBackend.MATH


def test_choice_honours_sdpa_kernel():
    q, k, v = _qkv()
    with sdpa_kernel([SDPBackend.MATH]):
        assert _choice(q, k, v) == SDPBackend.MATH
    with sdpa_kernel([SDPBackend.OVERRIDEABLE]):
        assert _choice(q, k, v) == SDPBackend.OVERRIDEABLE
        with pytest.raises(RuntimeError, match="no enabled backend"):
            _choice(q, k, v, dropout_p=0.5)


def _attention_with_grads(q, k, v, device, **kwargs):
    q, k, v = (t.detach().to(device).requires_grad_() for t in (q, k, v))
    mask = kwargs.pop("attn_mask", None)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask.to(device), **kwargs)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(out.dtype)
    out.backward(grad.to(device))
    return [t.detach().cpu() for t in (out, q.grad, k.grad, v.grad)]


# sdpa takes a mask or is_causal, not both.
@pytest.mark.parametrize("mask, causal", [("none", False), ("none", True), ("bool_2d", False), ("float_4d", False)])
def test_forward_and_backward_match_cpu_and_math(mask, causal):
    q, k, v = _qkv(l=8, s=12)
    attn_mask = MASKS[mask](8, 12)
    device = _attention_with_grads(q, k, v, DEV, attn_mask=attn_mask, is_causal=causal)
    cpu = _attention_with_grads(q, k, v, "cpu", attn_mask=attn_mask, is_causal=causal)
    with sdpa_kernel([SDPBackend.MATH]):
        math = _attention_with_grads(q, k, v, "cpu", attn_mask=attn_mask, is_causal=causal)
    for d, c, m in zip(device, cpu, math):
        torch.testing.assert_close(d, c, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(d, m, rtol=1e-4, atol=1e-5)


def test_sdpa_runs_the_fused_op_not_bmm_softmax():
    q, k, v = (t.to(DEV).requires_grad_() for t in _qkv())
    with torch.profiler.profile() as prof:
        F.scaled_dot_product_attention(q, k, v).sum().backward()
    names = {e.key for e in prof.key_averages()}
    assert "aten::_scaled_dot_product_fused_attention_overrideable" in names
    assert "aten::_scaled_dot_product_fused_attention_overrideable_backward" in names
    assert "aten::bmm" not in names and "aten::_softmax" not in names


def test_bfloat16_matches_cpu():
    q, k, v = _qkv(dtype=torch.bfloat16)
    out = F.scaled_dot_product_attention(q.to(DEV), k.to(DEV), v.to(DEV), is_causal=True)
    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_dropout_is_reproducible_from_the_seed():
    q, k, v = (t.to(DEV) for t in _qkv())
    outs = []
    for _ in range(2):
        torch.openreg.manual_seed(7)
        outs.append(F.scaled_dot_product_attention(q, k, v, dropout_p=0.3).cpu())
    assert torch.equal(outs[0], outs[1])
    torch.openreg.manual_seed(8)
    assert not torch.equal(F.scaled_dot_product_attention(q, k, v, dropout_p=0.3).cpu(), outs[0])


@pytest.fixture
def cpu_threads_like_device_kernels():
    """CPU reductions split across threads round differently with the
    thread count (layer norm's weight gradient here), and a device kernel
    runs single-threaded, or split into single-threaded chunks (Note [Kernel
    threads]): the CPU reference uses one thread."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def test_transformer_training_matches_cpu(cpu_threads_like_device_kernels):
    # The model: before fused attention (and layer norm on the CPU
    # kernel), it drifted 1e-3 from CPU in 20 AdamW steps, which amplify any
    # difference in the gradients.
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    x = torch.randn(8, 32, 64)
    params = []
    for device in ("cpu", DEV):
        m = copy.deepcopy(model).to(device)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        inputs = x.to(device)
        for _ in range(20):
            opt.zero_grad()
            m(inputs).square().mean().backward()
            opt.step()
        params.append([p.detach().cpu() for p in m.parameters()])
    for c, d in zip(*params):
        torch.testing.assert_close(d, c, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "shapes, dtype",
    [
        (((4, 2, 256, 128),) * 3, torch.float16),  # the fused kernel
        (((2, 2, 8, 16), (2, 2, 8, 16), (2, 2, 8, 32)), torch.float32),  # value head size differs
        (((2, 8, 16),) * 3, torch.float32),  # 3-D
        (((2, 4, 8, 16), (2, 2, 6, 16), (2, 2, 6, 16)), torch.float32),  # grouped-query attention
        (((2, 4, 8, 16), (2, 2, 6, 16), (2, 2, 6, 16)), torch.bfloat16),
        (((2, 2, 8, 16),) * 3, torch.float64),
    ],
)
@pytest.mark.parametrize("is_causal", [False, True])
def test_overrideable_op_takes_what_the_math_path_takes(shapes, dtype, is_causal):
    """Called directly, the overrideable op chooses its route inside and
    matches the math path, forward and backward."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(s, dtype=dtype) for s in shapes)
    gqa = q.dim() == 4 and q.size(1) != k.size(1)
    leaves = [t.to("openreg").requires_grad_() for t in (q, k, v)]
    out = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(*leaves, is_causal=is_causal)[0]
    grad = torch.randn_like(out)
    out.backward(grad)
    refs = [t.double().requires_grad_() for t in (q, k, v)]
    want = torch.nn.functional.scaled_dot_product_attention(*refs, is_causal=is_causal, enable_gqa=gqa)
    want.backward(grad.cpu().double())
    tol = dict(rtol=2e-2, atol=2e-2) if dtype in (torch.float16, torch.bfloat16) else dict(rtol=1e-4, atol=1e-5)
    assert out.dtype == dtype and out.shape == want.shape
    torch.testing.assert_close(out.cpu().double(), want.detach(), **tol)
    for leaf, ref in zip(leaves, refs):
        assert leaf.grad.dtype == dtype
        torch.testing.assert_close(leaf.grad.cpu().double(), ref.grad, **tol)


def test_overrideable_op_with_dropout_reproduces_its_mask_in_backward():
    """Dropout takes the math route: the backward redraws the forward's mask
    from the generator state the forward returned (gradcheck reseeds, so
    every evaluation draws the same mask); the default generator moves on."""
    op = torch.ops.aten._scaled_dot_product_fused_attention_overrideable
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 3, dtype=torch.float64, device="openreg", requires_grad=True) for _ in range(3))

    def attend(q, k, v):
        torch.openreg.manual_seed(5)
        return op(q, k, v, dropout_p=0.4)[0]

    assert torch.autograd.gradcheck(attend, (q, k, v))
    torch.openreg.manual_seed(5)
    first = op(q, k, v, dropout_p=0.4)[0]
    second = op(q, k, v, dropout_p=0.4)[0]
    assert not torch.equal(first.detach().cpu(), second.detach().cpu())
    undropped = op(q, k, v)[0]
    assert not torch.equal(first.detach().cpu(), undropped.detach().cpu())
    with pytest.raises(RuntimeError, match=r"dropout_p must be in \[0, 1\)"):
        op(q, k, v, dropout_p=1.0)


@pytest.mark.parametrize("bias_shape", [(2, 3, 5, 7), (1, 1, 5, 7), (5, 7), (2, 1, 1, 7)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_overrideable_backward_returns_the_bias_gradient(bias_shape, dtype):
    """Asked for it (grad_input_mask[3]), the backward returns the gradient of
    a floating-point attn_bias, broadcast dimensions summed, as CUDA's
    memory-efficient kernel does; it equals the math path's, whose autograd
    differentiates softmax(q k^T * scale + bias) v."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 8, dtype=dtype) for n in (5, 7, 7))
    bias = torch.randn(bias_shape, dtype=dtype)
    grad = torch.randn(2, 3, 5, 8, dtype=dtype)
    refs = [t.double().requires_grad_() for t in (q, k, v, bias)]
    want = torch.softmax(refs[0] @ refs[1].transpose(-2, -1) / 8**0.5 + refs[3], -1) @ refs[2]
    want.backward(grad.double())

    on_device = [t.to("openreg") for t in (q, k, v, bias)]
    out = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(*on_device)
    grads = torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward(
        grad.to("openreg"), *on_device, [True, True, True, True], *out[:6], 0.0, False, out[6], out[7]
    )
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else {}
    for got, ref in zip(grads, refs):
        assert got.dtype == dtype and got.shape == ref.shape
        torch.testing.assert_close(got.cpu().double(), ref.grad, **tol)
    # Not asked for: no bias gradient.
    unasked = torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward(
        grad.to("openreg"), *on_device, [True, True, True, False], *out[:6], 0.0, False, out[6], out[7]
    )
    assert unasked[3] is None or not unasked[3].defined()


def test_overrideable_backward_refuses_a_gradient_for_a_boolean_mask():
    q, k, v = (torch.randn(1, 2, 4, 8, device="openreg") for _ in range(3))
    mask = torch.ones(4, 4, dtype=torch.bool, device="openreg")
    out = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(q, k, v, mask)
    with pytest.raises(RuntimeError, match="no gradient for a Bool attn_bias"):
        torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward(
            torch.randn_like(out[0]), q, k, v, mask, [True, True, True, True], *out[:6], 0.0, False, out[6], out[7]
        )
