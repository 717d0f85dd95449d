//! The caching device allocator: one per device, with CUDA's pools, block
//! splitting, per-stream reuse, deferred reuse after `record_stream`, and
//! CUDA-shaped statistics.
//!
//! Note [Caching allocator]: device memory is mapped in segments (`device_memory.rs`)
//! and carved into blocks. Requests up to 1 MiB come from the small pool
//! (2 MiB segments), larger ones from the large pool (20 MiB segments, or the
//! request rounded up to 2 MiB when it is 10 MiB or more). A freed block goes
//! back to a free list keyed by the stream that allocated it, so only work on
//! that stream — which runs in order — can reuse it without synchronization.
//! Blocks of one segment merge again when adjacent ones are free. A block that
//! other streams used (`record_stream`) is "pending" after free: it is reused
//! only once each of those streams has passed the point where it was freed.
//! Mapped memory is returned only by `empty_cache`, or when an allocation
//! would otherwise fail: then cached segments are released, pending frees
//! are waited for, and only if that is not enough is it out of memory.
//!
//! Note [Stream-ordered memory]: as with CUDA, a block is free the moment
//! its tensor is, even while kernels queued on its stream still use it:
//! queued kernels do not keep device memory alive. That is safe because
//! only later work on the same stream can get the block again. Unmapping is
//! the exception — no queued kernel may touch a segment after it — so each
//! segment remembers how far its stream had got when a block of it was last
//! freed, and is unmapped only once the stream has passed that point:
//! `empty_cache` and the out-of-memory retry wait for it with the lock
//! released, and `release_cached_segments` skips a segment short of it.
//!
//! Note [Graph pools]: a graph's private pool (src/runtime/graph.rs) is one more
//! owner of free blocks beside the streams. While a stream captures, its
//! allocations come from the capture's pool: segments mapped for that pool
//! and blocks freed into it, never from a stream's free list, and a block
//! of the pool, freed, returns to the pool. So memory a captured kernel
//! uses is never handed to eager work while the graph lives, and replays
//! (which run the recorded work in recorded order) find their buffers
//! where the capture left them. A pool lives while a graph uses it (graphs
//! may share one, `retain_pool`); once released, its free segments are
//! unmapped like any cached segment, and blocks still allocated from it
//! (a graph's outputs the user kept) free into it and go the same way.
//! A pool's blocks are used by replays and the work after them on any
//! stream, so a pool segment is unmapped only once every stream of the
//! device has passed the point of its last free (`other_users`).
//!
//! Note [Device memory generations]: a device restart (Note [Stopped
//! devices] in device_stop.rs) begins a new generation of its memory. Each
//! allocation records the generation it was made in; one made before the
//! restart is stale, and the shim refuses to make a CPU view of stale
//! memory (`cpp/device/memory_generation.h`, called where device tensors become CPU
//! views for kernels), so using a tensor from before a restart raises an
//! error naming it instead of computing on it. Stale memory stays mapped
//! until its tensor frees it: a kernel still running from before the stop,
//! or a view some code still holds, never touches unmapped memory, which
//! would crash the process. Freed, a stale block is an ordinary free block
//! (a later allocation records the new generation). The restart unmaps the
//! cached segments no queued kernel can still touch, without waiting.
//! Checking costs one atomic load while no stale allocation is live
//! (`STALE_ALLOCATIONS`, every device together); only then is the address
//! looked up.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::{Mutex, MutexGuard};

use crate::runtime::device::DeviceIndex;
use crate::base::error::{Error, ErrorKind, Result};
use crate::memory::device_memory;
use crate::memory::history::{
    self, Action, BlockSnapshot, DeviceSnapshot, Frames, SegmentSnapshot, Trace, TraceEntry,
};
use crate::base::options;
use crate::runtime::hooks;
use crate::runtime::stream::StreamQueue;

pub const MIN_BLOCK: usize = 512;
pub const SMALL_REQUEST: usize = 1 << 20;
pub const SMALL_SEGMENT: usize = 2 << 20;
pub const LARGE_SEGMENT: usize = 20 << 20;
pub const MIN_LARGE_ALLOC: usize = 10 << 20;
pub const LARGE_ROUNDING: usize = 2 << 20;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Pool {
    Small = 0,
    Large = 1,
}

pub use crate::memory::stat::Stat;

/// A statistic for all pools (index 0), the small pool (1) and the large (2).
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatArray(pub [Stat; 3]);

impl StatArray {
    fn increase(&mut self, pool: Pool, amount: usize) {
        self.0[0].increase(amount);
        self.0[1 + pool as usize].increase(amount);
    }

    fn decrease(&mut self, pool: Pool, amount: usize) {
        self.0[0].decrease(amount);
        self.0[1 + pool as usize].decrease(amount);
    }

    fn each(&mut self, f: impl Fn(&mut Stat)) {
        self.0.iter_mut().for_each(f)
    }

    pub fn all(&self) -> Stat {
        self.0[0]
    }
}

/// The allocator's statistics, with the meaning CUDA gives each field.
#[derive(Default, Clone, Debug, PartialEq, Eq)]
pub struct DeviceStats {
    pub allocation: StatArray,
    pub segment: StatArray,
    pub active: StatArray,
    pub inactive_split: StatArray,
    pub allocated_bytes: StatArray,
    pub reserved_bytes: StatArray,
    pub active_bytes: StatArray,
    pub inactive_split_bytes: StatArray,
    pub requested_bytes: StatArray,
    pub num_alloc_retries: i64,
    pub num_ooms: i64,
    pub num_sync_all_streams: i64,
    pub num_device_alloc: i64,
    pub num_device_free: i64,
    pub oversize_allocations: Stat,
    pub oversize_segments: Stat,
    pub max_split_size: i64,
}

impl DeviceStats {
    fn arrays(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum BlockState {
    Free,
    Allocated,
    /// Freed by its owner, still possibly in use by a recorded stream.
    Pending,
}

struct Block {
    ptr: usize,
    size: usize,
    requested: usize,
    segment: usize,
    /// The size of the segment: a block smaller than it is a split block.
    segment_size: usize,
    stream: &'static StreamQueue,
    /// The free list the block returns to: its stream's, or a graph pool's
    /// (`owner_key`, Note [Graph pools]).
    owner: usize,
    pool: Pool,
    state: BlockState,
    /// Neighbours within the segment, by address.
    prev: Option<BlockId>,
    next: Option<BlockId>,
    /// Streams other than `stream` that used the block (`record_stream`).
    uses: Vec<&'static StreamQueue>,
    /// Who allocated it, while memory history records stacks.
    frames: Frames,
    /// The device memory generation it was allocated in (Note [Device
    /// memory generations]); meaningless while free.
    generation: u64,
}

impl Block {
    fn is_split(&self) -> bool {
        self.size != self.segment_size
    }
}

/// A block's index in `State::blocks`. Neighbours and free lists refer to
/// blocks by id, so the hot paths index a vector instead of hashing
/// addresses; only `free` (which knows just the address) looks one up.
type BlockId = u32;

struct Segment {
    size: usize,
    pool: Pool,
    stream: &'static StreamQueue,
    /// `stream`'s key, or the graph pool's the segment was mapped for.
    owner: usize,
    /// The block at the segment's base: it stays the first block through
    /// every split and merge.
    first: BlockId,
    /// The end of `stream` when a block of this segment was last freed: no
    /// queued kernel uses the segment once the stream has completed it
    /// (Note [Stream-ordered memory]).
    last_free: u64,
    /// A graph pool's segment only: the end of every stream of the device
    /// that had unfinished work when a block was last freed. A graph's
    /// blocks are used by its replays and the work after them on any
    /// stream, not only the capturing one (Note [Graph pools]).
    other_users: Vec<(&'static StreamQueue, u64)>,
}

impl Segment {
    /// Whether no queued kernel can touch the segment any more.
    fn unused(&self) -> bool {
        self.stream.has_completed(self.last_free)
            && self
                .other_users
                .iter()
                .all(|(s, seq)| s.has_completed(*seq))
    }
}

struct PendingFree {
    block: BlockId,
    /// `(stream, seq)`: the block is reusable once every stream has completed `seq`.
    markers: Vec<(&'static StreamQueue, u64)>,
}

/// A free-list key: owner (stream or graph pool), then best fit by size,
/// then address; last the block itself.
type FreeKey = (usize, usize, usize, BlockId);

/// A stream's owner key: its address (even, being aligned).
fn stream_key(stream: &'static StreamQueue) -> usize {
    stream as *const StreamQueue as usize
}

/// The owner key of the graph pool numbered `index`: odd, so it never
/// equals a stream's.
fn graph_pool_key(index: usize) -> usize {
    index << 1 | 1
}

/// The owner an allocation for work on `stream` comes from: the pool of
/// the capture it records into, else the stream itself.
fn owner_key(stream: &'static StreamQueue) -> usize {
    match stream.capture_pool() {
        0 => stream_key(stream),
        pool => pool,
    }
}

/// A graph pool's owner key and how many graphs use it.
struct GraphPool {
    key: usize,
    users: usize,
}

/// Hashes block addresses (distinct multiples of 512) with one multiply:
/// SipHash's flooding resistance buys nothing for our own pointers and costs
/// a visible share of every allocation.
#[derive(Default)]
struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_usize(&mut self, address: usize) {
        self.0 = (address as u64 >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

#[derive(Default)]
struct State {
    /// Every block of every mapped segment; the ids of blocks merged into a
    /// neighbour or unmapped wait in `unused_ids` for reuse.
    blocks: Vec<Block>,
    unused_ids: Vec<BlockId>,
    /// Allocated blocks by address.
    allocated: HashMap<usize, BlockId, BuildHasherDefault<AddressHasher>>,
    free: [BTreeSet<FreeKey>; 2],
    pending: Vec<PendingFree>,
    segments: BTreeMap<usize, Segment>,
    /// Set by `set_memory_fraction`; the capacity otherwise.
    limit: Option<usize>,
    stats: DeviceStats,
    /// Recent events, while memory history records (Note [Memory history]).
    trace: Trace,
    /// Live graph pools (Note [Graph pools]); `pools_made` numbers them.
    graph_pools: HashMap<crate::runtime::graph::MempoolId, GraphPool>,
    pools_made: usize,
    /// The current memory generation: the number of device restarts
    /// (Note [Device memory generations]).
    generation: u64,
    device: DeviceIndex,
}

/// Why an allocation failed: the C++ side raises `torch.OutOfMemoryError`
/// for `out_of_memory` and a `RuntimeError` otherwise.
pub struct AllocError {
    pub error: Error,
    pub out_of_memory: bool,
}

pub struct DeviceAllocator {
    device: DeviceIndex,
    capacity: usize,
    state: Mutex<State>,
}

fn round_size(size: usize) -> usize {
    size.max(MIN_BLOCK).div_ceil(MIN_BLOCK) * MIN_BLOCK
}

fn segment_size(size: usize) -> usize {
    if size <= SMALL_REQUEST {
        SMALL_SEGMENT
    } else if size < MIN_LARGE_ALLOC {
        LARGE_SEGMENT
    } else {
        size.div_ceil(LARGE_ROUNDING) * LARGE_ROUNDING
    }
}

fn pool_of(size: usize) -> Pool {
    if size <= SMALL_REQUEST {
        Pool::Small
    } else {
        Pool::Large
    }
}

fn should_split(pool: Pool, remaining: usize) -> bool {
    match pool {
        Pool::Small => remaining >= MIN_BLOCK,
        Pool::Large => remaining > SMALL_REQUEST,
    }
}

impl State {
    fn block(&self, id: BlockId) -> &Block {
        &self.blocks[id as usize]
    }

    fn block_mut(&mut self, id: BlockId) -> &mut Block {
        &mut self.blocks[id as usize]
    }

    fn new_block(&mut self, block: Block) -> BlockId {
        match self.unused_ids.pop() {
            Some(id) => {
                self.blocks[id as usize] = block;
                id
            }
            None => {
                self.blocks.push(block);
                BlockId::try_from(self.blocks.len() - 1).expect("fewer than 2^32 blocks")
            }
        }
    }

    fn retire_block(&mut self, id: BlockId) {
        self.unused_ids.push(id);
    }

    fn free_key(&self, id: BlockId) -> FreeKey {
        let block = self.block(id);
        (block.owner, block.size, block.ptr, id)
    }

    fn add_free(&mut self, id: BlockId) {
        let key = self.free_key(id);
        let block = self.block(id);
        let (pool, size, split) = (block.pool, block.size, block.is_split());
        self.free[pool as usize].insert(key);
        if split {
            self.stats.inactive_split.increase(pool, 1);
            self.stats.inactive_split_bytes.increase(pool, size);
        }
    }

    fn remove_free(&mut self, id: BlockId) {
        let key = self.free_key(id);
        let block = self.block(id);
        let (pool, size, split) = (block.pool, block.size, block.is_split());
        let removed = self.free[pool as usize].remove(&key);
        debug_assert!(removed, "free block missing from its free list");
        if split {
            self.stats.inactive_split.decrease(pool, 1);
            self.stats.inactive_split_bytes.decrease(pool, size);
        }
    }

    fn free_neighbour(&self, neighbour: Option<BlockId>) -> Option<BlockId> {
        neighbour.filter(|&n| self.block(n).state == BlockState::Free)
    }

    /// Makes a no-longer-used block free, merging it with free neighbours.
    fn release_block(&mut self, mut id: BlockId) {
        let (pool, size) = (self.block(id).pool, self.block(id).size);
        self.stats.active.decrease(pool, 1);
        self.stats.active_bytes.decrease(pool, size);
        if let Some(prev) = self.free_neighbour(self.block(id).prev) {
            self.remove_free(prev);
            let next = self.block(id).next;
            let merged = self.block_mut(prev);
            merged.size += size;
            merged.next = next;
            if let Some(next) = next {
                self.block_mut(next).prev = Some(prev);
            }
            self.retire_block(id);
            id = prev;
        }
        if let Some(next) = self.free_neighbour(self.block(id).next) {
            self.remove_free(next);
            let (absorbed, after) = (self.block(next).size, self.block(next).next);
            let block = self.block_mut(id);
            block.size += absorbed;
            block.next = after;
            if let Some(after) = after {
                self.block_mut(after).prev = Some(id);
            }
            self.retire_block(next);
        }
        let block = self.block_mut(id);
        block.state = BlockState::Free;
        block.uses.clear();
        block.frames = None;
        let (segment, stream, owner) = (block.segment, block.stream, block.owner);
        let other_users = if owner & 1 == 1 {
            self.unfinished_streams()
        } else {
            Vec::new()
        };
        let seg = self.segments.get_mut(&segment).expect("segment exists");
        seg.last_free = stream.marker();
        seg.other_users = other_users;
        self.add_free(id);
    }

    /// Frees every pending block whose recorded streams have all passed it.
    fn process_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|p| {
                p.markers
                    .iter()
                    .all(|(stream, seq)| stream.has_completed(*seq))
            });
        self.pending = waiting;
        for p in ready {
            let block = self.block(p.block);
            let (addr, size, stream) = (block.ptr, block.size, block.stream.id());
            self.note(TraceEntry::new(
                Action::FreeCompleted,
                addr,
                size,
                stream,
                None,
            ));
            self.release_block(p.block);
        }
    }

    /// Segments that are entirely one free block, except those of a live
    /// graph pool (whose replays use blocks freed during capture).
    fn cached_segments(&self) -> impl Iterator<Item = (&usize, &Segment)> {
        self.segments.iter().filter(|(_, seg)| {
            let first = self.block(seg.first);
            first.state == BlockState::Free
                && first.size == seg.size
                && !self.is_live_pool(seg.owner)
        })
    }

    fn is_live_pool(&self, owner: usize) -> bool {
        owner & 1 == 1 && self.graph_pools.values().any(|p| p.key == owner)
    }

    /// The current end of every stream of this device with unfinished work.
    fn unfinished_streams(&self) -> Vec<(&'static StreamQueue, u64)> {
        crate::runtime::device::existing_contexts()
            .find(|ctx| ctx.index == self.device)
            .map_or_else(Vec::new, |ctx| ctx.streams.unfinished_points())
    }

    /// The stream points to wait for before the cache can be released:
    /// those of pending frees, and the last frees of cached segments.
    fn release_waits(&self) -> Vec<(&'static StreamQueue, u64)> {
        let pending = self.pending.iter().flat_map(|p| p.markers.iter().copied());
        let cached = self.cached_segments().flat_map(|(_, seg)| {
            std::iter::once((seg.stream, seg.last_free)).chain(seg.other_users.iter().copied())
        });
        pending
            .chain(cached)
            .filter(|(stream, seq)| !stream.has_completed(*seq))
            .collect()
    }

    /// Unmaps every cached segment that no queued kernel can still touch
    /// (Note [Stream-ordered memory]).
    fn release_cached_segments(&mut self, which: impl Fn(&Segment) -> bool) {
        let whole: Vec<usize> = self
            .cached_segments()
            .filter(|(_, seg)| which(seg) && seg.unused())
            .map(|(base, _)| *base)
            .collect();
        for base in whole {
            let seg = self.segments.remove(&base).expect("segment exists");
            self.remove_free(seg.first);
            self.retire_block(seg.first);
            device_memory::unmap(base, seg.size);
            if let Some(observer) = hooks::MEMORY_OBSERVER.get() {
                observer.unmapped(base, seg.size);
            }
            self.note(TraceEntry::new(
                Action::SegmentFree,
                base,
                seg.size,
                seg.stream.id(),
                None,
            ));
            self.stats.segment.decrease(seg.pool, 1);
            self.stats.reserved_bytes.decrease(seg.pool, seg.size);
            self.stats.num_device_free += 1;
        }
    }

    /// Records `entry` if memory history records events.
    fn note(&mut self, entry: TraceEntry) {
        if let Some(settings) = history::current() {
            self.trace.record(&settings, entry);
        }
    }

    fn reserved(&self) -> usize {
        self.stats.reserved_bytes.all().current as usize
    }

    fn best_fit(&self, pool: Pool, key: usize, size: usize) -> Option<BlockId> {
        self.free[pool as usize]
            .range((key, size, 0, 0)..)
            .next()
            .filter(|(k, _, _, _)| *k == key)
            .map(|(_, _, _, id)| *id)
    }

    fn map_segment(
        &mut self,
        size: usize,
        pool: Pool,
        stream: &'static StreamQueue,
        owner: usize,
        frames: &Frames,
    ) -> Result<BlockId> {
        let base = device_memory::map(size)?;
        self.note(TraceEntry::new(
            Action::SegmentAlloc,
            base,
            size,
            stream.id(),
            frames.clone(),
        ));
        let first = self.new_block(Block {
            ptr: base,
            size,
            requested: 0,
            segment: base,
            segment_size: size,
            stream,
            owner,
            pool,
            state: BlockState::Free,
            prev: None,
            next: None,
            uses: Vec::new(),
            frames: None,
            generation: 0,
        });
        self.segments.insert(
            base,
            Segment {
                size,
                pool,
                stream,
                owner,
                first,
                last_free: 0,
                other_users: Vec::new(),
            },
        );
        self.stats.segment.increase(pool, 1);
        self.stats.reserved_bytes.increase(pool, size);
        self.stats.num_device_alloc += 1;
        self.add_free(first);
        Ok(first)
    }
}

impl DeviceAllocator {
    pub fn new(device: DeviceIndex) -> DeviceAllocator {
        let state = State {
            stats: DeviceStats {
                max_split_size: i64::MAX,
                ..Default::default()
            },
            device,
            ..Default::default()
        };
        DeviceAllocator {
            device,
            capacity: options::get().device_memory,
            state: Mutex::new(state),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// `size` bytes for work on `stream`; 0 bytes is the null pointer.
    pub fn malloc(
        &self,
        size: usize,
        stream: &'static StreamQueue,
    ) -> std::result::Result<usize, AllocError> {
        let ptr = self.malloc_block(size, stream)?;
        if let Some(observer) = hooks::MEMORY_OBSERVER.get() {
            observer.allocated(ptr, size, stream);
        }
        Ok(ptr)
    }

    fn malloc_block(
        &self,
        size: usize,
        stream: &'static StreamQueue,
    ) -> std::result::Result<usize, AllocError> {
        if size == 0 {
            return Ok(0);
        }
        if let Err(error) = crate::runtime::device_stop::check_running(self.device) {
            return Err(AllocError {
                error,
                out_of_memory: false,
            });
        }
        if let Some(hook) = hooks::BEFORE_ALLOC.get() {
            if let Err(error) = hook(self.device, size) {
                let out_of_memory = error.kind == ErrorKind::OutOfMemory;
                return Err(AllocError {
                    error,
                    out_of_memory,
                });
            }
        }
        // Captured before locking: the collector may take the host's locks.
        let frames = history::current()
            .filter(|s| s.alloc_stacks)
            .and_then(|_| history::capture());
        let mut st = self.state.lock();
        if size > self.capacity {
            // Cannot fit however much is freed (and would overflow rounding).
            let limit = st.limit.unwrap_or(self.capacity);
            return Err(self.out_of_memory(&mut st, size, limit, stream, frames));
        }
        let rounded = round_size(size);
        let pool = pool_of(rounded);
        let owner = owner_key(stream);
        st.process_pending();
        let id = match st.best_fit(pool, owner, rounded) {
            Some(id) => id,
            None => self.grow(&mut st, rounded, size, pool, stream, owner, &frames)?,
        };

        st.remove_free(id);
        let (ptr, remaining) = (st.block(id).ptr, st.block(id).size - rounded);
        if should_split(pool, remaining) {
            let (segment, segment_size, next, block_stream) = {
                let b = st.block_mut(id);
                b.size = rounded;
                (b.segment, b.segment_size, b.next, b.stream)
            };
            let rest = st.new_block(Block {
                ptr: ptr + rounded,
                size: remaining,
                requested: 0,
                segment,
                segment_size,
                stream: block_stream,
                owner,
                pool,
                state: BlockState::Free,
                prev: Some(id),
                next,
                uses: Vec::new(),
                frames: None,
                generation: 0,
            });
            st.block_mut(id).next = Some(rest);
            if let Some(next) = next {
                st.block_mut(next).prev = Some(rest);
            }
            st.add_free(rest);
        }
        let generation = st.generation;
        let block = st.block_mut(id);
        block.state = BlockState::Allocated;
        block.requested = size;
        block.frames = frames.clone();
        block.generation = generation;
        let got = block.size;
        st.note(TraceEntry::new(
            Action::Alloc,
            ptr,
            got,
            stream.id(),
            frames,
        ));
        st.allocated.insert(ptr, id);
        st.stats.allocation.increase(pool, 1);
        st.stats.allocated_bytes.increase(pool, got);
        st.stats.requested_bytes.increase(pool, size);
        st.stats.active.increase(pool, 1);
        st.stats.active_bytes.increase(pool, got);
        Ok(ptr)
    }

    /// Maps a new segment for a request, releasing cache and waiting for
    /// pending frees first if the limit would be exceeded.
    #[cold]
    fn grow(
        &self,
        st: &mut MutexGuard<'_, State>,
        rounded: usize,
        requested: usize,
        pool: Pool,
        stream: &'static StreamQueue,
        owner: usize,
        frames: &Frames,
    ) -> std::result::Result<BlockId, AllocError> {
        let seg = segment_size(rounded);
        let limit = st.limit.unwrap_or(self.capacity);
        if st.reserved() + seg > limit {
            st.stats.num_alloc_retries += 1;
            let waits = st.release_waits();
            if wait_unlocked(st, waits) {
                st.stats.num_sync_all_streams += 1;
            }
            st.process_pending();
            if let Some(id) = st.best_fit(pool, owner, rounded) {
                return Ok(id);
            }
            st.release_cached_segments(|_| true);
        }
        if st.reserved() + seg > limit {
            return Err(self.out_of_memory(st, requested, limit, stream, frames.clone()));
        }
        st.map_segment(seg, pool, stream, owner, frames)
            .map_err(|error| AllocError {
                error,
                out_of_memory: false,
            })
    }

    /// Counts and records an allocation of `requested` bytes that does not fit.
    #[cold]
    fn out_of_memory(
        &self,
        st: &mut State,
        requested: usize,
        limit: usize,
        stream: &'static StreamQueue,
        frames: Frames,
    ) -> AllocError {
        st.stats.num_ooms += 1;
        let mut entry = TraceEntry::new(Action::Oom, 0, requested, stream.id(), frames);
        entry.device_free = limit.saturating_sub(st.reserved());
        st.note(entry);
        AllocError {
            error: self.oom_error(st, requested, limit),
            out_of_memory: true,
        }
    }

    #[cold]
    fn oom_error(&self, st: &State, requested: usize, limit: usize) -> Error {
        let allocated = st.stats.allocated_bytes.all().current as usize;
        let reserved = st.reserved();
        Error::new(
            ErrorKind::OutOfMemory,
            format!(
                "openreg out of memory on device {}: tried to allocate {} ({requested} bytes); the device has a capacity of {} \
                 ({} usable by this process), of which {} is allocated by PyTorch, {} reserved by the caching allocator, and {} free",
                self.device,
                human(requested),
                human(self.capacity),
                human(limit),
                human(allocated),
                human(reserved),
                human(limit.saturating_sub(reserved)),
            ),
        )
    }

    /// Returns `ptr` to the cache (see Note [Caching allocator]).
    pub fn free(&self, ptr: usize) -> Result<()> {
        self.try_free(ptr).unwrap_or_else(|| {
            Err(Error::invalid_value(format!(
                "free of {ptr:#x} on openreg device {}: not a live allocation of this device",
                self.device
            )))
        })
    }

    /// `free`, or `None` when `ptr` is not a live allocation of this device.
    fn try_free(&self, ptr: usize) -> Option<Result<()>> {
        if ptr == 0 {
            return Some(Ok(()));
        }
        let frames = history::current()
            .filter(|s| s.free_stacks)
            .and_then(|_| history::capture());
        let mut st = self.state.lock();
        let id = st.allocated.remove(&ptr)?;
        let generation = st.generation;
        let block = st.block_mut(id);
        if block.generation != generation {
            STALE_ALLOCATIONS.fetch_sub(1, Ordering::AcqRel);
        }
        let (pool, size, requested, stream) =
            (block.pool, block.size, block.requested, block.stream.id());
        let markers: Vec<_> = block
            .uses
            .iter()
            .map(|s| (*s, s.marker()))
            .filter(|(s, seq)| !s.has_completed(*seq))
            .collect();
        if markers.is_empty() {
            block.state = BlockState::Free; // release_block finishes the transition
        } else {
            block.state = BlockState::Pending;
        }
        st.stats.allocation.decrease(pool, 1);
        st.stats.allocated_bytes.decrease(pool, size);
        st.stats.requested_bytes.decrease(pool, requested);
        st.note(TraceEntry::new(
            Action::FreeRequested,
            ptr,
            size,
            stream,
            frames.clone(),
        ));
        let observer = hooks::MEMORY_OBSERVER.get();
        let recorded = match observer {
            Some(observer) if observer.active() => st.block(id).uses.clone(),
            _ => Vec::new(),
        };
        if markers.is_empty() {
            st.note(TraceEntry::new(
                Action::FreeCompleted,
                ptr,
                size,
                stream,
                frames,
            ));
            st.release_block(id);
        } else {
            st.pending.push(PendingFree { block: id, markers });
        }
        drop(st); // the observer locks its own state, never under ours
        if let Some(observer) = observer {
            observer.freed(ptr, &recorded);
        }
        Some(Ok(()))
    }

    /// Marks `ptr` as used by `stream` too, deferring its reuse after free
    /// until `stream` has finished the work queued before the free.
    pub fn record_stream(&self, ptr: usize, stream: &'static StreamQueue) -> Result<()> {
        let mut st = self.state.lock();
        match st.allocated.get(&ptr).copied() {
            Some(id) => {
                let b = st.block_mut(id);
                if !std::ptr::eq(b.stream, stream) && !b.uses.iter().any(|s| std::ptr::eq(*s, stream)) {
                    b.uses.push(stream);
                }
                Ok(())
            }
            _ => Err(Error::invalid_value(format!(
                "record_stream: {ptr:#x} is not the start of a live allocation on openreg device {}",
                self.device
            ))),
        }
    }

    /// Releases every cached segment that holds no live block.
    pub fn empty_cache(&self) {
        let mut st = self.state.lock();
        let waits = st.release_waits();
        wait_unlocked(&mut st, waits);
        st.process_pending();
        st.release_cached_segments(|_| true);
    }

    /// Begins a new memory generation (a device restart): every live
    /// allocation becomes stale, and the cached segments no queued kernel
    /// can touch are unmapped, without waiting (Note [Device memory
    /// generations]).
    pub fn begin_generation(&self) {
        let mut st = self.state.lock();
        st.generation += 1;
        STALE_ALLOCATIONS.fetch_add(st.allocated.len(), Ordering::AcqRel);
        st.process_pending();
        st.release_cached_segments(|_| true);
    }

    /// The error for `ptr` if it is a live allocation of an earlier
    /// generation of this device; `None` for anything else.
    fn stale_error(&self, ptr: usize) -> Option<Error> {
        let st = self.state.lock();
        let block = st.block(*st.allocated.get(&ptr)?);
        (block.generation != st.generation).then(|| {
            let device = self.device;
            Error::new(
                ErrorKind::InvalidValue,
                format!(
                    "this openreg tensor's memory ({} bytes at {ptr:#x}) was allocated on device {device} before \
                     torch.openreg.restart_device({device}); memory from before a device restart cannot be used: \
                     create the tensor again",
                    block.requested
                ),
            )
        })
    }

    /// One more graph uses the pool `id` (created on first use); returns
    /// its owner key (Note [Graph pools]).
    pub fn retain_pool(&self, id: crate::runtime::graph::MempoolId) -> usize {
        let mut st = self.state.lock();
        if let Some(pool) = st.graph_pools.get_mut(&id) {
            pool.users += 1;
            return pool.key;
        }
        st.pools_made += 1;
        let key = graph_pool_key(st.pools_made);
        st.graph_pools.insert(id, GraphPool { key, users: 1 });
        key
    }

    /// One graph less uses the pool `id`; the last one releases it: its
    /// cached segments are unmapped now if no queued kernel can touch them
    /// (else by the next `empty_cache`), and its blocks still allocated are
    /// cached like any other once freed. Never waits: it may run on a
    /// stream's worker (dropping a graph's last launch).
    pub fn release_pool(&self, id: crate::runtime::graph::MempoolId) {
        let mut st = self.state.lock();
        let Some(pool) = st.graph_pools.get_mut(&id) else {
            return;
        };
        pool.users -= 1;
        if pool.users == 0 {
            let key = pool.key;
            st.graph_pools.remove(&id);
            st.release_cached_segments(|seg| seg.owner == key);
        }
    }

    pub fn stats(&self) -> DeviceStats {
        self.state.lock().stats.clone()
    }

    pub fn reset_peak_stats(&self) {
        let mut st = self.state.lock();
        for array in st.stats.arrays() {
            array.each(|s| s.peak = s.current);
        }
        st.stats.oversize_allocations.peak = st.stats.oversize_allocations.current;
        st.stats.oversize_segments.peak = st.stats.oversize_segments.current;
    }

    pub fn reset_accumulated_stats(&self) {
        let mut st = self.state.lock();
        for array in st.stats.arrays() {
            array.each(|s| {
                s.allocated = 0;
                s.freed = 0
            });
        }
        let s = &mut st.stats;
        (
            s.num_alloc_retries,
            s.num_ooms,
            s.num_sync_all_streams,
            s.num_device_alloc,
            s.num_device_free,
        ) = (0, 0, 0, 0, 0);
    }

    /// `(free, total)` bytes as the device sees them: total is the capacity,
    /// free is what is not reserved by this allocator.
    pub fn memory_info(&self) -> (usize, usize) {
        let st = self.state.lock();
        (self.capacity.saturating_sub(st.reserved()), self.capacity)
    }

    /// Caps what this process may reserve at `fraction` of the capacity.
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<()> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(Error::invalid_value(format!(
                "memory fraction {fraction} for openreg device {} is invalid: it must be within 0..=1",
                self.device
            )));
        }
        self.state.lock().limit = Some((self.capacity as f64 * fraction) as usize);
        Ok(())
    }

    /// The segments with their blocks, and the recorded events
    /// (Note [Memory history]).
    pub fn snapshot(&self) -> DeviceSnapshot {
        let st = self.state.lock();
        let segments = st
            .segments
            .iter()
            .map(|(&address, seg)| {
                let mut blocks = Vec::new();
                let mut next = Some(seg.first);
                while let Some(id) = next {
                    let b = st.block(id);
                    let state = match b.state {
                        BlockState::Allocated => "active_allocated",
                        BlockState::Pending => "active_awaiting_free",
                        BlockState::Free => "inactive",
                    };
                    let requested_size = if b.state == BlockState::Free {
                        0
                    } else {
                        b.requested
                    };
                    blocks.push(BlockSnapshot {
                        address: b.ptr,
                        size: b.size,
                        requested_size,
                        state,
                        frames: b.frames.clone(),
                    });
                    next = b.next;
                }
                let segment_type = match seg.pool {
                    Pool::Small => "small",
                    Pool::Large => "large",
                };
                SegmentSnapshot {
                    device: self.device,
                    address,
                    total_size: seg.size,
                    stream: seg.stream.id(),
                    segment_type,
                    blocks,
                }
            })
            .collect();
        DeviceSnapshot {
            segments,
            trace: st.trace.entries().cloned().collect(),
        }
    }

    /// Drops the recorded events (history was switched off).
    pub fn clear_history(&self) {
        self.state.lock().trace.clear();
    }

    /// The fraction of the capacity this process may reserve (1 unless
    /// `set_memory_fraction` changed it).
    pub fn memory_fraction(&self) -> f64 {
        self.state
            .lock()
            .limit
            .map_or(1.0, |limit| limit as f64 / self.capacity as f64)
    }

    /// Whether `ptr` lies inside one of this device's segments.
    pub fn owns(&self, ptr: usize) -> bool {
        let st = self.state.lock();
        st.segments
            .range(..=ptr)
            .next_back()
            .is_some_and(|(base, seg)| ptr < base + seg.size)
    }

    /// The live allocation that holds `ptr`: its start, requested size and
    /// allocation stream.
    pub fn allocation_containing(
        &self,
        ptr: usize,
    ) -> Option<(usize, usize, &'static StreamQueue)> {
        let st = self.state.lock();
        let (&segment_base, segment) = st.segments.range(..=ptr).next_back()?;
        if ptr >= segment_base + segment.size {
            return None;
        }
        let mut id = Some(segment.first);
        while let Some(block) = id.map(|id| st.block(id)) {
            if (block.ptr..block.ptr + block.size).contains(&ptr) {
                return (block.state == BlockState::Allocated).then_some((
                    block.ptr,
                    block.requested,
                    block.stream,
                ));
            }
            id = block.next;
        }
        None
    }

    /// The live allocation starting at `ptr`: its usable size in bytes.
    pub fn allocation_size(&self, ptr: usize) -> Option<usize> {
        let st = self.state.lock();
        st.allocated.get(&ptr).map(|&id| st.block(id).size)
    }
}

/// Waits until each stream has completed its point in `waits`, with the
/// allocator unlocked meanwhile (a queued kernel may allocate). Returns
/// whether there was anything to wait for.
fn wait_unlocked(st: &mut MutexGuard<'_, State>, waits: Vec<(&'static StreamQueue, u64)>) -> bool {
    if waits.is_empty() {
        return false;
    }
    MutexGuard::unlocked(st, || {
        for (stream, seq) in waits {
            // A failed kernel is reported by the stream's own synchronize.
            let _ = stream.wait_for(seq, false);
        }
    });
    true
}

fn human(bytes: usize) -> String {
    const UNITS: [&str; 4] = ["bytes", "KiB", "MiB", "GiB"];
    let (mut value, mut unit) = (bytes as f64, 0);
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

/// Live allocations made before their device's last restart, on every
/// device (Note [Device memory generations]).
static STALE_ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

/// Whether `ptr` (an allocation's start, or any other address) may be used:
/// false only for a live allocation from before its device's restart. One
/// atomic load unless stale allocations are live.
#[inline]
pub fn is_current(ptr: usize) -> bool {
    STALE_ALLOCATIONS.load(Ordering::Acquire) == 0 || check_current(ptr).is_ok()
}

/// `is_current`, with the error naming the allocation and its device.
pub fn check_current(ptr: usize) -> Result<()> {
    if STALE_ALLOCATIONS.load(Ordering::Acquire) == 0 || ptr == 0 {
        return Ok(());
    }
    match crate::runtime::device::existing_contexts().find_map(|ctx| ctx.allocator.stale_error(ptr)) {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

/// The device whose memory holds `ptr`, among devices with a context.
pub fn device_of(ptr: usize) -> Option<DeviceIndex> {
    crate::runtime::device::existing_contexts()
        .find(|ctx| ctx.allocator.owns(ptr))
        .map(|ctx| ctx.index)
}

/// The live device allocation that holds `ptr`, on any device: its start,
/// requested size and allocation stream.
pub fn allocation_containing(ptr: usize) -> Option<(usize, usize, &'static StreamQueue)> {
    crate::runtime::device::existing_contexts().find_map(|ctx| ctx.allocator.allocation_containing(ptr))
}

/// Frees `ptr` on whichever device owns it (a `DataPtr` deleter knows only
/// the pointer).
pub fn free_anywhere(ptr: usize) -> Result<()> {
    if ptr == 0 {
        return Ok(());
    }
    // One lookup per device tried (a DataPtr deleter knows only the pointer).
    crate::runtime::device::existing_contexts()
        .find_map(|ctx| ctx.allocator.try_free(ptr))
        .unwrap_or_else(|| {
            Err(Error::invalid_value(format!(
                "free of {ptr:#x}: not openreg device memory"
            )))
        })
}
