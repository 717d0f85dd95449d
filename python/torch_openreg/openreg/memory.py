"""``torch.openreg.memory``: the memory functions under the module name
``torch.cuda.memory`` has, including the private history and snapshot
functions that PyTorch's tools call by that path."""

from ._memory import (  # noqa: F401
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
from ._snapshot import _dump_snapshot, _record_memory_history, _snapshot, memory_snapshot  # noqa: F401
