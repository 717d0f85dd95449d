//! Note [Invalid options]: an unusable `OPENREG_*` value fails the runtime's
//! initialization, every time, naming the variable, while the device count
//! and the options stay readable. Its own test binary (one test), so the
//! variables are set before the runtime reads its options.

use torch_openreg::base::error::ErrorKind;
use torch_openreg::{runtime::device, base::options};

#[test]
fn initialization_fails_naming_each_invalid_variable() {
    std::env::set_var("OPENREG_LAUNCH_BLOCKING", "maybe");
    std::env::set_var("OPENREG_LOG", "loud");
    std::env::set_var("OPENREG_DEVICE_COUNT", "3");

    // Nothing that needs no initialization fails.
    assert_eq!(device::device_count(), 3);
    assert_eq!(options::get().source("OPENREG_LOG"), "invalid");
    assert!(device::set_device(2).is_ok());

    let expected = "openreg cannot initialize: invalid option values: \
                    OPENREG_LAUNCH_BLOCKING=\"maybe\" (expected 0 or 1); \
                    OPENREG_LOG=\"loud\" (expected one of error, warn, info, debug); \
                    fix or unset these variables";
    for _ in 0..2 {
        let error = device::init().unwrap_err();
        assert_eq!(
            (error.kind, error.message.as_str()),
            (ErrorKind::InvalidValue, expected)
        );
        // First use initializes, so it fails the same way and creates nothing.
        let error = device::context(1)
            .err()
            .expect("a context despite invalid options");
        assert_eq!(error.message, expected);
    }
    assert!(!device::is_initialized());
    assert_eq!(device::existing_contexts().count(), 0);
}
