"""Many threads switching devices and recording/waiting on events at once:
consistent results, no deadlock."""

import random
import threading
import time

import torch

from _openreg_util import run_threads

THREADS = 8
DURATION_S = 2.5


def test_eight_threads_switch_devices_and_sync_events():
    count = torch.openreg.device_count()
    # Events every thread records and waits on, one per device.
    shared = [torch.Event(device="openreg") for _ in range(count)]
    for dev, event in enumerate(shared):  # created (and owned by dev) before the threads share it
        event.record(torch.openreg.default_stream(dev))
    shared_lock = threading.Lock()
    iterations = [0] * THREADS
    stop_at = time.monotonic() + DURATION_S

    def worker(tid):
        def body():
            rng = random.Random(tid)
            mine = [torch.Event(device="openreg") for _ in range(count)]
            after = [torch.Event(device="openreg") for _ in range(count)]
            while time.monotonic() < stop_at:
                dev = rng.randrange(count)
                torch.openreg.set_device(dev)
                assert torch.openreg.current_device() == dev
                producer = torch.Stream(device=f"openreg:{dev}")
                consumer = torch.Stream(device=f"openreg:{dev}")
                with torch.openreg.stream(producer):
                    torch.openreg._sleep(rng.choice((0, 1, 2)))
                    mine[dev].record()
                # Each thread's current device stays its own through the stream context.
                assert torch.openreg.current_device() == dev
                mine[dev].wait(consumer)
                # Shared events: another thread may re-record them at any time;
                # whatever version we wait for must simply complete.
                if rng.random() < 0.5:
                    with shared_lock:
                        shared[dev].record(producer)
                else:
                    shared[dev].wait(consumer)
                after[dev].record(consumer)
                after[dev].synchronize()
                # consumer waited for mine[dev]'s version, so it completed first.
                assert mine[dev].query() is True
                assert after[dev].query() is True
                if rng.random() < 0.2:
                    # Pool streams are shared with the other threads, so only
                    # this thread's own marker is known to be complete.
                    torch.openreg.synchronize(dev)
                    assert mine[dev].query() is True
                iterations[tid] += 1

        return body

    errors = run_threads([worker(i) for i in range(THREADS)], timeout=DURATION_S + 30)
    assert not errors, errors
    assert all(n > 0 for n in iterations), iterations
    for dev in range(count):
        torch.openreg.synchronize(dev)
        shared[dev].synchronize()
        assert shared[dev].query() is True
    assert torch.openreg.current_device() == 0  # the main thread's device never moved


def test_threads_keep_independent_devices_and_streams():
    count = torch.openreg.device_count()
    barrier = threading.Barrier(4, timeout=10)
    results = {}

    def worker(tid):
        def body():
            dev = tid % count
            torch.openreg.set_device(dev)
            s = torch.Stream(device=f"openreg:{dev}")
            torch.openreg.set_stream(s)
            barrier.wait()
            ok = True
            for _ in range(500):
                ok &= torch.openreg.current_device() == dev
                ok &= torch.openreg.current_stream(dev) == s
            barrier.wait()
            results[tid] = ok

        return body

    errors = run_threads([worker(i) for i in range(4)], timeout=20)
    assert not errors, errors
    assert results == {i: True for i in range(4)}
    assert torch.openreg.current_stream(0) == torch.openreg.default_stream(0)
