"""Custom C++ kernels: an extension JIT-built with torch.utils.cpp_extension.load
against <torch_openreg/kernel.h> (from torch_openreg.include_dir()) and linked
with libtorch_openreg.so queues its kernel on the current openreg stream.

The extension (extension/scale_kernel.cpp) registers torch.ops.openreg_ext.*
with TORCH_LIBRARY, not as a Python module: torch/library.h compiles in about
10 s on 2 cores, torch/extension.h takes much longer. It is built once per
session, into a pytest temporary directory.
"""

import faulthandler
import glob
import os
import sys
import time

import pytest
import torch
from torch.utils import cpp_extension

import torch_openreg
from _openreg_util import Script, clean_env, new_stream

EXTENSION_SOURCES = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "extension", "*.cpp")))
# The compile takes ~10 s here; a hung compiler ends the run with a traceback.
BUILD_TIMEOUT_S = 300

N = 4096


class Extension:
    """torch.ops.openreg_ext, plus the path of the library that defines it."""

    def __init__(self, library: str):
        self.library = library

    def __getattr__(self, name):
        return getattr(torch.ops.openreg_ext, name)


# Session scope, though only this module uses it: conftest moves subprocess
# tests to the end of the run, which would set up a module fixture a second
# time, and loading a second build of the library into the process aborts
# it (the openreg_ext namespace registered twice).
@pytest.fixture(scope="session")
def ext(tmp_path_factory) -> Extension:
    """The extension, built and loaded once."""
    build_dir = str(tmp_path_factory.mktemp("openreg_ext_build"))
    lib_dir = os.path.dirname(torch_openreg.library_path())
    faulthandler.dump_traceback_later(BUILD_TIMEOUT_S, exit=True, file=sys.stderr)
    try:
        cpp_extension.load(
            name="openreg_ext",
            sources=EXTENSION_SOURCES,
            extra_include_paths=[torch_openreg.include_dir()],
            extra_ldflags=[f"-L{lib_dir}", "-ltorch_openreg", f"-Wl,-rpath,{lib_dir}"],
            build_directory=build_dir,
            is_python_module=False,
            verbose=False,
        )
    finally:
        faulthandler.cancel_dump_traceback_later()
    library = os.path.join(build_dir, "openreg_ext.so")
    assert os.path.isfile(library)
    return Extension(library)


def values(t: torch.Tensor) -> list:
    return t.cpu().tolist()


def test_include_dir_holds_the_public_headers():
    root = torch_openreg.include_dir()
    assert os.path.isfile(os.path.join(root, "openreg.h"))
    assert os.path.isfile(os.path.join(root, "torch_openreg", "kernel.h"))


def test_extension_links_the_openreg_library(ext):
    with open(ext.library, "rb") as f:
        assert b"libtorch_openreg.so" in f.read()  # DT_NEEDED: linked by path, not by accident


def test_result_after_synchronize(ext):
    x = torch.arange(N, dtype=torch.float32, device="openreg")
    out = ext.scale_(x, 2.5)
    assert out.data_ptr() == x.data_ptr()  # in place
    torch.openreg.synchronize()
    assert values(x) == [i * 2.5 for i in range(N)]


def while_sleeping(attempt) -> dict:
    """Observations made while a stream sleeps. ``attempt(sleep_ms)`` queues
    a sleep, records an event right behind it, observes, and returns
    ``(event, observations)``; they count only if the event has still not
    completed (the host looked within the sleep). On a machine too loaded for
    that, the attempt is repeated with a longer sleep."""
    for sleep_ms in (200, 1000, 3000):
        event, observed = attempt(sleep_ms)
        conclusive = not event.query()
        torch.openreg.synchronize()
        if conclusive:
            return observed
    pytest.fail("the host never managed to look while the stream slept")


def sleep_then_record(sleep_ms: float) -> torch.Event:
    torch.openreg._sleep(sleep_ms)
    event = torch.Event(device="openreg")
    event.record()
    return event


def test_kernel_is_queued_on_the_current_stream(ext):
    stream = torch.openreg.current_stream()
    peek_stream = new_stream()
    assert ext.current_stream(0) == [0, stream.stream_id]
    x = torch.ones(N, device="openreg")

    def attempt(sleep_ms):
        x.fill_(1.0)
        slept = sleep_then_record(sleep_ms)
        t0 = time.perf_counter()
        ext.scale_(x, 2.0)
        call_s = time.perf_counter() - t0
        queued = not stream.query()
        with torch.openreg.stream(peek_stream):  # an idle stream reads x now
            peek = values(x)
        return slept, dict(call_s=call_s, sleep_s=sleep_ms / 1000, queued=queued, peek=peek)

    seen = while_sleeping(attempt)
    assert seen["call_s"] < seen["sleep_s"], "the launch waited for the stream"
    assert seen["queued"], "the stream was idle right after the launch"
    assert seen["peek"] == [1.0] * N, "the kernel ran before the work queued ahead of it"
    assert values(x) == [2.0] * N


def test_captured_tensors_live_until_the_kernel_ran(ext):
    nbytes = 1 << 22

    def attempt(sleep_ms):
        torch.openreg.synchronize()
        destroyed, base = ext.destroyed_kernels(), torch.openreg.memory_allocated(0)
        x = torch.ones(nbytes // 4, device="openreg")
        slept = sleep_then_record(sleep_ms)
        ext.scale_(x, 2.0)
        del x  # only the queued kernel holds x now
        seen = dict(held=torch.openreg.memory_allocated(0) - base, destroyed=ext.destroyed_kernels() - destroyed)
        return slept, dict(seen, destroyed_before=destroyed, base=base)

    seen = while_sleeping(attempt)  # synchronizes
    assert seen["held"] >= nbytes, "x was freed before the kernel ran"
    assert seen["destroyed"] == 0, "the kernel was destroyed before it ran"
    assert ext.destroyed_kernels() == seen["destroyed_before"] + 1, "the kernel was not destroyed after it ran"
    assert torch.openreg.memory_allocated(0) == seen["base"], "x outlived the kernel"


def test_kernel_captured_in_a_graph_runs_once_per_replay(ext):
    """A custom kernel launched while a graph captures is recorded, not run;
    each replay runs it once; what it captured lives until the graph goes."""
    x = torch.ones(N, device="openreg")
    destroyed = ext.destroyed_kernels()
    s, g = torch.Stream(device="openreg"), torch.accelerator.Graph()
    with s, g:
        ext.scale_(x, 2.0)
    assert torch.equal(x.cpu(), torch.ones(N)), "the captured kernel ran at capture"
    for replays in range(1, 4):
        g.replay()
        assert torch.equal(x.cpu(), torch.full((N,), 2.0**replays))
    assert ext.destroyed_kernels() == destroyed, "the graph's kernel was destroyed while the graph lives"
    g.reset()
    assert ext.destroyed_kernels() == destroyed + 1, "reset did not destroy the graph's kernel"


def test_non_default_stream_respects_an_event_wait(ext):
    producer, consumer = new_stream(), new_stream()
    assert producer.stream_id != consumer.stream_id
    x = torch.ones(N, device="openreg")

    def attempt(sleep_ms):
        x.fill_(1.0)
        with torch.openreg.stream(producer):
            slept = sleep_then_record(sleep_ms)
            x.fill_(3.0)
            ready = torch.Event(device="openreg")
            ready.record()
        consumer.wait_event(ready)
        with torch.openreg.stream(consumer):
            current = ext.current_stream(-1)
            ext.scale_(x, 2.0)
        return slept, dict(current=current, consumer_busy=not consumer.query(), default_idle=torch.openreg.default_stream(0).query())

    seen = while_sleeping(attempt)
    assert seen["current"] == [0, consumer.stream_id]
    assert seen["consumer_busy"], "the kernel did not wait for the producer"
    assert seen["default_idle"], "the kernel went to the default stream"
    assert values(x) == [6.0] * N  # 2 if the wait were ignored, 3 if it ran before the fill


def test_the_sanitizer_checks_the_accesses_a_kernel_declares(ext):
    """scale_ declares that it reads and writes its tensor: launched on a
    stream that has not waited for the stream that wrote the tensor, it is
    reported (and raises in "raise" mode); after the wait it is not."""
    side = new_stream()
    x = torch.ones(N, device="openreg")
    torch.openreg.synchronize()
    torch.openreg.sanitizer.clear()
    with torch.openreg.sanitizer.enable("raise"):
        with torch.openreg.stream(side):
            x.fill_(2.0)
        with pytest.raises(RuntimeError, match=r"openreg sanitizer: race: kernel \"host function\""):
            ext.scale_(x, 3.0)
        torch.openreg.current_stream().wait_stream(side)
        ext.scale_(x, 3.0)
        assert values(x) == [6.0] * N  # the failed launch did not run
    assert torch.openreg.sanitizer.counts()["race"] == 1
    torch.openreg.sanitizer.clear()


def test_runs_on_the_tensors_device(ext):
    if torch.openreg.device_count() < 2:
        pytest.skip("needs two openreg devices")
    x = torch.ones(N, device="openreg:1")
    assert torch.openreg.current_device() == 0

    def attempt(sleep_ms):
        x.fill_(1.0)
        with torch.openreg.device(1):
            slept = sleep_then_record(sleep_ms)
        ext.scale_(x, 4.0)
        return slept, dict(busy1=not torch.openreg.current_stream(1).query(), idle0=torch.openreg.current_stream(0).query())

    seen = while_sleeping(attempt)
    assert seen == dict(busy1=True, idle0=True), "the kernel did not go to the current stream of the tensor's device"
    assert values(x) == [4.0] * N


def test_bad_arguments_raise(ext):
    with pytest.raises(RuntimeError, match="openreg_ext::scale_: expected an openreg tensor, got a tensor on cpu"):
        ext.scale_(torch.ones(4), 2.0)
    with pytest.raises(RuntimeError, match="expected a float32 tensor, got Double"):
        ext.scale_(torch.ones(4, dtype=torch.float64, device="openreg"), 2.0)
    with pytest.raises(RuntimeError, match="expected a contiguous tensor"):
        ext.scale_(torch.ones(4, 4, device="openreg").t(), 2.0)


def test_failed_launch_throws_and_destroys_the_kernel(ext):
    torch.openreg.synchronize()
    destroyed = ext.destroyed_kernels()
    with pytest.raises(RuntimeError, match=r"openreg: orLaunchKernel failed: .*is not an openreg stream handle"):
        ext.launch_on_bad_stream()
    assert ext.destroyed_kernels() == destroyed + 1


def test_a_throwing_kernel_is_reported_and_the_stream_goes_on(ext, capfd):
    ext.throwing_kernel()
    torch.openreg.synchronize()
    assert "a deliberate failure in throwing_kernel" in capfd.readouterr().err
    x = torch.ones(N, device="openreg")
    ext.scale_(x, 3.0)
    torch.openreg.synchronize()
    assert values(x) == [3.0] * N


@pytest.mark.subprocess
def test_memory_protect_subprocess(ext):
    """With OPENREG_MEMORY_PROTECT=1 host code cannot touch device memory,
    but a launched kernel can."""
    code = f"""
    import torch, torch_openreg
    torch.ops.load_library({ext.library!r})
    RESULT["protect"] = torch.openreg.options()["OPENREG_MEMORY_PROTECT"]["value"]
    x = torch.arange({N}, dtype=torch.float32, device="openreg")
    torch.openreg._sleep(200)
    slept = torch.Event(device="openreg")
    slept.record()
    torch.ops.openreg_ext.scale_(x, 0.5)
    queued = not torch.openreg.current_stream().query()
    RESULT["queued"] = queued or slept.query()  # inconclusive if the sleep already ended
    torch.openreg.synchronize()
    RESULT["ok"] = x.cpu().tolist() == [i * 0.5 for i in range({N})]
    done(RESULT)
    """
    data = Script("memory_protect_kernel", code, clean_env(OPENREG_MEMORY_PROTECT="1"), timeout=60).result().check_ok()
    assert data == {"protect": "1", "queued": True, "ok": True}
