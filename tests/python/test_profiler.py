"""torch.profiler on openreg: the Kineto activity profiler registered for
PrivateUse1 (cpp/frontends/profiler.cpp) records each kernel where it runs (Note
[Profiler activities] in src/runtime/profiler.rs), links it to the op that launched
it, and puts each openreg stream on its own row of the trace."""

import json
import time

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

DEV = "openreg"
BOTH = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def _kernels(trace_path):
    with open(trace_path) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    rows = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    return events, kernels, rows


def test_ops_get_device_time_and_no_time_is_negative():
    """key_averages() charges each kernel's time to the op that launched it;
    no duration is negative, the record_function range is there."""
    x = torch.randn(256, 256, device=DEV)
    with profile(activities=BOTH) as p:
        with record_function("my_range"):
            for _ in range(3):
                (x @ x + 1).relu()
        torch.openreg.synchronize()
    averages = {e.key: e for e in p.key_averages()}
    assert "my_range" in averages
    for op in ("aten::mm", "aten::add", "aten::relu"):
        assert averages[op].self_device_time_total > 0, op
    assert all(e.self_device_time_total >= 0 and e.cpu_time_total >= 0 for e in p.key_averages())
    assert all(evt.time_range.elapsed_us() >= 0 for evt in p.events())


def test_queued_work_is_timed_where_it_runs(tmp_path):
    """A 30 ms kernel queued on a busy stream is recorded with its own
    duration, on the row of its stream, not the launch's few microseconds."""
    s = torch.Stream(device=DEV)
    with profile(activities=BOTH) as p:
        with s:
            torch.openreg._sleep(30)
            y = torch.ones(1000, device=DEV) * 3
        torch.openreg.synchronize()
    path = tmp_path / "trace.json"
    p.export_chrome_trace(str(path))
    _, kernels, rows = _kernels(path)
    sleeps = [k for k in kernels if k["name"] == "torch.openreg._sleep"]
    assert sleeps and sleeps[0]["dur"] >= 29_000, sleeps
    assert sleeps[0]["args"]["stream"] == s.stream_id
    assert rows[(sleeps[0]["pid"], sleeps[0]["tid"])] == f"openreg:0 stream {s.stream_id}"
    muls = [k for k in kernels if k["name"] == "aten::mul"]
    assert muls and muls[0]["ts"] >= sleeps[0]["ts"] + sleeps[0]["dur"] - 1, "the queued mul ran before the sleep ended"
    assert torch.equal(y.cpu(), torch.full((1000,), 3.0))


def test_trace_json_parses_with_a_row_per_stream(tmp_path):
    """export_chrome_trace() gives JSON with openreg kernels on one row per
    stream used, each row named after its device and stream."""
    s1, s2 = torch.Stream(device=DEV), torch.Stream(device=DEV)
    x = torch.randn(64, 64, device=DEV)
    with profile(activities=BOTH) as p:
        for s in (s1, s2):
            with s:
                x @ x
        torch.openreg.synchronize()
    path = tmp_path / "trace.json"
    p.export_chrome_trace(str(path))
    _, kernels, rows = _kernels(path)
    streams = {k["args"]["stream"] for k in kernels if k["name"] == "aten::mm"}
    assert streams == {s1.stream_id, s2.stream_id}
    names = {rows[(k["pid"], k["tid"])] for k in kernels if k["name"] == "aten::mm"}
    assert names == {f"openreg:0 stream {s.stream_id}" for s in (s1, s2)}
    assert all(k["dur"] >= 0 for k in kernels)


def test_graph_replay_is_one_activity():
    """A replayed graph shows as one kernel of the replaying stream."""
    x = torch.zeros(100, device=DEV)
    s, g = torch.Stream(device=DEV), torch.accelerator.Graph()
    with s, g:
        for _ in range(10):
            x.add_(1)
    with profile(activities=BOTH) as p:
        g.replay()
        torch.openreg.synchronize()
    replays = [e for e in p.events() if e.name.startswith("graph replay")]
    assert len(replays) == 1 and replays[0].name == "graph replay (10 nodes)"
    assert torch.equal(x.cpu(), torch.full((100,), 10.0))


def test_cpu_only_profiling_records_no_device_activity():
    """Without ProfilerActivity.PrivateUse1 the runtime records nothing."""
    x = torch.randn(64, 64, device=DEV)
    with profile(activities=[ProfilerActivity.CPU]) as p:
        x @ x
        torch.openreg.synchronize()
    assert all(e.self_device_time_total == 0 for e in p.key_averages())


# ------------------------------------------- the legacy autograd profiler


def _profiled_matmuls(**profiler_kwargs):
    """Three `x @ x` and a record_function range around a 30 ms kernel,
    under torch.autograd.profiler.profile; returns the profile and its wall
    time in microseconds."""
    x = torch.randn(128, 128, device=DEV)
    torch.openreg.synchronize()
    started = time.perf_counter()
    with torch.autograd.profiler.profile(**profiler_kwargs) as p:
        for _ in range(3):
            x @ x
        with record_function("sleeping_range"):
            torch.openreg._sleep(30)
            torch.openreg.synchronize()
    return p, (time.perf_counter() - started) * 1e6


def _assert_sane_times(p, wall_us):
    """No time is negative or longer than the whole profile (a garbage start
    time shows as about -4e16). A key's totals add up its nested calls
    (aten::matmul's include its aten::mm). No op's own device time is
    negative: an op's device time is never counted twice, once by device
    events and again by kernel activities, which would exceed the time of
    the op around it (cpp/frontends/profiler.cpp)."""
    for e in p.key_averages():
        for value in (e.cpu_time_total, e.self_cpu_time_total, e.device_time_total, e.self_device_time_total):
            assert 0 <= value <= wall_us * 3, (e.key, value)
    events = p.function_events if isinstance(p, torch.autograd.profiler.profile) else p.events()
    for e in events:
        assert 0 <= e.time_range.elapsed_us() <= wall_us, (e.name, e.time_range)
        assert 0 <= e.device_time_total <= wall_us * 2, (e.name, e.device_time_total)
        assert e.self_device_time_total >= 0, (e.name, e.self_device_time_total)


def test_legacy_profiler_with_use_device_times_ops_on_the_device():
    """use_device="openreg" without Kineto is the profiler's PrivateUse1
    fallback mode: each op is timed by device events through the stubs
    openreg registers (Note [Legacy profiler device timing] in
    cpp/frontends/profiler_stubs.cpp). Without them every op's CPU time was
    garbage."""
    p, wall_us = _profiled_matmuls(use_device="openreg")
    _assert_sane_times(p, wall_us)
    averages = {e.key: e for e in p.key_averages()}
    assert averages["aten::mm"].count >= 3
    assert averages["aten::mm"].device_time_total > 0
    # Device time is stream time: the range waited on the stream for its
    # 30 ms kernel; no matmul did (each is far shorter, even on a loaded
    # machine, where the three together may pass 30 ms).
    assert averages["sleeping_range"].device_time_total >= 29_000
    matmul = averages["aten::matmul"]
    assert matmul.device_time_total / matmul.count < 29_000


@pytest.mark.parametrize(
    "profiler_kwargs",
    [
        pytest.param({"use_device": "openreg", "use_kineto": True}, id="kineto-activities"),
        pytest.param({}, id="cpu-only"),
    ],
)
def test_legacy_profiler_other_modes_have_sane_times(profiler_kwargs):
    p, wall_us = _profiled_matmuls(**profiler_kwargs)
    _assert_sane_times(p, wall_us)


def test_torch_profiler_device_only_has_sane_times():
    x = torch.randn(128, 128, device=DEV)
    started = time.perf_counter()
    with profile(activities=[ProfilerActivity.PrivateUse1]) as p:
        for _ in range(3):
            x @ x
        torch.openreg.synchronize()
    _assert_sane_times(p, (time.perf_counter() - started) * 1e6)
    assert sum(e.self_device_time_total for e in p.key_averages()) > 0
