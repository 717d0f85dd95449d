//! Process lifecycle: first initialization, fork awareness and an orderly
//! finalize at exit.
//!
//! Finalization runs release callbacks in ascending priority order (like
//! torch_npu's prioritized release list): lower numbers are released first.
//! The runtime registers its own steps here; later subsystems (memory,
//! generators) add theirs with the priority that orders them after the
//! streams have drained.

use parking_lot::Mutex;

use crate::device;

/// Drain and stop every stream worker before anything they use is released.
pub const PRIORITY_STREAMS: i32 = 0;

type Release = Box<dyn FnOnce() + Send>;

static RELEASES: Mutex<Vec<(i32, &'static str, Release)>> = Mutex::new(Vec::new());

/// Registers `release` to run at finalize, ordered by `priority`.
pub fn register_release(priority: i32, name: &'static str, release: impl FnOnce() + Send + 'static) {
    RELEASES.lock().push((priority, name, Box::new(release)));
}

/// Runs once, from `device::init`.
pub(crate) fn on_first_init() {
    register_release(PRIORITY_STREAMS, "stream workers", || {
        device::existing_contexts().for_each(|ctx| ctx.streams.shut_down_all())
    });
    // SAFETY: both callbacks are `extern "C"` functions with no arguments
    // that never unwind; registering them has no other precondition.
    unsafe {
        libc::pthread_atfork(None, None, Some(after_fork_in_child));
        libc::atexit(finalize_at_exit);
    }
}

extern "C" fn after_fork_in_child() {
    device::mark_forked_child();
}

extern "C" fn finalize_at_exit() {
    // A forked child has the parent's queues but none of its worker threads:
    // draining them would wait forever.
    // Nothing may unwind out of an `extern "C"` function.
    if !device::is_in_bad_fork() {
        let _ = std::panic::catch_unwind(finalize);
    }
}

/// Releases everything registered, in priority order. Idempotent.
pub fn finalize() {
    let mut releases = std::mem::take(&mut *RELEASES.lock());
    releases.sort_by_key(|(priority, _, _)| *priority);
    for (_, _, release) in releases {
        release();
    }
}
