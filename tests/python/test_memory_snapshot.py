"""Memory history and snapshots in CUDA's format, read by PyTorch's own
viewer (torch.cuda._memory_viz needs no GPU)."""

import pickle
import subprocess
import sys

import pytest
import torch
from torch.cuda import _memory_viz

from _openreg_util import new_stream

history = torch.openreg.memory


@pytest.fixture
def recording():
    # Allocations below map new segments (and record segment_alloc) only if
    # no cached segment can serve them: give the cache back first, and ask
    # for sizes of 10 MiB and more, which get segments of their own.
    torch.openreg.empty_cache()
    history._record_memory_history(enabled="all", context="all", stacks="python", max_entries=10_000)
    yield
    history._record_memory_history(enabled=None)


def allocate_here(n: int) -> torch.Tensor:
    return torch.empty(n, dtype=torch.uint8, device="openreg:1")


def blocks_at(snapshot, address):
    return [b for seg in snapshot["segments"] for b in seg["blocks"] if b["address"] == address]


def test_snapshot_has_segments_blocks_and_trace(recording):
    x = allocate_here(3000)
    big = allocate_here((25 << 20) + 3)
    snap = history._snapshot()
    assert set(snap) >= {"segments", "device_traces"}
    assert len(snap["device_traces"]) == torch.openreg.device_count()

    (block,) = blocks_at(snap, x.data_ptr())
    assert block["state"] == "active_allocated"
    assert block["requested_size"] == 3000 and block["size"] == 3072
    assert any(f["name"] == "allocate_here" and f["filename"] == __file__ for f in block["frames"]), block["frames"]
    assert block["frames"][0]["line"] > 0

    seg = next(s for s in snap["segments"] if s["address"] <= x.data_ptr() < s["address"] + s["total_size"])
    assert seg["device"] == 1 and seg["segment_type"] == "small" and seg["total_size"] == 2 << 20
    assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
    assert seg["allocated_size"] == sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")
    large = next(s for s in snap["segments"] if s["address"] == big.data_ptr())
    assert large["segment_type"] == "large"

    trace = snap["device_traces"][1]
    allocs = [e for e in trace if e["action"] == "alloc" and e["addr"] == x.data_ptr()]
    assert allocs and allocs[-1]["size"] == 3072 and allocs[-1]["frames"]
    assert any(e["action"] == "segment_alloc" and e["addr"] == big.data_ptr() for e in trace)

    address = x.data_ptr()
    del x
    trace = history._snapshot()["device_traces"][1]
    actions = [e["action"] for e in trace if e.get("addr") == address]
    assert actions[-2:] == ["free_requested", "free_completed"], actions
    assert blocks_at(history._snapshot(), address)[0]["state"] == "inactive"
    del big
    torch.openreg.empty_cache()
    assert any(e["action"] == "segment_free" for e in history._snapshot()["device_traces"][1])


def test_pending_free_and_oom_are_recorded(recording):
    side = new_stream(1)
    x = allocate_here(4096)
    with torch.openreg.stream(side):
        torch.openreg._sleep(300)
    x.record_stream(side)
    address = x.data_ptr()
    del x
    (block,) = blocks_at(history._snapshot(), address)
    assert block["state"] == "active_awaiting_free"
    side.synchronize()
    with pytest.raises(torch.OutOfMemoryError):
        allocate_here(1 << 60)
    trace = history._snapshot()["device_traces"][1]
    oom = [e for e in trace if e["action"] == "oom"]
    assert oom and oom[-1]["size"] == 1 << 60 and oom[-1]["device_free"] > 0 and oom[-1]["frames"]


def test_bounded_trace_and_stopping(recording):
    history._record_memory_history(enabled="all", max_entries=5)
    tensors = [allocate_here(512) for _ in range(10)]
    assert len(history._snapshot()["device_traces"][1]) == 5
    del tensors
    history._record_memory_history(enabled=None)
    assert history._snapshot()["device_traces"] == [[] for _ in range(torch.openreg.device_count())]
    assert torch.openreg.memory_snapshot() == history._snapshot()["segments"]
    history._record_memory_history(enabled="state", context=None)
    y = allocate_here(100)
    assert history._snapshot()["device_traces"][1] == []
    assert blocks_at(history._snapshot(), y.data_ptr())[0]["frames"] == []


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="enabled"):
        history._record_memory_history(enabled="yes")
    with pytest.raises(ValueError, match="stacks"):
        history._record_memory_history(stacks="cpp")
    with pytest.raises(ValueError, match="max_entries"):
        history._record_memory_history(max_entries=0)
    with pytest.raises(ValueError, match="record_pinned_host_memory"):
        history._record_memory_history(record_pinned_host_memory=True)
    with pytest.raises(ValueError, match="mempool_id"):
        torch.openreg.memory_snapshot(mempool_id=(1, 0))


def test_memory_viz_renders_the_dumped_pickle(recording, tmp_path):
    x = allocate_here(5000)
    y = allocate_here(27 << 20)
    del x
    path = tmp_path / "snapshot.pickle"
    history._dump_snapshot(str(path))
    with open(path, "rb") as f:
        snap = pickle.load(f)

    # The text views and the flamegraph inputs (format_flamegraph would
    # download flamegraph.pl; the lines it is given are what matters).
    stats = _memory_viz.segsum(snap)
    assert "segments:" in stats and "total_reserved" in stats
    text = _memory_viz.trace(snap)
    assert "Device 1" in text and "cudaMalloc(" in text and "del " in text
    lines = _memory_viz.segments(snap, format_flamegraph=lambda s: s)
    assert "allocate_here" in lines and "active_allocated" in lines
    assert "allocate_here" in _memory_viz.memory(snap, format_flamegraph=lambda s: s)
    # The HTML views embed the pickle for PyTorch's MemoryViz.js.
    for html in (_memory_viz.trace_plot(snap), _memory_viz.segment_plot(snap)):
        assert html.startswith("\n<!DOCTYPE html>") and "snapshot.pickle" in html
    # The command-line tool, as a user would run it.
    out = tmp_path / "trace.html"
    subprocess.run(
        [sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", str(path), "-o", str(out)],
        check=True, timeout=120, capture_output=True,
    )
    assert "MemoryViz.js" in out.read_text()
    del y
