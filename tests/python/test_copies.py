"""Copies (Note [Copies]): host<->device, device<->device and
openreg:0<->openreg:1, contiguous or not, with dtype conversion. A copy runs
on the current stream; a copy between openreg tensors, or non_blocking=True
with a pinned host side, is truly asynchronous, anything else waits for the
stream."""

import io

import pytest
import torch

from _openreg_util import new_stream

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int8,
          torch.uint8, torch.bool, torch.complex64]


def _sample(dtype, shape=(3, 5)):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(shape, generator=g) * 50
    if dtype == torch.bool:
        return x > 0
    if dtype.is_complex:
        return torch.complex(x, -x).to(dtype)
    return x.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", ["openreg:0", "openreg:1"])
def test_host_device_round_trip(dtype, device):
    host = _sample(dtype)
    d = host.to(device)
    assert d.device == torch.device(device) and d.dtype == dtype
    back = d.cpu()
    assert back.device.type == "cpu" and back.dtype == dtype
    assert torch.equal(back, host)
    assert back.data_ptr() != host.data_ptr()


def test_copy_into_existing_tensors_with_conversion():
    host = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    d = torch.empty(3, 4, dtype=torch.float64, device="openreg:0")
    assert d.copy_(host) is d
    assert torch.equal(d.cpu(), host.double())
    h = torch.empty(3, 4, dtype=torch.int16)
    assert h.copy_(d) is h
    assert torch.equal(h, host.short())
    # Broadcasting copy.
    row = torch.empty(3, 4, device="openreg:1")
    row.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert torch.equal(row.cpu(), torch.tensor([1.0, 2.0, 3.0, 4.0]).expand(3, 4))


def test_non_contiguous_copies():
    host = torch.arange(24.0).reshape(4, 6)
    # non-contiguous host source, contiguous device destination
    d = host.t().to("openreg:0")
    assert d.is_contiguous() or d.stride() == host.t().stride()
    assert torch.equal(d.cpu(), host.t())
    # non-contiguous device source
    dev = host.to("openreg:0")
    assert torch.equal(dev[:, ::2].cpu(), host[:, ::2])
    assert torch.equal(dev.t().cpu(), host.t())
    # non-contiguous device destination, from host and from device
    dst = torch.zeros(4, 6, device="openreg:0")
    dst[:, 1::2] = host[:, ::2]
    ref = torch.zeros(4, 6)
    ref[:, 1::2] = host[:, ::2]
    assert torch.equal(dst.cpu(), ref)
    dst.t().copy_(dev.t() * 2)
    assert torch.equal(dst.cpu(), host * 2)
    # expanded (stride 0) source
    e = torch.empty(3, 4, device="openreg:1")
    e.copy_(torch.tensor([5.0]).expand(3, 4))
    assert e.sum().item() == 60.0
    # Storage offset.
    assert torch.equal(dev[2:, 3:].cpu(), host[2:, 3:])


def test_device_to_device_same_device():
    a = torch.arange(10.0, device="openreg:1")
    b = torch.empty(10, device="openreg:1")
    b.copy_(a)
    assert b.data_ptr() != a.data_ptr()
    assert torch.equal(b.cpu(), torch.arange(10.0))
    c = a.clone()
    a.zero_()
    assert torch.equal(c.cpu(), torch.arange(10.0))
    # to() on the same device and dtype is a no-op returning self.
    assert a.to("openreg:1") is a
    assert a.to("openreg:1", copy=True) is not a


@pytest.mark.parametrize("src_dev, dst_dev", [("openreg:0", "openreg:1"), ("openreg:1", "openreg:0")])
def test_cross_device_copies(src_dev, dst_dev, exact_memory):
    before = torch.openreg.memory_allocated(torch.device(dst_dev).index)
    src = torch.arange(1000.0, device=src_dev)
    moved = src.to(dst_dev)
    assert moved.device == torch.device(dst_dev)
    assert torch.openreg.memory_allocated(torch.device(dst_dev).index) == before + 4096
    assert torch.equal(moved.cpu(), torch.arange(1000.0))
    dst = torch.zeros(10, 100, dtype=torch.float64, device=dst_dev)
    dst.t().copy_(src.reshape(100, 10))
    assert torch.equal(dst.cpu(), torch.arange(1000.0).reshape(100, 10).t().double())


def test_cross_device_copy_waits_for_the_source_stream():
    src = torch.zeros(1000, device="openreg:0")
    with torch.openreg.device(0):
        torch.openreg._sleep(200)
    src.fill_(7.0)  # queued on openreg:0's current stream
    dst = src.to("openreg:1")
    assert dst.sum().item() == 7000.0


def test_cross_device_copy_waits_for_the_destination_stream():
    dst = torch.zeros(1000, device="openreg:1")
    with torch.openreg.device(1):
        torch.openreg._sleep(200)
    dst.fill_(1.0)  # queued on openreg:1's current stream: must not land after the copy
    dst.copy_(torch.full((1000,), 3.0, device="openreg:0"))
    dst.add_(1.0)  # and work queued on openreg:1 afterwards sees the copy
    assert dst.sum().item() == 4000.0


def test_blocking_copies_wait_for_the_stream():
    x = torch.zeros(1000, device="openreg:0")
    torch.openreg._sleep(200)
    x.fill_(2.0)
    assert x.cpu().sum().item() == 2000.0  # device -> host
    torch.openreg._sleep(200)
    x.fill_(3.0)
    h = torch.empty(1000)
    h.copy_(x)
    assert h.sum().item() == 3000.0
    # non_blocking into pageable (not pinned) host memory is synchronous too.
    torch.openreg._sleep(200)
    x.fill_(4.0)
    h.copy_(x, non_blocking=True)
    assert h.sum().item() == 4000.0


def test_host_to_device_copy_is_ordered_after_queued_work():
    x = torch.zeros(1000, device="openreg:0")
    torch.openreg._sleep(200)
    x.fill_(9.0)
    x.copy_(torch.ones(1000))  # must land after the fill, not before
    assert x.sum().item() == 1000.0


def test_non_blocking_device_to_pinned_host_is_asynchronous():
    src = torch.arange(8.0, device="openreg:0") + 100
    dst = torch.full((8,), -1.0).pin_memory()
    assert dst.is_pinned()
    torch.openreg._sleep(300)
    r = dst.copy_(src, non_blocking=True)
    assert r is dst
    # The stream has not got there yet: the destination still has old values.
    assert dst.tolist() == [-1.0] * 8
    assert not torch.openreg.current_stream().query()
    torch.openreg.synchronize()
    assert dst.tolist() == [100.0 + i for i in range(8)]


def test_non_blocking_to_with_pinned_memory():
    src = torch.arange(6.0, device="openreg:1")
    with torch.openreg.device(1):
        torch.openreg._sleep(300)
        out = src.to("cpu", non_blocking=True)
        # PyTorch allocates a pinned destination for a non_blocking D2H .to().
        assert out.is_pinned()
        torch.openreg.synchronize()
    assert out.tolist() == list(map(float, range(6)))


def test_non_blocking_pinned_host_to_device_is_asynchronous():
    host = torch.arange(16.0).pin_memory()
    dev = torch.zeros(16, device="openreg:0")
    torch.openreg._sleep(300)
    dev.copy_(host, non_blocking=True)
    assert not torch.openreg.current_stream().query()  # the copy is still queued behind the sleep
    assert dev.cpu().tolist() == list(map(float, range(16)))  # blocking read waits


def test_non_blocking_device_to_device_is_asynchronous():
    a = torch.arange(100.0, device="openreg:0")
    b = torch.zeros(100, device="openreg:0")
    torch.openreg._sleep(300)
    b.copy_(a, non_blocking=True)
    assert not torch.openreg.current_stream().query()
    assert b.sum().item() == sum(range(100))


def test_copy_runs_on_the_current_stream():
    s = new_stream(0)
    src = torch.arange(4.0, device="openreg:0")
    dst = torch.zeros(4).pin_memory()
    with torch.openreg.stream(s):
        torch.openreg._sleep(300)
        dst.copy_(src, non_blocking=True)
    # The default stream is idle; the copy is queued on s.
    assert torch.openreg.default_stream(0).query()
    assert not s.query()
    s.synchronize()
    assert dst.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_stream_ordering_through_events_only():
    """Stream A: sleep, then a non_blocking H2D copy into x; record an event.
    Stream B waits on the event, then computes on x: it sees the copy."""
    a, b = new_stream(0), new_stream(0)
    src = torch.arange(1.0, 1001.0).pin_memory()
    x = torch.zeros(1000, device="openreg:0")
    event = torch.Event(device="openreg:0")
    with torch.openreg.stream(a):
        torch.openreg._sleep(200)
        x.copy_(src, non_blocking=True)
        event.record(a)
    with torch.openreg.stream(b):
        event.wait(b)
        y = x * 2
        total = y.sum()
        # Read on b: as on CUDA, the default stream is not ordered after b.
        assert total.item() == 2 * 500500.0
    assert y.device == x.device


def test_without_an_event_the_other_stream_does_not_wait():
    """The control for the test above: streams really run concurrently, so
    only the event orders B after A."""
    a, b = new_stream(0), new_stream(0)
    src = torch.arange(1.0, 1001.0).pin_memory()
    x = torch.zeros(1000, device="openreg:0")
    with torch.openreg.stream(a):
        torch.openreg._sleep(400)
        x.copy_(src, non_blocking=True)
    with torch.openreg.stream(b):
        early = (x * 2).sum().item()
    a.synchronize()
    assert early == 0.0
    assert x.sum().item() == 500500.0


def test_record_stream_keeps_memory_for_the_other_stream():
    side = new_stream(0)
    x = torch.arange(1000.0, device="openreg:0")
    out = torch.zeros(1000).pin_memory()
    with torch.openreg.stream(side):
        torch.openreg._sleep(200)
        out.copy_(x, non_blocking=True)
    x.record_stream(side)
    del x
    # Reallocating the same size on the default stream must not reuse (and
    # overwrite) memory that the side stream has yet to read.
    y = torch.full((1000,), -5.0, device="openreg:0")  # noqa: F841
    side.synchronize()
    assert out.tolist() == list(map(float, range(1000)))


def test_copies_to_and_from_bytes_buffers():
    buf = io.BytesIO()
    host = torch.arange(5, dtype=torch.int16)
    d = host.to("openreg:1")
    buf.write(d.cpu().numpy().tobytes())
    assert buf.getvalue() == host.numpy().tobytes()
    n = torch.from_numpy(host.numpy()).to("openreg:0")
    assert n.tolist() == [0, 1, 2, 3, 4]
