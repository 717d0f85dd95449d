//! Many threads switching devices and chaining streams through events: the
//! results stay consistent and nothing deadlocks. Its own binary, since it
//! cycles through whole stream pools.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use torch_openreg::runtime::device;
use torch_openreg::runtime::event::Event;
use torch_openreg::runtime::stream::{StreamQueue, Task};

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

fn fresh_stream(device: i64) -> &'static StreamQueue {
    device::context(device).unwrap().streams.from_pool(0)
}

#[test]
fn eight_threads_switching_devices_and_waiting_events_agree() {
    let threads = 8;
    let rounds = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (rounds, barrier) = (rounds.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                let deadline = Instant::now() + Duration::from_millis(1500);
                let mut i = 0u64;
                while Instant::now() < deadline {
                    let dev = ((t as u64 + i) % 2) as i64;
                    device::set_device(dev).unwrap();
                    assert_eq!(device::current_device() as i64, dev);
                    let (producer, consumer) = (fresh_stream(dev), fresh_stream(dev));
                    let value = Arc::new(AtomicUsize::new(0));
                    let v = value.clone();
                    producer
                        .submit(host(move || v.store(1, Ordering::SeqCst)))
                        .unwrap();
                    let e = Event::new(dev, false).unwrap();
                    e.record(producer).unwrap();
                    e.block(consumer).unwrap();
                    let (v, seen) = (value.clone(), Arc::new(AtomicUsize::new(0)));
                    let s = seen.clone();
                    consumer
                        .submit(host(move || {
                            s.store(v.load(Ordering::SeqCst), Ordering::SeqCst)
                        }))
                        .unwrap();
                    consumer.synchronize().unwrap();
                    assert_eq!(
                        seen.load(Ordering::SeqCst),
                        1,
                        "the consumer ran before the producer's event"
                    );
                    i += 1;
                }
                rounds.fetch_add(i as usize, Ordering::Relaxed);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert!(rounds.load(Ordering::Relaxed) > threads * 10);
}
