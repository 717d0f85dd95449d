//! The C ABI's event calls (include/openreg.h), called as a C program would:
//! handles are validated (Note [Event handles] in src/runtime/event.rs), and a
//! stream may wait on an event of another device.

use std::ffi::{c_void, CStr};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use torch_openreg::bridge::capi::*;

const INVALID_HANDLE: OrError = 3;
const INVALID_VALUE: OrError = 2;

fn last_message() -> String {
    // SAFETY: orGetLastErrorMessage returns a NUL-terminated thread-local string.
    unsafe { CStr::from_ptr(orGetLastErrorMessage()) }
        .to_string_lossy()
        .into_owned()
}

fn ok(code: OrError) {
    assert_eq!(code, OR_SUCCESS, "{}", last_message());
}

fn create_event(timing: bool) -> *mut c_void {
    let mut e = null_mut();
    ok(orEventCreate(
        &mut e,
        if timing { 0 } else { OR_EVENT_DISABLE_TIMING },
    ));
    assert!(!e.is_null());
    e
}

fn pool_stream(device: i32) -> *mut c_void {
    let mut s = null_mut();
    ok(orStreamGetFromPool(device, 0, &mut s));
    s
}

/// Asserts that every event call rejects `bad` as an invalid handle, with a
/// message, and leaves `good` (a live, recorded event) working.
fn assert_rejected_everywhere(bad: *mut c_void, good: *mut c_void, what: &str) {
    let s = pool_stream(0);
    let mut ms = 0f32;
    let ms = &mut ms as *mut f32;
    let calls: [(&str, Box<dyn Fn() -> OrError>); 8] = [
        ("orEventRecord", Box::new(|| orEventRecord(bad, s))),
        ("orEventQuery", Box::new(|| orEventQuery(bad))),
        ("orEventSynchronize", Box::new(|| orEventSynchronize(bad))),
        ("orStreamWaitEvent", Box::new(|| orStreamWaitEvent(s, bad))),
        (
            "orEventElapsedTime (start)",
            Box::new(|| orEventElapsedTime(ms, bad, good)),
        ),
        (
            "orEventElapsedTime (end)",
            Box::new(|| orEventElapsedTime(ms, good, bad)),
        ),
        ("orEventDestroy", Box::new(|| orEventDestroy(bad))),
        ("orEventDestroy again", Box::new(|| orEventDestroy(bad))),
    ];
    for (name, call) in &calls {
        assert_eq!(call(), INVALID_HANDLE, "{name} with {what}");
        let message = last_message();
        assert!(
            message.contains("event handle"),
            "{name} with {what}: {message}"
        );
    }
    ok(orEventQuery(good));
    ok(orEventSynchronize(good));
}

fn recorded_timing_event() -> *mut c_void {
    let e = create_event(true);
    ok(orEventRecord(e, pool_stream(0)));
    ok(orEventSynchronize(e));
    e
}

#[test]
fn double_destroy_is_an_invalid_handle() {
    let e = create_event(false);
    ok(orEventDestroy(e));
    assert_eq!(orEventDestroy(e), INVALID_HANDLE);
    assert!(
        last_message().contains("not a live openreg event handle"),
        "{}",
        last_message()
    );
}

#[test]
fn use_after_destroy_is_an_invalid_handle() {
    let good = recorded_timing_event();
    let e = create_event(true);
    ok(orEventRecord(e, pool_stream(0)));
    ok(orEventDestroy(e));
    assert_rejected_everywhere(e, good, "a destroyed event");
    ok(orEventDestroy(good));
}

#[test]
fn a_destroyed_handle_stays_invalid_when_its_slot_is_reused() {
    // Creating events right after a destroy reuses the freed slot: the old
    // handle must not name the new event.
    let good = recorded_timing_event();
    let old = create_event(false);
    ok(orEventDestroy(old));
    let fresh: Vec<_> = (0..4).map(|_| create_event(false)).collect();
    assert!(
        !fresh.contains(&old),
        "a new event got a destroyed handle back"
    );
    assert_rejected_everywhere(old, good, "a destroyed event whose slot was reused");
    for e in fresh {
        ok(orEventQuery(e)); // untouched by the calls on `old`
        ok(orEventDestroy(e));
    }
    ok(orEventDestroy(good));
}

#[test]
fn garbage_and_null_handles_are_invalid() {
    let good = recorded_timing_event();
    let local = 42u64;
    let boxed = Box::new([0u8; 256]);
    let garbage: [(*mut c_void, &str); 5] = [
        (0x1234 as *mut c_void, "0x1234"),
        (
            &local as *const u64 as *mut c_void,
            "the address of a local",
        ),
        (
            boxed.as_ptr() as *mut c_void,
            "the address of a heap object",
        ),
        (pool_stream(0), "a stream handle"),
        (usize::MAX as *mut c_void, "all ones"),
    ];
    for (bad, what) in garbage {
        assert_rejected_everywhere(bad, good, what);
    }
    assert_rejected_everywhere(null_mut(), good, "null");
    assert!(last_message().contains("null"), "{}", last_message());
    ok(orEventDestroy(good));
}

static DONE: AtomicBool = AtomicBool::new(false);
static SEEN: AtomicBool = AtomicBool::new(false);

extern "C" fn slow_then_flag(_: *mut c_void) {
    thread::sleep(Duration::from_millis(150));
    DONE.store(true, Ordering::SeqCst);
}

extern "C" fn observe(_: *mut c_void) {
    SEEN.store(DONE.load(Ordering::SeqCst), Ordering::SeqCst);
}

#[test]
fn a_stream_waits_on_an_event_of_another_device_through_the_c_abi() {
    ok(orSetDevice(0));
    let (s0, s1) = (pool_stream(0), pool_stream(1));
    let e = create_event(false); // an event of device 0 (the current device)
    ok(orLaunchHostFunc(s0, Some(slow_then_flag), null_mut()));
    ok(orEventRecord(e, s0));
    ok(orStreamWaitEvent(s1, e));
    ok(orLaunchHostFunc(s1, Some(observe), null_mut()));
    ok(orStreamSynchronize(s1));
    assert!(
        SEEN.load(Ordering::SeqCst),
        "device 1 ran work before device 0 reached the event"
    );

    // Recording stays limited to streams of the event's device.
    assert_eq!(orEventRecord(e, s1), INVALID_VALUE);
    assert!(last_message().contains("device 0"), "{}", last_message());
    ok(orEventDestroy(e));
}

// The code and message a host function got from synchronizing its own stream.
static SELF_WAIT: std::sync::Mutex<Option<(OrError, String)>> = std::sync::Mutex::new(None);

extern "C" fn synchronize_own_stream(stream: *mut c_void) {
    let code = orStreamSynchronize(stream);
    *SELF_WAIT.lock().unwrap() = Some((code, last_message()));
}

#[test]
fn work_that_waits_for_its_own_stream_fails_instead_of_hanging() {
    // Note [Waiting from inside a kernel]: the worker running the host
    // function would wait for itself.
    ok(orSetDevice(0));
    let s = pool_stream(0);
    ok(orLaunchHostFunc(s, Some(slow_then_flag), null_mut()));
    ok(orLaunchHostFunc(s, Some(synchronize_own_stream), s));
    ok(orStreamSynchronize(s));
    let (code, message) = SELF_WAIT
        .lock()
        .unwrap()
        .take()
        .expect("the host function ran");
    assert_eq!(code, INVALID_VALUE);
    assert!(
        message.contains("waits for") && message.contains("itself"),
        "{message}"
    );
}
