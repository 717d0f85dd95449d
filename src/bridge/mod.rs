//! The only code that talks to C++ or C (Note [Layers] in src/lib.rs): the
//! cxx bridge the C++ shim calls through (`ffi`) and the plain C ABI of
//! `include/openreg.h` (`capi`). May use: `base`, `memory`, `runtime`,
//! `diagnostics`.

pub mod capi;
pub(crate) mod ffi;
