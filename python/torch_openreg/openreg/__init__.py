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

from . import amp, memory, sanitizer
from .amp import (
    get_amp_supported_dtype,
    get_autocast_dtype,
    is_autocast_enabled,
    set_autocast_dtype,
    set_autocast_enabled,
)
from ._graphs import graph_pool_handle, is_current_stream_capturing
from ._device import (
    can_device_access_peer,
    current_device,
    device,
    device_count,
    device_of,
    get_arch_list,
    get_device_capability,
    get_device_name,
    get_device_properties,
    init,
    is_available,
    is_bf16_supported,
    is_device_stopped,
    is_initialized,
    is_tf32_supported,
    restart_device,
    set_device,
    stop_device,
    synchronize,
    utilization,
)
from ._memory import (
    caching_allocator_alloc,
    caching_allocator_delete,
    device_memory_used,
    empty_cache,
    get_allocator_backend,
    get_per_process_memory_fraction,
    host_memory_stats,
    host_memory_stats_as_nested_dict,
    max_memory_allocated,
    max_memory_cached,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_cached,
    memory_reserved,
    memory_stats,
    memory_stats_as_nested_dict,
    memory_summary,
    reset_accumulated_host_memory_stats,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_max_memory_cached,
    reset_peak_host_memory_stats,
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
from ._snapshot import memory_snapshot
from ._streams import (
    Event,
    ExternalStream,
    Stream,
    StreamContext,
    current_stream,
    default_stream,
    get_stream_from_external,
    set_stream,
    stream,
)
from ._sync_debug import get_op_timeout_ms, get_sync_debug_mode, set_op_timeout_ms, set_sync_debug_mode

OutOfMemoryError = torch.OutOfMemoryError
has_half = True
has_magma = False


def _inject_fault(kind: str, after: int = 0) -> None:
    """Make the next-but-``after`` operation of ``kind`` fail once, to test
    error handling (Note [Injected faults] in src/diagnostics/fault.rs): ``"alloc"`` (an
    allocation raises ``torch.OutOfMemoryError``), ``"kernel"`` (a kernel is
    reported failed by its stream's next synchronizing call), ``"event"`` (an
    event record raises) or ``"enumerate"`` (``device_count()`` reports 0).
    The runtime stays usable after each. The option
    ``OPENREG_FAULT=kind[:after]`` arms the same from the start of the process."""
    if not isinstance(kind, str):
        raise TypeError(f"_inject_fault: kind must be a str, got {kind!r}")
    if not isinstance(after, int) or isinstance(after, bool) or after < 0:
        raise ValueError(f"_inject_fault: after must be a non-negative int, got {after!r}")
    try:
        _C._inject_fault(kind, after)
    except RuntimeError as e:
        raise ValueError(str(e)) from None


def _finalize() -> None:
    """Release the runtime now (drain and stop the streams, return cached
    memory, in priority order), for embedders that tear down early; later
    device work raises. The process does this itself at exit."""
    _C._finalize()


def __getattr__(name: str) -> Any:
    # torch.openreg.default_generators, as torch.cuda.default_generators: a
    # tuple read on each access, so importing the module creates nothing.
    if name == "default_generators":
        return _default_generators()
    # Note [torch.openreg._initialized]: torch.cuda's module flag, which
    # device-generic PyTorch code reads with getattr(device_module,
    # "_initialized", False) instead of calling is_initialized(): above all
    # torch.utils.checkpoint, which saves the device RNG state for the
    # recomputation only when it is true. Without it a checkpointed region's
    # recomputation draws new random numbers (a different dropout mask).
    # Read from the runtime on each access, as the runtime initializes itself
    # on first device use.
    if name == "_initialized":
        return is_initialized()
    raise AttributeError(f"module 'torch.openreg' has no attribute {name!r}")


def _lazy_init() -> None:
    """Called by torch before the process's first openreg tensor is made
    from Python (``torch/csrc/utils/device_lazy_init.cpp``), once it returns.

    Note [One-time costs at the first device use]: the first Python Meta
    kernel a process runs imports ``torch._dynamo`` (about 1.3 s), through
    ``torch._disable_dynamo`` on torch's Python references. openreg runs Meta
    kernels to plan an op's results while the device computes (Note [Meta
    results] in cpp/ops/meta_results.h), so that import would stall the host
    behind queued work the first time an op without a C++ Meta kernel (Note
    [C++ Meta kernels] in cpp/ops/meta_kernels.h) is planned: ``relu``,
    ``layer_norm``, ``embedding``... It is paid here instead, where no device
    work can be waiting, as a CUDA program pays for its context on its
    first CUDA tensor. So is the CPU kernels' own one-time setup (the CPU
    capability dispatch, the BLAS library: about 1 ms), which the first call
    of an op with new argument shapes behind queued work would pay on the
    host, where its CPU kernel checks the arguments (Note [Trial on
    stand-ins] in cpp/ops/fallback.cpp). The runtime itself still
    initializes on first use, wherever that is."""
    import torch._dynamo  # noqa: F401

    scratch = torch.ones(2, 2)
    (scratch @ scratch).sin_()


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


def ipc_collect() -> None:
    """Releases the device memory of tensors sent to other processes that
    every receiver has let go of (as ``torch.cuda.ipc_collect``); each send
    also does it. See Note [Sharing device memory between processes]."""
    from torch_openreg import _multiprocessing

    _multiprocessing.ipc_collect()


def options() -> dict[str, dict[str, Any]]:
    """The ``OPENREG_*`` options in force: ``{name: {"value": ..., "source":
    "environment", "default" or "invalid", "help": ...}}``. An invalid value
    (source ``"invalid"``, shown as set) makes the first device use raise a
    RuntimeError naming each such variable and the values it accepts."""
    result = {}
    for line in _C._options().splitlines():
        name, value, source, help_text = line.split("\t", 3)
        result[name] = {"value": value, "source": source, "help": help_text}
    return result


def stream_priority_range() -> tuple[int, int]:
    """(least, greatest) stream priority; lower numbers are higher priorities."""
    return _C._stream_priority_range()


__all__ = [
    "Event",
    "ExternalStream",
    "OutOfMemoryError",
    "Stream",
    "StreamContext",
    "amp",
    "caching_allocator_alloc",
    "caching_allocator_delete",
    "can_device_access_peer",
    "current_device",
    "current_stream",
    "default_generators",
    "default_stream",
    "device",
    "device_count",
    "device_memory_used",
    "device_of",
    "empty_cache",
    "get_allocator_backend",
    "get_amp_supported_dtype",
    "get_arch_list",
    "get_autocast_dtype",
    "get_device_capability",
    "get_device_name",
    "get_device_properties",
    "get_op_timeout_ms",
    "get_per_process_memory_fraction",
    "get_rng_state",
    "get_rng_state_all",
    "graph_pool_handle",
    "get_stream_from_external",
    "get_sync_debug_mode",
    "has_half",
    "has_magma",
    "host_memory_stats",
    "host_memory_stats_as_nested_dict",
    "init",
    "initial_seed",
    "ipc_collect",
    "is_autocast_enabled",
    "is_available",
    "is_bf16_supported",
    "is_current_stream_capturing",
    "is_device_stopped",
    "is_initialized",
    "is_tf32_supported",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_cached",
    "max_memory_reserved",
    "mem_get_info",
    "memory",
    "sanitizer",
    "memory_allocated",
    "memory_cached",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "options",
    "reset_accumulated_host_memory_stats",
    "reset_accumulated_memory_stats",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
    "reset_peak_host_memory_stats",
    "reset_peak_memory_stats",
    "restart_device",
    "seed",
    "seed_all",
    "set_autocast_dtype",
    "set_autocast_enabled",
    "set_device",
    "set_op_timeout_ms",
    "set_per_process_memory_fraction",
    "set_rng_state",
    "set_rng_state_all",
    "set_stream",
    "set_sync_debug_mode",
    "stream",
    "stop_device",
    "stream_priority_range",
    "synchronize",
    "utilization",
]
