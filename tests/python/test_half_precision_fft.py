"""FFTs in float16, complex32 and bfloat16 on openreg, as cuFFT computes them
(Note [Half-precision FFTs] in cpp/ops/half_precision_fft.cpp): computed in
float32 / complex64 and rounded once to the dtype CUDA returns; bfloat16
promoted to float32 by the torch.fft functions, as on CUDA; signal sizes
that are not powers of two refused at the call with cuFFT's error."""

import subprocess
import sys

import pytest
import torch

from _openreg_util import clean_env

DEV = "openreg"
CUFFT_SIZES = "cuFFT only supports dimensions whose sizes are powers of two when computing in"

pytestmark = pytest.mark.usefixtures("one_cpu_thread")

# (function, takes a real input only)
TRANSFORMS = [
    ("fft", False), ("ifft", False), ("rfft", True), ("irfft", False), ("hfft", False), ("ihfft", True),
    ("fft2", False), ("ifft2", False), ("rfft2", True), ("irfft2", False), ("hfft2", False), ("ihfft2", True),
    ("fftn", False), ("ifftn", False), ("rfftn", True), ("irfftn", False), ("hfftn", False), ("ihfftn", True),
]
TRANSFORM_NAMES = [name for name, _ in TRANSFORMS]
C2R = ("irfft", "hfft", "irfft2", "hfft2", "irfftn", "hfftn")


def wide(dtype):
    return torch.complex64 if dtype.is_complex else torch.float32


def rounded(t, narrow):
    """A float32 / complex64 result in `narrow`'s precision (its complex or
    real kin)."""
    real_narrow = narrow.to_real() if narrow.is_complex else narrow
    return t.to(real_narrow.to_complex() if t.is_complex() else real_narrow)


def signal(name, dtype):
    """A (4, 8) input in `dtype`; a c2r transform gets n / s making its output
    sizes powers of two (the default, 2 * (5 - 1) = 8, is one)."""
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    if dtype.is_complex:
        x = torch.complex(x, torch.randn(4, 8, generator=torch.Generator().manual_seed(2)))
    if name in C2R:
        x = x[..., :5]
    return x.to(dtype)


@pytest.mark.parametrize("name", TRANSFORM_NAMES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.complex32], ids=["float16", "complex32"])
def test_half_precision_equals_the_wider_transform_rounded_once(name, dtype):
    fn = getattr(torch.fft, name)
    x = signal(name, dtype)
    if dtype.is_complex and dict(TRANSFORMS)[name]:
        with pytest.raises(Exception, match="ComplexHalf"):  # the composite's error names the caller's dtype
            fn(x.to(DEV))
        return
    got = fn(x.to(DEV))
    want = rounded(fn(x.to(wide(dtype))), dtype)
    assert got.device.type == DEV and got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


@pytest.mark.parametrize("name", TRANSFORM_NAMES)
def test_bfloat16_is_promoted_to_float32_as_on_cuda(name):
    fn = getattr(torch.fft, name)
    x = signal(name, torch.bfloat16)
    got = fn(x.to(DEV))
    want = fn(x.float())
    # CUDA's (and meta's) promotion: the results are float32 / complex64.
    assert got.dtype == want.dtype == fn(x.to("meta")).dtype
    torch.testing.assert_close(got.cpu(), want)


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "queued"])
@pytest.mark.parametrize(
    "call, sizes",
    [
        (lambda x: torch.fft.fft(x), "[6]"),
        (lambda x: torch.fft.rfft(x, n=12), "[12]"),
        (lambda x: torch.fft.irfft(x[:4]), "[6]"),  # the c2r signal is the output's size
        (lambda x: torch.fft.hfft(x, n=10), "[10]"),
        (lambda x: torch.fft.fft2(x.reshape(2, 3)), "[2, 3]"),
        (lambda x: torch.fft.fft(x.to(torch.complex32)), "[6]"),
    ],
    ids=["fft", "rfft-n", "irfft", "hfft-n", "fft2", "complex32"],
)
def test_sizes_that_are_not_powers_of_two_are_refused_at_the_call(call, sizes, busy):
    x = torch.randn(6, dtype=torch.float16).to(DEV)
    if busy:
        torch.openreg._sleep(1)
    with pytest.raises(RuntimeError, match=rf"{CUFFT_SIZES} half precision, but got a signal size of\{sizes[:-1]}\]"):
        call(x)
    torch.openreg.synchronize()  # nothing was left queued to fail later


@pytest.mark.parametrize("name", TRANSFORM_NAMES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.complex32], ids=["float16", "complex32"])
def test_every_transform_refuses_what_cufft_refuses(name, dtype):
    """As PyTorch's test_fft_half_and_chalf_not_power_of_two_error asks of
    CUDA: a 13 x 13 input, whole and cut to 12 (n= or s=)."""
    if dtype.is_complex and dict(TRANSFORMS)[name]:
        pytest.skip("a real-input transform refuses complex32 by its dtype")
    fn = getattr(torch.fft, name)
    x = torch.randn(13, 13).to(dtype).to(DEV)
    cut = {"n": 12} if name[-1] not in "2n" else {"s": (12, 12)}
    for kwargs in ({}, cut):
        with pytest.raises(RuntimeError, match=CUFFT_SIZES):
            fn(x, **kwargs)


def test_float32_and_bfloat16_transforms_take_any_size():
    x = torch.randn(6)
    torch.testing.assert_close(torch.fft.fft(x.to(DEV)).cpu(), torch.fft.fft(x))
    torch.testing.assert_close(torch.fft.fft(x.bfloat16().to(DEV)).cpu(), torch.fft.fft(x.bfloat16().float()))


def test_gradients_flow_with_cuda_dtypes():
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(3)).half()
    weight = torch.randn(4, 9, dtype=torch.complex64, generator=torch.Generator().manual_seed(4))

    def spectral_filter(t, w):
        return torch.fft.irfft(torch.fft.rfft(t) * w, n=16)

    leaf = x.to(DEV).requires_grad_()
    w = weight.to(torch.complex32).to(DEV).requires_grad_()
    out = spectral_filter(leaf, w)
    assert out.dtype == torch.float16
    out.square().sum().backward()
    assert leaf.grad.dtype == torch.float16 and w.grad.dtype == torch.complex32

    ref_leaf = x.float().requires_grad_()
    ref_w = weight.to(torch.complex32).to(torch.complex64).requires_grad_()
    ref = spectral_filter(ref_leaf, ref_w)
    ref.square().sum().backward()
    torch.testing.assert_close(out.detach().cpu().float(), ref.detach(), rtol=2e-3, atol=2e-2)
    torch.testing.assert_close(leaf.grad.cpu().float(), ref_leaf.grad, rtol=2e-3, atol=5e-2)
    torch.testing.assert_close(w.grad.cpu().to(torch.complex64), ref_w.grad, rtol=2e-3, atol=5e-2)


def test_bfloat16_gradient_is_bfloat16():
    x = torch.randn(8).bfloat16().to(DEV).requires_grad_()
    torch.fft.rfft(x).abs().sum().backward()
    assert x.grad.dtype == torch.bfloat16 and x.grad.device.type == DEV


def test_out_forms():
    x = torch.randn(8)
    for dtype in (torch.complex32, torch.complex64):
        out = torch.empty(0, dtype=dtype, device=DEV)
        result = torch.fft.rfft(x.half().to(DEV), out=out)
        assert result is out and out.shape == (5,)
        torch.testing.assert_close(out.cpu(), torch.fft.rfft(x.half().float()).to(torch.complex32).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_stft_computes_frames_wider_and_rounds_once(dtype):
    x = torch.randn(2, 100, generator=torch.Generator().manual_seed(5)).to(dtype)
    window = torch.hann_window(16).to(dtype)
    got = torch.stft(x.to(DEV), 16, hop_length=4, window=window.to(DEV), return_complex=True)
    want = rounded(torch.stft(x.float(), 16, hop_length=4, window=window.float(), return_complex=True), dtype)
    assert got.dtype == want.dtype  # complex32, or bcomplex32 as cuFFT's bfloat16 transforms return
    torch.testing.assert_close(
        torch.view_as_real(got.cpu().to(torch.complex64)), torch.view_as_real(want.to(torch.complex64)), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match=CUFFT_SIZES):
        torch.stft(x.to(DEV), 10, window=torch.ones(10, dtype=dtype, device=DEV), return_complex=True)


def test_istft_inverts_half_precision_stft():
    x = torch.randn(128, generator=torch.Generator().manual_seed(6)).half()
    window = torch.hann_window(16).half().to(DEV)
    spectrum = torch.stft(x.to(DEV), 16, hop_length=4, window=window, return_complex=True)
    back = torch.istft(spectrum, 16, hop_length=4, window=window, length=128)
    assert back.dtype == torch.float16
    torch.testing.assert_close(back.cpu(), x, rtol=2e-3, atol=2e-3)


def test_compiled_half_precision_transform_equals_eager():
    x = torch.randn(4, 16).half().to(DEV)

    def spectrum(t):
        return torch.fft.rfft(t).abs()

    torch.testing.assert_close(torch.compile(spectrum, backend="openreg")(x).cpu(), spectrum(x).cpu())


def test_cpu_dtype_policy_refuses_half_as_the_cpu_does():
    script = (
        "import torch, torch_openreg\n"
        "try:\n"
        "    torch.fft.rfft(torch.randn(8).half().to('openreg'))\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
        env=clean_env(OPENREG_DTYPES="cpu"))
    assert "Unsupported dtype Half" in run.stdout, run.stdout + run.stderr
