//! torch_openreg: a simulated accelerator for PyTorch's PrivateUse1 backend.
//!
//! The runtime (devices, streams, events, generators, lifecycle, options) lives in these
//! modules and knows nothing of PyTorch. `ffi` is the one bridge the C++ shim
//! in `cpp/` calls through; `capi` is the plain C ABI of `include/openreg.h`.
//!
//! Note [Layers]: the modules form layers, each using only those below it
//! (its `crate::` paths name no higher layer), from the bottom: the ground
//! floor (errors, options, logging, hooks), memory (device memory, pinned
//! host memory, memory history), the runtime core (devices, streams and
//! the one door, events, the caching allocator, the kernel pool,
//! lifecycle, graphs, generators), the diagnostics (the stream sanitizer
//! and pinned guard, sync debug, injected faults, device stop, dtype
//! recording), and the bridge to C++ and C (`ffi`, `capi`). Where a lower
//! layer must let a higher one act, it owns a hook (Note [Hooks] in
//! hook.rs); `wire` below installs them all.

pub mod allocator;
pub mod capi;
pub mod device;
pub mod device_stop;
pub mod dtype_record;
pub mod error;
pub mod event;
pub mod fault;
mod ffi;
pub mod generator;
pub mod graph;
pub mod hook;
pub mod kernel_pool;
pub mod lifecycle;
pub mod log;
pub mod memory;
pub mod memory_history;
pub mod op_timeout;
pub mod options;
pub mod pinned;
mod pinned_guard;
pub mod profiler;
pub mod runtime_hooks;
pub mod sanitizer;
pub mod stat;
pub mod stream;
pub mod sync_debug;
pub mod utilization;

/// Registers the backend with PyTorch when the shared library is loaded, by
/// whatever way in (Python import, `ctypes`/`torch.ops.load_library`, a
/// libtorch program linking it). Calling the C++ registration from Rust also
/// keeps its object file in the link: a static registrar that nothing
/// references would be dropped by the linker, and nothing would register.
#[used]
#[link_section = ".init_array"]
static REGISTER_ON_LOAD: extern "C" fn() = register_on_load;

extern "C" fn register_on_load() {
    wire();
    // Nothing may unwind out of a load-time constructor.
    if let Err(e) = ffi::register_backend() {
        eprintln!("torch_openreg: registering the openreg backend with PyTorch failed: {e}");
    }
}

/// Installs every hook (Note [Hooks] in hook.rs): what the higher layers
/// do at the lower layers' hook points. Runs once, at load, before anything
/// can use a device.
fn wire() {
    log::WARNING_SINK.install(|message| ffi::emit_warning(message));
    fault::install_hooks();
    sanitizer::install_hooks();
    pinned_guard::install_hooks();
    sync_debug::install_hooks();
}

/// Whether the load-time registration ran and succeeded (checked by tests).
pub fn backend_registered() -> bool {
    ffi::backend_registered()
}
