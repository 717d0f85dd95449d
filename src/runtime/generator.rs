//! Random numbers: counter-based Philox4x32-10 generators (one default per
//! device, plus any the user creates) and the fills random kernels run.
//!
//! Note [Philox offsets]: a generator is just `(seed, offset)`. The seed is
//! the Philox key; the offset counts 32-bit draws already handed out. A
//! random kernel reserves the draws it will use on the host, when it is
//! launched (`Generator::reserve`): it gets the current offset as its base
//! and the offset moves past its draws, rounded up to a whole Philox block
//! (4 draws), as CUDA rounds its per-thread increments to 4. So the offset
//! is always a multiple of 4, and what a kernel computes depends only on
//! `(seed, base)` — not on when it runs, which thread runs it, or whether a
//! captured graph replays it with a later base.
//!
//! Note [Philox draw layout]: draw `i` of a kernel whose base is `b` is lane
//! `(b + i) % 4` of the Philox block with counter `(b + i) / 4` (as a 64-bit
//! number in the first two counter words; the last two are 0) under key
//! `seed`. Value `j` of a fill uses draws `k*j .. k*j + k`, where `k` is
//! `draws_per_value` (1 for a float32 uniform, 2 for float64 or a 64-bit
//! integer range); a Box–Muller pair (values `2m`, `2m + 1`) uses the draws
//! of both its values. Every value is thus a pure function of its index, and
//! the buffer can be split among any number of threads at pair boundaries
//! with the same result (see `fill`).

use std::sync::Arc;

use parking_lot::Mutex;

use crate::runtime::device::{self, DeviceIndex};
use crate::base::error::{Error, Result};
use crate::base::options::MAX_DEVICES;

/// PyTorch's default seed (`c10::default_rng_seed_val`): every default
/// generator starts with it, as CUDA's do.
pub const DEFAULT_SEED: u64 = 67280421310721;

/// The bytes of `get_state`: seed then offset, each little-endian u64 (the
/// shape of CUDA's Philox state).
pub const STATE_BYTES: usize = 16;

const PHILOX_M0: u32 = 0xD251_1F53;
const PHILOX_M1: u32 = 0xCD9E_8D57;
const PHILOX_W0: u32 = 0x9E37_79B9;
const PHILOX_W1: u32 = 0xBB67_AE85;

/// One Philox4x32-10 block (Salmon et al., "Parallel random numbers: as easy
/// as 1, 2, 3", SC 2011): ten rounds of the Philox S-box over `counter`.
#[inline(always)]
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let [mut c0, mut c1, mut c2, mut c3] = counter;
    let [mut k0, mut k1] = key;
    for round in 0..10 {
        if round > 0 {
            k0 = k0.wrapping_add(PHILOX_W0);
            k1 = k1.wrapping_add(PHILOX_W1);
        }
        let p0 = u64::from(PHILOX_M0) * u64::from(c0);
        let p1 = u64::from(PHILOX_M1) * u64::from(c2);
        (c0, c1, c2, c3) = (
            (p1 >> 32) as u32 ^ c1 ^ k0,
            p1 as u32,
            (p0 >> 32) as u32 ^ c3 ^ k1,
            p0 as u32,
        );
    }
    [c0, c1, c2, c3]
}

/// Where a kernel's draws start. See Note [Philox offsets].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhiloxSlice {
    pub seed: u64,
    /// The absolute index of the kernel's first draw; a multiple of 4.
    pub base: u64,
}

impl PhiloxSlice {
    /// Fills `out` with draws `first .. first + out.len()` of this slice.
    pub fn draws(&self, first: u64, out: &mut [u32]) {
        let key = [self.seed as u32, (self.seed >> 32) as u32];
        let absolute = self.base.wrapping_add(first);
        // A partial first block, then whole blocks. (One block at a time
        // measured fastest: the CPU overlaps consecutive blocks' rounds by
        // itself; hand-interleaved or AVX2 lanes were slower.)
        let head = ((4 - absolute % 4) % 4).min(out.len() as u64) as usize;
        let mut block = absolute / 4;
        if head > 0 {
            let lane = (absolute % 4) as usize;
            out[..head].copy_from_slice(&philox_block(block, key)[lane..lane + head]);
            block = block.wrapping_add(1);
        }
        for dst in out[head..].chunks_mut(4) {
            let bits = philox_block(block, key);
            if dst.len() == 4 {
                dst.copy_from_slice(&bits);
            } else {
                let len = dst.len();
                dst.copy_from_slice(&bits[..len]);
            }
            block = block.wrapping_add(1);
        }
    }
}

/// The Philox block with 64-bit counter `block`. See Note [Philox draw layout].
#[inline(always)]
fn philox_block(block: u64, key: [u32; 2]) -> [u32; 4] {
    philox4x32_10([block as u32, (block >> 32) as u32, 0, 0], key)
}

/// A generator's state. See Note [Philox offsets].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PhiloxState {
    seed: u64,
    offset: u64,
}

/// A handle to a generator's state. Handles of a device's default generator
/// share it; `fork` makes an independent copy.
pub struct Generator {
    state: Arc<Mutex<PhiloxState>>,
}

static DEFAULTS: [once_cell::sync::OnceCell<Arc<Mutex<PhiloxState>>>; MAX_DEVICES] =
    [const { once_cell::sync::OnceCell::new() }; MAX_DEVICES];

impl Generator {
    /// A new generator with `seed` and offset 0.
    pub fn new(seed: u64) -> Generator {
        Generator {
            state: Arc::new(Mutex::new(PhiloxState { seed, offset: 0 })),
        }
    }

    /// A handle to device `index`'s default generator, created on first use
    /// with `DEFAULT_SEED`. Creating it does not initialize the device.
    pub fn default_for(index: i64) -> Result<Generator> {
        let index: DeviceIndex = device::check_index(index)?;
        let state = DEFAULTS[index as usize].get_or_init(|| {
            Arc::new(Mutex::new(PhiloxState {
                seed: DEFAULT_SEED,
                offset: 0,
            }))
        });
        Ok(Generator {
            state: Arc::clone(state),
        })
    }

    /// An independent generator with a copy of this one's state.
    pub fn fork(&self) -> Generator {
        Generator {
            state: Arc::new(Mutex::new(*self.state.lock())),
        }
    }

    pub fn seed(&self) -> u64 {
        self.state.lock().seed
    }

    /// Reseeds; the sequence restarts (offset 0).
    pub fn set_seed(&self, seed: u64) {
        *self.state.lock() = PhiloxState { seed, offset: 0 };
    }

    pub fn offset(&self) -> u64 {
        self.state.lock().offset
    }

    /// Moves to draw `offset`, which must start a Philox block.
    pub fn set_offset(&self, offset: u64) -> Result<()> {
        check_offset(offset)?;
        self.state.lock().offset = offset;
        Ok(())
    }

    /// Whether `other` is a handle to the same state as this one.
    pub fn same_state(&self, other: &Generator) -> bool {
        Arc::ptr_eq(&self.state, &other.state)
    }

    /// Another handle to this generator's state (not a copy: see `fork`).
    pub fn share(&self) -> Generator {
        Generator {
            state: Arc::clone(&self.state),
        }
    }

    /// Hands out the next `draws` draws. See Note [Philox offsets].
    pub fn reserve(&self, draws: u64) -> PhiloxSlice {
        let mut st = self.state.lock();
        let slice = PhiloxSlice {
            seed: st.seed,
            base: st.offset,
        };
        st.offset = st.offset.wrapping_add(round_up_to_block(draws));
        slice
    }

    /// The state as CUDA-shaped bytes: seed, then offset (little-endian).
    pub fn state_bytes(&self) -> [u8; STATE_BYTES] {
        let st = *self.state.lock();
        let mut bytes = [0u8; STATE_BYTES];
        bytes[..8].copy_from_slice(&st.seed.to_le_bytes());
        bytes[8..].copy_from_slice(&st.offset.to_le_bytes());
        bytes
    }

    /// Restores what `state_bytes` returned.
    pub fn set_state_bytes(&self, bytes: &[u8]) -> Result<()> {
        if bytes.len() != STATE_BYTES {
            return Err(Error::invalid_value(format!(
                "openreg generator state must be {STATE_BYTES} bytes (seed and offset), got {}",
                bytes.len()
            )));
        }
        let word = |range: std::ops::Range<usize>| {
            u64::from_le_bytes(bytes[range].try_into().expect("8 bytes"))
        };
        let (seed, offset) = (word(0..8), word(8..16));
        check_offset(offset)?;
        *self.state.lock() = PhiloxState { seed, offset };
        Ok(())
    }
}

fn check_offset(offset: u64) -> Result<()> {
    if offset % 4 != 0 {
        return Err(Error::invalid_value(format!(
            "openreg generator offset must be a multiple of 4 (a whole Philox block), got {offset}"
        )));
    }
    Ok(())
}

/// `draws` rounded up to whole Philox blocks of 4.
pub fn round_up_to_block(draws: u64) -> u64 {
    draws.wrapping_add(3) & !3
}

/// A seed from the operating system's entropy (for `Generator.seed()`).
pub fn nondeterministic_seed() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: `bytes` is a writable buffer of the length passed.
    let read = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if read == bytes.len() as isize {
        u64::from_le_bytes(bytes)
    } else {
        // No entropy source: the clock still differs run to run.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        (now.as_nanos() as u64) ^ (std::process::id() as u64).rotate_left(32)
    }
}

// ---------------------------------------------------------------- fills

/// What a random kernel writes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Distribution {
    /// Uniform on `[from, to)`.
    Uniform {
        from: f64,
        to: f64,
    },
    Normal {
        mean: f64,
        std: f64,
    },
    /// 1 with probability `p`, else 0.
    Bernoulli {
        p: f64,
    },
    Exponential {
        lambda: f64,
    },
    /// The number of trials up to the first success, `>= 1`.
    Geometric {
        p: f64,
    },
    /// `exp` of a normal with `mean` and `std`.
    LogNormal {
        mean: f64,
        std: f64,
    },
    Cauchy {
        median: f64,
        sigma: f64,
    },
    /// Integers `from + (x mod range)`; `range == 0` means 2^64.
    Integers {
        from: i64,
        range: u64,
    },
}

/// The element type of the buffer a fill writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Element {
    F32,
    F64,
    I64,
}

impl Distribution {
    /// Checks the parameters; the error names the operation and the bound.
    pub fn validate(&self, element: Element) -> Result<()> {
        let bad = |what: String| Err(Error::invalid_value(what));
        let integers = matches!(self, Distribution::Integers { .. });
        if integers != (element == Element::I64) {
            return bad(format!("{self:?} cannot be generated as {element:?}"));
        }
        match *self {
            Distribution::Uniform { from, to } if !(from <= to) || !(to - from).is_finite() => {
                bad(format!("uniform_ expects to return a [from, to) range, but found from={from} > to={to} (or a non-finite range)"))
            }
            Distribution::Normal { std, .. } | Distribution::LogNormal { std, .. } if !(std >= 0.0) => {
                bad(format!("normal expects std >= 0.0, but found std {std}"))
            }
            Distribution::Bernoulli { p } if !(0.0..=1.0).contains(&p) => {
                bad(format!("bernoulli_ expects p to be in [0, 1], but got p={p}"))
            }
            Distribution::Exponential { lambda } if !(lambda > 0.0) => {
                bad(format!("exponential_ expects lambda > 0.0, but found lambda={lambda}"))
            }
            Distribution::Geometric { p } if !(p > 0.0 && p < 1.0) => {
                bad(format!("geometric_ expects p to be in (0, 1), but got p={p}"))
            }
            Distribution::Cauchy { sigma, .. } if !(sigma > 0.0) => {
                bad(format!("cauchy_ expects sigma > 0.0, but found sigma={sigma}"))
            }
            _ => Ok(()),
        }
    }

    /// `k` of Note [Philox draw layout].
    pub fn draws_per_value(&self, element: Element) -> u64 {
        match (*self, element) {
            (Distribution::Integers { range, .. }, _) => {
                if range != 0 && range <= 1 << 32 {
                    1
                } else {
                    2
                }
            }
            (_, Element::F32) => 1,
            _ => 2,
        }
    }

    fn pairs(&self) -> bool {
        matches!(
            self,
            Distribution::Normal { .. } | Distribution::LogNormal { .. }
        )
    }

    /// The draws a fill of `numel` values uses.
    pub fn draws(&self, element: Element, numel: u64) -> u64 {
        let values = if self.pairs() {
            numel + numel % 2
        } else {
            numel
        };
        values.saturating_mul(self.draws_per_value(element))
    }
}

/// A float type a fill can write: how it turns draws into a uniform.
trait Float: Copy + PartialEq + Send + Sync {
    const DRAWS: usize;
    /// Uniform on [0, 1) from `DRAWS` draws, with the full mantissa.
    fn uniform(draws: &[u32]) -> f64;
    fn from_f64(value: f64) -> Self;
}

impl Float for f32 {
    const DRAWS: usize = 1;
    #[inline(always)]
    fn uniform(draws: &[u32]) -> f64 {
        f64::from(draws[0] & ((1 << 24) - 1)) * (1.0 / (1u64 << 24) as f64)
    }
    #[inline(always)]
    fn from_f64(value: f64) -> f32 {
        value as f32
    }
}

impl Float for f64 {
    const DRAWS: usize = 2;
    #[inline(always)]
    fn uniform(draws: &[u32]) -> f64 {
        let bits = (u64::from(draws[0]) << 32 | u64::from(draws[1])) & ((1 << 53) - 1);
        bits as f64 * (1.0 / (1u64 << 53) as f64)
    }
    #[inline(always)]
    fn from_f64(value: f64) -> f64 {
        value
    }
}

/// Values generated per batch of draws (a multiple of 2: pairs never span
/// batches; small enough to stay in L1).
const BATCH: usize = 512;

/// Values per chunk of a fill split across the kernel pool (a multiple of
/// `BATCH`; Note [Kernel pool] in kernel_pool.rs).
const CHUNK: usize = 128 * BATCH;

/// Writes `dist` into `out` from `slice`, in chunks of `CHUNK` values on the
/// kernel pool. Chunk `i` writes values `i * CHUNK ..`, which are the
/// values an unsplit fill writes there (Note [Philox draw layout]), so the
/// result depends on nothing but the arguments. Parameters must have passed
/// `validate`.
pub fn fill<T: FillTarget>(out: &mut [T], dist: Distribution, slice: PhiloxSlice) {
    let len = out.len();
    let base = SharedMut(out.as_mut_ptr());
    crate::runtime::kernel_pool::for_each_chunk(len.div_ceil(CHUNK), &|chunk| {
        let start = chunk * CHUNK;
        let end = (start + CHUNK).min(len);
        // SAFETY: chunks are disjoint ranges of `out`, borrowed mutably for the call.
        let part = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), end - start) };
        T::fill_range(part, start as u64, dist, slice);
    });
}

/// A pointer the chunks of one fill share; each writes its own range.
#[derive(Clone, Copy)]
struct SharedMut<T>(*mut T);
// SAFETY: only ever used to write disjoint ranges (see `fill`).
unsafe impl<T> Sync for SharedMut<T> {}
impl<T> SharedMut<T> {
    fn get(self) -> *mut T {
        self.0
    }
}

/// A buffer element type `fill` can write.
pub trait FillTarget: Copy + Send + Sync {
    /// Writes values `start .. start + out.len()`; `start` is a multiple of
    /// `BATCH`.
    fn fill_range(out: &mut [Self], start: u64, dist: Distribution, slice: PhiloxSlice);
}

impl FillTarget for f32 {
    fn fill_range(out: &mut [f32], start: u64, dist: Distribution, slice: PhiloxSlice) {
        match dist {
            Distribution::Normal { mean, std } => {
                normal_f32(out, start, mean as f32, std as f32, false, slice)
            }
            Distribution::LogNormal { mean, std } => {
                normal_f32(out, start, mean as f32, std as f32, true, slice)
            }
            _ => fill_float(out, start, dist, slice),
        }
    }
}

impl FillTarget for f64 {
    fn fill_range(out: &mut [f64], start: u64, dist: Distribution, slice: PhiloxSlice) {
        fill_float(out, start, dist, slice)
    }
}

impl FillTarget for i64 {
    fn fill_range(out: &mut [i64], start: u64, dist: Distribution, slice: PhiloxSlice) {
        let Distribution::Integers { from, range } = dist else {
            unreachable!("validate() admits only integer fills of i64");
        };
        let k = dist.draws_per_value(Element::I64) as usize;
        let mut draws = [0u32; 2 * BATCH];
        for (b, batch) in out.chunks_mut(BATCH).enumerate() {
            let first = start + (b * BATCH) as u64;
            let draws = &mut draws[..batch.len() * k];
            slice.draws(first * k as u64, draws);
            for (value, d) in batch.iter_mut().zip(draws.chunks_exact(k)) {
                let x = if k == 1 {
                    u64::from(d[0])
                } else {
                    u64::from(d[0]) << 32 | u64::from(d[1])
                };
                let x = if range == 0 { x } else { x % range };
                *value = from.wrapping_add(x as i64);
            }
        }
    }
}

fn fill_float<T: Float>(out: &mut [T], start: u64, dist: Distribution, slice: PhiloxSlice) {
    let k = T::DRAWS;
    let mut draws = [0u32; 2 * BATCH];
    for (b, batch) in out.chunks_mut(BATCH).enumerate() {
        let first = start + (b * BATCH) as u64;
        // A batch holds whole pairs (BATCH is even); an odd tail still
        // computes its pair's second uniform (Distribution::draws reserved it).
        let values = if dist.pairs() {
            batch.len() + batch.len() % 2
        } else {
            batch.len()
        };
        let draws = &mut draws[..values * k];
        slice.draws(first * k as u64, draws);
        let uniform = |i: usize| T::uniform(&draws[i * k..i * k + k]);
        match dist {
            Distribution::Uniform { from, to } => {
                let scale = to - from;
                for (i, v) in batch.iter_mut().enumerate() {
                    let x = T::from_f64(uniform(i) * scale + from);
                    // Rounding to T may reach `to`, which [from, to) excludes.
                    *v = if T::from_f64(to) == x && from < to {
                        T::from_f64(from)
                    } else {
                        x
                    };
                }
            }
            Distribution::Normal { mean, std } => {
                box_muller(batch, &uniform, |z| T::from_f64(z * std + mean))
            }
            Distribution::LogNormal { mean, std } => {
                box_muller(batch, &uniform, |z| T::from_f64((z * std + mean).exp()))
            }
            Distribution::Bernoulli { p } => {
                for (i, v) in batch.iter_mut().enumerate() {
                    *v = T::from_f64(if uniform(i) < p { 1.0 } else { 0.0 });
                }
            }
            Distribution::Exponential { lambda } => {
                for (i, v) in batch.iter_mut().enumerate() {
                    // 1 - u is in (0, 1]: the logarithm is finite.
                    *v = T::from_f64(-(1.0 - uniform(i)).ln() / lambda);
                }
            }
            Distribution::Geometric { p } => {
                let log_q = (-p).ln_1p();
                for (i, v) in batch.iter_mut().enumerate() {
                    *v = T::from_f64(((1.0 - uniform(i)).ln() / log_q).ceil().max(1.0));
                }
            }
            Distribution::Cauchy { median, sigma } => {
                for (i, v) in batch.iter_mut().enumerate() {
                    *v = T::from_f64(
                        median + sigma * (std::f64::consts::PI * (uniform(i) - 0.5)).tan(),
                    );
                }
            }
            Distribution::Integers { .. } => {
                unreachable!("validate() admits integer fills of i64 only")
            }
        }
    }
}

/// Box–Muller over pairs of uniforms: values `2m`, `2m + 1` are the cosine
/// and sine branches of the pair drawn for them.
#[inline(always)]
fn box_muller<T: Copy>(batch: &mut [T], uniform: &impl Fn(usize) -> f64, map: impl Fn(f64) -> T) {
    for (m, pair) in batch.chunks_mut(2).enumerate() {
        // 1 - u is in (0, 1]: the logarithm is finite.
        let radius = (-2.0 * (1.0 - uniform(2 * m)).ln()).sqrt();
        let (sin, cos) = (2.0 * std::f64::consts::PI * uniform(2 * m + 1)).sin_cos();
        pair[0] = map(radius * cos);
        if let Some(second) = pair.get_mut(1) {
            *second = map(radius * sin);
        }
    }
}

/// Box–Muller in float32 for float32 outputs: value `2m` is `r cos θ` and
/// `2m + 1` is `r sin θ`, with `r = sqrt(-2 ln u1)`, `θ = 2π u2` for the
/// pair's draws (u1 in (0, 1], u2 in [0, 1), 24 bits each). `ln`, `sin` and
/// `cos` are polynomial (Cephes' single-precision ones, about 1 ulp) and
/// branch-free, so the loop vectorizes; libm calls would cost most of the
/// time of `torch.randn`.
///
/// Where the CPU has AVX2 the same loop is compiled for it as well, and that
/// copy runs: 8 lanes instead of SSE2's 4. The values are the same bits
/// either way, since every operation is an IEEE one rounded per element and
/// Rust never fuses a multiply and an add (no FMA) by itself.
fn normal_f32(out: &mut [f32], start: u64, mean: f32, std: f32, log: bool, slice: PhiloxSlice) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { normal_f32_avx2(out, start, mean, std, log, slice) };
    }
    normal_f32_loop(out, start, mean, std, log, slice)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn normal_f32_avx2(
    out: &mut [f32],
    start: u64,
    mean: f32,
    std: f32,
    log: bool,
    slice: PhiloxSlice,
) {
    normal_f32_loop(out, start, mean, std, log, slice)
}

#[inline(always)]
fn normal_f32_loop(
    out: &mut [f32],
    start: u64,
    mean: f32,
    std: f32,
    log: bool,
    slice: PhiloxSlice,
) {
    const SCALE: f32 = 1.0 / (1u32 << 24) as f32;
    let mut draws = [0u32; BATCH];
    let mut pairs = [[0f32; 2]; BATCH / 2];
    for (b, batch) in out.chunks_mut(BATCH).enumerate() {
        let first = start + (b * BATCH) as u64;
        let n_pairs = batch.len().div_ceil(2);
        let draws = &mut draws[..2 * n_pairs];
        slice.draws(first, draws);
        for (pair, d) in pairs.iter_mut().zip(draws.chunks_exact(2)) {
            let u1 = ((d[0] & 0xff_ffff) + 1) as f32 * SCALE;
            let u2 = (d[1] & 0xff_ffff) as f32 * SCALE;
            let r = (-2.0 * ln_f32(u1)).sqrt() * std;
            let (sin, cos) = sin_cos_2pi(u2);
            *pair = [r * cos + mean, r * sin + mean];
        }
        for (v, z) in batch.iter_mut().zip(pairs.iter().flatten()) {
            *v = if log { z.exp() } else { *z };
        }
    }
}

/// `ln x` for finite positive normal `x` (Cephes `logf`).
#[inline(always)]
fn ln_f32(x: f32) -> f32 {
    let bits = x.to_bits();
    let mut e = ((bits >> 23) & 0xff) as i32 - 126;
    // m in [0.5, 1); moved to [sqrt(1/2), sqrt(2)) so the polynomial's
    // argument stays small.
    let m = f32::from_bits((bits & 0x007f_ffff) | 0x3f00_0000);
    let small = m < std::f32::consts::FRAC_1_SQRT_2;
    e -= small as i32;
    let x = if small { m + m - 1.0 } else { m - 1.0 };
    let e = e as f32;
    let z = x * x;
    let mut y = 7.037_683_6e-2;
    for c in [
        -1.151_461e-1,
        1.167_699_9e-1,
        -1.242_014_1e-1,
        1.424_932_3e-1,
        -1.666_805_8e-1,
        2.000_071_4e-1,
        -2.499_999_4e-1,
        3.333_333e-1,
    ] {
        y = y * x + c;
    }
    y = y * x * z + e * -2.121_944_4e-4 - 0.5 * z;
    x + y + e * 0.693_359_4
}

/// `(sin 2πu, cos 2πu)` for `u` in [0, 1): quarter-turn reduction, then
/// Cephes' `sinf`/`cosf` polynomials on [-π/4, π/4].
#[inline(always)]
fn sin_cos_2pi(u: f32) -> (f32, f32) {
    let q = (u * 4.0 + 0.5) as i32; // nearest quarter turn, 0..=4
    let a = (u - q as f32 * 0.25) * std::f32::consts::TAU;
    let z = a * a;
    let sin = a + a * z * ((-1.951_529_6e-4 * z + 8.332_161e-3) * z - 1.666_665_5e-1);
    let cos = 1.0 - 0.5 * z + z * z * ((2.443_315_7e-5 * z - 1.388_731_6e-3) * z + 4.166_664_6e-2);
    let (s, c) = if q & 1 == 1 { (cos, sin) } else { (sin, cos) };
    let sin_sign = if q & 2 == 2 { -1.0 } else { 1.0 };
    let cos_sign = if (q + 1) & 2 == 2 { -1.0 } else { 1.0 };
    (s * sin_sign, c * cos_sign)
}

/// A random permutation of `0 .. out.len()` (Fisher–Yates, from the back:
/// step `i` swaps position `i` with one of `0 ..= i`, chosen by draws
/// `2i, 2i + 1`). Serial: each step depends on the last. Uses
/// `randperm_draws(out.len())` draws.
pub fn randperm(out: &mut [i64], slice: PhiloxSlice) {
    for (i, v) in out.iter_mut().enumerate() {
        *v = i as i64;
    }
    let mut d = [0u32; 2];
    for i in (1..out.len()).rev() {
        slice.draws(2 * i as u64, &mut d);
        let x = u64::from(d[0]) << 32 | u64::from(d[1]);
        out.swap(i, (x % (i as u64 + 1)) as usize);
    }
}

/// The draws `randperm` of `n` uses.
pub fn randperm_draws(n: u64) -> u64 {
    n.saturating_mul(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random123's known-answer vectors (its `kat_vectors` file).
    #[test]
    fn philox_known_answers() {
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0]
            ),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn long_draws_match_single_blocks() {
        let slice = PhiloxSlice { seed: 5, base: 0 };
        let mut long = vec![0u32; 103];
        slice.draws(1, &mut long);
        for (i, d) in long.iter().enumerate() {
            let absolute = 1 + i as u64;
            assert_eq!(
                *d,
                philox_block(absolute / 4, [5, 0])[(absolute % 4) as usize],
                "draw {absolute}"
            );
        }
    }

    #[test]
    fn draws_follow_the_block_layout() {
        let slice = PhiloxSlice {
            seed: 0x1234_5678_9abc_def0,
            base: 8,
        };
        let mut d = [0u32; 10];
        slice.draws(3, &mut d);
        let key = [0x9abc_def0, 0x1234_5678];
        // Draw 3 of base 8 is absolute draw 11: block 2, lane 3.
        assert_eq!(d[0], philox4x32_10([2, 0, 0, 0], key)[3]);
        assert_eq!(d[1..5], philox4x32_10([3, 0, 0, 0], key));
        assert_eq!(d[5..9], philox4x32_10([4, 0, 0, 0], key));
        assert_eq!(d[9], philox4x32_10([5, 0, 0, 0], key)[0]);
        // The block counter's high word is used beyond 2^32 blocks.
        let far = PhiloxSlice {
            seed: 0,
            base: 4 << 32,
        };
        let mut one = [0u32; 1];
        far.draws(0, &mut one);
        assert_eq!(one[0], philox4x32_10([0, 1, 0, 0], [0, 0])[0]);
    }

    #[test]
    fn reservation_rounds_to_blocks() {
        let g = Generator::new(7);
        assert_eq!(g.reserve(5), PhiloxSlice { seed: 7, base: 0 });
        assert_eq!(g.offset(), 8);
        assert_eq!(g.reserve(0), PhiloxSlice { seed: 7, base: 8 });
        assert_eq!(g.reserve(4), PhiloxSlice { seed: 7, base: 8 });
        assert_eq!(g.offset(), 12);
        assert_eq!(round_up_to_block(1), 4);
        assert_eq!(
            Distribution::Normal {
                mean: 0.0,
                std: 1.0
            }
            .draws(Element::F32, 3),
            4
        );
        assert_eq!(
            Distribution::Normal {
                mean: 0.0,
                std: 1.0
            }
            .draws(Element::F64, 3),
            8
        );
        assert_eq!(
            Distribution::Uniform { from: 0.0, to: 1.0 }.draws(Element::F64, 3),
            6
        );
        assert_eq!(
            Distribution::Integers { from: 0, range: 10 }.draws(Element::I64, 3),
            3
        );
        assert_eq!(
            Distribution::Integers { from: 0, range: 0 }.draws(Element::I64, 3),
            6
        );
        g.set_seed(9);
        assert_eq!((g.seed(), g.offset()), (9, 0));
        assert!(g.set_offset(6).is_err());
        g.set_offset(16).unwrap();
        assert_eq!(g.reserve(1).base, 16);
    }

    #[test]
    fn state_round_trips_and_rejects_bad_sizes() {
        let g = Generator::new(0xdead_beef);
        g.reserve(40);
        let saved = g.state_bytes();
        let first = g.reserve(4);
        g.set_state_bytes(&saved).unwrap();
        assert_eq!(g.reserve(4), first);
        assert!(g
            .set_state_bytes(&saved[..15])
            .unwrap_err()
            .message
            .contains("16 bytes"));
        let fork = g.fork();
        fork.reserve(4);
        assert_ne!(fork.offset(), g.offset());
    }

    fn filled<T: FillTarget + Default>(n: usize, dist: Distribution) -> Vec<T> {
        let mut out = vec![T::default(); n];
        fill(&mut out, dist, PhiloxSlice { seed: 42, base: 64 });
        out
    }

    /// A split fill (chunks on the kernel pool) and one unsplit fill.
    fn split_and_whole<T: FillTarget + Default + PartialEq + std::fmt::Debug>(
        n: usize,
        dist: Distribution,
    ) {
        let slice = PhiloxSlice { seed: 42, base: 64 };
        let split: Vec<T> = filled(n, dist);
        let mut whole = vec![T::default(); n];
        T::fill_range(&mut whole, 0, dist, slice);
        assert!(
            split == whole,
            "{dist:?}: a split fill differs from an unsplit one"
        );
    }

    #[test]
    fn split_fills_equal_unsplit_ones() {
        let n = 3 * CHUNK + 7;
        for dist in [
            Distribution::Uniform {
                from: -1.0,
                to: 2.0,
            },
            Distribution::Normal {
                mean: 1.0,
                std: 2.0,
            },
            Distribution::Cauchy {
                median: 0.0,
                sigma: 1.0,
            },
        ] {
            split_and_whole::<f32>(n, dist);
            split_and_whole::<f64>(n, dist);
        }
        split_and_whole::<i64>(
            n,
            Distribution::Integers {
                from: -5,
                range: 11,
            },
        );
    }

    /// The AVX2 copy of the float32 normal loop writes the bits the
    /// portable one writes (results must not depend on the machine's CPU).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_normals_equal_portable_ones() {
        if !std::is_x86_feature_detected!("avx2") {
            return;
        }
        let slice = PhiloxSlice { seed: 11, base: 3 };
        // An odd length: the last pair's second value is dropped.
        let n = 4 * BATCH + 5;
        for log in [false, true] {
            let (mut portable, mut avx2) = (vec![0f32; n], vec![0f32; n]);
            normal_f32_loop(&mut portable, 0, 0.5, 1.5, log, slice);
            // SAFETY: AVX2 support was checked above.
            unsafe { normal_f32_avx2(&mut avx2, 0, 0.5, 1.5, log, slice) };
            let differ = portable
                .iter()
                .zip(&avx2)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(differ, 0, "log={log}: {differ} of {n} values differ");
        }
    }

    #[test]
    fn values_are_functions_of_their_index() {
        // A fill's tail equals a fill that starts later (same base): what
        // makes chunking and inline/queued execution agree.
        let dist = Distribution::Uniform { from: 0.0, to: 1.0 };
        let slice = PhiloxSlice { seed: 3, base: 0 };
        let mut whole = vec![0f32; 2 * BATCH];
        f32::fill_range(&mut whole, 0, dist, slice);
        let mut tail = vec![0f32; BATCH];
        f32::fill_range(&mut tail, BATCH as u64, dist, slice);
        assert_eq!(whole[BATCH..], tail[..]);
        let mut d = [0u32; 1];
        slice.draws(5, &mut d);
        assert_eq!(whole[5], (d[0] & 0xff_ffff) as f32 / (1 << 24) as f32);
    }

    #[test]
    fn distributions_have_their_moments() {
        let n = 200_000;
        let mean_var = |v: &[f64]| {
            let mean = v.iter().sum::<f64>() / v.len() as f64;
            (
                mean,
                v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / v.len() as f64,
            )
        };
        let (m, var) = mean_var(&filled::<f64>(
            n,
            Distribution::Normal {
                mean: 3.0,
                std: 2.0,
            },
        ));
        assert!(
            (m - 3.0).abs() < 0.02 && (var - 4.0).abs() < 0.06,
            "normal {m} {var}"
        );
        let (m, var) = mean_var(&filled::<f64>(
            n,
            Distribution::Uniform { from: 0.0, to: 1.0 },
        ));
        assert!(
            (m - 0.5).abs() < 0.005 && (var - 1.0 / 12.0).abs() < 0.002,
            "uniform {m} {var}"
        );
        let (m, _) = mean_var(&filled::<f64>(n, Distribution::Exponential { lambda: 2.0 }));
        assert!((m - 0.5).abs() < 0.01, "exponential {m}");
        let geo = filled::<f64>(n, Distribution::Geometric { p: 0.25 });
        assert!(geo.iter().all(|&x| x >= 1.0) && (mean_var(&geo).0 - 4.0).abs() < 0.05);
        let (m, _) = mean_var(&filled::<f64>(n, Distribution::Bernoulli { p: 0.3 }));
        assert!((m - 0.3).abs() < 0.005, "bernoulli {m}");
        let ints = filled::<i64>(n, Distribution::Integers { from: -2, range: 5 });
        assert!(ints.iter().all(|x| (-2..3).contains(x)));
        assert!((0..5).all(|v| ints.contains(&(v - 2))));
    }

    #[test]
    fn invalid_parameters_are_rejected() {
        let err = |d: Distribution, e| d.validate(e).unwrap_err().message;
        assert!(
            err(Distribution::Uniform { from: 1.0, to: 0.0 }, Element::F32)
                .contains("from=1 > to=0")
        );
        assert!(err(Distribution::Bernoulli { p: 1.5 }, Element::F32).contains("[0, 1]"));
        assert!(err(Distribution::Geometric { p: 1.0 }, Element::F64).contains("(0, 1)"));
        assert!(err(
            Distribution::Normal {
                mean: 0.0,
                std: -1.0
            },
            Element::F64
        )
        .contains("std >= 0.0"));
        assert!(Distribution::Integers { from: 0, range: 3 }
            .validate(Element::F32)
            .is_err());
        assert!(Distribution::Uniform { from: 0.0, to: 0.0 }
            .validate(Element::F32)
            .is_ok());
    }

    #[test]
    fn polynomial_math_is_accurate() {
        for i in 1..=10_000 {
            let x = i as f32 / 10_000.0;
            assert!(
                (ln_f32(x) - x.ln()).abs() <= 2e-7 * x.ln().abs().max(1.0),
                "ln {x}"
            );
            let (s, c) = sin_cos_2pi(x - 1e-4);
            let (es, ec) = (std::f32::consts::TAU * (x - 1e-4)).sin_cos();
            assert!(
                (s - es).abs() < 2e-6 && (c - ec).abs() < 2e-6,
                "sincos {x}: {s} {c} vs {es} {ec}"
            );
        }
        assert!((ln_f32(f32::MIN_POSITIVE) - f32::MIN_POSITIVE.ln()).abs() < 1e-4);
    }

    #[test]
    fn randperm_is_a_permutation_and_reproducible() {
        let slice = PhiloxSlice { seed: 11, base: 0 };
        let mut a = vec![0i64; 1000];
        randperm(&mut a, slice);
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
        assert_ne!(a, sorted);
        let mut b = vec![0i64; 1000];
        randperm(&mut b, slice);
        assert_eq!(a, b);
    }

    #[test]
    fn default_generators_are_per_device() {
        let (d0, d1) = (
            Generator::default_for(0).unwrap(),
            Generator::default_for(1).unwrap(),
        );
        assert!(Generator::default_for(99).is_err());
        d0.set_seed(5);
        let again = Generator::default_for(0).unwrap();
        assert_eq!(again.seed(), 5);
        assert_eq!(d1.seed(), DEFAULT_SEED);
    }
}
