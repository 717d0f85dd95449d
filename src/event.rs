//! Events: versioned markers in a stream, as `DeviceGuardImplInterface`
//! specifies them.
//!
//! Note [Event versions]: each `record` bumps the event's version and points
//! it at "the stream after everything submitted so far" — a `(stream, seq)`
//! pair (see Note [Stream progress]). That version is complete once the stream
//! has completed `seq` tasks. `block` captures the pair current at the time of
//! the call and queues a wait for exactly it, so a later `record` cannot move
//! an earlier wait. An event never recorded is complete.

use std::sync::Arc;
use std::time::Instant;

use once_cell::sync::Lazy;
use parking_lot::Mutex;

use crate::device::{self, DeviceIndex};
use crate::error::{Error, ErrorKind, Result};
use crate::stream::{StreamQueue, Task};

/// Reference point for timestamps, so elapsed times are plain subtractions.
static EPOCH: Lazy<Instant> = Lazy::new(Instant::now);

struct Recorded {
    version: u64,
    stream: &'static StreamQueue,
    seq: u64,
}

#[derive(Default)]
struct EventState {
    recorded: Option<Recorded>,
    /// `(version, time)` of the newest version whose timestamp was taken.
    stamped: Option<(u64, Instant)>,
}

pub struct Event {
    device: DeviceIndex,
    timing: bool,
    state: Mutex<EventState>,
}

impl Event {
    /// A new event of `device`; `timing` enables `elapsed_time`.
    pub fn new(device: i64, timing: bool) -> Result<Arc<Event>> {
        let device = device::check_index(device)?;
        Lazy::force(&EPOCH);
        Ok(Arc::new(Event { device, timing, state: Mutex::new(EventState::default()) }))
    }

    pub fn device(&self) -> DeviceIndex {
        self.device
    }

    pub fn timing(&self) -> bool {
        self.timing
    }

    /// Records a new version at the current end of `stream`.
    pub fn record(self: &Arc<Event>, stream: &'static StreamQueue) -> Result<()> {
        if stream.device() != self.device {
            return Err(Error::invalid_value(format!(
                "an event of openreg device {} cannot be recorded on {stream}",
                self.device
            )));
        }
        let mut st = self.state.lock();
        let version = st.recorded.as_ref().map_or(1, |r| r.version + 1);
        let timestamp = self.timing.then(|| (Arc::clone(self), version));
        // Lock order: event, then stream (`mark` locks the stream).
        let (seq, reached_at) = stream.mark(timestamp)?;
        st.recorded = Some(Recorded { version, stream, seq });
        if let Some(at) = reached_at {
            st.stamped = Some((version, at));
        }
        Ok(())
    }

    /// Makes `stream` wait for the version recorded at the time of the call.
    pub fn block(&self, stream: &'static StreamQueue) -> Result<()> {
        if stream.device() != self.device {
            return Err(Error::invalid_value(format!(
                "{stream} cannot wait on an event of openreg device {}: an event is waited on by streams of its own device",
                self.device
            )));
        }
        let target = self.state.lock().recorded.as_ref().map(|r| (r.stream, r.seq));
        match target {
            // Nothing to wait for when the stream passes its own marker in
            // order, or when the marked point has already been reached.
            Some((source, seq)) if !std::ptr::eq(source, stream) && !source.has_completed(seq) => {
                stream.submit(Task::WaitFor { stream: source, seq }).map(drop)
            }
            _ => Ok(()),
        }
    }

    /// True if never recorded, or if the current version has completed.
    pub fn query(&self) -> bool {
        let target = self.state.lock().recorded.as_ref().map(|r| (r.stream, r.seq));
        target.is_none_or(|(stream, seq)| stream.has_completed(seq))
    }

    /// Waits until the current version has completed.
    pub fn synchronize(&self) -> Result<()> {
        let target = self.state.lock().recorded.as_ref().map(|r| (r.stream, r.seq));
        match target {
            Some((stream, seq)) => stream.wait_for(seq, false),
            None => Ok(()),
        }
    }

    pub(crate) fn stamp(&self, version: u64, at: Instant) {
        let mut st = self.state.lock();
        if st.stamped.is_none_or(|(v, _)| v < version) {
            st.stamped = Some((version, at));
        }
    }

    /// The time the current version was reached.
    fn completed_time(&self, role: &str) -> Result<Instant> {
        if !self.timing {
            return Err(Error::invalid_value(format!(
                "elapsed_time: the {role} event was created without timing (enable_timing=True is required for both events)"
            )));
        }
        let st = self.state.lock();
        let Some(recorded) = st.recorded.as_ref() else {
            return Err(Error::invalid_value(format!("elapsed_time: the {role} event has not been recorded")));
        };
        match st.stamped {
            Some((version, at)) if version == recorded.version => Ok(at),
            _ => Err(Error::new(
                ErrorKind::NotReady,
                format!("elapsed_time: the {role} event has not completed yet (synchronize it first)"),
            )),
        }
    }

    /// Milliseconds from `start`'s current version to `end`'s.
    pub fn elapsed_ms(start: &Event, end: &Event) -> Result<f64> {
        if start.device != end.device {
            return Err(Error::invalid_value(format!(
                "elapsed_time: the events belong to different openreg devices ({} and {})",
                start.device, end.device
            )));
        }
        let t0 = start.completed_time("start")?;
        let t1 = end.completed_time("end")?;
        Ok(signed_ms(t0, t1))
    }
}

fn signed_ms(from: Instant, to: Instant) -> f64 {
    if to >= from {
        to.duration_since(from).as_secs_f64() * 1e3
    } else {
        -(from.duration_since(to).as_secs_f64() * 1e3)
    }
}

/// An event handed across the C and C++ boundaries as an opaque pointer:
/// a leaked `Arc<Event>` reference, released by `release`.
pub mod handle {
    use super::*;

    pub fn into_raw(event: Arc<Event>) -> *const Event {
        Arc::into_raw(event)
    }

    /// A new reference to the event behind `ptr`.
    ///
    /// # Safety
    /// `ptr` must be null or come from `into_raw` and not yet be released.
    pub unsafe fn get(ptr: *const Event) -> Result<Arc<Event>> {
        if ptr.is_null() {
            return Err(Error::new(ErrorKind::InvalidHandle, "null openreg event handle"));
        }
        // SAFETY: `ptr` is a live `Arc` allocation (caller's contract); taking
        // one more strong reference keeps it alive for the returned `Arc`.
        unsafe {
            Arc::increment_strong_count(ptr);
            Ok(Arc::from_raw(ptr))
        }
    }

    /// # Safety
    /// `ptr` must come from `into_raw`; it is invalid afterwards.
    pub unsafe fn release(ptr: *const Event) {
        if !ptr.is_null() {
            // SAFETY: per the contract, this is the reference `into_raw` leaked.
            drop(unsafe { Arc::from_raw(ptr) });
        }
    }
}
