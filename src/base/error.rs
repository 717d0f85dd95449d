//! The runtime's error type and its one-time warnings.
//!
//! Every message names what was wrong (device index and count, stream, event)
//! so it can be shown to a Python or C++ user unchanged.

use std::fmt;

/// The runtime's error codes. They double as the C ABI's `orError_t`
/// (see `include/openreg.h`), so their numbers are part of the ABI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum ErrorKind {
    InvalidDevice = 1,
    InvalidValue = 2,
    InvalidHandle = 3,
    NotReady = 4,
    BadFork = 5,
    NoDevice = 6,
    OutOfMemory = 7,
    /// Not permitted during graph capture, or a capture that failed
    /// (`cudaErrorStreamCapture*`).
    StreamCapture = 8,
    /// The device is stopped (`orDeviceStop`; Note [Stopped devices]).
    DeviceStopped = 9,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
        }
    }

    pub fn invalid_value(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidValue, message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// Emits `message` once per process as a warning (`crate::base::log`).
/// Used on paths that must not fail (`noexcept` guard methods, option parsing).
pub fn warn_once(message: &str) {
    crate::base::log::once(crate::base::log::Level::Warn, message)
}
