"""Reductions that do not depend on the input's layout nor on how openreg
splits them: partials accumulate in the dtype CUDA accumulates in (Note
[Reduced-precision nansum] in cpp/ops/nansum.cpp, Note [Split kernels])."""

import math

import pytest
import torch
from torch.testing import make_tensor

from _openreg_util import busy

LAYOUTS = {
    "transposed": lambda t: t.transpose(0, 2),
    "sliced": lambda t: t[:, ::2],
    "permuted": lambda t: t.permute(2, 0, 1),
}
REDUCTIONS = {
    "nansum": lambda t, **kw: torch.nansum(t, **kw),
    "nanmean": lambda t, **kw: torch.nanmean(t, **kw),
}
DIMS = [{}, {"dim": 0}, {"dim": (0, 2), "keepdim": True}]


@pytest.mark.parametrize("queued", [False, True], ids=["idle", "busy"])
@pytest.mark.parametrize("kwargs", DIMS, ids=["all", "dim0", "dims02-keepdim"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reduced_precision_nan_reductions_do_not_depend_on_layout(dtype, reduction, layout, kwargs, queued):
    """As CUDA: summed in float32 and rounded once, so a strided input gives
    the bits of its contiguous copy. (CPU's kernel adds a strided float16
    input in float16: a 7x9x5 slice summed to 9.1953 where its contiguous
    copy gives 9.1797.)"""
    torch.manual_seed(0)
    values = torch.randn(7, 9, 5, dtype=dtype)
    values[1, 2, 3] = math.nan
    strided = LAYOUTS[layout](values.to("openreg"))
    assert not strided.is_contiguous()
    fn = REDUCTIONS[reduction]
    if queued:
        busy(torch.openreg.current_stream(), 20)
    got = fn(strided, **kwargs).cpu()
    from_contiguous = fn(strided.contiguous(), **kwargs).cpu()
    # nanmean is nansum's result over the count of numbers, divided in the
    # dtype (ATen's composite, on CUDA too).
    host = LAYOUTS[layout](values)
    wide_sum = torch.nansum(host.float(), **kwargs).to(dtype)
    cuda_computes = wide_sum if reduction == "nansum" else wide_sum.div((~host.isnan()).sum(**kwargs))
    assert got.dtype == dtype
    assert torch.equal(got, from_contiguous)
    assert torch.equal(got, cuda_computes)


def test_reduced_precision_nansum_out_and_dtype():
    x = torch.randn(6, 10, dtype=torch.float16, device="openreg").t()
    out = torch.empty(0, dtype=torch.float16, device="openreg")
    torch.nansum(x, 0, out=out)
    assert torch.equal(out.cpu(), x.cpu().float().nansum(0).half())
    assert torch.nansum(x, dtype=torch.float32).dtype == torch.float32
    torch.testing.assert_close(torch.nansum(x, dtype=torch.float32).cpu(), x.cpu().float().nansum())
    with pytest.raises(RuntimeError, match="nansum: provided dtype must match dtype of result"):
        torch.nansum(x, 0, dtype=torch.float32, out=out)


@pytest.mark.parametrize("extremal", [0.0, 1.0, math.nan, math.inf, -math.inf])
def test_complex_sums_of_extremal_values_equal_cpu(extremal, one_cpu_thread):
    """As PyTorch's test_ref_extremal_values builds them: openreg's sum of the
    same values is CPU's, bit for bit, inline and behind queued work. (Where
    it differed from NumPy's reference by a rounding, so did CPU's on the
    same values: the inputs differed, drawn from different generators.)"""
    torch.manual_seed(0)
    t = make_tensor((5,), dtype=torch.complex64, device="cpu", exclude_zero=True)
    t[2] = extremal
    on_device = t.to("openreg")
    for queued in (False, True):
        if queued:
            busy(torch.openreg.current_stream(), 20)
        for got, want in ((on_device.sum(), t.sum()), (on_device.sum(0), t.sum(0)), (on_device.mean(), t.mean())):
            assert torch.equal(torch.view_as_real(got.cpu()), torch.view_as_real(want)) or (
                got.cpu().isnan().any() and want.isnan().any()
            )
