//! The stream sanitizer (`OPENREG_SANITIZER`, `torch.openreg.sanitizer`):
//! reports every stream-ordering bug the first time the program makes it,
//! whatever the timing.
//!
//! Note [Stream sanitizer]: a happens-before model in CUDA's terms, checked
//! when work is launched (not when it happens to run).
//!  - Agents: every stream, and the host (all host threads, the autograd
//!    engine's included, are one agent). Each stream counts its launches;
//!    a launch is the point `(stream, n)`.
//!  - Each agent has a vector clock: for every stream, how many of its
//!    launches are ordered before the agent's present. A stream's own
//!    launches are ordered by submission. Edges, and nothing else: an event
//!    record takes the recording stream's clock, a wait on it (`wait_event`,
//!    `wait_stream`, across devices too) joins it into the waiting stream; a
//!    host synchronization the user asked for (a device, stream or event
//!    synchronize; a query that returned true, covering only up to the
//!    queried point; a blocking copy, `.item()`, a data-dependent shape)
//!    joins the synchronized clock into the host's; every launch joins the
//!    host's clock, since the host launched it after what it had seen. The
//!    runtime's own waits (an op run inline after its stream drained, a
//!    plan's first check, the allocator waiting for a stream) make no edge,
//!    so a missing one is reported whether or not timing hid the bug.
//!  - Memory: each device allocation keeps the launches that accessed it
//!    since their accesses were last covered: the last writes and the reads
//!    since, each with its byte range, stream, launch and op. A launch
//!    declares what it reads and writes (`KernelBuffer`: the fallback from
//!    the op schema's alias information, native kernels, copies, fills and
//!    random kernels from their operands, custom kernels as declared). An
//!    access conflicts with an earlier one of another stream on overlapping
//!    bytes, when one of them writes and the earlier is not ordered before
//!    it (its stream's entry in the launching stream's clock is smaller).
//!  - Freeing keeps the accesses the allocator does not cover: not those of
//!    the allocation stream, nor those it is already ordered after (a block
//!    is reused only by that stream's later work), nor of streams named by
//!    `record_stream` (the allocator waits for them), nor of what the host
//!    has synchronized with. The rest go with the memory to its next
//!    allocation, where a conflicting access is reported as memory freed
//!    while in use without `record_stream`.
//!  - Pinned host memory that a pending non-blocking copy reads or writes
//!    is protected (Note [Pinned memory guard] in pinned_guard.rs) until the
//!    host synchronizes with the copy.
//! Streams capturing a graph are not checked: their launches run only at
//! replay. Off (the default), the shim reads one flag per launch
//! (`openreg_sanitizer_on`) and the runtime's hooks one atomic.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_char, CStr};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Once, OnceLock};

use parking_lot::Mutex;

use crate::base::error::{Error, ErrorKind, Result};
use crate::base::options::{self, OptionSpec};
use crate::runtime::hooks::{self, MemoryObserver, OrderObserver, OrderPoint};
use crate::runtime::stream::{StreamQueue, TaskName};

/// What the sanitizer does with a report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Off = 0,
    /// The offending launch fails with the report.
    Raise = 1,
    /// Reports are collected, and printed at exit.
    Warn = 2,
}

impl Mode {
    pub const NAMES: [(&'static str, Mode); 6] = [
        ("0", Mode::Off),
        ("off", Mode::Off),
        ("1", Mode::Raise),
        ("raise", Mode::Raise),
        ("warn", Mode::Warn),
        ("2", Mode::Warn),
    ];

    pub fn name(self) -> &'static str {
        ["off", "raise", "warn"][self as usize]
    }

    fn from_code(code: u8) -> Mode {
        [Mode::Off, Mode::Raise, Mode::Warn][code as usize % 3]
    }
}

/// `OPENREG_SANITIZER`: the mode the sanitizer starts in (Note [Registered
/// options] in src/base/options.rs).
static OPTION: OptionSpec = OptionSpec {
    name: "OPENREG_SANITIZER",
    after: "OPENREG_SYNC_DEBUG",
    accepted: "one of 0, 1, raise, warn",
    help: "stream sanitizer: 0 (off, default), 1 or raise (the offending op fails), warn (reports printed at exit)",
    valid: |text| parse_mode(text).is_some(),
    show: |text| text.and_then(parse_mode).unwrap_or(Mode::Off).name().to_string(),
};

/// Registers `OPENREG_SANITIZER` (from `diagnostics::register_options`, at load).
pub(crate) fn register_options() {
    options::register(&OPTION);
}

/// `OPENREG_SANITIZER`'s text: one of `Mode::NAMES`, case-insensitive.
fn parse_mode(text: &str) -> Option<Mode> {
    options::parse_choice(text, &Mode::NAMES)
}

/// The mode `options` start the sanitizer in: `OPENREG_SANITIZER`, else
/// `Off`.
fn initial_mode(options: &options::Options) -> Mode {
    options
        .registered(OPTION.name)
        .and_then(parse_mode)
        .unwrap_or(Mode::Off)
}

#[cfg(test)]
mod option_tests {
    use super::*;
    use crate::base::options::Options;

    #[test]
    fn the_option_sets_the_initial_mode() {
        let initial = |text: &str| initial_mode(&Options::from_pairs(&[("OPENREG_SANITIZER", text)]));
        assert_eq!(initial_mode(&Options::from_pairs(&[])), Mode::Off);
        for (text, mode) in [
            ("0", Mode::Off),
            ("off", Mode::Off),
            ("1", Mode::Raise),
            (" Raise ", Mode::Raise),
            ("warn", Mode::Warn),
            ("2", Mode::Warn),
            ("", Mode::Off),
        ] {
            assert_eq!(initial(text), mode, "{text:?}");
        }
        let bad = Options::from_pairs(&[("OPENREG_SANITIZER", "maybe ")]);
        assert_eq!(initial_mode(&bad), Mode::Off);
        assert_eq!(bad.check().unwrap_err().message,
            "openreg cannot initialize: invalid option value: \
             OPENREG_SANITIZER=\"maybe \" (expected one of 0, 1, raise, warn); fix or unset this variable");
        let entry = bad.entries().into_iter().find(|e| e.name == "OPENREG_SANITIZER").unwrap();
        assert_eq!((entry.value.as_str(), bad.source("OPENREG_SANITIZER")), ("maybe ", "invalid"));
        let value = |text: &str| {
            Options::from_pairs(&[("OPENREG_SANITIZER", text)])
                .entries()
                .into_iter()
                .find(|e| e.name == "OPENREG_SANITIZER")
                .unwrap()
                .value
        };
        assert_eq!([value(""), value("1"), value("2")], ["off", "raise", "warn"]);
    }
}

/// Read by the shim before every launch (one relaxed load; Note [Stream
/// sanitizer]); mirrors `MODE != Off`.
#[no_mangle]
pub static openreg_sanitizer_on: AtomicBool = AtomicBool::new(false);

static MODE: AtomicU8 = AtomicU8::new(Mode::Off as u8);
/// Run once: applies `OPENREG_SANITIZER`, unless a call chose a mode first.
static INITIAL_MODE: Once = Once::new();

/// Whether the sanitizer checks anything (the runtime hooks' cheap test).
#[inline]
pub fn active() -> bool {
    openreg_sanitizer_on.load(Ordering::Relaxed)
}

pub fn mode() -> Mode {
    INITIAL_MODE.call_once(|| apply(initial_mode(options::get())));
    Mode::from_code(MODE.load(Ordering::Relaxed))
}

/// Turns the sanitizer on (`Raise`, `Warn`) or off. Turning it off keeps
/// the reports and counts (`clear` drops them) and forgets the model: what
/// runs meanwhile is not seen, so a later start begins afresh (no clocks,
/// no accesses, no pinned guards).
pub fn set_mode(mode: Mode) {
    INITIAL_MODE.call_once(|| ());
    apply(mode);
}

fn apply(mode: Mode) {
    MODE.store(mode as u8, Ordering::Relaxed);
    if mode != Mode::Off {
        crate::diagnostics::pinned_guard::install();
        openreg_sanitizer_on.store(true, Ordering::Release);
        return;
    }
    openreg_sanitizer_on.store(false, Ordering::Release);
    crate::diagnostics::pinned_guard::collect_faults();
    crate::diagnostics::pinned_guard::release_covered(|_, _| true);
    let mut state = STATE.lock();
    if let Some(st) = state.as_mut() {
        *st = State {
            reports: std::mem::take(&mut st.reports),
            counts: st.counts,
            ..State::default()
        };
    }
    UNMAPPED.lock().clear();
}

/// Applies `OPENREG_SANITIZER` unless a call chose a mode first (from
/// `device::init`, before any launch; `mode()` applies it too, so that it
/// reads right before the first device use), and prints collected reports
/// at exit.
pub(crate) fn init_from_options() {
    mode();
    crate::runtime::lifecycle::register_release(
        crate::runtime::lifecycle::PRIORITY_REPORTS,
        "sanitizer reports",
        print_reports_at_exit,
    );
}

/// The kinds of report, as `torch.openreg.sanitizer.counts()` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An access to memory whose last write, on another stream, is not
    /// ordered before it.
    Race = 0,
    /// A write while another stream's earlier read is not ordered before it.
    WriteAfterRead = 1,
    /// Memory freed while a stream other than its allocation stream used it,
    /// without `record_stream`, then reused.
    FreedInUse = 2,
    /// The host touched pinned memory a pending non-blocking copy uses.
    PinnedHostAccess = 3,
    /// An access whose only ordering came from `query()` of an event
    /// recorded before the racing work.
    QueryMisuse = 4,
}

/// Indexed by `Kind`; NUL-terminated for the C ABI.
pub const KIND_NAMES: [&CStr; 5] = [
    c"race",
    c"write_after_read",
    c"freed_in_use",
    c"pinned_host_access",
    c"query_misuse",
];

/// One range of memory a launch reads or writes, as the shim passes it
/// (`openreg::ffi::KernelBuffer` in cpp/shim.h, same layout). `tensor` is
/// the `c10::TensorImpl` it belongs to, for the report's description (0
/// when none), valid during the launch call.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KernelBuffer {
    pub address: usize,
    pub bytes: usize,
    pub written: bool,
    pub tensor: usize,
}

/// An agent of the model: a stream is `1 + device * streams + id` (0 would
/// be the host, which launches nothing itself: it only learns clocks).
type Agent = usize;

fn agent_of(stream: &StreamQueue) -> Agent {
    1 + stream.device() as usize * crate::runtime::stream::streams_per_device() + stream.id() as usize
}

/// A vector clock: entry `a` counts the launches of agent `a` ordered
/// before its owner's present.
#[derive(Clone, Debug, Default)]
pub struct Clock(Vec<u64>);

impl Clock {
    fn get(&self, agent: Agent) -> u64 {
        self.0.get(agent).copied().unwrap_or(0)
    }

    fn set(&mut self, agent: Agent, value: u64) {
        if self.0.len() <= agent {
            self.0.resize(agent + 1, 0);
        }
        self.0[agent] = value;
    }

    fn join(&mut self, other: &Clock) {
        if self.0.len() < other.0.len() {
            self.0.resize(other.0.len(), 0);
        }
        for (mine, theirs) in self.0.iter_mut().zip(&other.0) {
            *mine = (*mine).max(*theirs);
        }
    }
}

/// One launch: the point `(agent, seq)` and its op.
#[derive(Clone, Copy)]
struct Launch {
    agent: Agent,
    seq: u64,
    op: TaskName,
    /// Where the stream's device and id are, for the report.
    stream: &'static StreamQueue,
}

/// One allocation of device memory, from its malloc to its free.
struct Life {
    size: usize,
    /// The allocation stream (its accesses need no record_stream).
    agent: Agent,
    /// The Python line that allocated it, if known.
    source: Option<String>,
    /// What the first access said it holds ("float32[64, 256]").
    label: OnceLock<String>,
    /// Where it was freed, once it was.
    freed_at: OnceLock<String>,
}

impl Life {
    fn describe(&self) -> String {
        let what = self.label.get().map_or_else(
            || format!("{} bytes of device memory", self.size),
            |l| format!("tensor {l}"),
        );
        self.with_source(what)
    }

    /// `what` this memory holds, and the line that allocated it.
    fn with_source(&self, what: String) -> String {
        match &self.source {
            Some(line) => format!("{what} (allocated at {line})"),
            None => what,
        }
    }
}

/// An access of `launch` to bytes `start..end` of an allocation's `life`.
#[derive(Clone)]
struct Record {
    start: usize,
    end: usize,
    write: bool,
    launch: Launch,
    life: Arc<Life>,
}

impl Record {
    fn overlaps(&self, start: usize, end: usize) -> bool {
        self.start < end && start < self.end
    }

    fn within(&self, start: usize, end: usize) -> bool {
        start <= self.start && self.end <= end
    }
}

/// Accesses kept per allocation (live) or per freed range.
struct Memory {
    end: usize,
    life: Arc<Life>,
    records: Vec<Record>,
}

/// Above this many records an allocation's reads of one stream are merged
/// (a loop writing many slices of one buffer must not grow it forever).
const MAX_RECORDS: usize = 256;

struct StreamClock {
    clock: Clock,
    /// `State::host_generation` when the host's clock was last joined.
    host_generation: u64,
    stream: &'static StreamQueue,
}

#[derive(Default)]
struct State {
    streams: HashMap<Agent, StreamClock>,
    host: Clock,
    /// Bumped whenever the host's clock grows, so a launch joins it only
    /// when it has changed.
    host_generation: u64,
    /// For each stream, the point of it the host learned by a `query()`.
    host_queried: HashMap<Agent, u64>,
    live: BTreeMap<usize, Memory>,
    /// Freed memory with accesses the allocator did not cover.
    freed: BTreeMap<usize, Vec<Memory>>,
    reports: Vec<String>,
    counts: [u64; 5],
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn with_state<R>(f: impl FnOnce(&mut State) -> R) -> R {
    f(STATE.lock().get_or_insert_with(State::default))
}

impl State {
    /// The clock of `stream`, after joining what the host has seen.
    fn stream_clock(&mut self, stream: &'static StreamQueue) -> &mut Clock {
        let agent = agent_of(stream);
        let s = self.streams.entry(agent).or_insert_with(|| StreamClock {
            clock: Clock::default(),
            host_generation: 0,
            stream,
        });
        if s.host_generation != self.host_generation {
            s.clock.join(&self.host);
            s.host_generation = self.host_generation;
        }
        &mut s.clock
    }

    fn host_learns(&mut self, clock: &Clock, by_query: bool) {
        if by_query {
            for (agent, &seq) in clock.0.iter().enumerate().filter(|(_, &seq)| seq > 0) {
                let known = self.host_queried.entry(agent).or_default();
                *known = (*known).max(seq);
            }
        }
        self.host.join(clock);
        self.host_generation += 1;
    }

    /// The live allocation holding `address`: its base.
    fn live_base(&mut self, address: usize) -> Option<usize> {
        if let Some((&base, memory)) = self.live.range(..=address).next_back() {
            if address < memory.end {
                return Some(base);
            }
        }
        // Allocated before the sanitizer was on: learn it from the allocator.
        let (base, size, stream) = crate::runtime::allocator::allocation_containing(address)?;
        self.allocate(base, size, stream, None);
        Some(base)
    }

    fn allocate(
        &mut self,
        base: usize,
        size: usize,
        stream: &'static StreamQueue,
        source: Option<String>,
    ) {
        self.forget_unmapped();
        let end = base + size;
        let life = Arc::new(Life {
            size,
            agent: agent_of(stream),
            source,
            label: OnceLock::new(),
            freed_at: OnceLock::new(),
        });
        let mut records = Vec::new();
        // The uncovered accesses of freed memory this reuses come along.
        let overlapping: Vec<usize> = self.freed.range(..end).map(|(&b, _)| b).collect();
        for key in overlapping {
            let Some(bucket) = self.freed.remove(&key) else {
                continue;
            };
            let mut kept = Vec::new();
            for mut memory in bucket {
                let (inside, outside): (Vec<Record>, Vec<Record>) = memory
                    .records
                    .into_iter()
                    .partition(|r| r.overlaps(base, end));
                records.extend(inside);
                if !outside.is_empty() {
                    memory.records = outside;
                    kept.push(memory);
                }
            }
            if !kept.is_empty() {
                self.freed.insert(key, kept);
            }
        }
        self.live.insert(base, Memory { end, life, records });
    }
}

/// A Python source line ("file.py:12") for reports, from the host's
/// collector (`orSanitizerSetSourceCollector`); None without one.
pub type SourceCollector = unsafe extern "C" fn() -> *const c_char;
static SOURCE: AtomicUsize = AtomicUsize::new(0);

pub fn set_source_collector(collector: Option<SourceCollector>) {
    SOURCE.store(collector.map_or(0, |f| f as usize), Ordering::Release);
}

/// Not called under the state's lock: the collector takes the GIL.
fn source_line() -> Option<String> {
    let raw = SOURCE.load(Ordering::Acquire);
    if raw == 0 {
        return None;
    }
    // SAFETY: only `set_source_collector` stores non-zero values, and they
    // are `SourceCollector` function pointers.
    let collector: SourceCollector = unsafe { std::mem::transmute::<usize, SourceCollector>(raw) };
    // SAFETY: the collector returns null or a NUL-terminated string valid
    // until its next call on this thread.
    let text = unsafe { collector() };
    (!text.is_null()).then(|| {
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    })
}

/// A new allocation of `size` bytes at `base` for `stream`.
pub fn allocated(base: usize, size: usize, stream: &'static StreamQueue) {
    if !active() || base == 0 || crate::runtime::graph::is_capturing(stream) {
        return;
    }
    let source = source_line();
    with_state(|st| st.allocate(base, size, stream, source));
}

/// The allocation at `base` was freed; the allocator waits for `recorded`
/// (its record_stream streams) before reusing it.
pub fn freed(base: usize, recorded: &[&'static StreamQueue]) {
    if !active() {
        return;
    }
    let mut state = STATE.lock();
    let Some(st) = state.as_mut() else { return };
    let Some(mut memory) = st.live.remove(&base) else {
        return;
    };
    let covered: Vec<Agent> = recorded.iter().map(|s| agent_of(s)).collect();
    // The memory is reused only by later work of its allocation stream:
    // what that stream is already ordered after cannot race with it.
    let allocation_clock = st.streams.get(&memory.life.agent).map(|s| &s.clock);
    let host = &st.host;
    memory.records.retain(|r| {
        let (agent, seq) = (r.launch.agent, r.launch.seq);
        agent != memory.life.agent
            && !covered.contains(&agent)
            && host.get(agent) < seq
            && allocation_clock.is_none_or(|clock| clock.get(agent) < seq)
    });
    if memory.records.is_empty() {
        return;
    }
    drop(state);
    let _ = memory
        .life
        .freed_at
        .set(source_line().unwrap_or_else(|| "a free without a Python frame".to_string()));
    with_state(|st| st.freed.entry(base).or_default().push(memory));
}

/// Ranges unmapped since the state last looked (the allocator reports them
/// under its lock, which must never wait for the state's).
static UNMAPPED: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// Device memory `base..base + len` was unmapped: the allocator waited for
/// every stream that used it, so nothing about it is left to report.
pub fn unmapped(base: usize, len: usize) {
    if active() {
        UNMAPPED.lock().push((base, base + len));
    }
}

impl State {
    fn forget_unmapped(&mut self) {
        let ranges = std::mem::take(&mut *UNMAPPED.lock());
        for (base, end) in ranges {
            self.freed.retain(|_, bucket| {
                for m in bucket.iter_mut() {
                    m.records.retain(|r| !r.within(base, end));
                }
                bucket.retain(|m| !m.records.is_empty());
                !bucket.is_empty()
            });
        }
    }
}

/// `stream` waits for `point` (an event wait).
pub fn stream_waits(stream: &'static StreamQueue, point: &Clock) {
    if active() {
        with_state(|st| st.stream_clock(stream).join(point));
    }
}

/// `waiter` waits for everything launched on `source` so far.
pub fn stream_waits_stream(waiter: &'static StreamQueue, source: &'static StreamQueue) {
    if active() {
        with_state(|st| {
            let point = st.stream_clock(source).clone();
            st.stream_clock(waiter).join(&point);
        });
    }
}

/// The host synchronized with `point` (an event's), or learned by a query
/// that it has passed. Every host synchronization passes here, so it is
/// where a "raise" mode report of the pinned memory guard is raised.
pub fn host_waited_for(point: &Clock, by_query: bool) -> Result<()> {
    if !active() {
        return Ok(());
    }
    let host = with_state(|st| {
        st.host_learns(point, by_query);
        st.host.clone()
    });
    crate::diagnostics::pinned_guard::release_covered(|agent, seq| host.get(agent) >= seq);
    take_deferred_error()
}

/// The host waited for everything launched on `stream` so far (a blocking
/// copy, `.item()`, a data-dependent shape).
pub fn host_waited_for_stream(stream: &'static StreamQueue) -> Result<()> {
    match streams_point(&[stream]) {
        Some(point) => host_waited_for(&point, false),
        None => Ok(()),
    }
}

/// Guards the pinned host memory of a non-blocking copy just launched on
/// `stream` (Note [Pinned memory guard]); `tensor` describes it.
pub fn guard_pinned_copy(
    stream: &'static StreamQueue,
    address: usize,
    bytes: usize,
    device_writes: bool,
    tensor: &str,
) {
    if !active() || crate::runtime::graph::is_capturing(stream) {
        return;
    }
    let agent = agent_of(stream);
    let seq = with_state(|st| st.stream_clock(stream).get(agent));
    let name = stream_name(stream);
    let message = if device_writes {
        format!(
            "openreg sanitizer: pinned_host_access: the host read or wrote pinned host tensor {tensor}, the destination \
             of a non-blocking copy from the device on {name} (launch {seq}) that the host has not synchronized with; \
             its contents are not there yet on a real device\n  likely fix: synchronize first (stream.synchronize(), \
             or an event recorded after the copy and event.synchronize()) before using the host tensor"
        )
    } else {
        format!(
            "openreg sanitizer: pinned_host_access: the host wrote pinned host tensor {tensor}, the source of a \
             non-blocking copy to the device on {name} (launch {seq}) that the host has not synchronized with; on a \
             real device the copy may still be reading it\n  likely fix: record an event after the copy and call \
             event.synchronize() (or synchronize the stream) before refilling the buffer, or use another buffer"
        )
    };
    crate::diagnostics::pinned_guard::arm(address, bytes, device_writes, agent, seq, &message);
}

/// What the host would learn by synchronizing with `streams` now: a
/// synchronize takes it before waiting and gives it to
/// `host_waited_for` once the wait succeeded.
pub fn streams_point(streams: &[&'static StreamQueue]) -> Option<Clock> {
    if !active() {
        return None;
    }
    Some(with_state(|st| {
        let mut point = Clock::default();
        for &stream in streams {
            point.join(st.stream_clock(stream));
        }
        point
    }))
}

/// The sanitizer as the runtime sees it: the observer at its hook points
/// (Note [Hooks] in hook.rs), told each happens-before edge and each
/// allocation, free and unmap of device memory.
struct Observer;

impl OrderObserver for Observer {
    fn point(&self, streams: &[&'static StreamQueue]) -> Option<OrderPoint> {
        streams_point(streams).map(|clock| Arc::new(clock) as OrderPoint)
    }

    fn stream_waits(&self, stream: &'static StreamQueue, point: &OrderPoint) {
        if let Some(clock) = point.downcast_ref::<Clock>() {
            stream_waits(stream, clock);
        }
    }

    fn host_waited_for(&self, point: &OrderPoint, by_query: bool) -> Result<()> {
        match point.downcast_ref::<Clock>() {
            Some(clock) => host_waited_for(clock, by_query),
            None => Ok(()),
        }
    }
}

impl MemoryObserver for Observer {
    fn active(&self) -> bool {
        active()
    }

    fn allocated(&self, base: usize, size: usize, stream: &'static StreamQueue) {
        allocated(base, size, stream)
    }

    fn freed(&self, base: usize, recorded: &[&'static StreamQueue]) {
        freed(base, recorded)
    }

    fn unmapped(&self, base: usize, len: usize) {
        unmapped(base, len)
    }
}

/// Installs the sanitizer at the runtime's hook points: its observer, and
/// its start at the runtime's first initialization.
pub(crate) fn install_hooks() {
    hooks::ORDER_OBSERVER.install(&Observer);
    hooks::MEMORY_OBSERVER.install(&Observer);
    crate::runtime::lifecycle::AT_FIRST_INIT.install(init_from_options);
}

/// Checks a launch on `stream` accessing `buffers` (Note [Stream
/// sanitizer]); `describe` names a buffer's tensor for a report. In
/// "raise" mode a conflict fails the launch, and nothing is recorded.
pub fn check_launch(
    stream: &'static StreamQueue,
    op: TaskName,
    buffers: &[KernelBuffer],
    describe: &dyn Fn(usize) -> String,
) -> Result<()> {
    if !active() || crate::runtime::graph::is_capturing(stream) {
        return Ok(());
    }
    take_deferred_error()?;
    crate::diagnostics::pinned_guard::runtime_access(buffers);
    let mut state = STATE.lock();
    let st = state.get_or_insert_with(State::default);
    let agent = agent_of(stream);
    let clock = st.stream_clock(stream);
    let seq = clock.get(agent) + 1;
    clock.set(agent, seq);
    let clock = clock.clone();
    let launch = Launch {
        agent,
        seq,
        op,
        stream,
    };

    let mut conflict = None;
    let mut bases = Vec::with_capacity(buffers.len());
    for buffer in buffers.iter().filter(|b| b.bytes > 0) {
        let base = st.live_base(buffer.address);
        bases.push(base);
        let Some(memory) = base.and_then(|b| st.live.get(&b)) else {
            continue;
        };
        if buffer.tensor != 0 && memory.life.label.get().is_none() {
            let _ = memory.life.label.set(describe(buffer.tensor));
        }
        if conflict.is_none() {
            let (start, end) = (buffer.address, buffer.address + buffer.bytes);
            conflict = memory
                .records
                .iter()
                .filter(|r| {
                    r.overlaps(start, end)
                        && r.launch.agent != agent
                        && clock.get(r.launch.agent) < r.launch.seq
                })
                .find(|r| r.write || buffer.written)
                .map(|r| (r.clone(), *buffer, Arc::clone(&memory.life)));
        }
    }
    let found = conflict.map(|(earlier, buffer, life)| {
        report(st, &clock, &launch, &earlier, &buffer, &life, describe)
    });
    if mode() == Mode::Raise {
        if let Some((kind, message)) = found {
            drop(state);
            return Err(Error::new(
                ErrorKind::InvalidValue,
                add_report(kind, message),
            ));
        }
    }
    for (buffer, base) in buffers.iter().filter(|b| b.bytes > 0).zip(bases) {
        let Some(memory) = base.and_then(|b| st.live.get_mut(&b)) else {
            continue;
        };
        let (start, end) = (buffer.address, buffer.address + buffer.bytes);
        // A write ordered after every access it covers replaces them (a
        // conflicting one was reported); a read replaces this stream's
        // earlier reads of the same bytes.
        memory.records.retain(|r| {
            !(r.within(start, end) && (buffer.written || (!r.write && r.launch.agent == agent)))
        });
        let life = Arc::clone(&memory.life);
        memory.records.push(Record {
            start,
            end,
            write: buffer.written,
            launch,
            life,
        });
        if memory.records.len() > MAX_RECORDS {
            merge_records(&mut memory.records);
        }
    }
    drop(state);
    if let Some((kind, message)) = found {
        add_report(kind, message);
    }
    Ok(())
}

/// Keeps, per stream and kind, one record spanning its ranges (the newest
/// launch): coarser, so later checks may see overlaps that were gaps.
#[cold]
fn merge_records(records: &mut Vec<Record>) {
    let mut merged: Vec<Record> = Vec::new();
    for r in records.drain(..) {
        match merged.iter_mut().find(|m| {
            m.launch.agent == r.launch.agent && m.write == r.write && Arc::ptr_eq(&m.life, &r.life)
        }) {
            Some(m) => {
                m.start = m.start.min(r.start);
                m.end = m.end.max(r.end);
                if r.launch.seq > m.launch.seq {
                    m.launch = r.launch;
                }
            }
            None => merged.push(r),
        }
    }
    *records = merged;
}

fn stream_name(stream: &StreamQueue) -> String {
    format!(
        "openreg stream {} of device {}",
        stream.id(),
        stream.device()
    )
}

/// The report of `launch` accessing `buffer` against the `earlier` access.
fn report(
    st: &State,
    clock: &Clock,
    launch: &Launch,
    earlier: &Record,
    buffer: &KernelBuffer,
    life: &Arc<Life>,
    describe: &dyn Fn(usize) -> String,
) -> (Kind, String) {
    let (now, then) = (
        stream_name(launch.stream),
        stream_name(earlier.launch.stream),
    );
    let tensor = match buffer.tensor {
        0 => life.describe(),
        t => life.with_source(format!("tensor {}", describe(t))),
    };
    let (verb, access) = if buffer.written {
        ("writes", "write")
    } else {
        ("reads", "read")
    };
    let (earlier_verb, earlier_access) = if earlier.write {
        ("wrote", "write")
    } else {
        ("read", "read")
    };
    let known = clock.get(earlier.launch.agent);
    let queried = st
        .host_queried
        .get(&earlier.launch.agent)
        .copied()
        .unwrap_or(0);
    let reused = !Arc::ptr_eq(&earlier.life, life);
    let kind = if reused {
        Kind::FreedInUse
    } else if queried > 0 && queried >= known && queried < earlier.launch.seq {
        Kind::QueryMisuse
    } else if buffer.written && !earlier.write {
        Kind::WriteAfterRead
    } else {
        Kind::Race
    };
    let mut text = format!(
        "openreg sanitizer: {}: {} on {now} {verb} {tensor}",
        KIND_NAMES[kind as usize].to_string_lossy(),
        launch.op
    );
    let _ = write!(
        text,
        ", which {} {earlier_verb} on {then} (its launch {})",
        earlier.launch.op, earlier.launch.seq
    );
    if reused {
        let _ = write!(
            text,
            " while that memory was {}, freed at {} and reused since",
            earlier.life.describe(),
            earlier
                .life
                .freed_at
                .get()
                .map_or("an unknown place", String::as_str),
        );
    }
    let waited = match known {
        0 => format!("{now} has waited for none of {then}'s work"),
        n => format!("{now} has waited only for {then}'s first {n} launches"),
    };
    let _ = write!(
        text,
        "; nothing orders that {earlier_access} before this {access}: {waited}."
    );
    text.push_str("\n  likely fix: ");
    text.push_str(&match kind {
        Kind::FreedInUse => format!(
            "the freed tensor was still used by {then}: call tensor.record_stream(<{then}>) before freeing it (or make \
             the allocating stream wait for {then} before the tensor is freed)"
        ),
        Kind::QueryMisuse => format!(
            "Event.query() returned True for an event recorded on {then} before that access (it covers only work \
             launched before its record, up to launch {queried}); record the event after the work, or wait on it \
             (stream.wait_event / event.synchronize()) instead of polling an earlier one"
        ),
        _ => {
            let mut fix = format!(
                "make {now} wait for {then} before this launch (`torch.Stream.wait_stream`, or an event recorded on \
                 {then} after that {earlier_access} and waited on by {now})"
            );
            if known > 0 {
                let _ = write!(
                    fix,
                    "; {now} is ordered only after launch {known} of {then}: an event recorded (or a wait_stream made) \
                     before the work it should cover"
                );
            }
            if launch.stream.device() != earlier.launch.stream.device() {
                let _ = write!(fix, "; the two streams are on different devices");
            }
            let other_devices = st.streams.iter().any(|(&a, s)| {
                clock.get(a) > 0 && s.stream.device() != earlier.launch.stream.device() && a != launch.agent
            });
            if other_devices && known == 0 {
                let _ = write!(
                    fix,
                    "; {now} waited on a stream of another device than {then}'s: check that the wait names the right \
                     stream"
                );
            }
            fix
        }
    });
    (kind, text)
}

/// Counts and keeps a report, with the Python line of the host code that
/// made it when there is one (taken outside the state's lock: the
/// collector may take the GIL); returns its text.
pub(crate) fn add_report(kind: Kind, mut message: String) -> String {
    if let Some(line) = (kind != Kind::PinnedHostAccess).then(source_line).flatten() {
        let _ = write!(message, "\n  at: {line}");
    }
    with_state(|st| {
        st.counts[kind as usize] += 1;
        st.reports.push(message.clone());
    });
    message
}

pub fn reports() -> Vec<String> {
    crate::diagnostics::pinned_guard::collect_faults();
    STATE
        .lock()
        .as_ref()
        .map_or_else(Vec::new, |st| st.reports.clone())
}

pub fn counts() -> [u64; 5] {
    crate::diagnostics::pinned_guard::collect_faults();
    STATE.lock().as_ref().map_or([0; 5], |st| st.counts)
}

/// Drops the reports and counts (the model's state stays).
pub fn clear() {
    crate::diagnostics::pinned_guard::collect_faults();
    if let Some(st) = STATE.lock().as_mut() {
        st.reports.clear();
        st.counts = [0; 5];
    }
}

/// In "raise" mode, the report of a host access the pinned memory guard
/// caught since the last call (it cannot raise where it happened).
fn take_deferred_error() -> Result<()> {
    match crate::diagnostics::pinned_guard::collect_faults() {
        Some(message) if mode() == Mode::Raise => Err(Error::new(ErrorKind::InvalidValue, message)),
        _ => Ok(()),
    }
}

fn print_reports_at_exit() {
    let reports = reports();
    if reports.is_empty() || mode() != Mode::Warn {
        return;
    }
    eprintln!(
        "openreg sanitizer: {} stream-ordering reports:",
        reports.len()
    );
    for report in &reports {
        eprintln!("{report}");
    }
}
