//! Op timeouts name what ran too long (Note [Op timeout], Note [Task names]):
//! a kernel by its name, other work by what it is. Its own test binary: the
//! timeout is process-wide.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use torch_openreg::runtime::device;
use torch_openreg::base::error::ErrorKind;
use torch_openreg::runtime::op_timeout;
use torch_openreg::runtime::stream::{StreamQueue, Task, TaskName};

fn sleep_task(ms: u64) -> Task {
    Task::Run(Box::new(move || {
        Ok(thread::sleep(Duration::from_millis(ms)))
    }))
}

fn stream(priority: i32) -> &'static StreamQueue {
    device::context(0).unwrap().streams.from_pool(priority)
}

/// The timeout error of synchronizing `s`, which must come well before
/// the 2 s the tests' work lasts.
fn timeout_message(s: &StreamQueue) -> String {
    let t0 = Instant::now();
    let error = s.synchronize().unwrap_err();
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "the wait did not give up in time"
    );
    assert_eq!(error.kind, ErrorKind::NotReady);
    error.message
}

#[test]
fn the_timeout_names_the_running_task() {
    op_timeout::set_ms(100);

    // A named kernel; the name is what the shim passes (a literal here).
    let named = stream(0);
    named
        .submit_named(
            sleep_task(2000),
            TaskName::kernel(c"test.slow_kernel"),
            String::new,
        )
        .unwrap();
    let message = timeout_message(named);
    assert!(
        message.starts_with(&format!(
            "openreg op timeout: kernel \"test.slow_kernel\" running on {named} has run for "
        )),
        "{message}"
    );
    assert_eq!(
        named
            .running_task()
            .map(|n| n.text().into_owned())
            .as_deref(),
        Some("test.slow_kernel")
    );

    // A task submitted without a name says so.
    let unnamed = stream(-1);
    unnamed.submit(sleep_task(2000)).unwrap();
    assert!(timeout_message(unnamed).contains("an unnamed task running on"));

    // A stream waiting for another's work names the wait, not a kernel.
    let waiter = stream(0);
    assert!(!std::ptr::eq(waiter, named));
    waiter
        .submit(Task::WaitFor {
            stream: named,
            seq: named.marker(),
        })
        .unwrap();
    thread::sleep(Duration::from_millis(20)); // the worker starts the wait
    assert!(timeout_message(waiter)
        .contains("a wait for work of another stream (an event wait) running on"));

    // Work another thread runs inline is named by that thread.
    let inline = stream(-1); // a fresh, idle stream
    let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (began, began_rx) = std::sync::mpsc::channel();
    let runner = {
        let finished = Arc::clone(&finished);
        thread::spawn(move || {
            assert!(inline.try_begin_inline(TaskName::kernel(c"test.inline_kernel")));
            began.send(()).unwrap();
            thread::sleep(Duration::from_millis(2000));
            inline.end_inline();
            finished.store(true, std::sync::atomic::Ordering::Release);
        })
    };
    began_rx.recv().unwrap();
    assert!(timeout_message(inline).contains("kernel \"test.inline_kernel\" running on"));

    // Without a timeout, the waits complete.
    op_timeout::set_ms(0);
    for s in [named, unnamed, waiter, inline] {
        s.synchronize().unwrap();
    }
    runner.join().unwrap();
    assert!(finished.load(std::sync::atomic::Ordering::Acquire));
    assert!(named.running_task().is_none());
}
