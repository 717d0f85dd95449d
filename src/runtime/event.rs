//! Events: versioned markers in a stream, as `DeviceGuardImplInterface`
//! specifies them.
//!
//! Note [Event versions]: each `record` bumps the event's version and points
//! it at "the stream after everything submitted so far" — a `(stream, seq)`
//! pair (see Note [Stream progress]). That version is complete once the stream
//! has completed `seq` tasks. `block` captures the pair current at the time of
//! the call and queues a wait for exactly it, so a later `record` cannot move
//! an earlier wait. An event never recorded is complete. An event is recorded
//! only on streams of its own device (as `cudaEventRecord` requires), but
//! streams of any device may wait on it (as `cudaStreamWaitEvent` allows).
//! No cycle of waits can form: a wait only refers to work submitted before it.
//!
//! An event recorded on a capturing stream marks a node of the capture
//! instead (Note [Graph capture] in graph.rs): a stream that waits for it
//! joins the capture, and the host can neither query nor synchronize it
//! while the capture lasts (its work runs only at replay). Once the capture
//! has ended such a record orders nothing outside the graph: the event is
//! complete, as if never recorded.

use std::sync::Arc;
use std::time::Instant;

use once_cell::sync::Lazy;
use parking_lot::Mutex;

use crate::runtime::device::{self, DeviceIndex};
use crate::base::error::{Error, ErrorKind, Result};
use crate::runtime::graph::Capture;
use crate::runtime::hooks::{self, OrderPoint};
use crate::runtime::stream::{StreamQueue, Task};

/// Reference point for timestamps, so elapsed times are plain subtractions.
static EPOCH: Lazy<Instant> = Lazy::new(Instant::now);

struct Recorded {
    version: u64,
    stream: &'static StreamQueue,
    seq: u64,
    /// Recorded inside a capture: the capture and the event's node.
    captured: Option<(Arc<Capture>, usize)>,
    /// Where the recording stream's work stood in the happens-before order
    /// (`hooks::ORDER_OBSERVER`), while an observer is on.
    clock: Option<OrderPoint>,
}

impl Recorded {
    /// The capture the event was recorded in, while that capture lasts.
    fn active_capture(&self) -> Option<&(Arc<Capture>, usize)> {
        self.captured.as_ref().filter(|(capture, _)| {
            self.stream
                .capture()
                .is_some_and(|c| Arc::ptr_eq(&c, capture))
        })
    }
}

/// What a waiter must wait for: a point of a stream, or a node of an
/// active capture.
enum Target {
    Point(&'static StreamQueue, u64, Option<OrderPoint>),
    Captured(Arc<Capture>, usize),
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
        Ok(Arc::new(Event {
            device,
            timing,
            state: Mutex::new(EventState::default()),
        }))
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
        crate::runtime::device_stop::check_running(self.device)?;
        if let Some(hook) = hooks::BEFORE_EVENT_RECORD.get() {
            hook(stream)?;
        }
        let mut st = self.state.lock();
        let version = st.recorded.as_ref().map_or(1, |r| r.version + 1);
        if let Some(capture) = stream.capture() {
            let node = capture.record_event(stream);
            st.recorded = Some(Recorded {
                version,
                stream,
                seq: stream.marker(),
                captured: Some((capture, node)),
                clock: None,
            });
            return Ok(());
        }
        let timestamp = self.timing.then(|| (Arc::clone(self), version));
        // Lock order: event, then stream (`mark` locks the stream).
        let (seq, reached_at) = stream.mark(timestamp)?;
        st.recorded = Some(Recorded {
            version,
            stream,
            seq,
            captured: None,
            clock: hooks::order_point(&[stream]),
        });
        if let Some(at) = reached_at {
            st.stamped = Some((version, at));
        }
        Ok(())
    }

    /// Makes `stream` wait for the version recorded at the time of the call.
    /// `stream` may belong to another device than the event, as with
    /// `cudaStreamWaitEvent`: its later work waits for the point recorded on
    /// the event's device (pipeline parallelism's `wait_stream` across
    /// devices). Recording, by contrast, needs a stream of the event's device.
    pub fn block(&self, stream: &'static StreamQueue) -> Result<()> {
        match self.target() {
            Some(Target::Captured(capture, node)) => capture.wait_event(stream, node),
            // Nothing to wait for when the stream passes its own marker in
            // order, or when the marked point has already been reached.
            Some(Target::Point(source, seq, clock)) => {
                // The edge is the wait itself, whether or not the point has
                // been reached (Note [Stream sanitizer]).
                if let Some((clock, observer)) = clock.zip(hooks::ORDER_OBSERVER.get()) {
                    observer.stream_waits(stream, &clock);
                }
                if !std::ptr::eq(source, stream) && !source.has_completed(seq) {
                    stream.submit(Task::WaitFor {
                        stream: source,
                        seq,
                    })?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// The current version's target; None if never recorded, or recorded
    /// in a capture that has ended.
    fn target(&self) -> Option<Target> {
        let st = self.state.lock();
        let recorded = st.recorded.as_ref()?;
        if recorded.captured.is_none() {
            return Some(Target::Point(
                recorded.stream,
                recorded.seq,
                recorded.clock.clone(),
            ));
        }
        recorded
            .active_capture()
            .map(|(capture, node)| Target::Captured(Arc::clone(capture), *node))
    }

    /// Fails for an event recorded in an active capture: its work runs
    /// only at replay, so no host wait for it can end.
    fn check_not_captured(&self, what: &str) -> Result<()> {
        Self::check_target_not_captured(&self.target(), what)
    }

    fn check_target_not_captured(target: &Option<Target>, what: &str) -> Result<()> {
        match target {
            Some(Target::Captured(capture, _)) => Err(capture.invalidate(format!(
                "{what} of an event recorded inside a graph capture is not allowed while the capture lasts                  (the captured work runs only at replay)"
            ))),
            _ => Ok(()),
        }
    }

    /// True if never recorded, or if the current version has completed.
    pub fn query(&self) -> Result<bool> {
        self.check_not_captured("Event.query()")?;
        Ok(match self.target() {
            Some(Target::Point(stream, seq, clock)) => {
                let done = stream.has_completed(seq);
                if let Some(clock) = clock.filter(|_| done) {
                    hooks::host_waited_for(&clock, true)?; // up to the record only
                }
                done
            }
            _ => true,
        })
    }

    /// Waits until the current version has completed, after the
    /// host-synchronization checks (Note [Capture modes], Note [Sync debug]).
    pub fn synchronize(&self) -> Result<()> {
        let what = "Event.synchronize()";
        let target = self.target();
        Self::check_target_not_captured(&target, what)?;
        match target {
            Some(Target::Point(stream, seq, clock)) => {
                crate::runtime::graph::check_host_sync(what, Some(stream))?;
                hooks::before_host_wait(what)?;
                stream.wait_for(seq, true)?;
                match clock {
                    Some(clock) => hooks::host_waited_for(&clock, false),
                    None => Ok(()),
                }
            }
            _ => hooks::before_host_wait(what),
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
            return Err(Error::invalid_value(format!(
                "elapsed_time: the {role} event has not been recorded"
            )));
        };
        match st.stamped {
            Some((version, at)) if version == recorded.version => Ok(at),
            _ => Err(Error::new(
                ErrorKind::NotReady,
                format!(
                    "elapsed_time: the {role} event has not completed yet (synchronize it first)"
                ),
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

/// Events handed across the C and C++ boundaries as opaque handles.
///
/// Note [Event handles]: a handle is not a pointer but a slot of a registry
/// of live events: `(slot + 1) << 32 | generation`. The registry owns one
/// `Arc<Event>` per live handle; `release` empties the slot and bumps its
/// generation, so a destroyed handle (even after its slot is reused by a
/// new event), a double destroy, a garbage value or null is rejected with
/// `InvalidHandle` instead of touching freed memory.
///
/// A lookup is on the hot path (every record, synchronize, query, wait):
/// each thread remembers the last event it looked up, as a `Weak` beside the
/// count of releases at that time. While no handle has been released since,
/// the remembered handle is still live and the lookup is one upgrade, without
/// the registry's lock. Any release makes every thread's next lookup take the
/// lock. A `Weak` never drops an event, so a thread's cache keeps nothing
/// alive (an event's last reference may hold a capture and its kernels).
pub mod handle {
    use std::cell::RefCell;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Weak;

    use super::*;

    /// Handles are 64-bit values (`(slot + 1) << 32 | generation`).
    const _: () = assert!(usize::BITS == 64, "event handles need 64-bit pointers");

    struct Slot {
        /// Never 0 (so a handle is never null); bumped when the slot is freed.
        generation: u32,
        event: Option<Arc<Event>>,
    }

    struct Registry {
        slots: Vec<Slot>,
        /// Indices of empty slots, reused last-freed first.
        free: Vec<u32>,
    }

    static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
        slots: Vec::new(),
        free: Vec::new(),
    });

    /// Handles released so far; bumped under the registry's lock.
    static RELEASES: AtomicU64 = AtomicU64::new(0);

    thread_local! {
        /// This thread's last lookup: (handle, RELEASES then, the event).
        static LAST: RefCell<Option<(usize, u64, Weak<Event>)>> = const { RefCell::new(None) };
    }

    fn encode(slot: u32, generation: u32) -> usize {
        ((slot as usize + 1) << 32) | generation as usize
    }

    /// The slot and generation a handle names, if it is shaped like one.
    fn decode(handle: usize) -> Option<(usize, u32)> {
        let slot = (handle >> 32).checked_sub(1)?;
        Some((slot, handle as u32))
    }

    #[cold]
    fn invalid(handle: usize) -> Error {
        if handle == 0 {
            return Error::new(ErrorKind::InvalidHandle, "null openreg event handle");
        }
        Error::new(
            ErrorKind::InvalidHandle,
            format!("{handle:#x} is not a live openreg event handle (never created, or already destroyed)"),
        )
    }

    /// Registers `event`; returns its new handle (never 0).
    pub fn into_raw(event: Arc<Event>) -> usize {
        let mut reg = REGISTRY.lock();
        let slot = match reg.free.pop() {
            Some(slot) => slot,
            None => {
                let slot = u32::try_from(reg.slots.len()).expect("too many live openreg events");
                reg.slots.push(Slot {
                    generation: 1,
                    event: None,
                });
                slot
            }
        };
        let entry = &mut reg.slots[slot as usize];
        entry.event = Some(event);
        encode(slot, entry.generation)
    }

    /// A new reference to the event behind `handle`, or `InvalidHandle`.
    pub fn get(handle: usize) -> Result<Arc<Event>> {
        let cached = LAST.with(|last| {
            let last = last.borrow();
            let (h, releases, event) = last.as_ref()?;
            (*h == handle && *releases == RELEASES.load(Ordering::Acquire))
                .then(|| event.upgrade())
                .flatten()
        });
        if let Some(event) = cached {
            return Ok(event);
        }
        // The count read before the lookup: a release after it makes the
        // next lookup of this thread miss.
        let releases = RELEASES.load(Ordering::Acquire);
        let event = lookup(handle)?;
        LAST.with(|last| *last.borrow_mut() = Some((handle, releases, Arc::downgrade(&event))));
        Ok(event)
    }

    fn lookup(handle: usize) -> Result<Arc<Event>> {
        let reg = REGISTRY.lock();
        decode(handle)
            .and_then(|(slot, generation)| {
                reg.slots.get(slot).filter(|s| s.generation == generation)
            })
            .and_then(|s| s.event.clone())
            .ok_or_else(|| invalid(handle))
    }

    /// Ends `handle`: it is invalid afterwards. The event itself lives on
    /// while queued work still refers to it. `InvalidHandle` if `handle` is
    /// not live (null, garbage, or already released).
    pub fn release(handle: usize) -> Result<()> {
        let event = {
            let mut reg = REGISTRY.lock();
            let Some((slot, generation)) = decode(handle) else {
                return Err(invalid(handle));
            };
            let Some(entry) = reg
                .slots
                .get_mut(slot)
                .filter(|s| s.generation == generation && s.event.is_some())
            else {
                return Err(invalid(handle));
            };
            entry.generation = entry.generation.checked_add(1).unwrap_or(1);
            RELEASES.fetch_add(1, Ordering::AcqRel);
            let event = entry.event.take();
            reg.free.push(slot as u32);
            event
        };
        drop(event); // outside the registry's lock
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_released_by_another_thread_is_invalid_in_this_one() {
        let first = handle::into_raw(Event::new(0, false).unwrap());
        let second = handle::into_raw(Event::new(0, false).unwrap());
        // Remembered by this thread, and kept alive (as queued work keeps it).
        let alive = handle::get(first).unwrap();
        std::thread::spawn(move || handle::release(first).unwrap())
            .join()
            .unwrap();
        let err = handle::get(first).err().expect("a released handle");
        assert_eq!(err.kind, ErrorKind::InvalidHandle);
        // Its slot reused by a new event: the old handle stays invalid.
        let third = handle::into_raw(Event::new(0, false).unwrap());
        assert!(handle::get(first).is_err());
        assert!(handle::get(third).is_ok() && handle::get(second).is_ok());
        drop(alive);
        // The cache keeps nothing alive: the released event is gone.
        let weak = Arc::downgrade(&handle::get(second).unwrap());
        handle::release(second).unwrap();
        assert!(weak.upgrade().is_none());
        handle::release(third).unwrap();
    }
}

