//! Graph capture and replay in the runtime, without PyTorch: a capturing
//! stream records instead of running, replays run the recorded work in
//! order, host waits on a capturing stream fail, forked streams must join
//! back, allocations during capture come from the graph's pool, and random
//! slices are relative to each replay's base.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use torch_openreg::runtime::device;
use torch_openreg::base::error::ErrorKind;
use torch_openreg::runtime::event::Event;
use torch_openreg::runtime::generator::Generator;
use torch_openreg::runtime::graph::{self, CaptureMode};
use torch_openreg::runtime::stream::{StreamQueue, Task};

/// Captures are process-wide state (a "global" capture forbids every host
/// synchronization): the tests of this binary run one at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn fresh_stream() -> &'static StreamQueue {
    device::context(0).unwrap().streams.from_pool(0)
}

/// A task that appends `tag` to `log` each time it runs.
fn logging(log: &Arc<Mutex<Vec<u32>>>, tag: u32) -> Task {
    let log = Arc::clone(log);
    Task::Run(Box::new(move || {
        log.lock().unwrap().push(tag);
        Ok(())
    }))
}

#[test]
fn capture_records_and_each_launch_replays_in_order() {
    let _serial = serial();
    let s = fresh_stream();
    let log = Arc::new(Mutex::new(Vec::new()));
    graph::begin_capture(s, CaptureMode::Global, (0, 0), false).unwrap();
    assert!(graph::is_capturing(s));
    for tag in 0..3 {
        s.submit(logging(&log, tag)).unwrap();
    }
    s.synchronize().unwrap(); // nothing was queued, so nothing to wait for
    assert!(
        log.lock().unwrap().is_empty(),
        "captured work ran at capture"
    );
    let executable = Arc::new(graph::end_capture(s).unwrap());
    assert!(!graph::is_capturing(s));
    assert_eq!(executable.node_count(), 3);
    let other = fresh_stream();
    executable.launch(s).unwrap();
    executable.launch(other).unwrap(); // ordered behind the first launch
    other.synchronize().unwrap();
    assert_eq!(*log.lock().unwrap(), vec![0, 1, 2, 0, 1, 2]);
}

#[test]
fn host_waits_on_a_capturing_stream_fail_and_invalidate_the_capture() {
    let _serial = serial();
    let s = fresh_stream();
    graph::begin_capture(s, CaptureMode::Relaxed, (0, 0), false).unwrap();
    let err = graph::check_host_sync("Stream.synchronize()", Some(s)).unwrap_err();
    assert_eq!(err.kind, ErrorKind::StreamCapture);
    assert!(err.message.contains("capturing a graph"), "{}", err.message);
    // Relaxed: a sync of another stream is allowed.
    graph::check_host_sync("Stream.synchronize()", Some(fresh_stream())).unwrap();
    let err = match graph::end_capture(s) {
        Err(e) => e,
        Ok(_) => panic!("an invalidated capture ended successfully"),
    };
    assert!(
        err.message.contains("failed") && err.message.contains("Stream.synchronize()"),
        "{}",
        err.message
    );
    assert!(
        !graph::is_capturing(s),
        "a failed capture leaves the stream capturing"
    );
}

#[test]
fn global_mode_forbids_every_host_sync_and_thread_local_only_its_threads() {
    let _serial = serial();
    let s = fresh_stream();
    graph::begin_capture(s, CaptureMode::ThreadLocal, (0, 0), false).unwrap();
    let other_thread =
        std::thread::spawn(|| graph::check_host_sync("device synchronize", None).is_ok());
    assert!(
        other_thread.join().unwrap(),
        "thread_local forbade another thread's sync"
    );
    assert!(graph::check_host_sync("device synchronize", None).is_err());
    assert!(graph::end_capture(s).is_err());

    let s = fresh_stream();
    graph::begin_capture(s, CaptureMode::Global, (0, 0), false).unwrap();
    let other_thread =
        std::thread::spawn(|| graph::check_host_sync("device synchronize", None).is_ok());
    assert!(
        !other_thread.join().unwrap(),
        "global allowed another thread's sync"
    );
    assert!(graph::end_capture(s).is_err());
}

#[test]
fn nested_capture_on_one_stream_is_refused() {
    let _serial = serial();
    let s = fresh_stream();
    graph::begin_capture(s, CaptureMode::Global, (0, 0), false).unwrap();
    let err = graph::begin_capture(s, CaptureMode::Global, (0, 0), false)
        .err()
        .expect("nested capture accepted");
    assert!(err.message.contains("nested"), "{}", err.message);
    graph::end_capture(s).unwrap();
    assert!(
        graph::end_capture(s).is_err(),
        "ending a capture twice succeeded"
    );
}

#[test]
fn a_forked_stream_must_join_back() {
    let _serial = serial();
    let log = Arc::new(Mutex::new(Vec::new()));
    for join in [true, false] {
        let (origin, side) = (fresh_stream(), fresh_stream());
        let (fork, back) = (Event::new(0, false).unwrap(), Event::new(0, false).unwrap());
        graph::begin_capture(origin, CaptureMode::Global, (0, 0), false).unwrap();
        origin.submit(logging(&log, 1)).unwrap();
        fork.record(origin).unwrap();
        fork.block(side).unwrap(); // side joins the capture
        assert!(graph::is_capturing(side));
        side.submit(logging(&log, 2)).unwrap();
        if join {
            back.record(side).unwrap();
            back.block(origin).unwrap();
        }
        let ended = graph::end_capture(origin);
        assert!(!graph::is_capturing(side));
        match (join, ended) {
            (true, Ok(executable)) => {
                Arc::new(executable).launch(origin).unwrap();
                origin.synchronize().unwrap();
                assert_eq!(*log.lock().unwrap(), vec![1, 2]);
            }
            (false, Err(e)) => assert!(e.message.contains("unjoined"), "{}", e.message),
            (join, ended) => panic!("join={join}: end_capture gave {:?}", ended.map(|_| ())),
        }
    }
}

#[test]
fn allocations_during_capture_come_from_the_graphs_pool() {
    let _serial = serial();
    let ctx = device::context(0).unwrap();
    let s = fresh_stream();
    let eager = ctx.allocator.malloc(4096, s).ok().unwrap();
    ctx.allocator.free(eager).unwrap();
    graph::begin_capture(s, CaptureMode::Global, (0, 0), false).unwrap();
    let captured = ctx.allocator.malloc(4096, s).ok().unwrap();
    assert_ne!(captured, eager, "a capture reused eager memory");
    ctx.allocator.free(captured).unwrap();
    let again = ctx.allocator.malloc(4096, s).ok().unwrap();
    assert_eq!(
        again, captured,
        "the pool did not reuse its own freed block"
    );
    let executable = graph::end_capture(s).unwrap();
    // While the graph lives, its freed blocks are not handed to eager work.
    ctx.allocator.free(again).unwrap();
    let eager_again = ctx.allocator.malloc(4096, s).ok().unwrap();
    assert_ne!(
        eager_again, captured,
        "eager work got a block of a live graph pool"
    );
    ctx.allocator.free(eager_again).unwrap();
    let reserved = ctx.allocator.stats().reserved_bytes.all().current;
    drop(executable); // releases the pool: its cached segment goes
    assert!(ctx.allocator.stats().reserved_bytes.all().current < reserved);
}

#[test]
fn random_slices_in_a_capture_are_relative_to_each_replay() {
    let _serial = serial();
    let s = fresh_stream();
    let generator = Generator::new(7);
    // reserve_random_in_capture reads the current stream: make `s` current.
    torch_openreg::runtime::stream::exchange_current_stream(0, s.id()).unwrap();
    device::set_device(0).unwrap();
    graph::begin_capture(s, CaptureMode::Global, (0, 0), false).unwrap();
    let (first, cell) = graph::reserve_random_in_capture(&generator, 10)
        .unwrap()
        .unwrap();
    let (second, _) = graph::reserve_random_in_capture(&generator, 4)
        .unwrap()
        .unwrap();
    assert_eq!(
        (first, second),
        (0, 12),
        "draws are reserved in whole Philox blocks"
    );
    assert_eq!(generator.offset(), 0, "capture advanced the generator");
    let executable = Arc::new(graph::end_capture(s).unwrap());
    torch_openreg::runtime::stream::exchange_current_stream(0, 0).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    for _ in 0..2 {
        executable.launch(s).unwrap();
        let (cell, seen) = (Arc::clone(&cell), Arc::clone(&seen));
        s.submit(Task::Run(Box::new(move || {
            seen.lock().unwrap().push(cell.resolve(0).base);
            Ok(())
        })))
        .unwrap();
    }
    s.synchronize().unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        vec![0, 16],
        "each replay takes the next 16 draws"
    );
    assert_eq!(generator.offset(), 32);
}

#[test]
fn launch_counts_every_node_once() {
    let _serial = serial();
    let s = fresh_stream();
    let runs = Arc::new(AtomicUsize::new(0));
    graph::begin_capture(s, CaptureMode::Global, (0, 0), false).unwrap();
    for _ in 0..100 {
        let runs = Arc::clone(&runs);
        s.submit(Task::Run(Box::new(move || {
            runs.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })))
        .unwrap();
    }
    let executable = Arc::new(graph::end_capture(s).unwrap());
    for _ in 0..10 {
        executable.launch(s).unwrap();
    }
    s.synchronize().unwrap();
    assert_eq!(runs.load(Ordering::Relaxed), 1000);
}
