//! Device activity for PyTorch's profiler (`torch.profiler` with
//! `ProfilerActivity.PrivateUse1`), gathered by the runtime.
//!
//! Note [Profiler activities]: while a profiling session is active
//! (`start`..`stop`, driven by Kineto through cpp/frontends/profiler.cpp), every
//! piece of device work records one activity: its name, device, stream,
//! start and end on the wall clock Kineto uses (nanoseconds since the Unix
//! epoch), and the correlation id the launching thread had then (PyTorch's
//! profiler pushes one per operator call, so a kernel links to the op that
//! launched it and `key_averages()` adds its time to that op's device time).
//! Work is timed where it runs: on the stream's worker for queued work, on
//! the calling thread for inline work, so the times are the device's, not
//! the launch's. A session that is not active costs one atomic load per
//! launch.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use crate::base::error::Result;
use crate::runtime::stream::StreamQueue;

/// One piece of device work, as the trace shows it.
#[derive(Clone, Debug)]
pub struct Activity {
    pub name: String,
    pub device: i8,
    pub stream: i64,
    pub start_ns: i64,
    pub end_ns: i64,
    pub correlation: u64,
}

static ACTIVE: AtomicBool = AtomicBool::new(false);
static ACTIVITIES: Mutex<Vec<Activity>> = Mutex::new(Vec::new());

thread_local! {
    /// The correlation ids PyTorch's profiler pushed on this thread.
    static CORRELATION: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Starts a session: activities from now on are kept.
pub fn start() {
    ACTIVITIES.lock().clear();
    ACTIVE.store(true, Ordering::Release);
}

/// Ends the session; what was kept stays until `take`.
pub fn stop() {
    ACTIVE.store(false, Ordering::Release);
}

#[inline]
pub fn is_active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// The activities kept since `start`, removed.
pub fn take() -> Vec<Activity> {
    std::mem::take(&mut *ACTIVITIES.lock())
}

pub fn push_correlation(id: u64) {
    CORRELATION.with(|c| c.borrow_mut().push(id));
}

pub fn pop_correlation() {
    CORRELATION.with(|c| c.borrow_mut().pop());
}

/// The innermost correlation id of this thread, 0 if none.
pub fn current_correlation() -> u64 {
    CORRELATION.with(|c| c.borrow().last().copied().unwrap_or(0))
}

/// Nanoseconds since the Unix epoch (Kineto's clock).
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

pub fn record(activity: Activity) {
    if is_active() {
        ACTIVITIES.lock().push(activity);
    }
}

/// `work`, timed as an activity named `name` on `stream` whenever it runs
/// (Note [Profiler activities]); `work` itself when no session is active
/// at the launch.
pub fn timed(
    name: impl Into<String>,
    stream: &StreamQueue,
    mut work: Box<dyn FnMut() -> Result<()> + Send>,
) -> Box<dyn FnMut() -> Result<()> + Send> {
    if !is_active() {
        return work;
    }
    let (name, device, stream, correlation) = (
        name.into(),
        stream.device(),
        stream.id(),
        current_correlation(),
    );
    Box::new(move || {
        let start_ns = now_ns();
        let outcome = work();
        record(Activity {
            name: name.clone(),
            device,
            stream,
            start_ns,
            end_ns: now_ns().max(start_ns),
            correlation,
        });
        outcome
    })
}
