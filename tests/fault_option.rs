//! `OPENREG_FAULT=kind[:after]` (Note [Injected faults]): the option arms a
//! fault from the start of the process. Its own test binary, so the variable
//! is set before the runtime reads its options.

use torch_openreg::runtime::device;
use torch_openreg::diagnostics::fault::{self, Fault};
use torch_openreg::runtime::stream::Task;

#[test]
fn the_option_arms_a_kernel_fault_counted_from_the_start() {
    std::env::set_var("OPENREG_FAULT", "kernel:1");
    let stream = device::context(0).unwrap().streams.get(0).unwrap();
    stream.submit(Task::Run(Box::new(|| Ok(())))).unwrap();
    stream.synchronize().unwrap(); // the one allowed to succeed
    stream.submit(Task::Run(Box::new(|| Ok(())))).unwrap();
    let error = stream.synchronize().unwrap_err();
    assert_eq!(
        error.message,
        "injected fault (kernel): a kernel on openreg stream 0 on device 0 failed (OPENREG_FAULT)"
    );
    // Once only; the stream keeps working.
    stream.submit(Task::Run(Box::new(|| Ok(())))).unwrap();
    stream.synchronize().unwrap();
    // A later injection says where it came from.
    fault::inject(Fault::Kernel, 0);
    stream.submit(Task::Run(Box::new(|| Ok(())))).unwrap();
    assert!(stream
        .synchronize()
        .unwrap_err()
        .message
        .ends_with("(torch.openreg._inject_fault)"));
}
