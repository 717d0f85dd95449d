//! The stream sanitizer's happens-before model (Note [Stream sanitizer]),
//! without torch: launches declare their buffers directly, as the shim does.

use std::sync::Mutex;

use torch_openreg::runtime::event::Event;
use torch_openreg::diagnostics::sanitizer::{self, KernelBuffer, Mode};
use torch_openreg::runtime::stream::{self, StreamQueue, TaskName};
use torch_openreg::{runtime::allocator, runtime::device};

/// The sanitizer's state is the process's: tests take turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn begin() -> std::sync::MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    sanitizer::set_mode(Mode::Raise);
    device::synchronize_device(0).unwrap();
    device::synchronize_device(1).unwrap();
    sanitizer::clear();
    guard
}

fn stream(device: i64, id: i64) -> &'static StreamQueue {
    stream::lookup(device, id).unwrap()
}

fn malloc(bytes: usize, on: &'static StreamQueue) -> usize {
    device::context(on.device().into())
        .unwrap()
        .allocator
        .malloc(bytes, on)
        .map_err(|e| e.error)
        .unwrap()
}

fn access(on: &'static StreamQueue, ptr: usize, bytes: usize, written: bool) -> Result<(), String> {
    let buffer = KernelBuffer {
        address: ptr,
        bytes,
        written,
        tensor: 0,
    };
    sanitizer::check_launch(on, TaskName::kernel(c"test kernel"), &[buffer], &|_| {
        String::new()
    })
    .map_err(|e| e.message)
}

fn kind_count(kind: &str) -> u64 {
    let index = sanitizer::KIND_NAMES
        .iter()
        .position(|k| k.to_str() == Ok(kind))
        .unwrap();
    sanitizer::counts()[index]
}

#[test]
fn unordered_read_of_another_streams_write_is_a_race() {
    let _turn = begin();
    let (main, side) = (stream(0, 0), stream(0, 1));
    let buf = malloc(4096, main);
    access(side, buf, 4096, true).unwrap();
    let err = access(main, buf, 1024, false).unwrap_err();
    assert!(err.starts_with("openreg sanitizer: race:"), "{err}");
    assert!(
        err.contains("openreg stream 1 of device 0") && err.contains("has waited for none"),
        "{err}"
    );
    assert_eq!(kind_count("race"), 1);
    // Disjoint bytes of the same allocation do not conflict.
    access(side, buf + 2048, 1024, true).unwrap();
    access(main, buf, 1024, true).unwrap_err();
    allocator::free_anywhere(buf).unwrap();
}

#[test]
fn event_wait_orders_and_an_early_record_does_not() {
    let _turn = begin();
    let (main, side) = (stream(0, 0), stream(0, 2));
    let (a, b) = (malloc(4096, main), malloc(4096, main));
    access(side, a, 4096, true).unwrap();
    let event = Event::new(0, false).unwrap();
    event.record(side).unwrap();
    access(side, b, 4096, true).unwrap(); // after the record
    event.block(main).unwrap();
    access(main, a, 4096, false).unwrap();
    let err = access(main, b, 4096, false).unwrap_err();
    assert!(
        err.contains("waited only for") && err.contains("before the work it should cover"),
        "{err}"
    );
    for p in [a, b] {
        allocator::free_anywhere(p).unwrap();
    }
}

#[test]
fn cross_device_waits_order_and_host_syncs_order() {
    let _turn = begin();
    let (main, other) = (stream(0, 0), stream(1, 3));
    let buf = malloc(4096, main);
    access(other, buf, 4096, true).unwrap();
    let event = Event::new(1, false).unwrap();
    event.record(other).unwrap();
    event.block(main).unwrap(); // a stream of device 0 waits on device 1
    access(main, buf, 4096, true).unwrap();
    // A host synchronize orders what the host launches afterwards.
    access(other, buf, 4096, true).unwrap_err();
    device::synchronize_device(0).unwrap();
    device::synchronize_device(1).unwrap();
    let side = stream(0, 4);
    access(side, buf, 4096, true).unwrap();
    stream::lookup(0, 4).unwrap().synchronize().unwrap(); // the runtime's own wait: no edge
    access(main, buf, 4096, false).unwrap_err();
    device::synchronize_device(0).unwrap(); // the user's: an edge
    access(main, buf, 4096, false).unwrap();
    allocator::free_anywhere(buf).unwrap();
}

#[test]
fn write_after_an_unordered_read() {
    let _turn = begin();
    let (main, side) = (stream(0, 0), stream(0, 5));
    let weights = malloc(4096, main);
    access(side, weights, 4096, false).unwrap();
    let err = access(main, weights, 4096, true).unwrap_err();
    assert!(
        err.starts_with("openreg sanitizer: write_after_read:"),
        "{err}"
    );
    allocator::free_anywhere(weights).unwrap();
}

#[test]
fn query_covers_only_up_to_the_record() {
    let _turn = begin();
    let (main, side) = (stream(0, 0), stream(0, 6));
    let (early, late) = (malloc(4096, main), malloc(4096, main));
    access(side, early, 4096, true).unwrap();
    let event = Event::new(0, false).unwrap();
    event.record(side).unwrap();
    access(side, late, 4096, true).unwrap();
    assert!(event.query().unwrap());
    access(main, early, 4096, false).unwrap();
    let err = access(main, late, 4096, false).unwrap_err();
    assert!(err.starts_with("openreg sanitizer: query_misuse:"), "{err}");
    for p in [early, late] {
        allocator::free_anywhere(p).unwrap();
    }
}

#[test]
fn reuse_of_memory_freed_without_record_stream() {
    let _turn = begin();
    let (main, side) = (stream(0, 0), stream(0, 7));
    let first = malloc(8192, main);
    access(side, first, 8192, false).unwrap();
    allocator::free_anywhere(first).unwrap();
    let second = malloc(8192, main);
    assert_eq!(
        first, second,
        "the caching allocator reuses the block on its stream"
    );
    let err = access(main, second, 8192, true).unwrap_err();
    assert!(
        err.starts_with("openreg sanitizer: freed_in_use:") && err.contains("record_stream"),
        "{err}"
    );
    allocator::free_anywhere(second).unwrap();

    // With record_stream, the allocator waits for the side stream: no report.
    device::synchronize_device(0).unwrap();
    let third = malloc(8192, main);
    access(side, third, 8192, false).unwrap();
    device::context(0)
        .unwrap()
        .allocator
        .record_stream(third, side)
        .unwrap();
    allocator::free_anywhere(third).unwrap();
    let fourth = malloc(8192, main);
    access(main, fourth, 8192, true).unwrap();
    allocator::free_anywhere(fourth).unwrap();
}

#[test]
fn off_checks_nothing() {
    let _turn = begin();
    let (main, side) = (stream(0, 0), stream(0, 8));
    let buf = malloc(4096, main);
    sanitizer::set_mode(Mode::Off);
    access(side, buf, 4096, true).unwrap();
    access(main, buf, 4096, true).unwrap();
    assert_eq!(sanitizer::counts(), [0; 5]);
    sanitizer::set_mode(Mode::Warn);
    access(side, buf, 4096, true).unwrap();
    access(main, buf, 4096, true).unwrap(); // warn: reported, not failed
    assert_eq!(kind_count("race"), 1);
    assert_eq!(sanitizer::reports().len(), 1);
    allocator::free_anywhere(buf).unwrap();
}

/// Note [Pinned memory guard]: host threads reading a guarded pinned buffer
/// at once (as a CPU matmul's OpenMP team does) all fault; each access is
/// retried and the one report comes once. The faults taken after another
/// thread lifted the guard used to go to the default action: the process
/// died with SIGSEGV, at once or at the next guarded access.
#[test]
fn concurrent_host_reads_of_a_guarded_pinned_buffer_are_one_report() {
    let _turn = begin();
    let copy_stream = stream(1, 0);
    const READERS: usize = 4;
    let bytes = 2 * 4096;
    let host = torch_openreg::memory::pinned::malloc(bytes).unwrap();
    for _ in 0..100 {
        sanitizer::guard_pinned_copy(copy_stream, host, bytes, true, "host");
        let start = std::sync::Barrier::new(READERS);
        std::thread::scope(|scope| {
            for reader in 0..READERS {
                let start = &start;
                scope.spawn(move || {
                    start.wait();
                    // SAFETY: `host` is a live pinned allocation of `bytes`.
                    unsafe { std::ptr::read_volatile((host + reader * 8) as *const u64) }
                });
            }
        });
        assert_eq!(kind_count("pinned_host_access"), 1);
        sanitizer::clear();
    }
    torch_openreg::memory::pinned::free(host);
}
