//! The caching allocator (Note [Caching allocator]), each test on its own
//! allocator instance so statistics are exact. Capacity is 64 MiB here.

use std::sync::Once;
use std::thread;
use std::time::Duration;

use torch_openreg::runtime::allocator::{DeviceAllocator, SMALL_SEGMENT};
use torch_openreg::runtime::device;
use torch_openreg::base::error::ErrorKind;
use torch_openreg::runtime::stream::{StreamQueue, Task};

const MIB: usize = 1 << 20;

fn allocator() -> DeviceAllocator {
    static ENV: Once = Once::new();
    ENV.call_once(|| std::env::set_var("OPENREG_DEVICE_MEMORY", "64M"));
    DeviceAllocator::new(0)
}

fn stream() -> &'static StreamQueue {
    device::context(0).unwrap().streams.from_pool(0)
}

#[test]
fn freed_blocks_are_reused_on_the_same_stream() {
    let a = allocator();
    let s = stream();
    let p = a.malloc(1000, s).ok().unwrap();
    a.free(p).unwrap();
    let q = a.malloc(900, s).ok().unwrap();
    assert_eq!(p, q, "a cached block of the right size is reused");
    assert_eq!(a.stats().segment.all().current, 1);
    assert_eq!(a.stats().num_device_alloc, 1);
}

#[test]
fn small_requests_split_one_segment() {
    let a = allocator();
    let s = stream();
    let ptrs: Vec<usize> = (0..4).map(|_| a.malloc(4096, s).ok().unwrap()).collect();
    for w in ptrs.windows(2) {
        assert_eq!(
            w[1] - w[0],
            4096,
            "blocks are carved from one segment in order"
        );
    }
    let st = a.stats();
    assert_eq!(st.segment.all().current, 1);
    assert_eq!(st.reserved_bytes.all().current as usize, SMALL_SEGMENT);
    assert_eq!(st.allocated_bytes.all().current, 4 * 4096);
    assert_eq!(
        st.inactive_split.all().current,
        1,
        "the rest of the segment is one inactive split block"
    );
    // Freeing everything merges the segment back into one block.
    ptrs.iter().for_each(|&p| a.free(p).unwrap());
    let st = a.stats();
    assert_eq!(st.inactive_split.all().current, 0);
    assert_eq!(st.active.all().current, 0);
    let big = a.malloc(SMALL_SEGMENT - 4096, s).ok();
    assert!(big.is_some());
}

#[test]
fn blocks_are_not_shared_between_streams() {
    let a = allocator();
    let (s1, s2) = (stream(), stream());
    let p = a.malloc(2048, s1).ok().unwrap();
    a.free(p).unwrap();
    let q = a.malloc(2048, s2).ok().unwrap();
    assert_ne!(
        p, q,
        "another stream must not get a block without synchronization"
    );
    assert_eq!(a.stats().segment.all().current, 2);
}

#[test]
fn record_stream_defers_reuse_until_that_stream_passes_the_free() {
    let a = allocator();
    let (owner, user) = (stream(), stream());
    let p = a.malloc(1 << 16, owner).ok().unwrap();
    user.submit(Task::Run(Box::new(|| {
        Ok(thread::sleep(Duration::from_millis(150)))
    })))
    .unwrap();
    a.record_stream(p, user).unwrap();
    a.free(p).unwrap();
    let q = a.malloc(1 << 16, owner).ok().unwrap();
    assert_ne!(p, q, "reused while another stream may still use it");
    let st = a.stats();
    assert_eq!(
        st.allocated_bytes.all().current,
        1 << 16,
        "the pending block no longer counts as allocated"
    );
    assert_eq!(st.active.all().current, 2, "but is still active");
    user.synchronize().unwrap();
    a.free(q).unwrap();
    let r = a.malloc(1 << 16, owner).ok().unwrap();
    assert!(r == p || r == q);
    assert_eq!(a.stats().active.all().current, 1);
}

/// A task that blocks `stream` until the returned sender is dropped.
fn hold(stream: &'static StreamQueue) -> std::sync::mpsc::Sender<()> {
    let (release, gate) = std::sync::mpsc::channel::<()>();
    stream
        .submit(Task::Run(Box::new(move || {
            let _ = gate.recv();
            Ok(())
        })))
        .unwrap();
    release
}

/// Note [Stream-ordered memory]: a block is free for later work on its
/// stream at once, but its segment is unmapped only after the stream has
/// passed the free.
#[test]
fn segments_are_unmapped_only_after_their_stream_passes_the_free() {
    let a = allocator();
    let s = stream();
    let p = a.malloc(4096, s).ok().unwrap();
    let release = hold(s);
    a.free(p).unwrap();
    assert_eq!(
        a.malloc(4096, s).ok(),
        Some(p),
        "reused for later work on the same stream"
    );
    a.free(p).unwrap();
    let reserved_while_queued = thread::scope(|scope| {
        let emptying = scope.spawn(|| a.empty_cache());
        thread::sleep(Duration::from_millis(100));
        let reserved = a.stats().reserved_bytes.all().current;
        assert!(
            !emptying.is_finished(),
            "empty_cache did not wait for the stream"
        );
        drop(release);
        emptying.join().unwrap();
        reserved
    });
    assert_eq!(reserved_while_queued as usize, SMALL_SEGMENT);
    assert_eq!(a.stats().reserved_bytes.all().current, 0);
}

#[test]
fn out_of_memory_retry_waits_for_queued_kernels_before_unmapping() {
    let a = allocator();
    let s = stream();
    let first = a.malloc(40 * MIB, s).ok().unwrap();
    let release = hold(s);
    a.free(first).unwrap();
    thread::scope(|scope| {
        // 40 MiB cached + 50 MiB > 64 MiB: the cached segment must go, and
        // a queued kernel may still touch it.
        let growing = scope.spawn(|| a.malloc(50 * MIB, s).ok());
        thread::sleep(Duration::from_millis(100));
        assert!(
            !growing.is_finished(),
            "unmapped a segment its stream had not passed"
        );
        // The allocator is not locked meanwhile.
        assert_eq!(a.stats().reserved_bytes.all().current as usize, 40 * MIB);
        drop(release);
        assert!(growing.join().unwrap().is_some());
    });
    assert_eq!(a.stats().num_alloc_retries, 1);
}

#[test]
fn stats_follow_cuda_arithmetic() {
    let a = allocator();
    let s = stream();
    let small = a.malloc(100, s).ok().unwrap();
    let large = a.malloc(3 * MIB, s).ok().unwrap();
    let st = a.stats();
    assert_eq!(st.allocation.0[1].current, 1);
    assert_eq!(st.allocation.0[2].current, 1);
    assert_eq!(
        st.allocated_bytes.0[1].current, 512,
        "small requests round up to 512 bytes"
    );
    assert_eq!(st.allocated_bytes.0[2].current as usize, 3 * MIB);
    assert_eq!(st.requested_bytes.all().current as usize, 100 + 3 * MIB);
    assert_eq!(
        st.reserved_bytes.0[2].current as usize,
        20 * MIB,
        "mid-size requests get a 20 MiB segment"
    );
    a.free(small).unwrap();
    a.free(large).unwrap();
    let st = a.stats();
    assert_eq!(st.allocated_bytes.all().current, 0);
    assert_eq!(st.allocated_bytes.all().peak as usize, 512 + 3 * MIB);
    assert_eq!(
        st.allocated_bytes.all().freed,
        st.allocated_bytes.all().allocated
    );
    a.reset_peak_stats();
    assert_eq!(a.stats().allocated_bytes.all().peak, 0);
    a.reset_accumulated_stats();
    assert_eq!(a.stats().allocated_bytes.all().allocated, 0);
    a.empty_cache();
    let st = a.stats();
    assert_eq!(st.reserved_bytes.all().current, 0);
    assert_eq!(st.num_device_free, 2);
}

#[test]
fn out_of_memory_after_releasing_the_cache() {
    let a = allocator();
    let s = stream();
    let first = a.malloc(40 * MIB, s).ok().unwrap();
    a.free(first).unwrap();
    // Cached 40 MiB must be released to fit 50 MiB.
    let second = a.malloc(50 * MIB, s).ok().unwrap();
    assert_eq!(a.stats().num_alloc_retries, 1);
    let err = a.malloc(30 * MIB, s).err().unwrap();
    assert!(err.out_of_memory);
    assert_eq!(err.error.kind, ErrorKind::OutOfMemory);
    let msg = err.error.message;
    assert!(
        msg.contains("device 0")
            && msg.contains("30.00 MiB")
            && msg.contains("50.00 MiB is allocated"),
        "{msg}"
    );
    assert_eq!(a.stats().num_ooms, 1);
    a.free(second).unwrap();
    assert!(a.malloc(30 * MIB, s).is_ok());
}

#[test]
fn memory_fraction_limits_reservations() {
    let a = allocator();
    let s = stream();
    a.set_memory_fraction(0.25).unwrap();
    assert!(a.malloc(20 * MIB, s).is_err());
    assert!(a.malloc(10 * MIB, s).is_ok());
    assert!(a.set_memory_fraction(1.5).is_err());
    assert_eq!(a.memory_info().1, 64 * MIB);
}

#[test]
fn bad_frees_are_errors() {
    let a = allocator();
    let s = stream();
    let p = a.malloc(1024, s).ok().unwrap();
    assert!(a.owns(p + 100));
    a.free(p).unwrap();
    assert!(a.free(p).is_err(), "double free");
    assert!(a.free(12345).is_err(), "foreign pointer");
    a.free(0).unwrap();
    assert_eq!(a.malloc(0, s).ok(), Some(0));
}

#[test]
fn memory_is_writable_and_zero_sized_requests_cost_nothing() {
    let a = allocator();
    let s = stream();
    let p = a.malloc(MIB, s).ok().unwrap();
    // SAFETY: p is a live 1 MiB allocation of mapped, writable memory.
    unsafe { std::ptr::write_bytes(p as *mut u8, 7, MIB) };
    assert_eq!(unsafe { *((p + MIB - 1) as *const u8) }, 7);
    a.free(p).unwrap();
}
