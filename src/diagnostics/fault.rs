//! Fault injection (`torch.openreg._inject_fault(kind, after=N)`, or the
//! option `OPENREG_FAULT=kind[:after]`): lets users test their error
//! handling without a failing device.
//!
//! Note [Injected faults]: each kind of fault has a countdown. Arming it with
//! `after = N` lets N more operations of that kind succeed; the next one
//! fails, once, and the countdown is disarmed again. `OPENREG_FAULT` arms
//! its kind before the process's first operation that could fail (the first
//! check or injection arms it, once), so `after` counts from the start of
//! the process, the operations the runtime makes for itself included. Every
//! injected failure is an ordinary runtime error whose message says it was
//! injected and by what (the function or the option), and the runtime stays
//! usable after it:
//! - `Alloc`: a device allocation fails as out of memory (`torch.OutOfMemoryError`);
//! - `Kernel`: a kernel (queued or run inline) is reported failed after it
//!   ran, like a CUDA sticky error: the stream's next synchronizing call raises;
//! - `Event`: an event record fails;
//! - `Enumerate`: the device count (`orGetDeviceCount`) reports 0 devices.
//! Disarmed, a check is one relaxed atomic load.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Once;

use crate::base::error::{Error, ErrorKind, Result};
use crate::base::options::{self, OptionSpec};
use crate::runtime::hooks;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    Alloc = 0,
    Kernel = 1,
    Event = 2,
    Enumerate = 3,
}

impl Fault {
    pub const NAMES: [(&'static str, Fault); 4] = [
        ("alloc", Fault::Alloc),
        ("kernel", Fault::Kernel),
        ("event", Fault::Event),
        ("enumerate", Fault::Enumerate),
    ];

    pub fn from_name(name: &str) -> Result<Fault> {
        Fault::NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, f)| *f)
            .ok_or_else(|| {
                Error::invalid_value(format!(
                    "unknown fault kind {name:?}: expected one of {}",
                    Fault::NAMES.map(|(n, _)| n).join(", ")
                ))
            })
    }

    pub fn name(self) -> &'static str {
        Fault::NAMES[self as usize].0
    }

    /// `OPENREG_FAULT`'s text, `kind[:after]` (kind case-insensitive;
    /// `after` 0 when left out), or None if it is not that.
    pub fn parse_option(text: &str) -> Option<(Fault, u64)> {
        let (kind, after) = match text.split_once(':') {
            Some((kind, after)) => (kind, after.parse().ok()?),
            None => (text, 0),
        };
        Fault::NAMES
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(kind))
            .map(|(_, fault)| (*fault, after))
    }
}

/// `OPENREG_FAULT`: the fault armed from the start of the process (Note
/// [Registered options] in src/base/options.rs).
static OPTION: OptionSpec = OptionSpec {
    name: "OPENREG_FAULT",
    after: "OPENREG_STREAM_POOL_SIZE",
    accepted: "kind[:after], kind one of alloc, kernel, event, enumerate and after a non-negative integer",
    help: "kind[:after]: the (after+1)-th alloc, kernel, event or enumerate of the process fails once (fault injection; unset: none)",
    valid: |text| Fault::parse_option(text).is_some(),
    show: |text| match text.and_then(Fault::parse_option) {
        Some((fault, after)) => format!("{}:{after}", fault.name()),
        None => String::new(),
    },
};

/// Registers `OPENREG_FAULT` (from `diagnostics::register_options`, at load).
pub(crate) fn register_options() {
    options::register(&OPTION);
}

/// The fault `options` arm from the start (`OPENREG_FAULT`), if any.
fn armed_by(options: &options::Options) -> Option<(Fault, u64)> {
    options.registered(OPTION.name).and_then(Fault::parse_option)
}

#[cfg(test)]
mod option_tests {
    use super::*;
    use crate::base::options::Options;

    fn parse(pairs: &[(&str, &str)]) -> Options {
        Options::from_pairs(pairs)
    }

    #[test]
    fn fault_option() {
        assert_eq!(armed_by(&parse(&[])), None);
        assert_eq!(
            armed_by(&parse(&[("OPENREG_FAULT", "kernel:2")])),
            Some((Fault::Kernel, 2))
        );
        assert_eq!(
            armed_by(&parse(&[("OPENREG_FAULT", " ALLOC ")])),
            Some((Fault::Alloc, 0))
        );
        let o = parse(&[("OPENREG_FAULT", "disk:1")]);
        let invalid: Vec<&str> = o.invalid.iter().map(|i| i.name).collect();
        assert_eq!((armed_by(&o), invalid), (None, vec!["OPENREG_FAULT"]));
        assert!(o.check().unwrap_err().message.contains(
            "OPENREG_FAULT=\"disk:1\" (expected kind[:after], kind one of alloc, kernel, event, enumerate and after a \
             non-negative integer)"
        ));
        let entry = |o: &Options| {
            o.entries()
                .into_iter()
                .find(|e| e.name == "OPENREG_FAULT")
                .unwrap()
                .value
        };
        assert_eq!(entry(&parse(&[("OPENREG_FAULT", "Event")])), "event:0");
        assert_eq!(entry(&parse(&[])), "");
    }

    #[test]
    fn the_accepted_choices_are_the_names_the_parser_takes() {
        let accepted = parse(&[("OPENREG_FAULT", "?")]).invalid[0].accepted;
        let names = format!("one of {}", Fault::NAMES.map(|(n, _)| n).join(", "));
        assert!(accepted.contains(&names), "{accepted}");
    }
}

/// Per kind: 0 disarmed, else 1 + the operations still allowed to succeed.
static COUNTDOWNS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

/// Per kind: whether `OPENREG_FAULT` armed it (else `_inject_fault` did).
static BY_OPTION: [AtomicBool; 4] = [const { AtomicBool::new(false) }; 4];

/// Arms what `OPENREG_FAULT` asks for, the first time any fault is checked
/// or injected (Note [Injected faults]). After that, one atomic load.
#[inline]
fn arm_from_option() {
    static ARMED: Once = Once::new();
    ARMED.call_once(|| {
        if let Some((fault, after)) = armed_by(options::get()) {
            arm(fault, after, true);
        }
    });
}

fn arm(fault: Fault, after: u64, by_option: bool) {
    BY_OPTION[fault as usize].store(by_option, Ordering::Relaxed);
    COUNTDOWNS[fault as usize].store(after.saturating_add(1), Ordering::Release);
}

/// Arms `fault`: `after` more operations succeed, the next one fails.
pub fn inject(fault: Fault, after: u64) {
    arm_from_option();
    arm(fault, after, false);
}

/// Called by each operation of kind `fault`: whether this one must fail.
#[inline]
pub fn strikes(fault: Fault) -> bool {
    arm_from_option();
    let countdown = &COUNTDOWNS[fault as usize];
    if countdown.load(Ordering::Relaxed) == 0 {
        return false;
    }
    countdown
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        .is_ok_and(|before| before == 1)
}

/// Installs the faults at the runtime's hook points (Note [Hooks] in
/// hook.rs): a kernel, an event record and an allocation each ask whether
/// they are the one to fail.
pub(crate) fn install_hooks() {
    hooks::AFTER_KERNEL.install(|stream| {
        strikes(Fault::Kernel).then(|| error(Fault::Kernel, &format!("a kernel on {stream} failed")))
    });
    hooks::BEFORE_EVENT_RECORD.install(|stream| match strikes(Fault::Event) {
        true => Err(error(Fault::Event, &format!("recording an event on {stream} failed"))),
        false => Ok(()),
    });
    hooks::BEFORE_ALLOC.install(|device, size| match strikes(Fault::Alloc) {
        true => Err(error(
            Fault::Alloc,
            &format!("allocating {size} bytes on openreg device {device} failed"),
        )),
        false => Ok(()),
    });
}

/// The error of an injected `fault`, naming `what` failed (an allocation
/// fails as out of memory).
pub fn error(fault: Fault, what: &str) -> Error {
    let kind = if fault == Fault::Alloc {
        ErrorKind::OutOfMemory
    } else {
        ErrorKind::InvalidValue
    };
    let by = match BY_OPTION[fault as usize].load(Ordering::Relaxed) {
        true => "OPENREG_FAULT",
        false => "torch.openreg._inject_fault",
    };
    Error::new(
        kind,
        format!("injected fault ({}): {what} ({by})", fault.name()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_n_successes_one_failure() {
        assert!(!strikes(Fault::Event));
        inject(Fault::Event, 2);
        assert_eq!(
            [
                strikes(Fault::Event),
                strikes(Fault::Event),
                strikes(Fault::Event),
                strikes(Fault::Event)
            ],
            [false, false, true, false]
        );
        inject(Fault::Event, 0);
        assert!(strikes(Fault::Event));
        assert!(!strikes(Fault::Event));
        assert!(Fault::from_name("disk")
            .unwrap_err()
            .message
            .contains("alloc, kernel, event, enumerate"));
    }

    #[test]
    fn option_text() {
        assert_eq!(Fault::parse_option("alloc"), Some((Fault::Alloc, 0)));
        assert_eq!(Fault::parse_option("Kernel:3"), Some((Fault::Kernel, 3)));
        assert_eq!(
            Fault::parse_option("enumerate:0"),
            Some((Fault::Enumerate, 0))
        );
        for bad in [
            "disk",
            "alloc:",
            "alloc:-1",
            "alloc:x",
            ":2",
            "event:1:2",
            "alloc 2",
        ] {
            assert_eq!(Fault::parse_option(bad), None, "{bad:?}");
        }
    }
}
