//! The runtime core (Note [Layers] in src/lib.rs): devices, their streams
//! and the one door all device work passes (`stream`), events, the
//! stream-ordered caching allocator, the kernel pool, graph capture and
//! replay, random generators, lifecycle, the device controls (stop and
//! restart, op timeout, utilization, profiler activity), and the hook
//! points where diagnostics attach (`hooks`). May use: `base`, `memory`.

pub mod allocator;
pub mod device;
pub mod device_stop;
pub mod event;
pub mod generator;
pub mod graph;
pub mod hooks;
pub mod kernel_pool;
pub mod lifecycle;
pub mod op_timeout;
pub mod profiler;
pub mod stream;
pub mod utilization;
