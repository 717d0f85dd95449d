"""Streams: pools and priorities, asynchronous in-order execution, query and
synchronize, per-thread current streams, native handles, idle workers."""

import threading
import time

import pytest
import torch

from torch_openreg import _C
from _openreg_util import best_of, busy, clean_env, elapsed, new_stream, script

POOL_SIZE = 32

# Idle stream workers exit after OPENREG_WORKER_IDLE_MS: touch 40 streams
# with work, wait, and count worker threads.
IDLE_WORKERS = script(
    "idle_workers",
    """
    import torch, torch_openreg
    from torch_openreg import _C
    threads = lambda: len(os.listdir("/proc/self/task"))
    live = lambda: [_C._live_worker_count(0), _C._live_worker_count(1)]
    RESULT["idle_ms"] = torch.openreg.options()["OPENREG_WORKER_IDLE_MS"]["value"]
    torch.openreg.init()
    RESULT["live_before"] = live()
    baseline = threads()
    RESULT["baseline"] = baseline
    streams = [torch.Stream(device=f"openreg:{d}", priority=p) for d in (0, 1) for p in (0, -1) for _ in range(10)]
    RESULT["distinct"] = len({(s.device_index, s.stream_id) for s in streams})
    for s in streams:
        with torch.openreg.stream(s):
            torch.openreg._sleep(100)
    RESULT["live_busy"] = live()
    RESULT["threads_busy"] = threads()
    for s in streams:
        s.synchronize()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (live() != [0, 0] or threads() > baseline + 1):
        time.sleep(0.02)
    RESULT["live_after"] = live()
    RESULT["threads_after"] = threads()
    # A stream whose worker exited still runs new work (a new worker starts).
    s = streams[0]
    with torch.openreg.stream(s):
        torch.openreg._sleep(50)
    RESULT["query_restart"] = s.query()
    s.synchronize()
    RESULT["query_restart_done"] = s.query()
    done(RESULT)
    """,
    env=clean_env(OPENREG_WORKER_IDLE_MS="50"),
)


# OPENREG_STREAM_POOL_SIZE=4: pools of 4 streams, ids 1..4 (priority 0) and
# 5..8 (priority -1); the fifth stream of a pool is its first again, and ids
# past 8 name no stream (Note [StreamId assignment]).
POOL_OF_4 = script(
    "stream_pool_size=4",
    """
    import torch, torch_openreg
    opt = torch.openreg.options()["OPENREG_STREAM_POOL_SIZE"]
    RESULT["option"] = [opt["value"], opt["source"]]
    RESULT["low"] = [torch.Stream(device="openreg:0", priority=0).stream_id for _ in range(5)]
    RESULT["high"] = [torch.Stream(device="openreg:1", priority=-1).stream_id for _ in range(5)]
    by_id = lambda i: torch.Stream(stream_id=i, device_index=0, device_type=torch.openreg.default_stream(0).device_type)
    last = by_id(8)
    with torch.openreg.stream(last):
        torch.openreg._sleep(20)
        RESULT["on_last"] = torch.ones(3, device="openreg").sum().item()
    last.synchronize()
    RESULT["last_query"] = last.query()
    RESULT["bad"] = [error_of(lambda: by_id(9).query()), error_of(lambda: torch.openreg.set_stream(by_id(100)))]
    RESULT["current_after"] = torch.openreg.current_stream(0).stream_id
    done(RESULT)
    """,
    env=clean_env(OPENREG_STREAM_POOL_SIZE="4"),
)


@pytest.mark.subprocess
def test_stream_pool_size_option():
    data = POOL_OF_4.result().check_ok()
    assert data["option"] == ["4", "environment"]
    assert data["low"] == [1, 2, 3, 4, 1]
    assert data["high"] == [5, 6, 7, 8, 5]
    assert data["on_last"] == 3 and data["last_query"] is True
    for error, stream_id in zip(data["bad"], (9, 100)):
        assert error.startswith(f"RuntimeError: stream id {stream_id} is not an openreg stream of device 0"), error
        assert "valid ids are 0..=8" in error and "OPENREG_STREAM_POOL_SIZE=4" in error, error
    assert data["current_after"] == 0


def test_pool_size_is_the_default_32():
    opt = torch.openreg.options()["OPENREG_STREAM_POOL_SIZE"]
    assert (opt["value"], opt["source"]) == (str(POOL_SIZE), "default")


def test_priority_range():
    least, greatest = torch.openreg.stream_priority_range()
    assert (least, greatest) == _C._stream_priority_range()
    # Lower numbers are higher priorities; at least two priorities.
    assert least - greatest >= 1
    assert least == 0


def _ids(device, priority, n):
    return [new_stream(device, priority).stream_id for _ in range(n)]


def test_pool_is_round_robin_and_wraps_after_32():
    for priority in (0, -1):
        streams = [torch.Stream(device="openreg:1", priority=priority) for _ in range(POOL_SIZE + 1)]
        ids = [s.stream_id for s in streams]
        assert len(set(ids[:POOL_SIZE])) == POOL_SIZE, ids
        assert ids[POOL_SIZE] == ids[0], ids
        assert all(s.device == torch.device("openreg:1") for s in streams)
        assert 0 not in ids  # the default stream is not in the pools


def test_priorities_have_separate_pools_and_clamp():
    least, greatest = torch.openreg.stream_priority_range()
    low = set(_ids(0, least, POOL_SIZE))
    high = set(_ids(0, greatest, POOL_SIZE))
    assert len(low) == len(high) == POOL_SIZE
    assert not low & high
    # Out-of-range priorities are clamped into the range.
    assert set(_ids(0, greatest - 100, 5)) <= high
    assert set(_ids(0, least + 100, 5)) <= low
    assert set(torch.openreg.Stream(priority=greatest - 3).stream_id for _ in range(3)) <= high


def test_openreg_stream_constructor():
    s = torch.openreg.Stream(device=1)
    assert isinstance(s, torch.Stream)
    assert s.device == torch.device("openreg:1") and s.stream_id != 0
    s = torch.openreg.Stream(device="openreg:0", priority=-1)
    assert s.device == torch.device("openreg:0")
    with torch.openreg.device(1):
        assert torch.openreg.Stream().device_index == 1


def test_default_and_current_stream():
    for index in (0, 1):
        d = torch.openreg.default_stream(index)
        assert d.stream_id == 0 and d.device_index == index and d.device.type == "openreg"
        assert torch.openreg.current_stream(index) == d
        assert torch.accelerator.current_stream(index) == d
    torch.openreg.set_device(1)
    assert torch.openreg.current_stream().device_index == 1
    assert torch.openreg.default_stream().device_index == 1


def test_sleep_is_asynchronous_and_query_tracks_it():
    s = new_stream(0)
    assert s.query() is True
    took = elapsed(lambda: busy(s, 300))
    assert took < 0.15, f"_sleep blocked the host for {took:.3f}s"
    assert s.query() is False
    took = elapsed(s.synchronize)
    assert took >= 0.2
    assert s.query() is True


def test_query_false_while_last_kernel_runs_with_empty_queue():
    s = new_stream(0)
    t0 = time.perf_counter()
    busy(s, 400)
    time.sleep(0.15)  # the worker has dequeued the only kernel and is running it
    assert s.query() is False
    s.synchronize()
    assert time.perf_counter() - t0 >= 0.38
    assert s.query() is True


def test_synchronize_waits_for_all_submitted_work():
    s = new_stream(1)
    t0 = time.perf_counter()
    busy(s, 150)
    busy(s, 150)
    s.synchronize()
    assert time.perf_counter() - t0 >= 0.28
    assert s.query() is True


def _two_kernels(a, b, ms=200):
    def measure():
        t0 = time.perf_counter()
        busy(a, ms)
        busy(b, ms)
        a.synchronize()
        b.synchronize()
        return time.perf_counter() - t0

    return measure


def test_different_streams_run_concurrently():
    a, b = new_stream(0), new_stream(0)
    assert a.stream_id != b.stream_id
    took = best_of(3, _two_kernels(a, b))
    assert 0.19 <= took < 0.33, f"two 200 ms kernels on two streams took {took:.3f}s"


def test_streams_of_different_devices_run_concurrently():
    took = best_of(3, _two_kernels(new_stream(0), new_stream(1)))
    assert 0.19 <= took < 0.33, f"two 200 ms kernels on two devices took {took:.3f}s"


def test_one_stream_runs_kernels_one_after_another():
    s = new_stream(0)
    took = _two_kernels(s, s)()
    assert took >= 0.39


def test_work_on_one_stream_runs_in_order():
    s = new_stream(0)
    first = torch.Event(device="openreg")
    t0 = time.perf_counter()
    with torch.openreg.stream(s):
        torch.openreg._sleep(150)
        first.record()
        torch.openreg._sleep(150)
        torch.openreg._sleep(150)
    # The marker after the first kernel completes before the rest of the stream.
    first.synchronize()
    assert time.perf_counter() - t0 >= 0.14
    assert s.query() is False  # 300 ms of kernels are still to run
    s.synchronize()
    assert time.perf_counter() - t0 >= 0.44


def test_default_stream_runs_work_too():
    d = torch.openreg.default_stream(0)
    took = elapsed(lambda: torch.openreg._sleep(200))  # current stream = default
    assert took < 0.15
    assert d.query() is False
    d.synchronize()
    assert d.query() is True


def test_stream_wait_stream():
    a, b = new_stream(0), new_stream(0)
    busy(a, 300)
    t0 = time.perf_counter()
    b.wait_stream(a)
    assert b.query() is False  # b now waits for a's kernel
    b.synchronize()
    assert time.perf_counter() - t0 >= 0.25


def test_set_stream_makes_stream_current_for_its_device():
    s0, s1 = new_stream(0), new_stream(1)
    torch.openreg.set_stream(s1)
    assert torch.openreg.current_stream(1) == s1
    assert torch.openreg.current_stream(0) == torch.openreg.default_stream(0)
    torch.openreg.set_stream(s0)
    assert torch.openreg.current_stream(0) == s0
    assert torch.openreg.current_stream(1) == s1
    # _sleep goes to the current stream of the current device.
    torch.openreg.set_device(1)
    torch.openreg._sleep(200)
    assert s1.query() is False and s0.query() is True
    s1.synchronize()


def test_accelerator_current_and_set_stream():
    s1 = new_stream(1)
    torch.accelerator.set_stream(s1)
    assert torch.accelerator.current_stream(1) == s1
    assert torch.accelerator.current_stream(torch.device("openreg:1")) == s1
    assert torch.accelerator.current_stream(0) == torch.openreg.default_stream(0)


def test_exchange_stream_keeps_other_devices_streams():
    s0 = new_stream(0)
    torch.openreg.set_stream(s0)
    for _ in range(3):
        torch.openreg.set_stream(new_stream(1))
        assert torch.openreg.current_stream(0) == s0


def test_set_stream_makes_its_device_current_like_cuda():
    # torch.cuda.set_stream switches to the stream's device; so does ours.
    torch.openreg.set_device(0)
    s1 = new_stream(1)
    torch.openreg.set_stream(s1)
    assert torch.openreg.current_stream(1) == s1
    assert torch.openreg.current_device() == 1


def test_stream_context_manager_restores_streams_on_both_devices():
    a0, b1, s1 = new_stream(0), new_stream(1), new_stream(1)
    torch.openreg.set_stream(b1)
    torch.openreg.set_stream(a0)
    torch.openreg.set_device(0)
    with torch.openreg.stream(s1) as entered:
        assert entered is s1
        assert torch.openreg.current_device() == 1
        assert torch.openreg.current_stream() == s1
        assert torch.openreg.current_stream(0) == a0
        torch.openreg._sleep(150)
    assert s1.query() is False  # the kernel went to s1
    assert torch.openreg.current_device() == 0
    assert torch.openreg.current_stream(0) == a0
    assert torch.openreg.current_stream(1) == b1
    s1.synchronize()

    with torch.openreg.stream(None) as entered:  # no-op
        assert entered is None
        assert torch.openreg.current_stream(0) == a0
    assert torch.openreg.current_device() == 0


def test_stream_context_manager_restores_on_exception():
    s1 = new_stream(1)
    with pytest.raises(KeyError):
        with torch.openreg.stream(s1):
            raise KeyError("inside")
    assert torch.openreg.current_device() == 0
    assert torch.openreg.current_stream(1) == torch.openreg.default_stream(1)


def test_current_stream_is_per_thread_per_device():
    main0, main1 = new_stream(0), new_stream(1)
    torch.openreg.set_stream(main1)
    torch.openreg.set_stream(main0)
    barrier = threading.Barrier(2, timeout=10)
    seen = {}

    def other_thread():
        # A new thread starts on each device's default stream.
        seen["initial"] = [torch.openreg.current_stream(i).stream_id for i in (0, 1)]
        mine0, mine1 = new_stream(0), new_stream(1)
        torch.openreg.set_stream(mine1)
        torch.openreg.set_stream(mine0)
        barrier.wait()  # main checks its own streams now
        barrier.wait()
        seen["mine"] = (torch.openreg.current_stream(0) == mine0, torch.openreg.current_stream(1) == mine1)

    t = threading.Thread(target=other_thread, daemon=True)
    t.start()
    barrier.wait()
    assert torch.openreg.current_stream(0) == main0
    assert torch.openreg.current_stream(1) == main1
    barrier.wait()
    t.join(10)
    assert not t.is_alive()
    assert seen["initial"] == [0, 0]
    assert seen["mine"] == (True, True)


def test_native_handle_stable_and_distinct():
    a, b = new_stream(0), new_stream(0)
    h = a.native_handle
    assert isinstance(h, int) and h != 0
    assert a.native_handle == h
    rewrapped = torch.Stream(stream_id=a.stream_id, device_index=0, device_type=a.device_type)
    assert rewrapped.native_handle == h
    busy(a, 20)
    assert a.native_handle == h  # stable across use
    a.synchronize()
    handles = {
        h,
        b.native_handle,
        torch.openreg.default_stream(0).native_handle,
        torch.openreg.default_stream(1).native_handle,
        torch.Stream(stream_id=a.stream_id, device_index=1, device_type=a.device_type).native_handle,
    }
    assert len(handles) == 5


def test_stream_equality_and_hash():
    a = new_stream(0)
    same = torch.Stream(stream_id=a.stream_id, device_index=0, device_type=a.device_type)
    assert a == same and hash(a) == hash(same)
    assert a != torch.openreg.default_stream(0)


@pytest.mark.subprocess
def test_idle_workers_exit():
    data = IDLE_WORKERS.result().check_ok()
    assert data["idle_ms"] == "50"
    assert data["distinct"] == 40
    assert data["live_before"] == [0, 0]
    assert data["live_busy"][0] > 0 and data["live_busy"][1] > 0
    assert data["threads_busy"] > data["baseline"]
    assert data["live_after"] == [0, 0], data
    assert data["threads_after"] <= data["baseline"] + 1, data
    assert data["query_restart"] is False and data["query_restart_done"] is True
