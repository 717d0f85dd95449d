//! The runtime's one logging facility: every message the runtime has for a
//! user goes through here, filtered by `OPENREG_LOG`.
//!
//! Warnings and errors go to the warning sink (`WARNING_SINK`): the bridge
//! installs PyTorch's warning handler there when the library loads
//! (`TORCH_WARN`: a Python `UserWarning` under Python, stderr in a libtorch
//! program); without a sink they go to stderr. Info and debug lines, which
//! exist for people diagnosing the runtime itself, go to stderr prefixed
//! with `openreg [level]`.

use std::collections::HashSet;

use parking_lot::Mutex;

use crate::base::hook::Hook;
use crate::base::options;

/// Message levels, most severe first; `OPENREG_LOG` names the least severe
/// one shown (default `warn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error = 0,
    Warn = 1,
    Info = 2,
    Debug = 3,
}

impl Level {
    pub const NAMES: [(&'static str, Level); 4] = [
        ("error", Level::Error),
        ("warn", Level::Warn),
        ("info", Level::Info),
        ("debug", Level::Debug),
    ];

    pub fn name(self) -> &'static str {
        Level::NAMES[self as usize].0
    }
}

/// Where warnings and errors go (Note [Hooks]): told the whole message,
/// `openreg: ` prefix included. Installed by the bridge to C++.
pub static WARNING_SINK: Hook<fn(&str)> = Hook::new();

/// Whether messages of `level` are shown. While the options are being read
/// (their own warnings), the default level applies.
pub fn enabled(level: Level) -> bool {
    level <= options::get_if_read().map_or(options::DEFAULT_LOG_LEVEL, |o| o.log_level)
}

/// Shows `message` if `level` is enabled.
pub fn log(level: Level, message: &str) {
    if !enabled(level) {
        return;
    }
    match level {
        Level::Error | Level::Warn => {
            let message = format!("openreg: {message}");
            match WARNING_SINK.get() {
                Some(sink) => sink(&message),
                None => eprintln!("{message}"),
            }
        }
        Level::Info | Level::Debug => eprintln!("openreg [{}]: {message}", level.name()),
    }
}

pub fn warn(message: &str) {
    log(Level::Warn, message)
}

pub fn info(message: &str) {
    log(Level::Info, message)
}

static SHOWN_ONCE: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// Shows `message` once per process (later identical messages are dropped).
pub fn once(level: Level, message: &str) {
    if enabled(level)
        && SHOWN_ONCE
            .lock()
            .get_or_insert_with(HashSet::new)
            .insert(message.to_string())
    {
        log(level, message);
    }
}
