//! torch_openreg: a simulated accelerator for PyTorch's PrivateUse1 backend.
//!
//! This crate is the runtime: devices, streams, events, memory, graphs,
//! generators, lifecycle and options, knowing nothing of PyTorch. The C++
//! shim in `cpp/` subclasses PyTorch's interfaces and calls in through the
//! one cxx bridge (`bridge::ffi`); C programs use `bridge::capi`
//! (`include/openreg.h`).
//!
//! Note [Layers]: the modules sit in five folders, each using only the
//! folders below it (its `crate::` paths name no higher folder;
//! tests/layering.rs holds the rule), from the bottom:
//!  - `base`: errors, options, logging, and the hooks higher layers fill;
//!  - `memory`: device memory, pinned host memory, memory statistics and
//!    the allocation history;
//!  - `runtime`: the devices and their streams (the one door every piece of
//!    device work passes), events, the caching allocator, the kernel pool,
//!    graphs, generators, lifecycle, and the device controls PyTorch asks
//!    of a device (stop, op timeout, utilization, profiler activity);
//!  - `diagnostics`: what watches the runtime for the user: the stream
//!    sanitizer and its pinned memory guard, sync debug, injected faults,
//!    dtype recording;
//!  - `bridge`: the only code that talks to C++ or C.
//! Where a lower layer must let a higher one act, it owns a hook (Note
//! [Hooks] in src/base/hook.rs) and `wire` below installs them all.

pub mod base;
pub mod bridge;
pub mod diagnostics;
pub mod memory;
pub mod runtime;

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
    if let Err(e) = bridge::ffi::register_backend() {
        eprintln!("torch_openreg: registering the openreg backend with PyTorch failed: {e}");
    }
}

/// Installs every hook (Note [Hooks] in src/base/hook.rs): what the
/// higher layers do at the lower layers' hook points, and registers the
/// options they own (Note [Registered options] in src/base/options.rs).
/// Runs once, at load, before anything can use a device or read an option.
fn wire() {
    base::log::WARNING_SINK.install(|message| bridge::ffi::emit_warning(message));
    diagnostics::register_options();
    diagnostics::install_hooks();
}

/// Whether the load-time registration ran and succeeded (checked by tests).
pub fn backend_registered() -> bool {
    bridge::ffi::backend_registered()
}
