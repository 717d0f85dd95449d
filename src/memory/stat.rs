//! A memory statistic as PyTorch's allocators count one (bytes or blocks
//! now, at the peak, and allocated and freed over time): the caching
//! allocator's and the pinned host allocator's statistics.

/// One statistic, as `c10::CachingDeviceAllocator::Stat`.
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    pub current: i64,
    pub peak: i64,
    pub allocated: i64,
    pub freed: i64,
}

impl Stat {
    pub(crate) fn increase(&mut self, amount: usize) {
        self.current += amount as i64;
        self.peak = self.peak.max(self.current);
        self.allocated += amount as i64;
    }

    pub(crate) fn decrease(&mut self, amount: usize) {
        self.current -= amount as i64;
        debug_assert!(self.current >= 0, "negative memory statistic");
        self.freed += amount as i64;
    }
}

