"""Tensors on the device: creation, strides and views, resize_ and set_,
storage resize (resizePrivateUse1Bytes), fill_/zero_/item, pinned host
memory (pin_memory, is_pinned, isPinnedPtr) and getDeviceFromPtr."""

import ctypes
import os
import shutil
import subprocess

import pytest
import torch

from _openreg_util import new_stream, script

DEV0 = torch.device("openreg:0")
DEV1 = torch.device("openreg:1")


# ---------------------------------------------------------------- creation


def test_empty_has_requested_geometry_and_device():
    t = torch.empty(2, 3, 4, device="openreg:1", dtype=torch.float64)
    assert t.device == DEV1 and t.is_openreg and t.device.type == "openreg"
    assert t.shape == (2, 3, 4) and t.stride() == (12, 4, 1) and t.dtype == torch.float64
    assert t.is_contiguous() and t.storage_offset() == 0
    assert t.untyped_storage().nbytes() == 2 * 3 * 4 * 8
    assert t.untyped_storage().device == DEV1
    cl = torch.empty(2, 3, 4, 5, device="openreg:0", memory_format=torch.channels_last)
    assert cl.is_contiguous(memory_format=torch.channels_last)
    assert cl.stride() == (60, 1, 15, 3)
    assert torch.empty(0, device="openreg:0").data_ptr() == 0


def test_device_without_index_is_the_current_device():
    assert torch.empty(1, device="openreg").device == DEV0
    with torch.openreg.device(1):
        assert torch.empty(1, device="openreg").device == DEV1
        assert torch.ones(1, device="openreg").device == DEV1
        assert torch.tensor([1.0], device="openreg").device == DEV1
    assert torch.empty(1, device=torch.device("openreg", 1)).device == DEV1
    assert torch.ones(2).openreg().device == DEV0
    assert torch.ones(2).openreg(1).device == DEV1
    assert torch.ones(2).to("openreg").is_openreg


def test_empty_strided():
    t = torch.empty_strided((2, 3), (1, 2), device="openreg:0")
    assert t.shape == (2, 3) and t.stride() == (1, 2)
    assert not t.is_contiguous()
    assert t.untyped_storage().nbytes() == 6 * 4
    t.copy_(torch.arange(6.0).reshape(2, 3))
    assert torch.equal(t.cpu(), torch.arange(6.0).reshape(2, 3))
    # The storage holds the elements in stride order.
    assert torch.equal(t.as_strided((6,), (1,)).cpu(), torch.tensor([0.0, 3.0, 1.0, 4.0, 2.0, 5.0]))
    gap = torch.empty_strided((2, 2), (10, 2), device="openreg:1")
    assert gap.untyped_storage().nbytes() == (10 + 2 + 1) * 4
    assert torch.empty_strided((3, 0), (1, 1), device="openreg:0").untyped_storage().nbytes() == 0


def test_as_strided_views_device_memory():
    base = torch.arange(12.0, device="openreg:0")
    ref = torch.arange(12.0)
    for size, stride, offset in [((3, 3), (3, 1), 0), ((2, 2), (1, 4), 3), ((4,), (3,), 1), ((2, 3), (0, 1), 5)]:
        v = base.as_strided(size, stride, offset)
        assert v.storage_offset() == offset and v.stride() == stride
        assert v.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
        assert torch.equal(v.cpu(), ref.as_strided(size, stride, offset))
    base.as_strided((2,), (5,), 1).fill_(-1.0)
    ref.as_strided((2,), (5,), 1).fill_(-1.0)
    assert torch.equal(base.cpu(), ref)


def test_factories_and_conversions():
    assert torch.equal(torch.zeros(2, 2, device="openreg:0").cpu(), torch.zeros(2, 2))
    assert torch.equal(torch.full((3,), 2.5, device="openreg:1").cpu(), torch.full((3,), 2.5))
    x = torch.tensor([1, 2, 3], device="openreg:1")
    assert x.dtype == torch.int64 and x.tolist() == [1, 2, 3]
    for dtype in (torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8, torch.bool, torch.complex64):
        y = x.to(dtype)
        assert y.dtype == dtype and y.device == DEV1
        assert torch.equal(y.cpu(), torch.tensor([1, 2, 3]).to(dtype))
    assert x.clone().data_ptr() != x.data_ptr()
    assert torch.equal(x.clone().cpu(), x.cpu())
    t = torch.arange(6.0, device="openreg:0").reshape(2, 3).t()
    c = t.contiguous()
    assert c.is_contiguous() and c.data_ptr() != t.data_ptr()
    assert torch.equal(c.cpu(), torch.arange(6.0).reshape(2, 3).t())


# ------------------------------------------------------ fill_, zero_, item


def test_fill_zero_and_item():
    t = torch.empty(3, 4, device="openreg:1")
    assert t.fill_(2.5) is t
    assert torch.equal(t.cpu(), torch.full((3, 4), 2.5))
    t[:, 1].fill_(7)
    t.t()[2].zero_()
    ref = torch.full((3, 4), 2.5)
    ref[:, 1] = 7
    ref[:, 2] = 0
    assert torch.equal(t.cpu(), ref)
    assert t.zero_() is t and t.abs().sum().item() == 0.0
    assert t[1, 1].item() == 0.0
    b = torch.empty(5, dtype=torch.bool, device="openreg:0").fill_(True)
    assert b.all().item() is True
    i = torch.empty((), dtype=torch.int32, device="openreg:0").fill_(-17)
    assert i.item() == -17
    f = torch.empty((), dtype=torch.float64, device="openreg:0").fill_(1 / 3)
    assert f.item() == 1 / 3
    c = torch.empty((), dtype=torch.complex64, device="openreg:0").fill_(1 + 2j)
    assert c.item() == 1 + 2j
    # fill_ with a 0-dim tensor value
    t.fill_(torch.tensor(4.0))
    assert t.sum().item() == 48.0


def test_fill_is_ordered_on_the_stream():
    s = new_stream(0)
    t = torch.zeros(100, device="openreg:0")
    with torch.openreg.stream(s):
        torch.openreg._sleep(150)
        t.fill_(1.0)
        t[10:20].zero_()
        t.add_(1.0)
        total = t.sum().item()
    assert total == 90 * 2.0 + 10 * 1.0


# ------------------------------------------------------------ resize_, set_


def test_resize_keeps_data_and_grows_storage(exact_memory):
    t = torch.arange(4.0, device="openreg:0")
    before = torch.openreg.memory_allocated(0)
    r = t.resize_(3, 5)
    assert r is t and t.shape == (3, 5)
    assert t.untyped_storage().nbytes() == 15 * 4
    assert t.flatten()[:4].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert torch.openreg.memory_allocated(0) == before - 512 + 512  # one 512-byte block replaced by another
    t.resize_(2)
    assert t.tolist() == [0.0, 1.0]
    assert t.untyped_storage().nbytes() == 15 * 4  # shrinking keeps the storage
    t.resize_(0)
    assert t.numel() == 0
    t.resize_(20)
    assert t[:4].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_resize_sees_queued_writes():
    s = new_stream(0)
    t = torch.zeros(4, device="openreg:0")
    with torch.openreg.stream(s):
        torch.openreg._sleep(150)
        t.fill_(6.0)
        t.resize_(1000)  # copies the old bytes after the fill ran
        head = t[:4].cpu()
    assert head.tolist() == [6.0] * 4


def test_resize_on_device_1_stays_on_device_1(exact_memory):
    before0 = torch.openreg.memory_allocated(0)
    t = torch.ones(2, device="openreg:1")
    t.resize_(1000)
    assert t.device == DEV1 and t.untyped_storage().device == DEV1
    assert t[:2].tolist() == [1.0, 1.0]
    assert torch.openreg.memory_allocated(0) == before0


def test_set_shares_storage():
    src = torch.arange(10.0, device="openreg:1")
    t = torch.empty(0, device="openreg:1")
    assert t.set_(src) is t
    assert t.data_ptr() == src.data_ptr() and t.shape == (10,)
    u = torch.empty(0, device="openreg:1")
    u.set_(src.untyped_storage(), 2, (2, 3), (3, 1))
    assert u.tolist() == [[2.0, 3.0, 4.0], [5.0, 6.0, 7.0]]
    u.mul_(10)
    assert src.tolist() == [0, 1, 20, 30, 40, 50, 60, 70, 8, 9]
    w = torch.empty(0, device="openreg:1")
    w.set_(src.untyped_storage())
    assert w.shape == (10,) and w[9].item() == 9.0
    assert w.untyped_storage().data_ptr() == src.untyped_storage().data_ptr()


# ------------------------------------------------------------ storage resize


def test_untyped_storage_resize_keeps_bytes_and_device(exact_memory):
    for device in ("openreg:0", "openreg:1"):
        t = torch.arange(8, dtype=torch.uint8, device=device)
        storage = t.untyped_storage()
        index = torch.device(device).index
        before = torch.openreg.memory_allocated(index)
        storage.resize_(5000)
        assert storage.nbytes() == 5000 and storage.device == torch.device(device)
        assert torch.openreg.memory_allocated(index) == before - 512 + 5120
        view = torch.empty(0, dtype=torch.uint8, device=device).set_(storage, 0, (5000,), (1,))
        assert view[:8].tolist() == list(range(8))
        storage.resize_(3)
        assert storage.nbytes() == 3
        assert torch.openreg.memory_allocated(index) == before
        again = torch.empty(0, dtype=torch.uint8, device=device).set_(storage, 0, (3,), (1,))
        assert again.tolist() == [0, 1, 2]
        storage.resize_(0)
        assert storage.nbytes() == 0
        assert torch.openreg.memory_allocated(index) == before - 512


# Storage methods wait for the stream while holding the GIL; a deadlock there
# must not hang the test run, so this runs in a subprocess that gives up
# (faulthandler, exit code 1) after a few seconds.
STORAGE_AFTER_QUEUED_WORK = script(
    "storage_after_queued_work",
    """
    import faulthandler
    import torch, torch_openreg
    s = torch.Stream(device="openreg:1")
    t = torch.zeros(4, device="openreg:1")
    faulthandler.dump_traceback_later(8, exit=True)
    with torch.openreg.stream(s):
        torch.openreg._sleep(150)
        t.fill_(3.0)  # queued behind the sleep, on a tensor Python owns
        storage = t.untyped_storage()
        storage.resize_(64)
        RESULT["head"] = torch.empty(0, device="openreg:1").set_(storage, 0, (4,), (1,)).tolist()
        torch.openreg._sleep(150)
        t.fill_(5.0)
        RESULT["clone"] = torch.empty(0, device="openreg:1").set_(storage.clone(), 0, (4,), (1,)).tolist()
    faulthandler.cancel_dump_traceback_later()
    done(RESULT)
    """,
    timeout=60,
)


@pytest.mark.subprocess
def test_storage_resize_sees_queued_writes():
    data = STORAGE_AFTER_QUEUED_WORK.result().check_ok()
    assert data["head"] == [3.0] * 4
    assert data["clone"] == [5.0] * 4


def test_storage_clone_and_copy():
    t = torch.arange(6.0, device="openreg:1")
    s = t.untyped_storage()
    c = s.clone()
    assert c.device == DEV1 and c.data_ptr() != s.data_ptr()
    assert torch.empty(0, device="openreg:1").set_(c, 0, (6,), (1,)).tolist() == list(map(float, range(6)))
    host = s.cpu()
    assert host.device.type == "cpu" and host.nbytes() == 24
    assert torch.frombuffer(bytearray(bytes(host)), dtype=torch.float32).tolist() == list(map(float, range(6)))


# ---------------------------------------------------------- pinned memory


def test_pin_memory_and_is_pinned():
    plain = torch.arange(10.0)
    assert not plain.is_pinned()
    pinned = plain.pin_memory()
    assert pinned.is_pinned() and pinned.device.type == "cpu"
    assert pinned.data_ptr() != plain.data_ptr()
    assert torch.equal(pinned, plain)
    assert pinned[3:].is_pinned()  # a pointer inside a pinned allocation
    assert pinned.pin_memory().data_ptr() == pinned.data_ptr()  # already pinned: the same tensor
    fresh = torch.empty(100, pin_memory=True)
    assert fresh.is_pinned()
    assert torch.zeros(3, 4, pin_memory=True).is_pinned()
    assert not torch.ones(3, device="openreg:0").is_pinned()
    storage = pinned.untyped_storage()
    assert storage.is_pinned()
    del pinned, storage
    # Freed pinned memory is no longer pinned memory.
    assert not plain.clone().is_pinned()


def test_pinned_tensor_survives_ops():
    p = torch.arange(6.0).pin_memory()
    q = p * 2
    assert torch.equal(q, torch.arange(6.0) * 2)
    d = p.to("openreg:1")
    assert torch.equal(d.cpu(), torch.arange(6.0))


# ------------------------------------ hooks probed from C++ (getDeviceFromPtr)

_PROBE_SOURCE = r"""
#include <cstdio>
#include <ATen/detail/PrivateUse1HooksInterface.h>
extern "C" int probe_device_from_ptr(void* p, char* err, int n) {
  try { return at::detail::getPrivateUse1Hooks().getDeviceFromPtr(p).index(); }
  catch (const std::exception& e) { std::snprintf(err, n, "%s", e.what()); return -1; }
}
extern "C" int probe_is_pinned(void* p) { return at::detail::getPrivateUse1Hooks().isPinnedPtr(p) ? 1 : 0; }
"""


@pytest.fixture(scope="module")
def hooks_probe(tmp_path_factory):
    """A tiny C++ library (plain g++, ~2 s) calling openreg's registered
    PrivateUse1 hooks, loaded with ctypes."""
    compiler = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler to build the hooks probe")
    root = os.path.dirname(torch.__file__)
    work = tmp_path_factory.mktemp("hooks_probe")
    src, lib = work / "probe.cpp", work / "probe.so"
    src.write_text(_PROBE_SOURCE)
    cmd = [
        compiler, "-std=c++20", "-O0", "-shared", "-fPIC",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        f"-I{root}/include", f"-I{root}/include/torch/csrc/api/include",
        str(src), "-o", str(lib), f"-L{root}/lib", "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{root}/lib",
    ]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    probe = ctypes.CDLL(str(lib))
    probe.probe_device_from_ptr.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    probe.probe_is_pinned.argtypes = [ctypes.c_void_p]
    return probe


def _device_from_ptr(probe, ptr):
    err = ctypes.create_string_buffer(4096)
    index = probe.probe_device_from_ptr(ptr, err, len(err))
    return index, err.value.decode(errors="replace")


def test_get_device_from_ptr(hooks_probe):
    a = torch.empty(1000, device="openreg:0")
    b = torch.empty(1000, device="openreg:1")
    assert _device_from_ptr(hooks_probe, a.data_ptr())[0] == 0
    assert _device_from_ptr(hooks_probe, b.data_ptr())[0] == 1
    assert _device_from_ptr(hooks_probe, b.data_ptr() + 3999)[0] == 1  # inside the allocation
    host = torch.empty(10)
    index, message = _device_from_ptr(hooks_probe, host.data_ptr())
    assert index == -1 and "not openreg device memory" in message, message


def test_set_beyond_the_storage_grows_it_like_on_cpu(hooks_probe):
    x = torch.ones(10, device="openreg:0")
    storage = x.untyped_storage()
    t = torch.empty(0, device="openreg:0").set_(storage, 5, (100,), (1,))
    cpu = torch.ones(10)
    torch.empty(0).set_(cpu.untyped_storage(), 5, (100,), (1,))
    assert storage.nbytes() == cpu.untyped_storage().nbytes() == 105 * 4
    assert storage.device == DEV0
    assert _device_from_ptr(hooks_probe, storage.data_ptr())[0] == 0  # still device memory
    assert t[:5].tolist() == [1.0] * 5
    assert x.tolist() == [1.0] * 10


def test_is_pinned_ptr(hooks_probe):
    pinned = torch.empty(100).pin_memory()
    assert hooks_probe.probe_is_pinned(pinned.data_ptr()) == 1
    assert hooks_probe.probe_is_pinned(pinned.data_ptr() + 399) == 1
    assert hooks_probe.probe_is_pinned(torch.empty(100).data_ptr()) == 0
    assert hooks_probe.probe_is_pinned(torch.empty(100, device="openreg:0").data_ptr()) == 0
