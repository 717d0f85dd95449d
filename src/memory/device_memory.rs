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
//!
//! Note [Shareable device memory]: as CUDA memory can be opened by another
//! process (`cudaIpcGetMemHandle`), each device mapping is a shared mapping
//! of its own memory file (`memfd_create`), whose descriptor the runtime
//! keeps while the mapping lives: `shared_region` hands it out, and another
//! process that receives it (torch.multiprocessing passes descriptors) maps
//! the same pages with `map_shared`. Nothing else changes for the allocator:
//! it still maps whole segments and carves blocks out of them; a receiver
//! maps the whole segment and finds its block at an offset. (Pages of a
//! memory file are shmem pages; the cost is one descriptor per segment.) If
//! a memory file cannot be made (out of descriptors), the mapping is private
//! and anonymous as before, and sharing it is an error.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use parking_lot::Mutex;

use crate::base::error::{Error, Result};
use crate::base::options;

/// Mapping granularity; also the alignment of every device pointer.
pub const PAGE: usize = 4096;

struct Mapping {
    len: usize,
    /// The memory file behind the mapping (None: a private mapping, Note
    /// [Shareable device memory]).
    file: Option<OwnedFd>,
}

struct Mappings {
    open_windows: usize,
    /// base → every live device mapping (its own and other processes').
    live: BTreeMap<usize, Mapping>,
}

static MAPPINGS: Mutex<Mappings> = Mutex::new(Mappings {
    open_windows: 0,
    live: BTreeMap::new(),
});

fn protect_mode() -> bool {
    options::get().memory_protect
}

fn set_access(base: usize, len: usize, accessible: bool) {
    let prot = if accessible {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_NONE
    };
    // SAFETY: (base, len) is a live mapping this module created.
    let rc = unsafe { libc::mprotect(base as *mut libc::c_void, len, prot) };
    debug_assert_eq!(rc, 0, "mprotect of a device mapping failed");
}

fn initial_protection(mappings: &Mappings) -> libc::c_int {
    if !protect_mode() || mappings.open_windows > 0 {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_NONE
    }
}

/// A fresh memory file of `len` bytes, or None when none can be made.
fn memory_file(len: usize) -> Option<OwnedFd> {
    // SAFETY: the name is a NUL-terminated literal.
    let fd = unsafe { libc::memfd_create(c"openreg-device-memory".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: fd is a descriptor we just opened and own.
    let file = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate on our own descriptor.
    (unsafe { libc::ftruncate(file.as_raw_fd(), len as libc::off_t) } == 0).then_some(file)
}

/// Maps `len` bytes (a multiple of `PAGE`) of fresh, zeroed memory.
pub fn map(len: usize) -> Result<usize> {
    debug_assert!(len > 0 && len % PAGE == 0);
    let mut mappings = MAPPINGS.lock();
    let prot = initial_protection(&mappings);
    let file = memory_file(len);
    let (flags, fd) = match &file {
        Some(f) => (libc::MAP_SHARED | libc::MAP_NORESERVE, f.as_raw_fd()),
        None => (
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
        ),
    };
    // SAFETY: a fresh mapping of our own memory file (or anonymous memory).
    let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, 0) };
    if ptr == libc::MAP_FAILED {
        return Err(Error::invalid_value(format!(
            "mapping {len} bytes of device memory failed: {}",
            std::io::Error::last_os_error()
        )));
    }
    mappings.live.insert(ptr as usize, Mapping { len, file });
    Ok(ptr as usize)
}

/// Maps `len` bytes of device memory that another process shares through
/// its memory file `fd` (Note [Shareable device memory]); released by
/// `unmap`. The caller keeps `fd`; the mapping keeps a duplicate, so this
/// process can share the memory onwards.
pub fn map_shared(fd: RawFd, len: usize) -> Result<usize> {
    if len == 0 || len % PAGE != 0 {
        return Err(Error::invalid_value(format!(
            "a shared device mapping of {len} bytes is not whole pages"
        )));
    }
    let failed = |what: &str| {
        Error::invalid_value(format!(
            "{what} {len} bytes of shared device memory (descriptor {fd}) failed: {}",
            std::io::Error::last_os_error()
        ))
    };
    // SAFETY: fcntl on a descriptor the caller vouches for; a bad one fails.
    let duplicate = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if duplicate < 0 {
        return Err(failed("keeping the descriptor of"));
    }
    // SAFETY: a descriptor we just made and own.
    let file = unsafe { OwnedFd::from_raw_fd(duplicate) };
    let mut mappings = MAPPINGS.lock();
    let prot = initial_protection(&mappings);
    // SAFETY: maps a memory file; a descriptor of anything else fails.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(failed("mapping"));
    }
    mappings.live.insert(
        ptr as usize,
        Mapping {
            len,
            file: Some(file),
        },
    );
    Ok(ptr as usize)
}

/// Releases a mapping made by `map` or `map_shared`.
pub fn unmap(base: usize, len: usize) {
    let mut mappings = MAPPINGS.lock();
    mappings.live.remove(&base); // closes its memory file, if any
                                 // SAFETY: (base, len) is a live mapping from `map`, released once.
    unsafe { libc::munmap(base as *mut libc::c_void, len) };
}

/// The mapping that holds device pointer `ptr`: (its memory file, its
/// base, its length), for sharing it with another process.
pub fn shared_region(ptr: usize) -> Result<(RawFd, usize, usize)> {
    let mappings = MAPPINGS.lock();
    let (&base, mapping) = mappings
        .live
        .range(..=ptr)
        .next_back()
        .filter(|(&base, m)| ptr < base + m.len)
        .ok_or_else(|| {
            Error::invalid_value(format!("{ptr:#x} is not device memory of this process"))
        })?;
    let file = mapping.file.as_ref().ok_or_else(|| {
        Error::invalid_value(format!(
            "device memory at {ptr:#x} cannot be shared with another process: it was allocated when no memory file \
             could be made (out of file descriptors?)"
        ))
    })?;
    Ok((file.as_raw_fd(), base, mapping.len))
}

/// The length of the mapping that starts at `base`, if there is one.
pub fn mapping_len(base: usize) -> Option<usize> {
    MAPPINGS.lock().live.get(&base).map(|m| m.len)
}

/// Opens an access window: device memory is accessible to host code until
/// the matching `end_access` (the runtime's own device operations). Free
/// when protection is off.
#[inline]
pub fn begin_access() {
    if protect_mode() {
        let mut mappings = MAPPINGS.lock();
        mappings.open_windows += 1;
        if mappings.open_windows == 1 {
            for (&base, mapping) in &mappings.live {
                set_access(base, mapping.len, true);
            }
        }
    }
}

/// Closes a window opened by `begin_access`.
#[inline]
pub fn end_access() {
    if protect_mode() {
        let mut mappings = MAPPINGS.lock();
        mappings.open_windows -= 1;
        if mappings.open_windows == 0 {
            for (&base, mapping) in &mappings.live {
                set_access(base, mapping.len, false);
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
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(Error::invalid_value(format!(
            "mapping {len} bytes of pinned host memory failed: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(ptr as usize)
}

/// Releases a mapping made by `map_host`.
pub fn unmap_host(base: usize, len: usize) {
    // SAFETY: (base, len) is a live mapping from `map_host`, released once.
    unsafe { libc::munmap(base as *mut libc::c_void, len) };
}
