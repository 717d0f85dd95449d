//! Raw device memory: page-aligned host mappings that the runtime owns, with
//! a per-device capacity so running out is real.
//!
//! Note [Memory protection]: with `OPENREG_MEMORY_PROTECT=1` every device
//! mapping is `PROT_NONE` while no device operation runs, so host code that
//! reads device memory directly faults loudly. Device operations (kernels,
//! copies, fallbacks) open an `AccessWindow`, which makes every mapping
//! readable and writable until the last open window closes. Host code that
//! races with a running device operation is not caught: this is a debugging
//! aid, not isolation.

use std::collections::BTreeMap;

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::options;

/// Mapping granularity; also the alignment of every device pointer.
pub const PAGE: usize = 4096;

struct Protection {
    open_windows: usize,
    /// base → length of every live mapping (only tracked in protect mode).
    mappings: BTreeMap<usize, usize>,
}

static PROTECTION: Mutex<Protection> = Mutex::new(Protection { open_windows: 0, mappings: BTreeMap::new() });

fn protect_mode() -> bool {
    options::get().memory_protect
}

fn set_access(base: usize, len: usize, accessible: bool) {
    let prot = if accessible { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_NONE };
    // SAFETY: (base, len) is a live mapping this module created.
    let rc = unsafe { libc::mprotect(base as *mut libc::c_void, len, prot) };
    debug_assert_eq!(rc, 0, "mprotect of a device mapping failed");
}

/// Maps `len` bytes (a multiple of `PAGE`) of fresh, zeroed memory.
pub fn map(len: usize) -> Result<usize> {
    debug_assert!(len > 0 && len % PAGE == 0);
    let mut protection = PROTECTION.lock();
    let accessible = !protect_mode() || protection.open_windows > 0;
    let prot = if accessible { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_NONE };
    // SAFETY: an anonymous private mapping has no preconditions.
    let ptr = unsafe {
        libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0)
    };
    if ptr == libc::MAP_FAILED {
        return Err(Error::invalid_value(format!(
            "mapping {len} bytes of device memory failed: {}",
            std::io::Error::last_os_error()
        )));
    }
    if protect_mode() {
        protection.mappings.insert(ptr as usize, len);
    }
    Ok(ptr as usize)
}

/// Releases a mapping made by `map`.
pub fn unmap(base: usize, len: usize) {
    let mut protection = PROTECTION.lock();
    protection.mappings.remove(&base);
    // SAFETY: (base, len) is a live mapping from `map`, released once.
    unsafe { libc::munmap(base as *mut libc::c_void, len) };
}

/// Opens an access window: device memory is accessible to host code until
/// the matching `end_access` (the runtime's own device operations). Free
/// when protection is off.
#[inline]
pub fn begin_access() {
    if protect_mode() {
        let mut protection = PROTECTION.lock();
        protection.open_windows += 1;
        if protection.open_windows == 1 {
            for (&base, &len) in &protection.mappings {
                set_access(base, len, true);
            }
        }
    }
}

/// Closes a window opened by `begin_access`.
#[inline]
pub fn end_access() {
    if protect_mode() {
        let mut protection = PROTECTION.lock();
        protection.open_windows -= 1;
        if protection.open_windows == 0 {
            for (&base, &len) in &protection.mappings {
                set_access(base, len, false);
            }
        }
    }
}

/// `begin_access` for the lifetime of the value.
pub struct AccessWindow(());

impl AccessWindow {
    #[inline]
    pub fn open() -> AccessWindow {
        begin_access();
        AccessWindow(())
    }
}

impl Drop for AccessWindow {
    fn drop(&mut self) {
        end_access();
    }
}

/// Maps `len` bytes of ordinary host memory (pinned host allocations: never
/// protected).
pub fn map_host(len: usize) -> Result<usize> {
    // SAFETY: an anonymous private mapping has no preconditions.
    let ptr = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
    };
    if ptr == libc::MAP_FAILED {
        return Err(Error::invalid_value(format!("mapping {len} bytes of pinned host memory failed: {}", std::io::Error::last_os_error())));
    }
    Ok(ptr as usize)
}

/// Releases a mapping made by `map_host`.
pub fn unmap_host(base: usize, len: usize) {
    // SAFETY: (base, len) is a live mapping from `map_host`, released once.
    unsafe { libc::munmap(base as *mut libc::c_void, len) };
}
