//! Stopping and restarting a device (Note [Stopped devices], Note [Device
//! memory generations]), through the runtime and through the C ABI. Its own
//! test binary: a restart makes every live allocation of the device stale.

use std::ffi::{c_void, CStr};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use torch_openreg::runtime::allocator;
use torch_openreg::bridge::capi::*;
use torch_openreg::runtime::device;
use torch_openreg::runtime::device_stop;
use torch_openreg::base::error::ErrorKind;
use torch_openreg::runtime::event::Event;
use torch_openreg::runtime::stream::Task;

fn counting(counter: &Arc<AtomicUsize>) -> Task {
    let counter = Arc::clone(counter);
    Task::Run(Box::new(move || {
        counter.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }))
}

fn sleep_task(ms: u64) -> Task {
    Task::Run(Box::new(move || {
        Ok(thread::sleep(Duration::from_millis(ms)))
    }))
}

fn last_message() -> String {
    // SAFETY: orGetLastErrorMessage returns a NUL-terminated thread-local string.
    unsafe { CStr::from_ptr(orGetLastErrorMessage()) }
        .to_string_lossy()
        .into_owned()
}

extern "C" fn nothing(_: *mut c_void) {}

/// One test, in steps: they stop devices other steps use.
#[test]
fn stop_and_restart() {
    // A third device, never used, so no context is created for it.
    std::env::set_var("OPENREG_DEVICE_COUNT", "3");
    stop_abandons_rejects_and_restart_makes_old_memory_stale();
    c_abi_stop_and_restart();
    a_device_without_a_context_stays_without_one();
}

fn stop_abandons_rejects_and_restart_makes_old_memory_stale() {
    let ctx = device::context(1).unwrap();
    let stream = ctx.streams.from_pool(0);
    let other_device = device::context(0).unwrap().streams.from_pool(0);

    // Work queued behind a running kernel: the kernel finishes, the rest is
    // abandoned.
    let old = ctx
        .allocator
        .malloc(4096, stream)
        .map_err(|e| e.error)
        .unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    stream.submit(sleep_task(200)).unwrap();
    thread::sleep(Duration::from_millis(50)); // the worker has started it
    for _ in 0..3 {
        stream.submit(counting(&ran)).unwrap();
    }
    assert_eq!(device_stop::stop(1).unwrap(), 3);
    assert!(device_stop::is_stopped(1) && !device_stop::is_stopped(0));

    // New work for the device fails, naming it; other devices are unaffected.
    let error = stream.submit(counting(&ran)).unwrap_err();
    assert_eq!(error.kind, ErrorKind::DeviceStopped);
    assert!(
        error
            .message
            .starts_with("openreg device 1 is stopped (torch.openreg.stop_device(1))"),
        "{}",
        error.message
    );
    assert!(!stream.try_begin_inline(torch_openreg::runtime::stream::TaskName::INLINE));
    let alloc = ctx.allocator.malloc(64, stream).err().unwrap();
    assert!(!alloc.out_of_memory && alloc.error.kind == ErrorKind::DeviceStopped);
    let event = Event::new(1, false).unwrap();
    assert_eq!(
        event.record(stream).unwrap_err().kind,
        ErrorKind::DeviceStopped
    );
    other_device.submit(counting(&ran)).unwrap();
    other_device.synchronize().unwrap();
    assert_eq!(device_stop::stop(1).unwrap_err().message, "stop_device: openreg device 1 is already stopped (torch.openreg.restart_device(1) brings it back)");

    // The next synchronize waits for the running kernel and reports the
    // abandoned ones, once; they never ran.
    let message = stream.synchronize().unwrap_err().message;
    assert_eq!(message, format!("{stream}: 3 queued kernels were abandoned because openreg device 1 was stopped (torch.openreg.stop_device)"));
    stream.synchronize().unwrap();
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "only the other device's task ran"
    );
    assert!(
        allocator::is_current(old),
        "stopping alone does not make memory stale"
    );

    // Restart: work is accepted again; the allocation from before is stale
    // (still mapped, so freeing it is fine) and new ones are not.
    device_stop::restart(1).unwrap();
    assert!(device_stop::restart(1)
        .unwrap_err()
        .message
        .contains("openreg device 1 is not stopped"));
    stream.submit(counting(&ran)).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 2);
    assert!(!allocator::is_current(old));
    let stale = allocator::check_current(old).unwrap_err().message;
    assert!(
        stale.contains("(4096 bytes at ")
            && stale.contains("allocated on device 1 before torch.openreg.restart_device(1)"),
        "{stale}"
    );
    let fresh = ctx
        .allocator
        .malloc(4096, stream)
        .map_err(|e| e.error)
        .unwrap();
    assert!(
        allocator::is_current(fresh) && allocator::is_current(0) && allocator::is_current(12345)
    );
    // SAFETY: `old` is 4096 bytes of mapped device memory: stale memory
    // stays mapped until freed (Note [Device memory generations]).
    unsafe { std::ptr::write_bytes(old as *mut u8, 7, 4096) };
    ctx.allocator.free(old).unwrap();
    assert!(
        allocator::is_current(old),
        "freed, the address is no longer a stale allocation"
    );
    ctx.allocator.free(fresh).unwrap();
}

fn a_device_without_a_context_stays_without_one() {
    assert_eq!(device::device_count(), 3);
    assert_eq!(device_stop::stop(2).unwrap(), 0);
    device_stop::restart(2).unwrap();
    assert!(!device::has_primary_context(2).unwrap());
}

fn c_abi_stop_and_restart() {
    let mut stream = null_mut();
    assert_eq!(orStreamGetFromPool(0, -1, &mut stream), OR_SUCCESS);
    let mut stopped = -1;
    assert_eq!(orDeviceIsStopped(0, &mut stopped), OR_SUCCESS);
    assert_eq!(stopped, 0);
    assert_eq!(orDeviceStop(0), OR_SUCCESS, "{}", last_message());
    assert_eq!(orDeviceIsStopped(0, &mut stopped), OR_SUCCESS);
    assert_eq!(stopped, 1);
    assert_eq!(orLaunchHostFunc(stream, Some(nothing), null_mut()), 9);
    assert!(
        last_message().contains("openreg device 0 is stopped"),
        "{}",
        last_message()
    );
    // SAFETY: orGetErrorString returns a static NUL-terminated string.
    let text = unsafe { CStr::from_ptr(orGetErrorString(9)) }
        .to_string_lossy()
        .into_owned();
    assert!(text.contains("stopped"), "{text}");
    assert_eq!(orDeviceStop(0), 2);
    assert_eq!(
        orStreamSynchronize(stream),
        OR_SUCCESS,
        "nothing was queued: {}",
        last_message()
    );
    assert_eq!(orDeviceRestart(0), OR_SUCCESS, "{}", last_message());
    assert_eq!(orDeviceRestart(0), 2);
    assert_eq!(
        orLaunchHostFunc(stream, Some(nothing), null_mut()),
        OR_SUCCESS
    );
    assert_eq!(orStreamSynchronize(stream), OR_SUCCESS);
    assert_eq!(orDeviceStop(99), 1, "an invalid device index");
    assert_eq!(orDeviceIsStopped(0, null_mut()), 2);
}
