"""Events: versioned record/wait/query/synchronize, timing, waits across
devices and cross-device misuse, through torch.Event / torch.openreg.Event and
the device guard."""

import gc
import time

import pytest
import torch

from _openreg_util import busy, elapsed, new_stream


def test_event_construction():
    e = torch.Event(device="openreg", enable_timing=True)
    assert e.device.type == "openreg"
    e = torch.openreg.Event(enable_timing=True)
    assert isinstance(e, torch.Event) and e.device.type == "openreg"


def test_never_recorded_event_is_complete():
    e = torch.Event(device="openreg")
    assert e.query() is True
    assert elapsed(e.synchronize) < 0.1
    s = new_stream(0)
    e.wait(s)  # waiting for nothing queues nothing to wait for
    assert s.query() is True


def test_record_on_busy_stream_then_synchronize():
    s = new_stream(0)
    e = torch.Event(device="openreg")
    busy(s, 300)
    e.record(s)
    assert e.query() is False
    took = elapsed(e.synchronize)
    assert took >= 0.2
    assert e.query() is True


def test_record_on_idle_stream_is_complete_at_once():
    s = new_stream(0)
    e = torch.Event(device="openreg")
    e.record(s)
    assert e.query() is True


def test_record_uses_current_stream_by_default():
    s = new_stream(1)
    e = torch.openreg.Event()
    with torch.openreg.stream(s):
        torch.openreg._sleep(200)
        e.record()
    assert e.device == torch.device("openreg:1")
    assert e.query() is False
    s.synchronize()
    assert e.query() is True


def test_record_bumps_the_version():
    busy_stream, idle_stream = new_stream(0), new_stream(0)
    e = torch.Event(device="openreg")
    e.record(idle_stream)
    assert e.query() is True
    busy(busy_stream, 300)
    e.record(busy_stream)  # the new version is pending
    assert e.query() is False
    e.record(idle_stream)  # and a newer one on an idle stream is complete
    assert e.query() is True
    assert elapsed(e.synchronize) < 0.2  # synchronize waits for the current version only
    assert busy_stream.query() is False


def test_wait_blocks_stream_until_event_completes():
    a, b = new_stream(0), new_stream(0)
    e = torch.Event(device="openreg")
    busy(a, 300)
    e.record(a)
    t0 = time.perf_counter()
    e.wait(b)
    assert b.query() is False  # b waits for a's kernel
    b.synchronize()
    assert time.perf_counter() - t0 >= 0.25
    assert a.query() is True


def test_wait_captures_the_version_at_call_time():
    """stream A: sleep 300 ms, record e; stream B: wait e, record e2; then
    re-record e on an idle stream C. B must still wait for A's kernel."""
    a, b, c = new_stream(0), new_stream(0), new_stream(0)
    assert len({a.stream_id, b.stream_id, c.stream_id}) == 3
    e, e2 = torch.Event(device="openreg"), torch.Event(device="openreg")
    t0 = time.perf_counter()
    busy(a, 300)
    e.record(a)
    e.wait(b)
    e2.record(b)
    e.record(c)  # a later record must not move the earlier wait
    assert e.query() is True
    assert e2.query() is False
    e2.synchronize()
    assert time.perf_counter() - t0 >= 0.28
    assert a.query() is True


def test_a_later_wait_uses_the_new_version():
    a, b, c = new_stream(0), new_stream(0), new_stream(0)
    e = torch.Event(device="openreg")
    busy(a, 300)
    e.record(a)
    e.record(c)  # newer version, already complete
    e.wait(b)
    # b waits for the complete version on c, not for a's kernel.
    assert elapsed(b.synchronize) < 0.2
    assert a.query() is False


def test_wait_on_event_recorded_on_same_stream():
    s = new_stream(0)
    e = torch.Event(device="openreg")
    busy(s, 100)
    e.record(s)
    e.wait(s)  # stream order already guarantees it; must not deadlock
    busy(s, 50)
    took = elapsed(s.synchronize)
    assert took < 5
    assert s.query() is True and e.query() is True


def test_stream_record_event_and_wait_event():
    a, b = new_stream(1), new_stream(1)
    busy(a, 250)
    e = a.record_event()
    assert isinstance(e, torch.Event) and e.device == torch.device("openreg:1")
    b.wait_event(e)
    t0 = time.perf_counter()
    b.synchronize()
    assert time.perf_counter() - t0 >= 0.15


def test_elapsed_time_measures_the_kernel_between():
    s = new_stream(0)
    start = torch.Event(device="openreg", enable_timing=True)
    end = torch.Event(device="openreg", enable_timing=True)
    with torch.openreg.stream(s):
        torch.openreg._sleep(50)
        start.record()
        torch.openreg._sleep(200)
        end.record()
    end.synchronize()
    ms = start.elapsed_time(end)
    assert 190 <= ms <= 350, ms
    assert end.elapsed_time(start) == pytest.approx(-ms, abs=1e-3)


def test_elapsed_time_with_idle_start():
    s = new_stream(1)
    start = torch.Event(device="openreg", enable_timing=True)
    end = torch.Event(device="openreg", enable_timing=True)
    start.record(s)  # idle stream: reached now
    busy(s, 120)
    end.record(s)
    end.synchronize()
    assert 110 <= start.elapsed_time(end) <= 270


def test_openreg_event_elapsed_time():
    s = new_stream(1)
    start, end = torch.openreg.Event(enable_timing=True), torch.openreg.Event(enable_timing=True)
    start.record(s)
    busy(s, 120)
    end.record(s)
    end.synchronize()
    assert 110 <= start.elapsed_time(end) <= 270


def test_openreg_event_record_wait_query():
    a, b = new_stream(0), new_stream(0)
    e = torch.openreg.Event()
    busy(a, 200)
    e.record(a)
    assert e.query() is False
    b.wait_event(e)
    assert b.query() is False
    b.synchronize()
    assert e.query() is True and a.query() is True


def test_elapsed_time_uses_current_versions():
    s = new_stream(0)
    start = torch.Event(device="openreg", enable_timing=True)
    end = torch.Event(device="openreg", enable_timing=True)
    start.record(s)
    busy(s, 100)
    end.record(s)
    end.synchronize()
    first = start.elapsed_time(end)
    start.record(s)  # re-recorded: now after the first kernel
    busy(s, 150)
    end.record(s)
    end.synchronize()
    second = start.elapsed_time(end)
    assert 90 <= first <= 250
    assert 140 <= second <= 300


def test_elapsed_time_requires_timing_events():
    s = new_stream(0)
    plain = torch.Event(device="openreg")
    timed = torch.Event(device="openreg", enable_timing=True)
    plain.record(s)
    timed.record(s)
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):
        plain.elapsed_time(timed)
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):
        timed.elapsed_time(plain)


def test_elapsed_time_requires_recorded_events():
    s = new_stream(0)
    recorded = torch.Event(device="openreg", enable_timing=True)
    recorded.record(s)
    never = torch.Event(device="openreg", enable_timing=True)
    with pytest.raises((RuntimeError, ValueError), match="recorded"):
        recorded.elapsed_time(never)
    with pytest.raises((RuntimeError, ValueError), match="recorded"):
        never.elapsed_time(recorded)


def test_elapsed_time_requires_completed_events():
    s = new_stream(0)
    start = torch.Event(device="openreg", enable_timing=True)
    end = torch.Event(device="openreg", enable_timing=True)
    start.record(s)
    busy(s, 200)
    end.record(s)
    with pytest.raises(RuntimeError, match="complete"):
        start.elapsed_time(end)
    end.synchronize()
    assert start.elapsed_time(end) > 0


def _slow_fill_on(stream: torch.Stream, value: float) -> torch.Tensor:
    """A tensor of ``stream``'s device that ``stream`` fills with ``value``
    only after a 150 ms kernel."""
    x = torch.zeros(1024, device=stream.device)
    torch.openreg.synchronize(stream.device_index)  # the zeros are in place
    with torch.openreg.stream(stream):
        torch.openreg._sleep(150)
        x.fill_(value)
    return x


def _read_on(stream: torch.Stream, x: torch.Tensor) -> torch.Tensor:
    """Copies ``x`` to ``stream``'s device with ``stream`` current there: the
    copy runs after the work ``stream`` had queued (Note [Copies])."""
    with torch.openreg.stream(stream):
        return x.to(stream.device)


# Pipeline parallelism: a stream of one device waits for a stream of another,
# as cudaStreamWaitEvent allows (the event may be of another device).
_CROSS_DEVICE_WAITS = {
    "Stream.wait_stream": lambda s1, s0: s1.wait_stream(s0),
    "openreg.Stream.wait_stream": lambda s1, s0: torch.openreg.Stream._wrap(s1).wait_stream(s0),
    "Event.wait": lambda s1, s0: _recorded(s0).wait(s1),
    "openreg.Event.wait": lambda s1, s0: _recorded(s0, torch.openreg.Event()).wait(s1),
    "Stream.wait_event": lambda s1, s0: s1.wait_event(_recorded(s0)),
    "openreg.Stream.wait_event": lambda s1, s0: torch.openreg.Stream._wrap(s1).wait_event(_recorded(s0)),
}


def _recorded(stream: torch.Stream, event: torch.Event | None = None) -> torch.Event:
    event = event if event is not None else torch.Event(device="openreg")
    event.record(stream)
    assert event.device == stream.device
    return event


@pytest.mark.parametrize("how", sorted(_CROSS_DEVICE_WAITS))
@pytest.mark.parametrize("src, dst", [(0, 1), (1, 0)])
def test_a_stream_waits_for_a_stream_of_another_device(how, src, dst):
    s_src, s_dst = new_stream(src), new_stream(dst)
    x = _slow_fill_on(s_src, 7.0)
    _CROSS_DEVICE_WAITS[how](s_dst, s_src)
    assert s_dst.query() is False  # the wait is queued on the other device's stream
    y = _read_on(s_dst, x)
    assert y.device == torch.device("openreg", dst)
    s_dst.synchronize()
    assert s_src.query() is True
    assert torch.equal(y.cpu(), torch.full((1024,), 7.0)), "the copy ran before the other device's fill"


def test_a_cross_device_wait_waits_for_the_version_current_at_the_call():
    s0, s1 = new_stream(0), new_stream(1)
    x = _slow_fill_on(s0, 3.0)
    e = _recorded(s0)
    e.wait(s1)
    e.record(new_stream(0))  # a later version, complete at once
    assert e.query() is True
    y = _read_on(s1, x)
    s1.synchronize()  # the copy is asynchronous, as on CUDA
    assert torch.equal(y.cpu(), torch.full((1024,), 3.0))


def test_waiting_on_an_event_of_another_device_keeps_its_device():
    e = _recorded(new_stream(0))
    s1 = new_stream(1)
    e.wait(s1)
    s1.wait_event(e)
    assert e.device == torch.device("openreg:0")
    e.synchronize()
    s1.synchronize()
    assert e.query() and s1.query()


def test_record_event_of_device0_on_stream_of_device1_raises():
    e = torch.Event(device="openreg")
    s0 = new_stream(0)
    busy(s0, 100)
    e.record(s0)
    with pytest.raises(RuntimeError, match=r"device 0") as info:
        e.record(new_stream(1))
    assert "device 1" in str(info.value)
    # the event is unchanged: still its device-0 version
    assert e.device == torch.device("openreg:0")
    e.synchronize()
    assert e.query() is True


def test_destroying_events_with_pending_work_is_safe():
    s, t = new_stream(0), new_stream(0)
    busy(s, 300)
    for _ in range(20):
        e = torch.Event(device="openreg", enable_timing=True)
        e.record(s)
        e.wait(t)
        del e  # destroyEvent while s has not reached it and t waits for it
    assert t.query() is False
    gc.collect()
    t.synchronize()
    s.synchronize()
    assert s.query() and t.query()
