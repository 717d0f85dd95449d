"""``torch.openreg``: the device module of the openreg backend.

It mirrors ``torch.cuda`` for devices, streams and random generators. State lives in the Rust
runtime; these functions are thin wrappers over ``torch_openreg._C`` and over
PyTorch's generic ``torch.Stream`` / ``torch.Event``, which reach the same
runtime through the registered device guard.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_openreg import _C

from . import amp
from .amp import (
    get_amp_supported_dtype,
    get_autocast_dtype,
    is_autocast_enabled,
    is_bf16_supported,
    set_autocast_dtype,
    set_autocast_enabled,
)
from ._device import (
    current_device,
    device,
    device_count,
    device_of,
    get_device_name,
    get_device_properties,
    init,
    is_available,
    is_initialized,
    set_device,
    synchronize,
)
from ._memory import (
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_stats,
    reset_accumulated_memory_stats,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
)
from ._random import (
    default_generators as _default_generators,
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from ._streams import (
    Event,
    Stream,
    StreamContext,
    current_stream,
    default_stream,
    set_stream,
    stream,
)


def __getattr__(name: str) -> Any:
    # torch.openreg.default_generators, as torch.cuda.default_generators: a
    # tuple read on each access, so importing the module creates nothing.
    if name == "default_generators":
        return _default_generators()
    raise AttributeError(f"module 'torch.openreg' has no attribute {name!r}")


def _inductor_backend_init() -> None:
    """Called by Inductor (``init_backend_registration``) the first time it
    needs device backends: registers openreg's (Note [Inductor kernels in
    stream order] in ``torch_openreg/_inductor.py``)."""
    from torch_openreg import _inductor

    _inductor.register()


def _is_in_bad_fork() -> bool:
    """True in a forked child of a process that initialized openreg."""
    return _C._is_in_bad_fork()


def _sleep(milliseconds: float) -> None:
    """Queue a kernel that keeps the current stream busy (like ``torch.cuda._sleep``)."""
    _C._sleep(float(milliseconds))


def options() -> dict[str, dict[str, Any]]:
    """The ``OPENREG_*`` options in force: ``{name: {"value": ..., "help": ...}}``."""
    result = {}
    for line in _C._options().splitlines():
        name, value, help_text = line.split("\t", 2)
        result[name] = {"value": value, "help": help_text}
    return result


def stream_priority_range() -> tuple[int, int]:
    """(least, greatest) stream priority; lower numbers are higher priorities."""
    return _C._stream_priority_range()


__all__ = [
    "Event",
    "Stream",
    "StreamContext",
    "amp",
    "current_device",
    "current_stream",
    "default_generators",
    "default_stream",
    "device",
    "device_count",
    "device_of",
    "empty_cache",
    "get_amp_supported_dtype",
    "get_autocast_dtype",
    "get_device_name",
    "get_device_properties",
    "get_rng_state",
    "get_rng_state_all",
    "init",
    "initial_seed",
    "is_autocast_enabled",
    "is_available",
    "is_bf16_supported",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "options",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_autocast_dtype",
    "set_autocast_enabled",
    "set_device",
    "set_per_process_memory_fraction",
    "set_rng_state",
    "set_rng_state_all",
    "set_stream",
    "stream",
    "stream_priority_range",
    "synchronize",
]
