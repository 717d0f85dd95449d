//! Device utilization: the fraction of a recent window during which at least
//! one stream of the device had work (`torch.openreg.utilization`).
//!
//! Note [Busy clock]: each device keeps a busy clock. A stream is busy from
//! the moment work is submitted to it while it was idle until it has
//! completed everything submitted (`completed == submitted`, Note [Stream
//! progress]); the device is busy while any of its streams is. Streams report
//! only those two transitions, under their own lock, so the clock's lock is
//! taken once per burst of work, never per task of a busy stream.
//!
//! The clock stores knots `(time, busy time so far)` at each device-level
//! transition. Between two knots the busy time grows either with slope 1 (the
//! device was busy throughout) or not at all, so linear interpolation between
//! knots gives the busy time at any instant exactly, and the utilization over
//! `[now - window, now]` is the difference of two interpolations divided by
//! the window. Knots older than the longest window are pruned; a bounded
//! number are kept, so a device switching millions of times a second
//! degrades to a coarser (still correct on average) start point.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use once_cell::sync::Lazy;
use parking_lot::Mutex;

use crate::runtime::device::DeviceIndex;
use crate::base::options::MAX_DEVICES;

/// The window `utilization` reports on, as NVML's sample period (up to 1 s).
pub const WINDOW: Duration = Duration::from_secs(1);

/// Knots kept per device at most (Note [Busy clock]).
const MAX_KNOTS: usize = 4096;

/// The process's time origin for the clocks.
static EPOCH: Lazy<Instant> = Lazy::new(Instant::now);

fn now_ns() -> u64 {
    EPOCH.elapsed().as_nanos() as u64
}

#[derive(Clone, Copy)]
struct Knot {
    time: u64,
    busy: u64,
}

struct BusyClock {
    /// Streams of the device that are busy now.
    busy_streams: usize,
    /// Busy time accumulated up to the last knot.
    busy_ns: u64,
    /// When the device last became busy (valid while `busy_streams > 0`).
    busy_since: u64,
    knots: VecDeque<Knot>,
}

impl BusyClock {
    const fn new() -> BusyClock {
        BusyClock {
            busy_streams: 0,
            busy_ns: 0,
            busy_since: 0,
            knots: VecDeque::new(),
        }
    }

    fn push(&mut self, time: u64) {
        if self.knots.len() == MAX_KNOTS {
            self.knots.pop_front();
        }
        self.knots.push_back(Knot {
            time,
            busy: self.busy_ns,
        });
        let horizon = time.saturating_sub(WINDOW.as_nanos() as u64);
        // Keep one knot at or before the horizon for interpolating there.
        while self.knots.len() > 2 && self.knots[1].time <= horizon {
            self.knots.pop_front();
        }
    }

    fn busy_at_now(&self, now: u64) -> u64 {
        if self.busy_streams > 0 {
            self.busy_ns + now.saturating_sub(self.busy_since)
        } else {
            self.busy_ns
        }
    }

    /// Busy time accumulated up to `time` (not after the last knot).
    fn busy_at(&self, time: u64) -> u64 {
        let Some(first) = self.knots.front() else {
            return 0;
        };
        if time <= first.time {
            return first.busy;
        }
        let after = self
            .knots
            .iter()
            .position(|k| k.time >= time)
            .unwrap_or(self.knots.len() - 1);
        let (a, b) = (self.knots[after - 1], self.knots[after]);
        if b.time <= a.time {
            return b.busy;
        }
        a.busy
            + ((b.busy - a.busy) as u128 * (time - a.time) as u128 / (b.time - a.time) as u128)
                as u64
    }

    fn fraction(&self, now: u64, window: u64) -> f64 {
        let start = now.saturating_sub(window);
        let last = self.knots.back().map_or(0, |k| k.time);
        // After the last knot the device's state has not changed.
        let busy_then = if start >= last {
            if self.busy_streams > 0 {
                self.busy_ns + (start - self.busy_since)
            } else {
                self.busy_ns
            }
        } else {
            self.busy_at(start)
        };
        let span = now - start;
        if span == 0 {
            return 0.0;
        }
        (self.busy_at_now(now).saturating_sub(busy_then) as f64 / span as f64).clamp(0.0, 1.0)
    }
}

static CLOCKS: [Mutex<BusyClock>; MAX_DEVICES] =
    [const { Mutex::new(BusyClock::new()) }; MAX_DEVICES];

/// A stream of `device` went from idle to busy.
pub(crate) fn stream_became_busy(device: DeviceIndex) {
    let mut clock = CLOCKS[device as usize].lock();
    clock.busy_streams += 1;
    if clock.busy_streams == 1 {
        let now = now_ns();
        clock.busy_since = now;
        clock.push(now);
    }
}

/// A stream of `device` completed all its work.
pub(crate) fn stream_became_idle(device: DeviceIndex) {
    let mut clock = CLOCKS[device as usize].lock();
    debug_assert!(clock.busy_streams > 0, "a stream went idle twice");
    clock.busy_streams = clock.busy_streams.saturating_sub(1);
    if clock.busy_streams == 0 {
        let now = now_ns();
        clock.busy_ns += now.saturating_sub(clock.busy_since);
        clock.push(now);
    }
}

/// The fraction (0..=1) of the last `window` (at most `WINDOW`) during which
/// a stream of `device` had work. The index must be valid.
pub fn busy_fraction(device: DeviceIndex, window: Duration) -> f64 {
    let window = window.min(WINDOW).as_nanos() as u64;
    CLOCKS[device as usize].lock().fraction(now_ns(), window)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clock(transitions: &[(u64, bool)]) -> BusyClock {
        let mut c = BusyClock::new();
        for &(t, busy) in transitions {
            if busy {
                c.busy_streams += 1;
                c.busy_since = t;
            } else {
                c.busy_streams -= 1;
                c.busy_ns += t - c.busy_since;
            }
            c.push(t);
        }
        c
    }

    #[test]
    fn idle_device_is_zero() {
        assert_eq!(BusyClock::new().fraction(5_000, 1_000), 0.0);
    }

    #[test]
    fn exact_over_windows() {
        // Busy 100..300 and 500..600 (ns).
        let c = clock(&[(100, true), (300, false), (500, true), (600, false)]);
        assert!((c.fraction(700, 600) - 300.0 / 600.0).abs() < 1e-9);
        assert!((c.fraction(600, 400) - 200.0 / 400.0).abs() < 1e-9); // 200..600: 100 + 100
        assert!((c.fraction(1_000, 300) - 0.0).abs() < 1e-9);
    }

    #[test]
    fn busy_now_counts_to_now() {
        let c = clock(&[(100, true)]);
        assert!((c.fraction(300, 100) - 1.0).abs() < 1e-9);
        assert!((c.fraction(300, 300) - 200.0 / 300.0).abs() < 1e-9);
    }
}
