//! Pinned ("page-locked") host memory: host allocations the runtime knows
//! about, so PyTorch can ask `is_pinned` and copies from or to them may run
//! asynchronously on a stream.
//!
//! Nothing is really locked (it is all host memory here); what matters is the
//! registry: any pointer inside a live pinned allocation is pinned.

use std::collections::BTreeMap;

use parking_lot::Mutex;

use crate::error::Result;
use crate::memory::{self, PAGE};

/// base → mapped length of every live pinned allocation.
static PINNED: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());

/// `size` bytes of pinned host memory; 0 bytes is the null pointer.
pub fn malloc(size: usize) -> Result<usize> {
    if size == 0 {
        return Ok(0);
    }
    let len = size.div_ceil(PAGE) * PAGE;
    let base = memory::map_host(len)?;
    PINNED.lock().insert(base, len);
    Ok(base)
}

pub fn free(ptr: usize) {
    if let Some(len) = PINNED.lock().remove(&ptr) {
        memory::unmap_host(ptr, len);
    }
}

/// Whether `ptr` points into a live pinned allocation.
pub fn contains(ptr: usize) -> bool {
    PINNED.lock().range(..=ptr).next_back().is_some_and(|(base, len)| ptr < base + len)
}
