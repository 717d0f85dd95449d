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
