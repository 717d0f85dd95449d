//! Every runtime knob, read once from `OPENREG_*` environment variables.
//!
//! This is the only place that reads the environment. Values are parsed on
//! first use and then frozen for the life of the process. An empty variable
//! reads as unset (except `OPENREG_DEVICE_COUNT`, where it means 0 devices).
//!
//! Note [Invalid options]: parsing never fails; it records each variable
//! whose value it cannot use (`Options::invalid`), and the runtime's
//! initialization (`device::init`: first device use, or an explicit init)
//! fails with one error naming every such variable, its value and what it
//! accepts (`Options::check`), each time it is tried. Until then an invalid
//! option reads as its default, so loading the library, importing the Python
//! package, `torch.openreg.options()` and logging keep working. The device
//! count is the exception: the guard's `deviceCount` is `noexcept` and
//! answers without initializing, so an invalid `OPENREG_DEVICE_COUNT` means
//! 0 devices, with one warning, as before any initialization.
//!
//! Note [Registered options]: an option that belongs to a higher layer (a
//! diagnostic's switch) is that layer's, not this module's: this module
//! reads and validates variables and knows no diagnostic. The owner
//! describes its option in a `static OptionSpec` (its name, what it
//! accepts, its help, a validity test, how its value is shown) and
//! `register`s it when the library loads (`wire` in src/lib.rs, before any
//! option is read). From then on the option is read like this module's
//! own: its variable is read and validated with the others (an invalid
//! value is reported as in Note [Invalid options]), its name is a known one
//! (Note [Unknown options]), and `entries` lists it, after the option its
//! spec names in `after`, so the order of `torch.openreg.options()` is the
//! options table's. What is kept is its text (`Options::registered`), which
//! the owner parses itself with the parser its spec's `valid` uses.

use once_cell::sync::Lazy;
use parking_lot::Mutex;

use crate::base::error::{warn_once, Error, Result};
use crate::base::log::Level;

/// The most devices the runtime will simulate. Bounded so that per-thread
/// state can be fixed-size arrays (see `device.rs`).
pub const MAX_DEVICES: usize = 16;

/// Devices simulated when `OPENREG_DEVICE_COUNT` is unset.
pub const DEFAULT_DEVICE_COUNT: usize = 2;

/// The frozen option set. See the README's "Options" table.
#[derive(Debug, Clone)]
pub struct Options {
    /// `OPENREG_DEVICE_COUNT`: number of devices, 0..=MAX_DEVICES. Invalid → 0
    /// (Note [Invalid options]).
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
    /// `OPENREG_AUTOGRAD_ON_CALLER` (default 1): under Python, backward of
    /// openreg graphs runs on the thread that called it, as for CPU tensors,
    /// instead of autograd's device thread (a hand-off per op). Read by the
    /// Python package at import.
    pub autograd_on_caller: bool,
    /// `OPENREG_KERNEL_THREADS` (default 0: the available cores): the
    /// threads a split kernel runs on, its caller counted (Note [Kernel
    /// pool] in kernel_pool.rs). Results do not depend on it.
    pub kernel_threads: usize,
    /// `OPENREG_SPLIT_ELEMENTS` (default `DEFAULT_SPLIT_ELEMENTS`): the
    /// work, in elements, from which a kernel splits: a kernel of less runs
    /// whole, one of more in two chunks, and one of more than 8 times that
    /// in a power of two of chunks of 4 to 8 times that (Notes [Split
    /// kernels] in cpp/ops/kernel_split.h, [Chunk size] in kernel_split.cpp).
    /// Results may depend on it (chunk boundaries), never on the threads.
    pub split_elements: usize,
    /// `OPENREG_LOG`: the least severe message level shown (`crate::base::log`).
    pub log_level: Level,
    /// `OPENREG_EXIT_DRAIN_MS`: how long the host's exit waits for queued
    /// work before abandoning it (Note [Bounded exit drain] in lifecycle.rs).
    pub exit_drain_ms: u64,
    /// `OPENREG_STREAM_POOL_SIZE`: streams in each priority's pool of a
    /// device, 1..=MAX_STREAM_POOL_SIZE (Note [StreamId assignment]).
    pub stream_pool_size: usize,
    /// `OPENREG_DTYPES`: whose dtype support the kernels follow (Note
    /// [Dtype policy] in cpp/ops/dtype_policy.h). Read when the library
    /// registers its kernels.
    pub dtypes: DtypePolicy,
    /// The registered options (Note [Registered options]) these options
    /// were read with, in the order registered.
    specs: Vec<&'static OptionSpec>,
    /// Each registered option whose variable is set to a valid value: its
    /// name and its trimmed text (`registered`).
    registered_values: Vec<(&'static str, String)>,
    /// The options whose variable was set, in the order read (`entries`
    /// reports each option's source from it).
    pub from_environment: Vec<&'static str>,
    /// The variables (other than the device count) whose value cannot be
    /// used, in the order `entries` lists them (the order the options are
    /// read, registered ones in their place); each option reads as its
    /// default (Note [Invalid options]).
    pub invalid: Vec<InvalidOption>,
}

/// An option a higher layer owns (Note [Registered options]), described
/// by its owner in a `static`.
#[derive(Debug)]
pub struct OptionSpec {
    /// The variable, `OPENREG_...`.
    pub name: &'static str,
    /// The option this one is listed after (by `entries`, and in the error
    /// of Note [Invalid options]): one of this module's or a registered
    /// one. Options registered after the same one are listed in the order
    /// registered; one whose `after` is no option is listed last.
    pub after: &'static str,
    /// What the variable accepts, in words, as the error says it.
    pub accepted: &'static str,
    /// The option's meaning, as `torch.openreg.options()` shows it.
    pub help: &'static str,
    /// Whether the variable's trimmed, non-empty text is a value the owner
    /// can use.
    pub valid: fn(&str) -> bool,
    /// The value as `torch.openreg.options()` shows it: of the text `valid`
    /// accepted, or the default's when None (the variable unset, empty or
    /// invalid).
    pub show: fn(Option<&str>) -> String,
}

/// The registered options, in the order registered.
static REGISTERED: Mutex<Vec<&'static OptionSpec>> = parking_lot::const_mutex(Vec::new());

/// Makes `spec`'s option one that is read, validated and shown with the
/// others (Note [Registered options]). Called by its owner's
/// `register_options` from `wire` in src/lib.rs, when the library loads,
/// before any option is read; registering later, or a name twice, is a
/// wiring mistake and panics.
pub fn register(spec: &'static OptionSpec) {
    assert!(
        get_if_read().is_none(),
        "{} was registered after the options were read (Note [Registered options])",
        spec.name
    );
    let mut registered = REGISTERED.lock();
    assert!(
        registered.iter().all(|other| other.name != spec.name),
        "{} was registered twice (Note [Registered options])",
        spec.name
    );
    registered.push(spec);
}

/// Whose dtype support openreg's kernels follow (`OPENREG_DTYPES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DtypePolicy {
    /// CUDA's, as PyTorch's op_db declares it: dtypes only CUDA supports
    /// are computed in a wider dtype, dtypes only CPU supports are refused.
    Cuda,
    /// The CPU kernels' own.
    Cpu,
    /// The CPU kernels' own, and each kernel call's op and dtype are
    /// recorded: how scripts/generate_dtype_table.py derives the table.
    Record,
}

impl DtypePolicy {
    pub const NAMES: [(&'static str, DtypePolicy); 3] = [
        ("cuda", DtypePolicy::Cuda),
        ("cpu", DtypePolicy::Cpu),
        ("record", DtypePolicy::Record),
    ];

    pub fn name(self) -> &'static str {
        DtypePolicy::NAMES[self as usize].0
    }

    fn parse(text: &str) -> Option<DtypePolicy> {
        parse_choice(text, &DtypePolicy::NAMES)
    }

    /// `OPENREG_DTYPES` as the kernels' registration reads it, when the
    /// library loads: from the options if they are read, else from this
    /// variable alone, so that loading reads (and warns about) no other
    /// option before Python's warning handler is in place. An invalid value
    /// reads as the default here too; initialization reports it.
    pub fn at_load() -> DtypePolicy {
        if let Some(options) = get_if_read() {
            return options.dtypes;
        }
        std::env::var("OPENREG_DTYPES")
            .ok()
            .and_then(|text| DtypePolicy::parse(text.trim()))
            .unwrap_or(DtypePolicy::Cuda)
    }
}

/// A variable whose value the runtime cannot use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidOption {
    pub name: &'static str,
    /// The variable's text, as set.
    pub value: String,
    /// What the variable accepts, in words ("0 or 1").
    pub accepted: &'static str,
}

/// Messages shown when `OPENREG_LOG` is unset.
pub const DEFAULT_LOG_LEVEL: Level = Level::Warn;

/// How long exit waits for queued work when `OPENREG_EXIT_DRAIN_MS` is unset.
pub const DEFAULT_EXIT_DRAIN_MS: u64 = 500;

/// Streams per priority pool when `OPENREG_STREAM_POOL_SIZE` is unset (CUDA's 32).
pub const DEFAULT_STREAM_POOL_SIZE: usize = 32;

/// The largest `OPENREG_STREAM_POOL_SIZE`: each pool stream costs a queue
/// (a few hundred bytes) per device, its worker only while it has work.
pub const MAX_STREAM_POOL_SIZE: usize = 1024;

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
/// through `crate::base::log`, which reads the log level from them).
pub fn get_if_read() -> Option<&'static Options> {
    Lazy::get(&OPTIONS)
}

impl Options {
    /// Parses options from any key lookup; `get()` uses the environment.
    /// Separate so tests can parse values without touching the process env.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Options {
        let mut r = Reader {
            lookup,
            from_environment: Vec::new(),
            invalid: Vec::new(),
        };
        let mut options = Options {
            device_count: r.device_count(),
            launch_blocking: r.read("OPENREG_LAUNCH_BLOCKING", false, FLAG, parse_flag),
            worker_idle_ms: r.read("OPENREG_WORKER_IDLE_MS", 1000, MILLISECONDS, parse_u64),
            device_memory: r.read("OPENREG_DEVICE_MEMORY", DEFAULT_DEVICE_MEMORY, SIZE, parse_size),
            memory_protect: r.read("OPENREG_MEMORY_PROTECT", false, FLAG, parse_flag),
            autograd_on_caller: r.read("OPENREG_AUTOGRAD_ON_CALLER", true, FLAG, parse_flag),
            kernel_threads: r.read("OPENREG_KERNEL_THREADS", 0, "an integer from 0 (all cores) to 1024", |s| {
                parse_u64(s).filter(|&n| n <= 1024).map(|n| n as usize)
            }),
            split_elements: r.read("OPENREG_SPLIT_ELEMENTS", DEFAULT_SPLIT_ELEMENTS, "a positive integer", |s| {
                parse_u64(s).filter(|&n| n > 0).map(|n| n as usize)
            }),
            log_level: r.read("OPENREG_LOG", DEFAULT_LOG_LEVEL, "one of error, warn, info, debug", |s| {
                parse_choice(s, &Level::NAMES)
            }),
            exit_drain_ms: r.read("OPENREG_EXIT_DRAIN_MS", DEFAULT_EXIT_DRAIN_MS, MILLISECONDS, parse_u64),
            stream_pool_size: r.read(
                "OPENREG_STREAM_POOL_SIZE",
                DEFAULT_STREAM_POOL_SIZE,
                "an integer from 1 to 1024",
                |s| parse_u64(s).filter(|n| (1..=MAX_STREAM_POOL_SIZE as u64).contains(n)).map(|n| n as usize),
            ),
            dtypes: r.read("OPENREG_DTYPES", DtypePolicy::Cuda, "one of cuda, cpu, record", DtypePolicy::parse),
            specs: REGISTERED.lock().clone(),
            registered_values: Vec::new(),
            from_environment: Vec::new(),
            invalid: Vec::new(),
        };
        for &spec in &options.specs {
            let text = r.read(spec.name, None, spec.accepted, |text| {
                (spec.valid)(text).then(|| Some(text.to_string()))
            });
            if let Some(text) = text {
                options.registered_values.push((spec.name, text));
            }
        }
        let order = options.order();
        r.invalid.sort_by_key(|o| order.iter().position(|&name| name == o.name));
        options.from_environment = r.from_environment;
        options.invalid = r.invalid;
        options
    }

    /// The text of registered option `name` (Note [Registered options]),
    /// trimmed, when its variable is set to a value its spec's `valid`
    /// accepts; None when it is unset, empty or invalid, or `name` is not a
    /// registered option (the owner's default applies).
    pub fn registered(&self, name: &str) -> Option<&str> {
        self.registered_values
            .iter()
            .find(|(registered, _)| *registered == name)
            .map(|(_, text)| text.as_str())
    }

    /// Every option's name, in the order `entries` lists them.
    fn order(&self) -> Vec<&'static str> {
        let own: Vec<&'static str> = self.own_values().iter().map(|e| e.name).collect();
        listing_order(&own, &self.specs)
    }

    /// Ok when every option can be used; otherwise the one error that
    /// initialization raises (Note [Invalid options]), naming each invalid
    /// variable, its value and what it accepts.
    pub fn check(&self) -> Result<()> {
        if self.invalid.is_empty() {
            return Ok(());
        }
        let problems: Vec<String> = self
            .invalid
            .iter()
            .map(|o| format!("{}={:?} (expected {})", o.name, o.value, o.accepted))
            .collect();
        let several = problems.len() > 1;
        Err(Error::invalid_value(format!(
            "openreg cannot initialize: invalid option value{}: {}; fix or unset {}",
            if several { "s" } else { "" },
            problems.join("; "),
            if several {
                "these variables"
            } else {
                "this variable"
            },
        )))
    }

    /// Where `name`'s value comes from: "environment", "default", or
    /// "invalid" (a value that cannot be used: Note [Invalid options]).
    pub fn source(&self, name: &str) -> &'static str {
        if self.invalid.iter().any(|o| o.name == name) {
            "invalid"
        } else if self.from_environment.contains(&name) {
            "environment"
        } else {
            "default"
        }
    }

    /// Each option's value and meaning; an invalid one shows its text as set.
    pub fn entries(&self) -> Vec<OptionEntry> {
        let mut entries = self.values();
        for entry in &mut entries {
            if let Some(invalid) = self.invalid.iter().find(|o| o.name == entry.name) {
                entry.value = invalid.value.clone();
            }
        }
        entries
    }

    /// Each option's value and meaning, registered ones included, in
    /// `order`.
    fn values(&self) -> Vec<OptionEntry> {
        let mut values = self.own_values();
        values.extend(self.specs.iter().map(|spec| OptionEntry {
            name: spec.name,
            value: (spec.show)(self.registered(spec.name)),
            help: spec.help,
        }));
        let order = self.order();
        values.sort_by_key(|e| order.iter().position(|&name| name == e.name));
        values
    }

    /// This module's own options, in the order read.
    fn own_values(&self) -> Vec<OptionEntry> {
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
                name: "OPENREG_AUTOGRAD_ON_CALLER",
                value: (self.autograd_on_caller as u8).to_string(),
                help: "1: backward runs on the thread that calls it (Python, the importing thread), not autograd's device thread",
            },
            OptionEntry {
                name: "OPENREG_KERNEL_THREADS",
                value: self.kernel_threads.to_string(),
                help: "threads a split device kernel (and a large random fill) runs on, 0..=1024 (0: all cores); results never depend on it",
            },
            OptionEntry {
                name: "OPENREG_SPLIT_ELEMENTS",
                value: self.split_elements.to_string(),
                help: "work of one chunk of a split device kernel, in elements; smaller kernels run whole",
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
                name: "OPENREG_STREAM_POOL_SIZE",
                value: self.stream_pool_size.to_string(),
                help: "streams in each priority's pool per device (1..=1024, default 32), handed out round-robin",
            },
            OptionEntry {
                name: "OPENREG_DTYPES",
                value: self.dtypes.name().to_string(),
                help: "whose dtype support ops follow: cuda (default: CUDA's, per op_db), cpu (the CPU kernels'), record (cpu, recording each kernel's dtype)",
            },
        ]
    }
}

/// The options' names in the order `entries` lists them: `own` in order,
/// each registered one right after the one its spec names in `after` (those
/// after the same one in the order registered), then any whose `after` is
/// no option.
fn listing_order(own: &[&'static str], specs: &[&'static OptionSpec]) -> Vec<&'static str> {
    fn place(name: &'static str, specs: &[&'static OptionSpec], order: &mut Vec<&'static str>) {
        if order.contains(&name) {
            return; // a wiring mistake: `after`s that form a cycle
        }
        order.push(name);
        for spec in specs.iter().filter(|spec| spec.after == name) {
            place(spec.name, specs, order);
        }
    }
    let mut order = Vec::new();
    for &name in own {
        place(name, specs, &mut order);
    }
    for spec in specs {
        if !order.contains(&spec.name) {
            place(spec.name, specs, &mut order);
        }
    }
    order
}

/// `OPENREG_*` variables that are not runtime options but are read by
/// openreg's build (build.rs, cmake/OpenRegTorch.cmake): set in a runtime
/// process they are no typo.
const BUILD_VARIABLES: [&str; 2] = ["OPENREG_TORCH_DIR", "OPENREG_TORCH_CXX11_ABI"];

/// Options an earlier version had, and the option that does their work now.
const RENAMED: [(&str, &str); 1] = [("OPENREG_RANDOM_THREADS", "OPENREG_KERNEL_THREADS")];

/// Note [Unknown options]: an `OPENREG_*` variable that is neither an
/// option nor read by the build is most likely a typo or an option renamed
/// since (`RENAMED`); it would otherwise be ignored in silence. Each gets
/// one message naming it and the known options close to it: the option
/// that replaced it, else those within a few edits of its name or sharing a
/// word with it. `device::init` shows them once, as warnings, at the
/// runtime's first initialization; they never fail it (an unknown variable
/// changes nothing).
pub fn unknown_variables_in_environment() -> Vec<String> {
    unknown_variable_messages(std::env::vars_os().filter_map(|(name, _)| name.into_string().ok()))
}

/// One message for each unknown `OPENREG_*` name among `names` (Note
/// [Unknown options]), in name order.
fn unknown_variable_messages(names: impl IntoIterator<Item = String>) -> Vec<String> {
    let options = Options::from_lookup(|_| None).values();
    let known: Vec<&'static str> = options
        .iter()
        .map(|e| e.name)
        .chain(BUILD_VARIABLES)
        .collect();
    let mut unknown: Vec<String> = names
        .into_iter()
        .filter(|name| name.starts_with("OPENREG_") && !known.contains(&name.as_str()))
        .collect();
    unknown.sort();
    unknown
        .into_iter()
        .map(|name| {
            let advice = match RENAMED.iter().find(|(old, _)| *old == name) {
                Some((_, new)) => format!("it was replaced by {new}"),
                None => match close_options(&name, &known) {
                    close if close.is_empty() => {
                        "see torch.openreg.options() or the README's options table".to_string()
                    }
                    close => format!("did you mean {}?", close.join(" or ")),
                },
            };
            format!("{name} is not an openreg option and is ignored; {advice}")
        })
        .collect()
}

/// The known names within 3 edits of `name`, or sharing a word with it
/// (words split at `_`, the `OPENREG` prefix not counted), closest first.
fn close_options(name: &str, known: &[&'static str]) -> Vec<&'static str> {
    let words = |n: &str| -> Vec<String> { n.split('_').skip(1).map(str::to_string).collect() };
    let name_words = words(name);
    let mut close: Vec<(usize, &'static str)> = known
        .iter()
        .map(|&k| (edit_distance(name, k), k))
        .filter(|&(distance, k)| distance <= 3 || words(k).iter().any(|w| name_words.contains(w)))
        .collect();
    close.sort();
    close.into_iter().map(|(_, k)| k).collect()
}

/// Levenshtein distance over bytes (the names are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.iter().enumerate() {
        let mut current = vec![i + 1];
        for (j, &cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != cb);
            current.push(substitution.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

/// What variables of each kind accept, as the error says it.
const FLAG: &str = "0 or 1";
/// Chunk work of a split kernel, measured on 2 cores: an add of 4M floats ran
/// 2x faster (1.0x CPU) at 32K, 64K or 128K per chunk; one of 256K in eight
/// chunks of 32K 1.15x slower than in two. Since pool threads poll between
/// kernels (Note [Polling helpers]), two chunks pay from about 100K: an add
/// of 100K, 150K and 200K floats took 0.89x, 0.68x and 0.63x its time whole
/// (the split threshold was twice the chunk before, from when helpers slept).
pub const DEFAULT_SPLIT_ELEMENTS: usize = 1 << 17;
const MILLISECONDS: &str = "a non-negative integer (milliseconds)";
const SIZE: &str = "a positive size in bytes, such as 4096, 512M or 4G";

/// Reads variables through `lookup`, noting which were set and which hold a
/// value that cannot be used.
struct Reader<F> {
    lookup: F,
    from_environment: Vec<&'static str>,
    invalid: Vec<InvalidOption>,
}

impl<F: Fn(&str) -> Option<String>> Reader<F> {
    fn lookup(&mut self, name: &'static str) -> Option<String> {
        let value = (self.lookup)(name);
        if value.is_some() {
            self.from_environment.push(name);
        }
        value
    }

    /// `name`'s value as `parse` reads its trimmed text; `default` when the
    /// variable is unset or empty. A value `parse` rejects is recorded as
    /// invalid and reads as `default`.
    fn read<T>(
        &mut self,
        name: &'static str,
        default: T,
        accepted: &'static str,
        parse: impl Fn(&str) -> Option<T>,
    ) -> T {
        let Some(raw) = self.lookup(name) else {
            return default;
        };
        if raw.trim().is_empty() {
            return default;
        }
        parse(raw.trim()).unwrap_or_else(|| {
            self.invalid.push(InvalidOption {
                name,
                value: raw,
                accepted,
            });
            default
        })
    }

    /// `OPENREG_DEVICE_COUNT`: an invalid value (empty included) means 0
    /// devices and one warning, never an error (Note [Invalid options]).
    fn device_count(&mut self) -> usize {
        let Some(raw) = self.lookup("OPENREG_DEVICE_COUNT") else {
            return DEFAULT_DEVICE_COUNT;
        };
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
}

fn parse_flag(text: &str) -> Option<bool> {
    match text {
        "0" => Some(false),
        "1" => Some(true),
        _ => None,
    }
}

fn parse_u64(text: &str) -> Option<u64> {
    text.parse().ok()
}

/// One of `choices` by name (case-insensitive); for registered options'
/// parsers too.
pub fn parse_choice<T: Copy>(text: &str, choices: &[(&'static str, T)]) -> Option<T> {
    choices
        .iter()
        .find(|(choice, _)| choice.eq_ignore_ascii_case(text))
        .map(|(_, value)| *value)
}

/// A byte count: digits with an optional K, M or G (binary) suffix; not 0.
fn parse_size(text: &str) -> Option<usize> {
    let (digits, shift) = match text.char_indices().last() {
        Some((i, 'K' | 'k')) => (&text[..i], 10),
        Some((i, 'M' | 'm')) => (&text[..i], 20),
        Some((i, 'G' | 'g')) => (&text[..i], 30),
        _ => (text, 0),
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(1usize << shift))
        .filter(|&bytes| bytes > 0)
}

/// The options a process with exactly these variables set would read
/// (for tests, here and in the modules that own registered options).
#[cfg(test)]
impl Options {
    pub(crate) fn from_pairs(pairs: &[(&str, &str)]) -> Options {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Options::from_lookup(|k| {
            pairs
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Options {
        Options::from_pairs(pairs)
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
            assert_eq!(
                parse(&[("OPENREG_DEVICE_COUNT", bad)]).device_count,
                0,
                "value {bad:?}"
            );
        }
    }

    /// The names of the options recorded as invalid.
    fn invalid(o: &Options) -> Vec<&'static str> {
        o.invalid.iter().map(|i| i.name).collect()
    }

    #[test]
    fn flags() {
        assert!(parse(&[("OPENREG_LAUNCH_BLOCKING", "1")]).launch_blocking);
        assert!(!parse(&[("OPENREG_LAUNCH_BLOCKING", "0")]).launch_blocking);
        assert!(!parse(&[("OPENREG_LAUNCH_BLOCKING", "")]).launch_blocking);
        let yes = parse(&[("OPENREG_LAUNCH_BLOCKING", "yes")]);
        assert!(!yes.launch_blocking);
        assert_eq!(invalid(&yes), ["OPENREG_LAUNCH_BLOCKING"]);
        assert_eq!(parse(&[("OPENREG_WORKER_IDLE_MS", "5")]).worker_idle_ms, 5);
        let x = parse(&[("OPENREG_WORKER_IDLE_MS", "x")]);
        assert_eq!(x.worker_idle_ms, 1000);
        assert_eq!(invalid(&x), ["OPENREG_WORKER_IDLE_MS"]);
        assert!(parse(&[("OPENREG_MEMORY_PROTECT", "1")]).memory_protect);
        assert_eq!(parse(&[("OPENREG_KERNEL_THREADS", "3")]).kernel_threads, 3);
        assert_eq!(parse(&[]).kernel_threads, 0);
        assert_eq!(
            parse(&[("OPENREG_SPLIT_ELEMENTS", "16")]).split_elements,
            16
        );
        assert_eq!(
            invalid(&parse(&[("OPENREG_SPLIT_ELEMENTS", "0")])),
            ["OPENREG_SPLIT_ELEMENTS"]
        );
    }

    #[test]
    fn thread_counts_are_bounded() {
        assert_eq!(
            parse(&[("OPENREG_KERNEL_THREADS", "1024")]).kernel_threads,
            1024
        );
        for bad in ["-1", "1025", "two"] {
            let o = parse(&[("OPENREG_KERNEL_THREADS", bad)]);
            assert_eq!(
                invalid(&o),
                ["OPENREG_KERNEL_THREADS"],
                "OPENREG_KERNEL_THREADS={bad}"
            );
            assert_eq!(o.kernel_threads, 0);
        }
    }

    #[test]
    fn choices_and_sources() {
        let o = parse(&[
            ("OPENREG_LOG", "DEBUG"),
            ("OPENREG_SYNC_DEBUG", "error"),
            ("OPENREG_EXIT_DRAIN_MS", "20"),
        ]);
        assert_eq!(o.log_level, Level::Debug);
        assert_eq!(o.registered("OPENREG_SYNC_DEBUG"), Some("error"));
        assert_eq!(o.source("OPENREG_SYNC_DEBUG"), "environment");
        assert_eq!(o.exit_drain_ms, 20);
        assert_eq!(o.source("OPENREG_LOG"), "environment");
        assert_eq!(o.source("OPENREG_DEVICE_COUNT"), "default");
        assert!(o.invalid.is_empty());
        let d = parse(&[("OPENREG_LOG", "loud")]);
        assert_eq!(d.log_level, DEFAULT_LOG_LEVEL);
        assert_eq!(d.source("OPENREG_LOG"), "invalid");
        assert_eq!(d.exit_drain_ms, DEFAULT_EXIT_DRAIN_MS);
        assert_eq!(d.registered("OPENREG_SYNC_DEBUG"), None);
    }

    #[test]
    fn stream_pool_size_is_bounded() {
        assert_eq!(parse(&[]).stream_pool_size, DEFAULT_STREAM_POOL_SIZE);
        assert_eq!(
            parse(&[("OPENREG_STREAM_POOL_SIZE", "4")]).stream_pool_size,
            4
        );
        assert_eq!(
            parse(&[("OPENREG_STREAM_POOL_SIZE", "1024")]).stream_pool_size,
            MAX_STREAM_POOL_SIZE
        );
        for bad in ["0", "1025", "-1", "many", "4.5"] {
            let o = parse(&[("OPENREG_STREAM_POOL_SIZE", bad)]);
            assert_eq!(invalid(&o), ["OPENREG_STREAM_POOL_SIZE"], "value {bad:?}");
            assert_eq!(o.stream_pool_size, DEFAULT_STREAM_POOL_SIZE);
            let message = o.check().unwrap_err().message;
            assert!(
                message.contains(&format!(
                    "OPENREG_STREAM_POOL_SIZE={bad:?} (expected an integer from 1 to 1024)"
                )),
                "{message}"
            );
        }
    }

    #[test]
    fn sizes() {
        let size = |v: &str| parse(&[("OPENREG_DEVICE_MEMORY", v)]).device_memory;
        assert_eq!(size("4096"), 4096);
        assert_eq!(size("64K"), 64 << 10);
        assert_eq!(size("512M"), 512 << 20);
        assert_eq!(size("2g"), 2 << 30);
        assert_eq!(size(""), DEFAULT_DEVICE_MEMORY);
        for bad in ["0", "-1", "1T", "G", "99999999999999G"] {
            let o = parse(&[("OPENREG_DEVICE_MEMORY", bad)]);
            assert_eq!(o.device_memory, DEFAULT_DEVICE_MEMORY, "value {bad:?}");
            assert_eq!(invalid(&o), ["OPENREG_DEVICE_MEMORY"], "value {bad:?}");
        }
    }

    #[test]
    fn valid_options_pass_the_check() {
        assert!(parse(&[]).check().is_ok());
        let all_set = parse(&[
            ("OPENREG_DEVICE_COUNT", "3"),
            ("OPENREG_LAUNCH_BLOCKING", "1"),
            ("OPENREG_DEVICE_MEMORY", "1G"),
            ("OPENREG_KERNEL_THREADS", "2"),
            ("OPENREG_LOG", "Info"),
            ("OPENREG_SYNC_DEBUG", " warn "),
            ("OPENREG_WORKER_IDLE_MS", ""),
        ]);
        assert!(all_set.invalid.is_empty(), "{:?}", all_set.invalid);
        assert!(all_set.check().is_ok());
    }

    #[test]
    fn the_check_names_every_invalid_variable_its_value_and_what_it_accepts() {
        let o = parse(&[
            ("OPENREG_SYNC_DEBUG", "bogus"),
            ("OPENREG_WORKER_IDLE_MS", "soon"),
            ("OPENREG_MEMORY_PROTECT", "yes"),
            ("OPENREG_LOG", "debug"),
        ]);
        // In the order the options are read.
        assert_eq!(
            invalid(&o),
            [
                "OPENREG_WORKER_IDLE_MS",
                "OPENREG_MEMORY_PROTECT",
                "OPENREG_SYNC_DEBUG"
            ]
        );
        let error = o.check().unwrap_err();
        assert_eq!(error.kind, crate::base::error::ErrorKind::InvalidValue);
        assert_eq!(
            error.message,
            "openreg cannot initialize: invalid option values: \
             OPENREG_WORKER_IDLE_MS=\"soon\" (expected a non-negative integer (milliseconds)); \
             OPENREG_MEMORY_PROTECT=\"yes\" (expected 0 or 1); \
             OPENREG_SYNC_DEBUG=\"bogus\" (expected one of default, warn, error); \
             fix or unset these variables"
        );
        let one = parse(&[("OPENREG_EXIT_DRAIN_MS", "-5")])
            .check()
            .unwrap_err()
            .message;
        assert!(
            one.contains("invalid option value: OPENREG_EXIT_DRAIN_MS=\"-5\" (expected")
                && one.ends_with("this variable"),
            "{one}"
        );
    }

    #[test]
    fn the_accepted_choices_are_the_names_the_parser_takes() {
        let accepted = |name: &str| parse(&[(name, "?")]).invalid[0].accepted;
        let names = |choices: &[&str]| format!("one of {}", choices.join(", "));
        assert_eq!(
            accepted("OPENREG_LOG"),
            names(&Level::NAMES.map(|(n, _)| n))
        );
        assert_eq!(
            accepted("OPENREG_DTYPES"),
            names(&DtypePolicy::NAMES.map(|(n, _)| n))
        );
    }

    #[test]
    fn dtypes_option() {
        assert_eq!(parse(&[]).dtypes, DtypePolicy::Cuda);
        assert_eq!(
            parse(&[("OPENREG_DTYPES", " CPU ")]).dtypes,
            DtypePolicy::Cpu
        );
        assert_eq!(
            parse(&[("OPENREG_DTYPES", "record")]).dtypes,
            DtypePolicy::Record
        );
        let o = parse(&[("OPENREG_DTYPES", "gpu")]);
        assert_eq!(
            (o.dtypes, invalid(&o)),
            (DtypePolicy::Cuda, vec!["OPENREG_DTYPES"])
        );
        let entry = |o: &Options| {
            o.entries()
                .into_iter()
                .find(|e| e.name == "OPENREG_DTYPES")
                .unwrap()
                .value
        };
        assert_eq!(entry(&parse(&[("OPENREG_DTYPES", "cpu")])), "cpu");
        assert_eq!(entry(&parse(&[])), "cuda");
    }

    #[test]
    fn an_invalid_device_count_is_zero_devices_not_an_error() {
        let o = parse(&[("OPENREG_DEVICE_COUNT", "two")]);
        assert_eq!(o.device_count, 0);
        assert!(o.invalid.is_empty());
        assert!(o.check().is_ok());
        assert_eq!(o.source("OPENREG_DEVICE_COUNT"), "environment");
    }

    fn unknown(names: &[&str]) -> Vec<String> {
        unknown_variable_messages(names.iter().map(|n| n.to_string()))
    }

    #[test]
    fn known_options_and_build_variables_are_not_unknown() {
        let every_option: Vec<&str> = parse(&[]).entries().iter().map(|e| e.name).collect();
        assert!(unknown(&every_option).is_empty());
        assert!(unknown(&[
            "OPENREG_TORCH_DIR",
            "OPENREG_TORCH_CXX11_ABI",
            "PATH",
            "TORCH_OPENREG_X"
        ])
        .is_empty());
    }

    #[test]
    fn a_renamed_option_names_its_replacement() {
        assert_eq!(
            unknown(&["OPENREG_RANDOM_THREADS"]),
            ["OPENREG_RANDOM_THREADS is not an openreg option and is ignored; it was replaced by OPENREG_KERNEL_THREADS"]
        );
    }

    #[test]
    fn a_typo_names_the_options_close_to_it() {
        assert_eq!(
            unknown(&["OPENREG_DEVICE_COUNTS"]),
            [
                "OPENREG_DEVICE_COUNTS is not an openreg option and is ignored; \
              did you mean OPENREG_DEVICE_COUNT or OPENREG_DEVICE_MEMORY?"
            ]
        );
        assert_eq!(
            unknown(&["OPENREG_SANITISER"]),
            ["OPENREG_SANITISER is not an openreg option and is ignored; did you mean OPENREG_SANITIZER?"]
        );
        assert_eq!(
            unknown(&["OPENREG_ZZZZZZZ"]),
            ["OPENREG_ZZZZZZZ is not an openreg option and is ignored; \
              see torch.openreg.options() or the README's options table"]
        );
        // One message each, in name order.
        let two = unknown(&["OPENREG_LOGS", "OPENREG_FAULTS"]);
        assert!(
            two[0].starts_with("OPENREG_FAULTS ") && two[1].starts_with("OPENREG_LOGS "),
            "{two:?}"
        );
    }

    #[test]
    fn edit_distances() {
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }

    /// Registered options (Note [Registered options]) are registered when
    /// the library loads, in this test binary too, so `from_lookup` reads
    /// them: listed, and reported invalid, in their place among the others.
    #[test]
    fn registered_options_are_listed_and_checked_in_their_place() {
        let names: Vec<&str> = parse(&[]).entries().iter().map(|e| e.name).collect();
        assert_eq!(
            names,
            [
                "OPENREG_DEVICE_COUNT",
                "OPENREG_LAUNCH_BLOCKING",
                "OPENREG_WORKER_IDLE_MS",
                "OPENREG_DEVICE_MEMORY",
                "OPENREG_MEMORY_PROTECT",
                "OPENREG_AUTOGRAD_ON_CALLER",
                "OPENREG_KERNEL_THREADS",
                "OPENREG_SPLIT_ELEMENTS",
                "OPENREG_LOG",
                "OPENREG_EXIT_DRAIN_MS",
                "OPENREG_SYNC_DEBUG",
                "OPENREG_SANITIZER",
                "OPENREG_STREAM_POOL_SIZE",
                "OPENREG_FAULT",
                "OPENREG_DTYPES",
            ]
        );
        let o = parse(&[
            ("OPENREG_DTYPES", "gpu"),
            ("OPENREG_FAULT", "x"),
            ("OPENREG_STREAM_POOL_SIZE", "0"),
            ("OPENREG_SANITIZER", "x"),
            ("OPENREG_SYNC_DEBUG", "x"),
            ("OPENREG_LOG", "x"),
        ]);
        assert_eq!(
            invalid(&o),
            [
                "OPENREG_LOG",
                "OPENREG_SYNC_DEBUG",
                "OPENREG_SANITIZER",
                "OPENREG_STREAM_POOL_SIZE",
                "OPENREG_FAULT",
                "OPENREG_DTYPES"
            ]
        );
        assert_eq!(o.registered("OPENREG_SANITIZER"), None);
        assert_eq!(parse(&[("OPENREG_SANITIZER", " warn ")]).registered("OPENREG_SANITIZER"), Some("warn"));
        assert_eq!(parse(&[("OPENREG_SANITIZER", " ")]).registered("OPENREG_SANITIZER"), None);
        assert_eq!(parse(&[("OPENREG_LOG", "info")]).registered("OPENREG_LOG"), None);
    }

    #[test]
    fn a_registered_option_is_listed_after_the_one_its_spec_names() {
        fn spec(name: &'static str, after: &'static str) -> &'static OptionSpec {
            Box::leak(Box::new(OptionSpec {
                name,
                after,
                accepted: "",
                help: "",
                valid: |_| true,
                show: |_| String::new(),
            }))
        }
        let specs = [
            spec("D", "B"),
            spec("E", "D"),
            spec("F", "nothing"),
            spec("G", "A"),
            spec("H", "B"),
        ];
        assert_eq!(
            listing_order(&["A", "B", "C"], &specs),
            ["A", "G", "B", "D", "E", "H", "C", "F"]
        );
        // `after`s that form a cycle list each option once.
        let cycle = [spec("X", "Y"), spec("Y", "X")];
        assert_eq!(listing_order(&["A"], &cycle), ["A", "X", "Y"]);
    }

    #[test]
    fn entries_show_an_invalid_value_as_set() {
        let o = parse(&[("OPENREG_SYNC_DEBUG", "Bogus "), ("OPENREG_LOG", "info")]);
        let entry = |name: &str| o.entries().into_iter().find(|e| e.name == name).unwrap();
        assert_eq!(entry("OPENREG_SYNC_DEBUG").value, "Bogus ");
        assert_eq!(o.source("OPENREG_SYNC_DEBUG"), "invalid");
        assert_eq!(entry("OPENREG_LOG").value, "info");
        assert_eq!(entry("OPENREG_WORKER_IDLE_MS").value, "1000");
    }
}
