//! Pinned ("page-locked") host memory: host allocations the runtime knows
//! about, so PyTorch can ask `is_pinned` and copies from or to them may run
//! asynchronously on a stream.
//!
//! Nothing is really locked (it is all host memory here); what matters is the
//! registry: any pointer inside a live pinned allocation is pinned. There is
//! no cache: every allocation maps pages and every free unmaps them, so the
//! statistics count live allocations (`torch.openreg.host_memory_stats`).

use std::collections::BTreeMap;

use parking_lot::Mutex;

use crate::base::error::Result;
use crate::base::hook::Hook;
use crate::memory::device_memory::{self, PAGE};
use crate::memory::stat::Stat;

/// The pinned allocator's statistics, as CUDA's host allocator names them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostStats {
    /// Live allocations.
    pub allocations: Stat,
    /// Their bytes, rounded up to whole pages.
    pub allocated_bytes: Stat,
    pub num_host_alloc: i64,
    pub num_host_free: i64,
}

struct Registry {
    /// base → mapped length of every live pinned allocation.
    live: BTreeMap<usize, usize>,
    stats: HostStats,
}

static PINNED: Mutex<Registry> = Mutex::new(Registry {
    live: BTreeMap::new(),
    stats: HostStats {
        allocations: Stat {
            current: 0,
            peak: 0,
            allocated: 0,
            freed: 0,
        },
        allocated_bytes: Stat {
            current: 0,
            peak: 0,
            allocated: 0,
            freed: 0,
        },
        num_host_alloc: 0,
        num_host_free: 0,
    },
});

/// `size` bytes of pinned host memory; 0 bytes is the null pointer.
pub fn malloc(size: usize) -> Result<usize> {
    if size == 0 {
        return Ok(0);
    }
    let len = size.div_ceil(PAGE) * PAGE;
    let base = device_memory::map_host(len)?;
    let mut registry = PINNED.lock();
    registry.live.insert(base, len);
    registry.stats.allocations.increase(1);
    registry.stats.allocated_bytes.increase(len);
    registry.stats.num_host_alloc += 1;
    Ok(base)
}

/// When a pinned allocation `base..base + len` is freed, before its pages
/// are unmapped (Note [Hooks] in hook.rs): whoever watches host memory (the
/// pinned memory guard) lets go of it.
pub static BEFORE_UNMAP: Hook<fn(usize, usize)> = Hook::new();

pub fn free(ptr: usize) {
    let mut registry = PINNED.lock();
    if let Some(len) = registry.live.remove(&ptr) {
        registry.stats.allocations.decrease(1);
        registry.stats.allocated_bytes.decrease(len);
        registry.stats.num_host_free += 1;
        drop(registry);
        if let Some(hook) = BEFORE_UNMAP.get() {
            hook(ptr, len);
        }
        device_memory::unmap_host(ptr, len);
    }
}

/// Whether `ptr` points into a live pinned allocation.
pub fn contains(ptr: usize) -> bool {
    PINNED
        .lock()
        .live
        .range(..=ptr)
        .next_back()
        .is_some_and(|(base, len)| ptr < base + len)
}

pub fn stats() -> HostStats {
    PINNED.lock().stats
}

/// Peaks drop to the current values.
pub fn reset_peak_stats() {
    let stats = &mut PINNED.lock().stats;
    stats.allocations.peak = stats.allocations.current;
    stats.allocated_bytes.peak = stats.allocated_bytes.current;
}

/// The historical totals (allocated, freed, alloc and free counts) restart at 0.
pub fn reset_accumulated_stats() {
    let stats = &mut PINNED.lock().stats;
    for stat in [&mut stats.allocations, &mut stats.allocated_bytes] {
        (stat.allocated, stat.freed) = (0, 0);
    }
    (stats.num_host_alloc, stats.num_host_free) = (0, 0);
}
