//! The one bridge between the C++ shim (`cpp/`) and the Rust runtime.
//!
//! Every function here is a short adapter: it converts types and forwards.
//! A Rust `Err` becomes a C++ exception that the shim turns into a
//! `c10::Error` (a Python `RuntimeError`). Functions without `Result` cannot
//! fail and are the only ones the shim calls from `noexcept` methods.
//! Events cross as opaque `usize` handles (see `event::handle`); streams as
//! `(device, id)` values (see Note [StreamId assignment]); generators as an
//! opaque Rust `Generator` the shim holds in a `rust::Box`.

use std::ffi::c_char;
use std::sync::Arc;

use crate::runtime::allocator;
use crate::runtime::device;
use crate::base::error::Result;
use crate::runtime::event::{handle, Event};
use crate::runtime::generator::{self, Distribution, Element, Generator};
use crate::memory::device_memory;
use crate::memory::pinned;
use crate::runtime::stream::{self, StreamId};

#[cxx::bridge(namespace = "openreg::ffi")]
mod bridge {
    // Shared types.

    /// The result of a device allocation: `ptr`, or why not.
    struct Allocation {
        ptr: usize,
        out_of_memory: bool,
        error: String,
    }

    /// `c10::CachingDeviceAllocator::Stat`.
    struct StatFfi {
        current: i64,
        peak: i64,
        allocated: i64,
        freed: i64,
    }

    /// A statistic for all pools, the small pool and the large pool.
    struct StatArrayFfi {
        pools: [StatFfi; 3],
    }

    /// `c10::CachingDeviceAllocator::DeviceStats`, field for field.
    struct DeviceStatsFfi {
        allocation: StatArrayFfi,
        segment: StatArrayFfi,
        active: StatArrayFfi,
        inactive_split: StatArrayFfi,
        allocated_bytes: StatArrayFfi,
        reserved_bytes: StatArrayFfi,
        active_bytes: StatArrayFfi,
        inactive_split_bytes: StatArrayFfi,
        requested_bytes: StatArrayFfi,
        num_alloc_retries: i64,
        num_ooms: i64,
        num_sync_all_streams: i64,
        num_device_alloc: i64,
        num_device_free: i64,
        oversize_allocations: StatFfi,
        oversize_segments: StatFfi,
        max_split_size: i64,
    }

    struct MemoryInfo {
        free: usize,
        total: usize,
    }

    /// Whose dtype support the kernels follow (`OPENREG_DTYPES`,
    /// `options::DtypePolicy`).
    enum DtypePolicy {
        Cuda,
        Cpu,
        Record,
    }

    /// How `launch_kernel` runs a kernel on the current stream.
    enum LaunchMode {
        /// Queue it and return.
        Queue,
        /// Queue it and wait for it, reporting its failure.
        Wait,
        /// Run it right here if the stream is idle, else queue it
        /// (Note [Inline launches]); for short kernels.
        InlineIfIdle,
    }

    /// A random kernel's distribution (`generator::Distribution`, flat):
    /// `a`, `b` are its two float parameters in declaration order
    /// (from/to, mean/std, p, lambda, median/sigma); `from`, `range` those
    /// of `Integers`.
    enum RandomKind {
        Uniform,
        Normal,
        Bernoulli,
        Exponential,
        Geometric,
        LogNormal,
        Cauchy,
        Integers,
    }

    /// The element type of the contiguous buffer a random kernel writes.
    enum RandomElement {
        F32,
        F64,
        I64,
    }

    struct RandomFill {
        kind: RandomKind,
        element: RandomElement,
        a: f64,
        b: f64,
        from: i64,
        range: u64,
    }

    /// A kernel's run, for the profiler (src/runtime/profiler.rs).
    struct ProfiledActivity {
        name: String,
        device: i8,
        stream: i64,
        start_ns: i64,
        end_ns: i64,
        correlation: u64,
    }

    /// A memory pool id, `c10::MempoolId_t`.
    struct PoolId {
        first: u64,
        second: u64,
    }

    /// The draws reserved for one kernel (Note [Philox offsets]). A kernel
    /// captured in a graph has `replay` set: the address of the graph's
    /// cell for the generator, and `base` relative to what the cell holds
    /// at each replay (Note [Graph-safe random numbers] in graph.rs).
    struct RandomSlice {
        seed: u64,
        base: u64,
        replay: usize,
    }

    // Rust functions the C++ shim calls.
    extern "Rust" {
        // Devices (see Note [Current device], Note [Contexts]).
        fn device_count() -> i8;
        fn current_device() -> i8;
        fn set_device(index: i8) -> Result<()>;
        fn exchange_device(index: i8) -> Result<i8>;
        fn check_device(index: i8) -> Result<()>;
        fn has_primary_context(index: i8) -> Result<bool>;
        fn init() -> Result<()>;
        fn is_initialized() -> bool;
        fn synchronize_device(index: i8) -> Result<()>;
        /// A host-blocking operation named `what` is about to wait: warns
        /// or fails in sync-debug mode (Note [Sync debug]).
        fn check_host_sync(what: &str) -> Result<()>;
        fn device_supported_scalar_types(index: i8) -> Result<u64>;

        // Streams.
        fn current_stream(device: i8) -> Result<i64>;
        fn default_stream(device: i8) -> Result<i64>;
        fn pool_stream(device: i8, priority: i32) -> Result<i64>;
        fn exchange_stream(device: i8, id: i64) -> Result<i64>;
        fn check_stream(device: i8, id: i64) -> Result<()>;
        fn stream_native_handle(device: i8, id: i64) -> Result<usize>;
        fn query_stream(device: i8, id: i64) -> Result<bool>;
        fn synchronize_stream(device: i8, id: i64) -> Result<()>;

        // Events; `event` is 0 until the first record creates it. Handles are
        // checked (Note [Event handles] in src/runtime/event.rs).
        fn record_event(
            event: &mut usize,
            event_device: i8,
            device: i8,
            id: i64,
            timing: bool,
        ) -> Result<()>;
        fn block_event(event: usize, device: i8, id: i64) -> Result<()>;
        fn query_event(event: usize) -> Result<bool>;
        fn synchronize_event(event: usize) -> Result<()>;
        fn destroy_event(event: usize);
        fn event_elapsed_ms(start: usize, end: usize, device: i8) -> Result<f64>;

        // Device memory (see Note [Caching allocator]). Allocations are for
        // the current stream of `device`.
        fn device_malloc(device: i8, size: usize) -> Allocation;
        fn device_free(ptr: usize) -> Result<()>;
        fn device_of_pointer(ptr: usize) -> i8;
        fn record_stream(ptr: usize, device: i8, id: i64) -> Result<()>;
        fn empty_cache();
        fn device_stats(device: i8) -> Result<DeviceStatsFfi>;
        fn reset_peak_stats(device: i8) -> Result<()>;
        fn reset_accumulated_stats(device: i8) -> Result<()>;
        fn memory_info(device: i8) -> Result<MemoryInfo>;
        fn set_memory_fraction(device: i8, fraction: f64) -> Result<()>;
        fn any_device_initialized() -> bool;
        /// `OPENREG_SPLIT_ELEMENTS` (Note [Split kernels] in cpp/ops/kernel_split.h).
        fn split_elements() -> usize;
        /// `OPENREG_DTYPES` (Note [Dtype policy] in cpp/ops/dtype_policy.h).
        fn dtype_policy() -> DtypePolicy;
        /// Under `OPENREG_DTYPES=record`: one kernel call (`dtype_record`).
        fn record_kernel_dtype(op: &str, dtype: &str, computed: &str);

        // Pinned host memory.
        fn host_malloc(size: usize) -> Result<usize>;
        fn host_free(ptr: usize);
        fn is_pinned(ptr: usize) -> bool;

        /// Device memory is accessible to host code between these calls
        /// (Note [Memory protection]); C++ pairs them with `DeviceAccess`.
        fn begin_device_access();
        fn end_device_access();

        /// Fails if `ptr` is device memory allocated before its device's
        /// restart (Note [Device memory generations] in src/runtime/allocator.rs);
        /// the shim calls it when `openreg_memory_is_current` said no.
        fn check_device_memory(ptr: usize) -> Result<()>;

        // Kernels: run `kernel` on the current stream of `device`.
        fn launch_kernel(device: i8, kernel: UniquePtr<Kernel>, mode: LaunchMode) -> Result<()>;
        /// If the current stream of `device` is idle, reserves it for a
        /// kernel the caller runs itself, and returns true; the caller must
        /// then call `end_inline_kernel` (Note [Inline launches]).
        fn begin_inline_kernel(device: i8) -> Result<bool>;
        fn end_inline_kernel(device: i8);
        /// Reports a failed kernel of the current stream of `device` that
        /// no wait has reported yet (Note [Sticky kernel failures]).
        fn report_stream_failure(device: i8) -> Result<()>;
        /// Whether the current stream of `device` has a failure to report;
        /// one atomic load (false for a device that cannot be reached).
        fn stream_has_parked_failure(device: i8) -> bool;
        /// Makes the current stream of `waiter` wait for everything queued so
        /// far on the current stream of `device`.
        fn stream_wait_stream(waiter: i8, device: i8) -> Result<()>;

        // The stream sanitizer (src/diagnostics/sanitizer.rs); the shim calls these only
        // while `openreg_sanitizer_on` is set.
        /// Checks a launch named `name` on the current stream of `device`
        /// that accesses `count` buffers at `buffers`.
        unsafe fn sanitize_launch(
            device: i8,
            name: *const c_char,
            buffers: *const KernelBuffer,
            count: usize,
        ) -> Result<()>;
        /// The host has waited for everything launched so far on the
        /// current stream of `device`, as the user asked (a blocking copy,
        /// `.item()`).
        fn sanitizer_host_waited(device: i8) -> Result<()>;
        /// Guards pinned host memory of a non-blocking copy just launched on
        /// the current stream of `device` (Note [Pinned memory guard]).
        fn sanitizer_guard_pinned(
            device: i8,
            address: usize,
            bytes: usize,
            device_writes: bool,
            tensor: usize,
        ) -> Result<()>;

        // Generators (src/runtime/generator.rs). A `Generator` is a handle: the
        // handles of a device's default generator share its state.
        type Generator;
        fn default_generator(device: i8) -> Result<Box<Generator>>;
        fn new_generator(seed: u64) -> Box<Generator>;
        /// An independent generator with a copy of `g`'s state.
        fn fork_generator(g: &Generator) -> Box<Generator>;
        fn generator_seed(g: &Generator) -> u64;
        /// Reseeds and restarts the sequence (offset 0).
        fn set_generator_seed(g: &Generator, seed: u64);
        fn nondeterministic_seed() -> u64;
        fn generator_offset(g: &Generator) -> u64;
        fn set_generator_offset(g: &Generator, offset: u64) -> Result<()>;
        /// 16 bytes: seed, then offset, little-endian.
        fn generator_state(g: &Generator) -> Vec<u8>;
        fn set_generator_state(g: &Generator, state: &[u8]) -> Result<()>;
        /// Validates `fill` and reserves the draws of `numel` values.
        fn reserve_random(g: &Generator, fill: &RandomFill, numel: u64) -> Result<RandomSlice>;
        fn reserve_randperm(g: &Generator, n: u64) -> Result<RandomSlice>;
        /// Writes `numel` values of `fill` at `data`, split across the
        /// kernel pool (Note [Kernel pool]).
        unsafe fn random_fill(
            data: usize,
            numel: usize,
            fill: &RandomFill,
            slice: RandomSlice,
        ) -> Result<()>;
        /// Writes a random permutation of `0..n` as int64 at `data`.
        unsafe fn random_permutation(data: usize, n: usize, slice: RandomSlice);

        // Graph capture and replay (src/runtime/graph.rs), for at::GraphImplInterface.
        type Graph;
        fn new_graph(keep_graph: bool) -> Box<Graph>;
        /// Captures the current stream of the current device; `mode` is an
        /// `at::GraphCaptureMode` (0 default, 1 global, 2 thread_local, 3 relaxed).
        fn graph_capture_begin(g: &Graph, pool: PoolId, mode: i8) -> Result<()>;
        fn graph_capture_end(g: &Graph) -> Result<()>;
        fn graph_instantiate(g: &Graph) -> Result<()>;
        fn graph_replay(g: &Graph) -> Result<()>;
        fn graph_reset(g: &Graph) -> Result<()>;
        fn graph_pool(g: &Graph) -> PoolId;
        fn graph_enable_debug_mode(g: &Graph);
        /// The captured graph as Graphviz DOT (debug mode only).
        fn graph_debug_dot(g: &Graph) -> Result<String>;
        /// Whether the stream `(device, id)` is capturing a graph.
        fn is_stream_capturing(device: i8, id: i64) -> Result<bool>;
        /// Whether the current stream of `device` is capturing a graph.
        fn is_current_stream_capturing(device: i8) -> Result<bool>;

        // The profiler's device activity (src/runtime/profiler.rs).
        fn profiler_start();
        fn profiler_stop();
        fn profiler_take() -> Vec<ProfiledActivity>;
        fn profiler_active() -> bool;
        fn profiler_now_ns() -> i64;
        fn profiler_push_correlation(id: u64);
        fn profiler_pop_correlation();
        /// Records work that ran inline on the calling thread as an activity
        /// of the current stream of `device`.
        fn profiler_record_inline(name: &str, device: i8, start_ns: i64, end_ns: i64);
    }

    // C++ functions the Rust side calls.
    unsafe extern "C++" {
        include!("torch_openreg/cpp/shim.h");

        /// Forwards a warning to `TORCH_WARN` (a Python `UserWarning`). Never throws.
        fn emit_warning(message: &str);
        /// Registers guard, hooks and the backend name with PyTorch.
        fn register_backend() -> Result<()>;
        fn backend_registered() -> bool;

        /// A C++ closure that runs on a stream's worker (again on each
        /// replay, when a graph captured it).
        type Kernel;
        fn run_kernel(kernel: Pin<&mut Kernel>) -> Result<()>;
        /// `kernel`'s name: a string that lives for the process (Note
        /// [Task names] in src/runtime/stream.rs).
        fn kernel_name(kernel: &Kernel) -> *const c_char;
        /// What `kernel` is and touches, for a graph's debug dump.
        fn describe_kernel(kernel: &Kernel) -> String;

        /// A range of memory a kernel reads or writes; the same layout as
        /// `sanitizer::KernelBuffer`.
        type KernelBuffer;
        /// "float32[64, 256]" for the `c10::TensorImpl` at `tensor`.
        fn describe_tensor(tensor: usize) -> String;
    }
}

// SAFETY: a Kernel owns only reference-counted PyTorch tensors and plain
// values (atomic reference counts); it is run and destroyed by exactly one
// thread at a time: the stream worker it was handed to.
unsafe impl Send for bridge::Kernel {}

use crate::runtime::graph::{CaptureMode, Graph};
pub use bridge::{backend_registered, emit_warning, register_backend};
use bridge::{
    Allocation, DeviceStatsFfi, Kernel, LaunchMode, MemoryInfo, PoolId, ProfiledActivity,
    RandomElement, RandomFill, RandomKind, RandomSlice, StatArrayFfi, StatFfi,
};

// Note [Guard hot path]: a c10::DeviceGuard costs an exchange and a restore
// of the current device. The guard (cpp/device/guard.cpp) does both inline on the
// current-device slot, a C++ initial-exec thread-local (Note [Current device
// slot] in cpp/device/current_device.h), for any index below the device count; only
// an invalid index comes here: through the bridge's `exchange_device` for
// the full error, or through this plain C function from the `noexcept`
// uncheckedSetDevice (cxx's per-call unwind guard is not needed: it cannot
// panic). Declared in cpp/shim.h.

/// Restores a device; an invalid index is ignored with a one-time warning.
#[no_mangle]
pub extern "C" fn openreg_guard_unchecked_set_device(index: i8) {
    device::unchecked_set_device(index.into())
}

/// Whether device memory at `ptr` may be used (Note [Device memory
/// generations]): one atomic load unless a device was restarted while
/// tensors of it were alive. Outside cxx for the same reason as the guard's
/// functions: it runs for every device operand of every kernel.
#[no_mangle]
pub extern "C" fn openreg_memory_is_current(ptr: usize) -> bool {
    allocator::is_current(ptr)
}

fn check_device_memory(ptr: usize) -> Result<()> {
    allocator::check_current(ptr)
}

fn device_count() -> i8 {
    device::device_count() as i8
}

fn current_device() -> i8 {
    device::current_device()
}

fn set_device(index: i8) -> Result<()> {
    device::set_device(index.into())
}

fn exchange_device(index: i8) -> Result<i8> {
    device::exchange_device(index.into())
}

fn check_device(index: i8) -> Result<()> {
    device::check_index(index.into()).map(drop)
}

fn has_primary_context(index: i8) -> Result<bool> {
    device::has_primary_context(index.into())
}

fn init() -> Result<()> {
    device::init()
}

fn is_initialized() -> bool {
    device::is_initialized()
}

fn synchronize_device(index: i8) -> Result<()> {
    let what = "device synchronize (torch.openreg.synchronize)";
    crate::runtime::graph::check_host_sync(what, None)?;
    crate::diagnostics::sync_debug::check(what)?;
    device::synchronize_device(device::resolve(index.into()))
}

/// A host-blocking operation of the shim on the current stream of the
/// current device (Note [Capture modes], Note [Sync debug]).
fn check_host_sync(what: &str) -> Result<()> {
    crate::runtime::graph::check_host_sync(what, Some(stream::current(-1)?))?;
    crate::diagnostics::sync_debug::check(what)
}

/// Bit `n` set: `c10::ScalarType` code `n` is supported (see
/// `device::SUPPORTED_SCALAR_TYPES`).
fn device_supported_scalar_types(index: i8) -> Result<u64> {
    Ok(device::properties(device::resolve(index.into()))?.supported_scalar_types)
}

fn current_stream(device: i8) -> Result<i64> {
    let device = device::check_index(device::resolve(device.into()))?;
    Ok(stream::current_stream_id(device))
}

fn default_stream(device: i8) -> Result<i64> {
    device::check_index(device::resolve(device.into()))?;
    Ok(stream::DEFAULT_STREAM_ID)
}

fn pool_stream(device: i8, priority: i32) -> Result<i64> {
    Ok(device::context(device::resolve(device.into()))?
        .streams
        .from_pool(priority)
        .id())
}

fn exchange_stream(device: i8, id: i64) -> Result<i64> {
    let device = device::check_index(device::resolve(device.into()))?;
    stream::exchange_current_stream(device, id as StreamId)
}

fn check_stream(device: i8, id: i64) -> Result<()> {
    let device = device::check_index(device::resolve(device.into()))?;
    stream::check_stream_id(device, id)
}

fn stream_native_handle(device: i8, id: i64) -> Result<usize> {
    Ok(stream::lookup(device.into(), id)? as *const stream::StreamQueue as usize)
}

fn query_stream(device: i8, id: i64) -> Result<bool> {
    let stream = stream::lookup(device.into(), id)?;
    crate::runtime::graph::check_not_capturing(stream, "Stream.query()")?;
    stream.host_query()
}

fn synchronize_stream(device: i8, id: i64) -> Result<()> {
    let stream = stream::lookup(device.into(), id)?;
    let what = format!("Stream.synchronize() of {stream}");
    crate::runtime::graph::check_host_sync(&what, Some(stream))?;
    crate::diagnostics::sync_debug::check(&what)?;
    stream.host_synchronize()
}

/// `event` is 0 (created here, on its first record) or a handle from an
/// earlier `record_event`; a destroyed or garbage handle is an error
/// (Note [Event handles]).
fn record_event(
    event: &mut usize,
    event_device: i8,
    device: i8,
    id: i64,
    timing: bool,
) -> Result<()> {
    let stream = stream::lookup(device.into(), id)?;
    if *event == 0 {
        // PyTorch passes -1 for an event that has not taken a device yet: it
        // belongs to the device of the stream that first records it.
        let owner = if event_device == -1 {
            stream.device().into()
        } else {
            event_device.into()
        };
        *event = handle::into_raw(Event::new(owner, timing)?);
    }
    handle::get(*event)?.record(stream)
}

/// The stream may belong to another device than the event (Event::block).
fn block_event(event: usize, device: i8, id: i64) -> Result<()> {
    if event == 0 {
        return Ok(()); // never recorded: nothing to wait for
    }
    let stream = stream::lookup(device.into(), id)?;
    handle::get(event)?.block(stream)
}

fn query_event(event: usize) -> Result<bool> {
    if event == 0 {
        return Ok(true);
    }
    handle::get(event)?.query()
}

fn synchronize_event(event: usize) -> Result<()> {
    if event == 0 {
        return Ok(());
    }
    let event = handle::get(event)?;
    event.synchronize()
}

/// Called from the guard's `noexcept destroyEvent`: never fails; a handle
/// that is not live (destroyed twice, garbage) is ignored with a warning.
fn destroy_event(event: usize) {
    if event == 0 {
        return; // never recorded, so never created
    }
    if let Err(e) = handle::release(event) {
        crate::base::error::warn_once(&format!("destroyEvent ignored an invalid event: {e}"));
    }
}

fn event_elapsed_ms(start: usize, end: usize, device: i8) -> Result<f64> {
    device::check_index(device.into())?;
    let (start, end) = (handle::get(start)?, handle::get(end)?);
    Event::elapsed_ms(&start, &end)
}

fn device_malloc(device: i8, size: usize) -> Allocation {
    let failed = |error: crate::base::error::Error, out_of_memory| Allocation {
        ptr: 0,
        out_of_memory,
        error: error.message,
    };
    let result = stream::current(device.into()).and_then(|stream| {
        Ok(device::context(stream.device().into())?
            .allocator
            .malloc(size, stream))
    });
    match result {
        Ok(Ok(ptr)) => Allocation {
            ptr,
            out_of_memory: false,
            error: String::new(),
        },
        Ok(Err(e)) => failed(e.error, e.out_of_memory),
        Err(e) => failed(e, false),
    }
}

fn device_free(ptr: usize) -> Result<()> {
    allocator::free_anywhere(ptr)
}

fn device_of_pointer(ptr: usize) -> i8 {
    allocator::device_of(ptr).unwrap_or(-1)
}

fn record_stream(ptr: usize, device: i8, id: i64) -> Result<()> {
    let owner = allocator::device_of(ptr).ok_or_else(|| {
        crate::base::error::Error::invalid_value(format!(
            "record_stream: {ptr:#x} is not openreg device memory"
        ))
    })?;
    let stream = stream::lookup(device.into(), id)?;
    device::context(owner.into())?
        .allocator
        .record_stream(ptr, stream)
}

fn empty_cache() {
    device::existing_contexts().for_each(|ctx| ctx.allocator.empty_cache());
}

fn stat(s: allocator::Stat) -> StatFfi {
    StatFfi {
        current: s.current,
        peak: s.peak,
        allocated: s.allocated,
        freed: s.freed,
    }
}

fn stat_array(a: allocator::StatArray) -> StatArrayFfi {
    StatArrayFfi {
        pools: a.0.map(stat),
    }
}

fn device_stats(device: i8) -> Result<DeviceStatsFfi> {
    let s = device::context(device::resolve(device.into()))?
        .allocator
        .stats();
    Ok(DeviceStatsFfi {
        allocation: stat_array(s.allocation),
        segment: stat_array(s.segment),
        active: stat_array(s.active),
        inactive_split: stat_array(s.inactive_split),
        allocated_bytes: stat_array(s.allocated_bytes),
        reserved_bytes: stat_array(s.reserved_bytes),
        active_bytes: stat_array(s.active_bytes),
        inactive_split_bytes: stat_array(s.inactive_split_bytes),
        requested_bytes: stat_array(s.requested_bytes),
        num_alloc_retries: s.num_alloc_retries,
        num_ooms: s.num_ooms,
        num_sync_all_streams: s.num_sync_all_streams,
        num_device_alloc: s.num_device_alloc,
        num_device_free: s.num_device_free,
        oversize_allocations: stat(s.oversize_allocations),
        oversize_segments: stat(s.oversize_segments),
        max_split_size: s.max_split_size,
    })
}

fn reset_peak_stats(device: i8) -> Result<()> {
    device::context(device::resolve(device.into()))?
        .allocator
        .reset_peak_stats();
    Ok(())
}

fn reset_accumulated_stats(device: i8) -> Result<()> {
    device::context(device::resolve(device.into()))?
        .allocator
        .reset_accumulated_stats();
    Ok(())
}

fn memory_info(device: i8) -> Result<MemoryInfo> {
    let (free, total) = device::context(device::resolve(device.into()))?
        .allocator
        .memory_info();
    Ok(MemoryInfo { free, total })
}

fn set_memory_fraction(device: i8, fraction: f64) -> Result<()> {
    device::context(device::resolve(device.into()))?
        .allocator
        .set_memory_fraction(fraction)
}

fn any_device_initialized() -> bool {
    device::existing_contexts().next().is_some()
}

fn split_elements() -> usize {
    crate::base::options::get().split_elements
}

fn record_kernel_dtype(op: &str, dtype: &str, computed: &str) {
    crate::diagnostics::dtype_record::record(op, dtype, computed);
}

fn dtype_policy() -> bridge::DtypePolicy {
    match crate::base::options::DtypePolicy::at_load() {
        crate::base::options::DtypePolicy::Cuda => bridge::DtypePolicy::Cuda,
        crate::base::options::DtypePolicy::Cpu => bridge::DtypePolicy::Cpu,
        crate::base::options::DtypePolicy::Record => bridge::DtypePolicy::Record,
    }
}

fn host_malloc(size: usize) -> Result<usize> {
    pinned::malloc(size)
}

fn host_free(ptr: usize) {
    pinned::free(ptr)
}

fn is_pinned(ptr: usize) -> bool {
    pinned::contains(ptr)
}

fn begin_device_access() {
    device_memory::begin_access()
}

fn end_device_access() {
    device_memory::end_access()
}

fn begin_inline_kernel(device: i8) -> Result<bool> {
    Ok(stream::current(device.into())?.try_begin_inline(stream::TaskName::INLINE))
}

/// Ends what `begin_inline_kernel` began; the stream is the one reserved then
/// (the current stream cannot change in between: the same thread runs both).
fn end_inline_kernel(device: i8) {
    if let Ok(stream) = stream::current(device.into()) {
        stream.end_inline();
    }
}

fn report_stream_failure(device: i8) -> Result<()> {
    stream::current(device.into())?.take_failure()
}

fn stream_has_parked_failure(device: i8) -> bool {
    stream::current(device.into()).is_ok_and(|stream| stream.has_parked_failure())
}

fn launch_kernel(device: i8, mut kernel: cxx::UniquePtr<Kernel>, mode: LaunchMode) -> Result<()> {
    let stream = stream::current(device.into())?;
    let kernel_ref = kernel.as_ref().expect("a launched kernel is never null");
    // SAFETY: a kernel's name lives for the process (cpp/shim.h).
    let name = unsafe { stream::TaskName::kernel_from_ptr(bridge::kernel_name(kernel_ref)) };
    if mode == LaunchMode::Wait {
        // The caller needs the result on the host now (Note [Capture modes]).
        crate::runtime::graph::check_not_capturing(stream, "a kernel the host waits for")?;
    }
    // Only a capturing stream asks, for its debug dump.
    let label = if stream.capture_pool() != 0 {
        bridge::describe_kernel(kernel_ref)
    } else {
        String::new()
    };
    let profiled_name = if crate::runtime::profiler::is_active() {
        name.text().into_owned()
    } else {
        String::new()
    };
    let work: crate::runtime::graph::Work = Box::new(move || {
        let kernel = kernel.as_mut().expect("a launched kernel is never null");
        bridge::run_kernel(kernel)
            .map_err(|e| crate::base::error::Error::invalid_value(e.what().to_string()))
    });
    let task = stream::Task::Run(crate::runtime::profiler::timed(profiled_name, stream, work));
    match mode {
        LaunchMode::Wait => {
            let seq = stream.submit_named(task, name, String::new)?;
            stream.wait_for(seq, true)
        }
        LaunchMode::InlineIfIdle if label.is_empty() => stream.run_inline_or_submit(task, name),
        _ => stream.submit_named(task, name, move || label).map(drop),
    }
}

fn stream_wait_stream(waiter: i8, device: i8) -> Result<()> {
    let (waiter, source) = (
        stream::current(waiter.into())?,
        stream::current(device.into())?,
    );
    crate::diagnostics::sanitizer::stream_waits_stream(waiter, source);
    let seq = source.marker();
    if std::ptr::eq(waiter, source) || source.has_completed(seq) {
        return Ok(());
    }
    waiter
        .submit(stream::Task::WaitFor {
            stream: source,
            seq,
        })
        .map(drop)
}

/// # Safety
/// `buffers` points to `count` `KernelBuffer`s (cpp/shim.h), laid out as
/// `sanitizer::KernelBuffer` (the shim asserts it).
unsafe fn sanitize_launch(
    device: i8,
    name: *const c_char,
    buffers: *const bridge::KernelBuffer,
    count: usize,
) -> Result<()> {
    let stream = stream::current(device.into())?;
    let buffers = match count {
        0 => &[][..],
        // SAFETY: per this function's contract.
        _ => unsafe {
            std::slice::from_raw_parts(buffers.cast::<crate::diagnostics::sanitizer::KernelBuffer>(), count)
        },
    };
    // SAFETY: a kernel's name lives for the process (cpp/shim.h).
    let name = unsafe { stream::TaskName::kernel_from_ptr(name) };
    crate::diagnostics::sanitizer::check_launch(stream, name, buffers, &|tensor| {
        bridge::describe_tensor(tensor)
    })
}

fn sanitizer_host_waited(device: i8) -> Result<()> {
    crate::diagnostics::sanitizer::host_waited_for_stream(stream::current(device.into())?)
}

fn sanitizer_guard_pinned(
    device: i8,
    address: usize,
    bytes: usize,
    device_writes: bool,
    tensor: usize,
) -> Result<()> {
    let stream = stream::current(device.into())?;
    crate::diagnostics::sanitizer::guard_pinned_copy(
        stream,
        address,
        bytes,
        device_writes,
        &bridge::describe_tensor(tensor),
    );
    Ok(())
}

fn default_generator(device: i8) -> Result<Box<Generator>> {
    Ok(Box::new(Generator::default_for(device::resolve(
        device.into(),
    ))?))
}

fn new_generator(seed: u64) -> Box<Generator> {
    Box::new(Generator::new(seed))
}

fn fork_generator(g: &Generator) -> Box<Generator> {
    Box::new(g.fork())
}

fn generator_seed(g: &Generator) -> u64 {
    g.seed()
}

fn set_generator_seed(g: &Generator, seed: u64) {
    g.set_seed(seed)
}

fn nondeterministic_seed() -> u64 {
    generator::nondeterministic_seed()
}

fn generator_offset(g: &Generator) -> u64 {
    g.offset()
}

fn set_generator_offset(g: &Generator, offset: u64) -> Result<()> {
    g.set_offset(offset)
}

fn generator_state(g: &Generator) -> Vec<u8> {
    g.state_bytes().to_vec()
}

fn set_generator_state(g: &Generator, state: &[u8]) -> Result<()> {
    g.set_state_bytes(state)
}

fn distribution(fill: &RandomFill) -> Result<(Distribution, Element)> {
    let (a, b) = (fill.a, fill.b);
    let dist = match fill.kind {
        RandomKind::Uniform => Distribution::Uniform { from: a, to: b },
        RandomKind::Normal => Distribution::Normal { mean: a, std: b },
        RandomKind::Bernoulli => Distribution::Bernoulli { p: a },
        RandomKind::Exponential => Distribution::Exponential { lambda: a },
        RandomKind::Geometric => Distribution::Geometric { p: a },
        RandomKind::LogNormal => Distribution::LogNormal { mean: a, std: b },
        RandomKind::Cauchy => Distribution::Cauchy {
            median: a,
            sigma: b,
        },
        RandomKind::Integers => Distribution::Integers {
            from: fill.from,
            range: fill.range,
        },
        _ => {
            return Err(crate::base::error::Error::invalid_value(
                "unknown random distribution",
            ))
        }
    };
    let element = match fill.element {
        RandomElement::F32 => Element::F32,
        RandomElement::F64 => Element::F64,
        RandomElement::I64 => Element::I64,
        _ => {
            return Err(crate::base::error::Error::invalid_value(
                "unknown random element type",
            ))
        }
    };
    dist.validate(element)?;
    Ok((dist, element))
}

fn reserve_random(g: &Generator, fill: &RandomFill, numel: u64) -> Result<RandomSlice> {
    let (dist, element) = distribution(fill)?;
    reserve(g, dist.draws(element, numel))
}

fn reserve_randperm(g: &Generator, n: u64) -> Result<RandomSlice> {
    reserve(g, generator::randperm_draws(n))
}

/// `draws` draws of `g` for a kernel launched on the current stream of
/// the current device: from the generator now, or from a graph's replay
/// base if that stream is capturing.
fn reserve(g: &Generator, draws: u64) -> Result<RandomSlice> {
    if let Some((relative, cell)) = crate::runtime::graph::reserve_random_in_capture(g, draws)? {
        return Ok(RandomSlice {
            seed: 0,
            base: relative,
            replay: Arc::as_ptr(&cell) as usize,
        });
    }
    let slice = g.reserve(draws);
    Ok(RandomSlice {
        seed: slice.seed,
        base: slice.base,
        replay: 0,
    })
}

/// Where a kernel with `slice` draws from now.
fn philox_slice(slice: &RandomSlice) -> generator::PhiloxSlice {
    if slice.replay == 0 {
        return generator::PhiloxSlice {
            seed: slice.seed,
            base: slice.base,
        };
    }
    // SAFETY: `replay` is the address of a cell of the graph whose node
    // runs this kernel; the graph owns the cell and outlives its nodes' runs.
    let cell = unsafe { &*(slice.replay as *const crate::runtime::graph::RandomCell) };
    cell.resolve(slice.base)
}

/// # Safety
/// `data` points to `numel` writable, suitably aligned elements of
/// `fill.element` that nothing else accesses during the call.
unsafe fn random_fill(
    data: usize,
    numel: usize,
    fill: &RandomFill,
    slice: RandomSlice,
) -> Result<()> {
    let (dist, element) = distribution(fill)?;
    if numel == 0 {
        return Ok(()); // `data` may be null
    }
    let slice = philox_slice(&slice);
    // SAFETY (all three): per this function's contract.
    match element {
        Element::F32 => generator::fill(
            unsafe { std::slice::from_raw_parts_mut(data as *mut f32, numel) },
            dist,
            slice,
        ),
        Element::F64 => generator::fill(
            unsafe { std::slice::from_raw_parts_mut(data as *mut f64, numel) },
            dist,
            slice,
        ),
        Element::I64 => generator::fill(
            unsafe { std::slice::from_raw_parts_mut(data as *mut i64, numel) },
            dist,
            slice,
        ),
    }
    Ok(())
}

/// # Safety
/// `data` points to `n` writable int64 elements nothing else accesses.
unsafe fn random_permutation(data: usize, n: usize, slice: RandomSlice) {
    if n == 0 {
        return; // `data` may be null
    }
    // SAFETY: per this function's contract.
    let out = unsafe { std::slice::from_raw_parts_mut(data as *mut i64, n) };
    generator::randperm(out, philox_slice(&slice));
}

fn new_graph(keep_graph: bool) -> Box<Graph> {
    Box::new(Graph::new(keep_graph))
}

fn graph_capture_begin(g: &Graph, pool: PoolId, mode: i8) -> Result<()> {
    let mode = match mode {
        // CUDA's default for torch.cuda.graph is "global".
        0 | 1 => CaptureMode::Global,
        2 => CaptureMode::ThreadLocal,
        3 => CaptureMode::Relaxed,
        _ => {
            return Err(crate::base::error::Error::invalid_value(format!(
                "capture_begin: unknown capture mode {mode}"
            )))
        }
    };
    g.capture_begin((pool.first, pool.second), mode)
}

fn graph_capture_end(g: &Graph) -> Result<()> {
    g.capture_end()
}

fn graph_instantiate(g: &Graph) -> Result<()> {
    g.instantiate()
}

fn graph_replay(g: &Graph) -> Result<()> {
    g.replay()
}

fn graph_reset(g: &Graph) -> Result<()> {
    g.reset()
}

fn graph_pool(g: &Graph) -> PoolId {
    let (first, second) = g.pool();
    PoolId { first, second }
}

fn graph_enable_debug_mode(g: &Graph) {
    g.enable_debug_mode()
}

fn graph_debug_dot(g: &Graph) -> Result<String> {
    g.debug_dot()
}

fn is_stream_capturing(device: i8, id: i64) -> Result<bool> {
    Ok(crate::runtime::graph::is_capturing(stream::lookup(
        device.into(),
        id,
    )?))
}

fn is_current_stream_capturing(device: i8) -> Result<bool> {
    Ok(crate::runtime::graph::is_capturing(stream::current(device.into())?))
}

fn profiler_start() {
    crate::runtime::profiler::start()
}

fn profiler_stop() {
    crate::runtime::profiler::stop()
}

fn profiler_take() -> Vec<ProfiledActivity> {
    crate::runtime::profiler::take()
        .into_iter()
        .map(|a| ProfiledActivity {
            name: a.name,
            device: a.device,
            stream: a.stream,
            start_ns: a.start_ns,
            end_ns: a.end_ns,
            correlation: a.correlation,
        })
        .collect()
}

fn profiler_active() -> bool {
    crate::runtime::profiler::is_active()
}

fn profiler_now_ns() -> i64 {
    crate::runtime::profiler::now_ns()
}

fn profiler_push_correlation(id: u64) {
    crate::runtime::profiler::push_correlation(id)
}

fn profiler_pop_correlation() {
    crate::runtime::profiler::pop_correlation()
}

fn profiler_record_inline(name: &str, device: i8, start_ns: i64, end_ns: i64) {
    let index = device::resolve(device.into());
    let stream = device::check_index(index).map_or(0, stream::current_stream_id);
    crate::runtime::profiler::record(crate::runtime::profiler::Activity {
        name: name.to_string(),
        device: index as i8,
        stream,
        start_ns,
        end_ns: end_ns.max(start_ns),
        correlation: crate::runtime::profiler::current_correlation(),
    });
}
