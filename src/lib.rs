//! torch_openreg: a simulated accelerator for PyTorch's PrivateUse1 backend.
//!
//! The runtime (devices, streams, events, generators, lifecycle, options) lives in these
//! modules and knows nothing of PyTorch. `ffi` is the one bridge the C++ shim
//! in `cpp/` calls through; `capi` is the plain C ABI of `include/openreg.h`.

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
pub mod sanitizer;
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
    // Nothing may unwind out of a load-time constructor.
    if let Err(e) = ffi::register_backend() {
        eprintln!("torch_openreg: registering the openreg backend with PyTorch failed: {e}");
    }
}

/// Whether the load-time registration ran and succeeded (checked by tests).
pub fn backend_registered() -> bool {
    ffi::backend_registered()
}
