//! What watches the runtime on the user's behalf (Note [Layers] in
//! src/lib.rs): the stream sanitizer and its pinned memory guard, sync
//! debug, injected faults, dtype recording. Each attaches at the runtime's
//! hook points (`install_hooks`), so the runtime never names it. May use:
//! `base`, `memory`, `runtime`.

pub mod dtype_record;
pub mod fault;
pub(crate) mod pinned_guard;
pub mod sanitizer;
pub mod sync_debug;

/// Registers the options the diagnostics own (Note [Registered options]
/// in src/base/options.rs); called once, at load, before any option is read.
pub(crate) fn register_options() {
    sync_debug::register_options();
    sanitizer::register_options();
    fault::register_options();
}

/// Attaches every diagnostic at the hook points of the layers below
/// (Note [Hooks] in src/base/hook.rs); called once, at load.
pub(crate) fn install_hooks() {
    fault::install_hooks();
    sanitizer::install_hooks();
    pinned_guard::install_hooks();
    sync_debug::install_hooks();
}
