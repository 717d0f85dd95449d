"""One door for device work (Note [One door] in cpp/device/device_memory.h):
every read or write of device memory is a task on a stream, so memory that
another thread freed while its queued kernel still reads it is never overwritten
early, and the host does not wait for work it did not ask to wait for."""

import threading
import time
import warnings

import pytest
import torch
import torch.nn.functional as F

from _openreg_util import run_threads

THREADS = 8
DURATION_S = 3.0


def test_threads_sharing_the_default_stream_get_exact_results():
    """Several threads on the default stream, each queuing native and
    fallback ops and dropping temporaries right after queuing them: a block
    freed by one thread is reused by another only in stream order."""
    n = 4096
    expected_native = torch.arange(n, dtype=torch.float32) * 3
    expected_fallback = torch.sin(torch.arange(n, dtype=torch.float32)).abs() + 1
    expected_matmul = torch.full((64, 64), 64.0)
    wrong = []
    checks = [0] * THREADS
    stop_at = time.monotonic() + DURATION_S

    def worker(tid):
        def body():
            ones = torch.ones(64, 64, device="openreg")
            while time.monotonic() < stop_at:
                # Native kernels; the temporaries die as soon as the product is queued.
                t = torch.arange(n, dtype=torch.float32, device="openreg")
                native = t * 3
                del t
                # Fallback ops (sin, abs, matmul), fresh outputs of each.
                fallback = torch.sin(torch.arange(n, dtype=torch.float32, device="openreg")).abs() + 1
                product = ones @ ones
                # A long queued chain whose inputs are freed at once.
                for _ in range(3):
                    scratch = torch.full((n,), 7.0, device="openreg") * 2
                    del scratch
                for got, want, what in (
                    (native.cpu(), expected_native, "native"),
                    (fallback.cpu(), expected_fallback, "fallback"),
                    (product.cpu(), expected_matmul, "matmul"),
                ):
                    checks[tid] += 1
                    if not torch.equal(got, want):
                        bad = (got != want).nonzero()[0].item()
                        wrong.append(f"{what}[{bad}] = {got.flatten()[bad].item()}, want {want.flatten()[bad].item()}")

        return body

    assert run_threads([worker(tid) for tid in range(THREADS)]) == []
    assert sum(checks) > 100
    assert wrong == [], f"{len(wrong)} wrong of {sum(checks)}: {wrong[:5]}"


def _queue_long_work(ms=50):
    torch.openreg._sleep(ms)


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(lambda x: torch.sin(x), id="sin"),
        pytest.param(lambda x: torch.cumsum(x, 0), id="cumsum"),
        pytest.param(lambda x: x.sort().values, id="sort"),
        pytest.param(lambda x: F.softmax(x, 0), id="softmax"),
        pytest.param(lambda x: x @ x, id="dot"),
        pytest.param(lambda x: x.clone(), id="clone"),
        pytest.param(lambda x: x.to("openreg:1"), id="copy-to-other-device"),
        pytest.param(lambda x: torch.empty_like(x).copy_(x), id="copy_"),
        pytest.param(lambda x: x.resize_(2 * x.numel()), id="resize_-grow"),
        pytest.param(lambda x: F.conv1d(x.view(1, 1, -1), x[:3].view(1, 1, 3)), id="conv1d"),
    ],
)
def test_the_host_does_not_wait_for_queued_work(op):
    """An op queued behind 300 ms of work returns at once, as on CUDA; the
    value it computes is the one stream order gives. (Here on a plan already
    checked; a first call is test_a_first_call_behind_queued_work_does_not_wait.)"""
    x = torch.arange(1000, dtype=torch.float32, device="openreg")
    expected = op(x.cpu().clone()).cpu()
    # Plans and checks the op's results for these shapes: behind queued work
    # (long enough that a stalled caller still finds the stream busy), or the
    # call would run inline and plan nothing.
    _queue_long_work(50)
    op(x.clone())
    torch.openreg.synchronize()
    # 300 ms of queued work, and half of it as the bound: a loaded 2-core
    # machine can stall the calling thread for tens of milliseconds.
    _queue_long_work(300)
    start = time.perf_counter()
    got = op(x)
    elapsed = time.perf_counter() - start
    done_early = torch.openreg.current_stream().query()
    assert elapsed < 0.150, f"the host waited {elapsed * 1e3:.1f} ms"
    assert not done_early
    if got.numel() == 2000:  # resize_: the new elements are uninitialized
        torch.testing.assert_close(got.cpu()[:1000], torch.arange(1000, dtype=torch.float32))
    else:
        torch.testing.assert_close(got.cpu(), expected)


FIRST_CALLS = {
    "sin": lambda x, i: x.sin(),
    "cumsum": lambda x, i: x.cumsum(0),
    "softmax": lambda x, i: x.softmax(-1),
    "sort": lambda x, i: x.sort(0).values,
    "mm": lambda x, i: x @ x.T,
    "sin-out": lambda x, i: torch.sin(x, out=torch.empty_like(x)),
    "index_select": lambda x, i: x.index_select(0, i),
    "gather-on-a-view": lambda x, i: x[1:].gather(1, i.expand(4, 3)),
}


@pytest.mark.parametrize("op", FIRST_CALLS)
def test_a_first_call_behind_queued_work_does_not_wait(op):
    """The first call of a fallback op with argument shapes it has not seen
    behind queued work does not wait for the stream: its CPU kernel checks the
    arguments on stand-ins at the call (Note [Trial on stand-ins] in
    cpp/ops/fallback.cpp), and the call is queued. Its value is the one
    stream order gives."""
    fn = FIRST_CALLS[op]
    shape = (5, 3 + list(FIRST_CALLS).index(op))  # shapes no other test here uses
    x = torch.arange(shape[0] * shape[1], dtype=torch.float32, device="openreg").view(shape)
    index = torch.tensor([2, 0, 1], device="openreg")  # made before the work: a host copy waits
    expected = fn(x.cpu() * 2, index.cpu())
    stream = torch.openreg.current_stream()
    _queue_long_work(300)
    x.mul_(2)  # queued: a host copy made now would not see it
    got = fn(x, index)
    assert not stream.query(), "the host waited for the stream"
    torch.testing.assert_close(got.cpu(), expected)


def test_a_trials_warnings_are_raised_once_at_the_call():
    """A first call whose trial on stand-ins warns takes the waited route;
    the warning reaches the caller once, at the call (Note [Trial on
    stand-ins])."""
    x = torch.randn(6, 5, device="openreg")
    out = torch.empty(2, 2, device="openreg")  # resized, with a warning
    _queue_long_work(50)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.sin(x, out=out)
    resized = [w for w in caught if "resized" in str(w.message)]
    assert len(resized) == 1, [str(w.message) for w in caught]
    torch.testing.assert_close(out.cpu(), x.cpu().sin())


def test_data_dependent_shapes_synchronize_and_are_right():
    """nonzero and masked_select need the data to know their shape: they wait
    for the stream, as on CUDA, and see the queued writes."""
    x = torch.zeros(100, device="openreg")
    _queue_long_work(20)
    x[::7] = 1
    assert torch.nonzero(x).flatten().tolist() == list(range(0, 100, 7))
    assert torch.masked_select(x, x > 0).numel() == len(range(0, 100, 7))


def test_fallback_op_reading_a_freed_tensor_in_stream_order():
    """A fallback op's input dropped right after queuing, its block reused at
    once by a fresh output: the op still reads the old values."""
    _queue_long_work(30)
    a = torch.full((1 << 16,), 2.0, device="openreg")
    b = torch.exp(a)
    del a
    c = torch.full((1 << 16,), 5.0, device="openreg")
    torch.testing.assert_close(b.cpu(), torch.full((1 << 16,), 2.0).exp())
    torch.testing.assert_close(c.cpu(), torch.full((1 << 16,), 5.0))


def test_fallback_views_keep_their_dtype_and_geometry():
    z = torch.randn(4, 3, dtype=torch.complex64)
    zd = z.to("openreg")
    _queue_long_work(10)
    real = torch.view_as_real(zd)
    assert real.dtype == torch.float32 and real.shape == (4, 3, 2)
    torch.testing.assert_close(real.cpu(), torch.view_as_real(z))
    back = torch.view_as_complex(real)
    assert back.dtype == torch.complex64
    torch.testing.assert_close(back.cpu(), z)


@pytest.mark.parametrize(
    "conv, weight_shape",
    [(F.conv1d, (4, 2, 3)), (F.conv2d, (4, 2, 3, 3)), (F.conv_transpose2d, (2, 4, 3, 3))],
    ids=["conv1d", "conv2d", "conv_transpose2d"],
)
@pytest.mark.parametrize("where", ["weight-openreg:1", "weight-cpu", "bias-openreg:1", "bias-cpu"])
def test_convolution_checks_every_device_argument(conv, weight_shape, where):
    """As on CUDA, every tensor of a convolution is on the input's device."""
    dims = len(weight_shape) - 2
    x = torch.randn(1, 2, *([6] * dims), device="openreg:0")
    weight = torch.randn(*weight_shape, device="openreg:0")
    bias = torch.randn(4, device="openreg:0")
    what, device = where.split("-")
    if what == "weight":
        weight = weight.to(device)
    else:
        bias = bias.to(device)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        conv(x, weight, bias)


def test_convolution_forward_and_backward_match_cpu_behind_queued_work():
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 3, 9, 9), torch.randn(5, 3, 3, 3), torch.randn(5)
    xd, wd, bd = (t.to("openreg").requires_grad_() for t in (x, w, b))
    xc, wc, bc = (t.clone().requires_grad_() for t in (x, w, b))
    _queue_long_work(20)
    out = F.conv2d(xd, wd, bd, padding=1, stride=2)
    out.sum().backward()
    ref = F.conv2d(xc, wc, bc, padding=1, stride=2)
    ref.sum().backward()
    torch.testing.assert_close(out.cpu(), ref.detach())
    for got, want in ((xd, xc), (wd, wc), (bd, bc)):
        assert got.grad.device == torch.device("openreg:0")
        torch.testing.assert_close(got.grad.cpu(), want.grad)


def test_ops_whose_meta_kernel_sizes_an_output_differently_stay_right():
    """native_batch_norm's Meta kernel sizes the saved statistics of eval
    mode differently from the CPU kernel: the plan is checked once and then
    never used, so every call gives CPU's results."""
    x, mean, var = torch.randn(4, 3), torch.randn(3), torch.rand(3) + 0.5
    want = torch.native_batch_norm(x, None, None, mean, var, False, 0.1, 1e-5)
    xd, meand, vard = x.to("openreg"), mean.to("openreg"), var.to("openreg")
    for _ in range(3):
        _queue_long_work(1)
        got = torch.native_batch_norm(xd, None, None, meand, vard, False, 0.1, 1e-5)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            torch.testing.assert_close(g.cpu(), w)
