//! Memory history: what the caching allocator did and who asked, for
//! `torch.openreg.memory._record_memory_history` / `_snapshot` and PyTorch's
//! own viewer (`torch.cuda._memory_viz`).
//!
//! Note [Memory history]: recording is off by default and then costs one
//! relaxed atomic load per allocation. When on, each device's allocator
//! keeps a ring of its last `max_entries` events (`alloc`, `free_requested`,
//! `free_completed`, `segment_alloc`, `segment_free`, `oom`, as CUDA's
//! allocator names them) and remembers, per live block, the stack that
//! allocated it. Stacks come from a collector the host installs
//! (`orSetStackCollector`; the Python package installs one that reads the
//! calling thread's Python frames): the runtime stores the text it returns,
//! one frame per line as `filename<TAB>line<TAB>function`, innermost first,
//! and never interprets it. A snapshot is rendered as JSON with CUDA's
//! structure (segments with blocks, one trace per device); the Python side
//! turns each frames text into CUDA's list of `{filename, line, name}`.

use std::collections::VecDeque;
use std::ffi::{c_char, CStr};
use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use crate::base::error::{Error, Result};

/// The stack of one event or block (Note [Memory history]); `None` when not
/// recorded.
pub type Frames = Option<Arc<str>>;

/// What history records, as `_record_memory_history`'s arguments say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `enabled="all"`: keep the event trace (else only live blocks' stacks).
    pub trace: bool,
    /// Capture a stack for allocations (`context` of "state", "alloc", "all").
    pub alloc_stacks: bool,
    /// Capture a stack for frees too (`context="all"`).
    pub free_stacks: bool,
    /// Events kept per device.
    pub max_entries: usize,
}

static RECORDING: AtomicBool = AtomicBool::new(false);
static SETTINGS: Mutex<Option<Settings>> = Mutex::new(None);

/// Starts (`Some`) or stops (`None`) recording for every device. Stopping
/// drops the recorded events (see `allocator::DeviceAllocator::clear_history`).
pub fn set(settings: Option<Settings>) -> Result<()> {
    if settings.is_some_and(|s| s.max_entries == 0) {
        return Err(Error::invalid_value(
            "_record_memory_history: max_entries must be at least 1",
        ));
    }
    *SETTINGS.lock() = settings;
    RECORDING.store(settings.is_some(), Ordering::Release);
    Ok(())
}

/// The settings in force, or `None` when not recording (the cheap check).
#[inline]
pub fn current() -> Option<Settings> {
    if !RECORDING.load(Ordering::Relaxed) {
        return None;
    }
    *SETTINGS.lock()
}

/// A host function that returns the calling thread's stack as text, or null
/// when it has none to give; the text stays valid until the next call on
/// the same thread.
pub type StackCollector = unsafe extern "C" fn() -> *const c_char;

static COLLECTOR: AtomicUsize = AtomicUsize::new(0);

pub fn set_stack_collector(collector: Option<StackCollector>) {
    COLLECTOR.store(collector.map_or(0, |f| f as usize), Ordering::Release);
}

/// The calling thread's stack, if a collector is installed and has one.
pub fn capture() -> Frames {
    let raw = COLLECTOR.load(Ordering::Acquire);
    if raw == 0 {
        return None;
    }
    // SAFETY: only `set_stack_collector` stores non-zero values, and they
    // are `StackCollector` function pointers.
    let collector: StackCollector = unsafe { std::mem::transmute::<usize, StackCollector>(raw) };
    // SAFETY: the collector's contract: null, or a NUL-terminated string
    // valid until its next call on this thread.
    let text = unsafe { collector() };
    if text.is_null() {
        return None;
    }
    // SAFETY: as above.
    Some(Arc::from(
        unsafe { CStr::from_ptr(text) }.to_string_lossy().as_ref(),
    ))
}

/// An allocator event, as CUDA's `TraceEntry`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    Oom,
}

impl Action {
    pub fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::Oom => "oom",
        }
    }
}

#[derive(Clone, Debug)]
pub struct TraceEntry {
    pub action: Action,
    pub addr: usize,
    pub size: usize,
    /// The id of the stream (0: the default stream).
    pub stream: i64,
    pub time_us: i64,
    pub frames: Frames,
    /// For `oom`: bytes the device still had free.
    pub device_free: usize,
}

impl TraceEntry {
    pub fn new(
        action: Action,
        addr: usize,
        size: usize,
        stream: i64,
        frames: Frames,
    ) -> TraceEntry {
        let time_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64);
        TraceEntry {
            action,
            addr,
            size,
            stream,
            time_us,
            frames,
            device_free: 0,
        }
    }
}

/// One device's ring of recent events.
#[derive(Default)]
pub struct Trace {
    entries: VecDeque<TraceEntry>,
}

impl Trace {
    pub fn record(&mut self, settings: &Settings, entry: TraceEntry) {
        if !settings.trace {
            return;
        }
        while self.entries.len() >= settings.max_entries {
            self.entries.pop_front();
        }
        self.entries.push_back(entry);
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }

    pub fn entries(&self) -> impl Iterator<Item = &TraceEntry> {
        self.entries.iter()
    }
}

/// A block of a segment in a snapshot.
pub struct BlockSnapshot {
    pub address: usize,
    pub size: usize,
    pub requested_size: usize,
    /// "active_allocated", "active_awaiting_free" or "inactive".
    pub state: &'static str,
    pub frames: Frames,
}

pub struct SegmentSnapshot {
    pub device: i8,
    pub address: usize,
    pub total_size: usize,
    pub stream: i64,
    /// "small" or "large".
    pub segment_type: &'static str,
    pub blocks: Vec<BlockSnapshot>,
}

/// One device's allocator state and trace.
pub struct DeviceSnapshot {
    pub segments: Vec<SegmentSnapshot>,
    pub trace: Vec<TraceEntry>,
}

/// Renders the snapshot of devices `0..devices.len()` (a device without a
/// context has no segments and an empty trace) as JSON.
pub fn to_json(devices: &[Option<DeviceSnapshot>]) -> String {
    let mut out = String::from("{\"segments\":[");
    let segments = devices.iter().flatten().flat_map(|d| d.segments.iter());
    for (i, seg) in segments.enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_segment(&mut out, seg);
    }
    out.push_str("],\"device_traces\":[");
    for (i, device) in devices.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('[');
        for (j, e) in device.iter().flat_map(|d| d.trace.iter()).enumerate() {
            if j > 0 {
                out.push(',');
            }
            let _ = write!(
                out,
                "{{\"action\":\"{}\",\"addr\":{},\"size\":{},\"stream\":{},\"time_us\":{},\"device_free\":{},\"frames\":",
                e.action.name(),
                e.addr,
                e.size,
                e.stream,
                e.time_us,
                e.device_free
            );
            write_frames(&mut out, &e.frames);
            out.push('}');
        }
        out.push(']');
    }
    out.push_str("]}");
    out
}

fn write_segment(out: &mut String, seg: &SegmentSnapshot) {
    let allocated: usize = seg
        .blocks
        .iter()
        .filter(|b| b.state == "active_allocated")
        .map(|b| b.size)
        .sum();
    let active: usize = seg
        .blocks
        .iter()
        .filter(|b| b.state != "inactive")
        .map(|b| b.size)
        .sum();
    let requested: usize = seg
        .blocks
        .iter()
        .filter(|b| b.state != "inactive")
        .map(|b| b.requested_size)
        .sum();
    let _ = write!(
        out,
        "{{\"device\":{},\"address\":{},\"total_size\":{},\"allocated_size\":{allocated},\"active_size\":{active},\
         \"requested_size\":{requested},\"stream\":{},\"segment_type\":\"{}\",\"is_expandable\":false,\"blocks\":[",
        seg.device, seg.address, seg.total_size, seg.stream, seg.segment_type
    );
    for (i, b) in seg.blocks.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(
            out,
            "{{\"address\":{},\"size\":{},\"requested_size\":{},\"state\":\"{}\",\"frames\":",
            b.address, b.size, b.requested_size, b.state
        );
        write_frames(out, &b.frames);
        out.push('}');
    }
    out.push_str("]}");
}

/// Frames as a JSON string (the collector's text) or null.
fn write_frames(out: &mut String, frames: &Frames) {
    let Some(text) = frames else {
        out.push_str("null");
        return;
    };
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_is_a_bounded_ring() {
        let settings = Settings {
            trace: true,
            alloc_stacks: false,
            free_stacks: false,
            max_entries: 2,
        };
        let mut trace = Trace::default();
        for addr in 1..=3 {
            trace.record(&settings, TraceEntry::new(Action::Alloc, addr, 8, 0, None));
        }
        let addrs: Vec<usize> = trace.entries().map(|e| e.addr).collect();
        assert_eq!(addrs, [2, 3]);
        let state_only = Settings {
            trace: false,
            ..settings
        };
        trace.record(&state_only, TraceEntry::new(Action::Alloc, 9, 8, 0, None));
        assert_eq!(trace.entries().count(), 2);
    }

    #[test]
    fn json_escapes_frames() {
        let block = BlockSnapshot {
            address: 4096,
            size: 512,
            requested_size: 4,
            state: "active_allocated",
            frames: Some(Arc::from("a \"b\"\\c\t1\tf\n")),
        };
        let seg = SegmentSnapshot {
            device: 0,
            address: 4096,
            total_size: 2048,
            stream: 0,
            segment_type: "small",
            blocks: vec![block],
        };
        let json = to_json(&[
            Some(DeviceSnapshot {
                segments: vec![seg],
                trace: vec![],
            }),
            None,
        ]);
        assert!(
            json.contains(r#""frames":"a \"b\"\\c\u00091\u0009f\u000a""#),
            "{json}"
        );
        assert!(json.ends_with(r#""device_traces":[[],[]]}"#), "{json}");
        assert!(
            json.contains(r#""allocated_size":512,"active_size":512,"requested_size":4"#),
            "{json}"
        );
    }
}
