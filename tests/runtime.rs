//! Runtime tests in Rust, without PyTorch in the loop: devices, streams and
//! events as the guard contract needs them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use torch_openreg::runtime::device;
use torch_openreg::base::error::ErrorKind;
use torch_openreg::runtime::event::Event;
use torch_openreg::runtime::stream::{self, StreamQueue, Task};

/// Host work for a stream that cannot fail.
fn host(f: impl FnOnce() + Send + 'static) -> Task {
    let mut f = Some(f); // a task may run again (graph replay); these run once
    Task::Run(Box::new(move || {
        if let Some(f) = f.take() {
            f();
        }
        Ok(())
    }))
}

fn sleep_task(ms: u64) -> Task {
    Task::Run(Box::new(move || {
        Ok(thread::sleep(Duration::from_millis(ms)))
    }))
}

/// A pool stream for a test. Tests in this binary run in parallel and take
/// far fewer than 32 streams each, so no two running tests share one; tests
/// that cycle through whole pools live in their own binaries.
fn fresh_stream(device: i64) -> &'static StreamQueue {
    device::context(device).unwrap().streams.from_pool(0)
}

#[test]
fn backend_registers_with_pytorch_at_load() {
    assert!(torch_openreg::backend_registered());
}

#[test]
fn device_count_defaults_to_two() {
    assert_eq!(device::device_count(), 2);
}

#[test]
fn current_device_is_per_thread() {
    device::set_device(1).unwrap();
    let other = thread::spawn(device::current_device).join().unwrap();
    assert_eq!(other, 0, "a new thread starts on device 0");
    assert_eq!(device::current_device(), 1);
    assert_eq!(device::exchange_device(0).unwrap(), 1);
    assert_eq!(device::current_device(), 0);
}

#[test]
fn invalid_device_index_names_index_and_count() {
    let err = device::set_device(7).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidDevice);
    assert!(
        err.message.contains("index 7") && err.message.contains("2 devices"),
        "{}",
        err.message
    );
    assert!(device::set_device(-1).is_err());
    assert!(device::context(2).is_err());
    // unchecked_set_device never fails: it keeps the current device.
    device::set_device(1).unwrap();
    device::unchecked_set_device(9);
    assert_eq!(device::current_device(), 1);
}

#[test]
fn query_is_false_until_the_running_task_finishes() {
    let s = fresh_stream(0);
    let t = Instant::now();
    let started = Arc::new(AtomicBool::new(false));
    let flag = started.clone();
    s.submit(host(move || {
        flag.store(true, Ordering::SeqCst);
        thread::sleep(Duration::from_millis(150));
    }))
    .unwrap();
    while !started.load(Ordering::SeqCst) {
        thread::yield_now();
    }
    // The queue is empty now, but the task still runs.
    assert!(!s.query());
    s.synchronize().unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(150),
        "synchronize returned before the task ended"
    );
    assert!(s.query());
}

#[test]
fn a_stream_runs_its_work_in_order() {
    let s = fresh_stream(0);
    let log = Arc::new(parking_lot::Mutex::new(Vec::new()));
    for i in 0..50 {
        let log = log.clone();
        let pause = if i % 7 == 0 { 2 } else { 0 };
        s.submit(host(move || {
            thread::sleep(Duration::from_millis(pause));
            log.lock().push(i);
        }))
        .unwrap();
    }
    s.synchronize().unwrap();
    assert_eq!(*log.lock(), (0..50).collect::<Vec<_>>());
}

#[test]
fn different_streams_run_concurrently() {
    let (a, b) = (fresh_stream(1), fresh_stream(1));
    assert!(!std::ptr::eq(a, b));
    let t = Instant::now();
    a.submit(sleep_task(200)).unwrap();
    b.submit(sleep_task(200)).unwrap();
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(380),
        "took {:?}",
        t.elapsed()
    );
}

#[test]
fn a_panicking_task_is_reported_by_the_next_synchronize() {
    let s = fresh_stream(0);
    s.submit(host(|| panic!("kernel exploded"))).unwrap();
    let err = s.synchronize().unwrap_err();
    assert!(err.message.contains("kernel exploded"), "{}", err.message);
    s.synchronize().unwrap();
}

#[test]
fn never_recorded_event_is_complete() {
    let e = Event::new(0, false).unwrap();
    assert!(e.query().unwrap());
    e.synchronize().unwrap();
    e.block(fresh_stream(0)).unwrap();
}

#[test]
fn event_completes_when_its_stream_passes_it() {
    let s = fresh_stream(0);
    let e = Event::new(0, false).unwrap();
    s.submit(sleep_task(100)).unwrap();
    e.record(s).unwrap();
    assert!(!e.query().unwrap());
    e.synchronize().unwrap();
    assert!(e.query().unwrap());
}

#[test]
fn block_waits_for_the_version_current_at_the_call() {
    let (a, b, c) = (fresh_stream(1), fresh_stream(1), fresh_stream(1));
    let e = Event::new(1, false).unwrap();
    let a_done = Arc::new(AtomicBool::new(false));
    let flag = a_done.clone();
    a.submit(host(move || {
        thread::sleep(Duration::from_millis(150));
        flag.store(true, Ordering::SeqCst);
    }))
    .unwrap();
    e.record(a).unwrap();
    e.block(b).unwrap();
    // Re-recording on an idle stream completes the new version at once, but
    // must not release the wait queued before it.
    e.record(c).unwrap();
    assert!(e.query().unwrap());
    let seen = Arc::new(AtomicBool::new(false));
    let (seen2, a_done2) = (seen.clone(), a_done.clone());
    b.submit(host(move || {
        seen2.store(a_done2.load(Ordering::SeqCst), Ordering::SeqCst)
    }))
    .unwrap();
    b.synchronize().unwrap();
    assert!(
        seen.load(Ordering::SeqCst),
        "stream b ran before stream a reached the event"
    );
}

#[test]
fn elapsed_time_measures_between_timing_events() {
    let s = fresh_stream(0);
    let (start, end) = (Event::new(0, true).unwrap(), Event::new(0, true).unwrap());
    start.record(s).unwrap();
    s.submit(sleep_task(30)).unwrap();
    end.record(s).unwrap();
    assert_eq!(
        Event::elapsed_ms(&start, &end).unwrap_err().kind,
        ErrorKind::NotReady
    );
    end.synchronize().unwrap();
    let ms = Event::elapsed_ms(&start, &end).unwrap();
    assert!((25.0..200.0).contains(&ms), "{ms} ms");
}

#[test]
fn elapsed_time_rejects_non_timing_unrecorded_and_cross_device_events() {
    let s = fresh_stream(0);
    let plain = Event::new(0, false).unwrap();
    let timed = Event::new(0, true).unwrap();
    let unrecorded = Event::new(0, true).unwrap();
    plain.record(s).unwrap();
    timed.record(s).unwrap();
    let err = Event::elapsed_ms(&plain, &timed).unwrap_err();
    assert!(err.message.contains("enable_timing"), "{}", err.message);
    let err = Event::elapsed_ms(&timed, &unrecorded).unwrap_err();
    assert!(err.message.contains("not been recorded"), "{}", err.message);
    let other = Event::new(1, true).unwrap();
    other.record(fresh_stream(1)).unwrap();
    assert!(Event::elapsed_ms(&timed, &other).is_err());
}

#[test]
fn events_are_recorded_only_on_streams_of_their_device() {
    // As cudaEventRecord: the stream must belong to the event's device.
    let e = Event::new(0, false).unwrap();
    let err = e.record(fresh_stream(1)).unwrap_err();
    assert!(
        err.message.contains("device 0") && err.message.contains("device 1"),
        "{}",
        err.message
    );
    e.record(fresh_stream(0)).unwrap();
    assert!(Event::new(5, false).is_err());
}

/// A task that sleeps `ms`, then sets the returned flag.
fn slow_then_flag(ms: u64) -> (Task, Arc<AtomicBool>) {
    let done = Arc::new(AtomicBool::new(false));
    let flag = done.clone();
    let task = host(move || {
        thread::sleep(Duration::from_millis(ms));
        flag.store(true, Ordering::SeqCst);
    });
    (task, done)
}

/// Queues on `s` a task that records whether `done` was set when it ran.
fn observe(s: &'static StreamQueue, done: &Arc<AtomicBool>) -> Arc<AtomicBool> {
    let seen = Arc::new(AtomicBool::new(false));
    let (seen2, done2) = (seen.clone(), done.clone());
    s.submit(host(move || {
        seen2.store(done2.load(Ordering::SeqCst), Ordering::SeqCst)
    }))
    .unwrap();
    seen
}

#[test]
fn a_stream_waits_on_an_event_of_another_device() {
    // As cudaStreamWaitEvent: the waiting stream may be on another device,
    // and its later work runs only after the event's point has completed.
    for (from, to) in [(0, 1), (1, 0)] {
        let (src, dst) = (fresh_stream(from), fresh_stream(to));
        let e = Event::new(from, false).unwrap();
        let (task, done) = slow_then_flag(150);
        src.submit(task).unwrap();
        e.record(src).unwrap();
        e.block(dst).unwrap();
        assert!(!dst.query(), "the wait is queued on device {to}'s stream");
        let seen = observe(dst, &done);
        dst.synchronize().unwrap();
        assert!(
            seen.load(Ordering::SeqCst),
            "device {to} ran work before device {from} reached the event"
        );
        assert_eq!(e.device(), from as i8, "waiting does not move the event");
    }
}

#[test]
fn a_cross_device_wait_is_for_the_version_current_at_the_call() {
    let (a, b, c) = (fresh_stream(0), fresh_stream(1), fresh_stream(0));
    let e = Event::new(0, false).unwrap();
    let (task, done) = slow_then_flag(150);
    a.submit(task).unwrap();
    e.record(a).unwrap();
    e.block(b).unwrap();
    e.record(c).unwrap(); // a later, already complete version
    assert!(e.query().unwrap());
    let seen = observe(b, &done);
    b.synchronize().unwrap();
    assert!(
        seen.load(Ordering::SeqCst),
        "a later record released an earlier cross-device wait"
    );
}

#[test]
fn waiters_for_different_points_each_return_at_their_own() {
    // Note [Waking waiters]: sleepers are woken only when the lowest point
    // any of them waits for is reached; the others must sleep again for
    // theirs. The later waiter starts first, so the earlier one's point
    // lowers what the worker watches for while the later one sleeps.
    let s = fresh_stream(0);
    let (first, first_done) = slow_then_flag(50);
    let (second, second_done) = slow_then_flag(300);
    s.submit(sleep_task(30)).unwrap();
    let first_point = s.submit(first).unwrap();
    let last_point = s.submit(second).unwrap();
    let later = thread::spawn(move || {
        // A bounded wait: a sleeper nobody wakes fails here instead of hanging.
        let reached = s.wait_until(last_point, Instant::now() + Duration::from_secs(10));
        reached && second_done.load(Ordering::SeqCst)
    });
    thread::sleep(Duration::from_millis(10));
    let earlier = thread::spawn(move || {
        s.wait_for(first_point, true).unwrap();
        first_done.load(Ordering::SeqCst)
    });
    let started = Instant::now();
    let deadline_missed = !s.wait_until(last_point, started + Duration::from_millis(40));
    assert!(
        deadline_missed,
        "a wait with a deadline returned before its point"
    );
    assert!(
        started.elapsed() < Duration::from_millis(250),
        "a deadline waiter slept past its deadline"
    );
    assert!(
        earlier.join().unwrap(),
        "a waiter returned before its point"
    );
    assert!(!s.query(), "the earlier waiter waited for the later point");
    assert!(later.join().unwrap(), "a waiter returned before its point");
    assert!(s.query());
}

/// Which thread dropped a task, once one has.
type DroppedBy = Arc<std::sync::Mutex<Option<thread::ThreadId>>>;

/// A task that does nothing and notes which thread drops it.
fn witnessed_task() -> (Task, DroppedBy) {
    struct Witness(DroppedBy);
    impl Drop for Witness {
        fn drop(&mut self) {
            *self.0.lock().unwrap() = Some(thread::current().id());
        }
    }
    let dropped_by = DroppedBy::default();
    let witness = Witness(dropped_by.clone());
    let task = Task::Run(Box::new(move || {
        let _ = &witness;
        Ok(())
    }));
    (task, dropped_by)
}

#[test]
fn a_task_run_while_more_are_queued_is_dropped_by_the_next_submitter() {
    // Note [Retired tasks]: the host frees what it allocated for a task.
    let s = fresh_stream(0);
    s.submit(sleep_task(30)).unwrap(); // the next two queue behind it
    let (task, dropped_by) = witnessed_task();
    let ran = s.submit(task).unwrap();
    let last = s.submit(sleep_task(50)).unwrap();
    s.wait_for(ran, true).unwrap();
    assert_eq!(
        *dropped_by.lock().unwrap(),
        None,
        "the worker dropped a task with more queued"
    );
    s.submit(host(|| {})).unwrap();
    assert_eq!(*dropped_by.lock().unwrap(), Some(thread::current().id()));
    s.wait_for(last, true).unwrap();
}

#[test]
fn a_synchronize_returns_with_every_finished_task_dropped() {
    // Note [Retired tasks]: the task that drains the queue is dropped, with
    // those kept before it, before its completion counts.
    let s = fresh_stream(0);
    s.submit(sleep_task(30)).unwrap();
    let (first, first_dropped) = witnessed_task();
    let (last, last_dropped) = witnessed_task();
    s.submit(first).unwrap();
    let point = s.submit(last).unwrap();
    s.wait_for(point, true).unwrap();
    assert!(
        first_dropped.lock().unwrap().is_some(),
        "a task kept past a synchronize"
    );
    assert!(
        last_dropped.lock().unwrap().is_some(),
        "the last task kept past a synchronize"
    );
}

#[test]
fn synchronize_device_waits_for_every_stream() {
    let (a, b) = (fresh_stream(1), fresh_stream(1));
    a.submit(sleep_task(80)).unwrap();
    b.submit(sleep_task(120)).unwrap();
    device::synchronize_device(1).unwrap();
    assert!(a.query() && b.query());
}

#[test]
fn current_stream_is_per_thread_per_device() {
    assert_eq!(stream::exchange_current_stream(1, 5).unwrap(), 0);
    assert_eq!(stream::current_stream_id(1), 5);
    assert_eq!(
        stream::current_stream_id(0),
        0,
        "device 0 keeps its own current stream"
    );
    assert_eq!(
        thread::spawn(|| stream::current_stream_id(1))
            .join()
            .unwrap(),
        0
    );
    assert!(stream::exchange_current_stream(1, 99).is_err());
    stream::exchange_current_stream(1, 0).unwrap();
}

#[test]
fn contexts_are_created_on_first_use() {
    // Device 1 may already be in use by a parallel test; device-agnostic
    // check: a context exists exactly after `context` was called.
    device::context(0).unwrap();
    assert!(device::has_primary_context(0).unwrap());
    assert!(device::has_primary_context(3).is_err());
}
