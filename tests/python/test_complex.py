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
