//! Every runtime knob, read once from `OPENREG_*` environment variables.
//!
//! This is the only place that reads the environment. Values are parsed on
//! first use and then frozen for the life of the process; an invalid value is
//! never fatal: it falls back as documented and warns once.

use std::cell::RefCell;

use once_cell::sync::Lazy;

use crate::error::warn_once;
use crate::log::Level;
use crate::sync_debug::SyncDebugMode;

/// The most devices the runtime will simulate. Bounded so that per-thread
/// state can be fixed-size arrays (see `device.rs`).
pub const MAX_DEVICES: usize = 16;

/// Devices simulated when `OPENREG_DEVICE_COUNT` is unset.
pub const DEFAULT_DEVICE_COUNT: usize = 2;

/// The frozen option set. See the README's "Options" table.
#[derive(Debug, Clone)]
pub struct Options {
    /// `OPENREG_DEVICE_COUNT`: number of devices, 0..=MAX_DEVICES. Invalid → 0.
    pub device_count: usize,
    /// `OPENREG_LAUNCH_BLOCKING=1`: every launch waits for its stream.
    pub launch_blocking: bool,
    /// `OPENREG_WORKER_IDLE_MS`: how long an idle stream worker lingers before
    /// its thread exits (the next launch starts a new one).
    pub worker_idle_ms: u64,
    /// `OPENREG_DEVICE_MEMORY`: each device's capacity in bytes.
    pub device_memory: usize,
    /// `OPENREG_MEMORY_PROTECT=1`: device pages are inaccessible to host code
    /// outside device operations. See Note [Memory protection].
    pub memory_protect: bool,
    /// `OPENREG_RANDOM_THREADS`: threads a large random fill uses; 0 means
    /// the available cores. The values never depend on it (Note [Philox
    /// draw layout]); it exists to check exactly that.
    pub random_threads: usize,
    /// `OPENREG_AUTOGRAD_ON_CALLER` (default 1): under Python, backward of
    /// openreg graphs runs on the thread that called it, as for CPU tensors,
    /// instead of autograd's device thread (a hand-off per op). Read by the
    /// Python package at import.
    pub autograd_on_caller: bool,
    /// `OPENREG_KERNEL_THREADS` (default 1): the OpenMP team size of a device
    /// kernel, on every thread. Above 1, kernels on stream workers open teams
    /// of their own, which slows the process's own CPU work (Note [Kernel
    /// threads] in cpp/device_memory.h).
    pub kernel_threads: usize,
    /// `OPENREG_LOG`: the least severe message level shown (`crate::log`).
    pub log_level: Level,
    /// `OPENREG_EXIT_DRAIN_MS`: how long the host's exit waits for queued
    /// work before abandoning it (Note [Bounded exit drain] in lifecycle.rs).
    pub exit_drain_ms: u64,
    /// `OPENREG_SYNC_DEBUG`: the initial sync-debug mode (`crate::sync_debug`).
    pub sync_debug: SyncDebugMode,
    /// The options whose variable was set, in the order read (`entries`
    /// reports each option's source from it).
    pub from_environment: Vec<&'static str>,
}

/// Messages shown when `OPENREG_LOG` is unset.
pub const DEFAULT_LOG_LEVEL: Level = Level::Warn;

/// How long exit waits for queued work when `OPENREG_EXIT_DRAIN_MS` is unset.
pub const DEFAULT_EXIT_DRAIN_MS: u64 = 500;

/// Each device's capacity when `OPENREG_DEVICE_MEMORY` is unset.
pub const DEFAULT_DEVICE_MEMORY: usize = 4 << 30;

/// One option's name, value and meaning, as shown to Python users.
pub struct OptionEntry {
    pub name: &'static str,
    pub value: String,
    pub help: &'static str,
}

static OPTIONS: Lazy<Options> = Lazy::new(|| Options::from_lookup(|k| std::env::var(k).ok()));

/// The process-wide options.
#[inline]
pub fn get() -> &'static Options {
    &OPTIONS
}

/// The options, unless they are still being read (their parsing warns
/// through `crate::log`, which reads the log level from them).
pub fn get_if_read() -> Option<&'static Options> {
    Lazy::get(&OPTIONS)
}

impl Options {
    /// Parses options from any key lookup; `get()` uses the environment.
    /// Separate so tests can parse values without touching the process env.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Options {
        let set = RefCell::new(Vec::new());
        let lookup = |name: &'static str| {
            let value = lookup(name);
            if value.is_some() {
                set.borrow_mut().push(name);
            }
            value
        };
        let mut options = Options {
            device_count: parse_device_count(lookup("OPENREG_DEVICE_COUNT")),
            launch_blocking: parse_flag("OPENREG_LAUNCH_BLOCKING", lookup("OPENREG_LAUNCH_BLOCKING"), false),
            worker_idle_ms: parse_u64("OPENREG_WORKER_IDLE_MS", lookup("OPENREG_WORKER_IDLE_MS"), 1000),
            device_memory: parse_size("OPENREG_DEVICE_MEMORY", lookup("OPENREG_DEVICE_MEMORY"), DEFAULT_DEVICE_MEMORY),
            memory_protect: parse_flag("OPENREG_MEMORY_PROTECT", lookup("OPENREG_MEMORY_PROTECT"), false),
            random_threads: parse_u64("OPENREG_RANDOM_THREADS", lookup("OPENREG_RANDOM_THREADS"), 0).min(1024) as usize,
            autograd_on_caller: parse_flag("OPENREG_AUTOGRAD_ON_CALLER", lookup("OPENREG_AUTOGRAD_ON_CALLER"), true),
            kernel_threads: parse_u64("OPENREG_KERNEL_THREADS", lookup("OPENREG_KERNEL_THREADS"), 1).clamp(1, 1024) as usize,
            log_level: parse_choice("OPENREG_LOG", lookup("OPENREG_LOG"), &Level::NAMES, DEFAULT_LOG_LEVEL),
            exit_drain_ms: parse_u64("OPENREG_EXIT_DRAIN_MS", lookup("OPENREG_EXIT_DRAIN_MS"), DEFAULT_EXIT_DRAIN_MS),
            sync_debug: parse_choice("OPENREG_SYNC_DEBUG", lookup("OPENREG_SYNC_DEBUG"), &SyncDebugMode::NAMES, SyncDebugMode::Default),
            from_environment: Vec::new(),
        };
        options.from_environment = set.into_inner();
        options
    }

    /// Where `name`'s value comes from: "environment" or "default".
    pub fn source(&self, name: &str) -> &'static str {
        if self.from_environment.contains(&name) {
            "environment"
        } else {
            "default"
        }
    }

    pub fn entries(&self) -> Vec<OptionEntry> {
        vec![
            OptionEntry {
                name: "OPENREG_DEVICE_COUNT",
                value: self.device_count.to_string(),
                help: "number of simulated devices (0..=16, default 2; invalid means 0)",
            },
            OptionEntry {
                name: "OPENREG_LAUNCH_BLOCKING",
                value: (self.launch_blocking as u8).to_string(),
                help: "1: every launch waits for its stream to finish (debugging)",
            },
            OptionEntry {
                name: "OPENREG_WORKER_IDLE_MS",
                value: self.worker_idle_ms.to_string(),
                help: "milliseconds an idle stream worker thread lingers before exiting",
            },
            OptionEntry {
                name: "OPENREG_DEVICE_MEMORY",
                value: self.device_memory.to_string(),
                help: "bytes of memory per device (suffixes K, M, G accepted; default 4G)",
            },
            OptionEntry {
                name: "OPENREG_MEMORY_PROTECT",
                value: (self.memory_protect as u8).to_string(),
                help: "1: device memory faults when host code touches it outside device operations",
            },
            OptionEntry {
                name: "OPENREG_RANDOM_THREADS",
                value: self.random_threads.to_string(),
                help: "threads a large random fill uses (0: all cores); results never depend on it",
            },
            OptionEntry {
                name: "OPENREG_AUTOGRAD_ON_CALLER",
                value: (self.autograd_on_caller as u8).to_string(),
                help: "1: backward runs on the thread that calls it (Python, the importing thread), not autograd's device thread",
            },
            OptionEntry {
                name: "OPENREG_KERNEL_THREADS",
                value: self.kernel_threads.to_string(),
                help: "OpenMP threads a device kernel uses (default 1; more slows the process's own CPU work)",
            },
            OptionEntry {
                name: "OPENREG_LOG",
                value: self.log_level.name().to_string(),
                help: "least severe runtime message shown: error, warn (default), info or debug",
            },
            OptionEntry {
                name: "OPENREG_EXIT_DRAIN_MS",
                value: self.exit_drain_ms.to_string(),
                help: "milliseconds exit waits for queued device work before abandoning it (default 500)",
            },
            OptionEntry {
                name: "OPENREG_SYNC_DEBUG",
                value: self.sync_debug.name().to_string(),
                help: "initial set_sync_debug_mode: default, warn or error on host-blocking operations",
            },
        ]
    }
}

fn parse_device_count(raw: Option<String>) -> usize {
    let Some(raw) = raw else { return DEFAULT_DEVICE_COUNT };
    match raw.trim().parse::<usize>() {
        Ok(n) if n <= MAX_DEVICES => n,
        _ => {
            warn_once(&format!(
                "OPENREG_DEVICE_COUNT={raw:?} is invalid (expected an integer from 0 to {MAX_DEVICES}); \
                 openreg reports 0 devices"
            ));
            0
        }
    }
}

fn parse_flag(name: &str, raw: Option<String>, default: bool) -> bool {
    match raw.as_deref().map(str::trim) {
        None | Some("") => default,
        Some("0") => false,
        Some("1") => true,
        Some(other) => {
            warn_once(&format!("{name}={other:?} is invalid (expected 0 or 1); using {}", default as u8));
            default
        }
    }
}

fn parse_u64(name: &str, raw: Option<String>, default: u64) -> u64 {
    match raw.as_deref().map(str::trim) {
        None | Some("") => default,
        Some(s) => s.parse().unwrap_or_else(|_| {
            warn_once(&format!("{name}={s:?} is invalid (expected a non-negative integer); using {default}"));
            default
        }),
    }
}

/// One of `choices` by name (case-insensitive).
fn parse_choice<T: Copy + PartialEq>(name: &str, raw: Option<String>, choices: &[(&'static str, T)], default: T) -> T {
    let Some(raw) = raw else { return default };
    let text = raw.trim().to_ascii_lowercase();
    if let Some((_, value)) = choices.iter().find(|(choice, _)| *choice == text) {
        return *value;
    }
    let default_name = choices.iter().find(|(_, v)| *v == default);
    let accepted: Vec<&str> = choices.iter().map(|(choice, _)| *choice).collect();
    warn_once(&format!(
        "{name}={raw:?} is invalid (expected one of {}); using {}",
        accepted.join(", "),
        default_name.map_or("the default", |(n, _)| n)
    ));
    default
}

/// A byte count: digits with an optional K, M or G (binary) suffix.
fn parse_size(name: &str, raw: Option<String>, default: usize) -> usize {
    let Some(raw) = raw else { return default };
    let text = raw.trim();
    let (digits, shift) = match text.char_indices().last() {
        Some((i, 'K' | 'k')) => (&text[..i], 10),
        Some((i, 'M' | 'm')) => (&text[..i], 20),
        Some((i, 'G' | 'g')) => (&text[..i], 30),
        _ => (text, 0),
    };
    match digits.parse::<usize>().ok().and_then(|n| n.checked_mul(1usize << shift)) {
        Some(bytes) if bytes > 0 => bytes,
        _ => {
            warn_once(&format!("{name}={raw:?} is invalid (expected a positive size such as 512M or 4G); using {default}"));
            default
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Options {
        let pairs: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Options::from_lookup(|k| pairs.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn defaults() {
        let o = parse(&[]);
        assert_eq!(o.device_count, DEFAULT_DEVICE_COUNT);
        assert!(!o.launch_blocking);
        assert_eq!(o.worker_idle_ms, 1000);
    }

    #[test]
    fn device_count_values() {
        assert_eq!(parse(&[("OPENREG_DEVICE_COUNT", "4")]).device_count, 4);
        assert_eq!(parse(&[("OPENREG_DEVICE_COUNT", " 0 ")]).device_count, 0);
        for bad in ["-1", "two", "", "17", "1e3"] {
            assert_eq!(parse(&[("OPENREG_DEVICE_COUNT", bad)]).device_count, 0, "value {bad:?}");
        }
    }

    #[test]
    fn flags() {
        assert!(parse(&[("OPENREG_LAUNCH_BLOCKING", "1")]).launch_blocking);
        assert!(!parse(&[("OPENREG_LAUNCH_BLOCKING", "yes")]).launch_blocking);
        assert_eq!(parse(&[("OPENREG_WORKER_IDLE_MS", "5")]).worker_idle_ms, 5);
        assert_eq!(parse(&[("OPENREG_WORKER_IDLE_MS", "x")]).worker_idle_ms, 1000);
        assert!(parse(&[("OPENREG_MEMORY_PROTECT", "1")]).memory_protect);
        assert_eq!(parse(&[("OPENREG_RANDOM_THREADS", "3")]).random_threads, 3);
        assert_eq!(parse(&[]).random_threads, 0);
    }

    #[test]
    fn choices_and_sources() {
        let o = parse(&[("OPENREG_LOG", "DEBUG"), ("OPENREG_SYNC_DEBUG", "error"), ("OPENREG_EXIT_DRAIN_MS", "20")]);
        assert_eq!(o.log_level, Level::Debug);
        assert_eq!(o.sync_debug, SyncDebugMode::Error);
        assert_eq!(o.exit_drain_ms, 20);
        assert_eq!(o.source("OPENREG_LOG"), "environment");
        assert_eq!(o.source("OPENREG_DEVICE_COUNT"), "default");
        let d = parse(&[("OPENREG_LOG", "loud")]);
        assert_eq!(d.log_level, DEFAULT_LOG_LEVEL);
        assert_eq!(d.exit_drain_ms, DEFAULT_EXIT_DRAIN_MS);
        assert_eq!(d.sync_debug, SyncDebugMode::Default);
    }

    #[test]
    fn sizes() {
        let size = |v: &str| parse(&[("OPENREG_DEVICE_MEMORY", v)]).device_memory;
        assert_eq!(size("4096"), 4096);
        assert_eq!(size("64K"), 64 << 10);
        assert_eq!(size("512M"), 512 << 20);
        assert_eq!(size("2g"), 2 << 30);
        for bad in ["", "0", "-1", "1T", "G", "99999999999999G"] {
            assert_eq!(size(bad), DEFAULT_DEVICE_MEMORY, "value {bad:?}");
        }
    }
}
