//! Memory below the runtime (Note [Layers] in src/lib.rs): raw device memory
//! (page mappings with a capacity, shareable between processes), pinned
//! host memory, the statistics both allocators keep, and the allocation
//! history behind memory snapshots. The caching allocator that carves
//! device memory into blocks is stream-ordered, so it lives with the
//! streams in `runtime`. May use: `base`.

pub mod device_memory;
pub mod history;
pub mod pinned;
pub mod stat;
