//! Stopping and restarting a device (`torch.openreg.stop_device(i)` /
//! `restart_device(i)`, `orDeviceStop` / `orDeviceRestart`): what a test of
//! a program's error handling needs to simulate a device that goes away and
//! comes back.
//!
//! Note [Stopped devices]: `stop` marks the device stopped, then abandons
//! the work queued on its streams that has not started (as the exit drain
//! does: `StreamQueue::abandon_queued`; the abandoned kernels and what they
//! captured are dropped, not leaked); each stream's next synchronize
//! reports how many of its kernels were abandoned, once (a restart does not
//! discard that report). A kernel already running finishes on its own
//! thread: a host thread cannot be cancelled. While the device is stopped,
//! new work for it fails with an error naming the device and saying it is
//! stopped (`ErrorKind::DeviceStopped`): a launch on any of its streams
//! (`StreamQueue::submit_named` checks under the queue's lock, which `stop`
//! takes when it abandons, so nothing submitted after `stop` returns can
//! slip in), an allocation, an event record. Waiting, querying and freeing
//! still work, so a program can clean up. `restart` makes the device accept
//! work again and begins a new memory generation (Note [Device memory
//! generations] in allocator.rs): tensors allocated before it raise a clear
//! error when used. A graph captured before a restart still replays, on the
//! memory it captured (its pool keeps that mapped): its recorded kernels
//! made their CPU views at capture. Stopping a stopped device, or
//! restarting a running one, is an error: each call says what it expected.

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use crate::runtime::device::{self, DeviceIndex};
use crate::base::error::{Error, ErrorKind, Result};
use crate::base::options::MAX_DEVICES;

static STOPPED: [AtomicBool; MAX_DEVICES] = [const { AtomicBool::new(false) }; MAX_DEVICES];

/// Serializes stops and restarts (they are rare; the checks take no lock).
static TRANSITIONS: Mutex<()> = Mutex::new(());

/// Whether device `index` (a checked index) is stopped.
#[inline]
pub fn is_stopped(index: DeviceIndex) -> bool {
    STOPPED[index as usize].load(Ordering::Acquire)
}

/// Ok unless device `index` (a checked index) is stopped; then the error
/// that new work for it gets.
#[inline]
pub fn check_running(index: DeviceIndex) -> Result<()> {
    match is_stopped(index) {
        false => Ok(()),
        true => Err(stopped_error(index)),
    }
}

#[cold]
fn stopped_error(index: DeviceIndex) -> Error {
    Error::new(
        ErrorKind::DeviceStopped,
        format!(
            "openreg device {index} is stopped (torch.openreg.stop_device({index})): it accepts no new work until \
             torch.openreg.restart_device({index})"
        ),
    )
}

/// Stops device `index` (Note [Stopped devices]); returns how many queued
/// kernels were abandoned. Creates no context.
pub fn stop(index: i64) -> Result<usize> {
    let index = device::check_index(index)?;
    device::check_not_in_bad_fork()?;
    let _transition = TRANSITIONS.lock();
    if STOPPED[index as usize].swap(true, Ordering::AcqRel) {
        return Err(Error::invalid_value(format!(
            "stop_device: openreg device {index} is already stopped (torch.openreg.restart_device({index}) brings it back)"
        )));
    }
    let why = format!("because openreg device {index} was stopped (torch.openreg.stop_device)");
    let tasks = match device::has_primary_context(index.into())? {
        true => device::context(index.into())?.streams.abandon_all(&why),
        false => Vec::new(),
    };
    let abandoned = tasks.len();
    // Dropped here, outside the streams' locks: a kernel's captures may
    // release a host object that takes the host's own lock (kernel.h).
    drop(tasks);
    crate::base::log::log(
        crate::base::log::Level::Info,
        &format!("stop_device: device {index} stopped; {abandoned} queued kernels abandoned"),
    );
    Ok(abandoned)
}

/// Brings back the stopped device `index` with a new memory generation
/// (Note [Stopped devices]).
pub fn restart(index: i64) -> Result<()> {
    let index = device::check_index(index)?;
    device::check_not_in_bad_fork()?;
    let _transition = TRANSITIONS.lock();
    if !is_stopped(index) {
        return Err(Error::invalid_value(format!(
            "restart_device: openreg device {index} is not stopped (torch.openreg.stop_device({index}) stops it first)"
        )));
    }
    if device::has_primary_context(index.into())? {
        device::context(index.into())?.allocator.begin_generation();
    }
    STOPPED[index as usize].store(false, Ordering::Release);
    crate::base::log::log(
        crate::base::log::Level::Info,
        &format!("restart_device: device {index} restarted"),
    );
    Ok(())
}
