//! Finalize: release steps run by priority (ties in registration order),
//! after the work queued so far; later work is refused; finalize is
//! idempotent. Finalizing is process-wide and final, hence this binary of
//! its own with one test.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use torch_openreg::bridge::capi::{orFinalize, OR_SUCCESS};
use torch_openreg::runtime::device;
use torch_openreg::runtime::lifecycle::{self, PRIORITY_MEMORY, PRIORITY_STREAMS};
use torch_openreg::runtime::stream::Task;

#[test]
fn finalize_releases_by_priority_after_draining() {
    let stream = device::context(0).unwrap().streams.get(0).unwrap();
    let allocator = &device::context(0).unwrap().allocator;
    let cached = allocator.malloc(4096, stream).ok().expect("an allocation");
    allocator.free(cached).unwrap();
    assert!(allocator.stats().reserved_bytes.all().current > 0);
    let ran = Arc::new(AtomicBool::new(false));
    let flag = ran.clone();
    stream
        .submit(Task::Run(Box::new(move || {
            std::thread::sleep(Duration::from_millis(200));
            flag.store(true, Ordering::SeqCst);
            Ok(())
        })))
        .unwrap();

    // The runtime's own steps, in the order finalize will run them.
    let own: Vec<&str> = lifecycle::pending_releases()
        .iter()
        .map(|(_, name)| *name)
        .collect();
    assert_eq!(
        own,
        [
            "sanitizer reports",
            "stream workers",
            "cached device memory"
        ]
    );

    let order = Arc::new(Mutex::new(Vec::new()));
    let step = |name: &'static str| {
        let order = order.clone();
        let ran = ran.clone();
        move || {
            // Every step runs after the queued work: streams drain first.
            assert!(
                ran.load(Ordering::SeqCst),
                "{name} ran before the streams drained"
            );
            order.lock().push(name)
        }
    };
    lifecycle::register_release(PRIORITY_MEMORY + 10, "last", step("last"));
    lifecycle::register_release(PRIORITY_STREAMS + 1, "after streams", step("after streams"));
    lifecycle::register_release(PRIORITY_MEMORY, "beside memory", step("beside memory"));
    lifecycle::register_release(
        PRIORITY_STREAMS + 1,
        "after streams, second",
        step("after streams, second"),
    );
    let planned: Vec<&str> = lifecycle::pending_releases()
        .iter()
        .map(|(_, name)| *name)
        .collect();
    assert_eq!(
        planned,
        [
            "sanitizer reports",
            "stream workers",
            "after streams",
            "after streams, second",
            "cached device memory",
            "beside memory",
            "last"
        ]
    );

    assert_eq!(orFinalize(), OR_SUCCESS);
    assert_eq!(
        *order.lock(),
        [
            "after streams",
            "after streams, second",
            "beside memory",
            "last"
        ]
    );
    assert!(lifecycle::pending_releases().is_empty());
    // Cached memory went back: nothing is reserved any more.
    assert_eq!(allocator.stats().reserved_bytes.all().current, 0);

    // New work is refused with a clear error; a second finalize does nothing.
    let err = stream.submit(Task::Run(Box::new(|| Ok(())))).unwrap_err();
    assert!(err.message.contains("finalizing"), "{}", err.message);
    assert_eq!(orFinalize(), OR_SUCCESS);
    assert_eq!(order.lock().len(), 4);
}
