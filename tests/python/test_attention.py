"""Fused scaled dot product attention on openreg: the OVERRIDEABLE backend,
chosen by torch._fused_sdp_choice and implemented forward and backward with
the CPU's fused kernel (Note [Fused attention] in
cpp/frontends/attention.cpp)."""

import copy
import importlib.util
import itertools
import math
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch_openreg._op_db import cuda_dtypes, load_op_db

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


# ---- CUDA's flash and memory-efficient attention operators (Note [Flash
# and efficient attention] in cpp/frontends/flash_efficient_attention.cpp),
# against tests/attention_reference.py: CUDA's kernels as a formula on the
# CPU, one sequence at a time.

_spec = importlib.util.spec_from_file_location(
    "attention_reference", os.path.join(os.path.dirname(__file__), "..", "attention_reference.py"))
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)

FLASH = torch.ops.aten._flash_attention_forward
EFFICIENT = torch.ops.aten._efficient_attention_forward
OP_DB = {op.name: op for op in load_op_db() if op.name in reference.REFERENCES}
# (op_db name, dtype): op_db's CUDA dtypes for these OpInfos (CPU has none).
OPINFO_PAIRS = [(name, dtype) for name in sorted(OP_DB) for dtype in sorted(cuda_dtypes(OP_DB[name]), key=str)]
TOLERANCE = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float16: dict(rtol=2e-3, atol=2e-3),
             torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def _on_device(value):
    if isinstance(value, torch.Tensor):
        return value.detach().to(DEV).requires_grad_(value.requires_grad)
    return value


def _undropped_samples(name, dtype, requires_grad):
    samples = OP_DB[name].sample_inputs("cpu", dtype, requires_grad=requires_grad)
    return [s for s in samples if not s.kwargs.get("dropout_p")]


def test_opinfo_pairs_are_the_ones_cuda_declares():
    assert OPINFO_PAIRS == [
        ("torch.ops.aten._efficient_attention_forward", torch.bfloat16),
        ("torch.ops.aten._efficient_attention_forward", torch.float16),
        ("torch.ops.aten._efficient_attention_forward", torch.float32),
        ("torch.ops.aten._flash_attention_forward", torch.bfloat16),
        ("torch.ops.aten._flash_attention_forward", torch.float16),
    ]


@pytest.mark.parametrize("name, dtype", OPINFO_PAIRS)
def test_forward_matches_the_reference_on_op_db_samples(name, dtype, one_cpu_thread):
    """op_db's samples (dense, causal from either corner, a scale, a bias,
    packed sequences): every output as CUDA returns it: values, shapes,
    dtypes, and where it lives (efficient's philox scalars on the host)."""
    for i, sample in enumerate(_undropped_samples(name, dtype, requires_grad=False)):
        want = reference.REFERENCES[name](sample.input, *sample.args, **sample.kwargs)
        got = OP_DB[name](_on_device(sample.input), *map(_on_device, sample.args),
                          **{k: _on_device(v) for k, v in sample.kwargs.items()})
        assert len(got) == len(want)
        for n, (g, w) in enumerate(zip(got, want)):
            if not isinstance(w, torch.Tensor):
                assert g == w, (i, n)
                continue
            host = name.endswith("_efficient_attention_forward") and n in (2, 3)
            assert g.device.type == ("cpu" if host else DEV), (i, n)
            assert g.dtype == w.dtype and g.shape == w.shape, (i, n, g.dtype, g.shape, w.shape)
            torch.testing.assert_close(g.cpu(), w, **(TOLERANCE[dtype] if n == 0 else {}), msg=f"sample {i} result {n}")


# Relative to the gradient's largest element: with op_db's scores in the
# hundreds (scale=1.0), softmax is nearly one-hot and a gradient's small
# elements are differences of large terms, whose float32 rounding shows.
GRADIENT_TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _assert_close_at_scale(got, want, tolerance, msg=None):
    torch.testing.assert_close(got.double(), want.double(), rtol=tolerance,
                               atol=tolerance * want.abs().max().item(), msg=msg)


def _gradients(op, sample, device, dtype=None):
    """The sample's input gradients for output 0 times a fixed gradient (of
    the sample's dtype), computed in `dtype` (default: the sample's)."""
    leaves = [t.detach().to(device=device, dtype=dtype or t.dtype).requires_grad_()
              for t in (sample.input, *sample.args)]
    kwargs = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in sample.kwargs.items()}
    out = op(*leaves, **kwargs)[0]
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(sample.input.dtype)
    return [g.cpu() for g in torch.autograd.grad(out, leaves, grad.to(out))]


@pytest.mark.parametrize("name, dtype", OPINFO_PAIRS)
def test_gradients_flow_and_match_the_math_reference(name, dtype):
    """Autograd maps each forward to its backward (derivatives.yaml); the
    gradients of op_db's samples equal the reference's, differentiated in
    float64 on the CPU."""
    ref = lambda *args, **kwargs: reference.REFERENCES[name](*args, **kwargs, compute_dtype=torch.float64)
    for i, sample in enumerate(_undropped_samples(name, dtype, requires_grad=True)):
        got = _gradients(OP_DB[name], sample, DEV)
        want = _gradients(ref, sample, "cpu", torch.float64)
        for g, w in zip(got, want):
            assert g.dtype == dtype
            _assert_close_at_scale(g, w, GRADIENT_TOLERANCE[dtype], f"sample {i}")


def _qkv_bshd(b=2, sq=5, sk=7, h=4, hk=4, d=8, dv=8, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, sq, h, d, generator=g).to(dtype), torch.randn(b, sk, hk, d, generator=g).to(dtype),
            torch.randn(b, sk, hk, dv, generator=g).to(dtype))


def _sdpa_math(q, k, v, allowed=None, scale=None, bias=None):
    """sdpa's math on the CPU in float64, (batch, seqlen, heads, dim) in and out."""
    q, k, v = (t.double().transpose(1, 2) for t in (q, k, v))
    k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    mask = bias.double() if bias is not None else None
    if allowed is not None:
        mask = torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, -math.inf) + (
            mask if mask is not None else 0)
    with sdpa_kernel([SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale).transpose(1, 2)


def test_flash_causal_ends_at_the_last_key_and_efficient_chooses_its_corner():
    """flash's is_causal aligns the diagonal to the bottom right (flash-attn
    2: query i of 5 sees keys up to i + 2 of 7); efficient's custom_mask_type
    1 aligns it to the top left, 2 to the bottom right."""
    q, k, v = _qkv_bshd(sq=5, sk=7)
    bottom_right = torch.ones(5, 7, dtype=torch.bool).tril(2)
    top_left = torch.ones(5, 7, dtype=torch.bool).tril(0)
    flash = FLASH(*(t.to(DEV) for t in (q, k, v)), None, None, 5, 7, 0.0, True, False)[0]
    torch.testing.assert_close(flash.cpu().double(), _sdpa_math(q, k, v, bottom_right), **TOLERANCE[torch.float16])
    for mask_type, allowed in ((1, top_left), (2, bottom_right), (0, None)):
        out = EFFICIENT(*(t.float().to(DEV) for t in (q, k, v)), None, None, None, None, None, 0.0, mask_type)[0]
        torch.testing.assert_close(out.cpu().double(), _sdpa_math(q, k, v, allowed), rtol=1e-5, atol=1e-5)


def test_windows_bound_the_keys_around_the_diagonal():
    """flash's window_size_left/right, efficient's window_size (causal only):
    the keys a query sees, around the diagonal."""
    q, k, v = _qkv_bshd(sq=6, sk=6)
    band = lambda left, right: torch.ones(6, 6, dtype=torch.bool).tril(right).triu(-left)
    out = FLASH(*(t.to(DEV) for t in (q, k, v)), None, None, 6, 6, 0.0, False, False,
                window_size_left=2, window_size_right=1)[0]
    torch.testing.assert_close(out.cpu().double(), _sdpa_math(q, k, v, band(2, 1)), **TOLERANCE[torch.float16])
    out = EFFICIENT(*(t.float().to(DEV) for t in (q, k, v)), None, None, None, None, None, 0.0, 1, window_size=3)[0]
    torch.testing.assert_close(out.cpu().double(), _sdpa_math(q, k, v, band(2, 0)), rtol=1e-5, atol=1e-5)


def test_scale_and_grouped_query_attention():
    q, k, v = _qkv_bshd(h=4, hk=2)
    out = FLASH(*(t.to(DEV) for t in (q, k, v)), None, None, 5, 7, 0.0, False, False, scale=0.3)[0]
    torch.testing.assert_close(out.cpu().double(), _sdpa_math(q, k, v, scale=0.3), **TOLERANCE[torch.float16])
    out = EFFICIENT(*(t.float().to(DEV) for t in (q, k, v)), None, None, None, None, None, 0.0, 0, scale=0.3)[0]
    torch.testing.assert_close(out.cpu().double(), _sdpa_math(q, k, v, scale=0.3), rtol=1e-5, atol=1e-5)


def test_queries_without_keys_get_zero_and_each_kernels_logsumexp():
    """Causal from the bottom right with more queries than keys leaves the
    first queries no key: output 0, logsumexp +inf for flash (flash-attn),
    0 for efficient (aten/src/ATen/native/transformers/cuda/mem_eff_attention/
    kernel_forward.h), whose padding rows are +inf."""
    q, k, v = _qkv_bshd(sq=6, sk=4)
    out, lse = FLASH(*(t.to(DEV) for t in (q, k, v)), None, None, 6, 4, 0.0, True, False)[:2]
    assert out.cpu()[:, :2].abs().max() == 0 and (lse.cpu()[..., :2] == math.inf).all()
    assert torch.isfinite(lse.cpu()[..., 2:]).all() and out.cpu()[:, 2:].abs().max() > 0
    out, lse = EFFICIENT(*(t.float().to(DEV) for t in (q, k, v)), None, None, None, None, None, 0.0, 2, True)[:2]
    lse = lse.cpu()
    assert out.cpu()[:, :2].abs().max() == 0
    assert lse.shape == (2, 4, 32) and (lse[..., :2] == 0).all() and torch.isfinite(lse[..., 2:6]).all()
    assert (lse[..., 6:] == math.inf).all()


def test_efficient_bias_and_its_gradient():
    """An additive (batch, heads, q, k) bias in the query's dtype; with
    bias_requires_grad its gradient, allocated as CUDA allocates it (the last
    dimension padded to a multiple of 16)."""
    q, k, v = (t.float() for t in _qkv_bshd())
    bias = torch.randn(2, 4, 5, 7, generator=torch.Generator().manual_seed(1))
    leaves = [t.to(DEV).requires_grad_() for t in (q, k, v, bias)]
    out = EFFICIENT(*leaves[:3], leaves[3], None, None, None, None, 0.0, 0, True)[0]
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    out.backward(grad.to(DEV))
    refs = [t.double().requires_grad_() for t in (q, k, v, bias)]
    want = _sdpa_math(*refs[:3], bias=refs[3])
    want.backward(grad.double())
    torch.testing.assert_close(out.detach().cpu().double(), want.detach(), rtol=1e-5, atol=1e-5)
    for leaf, ref in zip(leaves, refs):
        torch.testing.assert_close(leaf.grad.cpu().double(), ref.grad, rtol=1e-4, atol=1e-5)
    outs = EFFICIENT(*(t.detach() for t in leaves[:3]), leaves[3].detach(), None, None, None, None, 0.0, 0, True)
    grads = torch.ops.aten._efficient_attention_backward(
        grad.to(DEV), *(t.detach() for t in leaves[:3]), leaves[3].detach(), outs[0], None, None, 5, 7, outs[1],
        0.0, outs[2], outs[3], 0, True)
    assert grads[3].shape == (2, 4, 5, 7) and grads[3].stride() == (4 * 5 * 16, 5 * 16, 16, 1)
    torch.testing.assert_close(grads[3].cpu().double(), refs[3].grad, rtol=1e-4, atol=1e-5)


def _packed(lengths, h=2, d=8, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
    return [torch.randn(total, h, d, generator=g).to(dtype) for _ in range(3)], cu


def test_flash_packed_sequences_attend_within_their_own():
    (q, k, v), cu = _packed([3, 1, 4])
    for causal in (False, True):
        got = FLASH(*(t.to(DEV) for t in (q, k, v)), cu.to(DEV), cu.to(DEV), 4, 4, 0.0, causal, False)
        want = reference.flash_attention_forward(q, k, v, cu, cu, 4, 4, 0.0, causal, False)
        assert got[1].shape == (2, 8)  # (heads, total_q)
        torch.testing.assert_close(got[0].cpu(), want[0], **TOLERANCE[torch.float16])
        torch.testing.assert_close(got[1].cpu(), want[1])
        for s, e in ((0, 3), (3, 4), (4, 8)):  # each sequence as sdpa alone
            allowed = torch.ones(e - s, e - s, dtype=torch.bool).tril() if causal else None
            alone = _sdpa_math(q[None, s:e], k[None, s:e], v[None, s:e], allowed)[0]
            torch.testing.assert_close(got[0].cpu()[s:e].double(), alone, **TOLERANCE[torch.float16])


def test_varlen_attn_runs_on_openreg_forward_and_backward():
    """torch.nn.attention.varlen.varlen_attn takes flash for a non-CUDA
    device: forward and backward equal sdpa per sequence."""
    from torch.nn.attention.varlen import varlen_attn

    (q, k, v), cu = _packed([5, 2, 3], dtype=torch.bfloat16)
    leaves = [t.to(DEV).requires_grad_() for t in (q, k, v)]
    out = varlen_attn(*leaves, cu.to(DEV), cu.to(DEV), 5, 5, window_size=(-1, 0))
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(4)).to(out.dtype)
    out.backward(grad.to(DEV))
    for s, e in ((0, 5), (5, 7), (7, 10)):
        refs = [t[None, s:e].double().requires_grad_() for t in (q, k, v)]
        alone = _sdpa_math(*refs, torch.ones(e - s, e - s, dtype=torch.bool).tril())
        alone.backward(grad[None, s:e].double())
        torch.testing.assert_close(out.detach().cpu()[s:e].double(), alone[0].detach(), **TOLERANCE[torch.bfloat16])
        for leaf, ref in zip(leaves, refs):
            torch.testing.assert_close(leaf.grad.cpu()[s:e].double(), ref.grad[0], **TOLERANCE[torch.bfloat16])


def test_flash_forward_into_out_for_varlen_attn_out():
    """_flash_attention_forward_no_dropout_inplace: the forward written into
    `out`, returning the logsumexp; dropout is refused, as on CUDA."""
    (q, k, v), cu = _packed([3, 2])
    args = (*(t.to(DEV) for t in (q, k, v)), cu.to(DEV), cu.to(DEV), 3, 3)
    out = torch.full(q.shape, math.nan, dtype=q.dtype, device=DEV)
    lse = torch.ops.aten._flash_attention_forward_no_dropout_inplace(out, *args, 0.0, True, False)
    want = FLASH(*args, 0.0, True, False)
    assert torch.equal(out.cpu(), want[0].cpu()) and torch.equal(lse.cpu(), want[1].cpu())
    with pytest.raises(RuntimeError, match="dropout_p must be 0"):
        torch.ops.aten._flash_attention_forward_no_dropout_inplace(out, *args, 0.5, True, False)


def test_efficient_packed_sequences_and_their_logsumexp_rows():
    """cu_seqlens_q/k with batch 1: one logsumexp row per sequence, 32 wide
    (max_seqlen_q rounded up), +inf past each sequence's length."""
    (q, k, v), cu = _packed([3, 1, 4], dtype=torch.float32)
    q, k, v = (t[None] for t in (q, k, v))
    got = EFFICIENT(*(t.to(DEV) for t in (q, k, v)), None, cu.to(DEV), cu.to(DEV), 4, 4, 0.0, 1, True)
    want = reference.efficient_attention_forward(q, k, v, None, cu, cu, 4, 4, 0.0, 1, True)
    assert got[1].shape == (3, 2, 32) and got[4:] == (4, 4) == want[4:]
    torch.testing.assert_close(got[0].cpu(), want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1].cpu(), want[1])
    assert torch.isinf(got[1].cpu()[1, :, 1:]).all() and torch.isfinite(got[1].cpu()[1, :, :1]).all()


def _keep_scale(seed, offset, shape, p):
    """The dropout draw of the Note: bernoulli_(1 - p) of a float32 tensor of
    the scores' shape, from a generator at the returned (seed, offset)."""
    g = torch.Generator(device=DEV)
    g.manual_seed(seed)
    g.set_offset(offset)
    return (torch.empty(shape, device=DEV).bernoulli_(1 - p, generator=g) / (1 - p)).cpu()


@pytest.mark.parametrize("op", ["flash", "efficient"])
def test_dropout_draws_from_the_openreg_generator_and_reproduces_from_the_seed(op):
    """The random-state outputs hold the draw's Philox seed and offset: the
    same seed draws the same mask, the generator moves on, and the backward
    redraws the forward's mask (the gradients equal the reference's with
    that mask)."""
    q, k, v = _qkv_bshd(dtype=torch.float16 if op == "flash" else torch.float32)
    p = 0.4

    def run(*leaves):
        if op == "flash":
            out = FLASH(*leaves, None, None, 5, 7, p, False, False)
            seed, offset = out[2].cpu().tolist()
        else:
            out = EFFICIENT(*leaves, None, None, None, None, None, p, 0, True)
            seed, offset = out[2].item(), out[3].item()
        return out[0], seed, offset

    torch.openreg.manual_seed(11)
    first, seed, offset = run(*(t.to(DEV) for t in (q, k, v)))
    second, _, next_offset = run(*(t.to(DEV) for t in (q, k, v)))
    assert seed == 11 and next_offset > offset
    assert not torch.equal(first.cpu(), second.cpu())
    torch.openreg.manual_seed(11)
    leaves = [t.to(DEV).requires_grad_() for t in (q, k, v)]
    again, seed_again, offset_again = run(*leaves)
    assert (seed_again, offset_again) == (seed, offset) and torch.equal(again.detach().cpu(), first.cpu())

    keep = _keep_scale(seed, offset, (2, 4, 5, 7), p)
    grad = torch.randn(again.shape, generator=torch.Generator().manual_seed(3))
    again.backward(grad.to(again))
    refs = [t.double().requires_grad_() for t in (q, k, v)]
    ref = reference.REFERENCES[f"torch.ops.aten._{op}_attention_forward"]
    want = ref(*refs, dropout_scale=keep, compute_dtype=torch.float64)[0]
    want.backward(grad.double())
    torch.testing.assert_close(again.detach().cpu().double(), want.detach(), **TOLERANCE[q.dtype])
    for leaf, r in zip(leaves, refs):
        _assert_close_at_scale(leaf.grad.cpu(), r.grad, GRADIENT_TOLERANCE[q.dtype])


def test_flash_debug_mask_carries_the_dropout_in_its_sign():
    """return_debug_mask (with dropout, as CUDA requires): the probabilities,
    negative where dropped, in (batch, heads, q, k) rounded up to 128."""
    q, k, v = _qkv_bshd()
    torch.openreg.manual_seed(3)
    out = FLASH(*(t.to(DEV) for t in (q, k, v)), None, None, 5, 7, 0.5, False, True)
    debug = out[4].cpu()
    assert debug.shape == (2, 4, 128, 128) and debug.dtype == torch.float16
    assert (debug[:, :, 5:] == 0).all() and (debug[..., 7:] == 0).all()
    seed, offset = out[2].cpu().tolist()
    kept = _keep_scale(seed, offset, (2, 4, 5, 7), 0.5) > 0
    assert torch.equal(debug[:, :, :5, :7] >= 0, kept)
    probabilities = torch.softmax(q.double().transpose(1, 2) @ k.double().transpose(1, 2).transpose(-2, -1) / 8**0.5, -1)
    torch.testing.assert_close(debug[:, :, :5, :7].abs().double(), probabilities, **TOLERANCE[torch.float16])
    with pytest.raises(RuntimeError, match="return_softmax is only supported when p_dropout > 0.0"):
        FLASH(*(t.to(DEV) for t in (q, k, v)), None, None, 5, 7, 0.0, False, True)


def test_results_are_allocated_as_cuda_allocates_them():
    """flash: empty_like its inputs (a transposed query keeps its strides);
    efficient: contiguous."""
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2).to(DEV) for t in _qkv_bshd())
    out = FLASH(q, k, v, None, None, 5, 7, 0.0, False, False)[0]
    assert out.stride() == q.stride() and not out.is_contiguous()
    out = EFFICIENT(q.float(), k.float(), v.float(), None, None, None, None, None, 0.0, 0)[0]
    assert out.is_contiguous()


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda q, k, v: FLASH(q.float(), k.float(), v.float(), None, None, 5, 7, 0.0, False, False),
         RuntimeError, "FlashAttention only support fp16 and bf16 data type"),
        (lambda q, k, v: FLASH(q, k.bfloat16(), v, None, None, 5, 7, 0.0, False, False),
         RuntimeError, "query and key must have the same dtype"),
        (lambda q, k, v: FLASH(q[0], k[0], v[0], None, None, 5, 7, 0.0, False, False),
         RuntimeError, "query must be 4-D"),
        (lambda q, k, v: FLASH(q, k[:, :, :3], v[:, :, :3], None, None, 5, 7, 0.0, False, False),
         RuntimeError, "Number of heads in key/value must divide number of heads in query"),
        (lambda q, k, v: FLASH(q, k, v[:, :, :2], None, None, 5, 7, 0.0, False, False),
         RuntimeError, "key and value must have shape"),
        (lambda q, k, v: FLASH(q[..., :6], k[..., :6], v[..., :6], None, None, 5, 7, 0.0, False, False),
         RuntimeError, "head_size must be a multiple of 8"),
        (lambda q, k, v: FLASH(q, k, v, None, None, 5, 7, 1.0, False, False),
         RuntimeError, r"dropout_p must be in \[0, 1\)"),
        (lambda q, k, v: FLASH(q, k, v, None, None, 5, 7, 0.0, False, False,
                               alibi_slopes=torch.zeros(4, device=DEV)),
         RuntimeError, "This flash attention build does not support alibi"),
        (lambda q, k, v: FLASH(q[0], k[0], v[0], *(torch.tensor([0, 5], dtype=torch.int32, device=DEV),) * 2, 5, 5,
                               0.0, False, False, block_table=torch.zeros(1, 1, dtype=torch.int32, device=DEV)),
         NotImplementedError, "block_table"),
        (lambda q, k, v: FLASH(q[0], k[0], v[0], *(torch.tensor([0, 5], device=DEV),) * 2, 5, 5, 0.0, False, False),
         RuntimeError, "cu_seqlens_q must have dtype int32"),
        (lambda q, k, v: FLASH(q[0], k[0], v[0], torch.tensor([0, 5], dtype=torch.int32, device=DEV), None, 5, 5,
                               0.0, False, False),
         RuntimeError, "must be both set or both not set"),
        (lambda q, k, v: EFFICIENT(q.double(), k.double(), v.double(), None, None, None, None, None, 0.0, 0),
         RuntimeError, "Only fp32, half & bf16 supported at the moment"),
        (lambda q, k, v: EFFICIENT(q, k.float(), v, None, None, None, None, None, 0.0, 0),
         RuntimeError, "query, key and value must have the same dtype"),
        (lambda q, k, v: EFFICIENT(q[0], k[0], v[0], None, None, None, None, None, 0.0, 0),
         RuntimeError, "query must be 4-D"),
        (lambda q, k, v: EFFICIENT(q, k[:, :, :3], v[:, :, :3], None, None, None, None, None, 0.0, 0),
         RuntimeError, "Number of heads in key/value must divide number of heads in query"),
        (lambda q, k, v: EFFICIENT(q, k, v[:, :, :2], None, None, None, None, None, 0.0, 0),
         RuntimeError, "key and value must have the same number of heads"),
        (lambda q, k, v: EFFICIENT(q, k, v, torch.zeros(2, 4, 5, 7, device=DEV), None, None, None, None, 0.0, 0),
         RuntimeError, "invalid dtype for bias - should match query's dtype"),
        (lambda q, k, v: EFFICIENT(q, k, v, torch.zeros(1, 4, 5, 7, dtype=q.dtype, device=DEV), None, None, None,
                                   None, 0.0, 0),
         RuntimeError, r"attn_bias: wrong shape \(batch dimension\)"),
        (lambda q, k, v: EFFICIENT(q, k, v, None, None, None, None, None, 0.0, 3),
         RuntimeError, "invalid value for `custom_mask_type`"),
        (lambda q, k, v: EFFICIENT(q, k, v, None, None, None, None, None, 0.0, 0, window_size=2),
         RuntimeError, "LocalAttention only supported in causal mode"),
        (lambda q, k, v: EFFICIENT(q, k, v, None, *(torch.tensor([0, 5], dtype=torch.int32, device=DEV),) * 2,
                                   5, 7, 0.0, 0),
         RuntimeError, "cu_seqlen only supports batch_size=1"),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_bad_input_raises_cuda_errors_at_the_call(call, error, match):
    q, k, v = (t.to(DEV) for t in _qkv_bshd())
    with pytest.raises(error, match=match):
        call(q, k, v)
    torch.openreg.synchronize()
