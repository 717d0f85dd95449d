"""Memory history and snapshots, as ``torch.cuda.memory`` offers them.

The caching allocator in the Rust runtime records events and the stacks
that caused them (Note [Memory history] in src/memory/history.rs); a snapshot
has CUDA's structure, so PyTorch's own tools read it: ``python -m
torch.cuda._memory_viz trace_plot snapshot.pickle -o trace.html``, or the
viewer at https://pytorch.org/memory_viz.
"""

from __future__ import annotations

import json
import pickle
import sys
from typing import Any

from torch_openreg import _C

from ._device import _valid_index

_ENABLED = (None, "state", "all")
_CONTEXT = (None, "state", "alloc", "all")
_STACKS = ("python", "all")


def _record_memory_history(
    enabled: str | None = "all",
    context: str | None = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    device: Any = None,
    clear_history: bool = False,
    compile_context: bool = False,
    global_record_annotations: bool = False,
    skip_actions: list[str] | None = None,
    record_pinned_host_memory: bool = False,
    record_cuda: bool = True,
) -> None:
    """Start (or with ``enabled=None`` stop) recording allocator history on
    every openreg device.

    ``enabled``: ``"all"`` keeps a trace of the last ``max_entries`` events
    per device (alloc, free_requested, free_completed, segment_alloc,
    segment_free, oom) besides the stacks of live blocks (``"state"``).
    ``context``: whose stacks are recorded (``"state"``/``"alloc"``:
    allocations; ``"all"``: frees too; ``None``: none). ``stacks``: the
    calling thread's Python frames for both ``"python"`` and ``"all"`` (the
    runtime records no C++ frames). Stopping drops what was recorded. The
    options of PyTorch's CUDA allocator that have no openreg meaning are
    accepted at their defaults and rejected otherwise.
    """
    if enabled not in _ENABLED:
        raise ValueError(f"_record_memory_history: enabled must be one of {_ENABLED}, got {enabled!r}")
    if context not in _CONTEXT:
        raise ValueError(f"_record_memory_history: context must be one of {_CONTEXT}, got {context!r}")
    if stacks not in _STACKS:
        raise ValueError(f"_record_memory_history: stacks must be one of {_STACKS}, got {stacks!r}")
    if not isinstance(max_entries, int) or isinstance(max_entries, bool) or max_entries < 1:
        raise ValueError(f"_record_memory_history: max_entries must be a positive int, got {max_entries!r}")
    unsupported = {
        "compile_context": compile_context is not False,
        "global_record_annotations": global_record_annotations is not False,
        "skip_actions": bool(skip_actions),
        "record_pinned_host_memory": record_pinned_host_memory is not False,
        "record_cuda": record_cuda is not True,
    }
    named = [name for name, given in unsupported.items() if given]
    if named:
        raise ValueError(f"_record_memory_history: openreg does not support {', '.join(named)}")
    if device is not None:
        _valid_index(device)  # history covers every device; a bad one is still an error
    stack_level = {None: 0, "state": 1, "alloc": 1, "all": 2}[context]
    max_entries = min(max_entries, 2**63 - 1)
    if clear_history or enabled is None:
        _C._record_memory_history(False, False, 0, 1)
    if enabled is not None:
        _C._record_memory_history(True, enabled == "all", stack_level, max_entries)


def _frames(text: str | None) -> list[dict[str, Any]]:
    frames = []
    for line in (text or "").splitlines():
        filename, lineno, name = line.split("\t", 2)
        frames.append({"filename": filename, "line": int(lineno), "name": name})
    return frames


def _snapshot(device: Any = None, augment_with_fx_traces: bool = False) -> dict[str, Any]:
    """The allocator state of every openreg device and the recorded events,
    with CUDA's structure: ``{"segments": [...], "device_traces": [[...],
    ...]}`` (see ``torch.cuda.memory._snapshot``). ``device`` is accepted for
    compatibility: as on CUDA, the snapshot covers every device."""
    if augment_with_fx_traces:
        raise ValueError("_snapshot: openreg does not support augment_with_fx_traces")
    if device is not None:
        _valid_index(device)
    data = json.loads(_C._memory_snapshot())
    for segment in data["segments"]:
        segment["segment_pool_id"] = (0, 0)
        segment["frames"] = []
        for block in segment["blocks"]:
            block["frames"] = _frames(block["frames"])
    for trace in data["device_traces"]:
        for entry in trace:
            entry["frames"] = _frames(entry["frames"])
            if entry["action"] != "oom":
                del entry["device_free"]
    data["allocator_settings"] = {}
    data["external_annotations"] = []
    return data


def _dump_snapshot(filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False) -> None:
    """Pickles ``_snapshot()`` to ``filename``, for ``torch.cuda._memory_viz``
    or https://pytorch.org/memory_viz."""
    snapshot = _snapshot(augment_with_fx_traces=augment_with_fx_traces)
    with open(filename, "wb") as f:
        pickle.dump(snapshot, f)


def memory_snapshot(mempool_id: Any = None, include_traces: bool = True) -> list[dict[str, Any]]:
    """The segments of every device's allocator (``_snapshot()["segments"]``);
    without ``include_traces``, blocks carry no stacks."""
    if mempool_id is not None:
        raise ValueError("memory_snapshot: openreg has no private memory pools (mempool_id must be None)")
    segments = _snapshot()["segments"]
    if not include_traces:
        for segment in segments:
            for block in segment["blocks"]:
                block["frames"] = []
    return segments
