//! Streams: in-order work queues, each executed by its own lazily started
//! worker thread, so different streams run concurrently.
//!
//! Note [StreamId assignment]: a stream is the value `(device, id)`.
//! Id 0 is the device's default stream. Pool streams have ids
//! `1 + level * pool_size() + slot`, where `level` 0 holds the normal
//! priority (0) and level 1 the high priority (-1), and `slot` (0..pool_size())
//! is handed out round-robin. `pool_size()` is `OPENREG_STREAM_POOL_SIZE`
//! (default 32, as CUDA's pools), fixed for the process: options are read
//! once, so an id means the same stream for the whole run. Ids outside
//! `0..=2 * pool_size()` name no stream and are rejected.
//!
//! Note [Stream progress]: every submitted task gets the next sequence number
//! (`submitted`); the worker bumps `completed` only after the task has run.
//! Hence "all work finished" is exactly `completed == submitted`, even while
//! the last task is executing with an empty queue. Both counters only move
//! under the queue's mutex, and every waiter re-checks them under that mutex
//! before sleeping on `progress`; the worker notifies `progress` after each
//! bump, so no wake-up can be lost.
//!
//! Note [Inline launches]: a short kernel launched on an idle stream may run
//! on the calling thread instead of waking the worker: the stream reserves
//! the next sequence number for it and is busy until it finishes; work
//! submitted meanwhile queues behind it (the worker does not start a task
//! while an inline one runs). The result is the same order as queuing, less
//! two thread hand-offs.
//!
//! Note [Capturing streams]: while a stream captures a graph (src/runtime/graph.rs)
//! `submit` hands each task to the capture instead of queuing it, and the
//! stream never runs work inline; its counters do not move, so everything
//! submitted before the capture still completes in order.
//!
//! Note [Task names]: each queued task carries a `TaskName`, so an op
//! timeout can say which kernel has run too long. A C++ kernel's name is
//! its `const char*` (an operator name such as "aten::mul", or a literal),
//! which lives for the process; the queue keeps that pointer, and the
//! running task's name, without copying, so naming costs a launch nothing.
//! The text is read only when an error is built.
//!
//! Note [Sticky kernel failures]: a failed task (a kernel that threw, an
//! injected kernel fault) is parked on its stream, and the next call that
//! waits for that stream because the user asked for a result reports it:
//! `synchronize()` of the stream, its device or an event recorded on it,
//! `.item()`, `.cpu()`, `.tolist()`, a blocking copy, an op with a
//! data-dependent shape, whether the wait found the stream busy (a queued
//! wait) or idle (the op ran inline, then `take_failure`). CUDA reports a
//! sticky error at every such call; openreg reports each failure once, at
//! the first of them, and stays usable after it, so a test suite can go on
//! in the same process. The runtime's own waits (a plan's first check, the
//! allocator) leave it parked.
//!
//! Note [Waiting from inside a kernel]: a thread that runs a stream's work
//! (its worker, or a thread running an inline task) and then waits for that
//! same stream would wait for itself forever: a CPU kernel that called an op
//! on openreg tensors would do that. `RUNNING_STREAM` remembers which stream
//! the thread runs work of, and such a wait is an error naming the stream
//! instead of a hang.
//!
//! Note [Idle workers]: a stream's worker thread is spawned by the first
//! submission and exits after `OPENREG_WORKER_IDLE_MS` with nothing to do, so a
//! process that touched a hundred streams keeps no hundred idle threads, and
//! an idle worker sleeps on a condition variable at no CPU cost.
//!
//! Note [Retired tasks]: a task the worker has run is not dropped there but
//! kept in `QueueState::retired`, and the next submission drops it on the
//! submitting thread. A kernel task holds what the host made for it (its
//! arguments, views of device memory, the closure): freed on the worker,
//! every such block crossed threads, and glibc's malloc then took the
//! host's arena lock for it (the worker's per-thread cache of freed blocks
//! fills at once when it never allocates them) while the host allocated
//! from the same arena: perf of the MLP step put 14% of the host's time in
//! malloc and in waking the worker blocked on that lock. Freed by the host,
//! the blocks go back to its own cache, still warm, for its next ops. When
//! a task leaves the queue empty, the worker drops it and every retired
//! task before it counts the task complete, so a synchronize still returns
//! with the memory of finished work freed, and an idle stream holds none.

use std::collections::VecDeque;
use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

use std::cell::Cell;

use crate::runtime::device::DeviceIndex;
use crate::base::error::{Error, ErrorKind, Result};
use crate::runtime::event::Event;
use crate::runtime::graph::Capture;
use crate::base::options::{self, MAX_DEVICES};
use crate::runtime::hooks;

thread_local! {
    /// The stream whose work this thread runs, as an address (0: none).
    /// Note [Waiting from inside a kernel].
    static RUNNING_STREAM: Cell<usize> = const { Cell::new(0) };
}

pub type StreamId = i64;

pub const DEFAULT_STREAM_ID: StreamId = 0;
/// Priorities follow CUDA: a lower number is a higher priority.
pub const LOWEST_PRIORITY: i32 = 0;
pub const HIGHEST_PRIORITY: i32 = -1;
const PRIORITY_LEVELS: usize = (LOWEST_PRIORITY - HIGHEST_PRIORITY) as usize + 1;

/// Streams in each priority's pool of a device (`OPENREG_STREAM_POOL_SIZE`;
/// Note [StreamId assignment]).
#[inline]
pub fn pool_size() -> usize {
    options::get().stream_pool_size
}

/// Streams of one device: the default stream and every pool's.
#[inline]
pub(crate) fn streams_per_device() -> usize {
    1 + PRIORITY_LEVELS * pool_size()
}

/// A marker that lets the C ABI reject pointers that are not streams.
const STREAM_MAGIC: u64 = 0x6f70_656e_7265_6753; // "openregS"

/// One unit of work on a stream.
pub enum Task {
    /// Host code run by the stream's worker (a kernel, a host function),
    /// with device memory accessible. A failure is parked for the next
    /// `synchronize` of the stream.
    /// A closure that can run again: a captured one runs once per graph
    /// replay (Note [Graph capture] in graph.rs).
    Run(Box<dyn FnMut() -> Result<()> + Send>),
    /// Block this stream until `stream` has completed `seq` tasks (event wait).
    WaitFor {
        stream: &'static StreamQueue,
        seq: u64,
    },
    /// Stamp the time this point of the stream is reached (timing events).
    Timestamp { event: Arc<Event>, version: u64 },
}

/// What a task is called in errors (Note [Task names]): a kernel's name,
/// or a phrase for work that is not a kernel. Two words, copied freely.
#[derive(Clone, Copy, Debug)]
pub struct TaskName {
    /// A NUL-terminated string that lives for the process.
    text: *const c_char,
    kernel: bool,
}

// SAFETY: `text` points to immutable bytes that live for the process.
unsafe impl Send for TaskName {}
unsafe impl Sync for TaskName {}

impl TaskName {
    /// A task submitted without a name.
    pub const UNNAMED: TaskName = TaskName::other(c"an unnamed task");
    /// A kernel the shim runs on the caller's thread (Note [Inline launches]).
    pub const INLINE: TaskName = TaskName::other(c"a kernel run inline by another thread");

    /// The kernel called `name`.
    pub const fn kernel(name: &'static CStr) -> TaskName {
        TaskName {
            text: name.as_ptr(),
            kernel: true,
        }
    }

    /// Work that is not a kernel, described by `phrase` ("a wait for …").
    pub const fn other(phrase: &'static CStr) -> TaskName {
        TaskName {
            text: phrase.as_ptr(),
            kernel: false,
        }
    }

    /// The kernel called `name`; a null `name` reads as "kernel".
    ///
    /// # Safety
    /// A non-null `name` is a NUL-terminated string that is never freed or
    /// changed (a string literal, an operator's name).
    pub unsafe fn kernel_from_ptr(name: *const c_char) -> TaskName {
        match name.is_null() {
            true => TaskName::kernel(c"kernel"),
            false => TaskName {
                text: name,
                kernel: true,
            },
        }
    }

    /// The name alone: "aten::mul", "an unnamed task".
    pub fn text(&self) -> std::borrow::Cow<'static, str> {
        // SAFETY: per the constructors, `text` is a NUL-terminated string
        // that lives for the process.
        unsafe { CStr::from_ptr(self.text) }.to_string_lossy()
    }
}

impl std::fmt::Display for TaskName {
    /// `kernel "aten::mul"`, or the phrase of other work.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kernel {
            true => write!(f, "kernel {:?}", self.text()),
            false => f.write_str(&self.text()),
        }
    }
}

impl Task {
    /// The name of a task submitted without one.
    fn default_name(&self) -> TaskName {
        match self {
            Task::Run(_) => TaskName::UNNAMED,
            Task::WaitFor { .. } => {
                TaskName::other(c"a wait for work of another stream (an event wait)")
            }
            Task::Timestamp { .. } => TaskName::other(c"an event time stamp"),
        }
    }
}

/// What a stream is running now (Note [Op timeout]).
#[derive(Clone, Copy)]
struct Running {
    since: Instant,
    name: TaskName,
}

struct QueueState {
    tasks: VecDeque<(Task, TaskName)>,
    completed: u64,
    worker_running: bool,
    /// A task runs on a caller's thread (Note [Inline launches]).
    inline_running: bool,
    /// The task running now, and since when (Note [Op timeout]).
    running: Option<Running>,
    shutting_down: bool,
    /// A task that failed; reported by the next wait the user asked for
    /// (Note [Sticky kernel failures]).
    deferred_error: Option<Error>,
    /// The graph capture this stream records into (Note [Capturing streams]).
    capture: Option<Arc<Capture>>,
    /// The lowest `completed` count a waiter sleeps for, `u64::MAX` if none
    /// (Note [Waking waiters]).
    awaited: u64,
    /// Tasks run by the worker, dropped by the next submission (Note
    /// [Retired tasks]).
    retired: Vec<Task>,
}

/// A stream's queue and its worker's state. Lives for the whole process.
pub struct StreamQueue {
    magic: u64,
    device: DeviceIndex,
    id: StreamId,
    state: Mutex<QueueState>,
    /// Signalled when a task is queued or shutdown starts (the worker waits).
    work_available: Condvar,
    /// Signalled when `completed` reaches `QueueState::awaited`, or the
    /// worker exits (Note [Waking waiters]).
    progress: Condvar,
    /// Tasks submitted so far (Note [Stream progress]). It moves only under
    /// `state`'s lock, like `completed`; it is atomic so that `marker` (on
    /// every allocator free) reads it without locking.
    submitted: AtomicU64,
    /// `QueueState::completed`, readable without locking (the fast paths of
    /// `has_completed` and `wait_for`: an event's synchronize on a point
    /// already reached). Stored under the lock, after the task has run.
    completed_seq: AtomicU64,
    /// The allocator key of the pool a capturing stream allocates from, 0
    /// when not capturing (read on every allocation without locking; Note
    /// [Graph pools] in allocator.rs).
    capture_pool: AtomicUsize,
    /// Whether `deferred_error` holds a failure, read without locking by
    /// every inline op that returns host data (Note [Sticky kernel failures]).
    failure_parked: AtomicBool,
}

impl StreamQueue {
    fn new(device: DeviceIndex, id: StreamId) -> StreamQueue {
        StreamQueue {
            magic: STREAM_MAGIC,
            device,
            id,
            state: Mutex::new(QueueState {
                tasks: VecDeque::new(),
                completed: 0,
                worker_running: false,
                inline_running: false,
                running: None,
                shutting_down: false,
                deferred_error: None,
                capture: None,
                awaited: u64::MAX,
                retired: Vec::new(),
            }),
            work_available: Condvar::new(),
            progress: Condvar::new(),
            submitted: AtomicU64::new(0),
            completed_seq: AtomicU64::new(0),
            capture_pool: AtomicUsize::new(0),
            failure_parked: AtomicBool::new(false),
        }
    }

    pub fn device(&self) -> DeviceIndex {
        self.device
    }

    pub fn id(&self) -> StreamId {
        self.id
    }

    pub fn priority(&self) -> i32 {
        if self.id == DEFAULT_STREAM_ID {
            LOWEST_PRIORITY
        } else {
            LOWEST_PRIORITY - ((self.id - 1) as usize / pool_size()) as i32
        }
    }

    /// Whether `ptr` points at a live stream (the C ABI's handle check).
    ///
    /// # Safety
    /// `ptr` must be null or point to readable memory of at least the size of
    /// a `StreamQueue`; handles we gave out always do.
    pub unsafe fn from_handle(ptr: *const StreamQueue) -> Result<&'static StreamQueue> {
        // SAFETY: the caller guarantees readability; streams are never freed.
        match unsafe { ptr.as_ref() } {
            Some(q) if q.magic == STREAM_MAGIC => Ok(q),
            _ => Err(Error::new(
                ErrorKind::InvalidHandle,
                format!("{ptr:p} is not an openreg stream handle"),
            )),
        }
    }

    /// Queues `task`; returns its sequence number. See Note [Stream progress].
    /// A capturing stream records it instead (Note [Capturing streams]) and
    /// returns the current marker, which is already passed by then.
    pub fn submit(&'static self, task: Task) -> Result<u64> {
        let name = task.default_name();
        self.submit_named(task, name, String::new)
    }

    /// `submit`, naming the task for errors (Note [Task names]), with a
    /// description of it for a capture's debug dump (called only then).
    pub fn submit_named(
        &'static self,
        task: Task,
        name: TaskName,
        describe: impl FnOnce() -> String,
    ) -> Result<u64> {
        let retired;
        let seq = {
            let mut st = self.state.lock();
            if st.shutting_down {
                return Err(Error::invalid_value(format!(
                    "{self} is shut down: the runtime is finalizing"
                )));
            }
            // Under the lock: Note [Stopped devices] in device_stop.rs.
            crate::runtime::device_stop::check_running(self.device)?;
            if let Some(capture) = st.capture.clone() {
                drop(st);
                capture.record(self, task, describe)?;
                return Ok(self.marker());
            }
            st.tasks.push_back((task, name));
            retired = std::mem::take(&mut st.retired); // dropped unlocked, below
            if st.worker_running {
                self.work_available.notify_one();
            } else {
                self.spawn_worker(&mut st)?;
            }
            if st.completed == self.marker() {
                crate::runtime::utilization::stream_became_busy(self.device); // Note [Busy clock]
            }
            // The worker cannot take the task before the lock is released.
            self.count_submission(&st)
        };
        drop(retired);
        if options::get().launch_blocking {
            self.wait_for(seq, true)?;
        }
        Ok(seq)
    }

    #[cold]
    fn spawn_worker(&'static self, st: &mut QueueState) -> Result<()> {
        let spawned = std::thread::Builder::new()
            .name(format!("openreg-d{}-s{}", self.device, self.id))
            .spawn(move || self.worker_loop());
        match spawned {
            Ok(_) => {
                st.worker_running = true;
                Ok(())
            }
            Err(e) => {
                st.tasks.pop_back();
                Err(Error::invalid_value(format!(
                    "{self}: cannot start its worker thread: {e}"
                )))
            }
        }
    }

    fn worker_loop(&'static self) {
        RUNNING_STREAM.with(|running| running.set(self as *const Self as usize));
        let idle = Duration::from_millis(options::get().worker_idle_ms);
        let mut st = self.state.lock();
        loop {
            if !st.inline_running {
                if let Some((task, name)) = st.tasks.pop_front() {
                    st.running = Some(Running {
                        since: Instant::now(),
                        name,
                    });
                    drop(st);
                    let is_kernel = matches!(task, Task::Run(_));
                    let mut task = task;
                    let outcome = catch_unwind(AssertUnwindSafe(|| run(&mut task)));
                    st = self.state.lock();
                    if st.tasks.is_empty() {
                        // The queue drains: free everything run before the
                        // completion counts (Note [Retired tasks]).
                        let retired = std::mem::take(&mut st.retired);
                        MutexGuard::unlocked(&mut st, || drop((task, retired)));
                    } else {
                        st.retired.push(task);
                    }
                    st.running = None;
                    if let Err(e) = self.flatten(outcome, name) {
                        self.park_failure(&mut st, || e);
                    }
                    if is_kernel {
                        self.after_kernel(&mut st);
                    }
                    self.count_completed(&mut st, 1);
                    if st.completed == self.marker() {
                        crate::runtime::utilization::stream_became_idle(self.device);
                    }
                    continue;
                }
            }
            crate::runtime::kernel_pool::worker_going_idle();
            if st.shutting_down
                || self.work_available.wait_for(&mut st, idle).timed_out() && st.tasks.is_empty()
            {
                st.worker_running = false;
                self.progress.notify_all();
                return;
            }
        }
    }

    /// A task's outcome as a runtime result; a failed kernel's error names
    /// it (a failure reported at a later wait says which op failed).
    fn flatten(&self, outcome: std::thread::Result<Result<()>>, name: TaskName) -> Result<()> {
        match outcome {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) if name.kernel => Err(Error::new(
                e.kind,
                format!("{name} on {self} failed: {e}"),
            )),
            Ok(Err(e)) => Err(Error::new(
                e.kind,
                format!("a kernel on {self} failed: {e}"),
            )),
            Err(panic) => Err(task_failed(self, panic)),
        }
    }

    /// Runs `task` on the calling thread if the stream is idle, else queues
    /// it (Note [Inline launches]). An inline task's failure is returned.
    pub fn run_inline_or_submit(&'static self, task: Task, name: TaskName) -> Result<()> {
        if !self.try_begin_inline(name) {
            return self.submit_named(task, name, String::new).map(drop);
        }
        let outcome = catch_unwind(AssertUnwindSafe(move || run(&mut { task })));
        self.end_inline();
        self.flatten(outcome, name)
    }

    /// Reserves the idle stream for work the caller runs itself; false if
    /// the stream is busy. A true result must be followed by `end_inline`.
    /// `name` names the work for an op timeout seen by another thread.
    pub fn try_begin_inline(&self, name: TaskName) -> bool {
        let mut st = self.state.lock();
        if st.completed != self.marker()
            || st.shutting_down
            || st.capture.is_some()
            || crate::runtime::device_stop::is_stopped(self.device)
        {
            return false; // a stopped device's error comes from `submit`
        }
        crate::runtime::utilization::stream_became_busy(self.device);
        self.count_submission(&st);
        st.inline_running = true;
        RUNNING_STREAM.with(|running| running.set(self as *const Self as usize));
        st.running = Some(Running {
            since: Instant::now(),
            name,
        });
        true
    }

    /// Parks the failure the `AFTER_KERNEL` hook reports for the kernel that
    /// just ran (an injected fault: Note [Injected faults] in fault.rs).
    fn after_kernel(&self, st: &mut QueueState) {
        if let Some(failure) = hooks::AFTER_KERNEL.get().and_then(|hook| hook(self)) {
            self.park_failure(st, || failure);
        }
    }

    /// Completes the work reserved by `try_begin_inline`.
    pub fn end_inline(&self) {
        RUNNING_STREAM.with(|running| running.set(0));
        let mut st = self.state.lock();
        self.after_kernel(&mut st);
        st.running = None;
        self.count_completed(&mut st, 1);
        if st.completed == self.marker() {
            crate::runtime::utilization::stream_became_idle(self.device);
        }
        st.inline_running = false;
        // Work queued behind the inline task waits for this; an idle worker
        // with nothing queued is left asleep (waking it costs a futex call
        // and restarts its idle countdown: Note [Idle workers]).
        if !st.tasks.is_empty() {
            self.work_available.notify_one();
        }
    }

    /// True when every submitted task has finished running.
    pub fn query(&self) -> bool {
        let st = self.state.lock();
        st.completed == self.marker()
    }

    /// Waits for everything submitted so far; reports a failed task once.
    pub fn synchronize(&self) -> Result<()> {
        self.wait_for(self.marker(), true)
    }

    /// The user's `synchronize()`: the host is then ordered after the
    /// stream's work so far (Note [Stream sanitizer]), which the runtime's
    /// own waits never order it after.
    pub fn host_synchronize(&'static self) -> Result<()> {
        let point = hooks::order_point(&[self]);
        self.synchronize()?;
        match point {
            Some(point) => hooks::host_waited_for(&point, false),
            None => Ok(()),
        }
    }

    /// The user's `query()`: true also orders the host after the stream's
    /// work up to the query (Note [Stream sanitizer]).
    pub fn host_query(&'static self) -> Result<bool> {
        let point = hooks::order_point(&[self]);
        let done = self.query();
        if let Some(point) = point.filter(|_| done) {
            hooks::host_waited_for(&point, true)?;
        }
        Ok(done)
    }

    /// Waits until `seq` tasks have completed. With `take_error` (a user's
    /// wait), a parked task failure is returned (once) instead of `Ok`, and
    /// a task running longer than the op timeout ends the wait with an error
    /// (Note [Op timeout]).
    pub fn wait_for(&self, seq: u64, take_error: bool) -> Result<()> {
        if self.has_completed(seq) && !(take_error && self.has_parked_failure()) {
            return Ok(());
        }
        let mut st = self.state.lock();
        if st.completed < seq && RUNNING_STREAM.with(Cell::get) == self as *const Self as usize {
            return Err(self.waits_for_itself());
        }
        while st.completed < seq {
            match crate::runtime::op_timeout::limit().filter(|_| take_error) {
                None => {
                    self.await_progress(&mut st, seq, None);
                }
                Some(limit) => {
                    let started = st.running.map_or_else(Instant::now, |r| r.since);
                    if let Some(running) = st.running.filter(|r| r.since.elapsed() >= limit) {
                        return Err(self.timed_out(running, limit));
                    }
                    self.await_progress(&mut st, seq, Some(started + limit));
                }
            }
        }
        match take_error.then(|| self.take_parked(&mut st)).flatten() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Takes the parked failure, if any, to report it (under the lock, so a
    /// failure parked meanwhile keeps its flag).
    fn take_parked(&self, st: &mut QueueState) -> Option<Error> {
        self.failure_parked.store(false, Ordering::Release);
        st.deferred_error.take()
    }

    /// Keeps the first failure of the stream's work for the next user wait.
    fn park_failure(&self, st: &mut QueueState, failure: impl FnOnce() -> Error) {
        if st.deferred_error.is_none() {
            st.deferred_error = Some(failure());
            self.failure_parked.store(true, Ordering::Release);
        }
    }

    /// Whether a failure waits to be reported; no lock.
    pub fn has_parked_failure(&self) -> bool {
        self.failure_parked.load(Ordering::Acquire)
    }

    #[cold]
    fn waits_for_itself(&self) -> Error {
        Error::invalid_value(format!(
            "work running on {self} waits for {self} itself, which would never return (an op on openreg \
             tensors called from inside a kernel on that stream)"
        ))
    }

    /// Reports a parked task failure (once), as a wait the user asked for
    /// does: for a user's wait that found the stream idle and ran inline.
    pub fn take_failure(&self) -> Result<()> {
        if !self.has_parked_failure() {
            return Ok(());
        }
        let failure = self.take_parked(&mut self.state.lock());
        failure.map_or(Ok(()), Err)
    }

    #[cold]
    fn timed_out(&self, running: Running, limit: Duration) -> Error {
        Error::new(
            ErrorKind::NotReady,
            format!(
                "openreg op timeout: {} running on {self} has run for {} ms, longer than the {} ms of \
                 torch.openreg.set_op_timeout_ms; the wait gave up (the kernel keeps running)",
                running.name,
                running.since.elapsed().as_millis(),
                limit.as_millis()
            ),
        )
    }

    /// The name of the task running now, if any (Note [Task names]).
    pub fn running_task(&self) -> Option<TaskName> {
        self.state.lock().running.map(|r| r.name)
    }

    /// The capture this stream records into, if it is capturing.
    pub fn capture(&self) -> Option<Arc<Capture>> {
        if self.capture_pool.load(Ordering::Acquire) == 0 {
            return None; // the common case, without locking
        }
        self.state.lock().capture.clone()
    }

    /// The allocator key of the pool this stream allocates from while it
    /// captures; 0 when it does not.
    #[inline]
    pub fn capture_pool(&self) -> usize {
        self.capture_pool.load(Ordering::Acquire)
    }

    /// Starts recording into `capture` (Note [Capturing streams]).
    pub(crate) fn join_capture(&self, capture: Arc<Capture>) -> Result<()> {
        let mut st = self.state.lock();
        if st.capture.is_some() {
            return Err(Error::new(
                ErrorKind::StreamCapture,
                format!("{self} is already part of a graph capture"),
            ));
        }
        self.capture_pool
            .store(capture.pool_key(), Ordering::Release);
        st.capture = Some(capture);
        Ok(())
    }

    /// Stops recording: later work runs again.
    pub(crate) fn leave_capture(&self) {
        let mut st = self.state.lock();
        st.capture = None;
        self.capture_pool.store(0, Ordering::Release);
    }

    /// The current end of the stream: it has passed this point once it has
    /// completed this many tasks.
    pub fn marker(&self) -> u64 {
        self.submitted.load(Ordering::Acquire)
    }

    /// One more task submitted; returns its sequence number. The caller
    /// holds the lock (`_st`), so a plain load and store suffice.
    fn count_submission(&self, _st: &QueueState) -> u64 {
        let seq = self.marker() + 1;
        self.submitted.store(seq, Ordering::Release);
        seq
    }

    /// Whether the first `seq` tasks have completed.
    pub fn has_completed(&self, seq: u64) -> bool {
        self.completed_seq.load(Ordering::Acquire) >= seq
    }

    /// `count` more tasks have finished running (under the lock, `st`);
    /// wakes the waiters once the first of them can go (Note [Waking
    /// waiters]).
    fn count_completed(&self, st: &mut QueueState, count: u64) {
        st.completed += count;
        self.completed_seq.store(st.completed, Ordering::Release);
        if st.completed >= st.awaited {
            st.awaited = u64::MAX;
            self.progress.notify_all();
        }
    }

    /// Note [Waking waiters]: a thread waiting for the stream (a
    /// synchronize, an event's, another stream's WaitFor task) sleeps until
    /// the count it waits for is reached, not at every completed task. Each
    /// sleeper lowers `awaited` to its count; the task completion that
    /// reaches it wakes every sleeper and resets it, and those still short
    /// of their count lower it again before sleeping. Waking the host at
    /// every task cost the worker a futex call per task (5-8 us on this
    /// VM's cross-core wake-ups) and the host a pointless context switch on
    /// the core the kernel pool needs, through a whole synchronize.
    ///
    /// Sleeps on `progress` until woken, or until `deadline`, as a waiter
    /// for `seq` completed tasks; true if the deadline passed.
    fn await_progress(
        &self,
        st: &mut MutexGuard<'_, QueueState>,
        seq: u64,
        deadline: Option<Instant>,
    ) -> bool {
        st.awaited = st.awaited.min(seq);
        match deadline {
            Some(deadline) => self.progress.wait_until(st, deadline).timed_out(),
            None => {
                self.progress.wait(st);
                false
            }
        }
    }

    /// Marks "this point" of the stream for an event: returns the sequence
    /// number the stream must complete to pass it. For a timing marker, an
    /// idle stream has already reached it, so its time is returned for the
    /// caller to store; a busy stream gets a task that stamps `event` when
    /// the worker gets there. (Returning the time instead of stamping here
    /// lets the caller hold the event's lock.)
    pub(crate) fn mark(
        &'static self,
        timestamp: Option<(Arc<Event>, u64)>,
    ) -> Result<(u64, Option<Instant>)> {
        let Some((event, version)) = timestamp else {
            return Ok((self.marker(), None));
        };
        let st = self.state.lock();
        if st.completed != self.marker() {
            drop(st);
            Ok((self.submit(Task::Timestamp { event, version })?, None))
        } else {
            Ok((self.marker(), Some(Instant::now())))
        }
    }

    /// Waits until `seq` tasks have completed or `deadline` passed; returns
    /// whether they completed. Leaves parked failures alone.
    pub fn wait_until(&self, seq: u64, deadline: Instant) -> bool {
        let mut st = self.state.lock();
        while st.completed < seq {
            if self.await_progress(&mut st, seq, Some(deadline)) {
                return st.completed >= seq;
            }
        }
        true
    }

    /// Gives up the queued tasks that have not started (Note [Bounded exit
    /// drain] in lifecycle.rs, Note [Stopped devices] in device_stop.rs) and
    /// returns them, for the caller to drop or leak outside the stream's
    /// lock (what they captured may take other locks when dropped, or need
    /// an interpreter that is going away). They count as completed, so no
    /// waiter hangs; the stream's next synchronize reports them, saying
    /// `why` ("at exit").
    pub(crate) fn abandon_queued(&self, why: &str) -> Vec<Task> {
        let mut st = self.state.lock();
        let abandoned: Vec<Task> = std::mem::take(&mut st.tasks)
            .into_iter()
            .map(|(task, _)| task)
            .collect();
        let count = abandoned.len();
        if count == 0 {
            return abandoned;
        }
        self.count_completed(&mut st, count as u64);
        self.park_failure(&mut st, || {
            Error::invalid_value(format!(
                "{self}: {count} queued kernels were abandoned {why}"
            ))
        });
        if st.completed == self.marker() {
            crate::runtime::utilization::stream_became_idle(self.device);
        }
        abandoned
    }

    /// Drains the queue and stops the worker (runtime finalization), waiting
    /// until `deadline` at most; returns whether the worker stopped.
    pub(crate) fn shut_down(&self, deadline: Option<Instant>) -> bool {
        let mut st = self.state.lock();
        st.shutting_down = true;
        self.work_available.notify_all();
        while st.worker_running {
            match deadline {
                Some(deadline) => {
                    if self.progress.wait_until(&mut st, deadline).timed_out() {
                        return !st.worker_running;
                    }
                }
                None => self.progress.wait(&mut st),
            }
        }
        true
    }
}

impl std::fmt::Display for StreamQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "openreg stream {} on device {}", self.id, self.device)
    }
}

fn run(task: &mut Task) -> Result<()> {
    match task {
        Task::Run(f) => {
            let _window = crate::memory::device_memory::AccessWindow::open();
            f()
        }
        // A parked error of the other stream is that stream's to report.
        Task::WaitFor { stream, seq } => {
            let _ = stream.wait_for(*seq, false);
            Ok(())
        }
        Task::Timestamp { event, version } => {
            event.stamp(*version, Instant::now());
            Ok(())
        }
    }
}

#[cold]
fn task_failed(stream: &StreamQueue, panic: Box<dyn std::any::Any + Send>) -> Error {
    let what = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("unknown panic");
    Error::invalid_value(format!("a task on {stream} failed: {what}"))
}

/// The streams of one device: the default stream and the priority pools.
pub struct DeviceStreams {
    device: DeviceIndex,
    streams: Box<[StreamQueue]>,
    next_slot: [AtomicUsize; PRIORITY_LEVELS],
}

impl DeviceStreams {
    pub fn new(device: DeviceIndex) -> DeviceStreams {
        DeviceStreams {
            device,
            streams: (0..streams_per_device() as StreamId)
                .map(|id| StreamQueue::new(device, id))
                .collect(),
            next_slot: [const { AtomicUsize::new(0) }; PRIORITY_LEVELS],
        }
    }

    /// The stream with `id`, or an error naming the id and the device.
    #[inline]
    pub fn get(&'static self, id: StreamId) -> Result<&'static StreamQueue> {
        check_stream_id(self.device, id)?;
        Ok(&self.streams[id as usize])
    }

    /// The next pool stream of `priority` (clamped to the supported range),
    /// handed out round-robin.
    pub fn from_pool(&'static self, priority: i32) -> &'static StreamQueue {
        let level = (LOWEST_PRIORITY - priority.clamp(HIGHEST_PRIORITY, LOWEST_PRIORITY)) as usize;
        let pool = pool_size();
        let slot = self.next_slot[level].fetch_add(1, Ordering::Relaxed) % pool;
        &self.streams[1 + level * pool + slot]
    }

    /// Every stream of the device.
    pub(crate) fn all(&'static self) -> Vec<&'static StreamQueue> {
        self.streams.iter().collect()
    }

    pub fn synchronize_all(&self) -> Result<()> {
        self.streams.iter().try_for_each(StreamQueue::synchronize)
    }

    /// Waits for the work submitted so far on every stream until `deadline`,
    /// leaving parked failures for the next `synchronize` (Note [Host exit]
    /// in lifecycle.rs); returns whether all of it completed.
    pub(crate) fn drain_all(&self, deadline: Instant) -> bool {
        self.streams
            .iter()
            .all(|s| s.wait_until(s.marker(), deadline))
    }

    /// `(stream, its current end)` for every stream with unfinished work.
    pub(crate) fn unfinished_points(&'static self) -> Vec<(&'static StreamQueue, u64)> {
        self.streams
            .iter()
            .map(|s| (s, s.marker()))
            .filter(|(s, seq)| !s.has_completed(*seq))
            .collect()
    }

    /// Abandons every stream's queued tasks, saying `why`; returns them
    /// (see `StreamQueue::abandon_queued`).
    pub(crate) fn abandon_all(&self, why: &str) -> Vec<Task> {
        self.streams
            .iter()
            .flat_map(|s| s.abandon_queued(why))
            .collect()
    }

    /// Stops every worker, waiting until `deadline` at most; returns whether
    /// all stopped.
    pub(crate) fn shut_down_all(&self, deadline: Option<Instant>) -> bool {
        self.streams
            .iter()
            .fold(true, |all, s| s.shut_down(deadline) && all)
    }

    /// How many of this device's streams have a live worker thread.
    pub fn live_workers(&self) -> usize {
        self.streams
            .iter()
            .filter(|s| s.state.lock().worker_running)
            .count()
    }
}

#[cold]
fn invalid_stream(device: DeviceIndex, id: StreamId) -> Error {
    Error::new(
        ErrorKind::InvalidHandle,
        format!(
            "stream id {id} is not an openreg stream of device {device} (valid ids are 0..={}: the default stream 0 \
             and two pools of OPENREG_STREAM_POOL_SIZE={} streams)",
            streams_per_device() - 1,
            pool_size()
        ),
    )
}

/// Validates a stream id without needing the device's context.
pub fn check_stream_id(device: DeviceIndex, id: StreamId) -> Result<()> {
    if (0..streams_per_device() as StreamId).contains(&id) {
        Ok(())
    } else {
        Err(invalid_stream(device, id))
    }
}

thread_local! {
    /// This thread's current stream id per device; every thread starts on
    /// each device's default stream.
    static CURRENT_STREAM: [Cell<StreamId>; MAX_DEVICES] = const { [const { Cell::new(DEFAULT_STREAM_ID) }; MAX_DEVICES] };
}

/// This thread's current stream id on `device` (an already checked index).
#[inline]
pub fn current_stream_id(device: DeviceIndex) -> StreamId {
    CURRENT_STREAM.with(|c| c[device as usize].get())
}

/// Makes `(device, id)` current for `device` on this thread; returns the
/// previous id. Does not change the current device.
#[inline]
pub fn exchange_current_stream(device: DeviceIndex, id: StreamId) -> Result<StreamId> {
    check_stream_id(device, id)?;
    Ok(CURRENT_STREAM.with(|c| c[device as usize].replace(id)))
}

/// The stream `(device, id)`, creating the device's context on first use.
/// A device of -1 means this thread's current device.
#[inline]
pub fn lookup(device: i64, id: StreamId) -> Result<&'static StreamQueue> {
    crate::runtime::device::context(crate::runtime::device::resolve(device))?
        .streams
        .get(id)
}

/// This thread's current stream of `device` (-1: the current device),
/// creating the device's context on first use.
#[inline]
pub fn current(device: i64) -> Result<&'static StreamQueue> {
    let index = crate::runtime::device::check_index(crate::runtime::device::resolve(device))?;
    lookup(index.into(), current_stream_id(index))
}
