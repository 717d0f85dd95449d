"""Device memory: what `torch.accelerator`'s memory functions report, out of
memory, and pinned host memory.

The statistics (`memory_stats`, `memory_allocated`, `memory_reserved`, their
peaks and resets, `empty_cache`) exist when the backend's allocator is a
`c10::DeviceAllocator`; a backend whose allocator is a plain `c10::Allocator`
has none, and torch says so ("Allocator for NAME is not a DeviceAllocator"),
which these checks report as not supported. Where statistics exist they
must track tensors exactly, as CUDA's caching allocator does. Running out of
memory raises `torch.OutOfMemoryError` and leaves the device usable;
pinned memory is optional (torch's PrivateUse1 hooks say when it is missing),
and where offered it is pinned and round-trips non_blocking copies.
"""

from __future__ import annotations

import torch

from torch_openreg.conformance._api import Failed, NotSupported, check, expect, first_line

AREA = "memory"

_MiB = 1 << 20

# torch.accelerator.memory_stats()'s keys, as torch.cuda.memory_stats documents
# them (its "allocated.*" is spelled "allocation.*" by both bindings).
_POOLED = ("allocation", "segment", "active", "inactive_split",
           "allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes")
_POOLS = ("all", "large_pool", "small_pool")
_METRICS = ("current", "peak", "allocated", "freed")
_COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free")
_KEYS = tuple(f"{s}.{p}.{m}" for s in _POOLED for p in _POOLS for m in _METRICS) + _COUNTERS


def _accelerator(name: str, *args):
    """torch.accelerator.<name>(*args); NotSupported where torch lacks the
    function or says the backend's allocator does not offer it."""
    function = getattr(torch.accelerator, name, None)
    if function is None:
        raise NotSupported(f"torch.accelerator.{name} is not in this torch")
    try:
        return function(*args)
    except NotImplementedError as error:  # e.g. "getMemoryInfo is not implemented for this allocator yet."
        raise NotSupported(f"torch.accelerator.{name} raised {first_line(error)}") from None
    except RuntimeError as error:
        if "is not a DeviceAllocator" not in str(error):
            raise
        raise NotSupported(f"torch.accelerator.{name}: torch says the backend's allocator is not a "
                           f"c10::DeviceAllocator (a plain c10::Allocator keeps no statistics)") from None


def _stats(i: int) -> dict:
    stats = _accelerator("memory_stats", i)
    expect(bool(stats), f"memory_stats({i}) is empty after the device allocated: torch says the device "
                        f"allocator is not initialized")
    return stats


def _allocated(i: int) -> int:
    return _accelerator("memory_allocated", i)


def _settle(i: int) -> None:
    torch.accelerator.synchronize(i)


@check("torch.accelerator.memory_stats(i) has CUDA's keys, non-negative integers consistent across pools "
       "(all = large_pool + small_pool, peak >= current, reserved >= allocated >= requested)")
def stats_keys(b):
    for i in range(b.device_count):
        held = torch.empty(_MiB + 1, dtype=torch.uint8, device=b.device(i))  # the first allocation initializes it
        stats = _stats(i)
        missing = [k for k in _KEYS if k not in stats]
        expect(not missing, f"memory_stats({i}) lacks {len(missing)} of CUDA's keys: {', '.join(missing[:6])}"
                            + (", ..." if len(missing) > 6 else ""))
        bad = [f"{k}={v!r}" for k, v in stats.items()
               if k != "max_split_size" and not (isinstance(v, int) and v >= 0)]  # max_split_size: -1 is unlimited
        expect(not bad, f"memory_stats({i}) has values that are not non-negative integers: {', '.join(bad[:4])}")
        for family in _POOLED:
            for metric in ("current", "allocated", "freed"):
                whole, large, small = (stats[f"{family}.{p}.{metric}"] for p in _POOLS)
                expect(whole == large + small, f"memory_stats({i}): {family}.all.{metric} is {whole}, "
                                               f"large_pool + small_pool is {large + small}")
            for pool in _POOLS:
                peak, current = stats[f"{family}.{pool}.peak"], stats[f"{family}.{pool}.current"]
                expect(peak >= current, f"memory_stats({i}): {family}.{pool}.peak {peak} < current {current}")
        reserved, allocated = stats["reserved_bytes.all.current"], stats["allocated_bytes.all.current"]
        requested = stats["requested_bytes.all.current"]
        expect(reserved >= allocated >= requested >= held.nbytes,
               f"memory_stats({i}) with {held.nbytes} bytes held: reserved {reserved}, allocated {allocated}, "
               f"requested {requested} bytes")
        del held
    return f"{len(_KEYS)} keys on {b.device_count} device(s)"


@check("memory_allocated grows by at least a tensor's bytes and returns to its baseline after del; "
       "max_memory_allocated tracks the peak; reset_peak_memory_stats and reset_accumulated_memory_stats reset")
def allocated_tracks_tensors(b):
    sizes = (1000, 4 * _MiB + 1)  # the small and the large pool
    for i in range(b.device_count):
        device = b.device(i)
        torch.empty(1, device=device)  # initializes the allocator
        _settle(i)
        others = {j: _allocated(j) for j in range(b.device_count) if j != i}
        for nbytes in sizes:
            base = _allocated(i)
            count = _stats(i)["allocation.all.current"]
            t = torch.empty(nbytes, dtype=torch.uint8, device=device)
            held = _allocated(i)
            expect(held - base >= nbytes, f"holding {nbytes} bytes on {device} moved memory_allocated "
                                          f"by {held - base}")
            expect(_stats(i)["allocation.all.current"] > count,
                   f"allocation.all.current on {device} did not grow with a tensor held")
            expect(_accelerator("max_memory_allocated", i) >= held,
                   f"max_memory_allocated({i}) is below memory_allocated({i}) {held}")
            expect(_accelerator("memory_reserved", i) >= held,
                   f"memory_reserved({i}) is below memory_allocated({i}) {held}")
            moved = {j: _allocated(j) for j in others if _allocated(j) != others[j]}
            expect(not moved, f"a tensor on {device} changed memory_allocated of device(s) {sorted(moved)}")
            del t
            _settle(i)
            after = _allocated(i)
            expect(after == base, f"after del of a {nbytes}-byte tensor and synchronize, memory_allocated({i}) is "
                                  f"{after}, baseline {base}")
            peak = _accelerator("max_memory_allocated", i)
            expect(peak >= base + nbytes, f"max_memory_allocated({i}) is {peak} after holding {base} + {nbytes}")

        _accelerator("reset_peak_memory_stats", i)
        base = _allocated(i)
        peak = _accelerator("max_memory_allocated", i)
        expect(peak == base, f"right after reset_peak_memory_stats({i}), max_memory_allocated is {peak}, "
                             f"memory_allocated {base}")
        reserved_peak, reserved = _accelerator("max_memory_reserved", i), _accelerator("memory_reserved", i)
        expect(reserved_peak == reserved, f"right after reset_peak_memory_stats({i}), max_memory_reserved is "
                                          f"{reserved_peak}, memory_reserved {reserved}")
        small = torch.empty(sizes[0], dtype=torch.uint8, device=device)
        del small
        _settle(i)
        peak = _accelerator("max_memory_allocated", i)
        expect(base + sizes[0] <= peak < base + sizes[1],
               f"after reset_peak_memory_stats({i}) and a {sizes[0]}-byte tensor, max_memory_allocated is {peak} "
               f"(baseline {base}; the earlier peak was over {base + sizes[1]})")

        _accelerator("reset_accumulated_memory_stats", i)
        stats = _stats(i)
        history = (stats["allocated_bytes.all.allocated"], stats["allocated_bytes.all.freed"])
        expect(history == (0, 0), f"after reset_accumulated_memory_stats({i}), allocated_bytes.all.allocated/freed "
                                  f"are {history}")
        t = torch.empty(sizes[1], dtype=torch.uint8, device=device)
        del t
        _settle(i)
        stats = _stats(i)
        history = (stats["allocated_bytes.all.allocated"], stats["allocated_bytes.all.freed"])
        expect(min(history) >= sizes[1], f"after a {sizes[1]}-byte tensor came and went, "
                                         f"allocated_bytes.all.allocated/freed are {history}")
    return f"{len(sizes)} sizes on {b.device_count} device(s)"


@check("empty_cache() returns cached memory: memory_reserved after it is no more than before the freed tensor")
def empty_cache(b):
    nbytes = 16 * _MiB
    for i in range(b.device_count):
        device = b.device(i)
        torch.empty(1, device=device)
        _settle(i)
        _accelerator("empty_cache")
        before = _accelerator("memory_reserved", i)
        t = torch.empty(nbytes, dtype=torch.uint8, device=device)
        held = _accelerator("memory_reserved", i)
        expect(held >= _allocated(i), f"memory_reserved({i}) is {held} with a {nbytes}-byte tensor held, "
                                      f"below memory_allocated({i})")
        del t
        _settle(i)
        cached = _accelerator("memory_reserved", i)
        _accelerator("empty_cache")
        after = _accelerator("memory_reserved", i)
        expect(after <= cached and after <= before,
               f"memory_reserved({i}): {before} before a {nbytes}-byte tensor, {cached} after del, "
               f"{after} after empty_cache()")
    return f"{b.device_count} device(s) back to their reserved baseline"


def _out_of_memory(device, nbytes: int) -> None:
    try:
        t = torch.empty(nbytes, dtype=torch.uint8, device=device)
    except torch.OutOfMemoryError:
        return
    except Exception as error:  # noqa: BLE001 - a RuntimeError of another kind breaks the contract
        raise Failed(f"allocating {nbytes} bytes on {device} raised {first_line(error)} "
                     f"({type(error).__module__}.{type(error).__qualname__}), not torch.OutOfMemoryError") from None
    del t
    raise Failed(f"allocating {nbytes} bytes on {device} succeeded")


@check("allocating far more than the device has raises torch.OutOfMemoryError, counted in num_ooms; "
       "afterwards the device allocates and computes correctly", isolated=True)
def out_of_memory(b):
    told = []
    for i in range(b.device_count):
        device = b.device(i)
        torch.empty(1, device=device)
        try:
            sizes = [2 * _accelerator("get_memory_info", i)[1], 1 << 50]
        except NotSupported:
            sizes = [1 << 50]
        try:
            before = (_stats(i)["num_ooms"], _allocated(i))
        except NotSupported:
            before = None
        for nbytes in sizes:
            _out_of_memory(device, nbytes)
        if before is not None:
            ooms = _stats(i)["num_ooms"] - before[0]
            expect(ooms >= len(sizes), f"num_ooms on {device} grew by {ooms} after {len(sizes)} out-of-memory errors")
            expect(_allocated(i) == before[1], f"the failed allocations left memory_allocated({i}) at "
                                               f"{_allocated(i)}, was {before[1]}")
        n = 1 << 18
        x = torch.arange(n, dtype=torch.float64, device=device) * 2
        total = x.sum().item()
        expect(total == n * (n - 1), f"after out of memory, 2 * arange({n}).sum() on {device} is {total}")
        told.append(f"{device}: {', '.join(str(s) for s in sizes)} bytes")
    statistics = "counted in num_ooms" if before is not None else "no memory stats to count them"
    return f"OutOfMemoryError for {'; '.join(told)}; {statistics}"


def pinned_memory_missing() -> str | None:
    """Why the backend offers no pinned host memory (torch's error), or None.
    tensors.py asks too: torch pins the destination of a device tensor's
    .to("cpu", non_blocking=True)."""
    try:
        torch.empty(1, pin_memory=True)
    except (NotImplementedError, RuntimeError) as error:
        # PrivateUse1HooksInterface without getPinnedMemoryAllocator (NotImplementedError), or a hooks
        # interface that keeps AcceleratorHooksInterface's "Backend doesn't support getPinnedMemoryAllocator()".
        if "getPinnedMemoryAllocator" not in str(error):
            raise
        return f"torch.empty(pin_memory=True) raised {first_line(error)}"
    return None


@check("torch.empty(pin_memory=True) and tensor.pin_memory() are pinned (a plain CPU tensor is not); "
       "non_blocking copies from pinned memory to each device and back, then synchronize, equal the source")
def pinned(b):
    missing = pinned_memory_missing()
    if missing is not None:
        raise NotSupported(missing)
    n = (1 << 20) if b.full else (1 << 16)
    pinned_buffer = torch.empty(n, pin_memory=True)
    expect(pinned_buffer.is_pinned(), "torch.empty(pin_memory=True).is_pinned() is False")
    source = torch.randn(n)
    expect(not source.is_pinned(), "a plain CPU tensor says is_pinned()")
    pinned_copy = source.pin_memory()
    expect(pinned_copy.is_pinned(), "tensor.pin_memory().is_pinned() is False")
    expect(torch.equal(pinned_copy, source), "tensor.pin_memory() changed the values")
    expect(not source.is_pinned(), "tensor.pin_memory() pinned the original rather than a copy")
    pinned_buffer.copy_(source)
    for i in range(b.device_count):
        on_device = pinned_buffer.to(b.device(i), non_blocking=True)
        back = torch.empty(n, pin_memory=True)
        back.copy_(on_device, non_blocking=True)
        returned = on_device.to("cpu", non_blocking=True)
        torch.accelerator.synchronize(i)
        expect(torch.equal(back, source), f"pinned -> {b.device(i)} -> pinned with non_blocking=True changed values")
        expect(torch.equal(returned, source), f"{b.device(i)}.to('cpu', non_blocking=True) changed values")
        expect(torch.equal(pinned_copy.to(b.device(i), non_blocking=True).cpu(), source),
               f"tensor.pin_memory() -> {b.device(i)} changed values")
    return f"{n} floats to {b.device_count} device(s) and back"


@check("get_memory_info(i) is (free, total) with 0 <= free <= total; holding a tensor lowers free by its size, "
       "freeing it (with empty_cache) raises free again")
def memory_info(b):
    for i in range(b.device_count):
        device = b.device(i)
        torch.empty(1, device=device)
        _settle(i)
        info = _accelerator("get_memory_info", i)
        expect(isinstance(info, tuple) and len(info) == 2 and all(isinstance(v, int) for v in info),
               f"get_memory_info({i}) returned {info!r}")
        free, total = info
        expect(0 <= free <= total and total > 0, f"get_memory_info({i}) is (free {free}, total {total})")
        _accelerator("empty_cache")
        free, _ = _accelerator("get_memory_info", i)
        nbytes = max(_MiB, min(free // 4, 64 * _MiB)) // _MiB * _MiB
        t = torch.empty(nbytes, dtype=torch.uint8, device=device)
        held_free, held_total = _accelerator("get_memory_info", i)
        expect(held_total == total, f"get_memory_info({i}) total changed from {total} to {held_total}")
        expect(held_free <= free - nbytes, f"holding {nbytes} bytes on {device}, free memory went from {free} to "
                                           f"{held_free}: get_memory_info does not see this process's memory")
        del t
        _settle(i)
        _accelerator("empty_cache")
        freed, _ = _accelerator("get_memory_info", i)
        expect(freed >= held_free + nbytes // 2, f"after del and empty_cache, free memory on {device} is {freed}, "
                                                 f"{held_free} while {nbytes} bytes were held")
    return f"{b.device_count} device(s); holding {nbytes} bytes lowered free memory by {free - held_free}"
