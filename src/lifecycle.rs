//! Process lifecycle: first initialization, fork awareness and an orderly
//! finalize at exit.
//!
//! Finalization runs release callbacks in ascending priority order (like
//! torch_npu's prioritized release list): lower numbers are released first.
//! The runtime registers its own steps here; later subsystems (memory,
//! generators) add theirs with the priority that orders them after the
//! streams have drained.
//!
//! Note [Host exit]: a custom kernel (include/torch_openreg/kernel.h)
//! captures tensors, and is destroyed on the stream's worker after it ran.
//! If it held the last reference to a tensor that has a Python object,
//! destroying it takes the GIL (PyTorch's PyInterpreter decref). Once CPython
//! has begun finalizing, a thread that takes the GIL is ended with
//! `pthread_exit`, whose forced unwind through the kernel's `noexcept`
//! callback calls `std::terminate`: the process aborted at exit in about
//! half the runs of the README's example. (PyTorch's own check,
//! `Py_IsInitialized()` before taking the GIL, is a race: the worker passes
//! it, then waits for the GIL that the main thread holds into finalization.)
//! So the host tells the runtime before it finalizes: the Python package
//! calls `prepare_host_exit` (through `orPrepareHostExit`) from an `atexit`
//! handler, which CPython runs before finalizing, with the GIL released. It
//! 1. drains every stream, so the kernels queued so far run and drop their
//!    captures while the interpreter is whole (a destructor may take the GIL);
//! 2. closes the release gate and waits for the releases in flight: from then
//!    on `begin_kernel_release` says no, and kernel.h leaks what a kernel
//!    captured instead of destroying it (as PyTorch leaks Python objects it
//!    can no longer decref). That covers kernels queued later (by a daemon
//!    thread, by an `atexit` handler that runs after ours) or still running.
//!
//! The gate never closes unless a host asks, so a libtorch program frees
//! everything as before. Kernels still run after the gate closes, and
//! `finalize` still drains the streams at process exit.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

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

/// The release gate of Note [Host exit]: this bit is set once the host began
/// exiting; the other bits count the kernel releases in flight.
const HOST_EXITING: usize = 1 << (usize::BITS - 1);
static KERNEL_RELEASES: AtomicUsize = AtomicUsize::new(0);

/// Whether a kernel may destroy what it captured now (Note [Host exit]). A
/// true result must be followed by `end_kernel_release` once it is done; on
/// false, the caller leaks the captures instead.
pub fn begin_kernel_release() -> bool {
    if KERNEL_RELEASES.fetch_add(1, Ordering::AcqRel) & HOST_EXITING == 0 {
        return true;
    }
    KERNEL_RELEASES.fetch_sub(1, Ordering::AcqRel);
    false
}

/// Ends a release that `begin_kernel_release` allowed.
pub fn end_kernel_release() {
    KERNEL_RELEASES.fetch_sub(1, Ordering::AcqRel);
}

/// Whether `prepare_host_exit` has closed the release gate.
pub fn is_host_exiting() -> bool {
    KERNEL_RELEASES.load(Ordering::Acquire) & HOST_EXITING != 0
}

/// The host is about to finalize (Note [Host exit]): waits for the work
/// queued on every stream so far, then closes the release gate and waits for
/// the releases in flight. The caller must not hold a lock a kernel's
/// destructor takes (Python: call it without the GIL). Initializes nothing;
/// idempotent.
pub fn prepare_host_exit() {
    // A forked child has the parent's queues but none of its worker threads.
    if !device::is_in_bad_fork() {
        device::existing_contexts().for_each(|ctx| ctx.streams.drain_all());
    }
    KERNEL_RELEASES.fetch_or(HOST_EXITING, Ordering::AcqRel);
    // Cold and short: a release in flight is a destructor already running.
    while KERNEL_RELEASES.load(Ordering::Acquire) & !HOST_EXITING != 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
}
