//! Note [Kernel pool]: the threads that run the chunks of one large kernel.
//!
//! A device kernel that is worth splitting (a pointwise op, a copy, a fill,
//! a matmul, a convolution over a batch: `cpp/ops/kernel_split.h`) is cut into
//! chunks whose boundaries depend only on its shapes. The thread running the
//! kernel (a stream worker, or the host for an inline kernel) hands the
//! chunks to this pool and takes chunks itself until none are left, then
//! waits for the chunks others took. So:
//!  - results never depend on the number of threads or on timing: each chunk
//!    is a fixed piece of work, whoever runs it;
//!  - the kernel is still one task of its stream (order, events, capture,
//!    the sanitizer and the op timeout see one kernel): the pool only lends
//!    hands while the task runs;
//!  - a thread that cannot be started, a pool busy with another stream's
//!    kernel, or a chunk that itself splits work only means fewer hands: the
//!    caller then runs its chunks alone, with the same boundaries.
//!
//! The pool has `OPENREG_KERNEL_THREADS` threads in all, the caller counted
//! (default: the available cores). Helpers start at the first split kernel.
//! They are plain threads:
//! each chunk runs a single-threaded CPU kernel (Note [Kernel threads] in
//! cpp/device/device_memory.h), so no OpenMP team is ever opened off the user's
//! threads.
//!
//! Note [Lanes]: a kernel's chunks are cut into contiguous lanes, one per
//! pool thread. The n-th thread to join a kernel starts at the front of lane
//! n and, its lane done, takes what is left of the others, lane by lane. So
//! while every thread is there, each streams through its own contiguous part
//! of the arrays, as the static schedule of PyTorch's CPU kernels does; a
//! helper that comes late only leaves its lane to the others. Claimed in one
//! shared order instead (the k-th claim taking chunk k), two threads took
//! alternate chunks of the same arrays: the machine here moves between a
//! fast and a slow state of memory traffic for seconds at a time, and an add
//! of 4M floats in 30 chunks (4 since Note [Chunk size] in
//! cpp/ops/kernel_split.cpp) ran at 382-487 us a call in 11 processes, never
//! in the fast state, where CPU PyTorch's add ran at 224-265 us (5 of 11
//! processes); in lanes it reached 262-307 us (5 of 11). Which thread runs
//! a chunk never changes a result.
//!
//! Note [Polling helpers]: between kernels a helper polls for the next one
//! for `HELPER_POLL`, yielding its core at every poll, and only then sleeps
//! on a condition variable (a caller notifies only when some helper
//! sleeps). Waking a sleeping helper cost the caller a futex call of 2-9 us
//! (a cross-core wake-up on this VM), and the helper then started its chunk
//! late, so the caller waited for it: 15 us per split kernel of a
//! transformer step whose chunks take 25 us. A polling helper takes the
//! next kernel's chunk at once; yielding gives its core to any runnable
//! thread (the user's Python thread, queuing the next ops), so polling costs
//! only a core that would otherwise idle. Training steps split a kernel
//! every 50-500 us, so their helpers never sleep; an idle device's helpers
//! sleep after `HELPER_POLL`, or as soon as a stream worker finds its queue
//! empty and sleeps (`worker_going_idle`). That second rule keeps the
//! scheduler placing threads well: a polling helper is a runnable thread, so
//! its core never looks idle, and a worker woken by the next submission
//! (after a synchronize, say) then often landed on the core of the thread
//! that woke it, the user's: on 2 cores the device's critical path then
//! shared a core with Python while the helper's core polled, and stayed so
//! for seconds (the scheduler moved neither thread to the polling core).
//! 8 of 16 processes of the MLP step ran so, 576-674 us a step against
//! 477-526; with the rule, none of 16 (472-544 us).
//!
//! Note [Helper on the caller's core]: a helper does not poll on the core
//! its caller was on when it published its last kernel, nor join a kernel it
//! finds published while there (one woken from sleep for a kernel joins it
//! wherever it woke, and checks once it polls again): there it only takes
//! turns with the caller, so the kernel's chunks run one after the other.
//! The scheduler, seeing two runnable threads on one core and none on the
//! other, left them so for tens of milliseconds: an addmm of 64x256 by
//! 256x256, queued 44 times, ran at 78-82 us a call (CPU PyTorch's
//! single-threaded time, against 43-48 us with the two apart) for the first
//! 1-8 batches in 6 of 8 fresh processes, stream worker and helper on one
//! core while the host slept in a synchronize. Putting such a helper to
//! sleep, for the caller's wake-up at its next kernel to place it anew,
//! changed nothing (6 of 8): it was woken on the same core. So a helper
//! found there moves itself off: it narrows its affinity to the process's
//! other cores, which migrates it at once, and then gives the affinity back,
//! leaving the scheduler free to place it later (2 of 24 processes still had
//! such batches, 3 of 9 each). A helper that may use no other core leaves
//! the kernel to its caller and sleeps.
//!
//! Note [Waiting caller]: the caller, its own chunks done, waits for the
//! chunks helpers took the way a helper waits for a kernel: it spins
//! `CALLER_SPINS` pauses (a helper's chunk ends about when the caller's
//! does), then polls, yielding its core, for `CALLER_POLL`, and only then
//! sleeps on `Pool::finished`. The helper finishing the last chunk notifies
//! only a sleeping caller: it increments `finished` and then reads
//! `caller_sleeps`, while the caller sets `caller_sleeps` and then reads
//! `finished` (all SeqCst), so at least one of them sees the other's write,
//! and the notify, under `finished_lock`, cannot precede the caller's wait.

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Runs chunk `chunk` of a kernel; `context` is the caller's. Must not
/// unwind (a C++ body catches its exceptions: cpp/ops/kernel_split.cpp).
pub type ChunkBody = unsafe extern "C" fn(context: *mut c_void, chunk: usize);

/// How long an idle helper polls for the next kernel before it sleeps
/// (Note [Polling helpers]). A minute in this crate's unit tests, so that
/// they can tell a helper put to sleep by `worker_going_idle` from one whose
/// poll ran out.
const HELPER_POLL: Duration = if cfg!(test) {
    Duration::from_secs(60)
} else {
    Duration::from_millis(1)
};

/// Pauses a caller spins for the helpers' chunks before it polls, and how
/// long it then polls before it sleeps (Note [Waiting caller]).
const CALLER_SPINS: usize = 100;
const CALLER_POLL: Duration = Duration::from_millis(1);

/// One split kernel, shared by the caller and the helpers.
struct Job {
    body: ChunkBody,
    /// The caller's context pointer; valid until the caller returns, which
    /// it does only after every claimed chunk has finished.
    context: usize,
    chunks: usize,
    /// The chunks cut into contiguous lanes, one per thread (Note [Lanes]).
    lanes: Vec<Lane>,
    /// Threads that joined so far: the n-th starts in lane n.
    joined: AtomicUsize,
    /// Chunks finished.
    finished: AtomicUsize,
    /// Whether the caller sleeps on `Pool::finished` (Note [Waiting caller]).
    caller_sleeps: AtomicBool,
}

impl Job {
    fn new(body: ChunkBody, context: *mut c_void, chunks: usize, threads: usize) -> Job {
        let count = threads.clamp(1, chunks.max(1));
        let lanes = (0..count)
            .map(|i| Lane {
                next: AtomicUsize::new(i * chunks / count),
                end: (i + 1) * chunks / count,
            })
            .collect();
        Job {
            body,
            context: context as usize,
            chunks,
            lanes,
            joined: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            caller_sleeps: AtomicBool::new(false),
        }
    }

    /// Claims and runs chunks until none are left: first those of its own
    /// lane, then the rest of the others' (Note [Lanes]).
    fn work(&self) {
        let first = self.joined.fetch_add(1, Ordering::Relaxed);
        for i in 0..self.lanes.len() {
            self.work_lane(&self.lanes[(first + i) % self.lanes.len()]);
        }
    }

    fn work_lane(&self, lane: &Lane) {
        loop {
            let chunk = lane.next.fetch_add(1, Ordering::Relaxed);
            if chunk >= lane.end {
                return;
            }
            IN_CHUNK.with(|c| c.set(true));
            // SAFETY: `context` outlives every claimed chunk (see `context`).
            unsafe { (self.body)(self.context as *mut c_void, chunk) };
            IN_CHUNK.with(|c| c.set(false));
            // SeqCst here and on `caller_sleeps` (Note [Waiting caller]).
            if self.finished.fetch_add(1, Ordering::SeqCst) + 1 == self.chunks
                && self.caller_sleeps.load(Ordering::SeqCst)
            {
                let pool = pool();
                let _lock = pool.finished_lock.lock().unwrap_or_else(|e| e.into_inner());
                pool.finished.notify_all();
            }
        }
    }
}

/// A contiguous run of a job's chunks.
struct Lane {
    /// The next chunk of the lane to claim.
    next: AtomicUsize,
    /// One past the lane's last chunk.
    end: usize,
}

struct Pool {
    /// Threads in all, the caller counted.
    threads: usize,
    /// What the helpers watch: the job they serve now, if any.
    published: Mutex<Option<Arc<Job>>>,
    /// Jobs published so far: moved under `published`'s lock (so a helper
    /// checking it there before sleeping cannot miss a publication), read
    /// by polling helpers without it.
    generation: AtomicU64,
    /// Helpers asleep on `wake` (changed under `published`'s lock).
    sleepers: AtomicUsize,
    wake: Condvar,
    finished_lock: Mutex<()>,
    finished: Condvar,
    /// Held by the caller of the kernel the helpers serve.
    in_use: Mutex<()>,
    /// Helpers started so far (started at the first split kernel).
    started: OnceLock<usize>,
    /// The core the caller of the latest kernel was on as it published it,
    /// or -1 (Note [Helper on the caller's core]).
    caller_cpu: AtomicI32,
}

thread_local! {
    /// Whether this thread is running a chunk (a nested split runs alone).
    static IN_CHUNK: Cell<bool> = const { Cell::new(false) };
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let configured = crate::base::options::get().kernel_threads;
        let threads = if configured > 0 {
            configured
        } else {
            available_cores()
        };
        Pool {
            threads,
            published: Mutex::new(None),
            generation: AtomicU64::new(0),
            sleepers: AtomicUsize::new(0),
            wake: Condvar::new(),
            finished_lock: Mutex::new(()),
            finished: Condvar::new(),
            in_use: Mutex::new(()),
            started: OnceLock::new(),
            caller_cpu: AtomicI32::new(-1),
        }
    })
}

/// The cores this process may run on.
pub fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Threads a split kernel runs on, the caller counted.
pub fn threads() -> usize {
    pool().threads
}

fn start_helpers(pool: &'static Pool) -> usize {
    *pool.started.get_or_init(|| {
        let mut started = 0;
        for i in 1..pool.threads {
            let spawned = std::thread::Builder::new()
                .name(format!("openreg-kernel-{i}"))
                .spawn(move || helper(pool));
            match spawned {
                Ok(_) => started += 1,
                Err(e) => {
                    crate::base::error::warn_once(&format!("split kernels run on fewer threads: {e}"));
                    break;
                }
            }
        }
        started
    })
}

/// Polls `ready` for at most `window`, yielding the core between polls
/// (Notes [Polling helpers], [Waiting caller]); returns its last answer.
fn poll_yielding(window: Duration, ready: impl Fn() -> bool) -> bool {
    let since = Instant::now();
    while !ready() {
        if since.elapsed() >= window {
            return false;
        }
        std::thread::yield_now();
    }
    true
}

/// Times a stream worker found its queue empty and went to sleep.
static WORKERS_WENT_IDLE: AtomicU64 = AtomicU64::new(0);

/// Called by a stream worker about to sleep on an empty queue: polling
/// helpers stop polling and sleep too (Note [Polling helpers]).
pub fn worker_going_idle() {
    WORKERS_WENT_IDLE.fetch_add(1, Ordering::Relaxed);
}

/// Whether this thread runs on the core of the latest kernel's caller and
/// cannot leave it: found there, it first moves to another core the process
/// may use (Note [Helper on the caller's core]).
fn stuck_on_callers_core(pool: &Pool) -> bool {
    let caller = pool.caller_cpu.load(Ordering::Relaxed);
    caller >= 0 && current_cpu() == caller && !move_off_core(caller)
}

/// The core the calling thread runs on, or -1.
fn current_cpu() -> i32 {
    // SAFETY: sched_getcpu takes nothing and only reads.
    unsafe { libc::sched_getcpu() }
}

/// Moves the calling thread off core `cpu`: narrows its affinity to the
/// cores it may use but `cpu`, which migrates it at once, then gives the
/// affinity back, so that the scheduler stays free to place it. False when
/// it may use no other core.
fn move_off_core(cpu: i32) -> bool {
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: cpu_set_t is plain bits; the calls read and write only these
    // sets, for the calling thread (pid 0).
    unsafe {
        let mut allowed: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size, &mut allowed) != 0 {
            return false;
        }
        let mut elsewhere = allowed;
        libc::CPU_CLR(cpu as usize, &mut elsewhere);
        if libc::CPU_COUNT(&elsewhere) == 0 || libc::sched_setaffinity(0, size, &elsewhere) != 0 {
            return false;
        }
        libc::sched_setaffinity(0, size, &allowed);
    }
    true
}

fn helper(pool: &'static Pool) {
    let mut seen = 0;
    loop {
        let quiet = WORKERS_WENT_IDLE.load(Ordering::Relaxed);
        poll_yielding(HELPER_POLL, || {
            pool.generation.load(Ordering::Acquire) != seen
                || WORKERS_WENT_IDLE.load(Ordering::Relaxed) != quiet
                || stuck_on_callers_core(pool)
        });
        let job = {
            let mut published = pool.published.lock().unwrap_or_else(|e| e.into_inner());
            if pool.generation.load(Ordering::Acquire) == seen || stuck_on_callers_core(pool) {
                // Any kernel published now is left to its caller. A
                // publisher that bumps the generation after this sees the
                // count (both under the lock) and notifies.
                seen = pool.generation.load(Ordering::Acquire);
                pool.sleepers.fetch_add(1, Ordering::Relaxed);
                while pool.generation.load(Ordering::Acquire) == seen {
                    published = pool.wake.wait(published).unwrap_or_else(|e| e.into_inner());
                }
                pool.sleepers.fetch_sub(1, Ordering::Relaxed);
            }
            seen = pool.generation.load(Ordering::Acquire);
            published.clone()
        };
        if let Some(job) = job {
            job.work();
        }
    }
}

/// Runs `body(context, i)` for every chunk `i < chunks`, on the pool's
/// threads and the caller's, and returns when all have finished.
///
/// # Safety
/// `body` must be safe to call with `context` from any thread, concurrently
/// for distinct chunks, until this returns.
pub unsafe fn run_chunks(chunks: usize, body: ChunkBody, context: *mut c_void) {
    let pool = pool();
    let job = Arc::new(Job::new(body, context, chunks, pool.threads));
    let alone = chunks < 2 || pool.threads < 2 || IN_CHUNK.with(|c| c.get());
    let in_use = if alone {
        None
    } else {
        pool.in_use.try_lock().ok()
    };
    if in_use.is_none() || start_helpers(pool) == 0 {
        job.work();
        return;
    }
    let some_sleep = {
        let mut published = pool.published.lock().unwrap_or_else(|e| e.into_inner());
        *published = Some(job.clone());
        pool.caller_cpu.store(current_cpu(), Ordering::Relaxed);
        pool.generation.fetch_add(1, Ordering::Release);
        pool.sleepers.load(Ordering::Relaxed) > 0
    };
    if some_sleep {
        pool.wake.notify_all();
    }
    job.work();
    wait_for_helpers(pool, &job);
    *pool.published.lock().unwrap_or_else(|e| e.into_inner()) = None;
    drop(in_use);
}

/// Returns once every chunk of `job` has finished (Note [Waiting caller]).
fn wait_for_helpers(pool: &Pool, job: &Job) {
    let done = || job.finished.load(Ordering::SeqCst) == job.chunks;
    for _ in 0..CALLER_SPINS {
        if done() {
            return;
        }
        std::hint::spin_loop();
    }
    if poll_yielding(CALLER_POLL, done) {
        return;
    }
    let mut lock = pool.finished_lock.lock().unwrap_or_else(|e| e.into_inner());
    job.caller_sleeps.store(true, Ordering::SeqCst);
    while !done() {
        lock = pool.finished.wait(lock).unwrap_or_else(|e| e.into_inner());
    }
}

/// Runs `f(i)` for every chunk `i < chunks` on the pool (see `run_chunks`).
/// A panicking chunk panics the caller, after every chunk has finished.
pub fn for_each_chunk<F: Fn(usize) + Sync>(chunks: usize, f: &F) {
    struct Context<'a, F> {
        f: &'a F,
        panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
    }
    unsafe extern "C" fn call<F: Fn(usize) + Sync>(context: *mut c_void, chunk: usize) {
        // SAFETY: `context` is the `Context` below, alive until run_chunks returns.
        let context = unsafe { &*(context as *const Context<F>) };
        if let Err(panic) =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (context.f)(chunk)))
        {
            context
                .panic
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert(panic);
        }
    }
    let context = Context {
        f,
        panic: Mutex::new(None),
    };
    // SAFETY: `F: Sync`, and `context` outlives the call.
    unsafe {
        run_chunks(
            chunks,
            call::<F>,
            &context as *const Context<F> as *mut c_void,
        )
    };
    if let Some(panic) = context
        .panic
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
    {
        std::panic::resume_unwind(panic);
    }
}

/// C entry point for the shim (`cpp/ops/kernel_split.cpp`).
///
/// # Safety
/// As `run_chunks`.
#[no_mangle]
pub unsafe extern "C" fn orRunKernelChunks(chunks: usize, body: ChunkBody, context: *mut c_void) {
    unsafe { run_chunks(chunks, body, context) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    type Seen = Mutex<Vec<(usize, std::thread::ThreadId)>>;

    fn note(context: *mut c_void, chunk: usize, taking: Duration) {
        let seen = unsafe { &*(context as *const Seen) };
        std::thread::sleep(taking);
        seen.lock()
            .unwrap()
            .push((chunk, std::thread::current().id()));
    }

    unsafe extern "C" fn record(context: *mut c_void, chunk: usize) {
        note(context, chunk, Duration::from_micros(200));
    }

    /// Chunks after the first outlast a waiting caller's poll.
    unsafe extern "C" fn record_slowly(context: *mut c_void, chunk: usize) {
        let taking = if chunk == 0 {
            Duration::from_micros(200)
        } else {
            CALLER_POLL * 20
        };
        note(context, chunk, taking);
    }

    fn run_with(chunks: usize, body: ChunkBody) -> Vec<(usize, std::thread::ThreadId)> {
        let seen = Seen::default();
        unsafe { run_chunks(chunks, body, &seen as *const _ as *mut c_void) };
        seen.into_inner().unwrap()
    }

    fn run(chunks: usize) -> Vec<(usize, std::thread::ThreadId)> {
        run_with(chunks, record)
    }

    #[test]
    fn a_thread_starts_in_its_own_lane_then_takes_the_others() {
        let seen = Seen::default();
        let job = Job::new(record, &seen as *const _ as *mut c_void, 10, 2);
        job.joined.store(1, Ordering::Relaxed); // as the second thread to join
        job.work();
        let order: Vec<usize> = seen
            .into_inner()
            .unwrap()
            .into_iter()
            .map(|(c, _)| c)
            .collect();
        assert_eq!(order, [5, 6, 7, 8, 9, 0, 1, 2, 3, 4]);
    }

    #[test]
    fn lanes_cover_the_chunks_once_whatever_the_threads() {
        for (chunks, threads) in [(0, 2), (1, 4), (3, 8), (10, 3), (64, 2)] {
            let job = Job::new(record, std::ptr::null_mut(), chunks, threads);
            let mut covered = Vec::new();
            for lane in &job.lanes {
                covered.extend(lane.next.load(Ordering::Relaxed)..lane.end);
            }
            assert_eq!(
                covered,
                (0..chunks).collect::<Vec<_>>(),
                "{chunks} chunks, {threads} threads"
            );
        }
    }

    #[test]
    fn every_chunk_runs_once() {
        for chunks in [0, 1, 2, 7, 64] {
            let mut got: Vec<usize> = run(chunks).into_iter().map(|(c, _)| c).collect();
            got.sort_unstable();
            assert_eq!(got, (0..chunks).collect::<Vec<_>>());
        }
    }

    /// Whether the chunks of one 64-chunk call ran on more than one thread.
    fn one_call_spreads() -> bool {
        run(64)
            .into_iter()
            .map(|(_, t)| t)
            .collect::<HashSet<_>>()
            .len()
            > 1
    }

    #[test]
    fn helpers_take_chunks_when_cores_allow() {
        if threads() < 2 {
            return;
        }
        // The other tests of this binary run at the same time and may keep
        // every helper busy for one call (fewer hands, by design): some call
        // of a few must find one free.
        let spread = (0..20).any(|_| one_call_spreads());
        assert!(spread, "every chunk of 20 calls ran on the caller");
    }

    /// Whether every helper sleeps within 10 s, while stream workers keep
    /// going idle (the other tests of this binary run split kernels too,
    /// which set the helpers polling again).
    fn helpers_fall_asleep_as_workers_idle() -> bool {
        let helpers = start_helpers(pool());
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            worker_going_idle();
            if pool().sleepers.load(Ordering::Relaxed) == helpers {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    #[test]
    fn helpers_stop_polling_when_a_stream_worker_goes_idle() {
        if threads() < 2 {
            return;
        }
        // The helpers run a kernel and then poll, for a minute in this
        // binary (HELPER_POLL): only the idle signal puts them to sleep.
        one_call_spreads();
        assert!(
            helpers_fall_asleep_as_workers_idle(),
            "helpers went on polling after stream workers went idle"
        );
    }

    #[test]
    fn helpers_asleep_are_woken_for_the_next_kernel() {
        if threads() < 2 {
            return;
        }
        // Each call comes after the helpers have stopped polling and sleep
        // (Note [Polling helpers]): the publisher must notice and wake them.
        let spread = (0..20).any(|_| {
            assert!(helpers_fall_asleep_as_workers_idle());
            one_call_spreads()
        });
        assert!(
            spread,
            "every chunk of 20 calls after an idle spell ran on the caller"
        );
    }

    #[test]
    fn a_caller_asleep_is_woken_by_the_last_helper_chunk() {
        if threads() < 2 {
            return;
        }
        // The caller claims chunk 0, the quick one: when a helper took the
        // slow one, the caller is out of chunks and asleep long before it
        // ends, and the helper must wake it.
        let spread = (0..20).any(|_| {
            let seen = run_with(2, record_slowly);
            assert_eq!(seen.len(), 2);
            seen[0].1 != seen[1].1
        });
        assert!(spread, "every chunk of 20 calls ran on the caller");
    }

    fn affinity() -> Vec<usize> {
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::cpu_set_t>();
        assert_eq!(unsafe { libc::sched_getaffinity(0, size, &mut set) }, 0);
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
            .collect()
    }

    #[test]
    fn a_thread_moved_off_a_core_runs_elsewhere_with_its_affinity_back() {
        std::thread::spawn(|| {
            let allowed = affinity();
            if allowed.len() < 2 {
                return;
            }
            for _ in 0..5 {
                let here = current_cpu();
                assert!(move_off_core(here));
                assert_ne!(current_cpu(), here, "still on core {here}");
                assert_eq!(affinity(), allowed);
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_with_one_core_stays_there() {
        std::thread::spawn(|| {
            let here = current_cpu();
            let mut only: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            unsafe { libc::CPU_SET(here as usize, &mut only) };
            let size = std::mem::size_of::<libc::cpu_set_t>();
            assert_eq!(unsafe { libc::sched_setaffinity(0, size, &only) }, 0);
            assert!(!move_off_core(here));
            assert_eq!(current_cpu(), here);
            assert_eq!(affinity(), [here as usize]);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn concurrent_callers_all_finish() {
        let handles: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(|| run(16).len()))
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), 16);
        }
    }

    unsafe extern "C" fn nested(context: *mut c_void, _chunk: usize) {
        unsafe extern "C" fn inner(context: *mut c_void, _chunk: usize) {
            unsafe { &*(context as *const AtomicUsize) }.fetch_add(1, Ordering::Relaxed);
        }
        unsafe { run_chunks(3, inner, context) };
    }

    #[test]
    fn a_chunk_that_splits_runs_its_chunks_alone() {
        let count = AtomicUsize::new(0);
        unsafe { run_chunks(8, nested, &count as *const _ as *mut c_void) };
        assert_eq!(count.load(Ordering::Relaxed), 24);
    }
}
