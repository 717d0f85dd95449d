//! The sanitizer's guard on pinned host memory.
//!
//! Note [Pinned memory guard]: a non-blocking copy between the device and
//! pinned host memory is, on CUDA, still running when the host goes on, so
//! the host must not read its destination (D2H) or refill its source (H2D)
//! until it has synchronized with the copy. Host code touches that memory
//! directly (numpy, CPU ops), not through the runtime, so the sanitizer
//! catches it with page protection: under the sanitizer such a copy is done
//! at its launch (the runtime's own wait: no happens-before edge), and then
//! its host pages are made inaccessible (D2H destination) or read-only (H2D
//! source) until the host's clock covers the copy (`release_covered`, after
//! every host synchronization). A host access meanwhile faults; the SIGSEGV
//! handler finds the guarded range, marks it as reported, restores access
//! and returns, so the access proceeds; the report is collected by the next
//! sanitizer call (in "raise" mode, the next launch or sync fails with it).
//! The runtime's own accesses (another copy of the same buffer) lift the
//! guard first (`runtime_access`), and freeing the pinned memory drops it.
//! Pinned allocations are whole pages of their own (src/memory/pinned.rs), so a
//! guard touches no other allocation; views of one pinned buffer share its
//! pages, and a host access to another view on a guarded page is reported
//! too (a limitation, said in docs/sanitizer-and-diagnostics.md).
//! The handler reads only fixed slots of atomics and a message written
//! before the slot was armed; faults elsewhere go to the previous handler.
//!
//! Several host threads can fault on one guarded range at once (a CPU
//! matmul's OpenMP team reading the buffer): the first to enter lifts the
//! protection and marks the slot FAULTED, and the others, whose faults
//! were taken while it was still protected, find the slot FAULTED (or FREE
//! again, if the report was collected meanwhile). Their access only needs
//! retrying, so the handler takes a fault inside any slot's range as its
//! own, whatever the slot's state: a slot's range stays recorded after it
//! is released (its pages are then accessible again) and is cleared only
//! when its memory is freed, so a fault there always lands on pages that
//! are accessible again by the time it is retried. Passing
//! such a fault on would run the default action (the process dies) or, as
//! it did, reset SIGSEGV to it and leave the next guarded access to kill
//! the process.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Once;

use parking_lot::Mutex;

use crate::memory::device_memory::PAGE;
use crate::diagnostics::sanitizer::KernelBuffer;

const SLOTS: usize = 64;
const MESSAGE_BYTES: usize = 1024;

const FREE: u8 = 0;
const ARMED: u8 = 1;
const FAULTED: u8 = 2;

struct Slot {
    state: AtomicU8,
    /// Page-aligned guarded range.
    start: AtomicUsize,
    end: AtomicUsize,
    /// The copy's launch: released once the host's clock has `seq` of `agent`.
    agent: AtomicUsize,
    seq: AtomicU64,
    message_len: AtomicUsize,
    message: std::cell::UnsafeCell<[u8; MESSAGE_BYTES]>,
}

impl Slot {
    /// The recorded range (empty once its memory was freed).
    fn pages(&self) -> std::ops::Range<usize> {
        self.start.load(Ordering::Relaxed)..self.end.load(Ordering::Relaxed)
    }

    fn overlaps(&self, start: usize, end: usize) -> bool {
        let pages = self.pages();
        pages.start < end && start < pages.end
    }
}

// SAFETY: `message` is written only by the thread that owns the slot while it
// is FREE (under ARMING), and read once it is armed or faulted.
unsafe impl Sync for Slot {}

static GUARDS: [Slot; SLOTS] = [const {
    Slot {
        state: AtomicU8::new(FREE),
        start: AtomicUsize::new(0),
        end: AtomicUsize::new(0),
        agent: AtomicUsize::new(0),
        seq: AtomicU64::new(0),
        message_len: AtomicUsize::new(0),
        message: std::cell::UnsafeCell::new([0; MESSAGE_BYTES]),
    }
}; SLOTS];

/// Slots not FREE: the launch path skips all of this when 0.
static IN_USE: AtomicUsize = AtomicUsize::new(0);
/// Some slot was armed once: its range may still be recorded (`forget`).
static EVER_ARMED: AtomicBool = AtomicBool::new(false);
/// Serializes arming, releasing and collecting (never the handler).
static ARMING: Mutex<()> = Mutex::new(());

static INSTALL: Once = Once::new();
static mut PREVIOUS: std::mem::MaybeUninit<libc::sigaction> = std::mem::MaybeUninit::uninit();

/// Installs the SIGSEGV handler (once; when the sanitizer is first enabled).
pub(crate) fn install() {
    INSTALL.call_once(|| {
        // SAFETY: a zeroed sigaction with our handler and SA_SIGINFO is a
        // valid argument; PREVIOUS is written once, here, before any fault
        // can reach the handler that reads it.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_fault as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(libc::SIGSEGV, &action, (&raw mut PREVIOUS).cast());
        }
    });
}

extern "C" fn on_fault(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let address = unsafe { (*info).si_addr() } as usize;
    let covers = |slot: &Slot| slot.pages().contains(&address);
    for slot in &GUARDS {
        if slot.state.load(Ordering::Acquire) == ARMED && covers(slot) {
            let pages = slot.pages();
            // SAFETY: mprotect is async-signal-safe; the range is mapped
            // pinned memory (freeing it disarms the slot first).
            unsafe {
                libc::mprotect(
                    pages.start as *mut libc::c_void,
                    pages.len(),
                    libc::PROT_READ | libc::PROT_WRITE,
                )
            };
            slot.state.store(FAULTED, Ordering::Release);
            return; // the access is retried, and succeeds
        }
    }
    if GUARDS.iter().any(covers) {
        return; // lifted by another thread's fault or a release: retried
    }
    // Not ours: what would have happened without us.
    // SAFETY: PREVIOUS was filled by sigaction before this handler existed.
    unsafe {
        let previous = &*(&raw const PREVIOUS).cast::<libc::sigaction>();
        if previous.sa_sigaction == libc::SIG_DFL || previous.sa_sigaction == libc::SIG_IGN {
            libc::signal(signal, libc::SIG_DFL);
            return; // the fault repeats, with the default action
        }
        if previous.sa_flags & libc::SA_SIGINFO != 0 {
            let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                std::mem::transmute(previous.sa_sigaction);
            handler(signal, info, context);
        } else {
            let handler: extern "C" fn(libc::c_int) = std::mem::transmute(previous.sa_sigaction);
            handler(signal);
        }
    }
}

fn page_range(address: usize, bytes: usize) -> (usize, usize) {
    (
        address / PAGE * PAGE,
        (address + bytes).div_ceil(PAGE) * PAGE,
    )
}

fn set_protection(start: usize, end: usize, prot: libc::c_int) {
    // SAFETY: (start, end) covers pages of a live pinned allocation.
    unsafe { libc::mprotect(start as *mut libc::c_void, end - start, prot) };
}

/// Guards `bytes` at `address` (pinned) after a copy at `(agent, seq)`:
/// `device_writes` (D2H) makes them inaccessible, else read-only.
pub(crate) fn arm(
    address: usize,
    bytes: usize,
    device_writes: bool,
    agent: usize,
    seq: u64,
    message: &str,
) {
    if bytes == 0 {
        return;
    }
    let _arming = ARMING.lock();
    let (start, end) = page_range(address, bytes);
    disarm_overlapping(start, end, false);
    // A free slot that records no range, or this one, is taken first: the
    // ranges others record keep late faults on them retried (above).
    let free = || {
        GUARDS
            .iter()
            .filter(|s| s.state.load(Ordering::Acquire) == FREE)
    };
    let Some(slot) = free()
        .find(|s| s.pages().is_empty() || s.pages() == (start..end))
        .or_else(|| free().next())
    else {
        crate::base::log::once(crate::base::log::Level::Warn, "openreg sanitizer: more than 64 pinned buffers with pending copies; later ones are not guarded");
        return;
    };
    let text = message.as_bytes();
    let len = text.len().min(MESSAGE_BYTES);
    // SAFETY: the slot is FREE and we hold ARMING: nobody reads or writes it.
    unsafe { (&mut *slot.message.get())[..len].copy_from_slice(&text[..len]) };
    slot.message_len.store(len, Ordering::Relaxed);
    slot.start.store(start, Ordering::Relaxed);
    slot.end.store(end, Ordering::Relaxed);
    slot.agent.store(agent, Ordering::Relaxed);
    slot.seq.store(seq, Ordering::Relaxed);
    IN_USE.fetch_add(1, Ordering::AcqRel);
    EVER_ARMED.store(true, Ordering::Release);
    slot.state.store(ARMED, Ordering::Release);
    set_protection(
        start,
        end,
        if device_writes {
            libc::PROT_NONE
        } else {
            libc::PROT_READ
        },
    );
}

/// Disarms the slots overlapping `start..end`; with `collect`, faulted ones
/// are kept for `collect_faults`. Holds ARMING.
fn disarm_overlapping(start: usize, end: usize, collect: bool) {
    for slot in &GUARDS {
        let state = slot.state.load(Ordering::Acquire);
        if state == FREE || !slot.overlaps(start, end) || (collect && state == FAULTED) {
            continue;
        }
        if state == ARMED {
            let pages = slot.pages();
            set_protection(pages.start, pages.end, libc::PROT_READ | libc::PROT_WRITE);
        } else {
            report(slot);
        }
        slot.state.store(FREE, Ordering::Release);
        IN_USE.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Launches touching guarded pinned memory are the runtime's accesses.
pub(crate) fn runtime_access(buffers: &[KernelBuffer]) {
    if IN_USE.load(Ordering::Acquire) == 0 {
        return;
    }
    let _arming = ARMING.lock();
    for b in buffers.iter().filter(|b| b.bytes > 0) {
        let (start, end) = page_range(b.address, b.bytes);
        disarm_overlapping(start, end, true);
    }
}

/// Installs `forget` where pinned memory is freed (Note [Hooks] in
/// hook.rs).
pub(crate) fn install_hooks() {
    crate::memory::pinned::BEFORE_UNMAP.install(forget);
}

/// Pinned memory at `base..base + len` is being freed: its guards are
/// dropped, and so are the ranges released slots still record, so that a
/// fault on the unmapped pages is no longer taken for a guarded access.
pub(crate) fn forget(base: usize, len: usize) {
    if !EVER_ARMED.load(Ordering::Acquire) {
        return;
    }
    let _arming = ARMING.lock();
    let end = base + len;
    disarm_overlapping(base, end, false);
    for slot in GUARDS.iter().filter(|slot| slot.overlaps(base, end)) {
        slot.start.store(0, Ordering::Relaxed);
        slot.end.store(0, Ordering::Relaxed);
    }
}

/// Lifts the guards of copies the host has synchronized with.
pub(crate) fn release_covered(covered: impl Fn(usize, u64) -> bool) {
    if IN_USE.load(Ordering::Acquire) == 0 {
        return;
    }
    let _arming = ARMING.lock();
    for slot in &GUARDS {
        if slot.state.load(Ordering::Acquire) == ARMED
            && covered(
                slot.agent.load(Ordering::Relaxed),
                slot.seq.load(Ordering::Relaxed),
            )
        {
            let pages = slot.pages();
            set_protection(pages.start, pages.end, libc::PROT_READ | libc::PROT_WRITE);
            slot.state.store(FREE, Ordering::Release);
            IN_USE.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Reports the host access a faulted slot caught; returns the report.
fn report(slot: &Slot) -> String {
    crate::diagnostics::sanitizer::add_report(crate::diagnostics::sanitizer::Kind::PinnedHostAccess, message(slot))
}

/// The report a slot was armed with.
fn message(slot: &Slot) -> String {
    let len = slot.message_len.load(Ordering::Relaxed);
    // SAFETY: the slot is armed or faulted: its message was written before.
    String::from_utf8_lossy(unsafe { &(&*slot.message.get())[..len] }).into_owned()
}

/// Moves the host accesses the handler caught into the reports; returns the
/// last one's text.
pub(crate) fn collect_faults() -> Option<String> {
    if IN_USE.load(Ordering::Acquire) == 0 {
        return None;
    }
    let _arming = ARMING.lock();
    let mut last = None;
    for slot in &GUARDS {
        if slot.state.load(Ordering::Acquire) == FAULTED {
            last = Some(report(slot));
            slot.state.store(FREE, Ordering::Release);
            IN_USE.fetch_sub(1, Ordering::AcqRel);
        }
    }
    last
}
