"""torch.cuda parity: every torch.cuda name a device-agnostic program may
use is on torch.openreg with CUDA's parameters, or listed in the table of
deliberate absences of docs/devices-and-streams.md (and really absent); plus
the behaviour of the device-management functions beyond the basics."""

import inspect
import os
import re
import types
import uuid

import pytest
import torch

from _openreg_util import busy, new_stream

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "devices-and-streams.md")


def cuda_names() -> set[str]:
    """The public names of dir(torch.cuda) that belong to torch.cuda: its
    __all__, and functions, classes and submodules defined there (not the
    helpers it imports, such as os or typing names)."""
    names = set()
    for name in dir(torch.cuda):
        if name.startswith("_"):
            continue
        obj = getattr(torch.cuda, name)
        if name in torch.cuda.__all__:
            names.add(name)
        elif isinstance(obj, types.ModuleType):
            if obj.__name__.startswith("torch.cuda."):
                names.add(name)
        elif callable(obj) and str(getattr(obj, "__module__", "")).startswith("torch.cuda"):
            names.add(name)
    return names


def readme_absent() -> dict[str, str]:
    """name -> reason, from docs/devices-and-streams.md's table of what torch.openreg lacks."""
    text = open(DOC).read()
    start = text.index("What `torch.cuda` has and `torch.openreg` deliberately does not:")
    absent = {}
    for line in text[start:].splitlines()[3:]:
        if not line.startswith("|"):
            break
        names_cell, reason = [cell.strip() for cell in line.strip("|").split("|")]
        for name in re.findall(r"`([^`]+)`", names_cell):
            absent[name] = reason
    return absent


def test_every_cuda_name_is_present_or_explained():
    absent = readme_absent()
    assert absent, "the absence table of docs/devices-and-streams.md was not found"
    names = cuda_names()
    assert {"synchronize", "memory_stats", "Stream", "utilization"} <= names
    unexplained = sorted(n for n in names if not hasattr(torch.openreg, n) and n not in absent)
    assert not unexplained, f"torch.cuda names neither on torch.openreg nor in the docs table: {unexplained}"
    wrongly_listed = sorted(n for n in absent if hasattr(torch.openreg, n))
    assert not wrongly_listed, f"listed as absent in the docs but present: {wrongly_listed}"
    stale = sorted(n for n in absent if n not in names)
    assert not stale, f"listed in the docs but not a torch.cuda name: {stale}"
    assert all(reason for reason in absent.values())


def _parameters(fn) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]


def test_functions_take_cudas_parameters():
    mismatched = {}
    for name in sorted(cuda_names()):
        ours, theirs = getattr(torch.openreg, name, None), getattr(torch.cuda, name)
        if inspect.isfunction(ours) and inspect.isfunction(theirs):
            if _parameters(ours) != _parameters(theirs):
                mismatched[name] = (str(inspect.signature(ours)), str(inspect.signature(theirs)))
    for name in ("_record_memory_history", "_snapshot", "_dump_snapshot", "memory_snapshot"):
        ours, theirs = getattr(torch.openreg.memory, name), getattr(torch.cuda.memory, name)
        if _parameters(ours) != _parameters(theirs):
            mismatched["memory." + name] = (str(inspect.signature(ours)), str(inspect.signature(theirs)))
    assert not mismatched, mismatched


def test_properties_capability_and_peers():
    props = [torch.openreg.get_device_properties(i) for i in range(torch.openreg.device_count())]
    assert all(isinstance(p.uuid, uuid.UUID) for p in props)
    assert len({p.uuid for p in props}) == len(props), "device UUIDs must differ"
    assert torch.openreg.get_device_properties(1).uuid == props[1].uuid, "a device's UUID is stable"
    assert torch.openreg.get_device_capability(1) == (props[1].major, props[1].minor)
    assert torch.openreg.get_arch_list() == [f"openreg_{props[0].major}{props[0].minor}"]
    assert torch.openreg.can_device_access_peer(0, 1) is True
    assert torch.openreg.can_device_access_peer("openreg:1", torch.device("openreg", 0)) is True
    with pytest.raises(RuntimeError, match="out of range"):
        torch.openreg.can_device_access_peer(0, 7)
    assert torch.openreg.is_bf16_supported() is True
    x = torch.ones(4, dtype=torch.bfloat16, device="openreg")
    assert (x + x).cpu().tolist() == [2.0] * 4
    assert torch.openreg.is_tf32_supported() is False
    assert torch.openreg.OutOfMemoryError is torch.OutOfMemoryError


def test_default_generators_are_the_device_generators():
    gens = torch.openreg.default_generators
    assert len(gens) == torch.openreg.device_count()
    gens[1].manual_seed(123)
    assert torch.openreg.get_rng_state(1).tolist() == gens[1].get_state().tolist()
    torch.openreg.manual_seed_all(7)
    assert gens[1].initial_seed() == 7


def test_utilization_follows_stream_work():
    s = new_stream(1)
    s.synchronize()
    busy(s, 1500)
    # Busy since the launch: the last second is (almost) all busy whatever
    # the machine's load, since the kernel sleeps for 1.5 s.
    import time

    time.sleep(1.05)
    during = torch.openreg.utilization(1)
    assert during >= 90, during
    s.synchronize()
    time.sleep(1.1)
    assert torch.openreg.utilization(1) == 0
    with pytest.raises(RuntimeError, match="out of range"):
        torch.openreg.utilization(5)


def test_caching_allocator_alloc_and_delete():
    before = torch.openreg.memory_allocated(1)
    s = new_stream(1)
    ptr = torch.openreg.caching_allocator_alloc(4096, 1, s)
    assert ptr != 0
    assert torch.openreg.memory_allocated(1) == before + 4096
    torch.openreg.caching_allocator_delete(ptr)
    assert torch.openreg.memory_allocated(1) == before
    with pytest.raises(RuntimeError, match="not openreg device memory"):
        torch.openreg.caching_allocator_delete(ptr)
    with pytest.raises(ValueError, match="not a stream of openreg device 0"):
        torch.openreg.caching_allocator_alloc(16, 0, s)
    with pytest.raises(torch.OutOfMemoryError, match="out of memory"):
        torch.openreg.caching_allocator_alloc(1 << 60, 0)
    assert torch.openreg.get_allocator_backend() == "native"


def test_memory_fraction_aliases_and_summary():
    assert torch.openreg.get_per_process_memory_fraction(1) == 1.0
    torch.openreg.set_per_process_memory_fraction(0.5, 1)
    try:
        assert torch.openreg.get_per_process_memory_fraction(1) == pytest.approx(0.5)
    finally:
        torch.openreg.set_per_process_memory_fraction(1.0, 1)
    x = torch.empty(3 << 20, dtype=torch.uint8, device="openreg:1")
    assert torch.openreg.memory_cached(1) == torch.openreg.memory_reserved(1) > 0
    assert torch.openreg.max_memory_cached(1) == torch.openreg.max_memory_reserved(1)
    assert torch.openreg.device_memory_used(1) == torch.openreg.memory_reserved(1)
    nested = torch.openreg.memory_stats_as_nested_dict(1)
    assert nested["allocated_bytes"]["all"]["current"] == torch.openreg.memory_allocated(1)
    summary = torch.openreg.memory_summary(1)
    assert "device 1" in summary and "Allocated memory" in summary and "from large pool" in summary
    assert "from large pool" not in torch.openreg.memory_summary(1, abbreviated=True)
    del x
    torch.openreg.reset_max_memory_allocated(1)
    assert torch.openreg.max_memory_allocated(1) == torch.openreg.memory_allocated(1)


def test_external_stream_wraps_a_native_handle():
    s = new_stream(1)
    ext = torch.openreg.ExternalStream(s.native_handle)
    assert (ext.device_index, ext.stream_id) == (s.device_index, s.stream_id)
    assert torch.openreg.get_stream_from_external(s.native_handle, 1) == s
    with pytest.raises(ValueError, match="device 1"):
        torch.openreg.ExternalStream(s.native_handle, device=0)
    with pytest.raises(RuntimeError, match="not an openreg stream handle"):
        torch.openreg.ExternalStream(0)


def test_host_memory_stats_count_pinned_allocations():
    torch.openreg.reset_accumulated_host_memory_stats()
    before = torch.openreg.host_memory_stats()
    pinned = torch.empty(5000, dtype=torch.uint8).pin_memory()
    during = torch.openreg.host_memory_stats()
    assert during["allocations.current"] == before["allocations.current"] + 1
    assert during["allocated_bytes.current"] - before["allocated_bytes.current"] >= 5000
    assert during["active_bytes.current"] == during["allocated_bytes.current"]
    assert during["num_host_alloc"] == 1
    del pinned
    after = torch.openreg.host_memory_stats()
    assert after["allocations.current"] == before["allocations.current"]
    assert after["num_host_free"] == 1 and after["allocated_bytes.peak"] >= during["allocated_bytes.current"]
    torch.openreg.reset_peak_host_memory_stats()
    assert torch.openreg.host_memory_stats()["allocated_bytes.peak"] == after["allocated_bytes.current"]
    nested = torch.openreg.host_memory_stats_as_nested_dict()
    assert nested["allocations"]["current"] == after["allocations.current"]
