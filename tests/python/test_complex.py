"""Complex tensors: lazily conjugated or negated tensors are resolved where
openreg copies (Note [Copies]), and views that change the element type keep
their own dtype and geometry (Note [Meta results])."""

import pytest
import torch

DEV = "openreg:0"


@pytest.fixture
def z():
    return torch.randn(4, 3, dtype=torch.complex64, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(lambda t: t.conj().clone(), id="conj-clone"),
        pytest.param(lambda t: t.conj().cpu(), id="conj-to-host"),
        pytest.param(lambda t: -t.conj(), id="neg-conj"),
        pytest.param(lambda t: t.mH.contiguous(), id="mH"),
        pytest.param(lambda t: torch.fft.ifft(t), id="fft.ifft"),
        pytest.param(lambda t: torch.linalg.svdvals(t), id="svdvals"),
        pytest.param(lambda t: torch.isinf(t), id="isinf"),
        pytest.param(lambda t: torch.isfinite(t), id="isfinite"),
        pytest.param(lambda t: torch.view_as_real(t), id="view_as_real"),
        pytest.param(lambda t: t.real, id="real"),
        pytest.param(lambda t: t.imag, id="imag"),
        pytest.param(lambda t: torch.view_as_complex(torch.view_as_real(t).contiguous()), id="view_as_complex"),
        pytest.param(lambda t: t.conj().resolve_conj() * 2, id="resolve_conj"),
        # The CPU kernel reads a lazily conjugated operand itself (cpu_view
        # carries the bits).
        pytest.param(lambda t: t @ t.mH, id="matmul-mH"),
        pytest.param(lambda t: torch.mm(t.mT, t.conj()), id="mm-conj"),
        pytest.param(lambda t: torch.cov(t), id="cov"),
        pytest.param(lambda t: torch.corrcoef(t), id="corrcoef"),
    ],
)
def test_complex_ops_match_cpu(z, op):
    got = op(z.to(DEV))
    want = op(z)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want.cpu() if want.device.type != "cpu" else want)


def test_dtype_changing_views_alias_the_device_memory(z):
    d = z.to(DEV)
    real = torch.view_as_real(d)
    assert real.dtype == torch.float32 and real.stride() == (6, 2, 1)
    real[0, 0, 0] = 100.0
    d.imag[1, 1] = -5.0
    want = z.clone()
    want[0, 0] = complex(100.0, z[0, 0].imag.item())
    want[1, 1] = complex(z[1, 1].real.item(), -5.0)
    torch.testing.assert_close(d.cpu(), want)


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [True, False])
def test_lu_solve_conjugates_its_result_by_the_bit_as_on_cpu(left, adjoint):
    # left=False solves A^H X^H = B^H and hands back X by flipping the out=
    # tensor's conjugate bit inside the CPU kernel.
    g = torch.Generator().manual_seed(1)
    a = torch.randn(3, 3, dtype=torch.complex64, generator=g)
    b = torch.randn(3, 4, dtype=torch.complex64, generator=g)
    b = b if left else b.mT.contiguous()
    lu, pivots = torch.linalg.lu_factor(a)
    want = torch.linalg.lu_solve(lu, pivots, b, left=left, adjoint=adjoint)
    got = torch.linalg.lu_solve(lu.to(DEV), pivots.to(DEV), b.to(DEV), left=left, adjoint=adjoint)
    torch.testing.assert_close(got.cpu(), want)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_random_fills_draw_both_parts(dtype):
    # As PyTorch: the real view is filled; a normal's variance is split
    # evenly between the real and imaginary parts.
    torch.openreg.manual_seed(3)
    z = torch.randn(20000, dtype=dtype, device=DEV).cpu()
    assert z.dtype == dtype
    for part in (z.real, z.imag):
        assert abs(part.mean().item()) < 0.03
        assert abs(part.var().item() - 0.5) < 0.03
    torch.openreg.manual_seed(3)
    assert torch.equal(torch.randn(20000, dtype=dtype, device=DEV).cpu(), z)
    u = torch.rand(1000, dtype=dtype, device=DEV).cpu()
    assert ((u.real >= 0) & (u.real < 1) & (u.imag >= 0) & (u.imag < 1)).all()
    assert u.real.std() > 0.2 and u.imag.std() > 0.2


def nan_parts():
    x = torch.randn(3, 4, dtype=torch.complex64, generator=torch.Generator().manual_seed(7))
    x[0, 1] = complex(float("nan"), 1.0)
    x[2, 2] = complex(1.0, float("nan"))
    return x


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "queued"])
@pytest.mark.parametrize(
    "kwargs", [{}, {"dim": 1}, {"dim": 0, "keepdim": True}, {"dim": 1, "dtype": torch.complex128}],
    ids=["all", "dim", "keepdim", "dtype"])
def test_complex_nansum_and_nanmean_leave_out_an_element_with_a_nan_part(kwargs, busy):
    """As CUDA's kernel (Note [Complex nansum]); CPU refuses complex nansum."""
    x = nan_parts()
    kept = torch.where(x.isnan(), 0, x)
    want_sum = kept.sum(**kwargs)
    counted = {k: v for k, v in kwargs.items() if k != "dtype"}
    want_mean = want_sum / (~x.isnan()).sum(**counted)
    d = x.to(DEV)
    if busy:
        torch.openreg._sleep(1)
    got_sum, got_mean = torch.nansum(d, **kwargs), torch.nanmean(d, **kwargs)
    assert got_sum.dtype == want_sum.dtype and got_mean.dtype == want_mean.dtype
    torch.testing.assert_close(got_sum.cpu(), want_sum)
    torch.testing.assert_close(got_mean.cpu(), want_mean)


def test_complex32_nansum_is_summed_wider_and_rounded_once():
    x = nan_parts()
    got = torch.nansum(x.to(torch.complex32).to(DEV), dim=1)
    want = torch.where(x.isnan(), 0, x).to(torch.complex32).to(torch.complex64).sum(1).to(torch.complex32)
    assert got.dtype == torch.complex32
    torch.testing.assert_close(got.cpu().to(torch.complex64), want.to(torch.complex64))


def test_complex_nansum_out_and_real_nansum():
    x = nan_parts()
    out = torch.empty(0, dtype=torch.complex64, device=DEV)
    assert torch.nansum(x.to(DEV), 0, out=out) is out
    torch.testing.assert_close(out.cpu(), torch.where(x.isnan(), 0, x).sum(0))
    real = torch.tensor([1.0, float("nan"), 2.0])
    torch.testing.assert_close(torch.nansum(real.to(DEV)).cpu(), torch.nansum(real))


def test_complex_nansum_out_computes_in_the_out_dtype_and_checks_dtype():
    """nansum_out sums in `dtype`, else in the out= tensor's dtype, and
    refuses a `dtype` other than the out= tensor's (get_dtype_from_result,
    make_reduction), as for a real input."""
    x = nan_parts().to(torch.complex128) * 1e8 + 1
    x[0, 0] = 1e-8
    kept = torch.where(x.isnan(), 0, x)
    out = torch.empty(0, dtype=torch.complex128, device=DEV)
    torch.nansum(x.to(torch.complex64).to(DEV), out=out)
    want = kept.to(torch.complex64).to(torch.complex128).sum()
    assert out.dtype == torch.complex128
    torch.testing.assert_close(out.cpu(), want, rtol=0, atol=0)
    half = torch.empty(0, dtype=torch.complex32, device=DEV)
    torch.nansum(x.to(torch.complex64).to(DEV), 1, out=half)
    assert half.dtype == torch.complex32
    torch.testing.assert_close(
        half.cpu().to(torch.complex64), kept.to(torch.complex64).sum(1).to(torch.complex32).to(torch.complex64))
    message = "nansum: provided dtype must match dtype of result. Got ComplexFloat and ComplexDouble."
    with pytest.raises(RuntimeError, match=message):
        torch.nansum(x.to(DEV), dtype=torch.complex128, out=torch.empty(0, dtype=torch.complex64, device=DEV))
    real = torch.tensor([1.0, float("nan"), 2.0], device=DEV)
    with pytest.raises(RuntimeError, match="nansum: provided dtype must match dtype of result. Got Float and Double."):
        torch.nansum(real, dtype=torch.float64, out=torch.empty(0, device=DEV))
