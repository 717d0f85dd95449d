//! Idle stream workers exit (Note [Idle workers]): a process that touched
//! many streams keeps no idle thread per stream. Its own test binary, so the
//! short idle time is set before the runtime reads its options.

use std::time::{Duration, Instant};

use torch_openreg::device;
use torch_openreg::stream::Task;

#[test]
fn idle_workers_exit_and_restart_on_demand() {
    std::env::set_var("OPENREG_WORKER_IDLE_MS", "50");
    let streams = &device::context(0).unwrap().streams;
    let touched: Vec<_> = (0..40).map(|i| streams.from_pool(if i % 2 == 0 { 0 } else { -1 })).collect();
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
