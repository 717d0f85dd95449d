//! Op timeouts (`torch.openreg.set_op_timeout_ms`): a synchronizing call
//! gives up on a kernel that runs too long, with an error naming the kernel
//! and the stream, instead of hanging.
//!
//! Note [Op timeout]: each stream remembers which task it is running and
//! when it started (its name: Note [Task names] in stream.rs). A
//! user-facing wait (a synchronize, a blocking launch: the waits that report
//! failures) that is still waiting when that task has run longer than the
//! timeout returns a timeout error naming the task and the stream; the
//! kernel itself keeps running (a host thread cannot be cancelled), so the
//! stream stays busy until it ends. The runtime's own waits (the allocator's, the exit drain)
//! never time out: they guard memory a kernel may still use.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Milliseconds; 0 means no timeout.
static TIMEOUT_MS: AtomicU64 = AtomicU64::new(0);

/// Sets the timeout; 0 disables it.
pub fn set_ms(ms: u64) {
    TIMEOUT_MS.store(ms, Ordering::Relaxed);
}

pub fn get_ms() -> u64 {
    TIMEOUT_MS.load(Ordering::Relaxed)
}

/// The timeout in force, if any.
pub fn limit() -> Option<Duration> {
    match get_ms() {
        0 => None,
        ms => Some(Duration::from_millis(ms)),
    }
}
