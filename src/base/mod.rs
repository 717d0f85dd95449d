//! The ground floor: what every other layer uses and that uses nothing of
//! theirs (Note [Layers] in src/lib.rs): errors, the options read from the
//! environment, logging, and the hooks through which a lower layer lets a
//! higher one act. May use: nothing else in the crate.

pub mod error;
pub mod hook;
pub mod log;
pub mod options;
