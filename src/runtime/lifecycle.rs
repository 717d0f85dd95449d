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
//! half the runs of the example in docs/custom-kernels-and-libtorch.md.
//! (PyTorch's own check, `Py_IsInitialized()` before taking the GIL, is a
//! race: the worker passes it, then waits for the GIL that the main thread
//! holds into finalization.)
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
//!
//! Note [Bounded exit drain]: exit waits for queued work at most
//! `OPENREG_EXIT_DRAIN_MS` (default 500 ms), measured from the start of
//! the drain; a process whose last act was to queue a long kernel exits
//! promptly, as it would with a GPU. Past the bound, the tasks not yet
//! started are abandoned (leaked, never run: `StreamQueue::abandon_queued`)
//! with one warning, and a kernel already running is left to finish on its
//! own thread while the process exits; since a worker may then still be
//! running, the later release steps that would pull memory from under it
//! are skipped (the process is ending; the OS reclaims everything). An
//! explicit `finalize` (`torch.openreg._finalize()`, `orFinalize`) is asked
//! for by its caller and waits for all work.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::runtime::device;
use crate::base::hook::Hook;
use crate::base::log;
use crate::base::options;

// Release priorities: lower numbers are released first.
/// Drain and stop every stream worker before anything they use is released.
pub const PRIORITY_STREAMS: i32 = 0;
/// Before the streams stop: the sanitizer's collected reports are printed.
pub const PRIORITY_REPORTS: i32 = -10;
/// Return cached device memory once no worker can touch it.
pub const PRIORITY_MEMORY: i32 = 50;

type Release = Box<dyn FnOnce() + Send>;

static RELEASES: Mutex<Vec<(i32, &'static str, Release)>> = Mutex::new(Vec::new());

/// Registers `release` to run at finalize, ordered by `priority` (steps of
/// equal priority run in registration order).
pub fn register_release(
    priority: i32,
    name: &'static str,
    release: impl FnOnce() + Send + 'static,
) {
    RELEASES.lock().push((priority, name, Box::new(release)));
}

/// The release steps still to run, as `(priority, name)` in the order
/// `finalize` runs them.
pub fn pending_releases() -> Vec<(i32, &'static str)> {
    let mut steps: Vec<_> = RELEASES
        .lock()
        .iter()
        .map(|(priority, name, _)| (*priority, *name))
        .collect();
    steps.sort_by_key(|(priority, _)| *priority);
    steps
}

/// Set when a stream worker did not stop by the exit deadline (Note
/// [Bounded exit drain]): later steps must not release what it may use.
static WORKERS_LEFT_RUNNING: AtomicBool = AtomicBool::new(false);

/// The deadline of an exit-time wait that starts now.
fn exit_deadline() -> Instant {
    Instant::now() + Duration::from_millis(options::get().exit_drain_ms)
}

/// Whether finalize is running at process exit (bounded) or was asked for.
static AT_EXIT: AtomicBool = AtomicBool::new(false);

/// Once, at the runtime's first initialization (`device::init`), before
/// any launch: a higher layer's own start (the stream sanitizer applies its
/// option and registers its reports' release: Note [Hooks] in hook.rs).
pub static AT_FIRST_INIT: Hook<fn()> = Hook::new();

/// Runs once, from `device::init`.
pub(crate) fn on_first_init() {
    if let Some(start) = AT_FIRST_INIT.get() {
        start();
    }
    register_release(PRIORITY_STREAMS, "stream workers", || {
        let deadline = AT_EXIT.load(Ordering::Acquire).then(exit_deadline);
        let stopped = device::existing_contexts()
            .fold(true, |all, ctx| ctx.streams.shut_down_all(deadline) && all);
        if !stopped {
            WORKERS_LEFT_RUNNING.store(true, Ordering::Release);
            log::info("exit: a kernel is still running; its worker is left to the process exit");
        }
    });
    register_release(PRIORITY_MEMORY, "cached device memory", || {
        if !WORKERS_LEFT_RUNNING.load(Ordering::Acquire) {
            device::existing_contexts().for_each(|ctx| ctx.allocator.empty_cache());
        }
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
        AT_EXIT.store(true, Ordering::Release);
        let _ = std::panic::catch_unwind(finalize);
    }
}

/// Releases everything registered, in priority order (steps of equal
/// priority in registration order). Idempotent. After it, streams reject new
/// work with an error saying the runtime is finalizing.
pub fn finalize() {
    let mut releases = std::mem::take(&mut *RELEASES.lock());
    releases.sort_by_key(|(priority, _, _)| *priority);
    for (_, name, release) in releases {
        log::log(log::Level::Debug, &format!("finalize: releasing {name}"));
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
/// queued on every stream so far, at most `OPENREG_EXIT_DRAIN_MS` (Note
/// [Bounded exit drain]), then closes the release gate and waits for the
/// releases in flight. The caller must not hold a lock a kernel's destructor
/// takes (Python: call it without the GIL). Initializes nothing; idempotent.
pub fn prepare_host_exit() {
    // A forked child has the parent's queues but none of its worker threads.
    if !device::is_in_bad_fork() {
        let deadline = exit_deadline();
        let drained = device::existing_contexts()
            .fold(true, |all, ctx| ctx.streams.drain_all(deadline) && all);
        if !drained {
            let tasks: Vec<_> = device::existing_contexts()
                .flat_map(|ctx| ctx.streams.abandon_all("at exit"))
                .collect();
            let abandoned = tasks.len();
            // Leaked, not dropped: what they captured may need the host's
            // interpreter, which is about to finalize.
            std::mem::forget(tasks);
            log::once(
                log::Level::Warn,
                &format!(
                    "exit: device work was still queued after OPENREG_EXIT_DRAIN_MS={} ms; {abandoned} queued kernels \
                     were abandoned (call torch.openreg.synchronize() before exiting to finish them)",
                    options::get().exit_drain_ms
                ),
            );
        }
    }
    KERNEL_RELEASES.fetch_or(HOST_EXITING, Ordering::AcqRel);
    // Cold and short: a release in flight is a destructor already running.
    while KERNEL_RELEASES.load(Ordering::Acquire) & !HOST_EXITING != 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
}
