//! Idle stream workers exit (Note [Idle workers]): a process that touched
//! many streams keeps no idle thread per stream. Its own test binary, so the
//! short idle time is set before the runtime reads its options.

use std::time::{Duration, Instant};

use torch_openreg::runtime::device;
use torch_openreg::runtime::stream::{self, Task};

#[test]
fn idle_workers_exit_and_restart_on_demand() {
    std::env::set_var("OPENREG_WORKER_IDLE_MS", "50");
    let streams = &device::context(0).unwrap().streams;
    let touched: Vec<_> = (0..40)
        .map(|i| streams.from_pool(if i % 2 == 0 { 0 } else { -1 }))
        .collect();
    for s in &touched {
        s.submit(Task::Run(Box::new(|| Ok(())))).unwrap();
    }
    assert!(streams.live_workers() > 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while streams.live_workers() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(streams.live_workers(), 0, "idle workers did not exit");

    // A new submission starts a worker again and runs.
    touched[0].submit(Task::Run(Box::new(|| Ok(())))).unwrap();
    touched[0].synchronize().unwrap();
    assert!(touched[0].query());
}

/// Inline kernels (Note [Inline launches]) leave a sleeping worker asleep:
/// a stream busy with inline work only still lets its idle worker exit.
#[test]
fn inline_kernels_do_not_keep_an_idle_worker_awake() {
    std::env::set_var("OPENREG_WORKER_IDLE_MS", "50");
    let streams = &device::context(0).unwrap().streams;
    let stream = streams.get(0).unwrap();
    stream.submit(Task::Run(Box::new(|| Ok(())))).unwrap();
    stream.synchronize().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut worker_exited = false;
    while Instant::now() < deadline && !worker_exited {
        for _ in 0..100 {
            assert!(stream.try_begin_inline(stream::TaskName::INLINE));
            stream.end_inline();
        }
        worker_exited = streams.live_workers() == 0;
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(worker_exited, "inline kernels kept the idle worker awake");
}
