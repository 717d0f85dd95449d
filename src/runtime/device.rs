//! Devices: how many there are, which one is current on this thread, and
//! their lazily created contexts.
//!
//! Note [Current device]: the current device is a per-thread value, so
//! reading or exchanging it takes no lock, allocation or syscall. It lives in
//! C++, in an initial-exec thread-local that the device guard reaches inline
//! (Note [Current device slot] in cpp/device/current_device.h); this module reads
//! and writes that one slot through its two accessors. Setting the device
//! that is already current changes nothing (and creates no context), which
//! keeps `c10::DeviceGuard` round trips to the same device free.
//!
//! Note [Contexts]: a device's context (its streams) is created on first use
//! of a resource of that device — a stream operation, an event record, a
//! synchronize — not by making the device current. `has_primary_context`
//! reports whether that happened, and never creates one itself.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use crate::runtime::allocator::DeviceAllocator;
use crate::base::error::{Error, ErrorKind, Result};
use crate::base::options::{self, MAX_DEVICES};
use crate::runtime::stream::DeviceStreams;

pub type DeviceIndex = i8;

/// Fixed facts about one simulated device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceProperties {
    pub name: String,
    pub index: DeviceIndex,
    pub major: i32,
    pub minor: i32,
    pub multi_processor_count: i32,
    /// Capacity in bytes (`OPENREG_DEVICE_MEMORY`).
    pub total_memory: usize,
    /// The dtypes that work here, as a set of `c10::ScalarType` codes (bit
    /// `n` for code `n`): what `getDeviceCapability` reports.
    pub supported_scalar_types: u64,
    /// Stable for the device index across processes, as a GPU's UUID is for
    /// the physical device: "openreg" in ASCII, then the index.
    pub uuid: [u8; 16],
}

/// `c10::ScalarType` codes (torch/headeronly/core/ScalarType.h; stable, as
/// PyTorch's serialization format relies on them) of the dtypes a tensor of
/// this device can hold and convert: creating one and converting it to
/// another supported dtype and back works (tests/python/test_dtypes.py
/// checks every torch dtype both ways). Left out: the quantized dtypes (no
/// kernels here), and the bit-packed (`bits*`) and sub-byte (`int1`..`int7`,
/// `uint1`..`uint7`, `float4_e2m1fn_x2`) ones, which even PyTorch's CPU
/// kernels cannot convert ("copy_ not implemented").
pub const SUPPORTED_SCALAR_TYPES: &[(u32, &str)] = &[
    (0, "Byte"),
    (1, "Char"),
    (2, "Short"),
    (3, "Int"),
    (4, "Long"),
    (5, "Half"),
    (6, "Float"),
    (7, "Double"),
    (8, "ComplexHalf"),
    (9, "ComplexFloat"),
    (10, "ComplexDouble"),
    (11, "Bool"),
    (15, "BFloat16"),
    (23, "Float8_e5m2"),
    (24, "Float8_e4m3fn"),
    (25, "Float8_e5m2fnuz"),
    (26, "Float8_e4m3fnuz"),
    (27, "UInt16"),
    (28, "UInt32"),
    (29, "UInt64"),
    (44, "Float8_e8m0fnu"),
    (46, "BComplex32"),
];

const fn scalar_type_set(types: &[(u32, &str)]) -> u64 {
    let mut bits = 0u64;
    let mut i = 0;
    while i < types.len() {
        bits |= 1 << types[i].0;
        i += 1;
    }
    bits
}

/// What exists once a device has been used: its streams and its memory.
pub struct DeviceContext {
    pub index: DeviceIndex,
    pub streams: DeviceStreams,
    pub allocator: DeviceAllocator,
}

// The current-device slot (Note [Current device slot] in
// cpp/device/current_device.h), defined in cpp/device/current_device.cpp.
extern "C" {
    fn openreg_current_device_get() -> DeviceIndex;
    fn openreg_current_device_set(index: DeviceIndex);
}

#[inline]
fn slot() -> DeviceIndex {
    // SAFETY: reads this thread's slot; cannot fail.
    unsafe { openreg_current_device_get() }
}

#[inline]
fn set_slot(index: DeviceIndex) {
    // SAFETY: writes this thread's slot; cannot fail.
    unsafe { openreg_current_device_set(index) }
}

static CONTEXTS: [OnceLock<DeviceContext>; MAX_DEVICES] = [const { OnceLock::new() }; MAX_DEVICES];
static INITIALIZED: AtomicBool = AtomicBool::new(false);
static IN_BAD_FORK: AtomicBool = AtomicBool::new(false);

/// The number of devices; never fails (0 when misconfigured).
#[inline]
pub fn device_count() -> usize {
    options::get().device_count
}

/// Checks that `index` names an existing device.
#[inline]
pub fn check_index(index: i64) -> Result<DeviceIndex> {
    let count = device_count();
    if index >= 0 && (index as usize) < count {
        Ok(index as DeviceIndex)
    } else {
        Err(invalid_device(index, count))
    }
}

#[cold]
fn invalid_device(index: i64, count: usize) -> Error {
    if count == 0 {
        Error::new(ErrorKind::NoDevice, format!("openreg device index {index} is invalid: no openreg devices are available (OPENREG_DEVICE_COUNT)"))
    } else {
        Error::new(
            ErrorKind::InvalidDevice,
            format!("openreg device index {index} is out of range: there are {count} devices (valid indices 0..{})", count - 1),
        )
    }
}

/// This thread's current device. A thread starts on device 0.
#[inline]
pub fn current_device() -> DeviceIndex {
    slot()
}

/// `index`, or this thread's current device when `index` is -1 (PyTorch's
/// "no index" convention). Not validated: callers check it.
#[inline]
pub fn resolve(index: i64) -> i64 {
    if index == -1 {
        current_device() as i64
    } else {
        index
    }
}

/// Makes `index` current on this thread after checking it.
#[inline]
pub fn set_device(index: i64) -> Result<()> {
    let index = check_index(index)?;
    set_slot(index);
    Ok(())
}

/// Makes `index` current and returns the previous current device.
#[inline]
pub fn exchange_device(index: i64) -> Result<DeviceIndex> {
    let index = check_index(index)?;
    let previous = slot();
    set_slot(index);
    Ok(previous)
}

/// For `noexcept` callers: an invalid index leaves the device unchanged and
/// warns once instead of failing.
pub fn unchecked_set_device(index: i64) {
    match check_index(index) {
        Ok(index) => set_slot(index),
        Err(e) => crate::base::error::warn_once(&format!("uncheckedSetDevice ignored: {e}")),
    }
}

/// Marks the runtime initialized (idempotent). Checks the fork state, so a
/// forked child of an initialized parent is told, not left to hang, and the
/// options, so an invalid `OPENREG_*` value fails here, every time, naming
/// the variable (Note [Invalid options]); the runtime then stays
/// uninitialized. The first initialization warns about `OPENREG_*`
/// variables that are no option (Note [Unknown options]).
pub fn init() -> Result<()> {
    check_not_in_bad_fork()?;
    options::get().check()?;
    if !INITIALIZED.swap(true, Ordering::AcqRel) {
        for message in options::unknown_variables_in_environment() {
            crate::base::error::warn_once(&message); // Note [Unknown options]
        }
        crate::runtime::lifecycle::on_first_init();
    }
    Ok(())
}

pub fn is_initialized() -> bool {
    INITIALIZED.load(Ordering::Acquire)
}

#[inline]
pub fn check_not_in_bad_fork() -> Result<()> {
    if IN_BAD_FORK.load(Ordering::Relaxed) {
        return Err(Error::new(
            ErrorKind::BadFork,
            "Cannot re-initialize openreg in forked subprocess. To use openreg with multiprocessing, \
             you must use the 'spawn' start method",
        ));
    }
    Ok(())
}

pub fn is_in_bad_fork() -> bool {
    IN_BAD_FORK.load(Ordering::Relaxed)
}

/// Called in a fork child: the parent's worker threads do not exist here.
pub(crate) fn mark_forked_child() {
    if is_initialized() {
        IN_BAD_FORK.store(true, Ordering::Relaxed);
    }
}

/// The context of `index`, created on first use. See Note [Contexts].
#[inline]
pub fn context(index: i64) -> Result<&'static DeviceContext> {
    let index = check_index(index)?;
    check_not_in_bad_fork()?;
    if let Some(ctx) = CONTEXTS[index as usize].get() {
        return Ok(ctx);
    }
    create_context(index)
}

#[cold]
fn create_context(index: DeviceIndex) -> Result<&'static DeviceContext> {
    init()?;
    Ok(CONTEXTS[index as usize].get_or_init(|| DeviceContext {
        index,
        streams: DeviceStreams::new(index),
        allocator: DeviceAllocator::new(index),
    }))
}

/// Whether device `index`'s context exists; never creates it.
pub fn has_primary_context(index: i64) -> Result<bool> {
    let index = check_index(index)?;
    Ok(CONTEXTS[index as usize].get().is_some())
}

/// Every context created so far (for whole-runtime operations like shutdown).
pub fn existing_contexts() -> impl Iterator<Item = &'static DeviceContext> {
    CONTEXTS.iter().filter_map(OnceLock::get)
}

/// The compute capability a device reports: under `OPENREG_DTYPES=cuda`
/// that of the GPU whose dtype support it follows (an H100's, as
/// `torch_openreg._op_db.GPU_CAPABILITY` evaluates op_db), so code that asks
/// `get_device_capability() >= (8, 0)` before using bfloat16 finds it;
/// otherwise the simulated architecture's own 1.0.
pub fn compute_capability() -> (i32, i32) {
    match options::get().dtypes {
        options::DtypePolicy::Cuda => (9, 0),
        options::DtypePolicy::Cpu | options::DtypePolicy::Record => (1, 0),
    }
}

pub fn properties(index: i64) -> Result<DeviceProperties> {
    let index = check_index(index)?;
    let (major, minor) = compute_capability();
    Ok(DeviceProperties {
        name: format!("OpenReg Simulated Device {index}"),
        index,
        major,
        minor,
        multi_processor_count: std::thread::available_parallelism().map_or(1, |n| n.get() as i32),
        total_memory: options::get().device_memory,
        supported_scalar_types: scalar_type_set(SUPPORTED_SCALAR_TYPES),
        uuid: device_uuid(index),
    })
}

fn device_uuid(index: DeviceIndex) -> [u8; 16] {
    let mut uuid = [0u8; 16];
    uuid[..7].copy_from_slice(b"openreg");
    uuid[15] = index as u8;
    uuid
}

/// Whether `device` can use memory of `peer` directly: any two devices can
/// (all device memory is host memory), as CUDA's peer access says for
/// devices of one NVLink island. Both indices must name devices.
pub fn can_access_peer(device: i64, peer: i64) -> Result<bool> {
    check_index(device)?;
    check_index(peer)?;
    Ok(true)
}

/// Waits for every stream of device `index` (a user's synchronize: the
/// host is then ordered after all of their work, Note [Stream sanitizer]).
pub fn synchronize_device(index: i64) -> Result<()> {
    let streams = &context(index)?.streams;
    let point = crate::runtime::hooks::order_point(&streams.all());
    streams.synchronize_all()?;
    match point {
        Some(point) => crate::runtime::hooks::host_waited_for(&point, false),
        None => Ok(()),
    }
}
