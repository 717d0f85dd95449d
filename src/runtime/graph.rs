//! Graph capture and replay, with CUDA graphs' semantics.
//!
//! Note [Graph capture]: a stream in capture mode records the work submitted
//! to it instead of running it. Every launch goes through
//! `StreamQueue::submit` (Note [One door] in cpp/device/device_memory.h), and a
//! capturing stream hands each task to its `Capture` as a node: a kernel (a
//! closure that runs again on each replay), or an event record. Nothing is
//! queued, so the stream's progress counters do not move and nothing waits
//! for captured work: a host synchronization with the capturing stream
//! could never finish, so it is an error (Note [Capture modes]). A stream
//! never runs a kernel inline while it captures (`try_begin_inline`), so
//! the C++ shim's inline paths fall through to a launch, which records.
//!
//! Each node depends on the previous node of its stream and on the events
//! its stream waited for since (cross-stream capture): a stream that waits
//! on an event recorded inside the capture joins it, and must be joined
//! back (the origin stream waits on an event recorded on it after its last
//! work) before the capture ends, or `end_capture` fails as "unjoined", as
//! CUDA's fork/join rule says. Nodes are kept in submission order, which is
//! a topological order of those dependencies (a dependency is always
//! recorded before its dependents).
//!
//! Note [Graph replay]: a replay is one task on the replaying stream that
//! runs every node in recorded order, on whatever the captured buffers hold
//! then. Recorded order respects every captured dependency, so results are
//! those of eager execution; branches captured on different streams run one
//! after another rather than side by side (a simulated device gains nothing
//! from overlapping them). Launches of one graph are ordered among
//! themselves, as launches of one `cudaGraphExec_t` are: a replay on
//! another stream waits for the previous one.
//!
//! Note [Capture modes]: while any capture is active, a host
//! synchronization (a device, stream or event synchronize, `.item()`, a
//! blocking copy, an op whose result shape depends on data) is checked:
//!  - one that would wait for a capturing stream, or for an event recorded
//!    inside a capture, can never complete: always an error;
//!  - any other is "potentially unsafe" (on a GPU it could involve the
//!    capturing stream implicitly): an error under `Global` whichever thread
//!    makes it, under `ThreadLocal` only from the thread that began the
//!    capture, and allowed under `Relaxed`.
//!
//! An illegal operation also invalidates the capture: `end_capture` then
//! fails naming the first offence, the streams leave capture mode and the
//! graph's pool is released, so the stream stays usable and the graph can
//! be reset and captured again.
//!
//! Note [Graph-safe random numbers]: a random kernel captured in a graph
//! must draw new numbers on every replay. During capture a generator hands
//! out offsets relative to the graph (`reserve_random`), and each kernel's
//! slice points at a cell of its generator in the graph. A replay reserves
//! the whole captured amount from each generator at the call (so replays
//! advance it as eager work would, and a sequence of replays is reproducible
//! from `manual_seed`) and writes the seed and base into the cells before it
//! runs the nodes; the first replay after `manual_seed(s)` draws exactly
//! what the same ops would have drawn eagerly.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;

use parking_lot::Mutex;

use crate::runtime::device::{self, DeviceIndex};
use crate::base::error::{Error, ErrorKind, Result};
use crate::runtime::generator::{self, Generator, PhiloxSlice};
use crate::runtime::stream::{StreamQueue, Task, TaskName};

/// A memory pool id, as `c10::MempoolId_t`: `(capture id, 0)` for a pool a
/// graph made for itself, `(0, handle id)` for one from `graph_pool_handle`.
pub type MempoolId = (u64, u64);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum CaptureMode {
    Global,
    ThreadLocal,
    Relaxed,
}

impl CaptureMode {
    fn name(self) -> &'static str {
        match self {
            CaptureMode::Global => "global",
            CaptureMode::ThreadLocal => "thread_local",
            CaptureMode::Relaxed => "relaxed",
        }
    }
}

/// A recorded kernel: runs once per replay.
pub type Work = Box<dyn FnMut() -> Result<()> + Send>;

struct Node {
    /// None for an event record (it only orders).
    work: Option<Work>,
    stream: &'static StreamQueue,
    deps: Vec<usize>,
    /// What the node is, for `debug_dump` (only described in debug mode).
    label: String,
}

/// A stream taking part in a capture.
struct Member {
    stream: &'static StreamQueue,
    /// Its last node; None before its first.
    tail: Option<usize>,
    /// Event nodes it waited for since its last node.
    waits: Vec<usize>,
}

/// A generator used by random kernels of a capture (Note [Graph-safe
/// random numbers]).
struct CapturedGenerator {
    generator: Generator,
    /// Draws reserved by the captured kernels, in whole Philox blocks.
    increment: u64,
    cell: Arc<RandomCell>,
}

/// Where a replay puts a generator's seed and base offset for the kernels
/// that draw from it.
#[derive(Default)]
pub struct RandomCell {
    seed: AtomicU64,
    base: AtomicU64,
}

impl RandomCell {
    /// The slice a kernel captured with `relative` draws from now.
    pub fn resolve(&self, relative: u64) -> PhiloxSlice {
        PhiloxSlice {
            seed: self.seed.load(Ordering::Acquire),
            base: self.base.load(Ordering::Acquire).wrapping_add(relative),
        }
    }
}

#[derive(Default)]
struct CaptureState {
    nodes: Vec<Node>,
    members: Vec<Member>,
    generators: Vec<CapturedGenerator>,
    /// The first illegal operation, which invalidated the capture.
    failure: Option<String>,
}

/// A capture in progress (Note [Graph capture]).
pub struct Capture {
    device: DeviceIndex,
    origin: &'static StreamQueue,
    mode: CaptureMode,
    thread: ThreadId,
    pool: MempoolId,
    /// The allocator's key for `pool` (Note [Graph pools] in allocator.rs).
    pool_key: usize,
    /// Describe nodes for `debug_dump`.
    debug: bool,
    state: Mutex<CaptureState>,
}

/// Active captures, for the host-synchronization checks.
static ACTIVE: Mutex<Vec<Arc<Capture>>> = Mutex::new(Vec::new());
/// `ACTIVE.len()`, read without locking on every host synchronization.
static ACTIVE_COUNT: AtomicUsize = AtomicUsize::new(0);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A fresh process-unique id (captures and pool handles share the counter,
/// as CUDA's do).
fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// A new pool id for `graph_pool_handle()`.
pub fn new_pool_handle() -> MempoolId {
    (0, next_id())
}

fn capture_error(message: String) -> Error {
    Error::new(ErrorKind::StreamCapture, message)
}

impl Capture {
    pub fn pool_key(&self) -> usize {
        self.pool_key
    }

    /// Marks the capture as failed by `what` (the first offence wins) and
    /// returns the error to raise now.
    pub(crate) fn invalidate(&self, what: String) -> Error {
        let mut st = self.state.lock();
        st.failure.get_or_insert_with(|| what.clone());
        capture_error(what)
    }

    fn member(st: &mut CaptureState, stream: &StreamQueue) -> usize {
        st.members
            .iter()
            .position(|m| std::ptr::eq(m.stream, stream))
            .expect("a capturing stream is a member of its capture")
    }

    fn push_node(
        st: &mut CaptureState,
        stream: &'static StreamQueue,
        work: Option<Work>,
        label: String,
    ) -> usize {
        let m = Capture::member(st, stream);
        let member = &mut st.members[m];
        let mut deps: Vec<usize> = member.tail.into_iter().collect();
        deps.append(&mut member.waits);
        deps.sort_unstable();
        deps.dedup();
        let index = st.nodes.len();
        st.members[m].tail = Some(index);
        st.nodes.push(Node {
            work,
            stream,
            deps,
            label,
        });
        index
    }

    /// Records `task`, submitted to the capturing `stream` (Note [Graph
    /// capture]). `describe` names a kernel for debug dumps.
    pub(crate) fn record(
        &self,
        stream: &'static StreamQueue,
        task: Task,
        describe: impl FnOnce() -> String,
    ) -> Result<()> {
        match task {
            Task::Run(work) => {
                let label = if self.debug { describe() } else { String::new() };
                Capture::push_node(&mut self.state.lock(), stream, Some(work), label);
                Ok(())
            }
            Task::WaitFor { stream: source, .. } => Err(self.invalidate(format!(
                "{stream} is capturing a graph and cannot wait for work of {source} that was queued outside the \
                 capture (a captured graph may depend only on captured work; synchronize before capture_begin)"
            ))),
            // Timing stamps of events recorded in a capture are not taken
            // (Event::record records an ordering node instead).
            Task::Timestamp { .. } => Ok(()),
        }
    }

    /// An event recorded on the capturing `stream`: returns its node.
    pub(crate) fn record_event(&self, stream: &'static StreamQueue) -> usize {
        let label = if self.debug {
            "event record".to_string()
        } else {
            String::new()
        };
        Capture::push_node(&mut self.state.lock(), stream, None, label)
    }

    /// Makes `stream` wait for the event node `node` of this capture,
    /// joining the capture if it is not part of it yet.
    pub(crate) fn wait_event(
        self: &Arc<Capture>,
        stream: &'static StreamQueue,
        node: usize,
    ) -> Result<()> {
        match stream.capture() {
            Some(current) if Arc::ptr_eq(&current, self) => {
                let mut st = self.state.lock();
                let m = Capture::member(&mut st, stream);
                st.members[m].waits.push(node);
                Ok(())
            }
            Some(_) => Err(self.invalidate(format!(
                "{stream} waited on an event recorded in another graph capture: two captures cannot be merged"
            ))),
            None => {
                if stream.device() != self.device {
                    return Err(self.invalidate(format!(
                        "{stream} waited on an event recorded in a graph capture on openreg device {}: a capture \
                         stays on one device",
                        self.device
                    )));
                }
                self.state.lock().members.push(Member { stream, tail: Some(node), waits: Vec::new() });
                stream.join_capture(Arc::clone(self))
            }
        }
    }

    /// A random kernel of this capture reserves `draws` draws of
    /// `generator`: its slice is relative to the replay's base (Note
    /// [Graph-safe random numbers]); returns it and the cell to read.
    pub(crate) fn reserve_random(
        &self,
        generator: &Generator,
        draws: u64,
    ) -> (u64, Arc<RandomCell>) {
        let mut st = self.state.lock();
        let index = match st
            .generators
            .iter()
            .position(|g| g.generator.same_state(generator))
        {
            Some(index) => index,
            None => {
                st.generators.push(CapturedGenerator {
                    generator: generator.share(),
                    increment: 0,
                    cell: Arc::default(),
                });
                st.generators.len() - 1
            }
        };
        let captured = &mut st.generators[index];
        let relative = captured.increment;
        captured.increment = captured
            .increment
            .wrapping_add(generator::round_up_to_block(draws));
        (relative, Arc::clone(&captured.cell))
    }

    /// The streams not joined back into the origin: those whose last node
    /// the origin's frontier does not depend on.
    fn unjoined(st: &CaptureState) -> Vec<&'static StreamQueue> {
        let origin = &st.members[0];
        let mut reached = vec![false; st.nodes.len()];
        let mut todo: Vec<usize> = origin
            .tail
            .into_iter()
            .chain(origin.waits.iter().copied())
            .collect();
        while let Some(n) = todo.pop() {
            if !std::mem::replace(&mut reached[n], true) {
                todo.extend(st.nodes[n].deps.iter().copied());
            }
        }
        st.members[1..]
            .iter()
            .filter(|m| m.tail.is_some_and(|t| !reached[t]))
            .map(|m| m.stream)
            .collect()
    }
}

/// Whether `stream` is capturing (part of a capture).
pub fn is_capturing(stream: &StreamQueue) -> bool {
    stream.capture_pool() != 0
}

/// Fails (and invalidates the capture) if `stream` is capturing: `what`, a
/// host wait for it, could never end (Note [Capture modes]).
pub fn check_not_capturing(stream: &StreamQueue, what: &str) -> Result<()> {
    match stream.capture() {
        None => Ok(()),
        Some(capture) => Err(capture.invalidate(format!(
            "{what} is not allowed while {stream} is capturing a graph: captured work runs only at replay, so the \
             host cannot wait for it (operation not permitted when stream is capturing)"
        ))),
    }
}

/// Checks a host synchronization against the active captures (Note
/// [Capture modes]); `stream` is the stream it waits for, if one. `what`
/// names it for the user.
pub fn check_host_sync(what: &str, stream: Option<&StreamQueue>) -> Result<()> {
    if ACTIVE_COUNT.load(Ordering::Acquire) == 0 {
        return Ok(());
    }
    if let Some(stream) = stream {
        check_not_capturing(stream, what)?;
    }
    let me = std::thread::current().id();
    let active = ACTIVE.lock().clone();
    for capture in active {
        let offends = match capture.mode {
            CaptureMode::Global => true,
            CaptureMode::ThreadLocal => capture.thread == me,
            CaptureMode::Relaxed => false,
        };
        if offends {
            return Err(capture.invalidate(format!(
                "{what} is not allowed while {} is capturing a graph with capture_error_mode=\"{}\" (a host \
                 synchronization during capture; use capture_error_mode=\"{}\" to allow it)",
                capture.origin,
                capture.mode.name(),
                if capture.mode == CaptureMode::Global { "thread_local\" or \"relaxed" } else { "relaxed" }
            )));
        }
    }
    Ok(())
}

/// The slice for a random kernel launched now on the current stream of the
/// current device, if that stream is capturing (Note [Graph-safe random
/// numbers]): `(relative base, cell)`.
pub fn reserve_random_in_capture(
    generator: &Generator,
    draws: u64,
) -> Result<Option<(u64, Arc<RandomCell>)>> {
    if ACTIVE_COUNT.load(Ordering::Acquire) == 0 {
        return Ok(None);
    }
    let stream = crate::runtime::stream::current(-1)?;
    Ok(stream
        .capture()
        .map(|capture| capture.reserve_random(generator, draws)))
}

fn activate(capture: &Arc<Capture>) {
    let mut active = ACTIVE.lock();
    active.push(Arc::clone(capture));
    ACTIVE_COUNT.store(active.len(), Ordering::Release);
}

fn deactivate(capture: &Arc<Capture>) {
    let mut active = ACTIVE.lock();
    active.retain(|c| !Arc::ptr_eq(c, capture));
    ACTIVE_COUNT.store(active.len(), Ordering::Release);
}

/// Begins capturing the work of `stream` (Note [Graph capture]), allocating
/// from `pool` (Note [Graph pools] in allocator.rs); `(0, 0)` asks for a
/// new pool of the graph's own.
pub fn begin_capture(
    stream: &'static StreamQueue,
    mode: CaptureMode,
    pool: MempoolId,
    debug: bool,
) -> Result<Arc<Capture>> {
    if let Some(existing) = stream.capture() {
        let role = if std::ptr::eq(existing.origin, stream) {
            "already capturing a graph"
        } else {
            "already part of a capture"
        };
        return Err(capture_error(format!(
            "capture_begin: {stream} is {role}; captures cannot be nested on one stream (end the capture first)"
        )));
    }
    let id = next_id();
    let pool = if pool == (0, 0) { (id, 0) } else { pool };
    let allocator = &device::context(stream.device().into())?.allocator;
    let pool_key = allocator.retain_pool(pool);
    let capture = Arc::new(Capture {
        device: stream.device(),
        origin: stream,
        mode,
        thread: std::thread::current().id(),
        pool,
        pool_key,
        debug,
        state: Mutex::new(CaptureState {
            members: vec![Member {
                stream,
                tail: None,
                waits: Vec::new(),
            }],
            ..CaptureState::default()
        }),
    });
    if let Err(e) = stream.join_capture(Arc::clone(&capture)) {
        allocator.release_pool(pool);
        return Err(e);
    }
    activate(&capture);
    Ok(capture)
}

/// What a finished capture recorded: a graph ready to be replayed.
pub struct Executable {
    device: DeviceIndex,
    pool: MempoolId,
    nodes: Mutex<Vec<Node>>,
    node_count: usize,
    generators: Vec<(Generator, u64, Arc<RandomCell>)>,
    /// The DOT text of the graph, in debug mode.
    dot: Option<String>,
    /// Where the newest launch was queued (launches are ordered, Note
    /// [Graph replay]).
    last_launch: Mutex<Option<(&'static StreamQueue, u64)>>,
}

/// Ends the capture that `stream` began. Every member stream leaves capture
/// mode whatever the outcome; on failure the pool is released.
pub fn end_capture(stream: &'static StreamQueue) -> Result<Executable> {
    let Some(capture) = stream.capture() else {
        return Err(capture_error(format!(
            "capture_end: {stream} is not capturing a graph (no capture_begin on it)"
        )));
    };
    if !std::ptr::eq(capture.origin, stream) {
        return Err(capture_error(format!(
            "capture_end: {stream} joined a capture begun on {}; end it on that stream",
            capture.origin
        )));
    }
    deactivate(&capture);
    let st = std::mem::take(&mut *capture.state.lock());
    for member in &st.members {
        member.stream.leave_capture();
    }
    let allocator = &device::context(capture.device.into())?.allocator;
    let failure = match &st.failure {
        Some(failure) => Some(format!("the graph capture on {stream} failed: {failure}")),
        None => {
            let unjoined = Capture::unjoined(&st);
            (!unjoined.is_empty()).then(|| {
                let names: Vec<String> = unjoined.iter().map(|s| s.to_string()).collect();
                format!(
                    "capture_end: the capture on {stream} has unjoined work on {}: a stream that joined the capture \
                     must be joined back (the capturing stream waits for it, e.g. capturing.wait_stream(other)) \
                     before capture_end",
                    names.join(", ")
                )
            })
        }
    };
    if let Some(failure) = failure {
        drop(st); // the recorded closures, before their pool goes
        allocator.release_pool(capture.pool);
        return Err(capture_error(failure));
    }
    let dot = capture.debug.then(|| to_dot(&st.nodes));
    let generators = st
        .generators
        .into_iter()
        .map(|g| (g.generator, g.increment, g.cell))
        .collect();
    Ok(Executable {
        device: capture.device,
        pool: capture.pool,
        node_count: st.nodes.len(),
        nodes: Mutex::new(st.nodes),
        generators,
        dot,
        last_launch: Mutex::new(None),
    })
}

/// Graphviz DOT for `nodes`: one node each, labelled with what it is and
/// its stream, and an edge per dependency.
fn to_dot(nodes: &[Node]) -> String {
    let mut dot =
        String::from("digraph openreg_graph {\n  node [shape=box, fontname=\"monospace\"];\n");
    for (i, node) in nodes.iter().enumerate() {
        let kind = if node.work.is_some() {
            "kernel"
        } else {
            "event"
        };
        let text = format!("{i}: {}\\nstream {} ({kind})", node.label, node.stream.id());
        let _ = writeln!(dot, "  n{i} [label=\"{}\"];", text.replace('"', "\\\""));
    }
    for (i, node) in nodes.iter().enumerate() {
        for dep in &node.deps {
            let _ = writeln!(dot, "  n{dep} -> n{i};");
        }
    }
    dot.push_str("}\n");
    dot
}

impl Executable {
    pub fn pool(&self) -> MempoolId {
        self.pool
    }

    pub fn node_count(&self) -> usize {
        self.node_count
    }

    pub fn dot(&self) -> Option<&str> {
        self.dot.as_deref()
    }

    /// Queues one replay on `stream` (Note [Graph replay]).
    pub fn launch(self: &Arc<Executable>, stream: &'static StreamQueue) -> Result<()> {
        if stream.device() != self.device {
            return Err(Error::invalid_value(format!(
                "graph replay: the graph was captured on openreg device {} and cannot run on {stream}",
                self.device
            )));
        }
        if stream.capture().is_some() {
            return Err(capture_error(format!(
                "graph replay on {stream}, which is capturing: replaying a graph into another capture is not supported"
            )));
        }
        // The generators advance at the call, in call order (Note
        // [Graph-safe random numbers]).
        let draws: Vec<(Arc<RandomCell>, PhiloxSlice)> = self
            .generators
            .iter()
            .map(|(g, increment, cell)| (Arc::clone(cell), g.reserve(*increment)))
            .collect();
        let mut last = self.last_launch.lock();
        if let Some((previous, seq)) = *last {
            if !std::ptr::eq(previous, stream) && !previous.has_completed(seq) {
                stream.submit(Task::WaitFor {
                    stream: previous,
                    seq,
                })?;
            }
        }
        let graph = Arc::clone(self);
        let replay = crate::runtime::profiler::timed(
            format!("graph replay ({} nodes)", self.node_count),
            stream,
            Box::new(move || graph.run(&draws)),
        );
        let seq = stream.submit_named(
            Task::Run(replay),
            TaskName::kernel(c"graph replay"),
            String::new,
        )?;
        *last = Some((stream, seq));
        Ok(())
    }

    /// Runs every node in recorded order (a task of the replaying stream).
    fn run(&self, draws: &[(Arc<RandomCell>, PhiloxSlice)]) -> Result<()> {
        let mut nodes = self.nodes.lock();
        for (cell, slice) in draws {
            cell.seed.store(slice.seed, Ordering::Release);
            cell.base.store(slice.base, Ordering::Release);
        }
        for node in nodes.iter_mut() {
            if let Some(work) = node.work.as_mut() {
                work()?;
            }
        }
        Ok(())
    }
}

impl Drop for Executable {
    /// The last reference is gone, so no launch is queued any more (each
    /// holds one): the pool can go.
    fn drop(&mut self) {
        self.nodes.get_mut().clear(); // the recorded closures, before their pool
        if let Ok(ctx) = device::context(self.device.into()) {
            ctx.allocator.release_pool(self.pool);
        }
    }
}

enum Phase {
    Empty,
    Capturing {
        stream: &'static StreamQueue,
    },
    /// Captured and kept (`keep_graph`), not instantiated yet.
    Captured(Arc<Executable>),
    Instantiated(Arc<Executable>),
}

struct GraphState {
    phase: Phase,
    debug: bool,
    /// The pool of the newest capture (kept for `pool()` after reset).
    pool: MempoolId,
}

/// A graph as `torch.accelerator.Graph` and the C ABI see it: capture,
/// instantiate, replay, reset (`at::GraphImplInterface`'s contract).
pub struct Graph {
    keep_graph: bool,
    state: Mutex<GraphState>,
}

impl Graph {
    pub fn new(keep_graph: bool) -> Graph {
        Graph {
            keep_graph,
            state: Mutex::new(GraphState {
                phase: Phase::Empty,
                debug: false,
                pool: (0, 0),
            }),
        }
    }

    /// Begins capturing the current stream of the current device.
    pub fn capture_begin(&self, pool: MempoolId, mode: CaptureMode) -> Result<()> {
        let mut st = self.state.lock();
        match st.phase {
            Phase::Empty => {}
            Phase::Capturing { stream, .. } => {
                return Err(capture_error(format!("capture_begin: this graph is already capturing {stream}")))
            }
            _ => {
                return Err(capture_error(
                    "capture_begin: this graph already holds a captured graph; call reset() before capturing again"
                        .to_string(),
                ))
            }
        }
        let stream = crate::runtime::stream::current(-1)?;
        let capture = begin_capture(stream, mode, pool, st.debug)?;
        st.pool = capture.pool;
        st.phase = Phase::Capturing { stream };
        Ok(())
    }

    /// Ends the capture on the stream it began on, which must be current.
    pub fn capture_end(&self) -> Result<()> {
        let mut st = self.state.lock();
        let Phase::Capturing { stream, .. } = st.phase else {
            return Err(capture_error(
                "capture_end() called without a capture_begin() on this graph".to_string(),
            ));
        };
        let current = crate::runtime::stream::current(stream.device().into())?;
        let current_device = device::current_device();
        if !std::ptr::eq(current, stream) || current_device != stream.device() {
            return Err(capture_error(format!(
                "capture_end: the capture began on {stream}, but the current stream is {} (end it on the stream it began on)",
                crate::runtime::stream::current(-1)?
            )));
        }
        let ended = end_capture(stream);
        st.phase = Phase::Empty;
        let executable = Arc::new(ended?);
        st.phase = if self.keep_graph {
            Phase::Captured(executable)
        } else {
            Phase::Instantiated(executable)
        };
        Ok(())
    }

    pub fn instantiate(&self) -> Result<()> {
        let mut st = self.state.lock();
        st.phase = match std::mem::replace(&mut st.phase, Phase::Empty) {
            Phase::Captured(executable) | Phase::Instantiated(executable) if self.keep_graph => {
                Phase::Instantiated(executable)
            }
            other => {
                st.phase = other;
                let why = if self.keep_graph {
                    "without a completed capture"
                } else {
                    "after capture_end with keep_graph=False (capture_end instantiated it and discarded the captured graph)"
                };
                return Err(capture_error(format!("instantiate() called {why}")));
            }
        };
        Ok(())
    }

    /// Replays on the current stream of the graph's device.
    pub fn replay(&self) -> Result<()> {
        let executable = {
            let mut st = self.state.lock();
            match &st.phase {
                Phase::Captured(executable) => {
                    let executable = Arc::clone(executable);
                    st.phase = Phase::Instantiated(Arc::clone(&executable));
                    executable
                }
                Phase::Instantiated(executable) => Arc::clone(executable),
                Phase::Capturing { stream, .. } => {
                    return Err(capture_error(format!(
                        "replay() called while this graph is still capturing {stream}"
                    )))
                }
                Phase::Empty => {
                    return Err(capture_error(
                        "replay() called without a successful capture".to_string(),
                    ))
                }
            }
        };
        executable.launch(crate::runtime::stream::current(executable.device.into())?)
    }

    /// Releases the captured graph and its pool; the graph may capture again.
    pub fn reset(&self) -> Result<()> {
        let mut st = self.state.lock();
        match std::mem::replace(&mut st.phase, Phase::Empty) {
            Phase::Empty => Ok(()),
            Phase::Captured(executable) | Phase::Instantiated(executable) => {
                drop(st);
                drop(executable);
                Ok(())
            }
            capturing @ Phase::Capturing { .. } => {
                st.phase = capturing;
                Err(capture_error(
                    "reset() called during capture: end the capture (capture_end) first"
                        .to_string(),
                ))
            }
        }
    }

    pub fn pool(&self) -> MempoolId {
        self.state.lock().pool
    }

    pub fn enable_debug_mode(&self) {
        self.state.lock().debug = true;
    }

    /// The captured graph as Graphviz DOT (debug mode only).
    pub fn debug_dot(&self) -> Result<String> {
        let st = self.state.lock();
        if !st.debug {
            return Err(Error::invalid_value(
                "debug_dump: call enable_debug_mode() before capture_begin to record the graph for dumping",
            ));
        }
        match &st.phase {
            Phase::Captured(executable) | Phase::Instantiated(executable) => {
                executable.dot().map(str::to_string).ok_or_else(|| {
                    Error::invalid_value(
                        "debug_dump: the graph was captured before enable_debug_mode()",
                    )
                })
            }
            _ => Err(Error::invalid_value(
                "debug_dump: this graph holds no captured graph",
            )),
        }
    }

    /// How many nodes the captured graph has (0 without one).
    pub fn node_count(&self) -> usize {
        match &self.state.lock().phase {
            Phase::Captured(executable) | Phase::Instantiated(executable) => {
                executable.node_count()
            }
            _ => 0,
        }
    }

    /// The stream this graph is capturing, if it is.
    pub fn capturing_stream(&self) -> Option<&'static StreamQueue> {
        match self.state.lock().phase {
            Phase::Capturing { stream, .. } => Some(stream),
            _ => None,
        }
    }
}

impl Drop for Graph {
    /// A graph dropped mid-capture ends it, discarding what it recorded.
    fn drop(&mut self) {
        if let Phase::Capturing { stream, .. } = self.state.get_mut().phase {
            let _ = end_capture(stream);
        }
    }
}
