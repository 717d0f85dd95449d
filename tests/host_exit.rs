//! The host-exit protocol (Note [Host exit] in src/runtime/lifecycle.rs), through the
//! C ABI the Python package calls at exit. Closing the release gate is
//! process-wide and final, hence this binary of its own with one test.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use torch_openreg::bridge::capi::{
    orKernelReleaseBegin, orKernelReleaseEnd, orPrepareHostExit, OR_SUCCESS,
};
use torch_openreg::runtime::device;
use torch_openreg::base::error::Error;
use torch_openreg::runtime::lifecycle;
use torch_openreg::runtime::stream::Task;

fn flag_after(ms: u64, flag: &Arc<AtomicBool>) -> Task {
    let flag = flag.clone();
    Task::Run(Box::new(move || {
        thread::sleep(Duration::from_millis(ms));
        flag.store(true, Ordering::SeqCst);
        Ok(())
    }))
}

#[test]
fn prepare_host_exit_drains_streams_then_closes_the_release_gate() {
    // This test checks the protocol, not the default budget: a 2-core CI
    // machine running other test binaries can take longer than 500 ms for
    // 150 ms of queued work. Options are read once, at first use, below.
    std::env::set_var("OPENREG_EXIT_DRAIN_MS", "30000");
    let default0 = device::context(0).unwrap().streams.get(0).unwrap();
    let pool1 = device::context(1).unwrap().streams.from_pool(-1);
    let (ran0, ran1) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    default0
        .submit(Task::Run(Box::new(|| {
            Err(Error::invalid_value("a deliberate failure"))
        })))
        .unwrap();
    default0.submit(flag_after(150, &ran0)).unwrap();
    pool1.submit(flag_after(150, &ran1)).unwrap();

    // A kernel destroying its captures while the host starts to exit.
    let (started_tx, started_rx) = mpsc::channel();
    let released = Arc::new(AtomicBool::new(false));
    let releaser = {
        let released = released.clone();
        thread::spawn(move || {
            assert_eq!(
                orKernelReleaseBegin(),
                1,
                "the gate is open before the host exits"
            );
            started_tx.send(()).unwrap();
            thread::sleep(Duration::from_millis(300));
            released.store(true, Ordering::SeqCst);
            orKernelReleaseEnd();
        })
    };
    started_rx.recv().unwrap();
    assert!(!lifecycle::is_host_exiting());

    assert_eq!(orPrepareHostExit(), OR_SUCCESS);
    assert!(
        ran0.load(Ordering::SeqCst) && ran1.load(Ordering::SeqCst),
        "queued work did not finish first"
    );
    assert!(default0.query() && pool1.query());
    assert!(
        released.load(Ordering::SeqCst),
        "a release in flight was not waited for"
    );
    assert!(lifecycle::is_host_exiting());
    assert_eq!(
        orKernelReleaseBegin(),
        0,
        "a release was allowed after the host began exiting"
    );
    releaser.join().unwrap();

    // The drain left the parked failure to the stream's next synchronize.
    let err = default0.synchronize().unwrap_err();
    assert!(
        err.message.contains("a deliberate failure"),
        "{}",
        err.message
    );

    // Streams still run work afterwards; preparing again is harmless.
    let ran_later = Arc::new(AtomicBool::new(false));
    default0.submit(flag_after(0, &ran_later)).unwrap();
    default0.synchronize().unwrap();
    assert!(ran_later.load(Ordering::SeqCst));
    assert_eq!(orPrepareHostExit(), OR_SUCCESS);
    assert_eq!(orKernelReleaseBegin(), 0);
}
