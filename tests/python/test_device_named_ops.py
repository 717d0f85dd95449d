"""The ATen ops that refused an openreg tensor by its device while CUDA
computes them (Note [Ops refused by device name] in
cpp/ops/device_named_ops.cpp): each equals CPU where CPU computes it, and
CUDA's formula where only CUDA does, inline and behind queued work."""

import warnings

import pytest
import torch

DEV = "openreg:0"


def generator():
    return torch.Generator().manual_seed(0)


def busy_or_idle(busy):
    """Queues a kernel first when `busy`, so the call waits behind it."""
    if busy:
        torch.openreg._sleep(1)


def raised(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the error itself is compared
        return type(e), str(e).split("\n")[0]
    raise AssertionError("expected an error")


def caught_warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught]


BUSY = pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])


# mode.values: mode_out's device check (aten/src/ATen/native/Sorting.cpp) names
# CPU, CUDA and XPU.


def mode_input():
    return torch.randint(0, 3, (4, 7), generator=generator()).float()


@BUSY
@pytest.mark.parametrize("keepdim", [False, True])
def test_mode_out_equals_cpu(busy, keepdim):
    x = mode_input()
    want = torch.mode(x, 1, keepdim)
    values, indices = torch.empty(0, device=DEV), torch.empty(0, dtype=torch.long, device=DEV)
    busy_or_idle(busy)
    got = torch.mode(x.to(DEV), 1, keepdim, out=(values, indices))
    assert got.values is values and got.indices is indices
    assert torch.equal(values.cpu(), want.values) and torch.equal(indices.cpu(), want.indices)


def test_mode_out_rules_as_cpu():
    """out= as CPU's (= CUDA's) mode_out: a preallocated non-contiguous out
    of the right shape is written in place, one of another shape is resized
    with resize_output's warning, a wrong dtype is refused, a 0-dim input
    resizes without warning."""
    x = mode_input()
    for device in ("cpu", DEV):
        values = torch.empty(4, 2, device=device)[:, 0]
        indices = torch.empty(4, dtype=torch.long, device=device)
        torch.mode(x.to(device), 1, out=(values, indices))
        assert values.stride() == (2,)
        assert torch.equal(values.cpu(), torch.mode(x, 1).values)
    warned = {
        device: caught_warnings(lambda d=device: torch.mode(
            x.to(d), 1, out=(torch.empty(9, device=d), torch.empty(9, dtype=torch.long, device=d))))
        for device in ("cpu", DEV)
    }
    assert warned["cpu"] and warned[DEV] == warned["cpu"]
    refusals = {
        device: raised(lambda d=device: torch.mode(
            x.to(d), 1, out=(torch.empty(0, dtype=torch.double, device=d), torch.empty(0, dtype=torch.long, device=d))))
        for device in ("cpu", DEV)
    }
    assert refusals[DEV] == refusals["cpu"]
    scalar = torch.tensor(2.5)
    values, indices = torch.empty(3, device=DEV), torch.empty(3, dtype=torch.long, device=DEV)
    assert not caught_warnings(lambda: torch.mode(scalar.to(DEV), out=(values, indices)))
    assert values.shape == () and values.item() == 2.5 and indices.item() == 0


# conj_physical_ and kaiser_window: composites calling a DispatchStub.


@BUSY
def test_conj_physical_in_place_equals_cpu(busy):
    z = torch.randn(5, 3, dtype=torch.complex64, generator=generator())
    d = z.to(DEV)
    busy_or_idle(busy)
    assert d.conj_physical_() is d
    assert torch.equal(d.cpu(), z.clone().conj_physical_())


@BUSY
@pytest.mark.parametrize("args", [(7,), (8, False), (9, True, 3.5), (1,), (0,)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kaiser_window_equals_cpu(busy, args, dtype):
    busy_or_idle(busy)
    got = torch.kaiser_window(*args, dtype=dtype, device="openreg:1")
    assert got.device == torch.device("openreg:1") and got.dtype == dtype
    assert torch.equal(got.cpu(), torch.kaiser_window(*args, dtype=dtype))


# Softmax's half-to-float conversion: CUDA's host_softmax computes a Half
# input in float (SoftMax.cu); CPU's kernels refuse it.

def softmax_backward_out(grad, output, dim, input_dtype, out):
    return torch.ops.aten._softmax_backward_data.out(grad, output, dim, input_dtype, grad_input=out)


def log_softmax_backward_out(grad, output, dim, input_dtype, out):
    return torch.ops.aten._log_softmax_backward_data.out(grad, output, dim, input_dtype, out=out)


SOFTMAXES = pytest.mark.parametrize(
    "softmax, backward, backward_out",
    [(torch._softmax, torch._softmax_backward_data, softmax_backward_out),
     (torch._log_softmax, torch._log_softmax_backward_data, log_softmax_backward_out)],
    ids=["softmax", "log_softmax"])


def half_input():
    return torch.randn(4, 6, generator=generator()).half()


@BUSY
@SOFTMAXES
def test_half_to_float_softmax_computes_in_float(busy, softmax, backward, backward_out, one_cpu_thread):
    x = half_input()
    want = softmax(x.float(), 1, False)
    busy_or_idle(busy)
    got = softmax(x.to(DEV), 1, True)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    out = torch.empty(0, device=DEV)
    assert softmax(x.to(DEV), 0, True, out=out) is out
    torch.testing.assert_close(out.cpu(), softmax(x.float(), 0, False), rtol=0, atol=0)


@SOFTMAXES
def test_half_to_float_softmax_refuses_as_cuda(softmax, backward, backward_out):
    x = half_input().to(DEV)
    with pytest.raises(RuntimeError, match="^conversion is supported for Half type only$"):
        softmax(x.float(), 1, True)
    with pytest.raises(RuntimeError, match="Expected out tensor to have dtype float, but got double instead"):
        softmax(x, 1, True, out=torch.empty(0, dtype=torch.double, device=DEV))
    # The meta function's check comes first, as on CUDA and CPU.
    assert raised(lambda: softmax(x, 5, True)) == raised(lambda: softmax(x.cpu().float(), 5, False))


@BUSY
@SOFTMAXES
def test_half_input_backward_rounds_the_float_gradient_once(busy, softmax, backward, backward_out, one_cpu_thread):
    """_softmax_backward_data(float grad, float output, dim, Half): CUDA's
    host_softmax_backward computes in float and writes Half."""
    x = half_input()
    output = softmax(x.float(), 1, False)
    grad = torch.randn(4, 6, generator=generator())
    want = backward(grad, output, 1, torch.float32).half()
    busy_or_idle(busy)
    got = backward(grad.to(DEV), output.to(DEV), 1, torch.half)
    assert got.dtype == torch.half
    assert torch.equal(got.cpu(), want)
    out = torch.empty(0, dtype=torch.half, device=DEV)
    assert backward_out(grad.to(DEV), output.to(DEV), 1, torch.half, out) is out
    assert torch.equal(out.cpu(), want)


@SOFTMAXES
def test_half_to_float_autograd_equals_the_float_computation(softmax, backward, backward_out, one_cpu_thread):
    x = half_input()
    grad = torch.randn(4, 6, generator=generator())
    leaf = x.to(DEV).requires_grad_()
    softmax(leaf, 1, True).backward(grad.to(DEV))
    want = backward(grad, softmax(x.float(), 1, False), 1, torch.float32).half()
    assert leaf.grad.dtype == torch.half
    assert torch.equal(leaf.grad.cpu(), want)


@SOFTMAXES
def test_mismatched_backward_dtypes_refused_as_cuda(softmax, backward, backward_out):
    grad = torch.randn(3, 4, dtype=torch.double, device=DEV)
    output = torch.randn(3, 4, dtype=torch.double, device=DEV)
    with pytest.raises(RuntimeError, match="expected input and grad types to match, or input to be at::Half"):
        backward(grad, output, 1, torch.float32)
    with pytest.raises(RuntimeError, match="Expected out tensor to have dtype c10::Half, but got float instead"):
        backward_out(grad.float(), output.float(), 1, torch.half, torch.empty(0, device=DEV))
    # The meta function's own checks come first.
    assert raised(lambda: backward(grad.float(), output.float(), 7, torch.half)) == raised(
        lambda: backward(grad.cpu().float(), output.cpu().float(), 7, torch.float32))


# LU without pivoting: CUDA factors without row exchanges and returns the
# pivots 1..k (lu_factor in cuda/linalg/BatchLinearAlgebra.cpp); CPU refuses.


def dominant(*shape, dtype=torch.float64):
    """Matrices whose diagonal dominates each column, so CPU's partial
    pivoting exchanges no rows and its LU is the one without pivoting."""
    a = torch.randn(*shape, generator=generator(), dtype=dtype)
    k = min(shape[-2:])
    added = torch.zeros_like(a)
    added.diagonal(dim1=-2, dim2=-1).copy_(a.abs().sum(-2)[..., :k] + 1)
    return a + added


LU_SHAPES = pytest.mark.parametrize(
    "shape, dtype",
    [((5, 5), torch.float64), ((3, 4, 4), torch.float32), ((6, 4), torch.float64), ((4, 6), torch.float64),
     ((2, 3, 3), torch.complex128)],
    ids=["square", "batch-float", "tall", "wide", "complex"])


def pivots_1_to_k(a):
    k = min(a.shape[-2:])
    return torch.arange(1, k + 1, dtype=torch.int32).expand(*a.shape[:-2], k)


@BUSY
@LU_SHAPES
def test_lu_factor_without_pivoting_equals_cpu_when_no_row_moves(busy, shape, dtype):
    a = dominant(*shape, dtype=dtype)
    want_lu, want_pivots, want_info = torch.linalg.lu_factor_ex(a)
    assert torch.equal(want_pivots, pivots_1_to_k(a)), "the reference exchanged rows"
    busy_or_idle(busy)
    lu, pivots, info = torch.linalg.lu_factor_ex(a.to(DEV), pivot=False)
    torch.testing.assert_close(lu.cpu(), want_lu)
    assert lu.stride() == want_lu.stride()
    assert torch.equal(pivots.cpu(), want_pivots) and torch.equal(info.cpu(), want_info)
    lu2, pivots2 = torch.linalg.lu_factor(a.to(DEV), pivot=False)
    torch.testing.assert_close(lu2.cpu(), want_lu)
    assert torch.equal(pivots2.cpu(), want_pivots)


@BUSY
@LU_SHAPES
def test_linalg_lu_without_pivoting_equals_cpu_when_no_row_moves(busy, shape, dtype):
    a = dominant(*shape, dtype=dtype)
    _, want_l, want_u = torch.linalg.lu(a)
    busy_or_idle(busy)
    p, l, u = torch.linalg.lu(a.to(DEV), pivot=False)
    assert p.shape == (0,) and p.dtype == dtype  # linalg_lu's meta function: P is empty
    torch.testing.assert_close(l.cpu(), want_l)
    torch.testing.assert_close(u.cpu(), want_u)
    assert (l.stride(), u.stride()) == (want_l.stride(), want_u.stride())
    torch.testing.assert_close((l @ u).cpu(), a)


def test_lu_without_pivoting_out_forms_equal_cpu():
    a = dominant(3, 5, 5)
    want_lu, want_pivots, want_info = torch.linalg.lu_factor_ex(a)
    outs = (torch.empty(0, dtype=a.dtype, device=DEV), torch.empty(0, dtype=torch.int32, device=DEV),
            torch.empty(0, dtype=torch.int32, device=DEV))
    got = torch.linalg.lu_factor_ex(a.to(DEV), pivot=False, out=outs)
    assert all(g is o for g, o in zip(got, outs))
    torch.testing.assert_close(outs[0].cpu(), want_lu)
    assert outs[0].stride() == want_lu.stride()  # batched column-major, as the meta function plans
    assert torch.equal(outs[1].cpu(), want_pivots) and torch.equal(outs[2].cpu(), want_info)
    _, want_l, want_u = torch.linalg.lu(a)
    plu = tuple(torch.empty(0, dtype=a.dtype, device=DEV) for _ in range(3))
    torch.linalg.lu(a.to(DEV), pivot=False, out=plu)
    assert plu[0].shape == (0,)
    torch.testing.assert_close(plu[1].cpu(), want_l)
    torch.testing.assert_close(plu[2].cpu(), want_u)
    # A wrong out= dtype is refused before anything is written.
    bad = (torch.zeros(2, dtype=torch.float32, device=DEV),) + outs[1:]
    with pytest.raises(RuntimeError, match="Expected out tensor to have dtype double, but got float instead"):
        torch.linalg.lu_factor_ex(a.to(DEV), pivot=False, out=bad)
    assert torch.equal(bad[0].cpu(), torch.zeros(2))
    # A non-empty out of another shape is resized with resize_output's warning.
    small = torch.empty(2, dtype=a.dtype, device=DEV)
    assert caught_warnings(lambda: torch.linalg.lu_factor_ex(a.to(DEV), pivot=False, out=(small,) + outs[1:]))
    torch.testing.assert_close(small.cpu(), want_lu)


def test_lu_without_pivoting_zero_pivot_as_lapack():
    """A zero pivot is left in place and reported (1-based) in info, its
    column not scaled; linalg.lu_factor (check_errors) raises as CPU raises
    for the same info."""
    a = torch.tensor([[0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    lu, pivots, info = torch.linalg.lu_factor_ex(a.to(DEV), pivot=False)
    assert torch.equal(lu.cpu(), torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64))
    assert info.item() == 1 and pivots.tolist() == [1, 2]
    zeros = torch.zeros(2, 2, dtype=torch.float64)
    assert raised(lambda: torch.linalg.lu_factor(zeros.to(DEV), pivot=False)) == raised(
        lambda: torch.linalg.lu_factor(zeros))


def test_torch_lu_without_pivoting():
    a = dominant(2, 4, 4)
    want_lu, want_pivots = torch.linalg.lu_factor(a)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.lu's deprecation
        lu, pivots, info = torch.lu(a.to(DEV), pivot=False, get_infos=True)
    torch.testing.assert_close(lu.cpu(), want_lu)
    assert torch.equal(pivots.cpu(), want_pivots) and not info.cpu().any()


def test_lu_without_pivoting_other_inputs_as_cpu():
    """Inputs CPU handles before its pivot check (no elements) equal CPU;
    inputs it refuses for other reasons are refused the same way."""
    for shape in [(0, 3, 3), (3, 0)]:
        empty = torch.empty(shape, dtype=torch.float64)
        got, want = torch.linalg.lu_factor_ex(empty.to(DEV), pivot=False), torch.linalg.lu_factor_ex(empty, pivot=False)
        assert all(g.shape == w.shape and g.dtype == w.dtype for g, w in zip(got, want))
    vector = torch.ones(3)
    assert raised(lambda: torch.linalg.lu_factor_ex(vector.to(DEV), pivot=False)) == raised(
        lambda: torch.linalg.lu_factor_ex(vector, pivot=False))
    integers = torch.ones(3, 3, dtype=torch.int32)
    assert raised(lambda: torch.linalg.lu(integers.to(DEV), pivot=False))[0] is raised(
        lambda: torch.linalg.lu(integers, pivot=False))[0]


# svd's driver=: accepted only where svd_uses_cusolver; openreg computes the
# same decomposition with the CPU's algorithm.


@BUSY
@pytest.mark.parametrize("driver", ["gesvd", "gesvdj", "gesvda"])
def test_svd_driver_accepted_as_cuda(busy, driver):
    a = torch.randn(2, 5, 3, dtype=torch.float64, generator=generator())
    want_u, want_s, want_vh = torch.linalg.svd(a, full_matrices=False)
    busy_or_idle(busy)
    u, s, vh = torch.linalg.svd(a.to(DEV), full_matrices=False, driver=driver)
    torch.testing.assert_close((u.cpu(), s.cpu(), vh.cpu()), (want_u, want_s, want_vh))
    torch.testing.assert_close(torch.linalg.svdvals(a.to(DEV), driver=driver).cpu(), want_s)
    outs = tuple(torch.empty(0, dtype=torch.float64, device=DEV) for _ in range(3))
    torch.linalg.svd(a.to(DEV), full_matrices=False, driver=driver, out=outs)
    torch.testing.assert_close(tuple(o.cpu() for o in outs), (want_u, want_s, want_vh))


def test_svd_unknown_driver_refused_as_cuda():
    a = torch.randn(4, 3, device=DEV)
    with pytest.raises(RuntimeError, match="^torch.linalg.svd: unknown svd driver gesdd in svd_cusolver computation"):
        torch.linalg.svd(a, driver="gesdd")
    # CUDA's _linalg_svd_out returns an empty input's results before the
    # driver is looked at; the meta function's checks come before both.
    u, s, vh = torch.linalg.svd(torch.empty(0, 3, device=DEV), driver="gesdd")
    assert (u.shape, s.shape, vh.shape) == ((0, 0), (0,), (3, 3))
    integers = torch.ones(3, 3, dtype=torch.int32)
    assert raised(lambda: torch.linalg.svd(integers.to(DEV), driver="gesvd")) == raised(
        lambda: torch.linalg.svd(integers))
