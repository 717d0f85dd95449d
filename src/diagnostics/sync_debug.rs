//! Sync-debug mode (`torch.openreg.set_sync_debug_mode`): host-blocking
//! operations warn or fail, so a user finds the `.item()` or blocking copy
//! that stalls the pipeline.
//!
//! Note [Sync debug]: an operation is host-blocking by what it is, not by
//! whether the stream happened to be busy: `.item()` on an idle stream
//! blocks nothing today but would on a loaded device, so it is reported
//! every time (as CUDA does). The host-blocking operations report
//! themselves here before they wait: synchronizing a device, stream or event
//! (`ffi.rs`, `capi.rs`), and the shim's blocking kernels (`.item()`, copies
//! between device and pageable host memory). One exception: an op whose
//! output shape depends on data (`nonzero`) is known to be one only once it
//! has to wait for queued work (the fallback runs any op at once on an idle
//! stream, before it asks whether its shape could be planned), so it is
//! reported when the stream is busy. The runtime's own waits (the allocator
//! waiting for a stream to pass a freed block, the exit drain) are not the
//! user's and do not report.

use std::sync::atomic::{AtomicU8, Ordering};

use once_cell::sync::Lazy;

use crate::base::error::{Error, Result};
use crate::base::options;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncDebugMode {
    /// Host-blocking operations are silent.
    Default = 0,
    /// Each one warns, naming the operation.
    Warn = 1,
    /// Each one fails with an error naming the operation (and does not wait).
    Error = 2,
}

impl SyncDebugMode {
    pub const NAMES: [(&'static str, SyncDebugMode); 3] = [
        ("default", SyncDebugMode::Default),
        ("warn", SyncDebugMode::Warn),
        ("error", SyncDebugMode::Error),
    ];

    pub fn name(self) -> &'static str {
        SyncDebugMode::NAMES[self as usize].0
    }

    fn from_code(code: u8) -> SyncDebugMode {
        SyncDebugMode::NAMES
            .get(code as usize)
            .map_or(SyncDebugMode::Default, |(_, mode)| *mode)
    }
}

/// The mode in force; starts as `OPENREG_SYNC_DEBUG`.
static MODE: Lazy<AtomicU8> = Lazy::new(|| AtomicU8::new(options::get().sync_debug as u8));

pub fn mode() -> SyncDebugMode {
    SyncDebugMode::from_code(MODE.load(Ordering::Relaxed))
}

pub fn set_mode(mode: SyncDebugMode) {
    MODE.store(mode as u8, Ordering::Relaxed);
}

/// Called by a host-blocking operation before it waits (Note [Sync debug]);
/// `what` names it for the user. In "error" mode the operation must not
/// proceed.
pub fn check(what: &str) -> Result<()> {
    match mode() {
        SyncDebugMode::Default => Ok(()),
        SyncDebugMode::Warn => {
            crate::base::log::warn(&format!("sync debug: {what} is a host-blocking operation (it waits for the device)"));
            Ok(())
        }
        SyncDebugMode::Error => Err(Error::invalid_value(format!(
            "openreg sync debug mode is \"error\": {what} is a host-blocking operation (it waits for the device); \
             call torch.openreg.set_sync_debug_mode(\"default\") to allow it"
        ))),
    }
}

/// Installs `check` where the runtime blocks the host for the user (an
/// event's synchronize: Note [Hooks] in hook.rs); the bridge's own
/// host-blocking calls call `check` directly.
pub(crate) fn install_hooks() {
    crate::runtime::hooks::BEFORE_HOST_WAIT.install(check);
}
