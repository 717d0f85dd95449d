"""Device memory, as ``torch.cuda`` offers it. Statistics come from the Rust
caching allocator through PyTorch's ``c10::DeviceAllocator`` (the same data
``torch.accelerator.memory_*`` reads); keys follow CUDA's."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from torch_openreg import _C

from ._device import _valid_index


def memory_stats(device: Any = None) -> OrderedDict[str, Any]:
    """CUDA-style allocator statistics (``allocated_bytes.all.current``, ...)."""
    return torch.accelerator.memory_stats(_valid_index(device))


def memory_allocated(device: Any = None) -> int:
    return torch.accelerator.memory_allocated(_valid_index(device))


def max_memory_allocated(device: Any = None) -> int:
    return torch.accelerator.max_memory_allocated(_valid_index(device))


def memory_reserved(device: Any = None) -> int:
    return torch.accelerator.memory_reserved(_valid_index(device))


def max_memory_reserved(device: Any = None) -> int:
    return torch.accelerator.max_memory_reserved(_valid_index(device))


def reset_peak_memory_stats(device: Any = None) -> None:
    torch.accelerator.reset_peak_memory_stats(_valid_index(device))


def reset_accumulated_memory_stats(device: Any = None) -> None:
    torch.accelerator.reset_accumulated_memory_stats(_valid_index(device))


def empty_cache() -> None:
    """Release cached, unused device memory of every device."""
    torch.accelerator.empty_cache()


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of ``device``: total is its capacity
    (``OPENREG_DEVICE_MEMORY``), free what the caching allocator has not reserved."""
    return torch.accelerator.get_memory_info(_valid_index(device))


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Cap what this process may reserve on ``device`` at ``fraction`` (0..1) of its capacity."""
    if not isinstance(fraction, (int, float)) or isinstance(fraction, bool):
        raise TypeError(f"fraction must be a float, got {fraction!r}")
    _C._set_memory_fraction(_valid_index(device), float(fraction))


def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
    """``memory_stats`` with its dotted keys as nested dictionaries."""
    return _nested(memory_stats(device))


def _nested(flat: dict[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        *path, leaf = key.split(".")
        node = nested
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def memory_cached(device: Any = None) -> int:
    """Deprecated name of ``memory_reserved`` (as in ``torch.cuda``)."""
    return memory_reserved(device)


def max_memory_cached(device: Any = None) -> int:
    """Deprecated name of ``max_memory_reserved`` (as in ``torch.cuda``)."""
    return max_memory_reserved(device)


def reset_max_memory_allocated(device: Any = None) -> None:
    """Deprecated: resets every peak statistic, like ``reset_peak_memory_stats``."""
    reset_peak_memory_stats(device)


def reset_max_memory_cached(device: Any = None) -> None:
    """Deprecated: resets every peak statistic, like ``reset_peak_memory_stats``."""
    reset_peak_memory_stats(device)


def get_per_process_memory_fraction(device: Any = None) -> float:
    """The fraction of ``device``'s capacity this process may reserve (1.0 unless set)."""
    return _C._get_memory_fraction(_valid_index(device))


def device_memory_used(device: Any = None) -> int:
    """Bytes of ``device`` in use: what this process reserved (an openreg
    device belongs to one process, so that is all of it)."""
    return memory_reserved(device)


def get_allocator_backend() -> str:
    """``"native"``: the runtime's caching allocator (there is no other)."""
    return "native"


def caching_allocator_alloc(size: int, device: Any = None, stream: Any = None) -> int:
    """``size`` bytes from the caching allocator for ``stream`` (default: the
    current stream of ``device``); returns the device pointer. Out of memory
    is ``torch.OutOfMemoryError``. Free it with ``caching_allocator_delete``."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"caching_allocator_alloc: size must be a non-negative int, got {size!r}")
    from ._streams import current_stream, stream as stream_context

    index = _valid_index(device)
    if stream is None:
        stream = current_stream(index)
    if isinstance(stream, int):
        raise TypeError("caching_allocator_alloc: pass a torch.Stream (an openreg stream), not an int")
    if stream.device.type != "openreg" or stream.device_index != index:
        raise ValueError(f"caching_allocator_alloc: {stream} is not a stream of openreg device {index}")
    with stream_context(stream):
        return _C._malloc(size)


def caching_allocator_delete(mem_ptr: int) -> None:
    """Returns memory from ``caching_allocator_alloc`` to the cache."""
    _C._free(mem_ptr)


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A printable table of ``device``'s allocator statistics (current, peak,
    total allocated and freed), by pool unless ``abbreviated``."""
    index = _valid_index(device)
    stats = memory_stats(index)
    pools = ("all",) if abbreviated else ("all", "large_pool", "small_pool")
    rows = [
        ("Allocated memory", "allocated_bytes", True),
        ("Active memory", "active_bytes", True),
        ("Requested memory", "requested_bytes", True),
        ("Reserved memory", "reserved_bytes", True),
        ("Non-releasable memory", "inactive_split_bytes", True),
        ("Allocations", "allocation", False),
        ("Active allocs", "active", False),
        ("Reserved segments", "segment", False),
        ("Non-releasable allocs", "inactive_split", False),
    ]
    width = 24
    lines = [
        f"openreg memory summary, device {index}",
        f"{'Metric':<{width}}{'Current':>14}{'Peak':>14}{'Allocated':>14}{'Freed':>14}",
    ]
    for title, key, is_bytes in rows:
        for pool in pools:
            label = title if pool == "all" else f"  from {pool.replace('_pool', '')} pool"
            values = [stats.get(f"{key}.{pool}.{field}", 0) for field in ("current", "peak", "allocated", "freed")]
            cells = "".join(f"{_format_amount(v, is_bytes):>14}" for v in values)
            lines.append(f"{label:<{width}}{cells}")
    lines.append(
        f"Allocation retries: {stats.get('num_alloc_retries', 0)}   "
        f"OOMs: {stats.get('num_ooms', 0)}   "
        f"segment maps/unmaps: {stats.get('num_device_alloc', 0)}/{stats.get('num_device_free', 0)}"
    )
    return "\n".join(lines) + "\n"


def _format_amount(value: int, is_bytes: bool) -> str:
    if not is_bytes:
        return str(value)
    units = ("B", "KiB", "MiB", "GiB")
    amount, unit = float(value), 0
    while abs(amount) >= 1024 and unit < len(units) - 1:
        amount, unit = amount / 1024, unit + 1
    return f"{value} B" if unit == 0 else f"{amount:.2f} {units[unit]}"


def host_memory_stats() -> OrderedDict[str, Any]:
    """Statistics of the pinned host allocator, with CUDA's keys:
    ``allocations.*`` and ``allocated_bytes.*`` (live pinned allocations and
    their page-rounded bytes; ``current``, ``peak``, ``allocated``, ``freed``),
    ``active_requests.*`` and ``active_bytes.*`` (the same: the pinned
    allocator keeps no cache), ``num_host_alloc`` and ``num_host_free``. No
    timing statistics."""
    raw = _C._host_memory_stats()
    result = {"num_host_alloc": raw["num_host_alloc"], "num_host_free": raw["num_host_free"]}
    for name, source in (
        ("allocations", "allocations"),
        ("active_requests", "allocations"),
        ("allocated_bytes", "allocated_bytes"),
        ("active_bytes", "allocated_bytes"),
    ):
        for field, value in zip(("current", "peak", "allocated", "freed"), raw[source]):
            result[f"{name}.{field}"] = value
    return OrderedDict(sorted(result.items()))


def host_memory_stats_as_nested_dict() -> dict[str, Any]:
    """``host_memory_stats`` with its dotted keys as nested dictionaries."""
    return _nested(host_memory_stats())


def reset_peak_host_memory_stats() -> None:
    _C._reset_host_memory_stats(True, False)


def reset_accumulated_host_memory_stats() -> None:
    _C._reset_host_memory_stats(False, True)
