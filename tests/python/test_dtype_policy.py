"""Dtype support as CUDA's (Note [Dtype policy] in cpp/ops/dtype_policy.h): a
dtype CPU lacks and CUDA supports is computed in a wider dtype; a dtype CPU
supports and CUDA refuses raises CUDA's NotImplementedError at the call;
OPENREG_DTYPES=cpu gives CPU's set instead. The sweep over op_db is in
test_opinfo_parity.py (--cuda-dtypes), the table's freshness in
test_dtype_table.py."""

import time

import pytest
import torch
import torch.nn.functional as F

from _openreg_util import clean_env, script

DEV = "openreg"


def _ints(*shape, dtype=torch.int64):
    return torch.randint(0, 5, shape, dtype=dtype).to(DEV)


# Calls CUDA refuses, each with the aten op its message names.
REFUSED = {
    "mm": (lambda: _ints(3, 4) @ _ints(4, 2), "mm", "Long"),
    "matmul_batched": (lambda: _ints(2, 3, 4, dtype=torch.int32) @ _ints(2, 4, 2, dtype=torch.int32), "bmm", "Int"),
    "linear": (lambda: F.linear(_ints(3, 4, dtype=torch.int8), _ints(2, 4, dtype=torch.int8)), "mm", "Char"),
    "addmm": (lambda: torch.addmm(_ints(2), _ints(3, 4), _ints(4, 2)), "addmm", "Long"),
    "dot": (lambda: torch.dot(_ints(4, dtype=torch.uint8), _ints(4, dtype=torch.uint8)), "dot", "Byte"),
    "conv2d": (lambda: F.conv2d(_ints(1, 2, 5, 5), _ints(3, 2, 3, 3)), "convolution", "Long"),
    "avg_pool2d": (lambda: F.avg_pool2d(_ints(1, 1, 4, 4), 2), "avg_pool2d", "Long"),
    "max_pool2d": (lambda: F.max_pool2d(_ints(1, 1, 4, 4, dtype=torch.int32), 2), "max_pool2d_with_indices", "Int"),
    "histogram": (lambda: torch.histogram(torch.rand(10).to(DEV), 4), "histogram", "Float"),
    "histc_half": (lambda: torch.histc(torch.rand(10).half().to(DEV), 4), "histc", "Half"),
    "interpolate_uint8": (
        lambda: F.interpolate(_ints(1, 1, 4, 4, dtype=torch.uint8), scale_factor=2, mode="bilinear"),
        "upsample_bilinear2d",
        "Byte",
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_cpu_only_dtypes_are_refused_as_on_cuda(name):
    call, op, dtype = REFUSED[name]
    with pytest.raises(NotImplementedError, match=rf"^\"{op}_openreg\" not implemented for '{dtype}'$"):
        call()
    torch.openreg.synchronize()  # nothing was left behind to fail later


def test_a_refusal_comes_at_the_call_before_any_work_is_queued():
    a, b = _ints(64, 64), _ints(64, 64)
    out = torch.zeros(64, 64, dtype=torch.int64, device=DEV)
    before = (a.cpu(), b.cpu())
    torch.openreg._sleep(300)  # the stream is busy: a queued call would return at once too
    start = time.monotonic()
    with pytest.raises(NotImplementedError, match="not implemented for 'Long'"):
        torch.mm(a, b, out=out)
    with pytest.raises(NotImplementedError, match="not implemented for 'Long'"):
        out.addmm_(a, b)
    assert time.monotonic() - start < 0.2, "the refusal waited for the stream"
    assert not torch.openreg.current_stream().query(), "the stream should still be busy with the sleep only"
    torch.openreg.synchronize()
    assert torch.equal(a.cpu(), before[0]) and torch.equal(b.cpu(), before[1])
    assert torch.equal(out.cpu(), torch.zeros(64, 64, dtype=torch.int64))


def test_integer_histc_counts_as_cuda_does():
    # A mixture-of-experts router counts tokens per expert with histc on
    # integer expert indices.
    experts = torch.randint(0, 8, (256,), dtype=torch.int32)
    for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        got = torch.histc(experts.to(dtype).to(DEV), bins=8, min=0, max=7)
        want = torch.histc(experts.double(), bins=8, min=0, max=7).to(dtype)
        assert got.dtype == dtype and got.device.type == DEV
        assert torch.equal(got.cpu(), want)


def test_complex32_computes_through_complex64():
    x = torch.randn(16, dtype=torch.complex64) / 4
    for op in (torch.exp, torch.sin, torch.tanh, torch.sqrt, lambda t: t.pow(2), torch.sum):
        got = op(x.to(torch.complex32).to(DEV))
        want = op(x.to(torch.complex32).to(torch.complex64)).to(torch.complex32)
        assert got.dtype == torch.complex32
        torch.testing.assert_close(got.cpu().to(torch.complex64), want.to(torch.complex64))
    # A real result of a complex32 op is float16, as on CUDA.
    assert torch.angle(x.to(torch.complex32).to(DEV)).dtype == torch.float16


def test_out_and_in_place_forms_write_their_argument():
    x = (torch.randn(8, dtype=torch.complex64) / 4).to(torch.complex32)
    out = torch.empty(8, dtype=torch.complex32, device=DEV)
    result = torch.exp(x.to(DEV), out=out)
    assert result is out
    rounded = lambda t: t.to(torch.complex32).to(torch.complex64)  # noqa: E731
    assert torch.equal(out.cpu().to(torch.complex64), rounded(torch.exp(x.to(torch.complex64))))
    y = x.to(DEV)
    assert y.sin_() is y
    assert torch.equal(y.cpu().to(torch.complex64), rounded(torch.sin(x.to(torch.complex64))))
    flags = torch.tensor([True, False, True], device=DEV)
    assert torch.equal(flags.abs().cpu(), torch.tensor([True, False, True]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_pooling_and_losses_train_as_on_cuda(dtype):
    x = torch.randn(1, 2, 4, 6, 6).to(dtype)
    dev = x.to(DEV).requires_grad_()
    F.avg_pool3d(dev, 2).sum().backward()
    ref = x.float().requires_grad_()
    F.avg_pool3d(ref, 2).sum().backward()
    assert dev.grad.dtype == dtype
    torch.testing.assert_close(dev.grad.cpu(), ref.grad.to(dtype))
    scores, target = torch.randn(4, 5).to(dtype), torch.tensor([0, 3, 1, 4])
    loss = F.multi_margin_loss(scores.to(DEV), target.to(DEV))
    assert loss.dtype == dtype
    torch.testing.assert_close(loss.cpu(), F.multi_margin_loss(scores.float(), target).to(dtype))


def test_float8_scatter():
    src = torch.randn(6).to(torch.float8_e4m3fn)
    index = torch.tensor([5, 4, 3, 2, 1, 0])
    got = torch.zeros(6, dtype=torch.float8_e4m3fn, device=DEV).scatter(0, index.to(DEV), src.to(DEV))
    want = torch.zeros(6).scatter(0, index, src.float()).to(torch.float8_e4m3fn)
    assert got.dtype == torch.float8_e4m3fn
    assert torch.equal(got.cpu().float(), want.float())


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "queued"])
def test_bool_scatter_reduce_is_refused_only_where_cuda_refuses_it(busy):
    """Note [scatter_reduce dtypes]: CUDA computes a bool sum and refuses
    prod, amax, amin and mean with cuda_scatter_gather_base_kernel_func's
    error, in every form, at the call, unless the index is empty."""
    self = torch.tensor([True, False, True, False])
    index = torch.tensor([0, 1, 0, 1])
    src = torch.tensor([False, True, True, True])
    d_self, d_index, d_src = self.to(DEV), index.to(DEV), src.to(DEV)
    if busy:
        torch.openreg._sleep(1)
    for include_self in (True, False):
        want = self.scatter_reduce(0, index, src, "sum", include_self=include_self)
        got = d_self.scatter_reduce(0, d_index, d_src, "sum", include_self=include_self)
        torch.testing.assert_close(got.cpu(), want)
    message = "\"openreg_scatter_gather_base_kernel_func\" not implemented for 'Bool'"
    for reduce in ("prod", "amax", "amin", "mean"):
        with pytest.raises(NotImplementedError, match=message):
            d_self.scatter_reduce(0, d_index, d_src, reduce)
        with pytest.raises(NotImplementedError, match=message):
            d_self.scatter_reduce(0, d_index, d_src, reduce, include_self=False)
        with pytest.raises(NotImplementedError, match=message):
            d_self.clone().scatter_reduce_(0, d_index, d_src, reduce)
        with pytest.raises(NotImplementedError, match=message):
            torch.scatter_reduce(d_self, 0, d_index, d_src, reduce, out=torch.empty_like(d_self))
        empty = torch.empty(0, dtype=torch.int64)
        if reduce != "mean":  # an empty index reaches no kernel: self comes back
            got = d_self.scatter_reduce(0, empty.to(DEV), d_src, reduce)
            torch.testing.assert_close(got.cpu(), self.scatter_reduce(0, empty, src, reduce))
    torch.openreg.synchronize()
    assert torch.equal(d_self.cpu(), self)
    ints = torch.tensor([3, 1, 2, 5])
    torch.testing.assert_close(
        ints.to(DEV).scatter_reduce(0, d_index, ints.to(DEV), "prod").cpu(), ints.scatter_reduce(0, index, ints, "prod"))


def test_scatter_reduce_refuses_the_dtypes_cuda_kernel_lacks_for_each_reduction():
    """Note [scatter_reduce dtypes]: CUDA's sum takes complex and refuses
    uint16, its prod/amax/amin/mean refuse complex and the unsigned dtypes
    (CPU computes complex prod/mean and unsigned sum/prod); under
    deterministic algorithms CUDA's sum and mean run no scatter kernel."""
    index = torch.tensor([0, 1, 0, 1])
    z = torch.tensor([1 + 2j, 3 - 1j, 2j, -1 + 0j])
    torch.testing.assert_close(
        z.to(DEV).scatter_reduce(0, index.to(DEV), z.to(DEV), "sum").cpu(), z.scatter_reduce(0, index, z, "sum"))
    for reduce in ("prod", "mean"):
        z.scatter_reduce(0, index, z, reduce)  # CPU computes it
        with pytest.raises(NotImplementedError, match="not implemented for 'ComplexFloat'"):
            z.to(DEV).scatter_reduce(0, index.to(DEV), z.to(DEV), reduce)
    u = torch.tensor([3, 1, 2, 5], dtype=torch.uint16)
    message = "\"openreg_scatter_gather_base_kernel_func\" not implemented for 'UInt16'"
    for reduce in ("sum", "prod"):
        u.scatter_reduce(0, index, u, reduce)  # CPU computes it
        with pytest.raises(NotImplementedError, match=message):
            u.to(DEV).scatter_reduce(0, index.to(DEV), u.to(DEV), reduce)
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        got = z.to(DEV).scatter_reduce(0, index.to(DEV), z.to(DEV), "mean").cpu()
        torch.testing.assert_close(got, z.scatter_reduce(0, index, z, "mean"))
        # CUDA's prod alerts before its dtype dispatch refuses (Note
        # [Deterministic alerts] in cpp/ops/deterministic_alerts.cpp); under
        # warn_only the refusal follows the warning.
        with pytest.raises(RuntimeError, match="^scatter_reduce_openreg_prod_ does not have a deterministic"):
            z.to(DEV).scatter_reduce(0, index.to(DEV), z.to(DEV), "prod")
        torch.use_deterministic_algorithms(True, warn_only=True)
        with pytest.warns(UserWarning, match="^scatter_reduce_openreg_prod_ does not have a deterministic"):
            with pytest.raises(NotImplementedError, match="not implemented for 'ComplexFloat'"):
                z.to(DEV).scatter_reduce(0, index.to(DEV), z.to(DEV), "prod")
    finally:
        torch.use_deterministic_algorithms(deterministic)


def test_two_float8_e5m2_matrices_are_refused_as_cublaslt_refuses_them():
    """Note [Float8 matmul dtypes]: e5m2 beside e4m3fn computes, two e5m2
    raise CUDA's ValueError, for _scaled_mm and _scaled_mm_v2."""
    scale = torch.tensor(1.0)
    e4m3 = torch.randn(16, 32).to(torch.float8_e4m3fn)
    e5m2 = torch.randn(16, 32).to(torch.float8_e5m2)
    want = torch._scaled_mm(e5m2, e4m3.t(), scale, scale, out_dtype=torch.bfloat16)
    got = torch._scaled_mm(e5m2.to(DEV), e4m3.t().to(DEV), scale.to(DEV), scale.to(DEV), out_dtype=torch.bfloat16)
    torch.testing.assert_close(got.cpu(), want)
    with pytest.raises(ValueError, match="Multiplication of two Float8_e5m2 matrices is not supported"):
        torch._scaled_mm(e5m2.to(DEV), e5m2.t().to(DEV), scale.to(DEV), scale.to(DEV), out_dtype=torch.bfloat16)
    from torch.nn.functional import ScalingType, SwizzleType

    def scaled_mm_v2(a, b):
        scales = [scale.reshape(1).to(a.device)]
        return torch._scaled_mm_v2(
            a, b, scales, [ScalingType.TensorWise], [SwizzleType.NO_SWIZZLE],
            scales, [ScalingType.TensorWise], [SwizzleType.NO_SWIZZLE], None, torch.bfloat16)

    torch.testing.assert_close(scaled_mm_v2(e5m2.to(DEV), e4m3.t().to(DEV)).cpu(), scaled_mm_v2(e5m2, e4m3.t()))
    with pytest.raises(ValueError, match="Multiplication of two Float8_e5m2 matrices is not supported"):
        scaled_mm_v2(e5m2.to(DEV), e5m2.t().to(DEV))


def test_capability_is_the_gpu_whose_dtypes_openreg_follows():
    from torch_openreg._op_db import GPU_CAPABILITY

    assert torch.openreg.get_device_capability() == GPU_CAPABILITY
    assert torch.openreg.get_arch_list() == [f"openreg_{GPU_CAPABILITY[0]}{GPU_CAPABILITY[1]}"]
    assert torch.openreg.options()["OPENREG_DTYPES"]["value"] == "cuda"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_lowers_only_to_dtypes_the_policy_accepts(dtype):
    model = torch.nn.Sequential(
        torch.nn.Conv2d(2, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 8), torch.nn.ReLU()
    ).to(DEV)
    attention = torch.nn.MultiheadAttention(8, 2, batch_first=True).to(DEV)
    x = torch.randn(3, 2, 6, 6, device=DEV)
    with torch.autocast(DEV, dtype=dtype):
        h = model(x)
        out, _ = attention(h[:, None], h[:, None], h[:, None])
        assert h.dtype == dtype and out.dtype == dtype
        q = torch.randn(2, 3, 8, device=DEV)
        assert torch.bmm(q, q.transpose(1, 2)).dtype == dtype
    out.float().sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_compiled_int_matmul_is_refused_as_eager_is():
    compiled = torch.compile(lambda a, b: a @ b + 1, backend="openreg")
    with pytest.raises(Exception, match="mm_openreg\" not implemented for 'Long'"):
        compiled(_ints(4, 4), _ints(4, 4))
    counted = torch.compile(lambda e: torch.histc(e, bins=4, min=0, max=3), backend="openreg")
    experts = torch.tensor([0, 1, 1, 3, 3, 3], dtype=torch.int32)
    assert torch.equal(counted(experts.to(DEV)).cpu(), torch.tensor([1, 2, 0, 3], dtype=torch.int32))


CPU_SET = script(
    "dtype_policy_cpu",
    """
    import torch, torch_openreg
    a = torch.arange(6).reshape(2, 3).to("openreg")
    RESULT["mm"] = (a @ a.T).cpu().tolist()
    RESULT["histc"] = error_of(lambda: torch.histc(torch.tensor([1, 2], device="openreg"), bins=2))
    RESULT["capability"] = list(torch.openreg.get_device_capability())
    RESULT["option"] = torch.openreg.options()["OPENREG_DTYPES"]["value"]
    done(RESULT)
    """,
    env=clean_env(OPENREG_DTYPES="cpu"),
)


def test_cpu_option_gives_the_cpu_kernels_own_set():
    data = CPU_SET.result().check_ok()
    assert data["mm"] == [[5, 14], [14, 50]]
    assert data["histc"] is not None and "not implemented for 'Long'" in data["histc"]
    assert "_openreg" not in data["histc"]  # CPU's own refusal
    assert data["capability"] == [1, 0]
    assert data["option"] == "cpu"
