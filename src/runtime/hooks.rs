//! The runtime's hook points: where the diagnostics (fault injection, the
//! stream sanitizer, sync debug) act on the one door without the runtime
//! naming them (Note [Hooks] in hook.rs).
//!
//! Each hook says when the runtime calls it, what it is told and what its
//! answer does. All are called outside the runtime's own locks unless they
//! say otherwise, so a hook may take its own locks (never the runtime's).

use std::any::Any;
use std::sync::Arc;

use crate::runtime::device::DeviceIndex;
use crate::base::error::{Error, Result};
use crate::base::hook::Hook;
use crate::runtime::stream::StreamQueue;

/// After a kernel ran on `stream` (queued or inline), before it counts as
/// completed, under the stream's lock: an error returned is parked as the
/// kernel's failure, reported by the stream's next synchronize.
pub static AFTER_KERNEL: Hook<fn(&StreamQueue) -> Option<Error>> = Hook::new();

/// Before an event is recorded on `stream`: an error fails the record.
pub static BEFORE_EVENT_RECORD: Hook<fn(&StreamQueue) -> Result<()>> = Hook::new();

/// Before `bytes` (more than 0) are allocated on `device`: an error fails
/// the allocation, as out of memory when its kind is `OutOfMemory`.
pub static BEFORE_ALLOC: Hook<fn(DeviceIndex, usize) -> Result<()>> = Hook::new();

/// Before the host blocks on device work at the user's request (`what`
/// names the operation, e.g. "Event.synchronize()"): an error refuses the
/// wait.
pub static BEFORE_HOST_WAIT: Hook<fn(&str) -> Result<()>> = Hook::new();

/// A point in the happens-before order of the device's work, as an
/// `OrderObserver` made it; the runtime only carries it (in an event) and
/// hands it back.
pub type OrderPoint = Arc<dyn Any + Send + Sync>;

/// Told how the host and the streams are ordered after each other's work
/// (Note [Stream sanitizer] in sanitizer.rs). Every method returns at once
/// when the observer is off; the runtime calls it only where it orders
/// anything: event records and waits, and the user's synchronizations.
pub trait OrderObserver: Send + Sync {
    /// What everything launched on `streams` so far has reached; None while
    /// the observer is off.
    fn point(&self, streams: &[&'static StreamQueue]) -> Option<OrderPoint>;
    /// `stream`'s later work waits for `point` (an event wait).
    fn stream_waits(&self, stream: &'static StreamQueue, point: &OrderPoint);
    /// The host waited for `point`, or learned by a query (`by_query`) that
    /// it has passed. An error is the observer's report, raised to the user.
    fn host_waited_for(&self, point: &OrderPoint, by_query: bool) -> Result<()>;
}

pub static ORDER_OBSERVER: Hook<&'static dyn OrderObserver> = Hook::new();

/// Told what the caching allocator does with device memory, for the stream
/// sanitizer's model of it. Called outside the allocator's lock.
pub trait MemoryObserver: Send + Sync {
    /// Whether the observer is on: the allocator collects what `freed`
    /// needs only then.
    fn active(&self) -> bool;
    /// A new allocation of `size` bytes at `base` for `stream`.
    fn allocated(&self, base: usize, size: usize, stream: &'static StreamQueue);
    /// The allocation at `base` was freed; the allocator waits for
    /// `recorded` (its `record_stream` streams) before reusing it.
    fn freed(&self, base: usize, recorded: &[&'static StreamQueue]);
    /// Device memory `base..base + len` was unmapped: every stream that used
    /// it has passed. Called under the allocator's lock.
    fn unmapped(&self, base: usize, len: usize);
}

pub static MEMORY_OBSERVER: Hook<&'static dyn MemoryObserver> = Hook::new();

/// What `ORDER_OBSERVER` makes of `streams` now; None without one.
pub(crate) fn order_point(streams: &[&'static StreamQueue]) -> Option<OrderPoint> {
    ORDER_OBSERVER.get()?.point(streams)
}

/// Tells `ORDER_OBSERVER` the host waited for `point` (Ok without one).
pub(crate) fn host_waited_for(point: &OrderPoint, by_query: bool) -> Result<()> {
    match ORDER_OBSERVER.get() {
        Some(observer) => observer.host_waited_for(point, by_query),
        None => Ok(()),
    }
}

/// The `BEFORE_HOST_WAIT` hook's answer for `what` (Ok without one).
pub(crate) fn before_host_wait(what: &str) -> Result<()> {
    match BEFORE_HOST_WAIT.get() {
        Some(hook) => hook(what),
        None => Ok(()),
    }
}
