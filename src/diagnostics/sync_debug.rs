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

/// `OPENREG_SYNC_DEBUG`: the mode sync debug starts in (Note [Registered
/// options] in src/base/options.rs).
static OPTION: options::OptionSpec = options::OptionSpec {
    name: "OPENREG_SYNC_DEBUG",
    after: "OPENREG_EXIT_DRAIN_MS",
    accepted: "one of default, warn, error",
    help: "initial set_sync_debug_mode: default, warn or error on host-blocking operations",
    valid: |text| parse_mode(text).is_some(),
    show: |text| text.and_then(parse_mode).unwrap_or(SyncDebugMode::Default).name().to_string(),
};

/// Registers `OPENREG_SYNC_DEBUG` (from `diagnostics::register_options`, at load).
pub(crate) fn register_options() {
    options::register(&OPTION);
}

/// `OPENREG_SYNC_DEBUG`'s text: a mode's name, case-insensitive.
fn parse_mode(text: &str) -> Option<SyncDebugMode> {
    options::parse_choice(text, &SyncDebugMode::NAMES)
}

/// The mode `options` start sync debug in: `OPENREG_SYNC_DEBUG`, else
/// `Default`.
fn initial_mode(options: &options::Options) -> SyncDebugMode {
    options
        .registered(OPTION.name)
        .and_then(parse_mode)
        .unwrap_or(SyncDebugMode::Default)
}

/// The mode in force; starts as `OPENREG_SYNC_DEBUG`.
static MODE: Lazy<AtomicU8> = Lazy::new(|| AtomicU8::new(initial_mode(options::get()) as u8));

#[cfg(test)]
mod option_tests {
    use super::*;
    use crate::base::options::Options;

    /// `OPENREG_SYNC_DEBUG` as these options start sync debug.
    fn initial(pairs: &[(&str, &str)]) -> SyncDebugMode {
        initial_mode(&Options::from_pairs(pairs))
    }

    #[test]
    fn the_option_sets_the_initial_mode() {
        assert_eq!(initial(&[]), SyncDebugMode::Default);
        assert_eq!(initial(&[("OPENREG_SYNC_DEBUG", "error")]), SyncDebugMode::Error);
        assert_eq!(initial(&[("OPENREG_SYNC_DEBUG", " warn ")]), SyncDebugMode::Warn);
        assert_eq!(initial(&[("OPENREG_SYNC_DEBUG", "")]), SyncDebugMode::Default);
        let bad = Options::from_pairs(&[("OPENREG_SYNC_DEBUG", "bogus"), ("OPENREG_LOG", "loud")]);
        assert_eq!(initial_mode(&bad), SyncDebugMode::Default);
        assert_eq!(bad.source("OPENREG_SYNC_DEBUG"), "invalid");
    }

    #[test]
    fn the_accepted_choices_are_the_names_the_parser_takes() {
        let o = Options::from_pairs(&[("OPENREG_SYNC_DEBUG", "?")]);
        assert_eq!(
            o.invalid[0].accepted,
            format!("one of {}", SyncDebugMode::NAMES.map(|(n, _)| n).join(", "))
        );
    }

    #[test]
    fn entries_show_the_mode() {
        let value = |o: &Options| {
            o.entries()
                .into_iter()
                .find(|e| e.name == "OPENREG_SYNC_DEBUG")
                .unwrap()
                .value
        };
        assert_eq!(value(&Options::from_pairs(&[])), "default");
        assert_eq!(value(&Options::from_pairs(&[("OPENREG_SYNC_DEBUG", " ERROR ")])), "error");
    }
}

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
