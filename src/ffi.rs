//! The one bridge between the C++ shim (`cpp/`) and the Rust runtime.
//!
//! Every function here is a short adapter: it converts types and forwards.
//! A Rust `Err` becomes a C++ exception that the shim turns into a
//! `c10::Error` (a Python `RuntimeError`). Functions without `Result` cannot
//! fail and are the only ones the shim calls from `noexcept` methods.
//! Events cross as opaque `usize` handles (see `event::handle`); streams as
//! `(device, id)` values (see Note [StreamId assignment]).

use crate::device;
use crate::error::Result;
use crate::event::{handle, Event};
use crate::stream::{self, StreamId};

#[cxx::bridge(namespace = "openreg::ffi")]
mod bridge {
    // Rust functions the C++ shim calls.
    extern "Rust" {
        // Devices (see Note [Current device], Note [Contexts]).
        fn device_count() -> i8;
        fn current_device() -> i8;
        fn set_device(index: i8) -> Result<()>;
        fn exchange_device(index: i8) -> Result<i8>;
        fn check_device(index: i8) -> Result<()>;
        fn has_primary_context(index: i8) -> Result<bool>;
        fn init() -> Result<()>;
        fn is_initialized() -> bool;
        fn synchronize_device(index: i8) -> Result<()>;
        fn device_supports_quantized(index: i8) -> Result<bool>;

        // Streams.
        fn current_stream(device: i8) -> Result<i64>;
        fn default_stream(device: i8) -> Result<i64>;
        fn pool_stream(device: i8, priority: i32) -> Result<i64>;
        fn exchange_stream(device: i8, id: i64) -> Result<i64>;
        fn check_stream(device: i8, id: i64) -> Result<()>;
        fn stream_native_handle(device: i8, id: i64) -> Result<usize>;
        fn query_stream(device: i8, id: i64) -> Result<bool>;
        fn synchronize_stream(device: i8, id: i64) -> Result<()>;

        // Events; `event` is 0 until the first record creates it.
        unsafe fn record_event(event: &mut usize, event_device: i8, device: i8, id: i64, timing: bool) -> Result<()>;
        unsafe fn block_event(event: usize, device: i8, id: i64) -> Result<()>;
        unsafe fn query_event(event: usize) -> Result<bool>;
        unsafe fn synchronize_event(event: usize) -> Result<()>;
        unsafe fn destroy_event(event: usize);
        unsafe fn event_elapsed_ms(start: usize, end: usize, device: i8) -> Result<f64>;
    }

    // C++ functions the Rust side calls.
    unsafe extern "C++" {
        include!("torch_openreg/cpp/shim.h");

        /// Forwards a warning to `TORCH_WARN` (a Python `UserWarning`). Never throws.
        fn emit_warning(message: &str);
        /// Registers guard, hooks and the backend name with PyTorch.
        fn register_backend() -> Result<()>;
        fn backend_registered() -> bool;
    }
}

pub use bridge::{backend_registered, emit_warning, register_backend};

// Note [Guard hot path]: a c10::DeviceGuard costs an exchange and a restore
// of the current device. These three run as plain C functions rather than
// through cxx, whose per-call unwind guard costs about as much as the work:
// they cannot panic (a const-initialized thread-local `Cell`) and report a
// bad index by return value, after which the shim calls the bridge's
// `exchange_device` for the full error. Declared in cpp/shim.h.

/// This thread's current device.
#[no_mangle]
pub extern "C" fn openreg_guard_current_device() -> i8 {
    device::current_device()
}

/// Exchanges the current device; -1 (and no change) for an invalid index.
#[no_mangle]
pub extern "C" fn openreg_guard_exchange_device(index: i8) -> i8 {
    device::exchange_device(index.into()).unwrap_or(-1)
}

/// Restores a device; an invalid index is ignored with a one-time warning.
#[no_mangle]
pub extern "C" fn openreg_guard_unchecked_set_device(index: i8) {
    device::unchecked_set_device(index.into())
}

fn device_count() -> i8 {
    device::device_count() as i8
}

fn current_device() -> i8 {
    device::current_device()
}

fn set_device(index: i8) -> Result<()> {
    device::set_device(index.into())
}

fn exchange_device(index: i8) -> Result<i8> {
    device::exchange_device(index.into())
}

fn check_device(index: i8) -> Result<()> {
    device::check_index(index.into()).map(drop)
}

fn has_primary_context(index: i8) -> Result<bool> {
    device::has_primary_context(index.into())
}

fn init() -> Result<()> {
    device::init()
}

fn is_initialized() -> bool {
    device::is_initialized()
}

fn synchronize_device(index: i8) -> Result<()> {
    device::synchronize_device(device::resolve(index.into()))
}

fn device_supports_quantized(index: i8) -> Result<bool> {
    Ok(device::properties(device::resolve(index.into()))?.supports_quantized)
}

fn current_stream(device: i8) -> Result<i64> {
    let device = device::check_index(device::resolve(device.into()))?;
    Ok(stream::current_stream_id(device))
}

fn default_stream(device: i8) -> Result<i64> {
    device::check_index(device::resolve(device.into()))?;
    Ok(stream::DEFAULT_STREAM_ID)
}

fn pool_stream(device: i8, priority: i32) -> Result<i64> {
    Ok(device::context(device::resolve(device.into()))?.streams.from_pool(priority).id())
}

fn exchange_stream(device: i8, id: i64) -> Result<i64> {
    let device = device::check_index(device::resolve(device.into()))?;
    stream::exchange_current_stream(device, id as StreamId)
}

fn check_stream(device: i8, id: i64) -> Result<()> {
    let device = device::check_index(device::resolve(device.into()))?;
    stream::check_stream_id(device, id)
}

fn stream_native_handle(device: i8, id: i64) -> Result<usize> {
    Ok(stream::lookup(device.into(), id)? as *const stream::StreamQueue as usize)
}

fn query_stream(device: i8, id: i64) -> Result<bool> {
    Ok(stream::lookup(device.into(), id)?.query())
}

fn synchronize_stream(device: i8, id: i64) -> Result<()> {
    stream::lookup(device.into(), id)?.synchronize()
}

/// # Safety
/// `event` is 0 or a handle from an earlier `record_event` not yet destroyed.
unsafe fn record_event(event: &mut usize, event_device: i8, device: i8, id: i64, timing: bool) -> Result<()> {
    let stream = stream::lookup(device.into(), id)?;
    if *event == 0 {
        // PyTorch passes -1 for an event that has not taken a device yet: it
        // belongs to the device of the stream that first records it.
        let owner = if event_device == -1 { stream.device().into() } else { event_device.into() };
        *event = handle::into_raw(Event::new(owner, timing)?) as usize;
    }
    // SAFETY: per this function's contract.
    unsafe { handle::get(*event as *const Event) }?.record(stream)
}

/// # Safety
/// `event` is 0 or a live handle.
unsafe fn block_event(event: usize, device: i8, id: i64) -> Result<()> {
    if event == 0 {
        return Ok(()); // never recorded: nothing to wait for
    }
    let stream = stream::lookup(device.into(), id)?;
    // SAFETY: per this function's contract.
    unsafe { handle::get(event as *const Event) }?.block(stream)
}

/// # Safety
/// `event` is 0 or a live handle.
unsafe fn query_event(event: usize) -> Result<bool> {
    if event == 0 {
        return Ok(true);
    }
    // SAFETY: per this function's contract.
    Ok(unsafe { handle::get(event as *const Event) }?.query())
}

/// # Safety
/// `event` is 0 or a live handle.
unsafe fn synchronize_event(event: usize) -> Result<()> {
    if event == 0 {
        return Ok(());
    }
    // SAFETY: per this function's contract.
    unsafe { handle::get(event as *const Event) }?.synchronize()
}

/// # Safety
/// `event` is 0 or a live handle; it is invalid afterwards.
unsafe fn destroy_event(event: usize) {
    // SAFETY: per this function's contract.
    unsafe { handle::release(event as *const Event) }
}

/// # Safety
/// Both are 0 or live handles.
unsafe fn event_elapsed_ms(start: usize, end: usize, device: i8) -> Result<f64> {
    device::check_index(device.into())?;
    // SAFETY: per this function's contract.
    let (start, end) = unsafe { (handle::get(start as *const Event)?, handle::get(end as *const Event)?) };
    Event::elapsed_ms(&start, &end)
}
