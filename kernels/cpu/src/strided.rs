//! Strided iteration over validated views, as NumPy's nditer and torch's
//! TensorIterator do it: the engine of the elementwise kernels ([`zip_map`])
//! and the row access of the last-dim reductions ([`map_rows`]).
//!
//! A plan is built in safe integer arithmetic first: size-1 dims are dropped,
//! dims where the output's stride is negative are flipped for every operand
//! (elementwise work does not care about order), dims are sorted by the
//! output's strides (so the output, and any operand laid out like it, is walked
//! in memory order), and neighbours that are contiguous with respect to each
//! other in every operand are merged. The kernel then sees runs: the output
//! as a `&mut [T]` and every input as a [`Src`]: a slice (inner stride 1), a
//! scalar (inner stride 0), the output itself (an exactly aliased input), or a
//! slice read through a per-thread buffer:
//! * an input transposed with respect to the output (its unit stride on
//!   another dim): that dim is moved next to the innermost one, and the input
//!   is read in tiles of [`TILE`] source rows x one cache line, moved with 8x8
//!   (4x4 for 8-byte elements) register transposes ([`transpose_into`]);
//! * stride -1: reversed with vector permutes; any other stride: gathered.
//!
//! Runs are walked by a cursor (no division per run) inside one `pulp`
//! dispatch per thread ([`RunKernel`], [`RowKernel`]): the walk and the
//! kernel's loop are one function compiled for AVX2 / AVX-512, so a run of a
//! broadcast or sliced operand costs little more than its loop. When
//! consecutive runs of a contiguous operand have gaps between them (rows of a
//! sliced tensor), the hardware prefetcher stops at each gap: the next run is
//! prefetched a piece at a time while the current one is computed. The
//! last-dim reductions read a transposed input's adjacent rows as [`Cols`]
//! (vertical sums) or transpose blocks of them into a row buffer (softmax).
//! Runs and rows are split across dlbridge's thread pool (`threads`) above [`PAR_MIN`] elements.
//!
//! Invariants: every view here was validated by dlbridge-core (its layout's
//! logical elements all lie in its extent of host memory, readable for the
//! view's lifetime; a `TensorViewMut` is writable, exclusively held and
//! non-overlapping), and the typed checks (`check_typed::<T>`, what `iter::<T>`
//! checks) are made first, so dtype, host memory and alignment are checked. An input
//! whose byte extent intersects the output's is refused unless it is exactly
//! the output (same address, shape and strides: the one aliasing the registry
//! allows); such an input is never turned into a slice, it is read through the
//! output's own slice. Every address formed below is `base + sum(i_d * s_d)`
//! for in-range indices `i_d` of some operand's (flipped, reordered, merged)
//! dims, which address exactly the same logical elements as the view's own
//! shape and strides, so it lies inside that view's validated extent. Runs
//! partition the index space, so the output slices handed to different
//! threads never overlap.
// Indexed loops on purpose: they stay inside pulp's `#[target_feature]` functions
// (an iterator adaptor's `fold` may be left out of line, compiled for the baseline).
#![allow(clippy::needless_range_loop)]

use std::mem::size_of;

use dlbridge_core::{Element, Error, Result, TensorView, TensorViewMut};
use smallvec::SmallVec;

/// Below this many elements a kernel runs on the calling thread.
pub const PAR_MIN: usize = 1 << 16;
/// Longest run when nothing needs gathering (elements).
const CHUNK: usize = 1 << 14;
/// Longest run when something is gathered or reversed (the length of the
/// per-thread buffers).
const BUF: usize = 1 << 10;
/// A cache line.
const LINE: usize = 64;
/// Width of a tile of a transposed input (elements along the output's
/// contiguous dim, i.e. source rows of the input); a tile is one cache line of
/// each source row, so every line is read once, whole. Measured on 4096x1024
/// f32: 256 source rows per tile beat 64 (more runs) and 1024 (more pages
/// and cache sets in flight).
const TILE: usize = 256;
/// Bytes computed between prefetches of a run ahead (when runs have gaps).
const PIECE: usize = 1 << 10;
/// Runs ahead whose lines are prefetched (when runs have gaps).
const AHEAD: usize = 2;
/// Bytes of the next row prefetched by [`map_rows`] (when rows have gaps).
const ROW_PREFETCH: usize = 1 << 13;
/// At most this many operands (the output and three inputs).
const MAX_OPS: usize = 4;

/// Where a kernel reads one input over a run.
#[derive(Debug)]
pub enum Src<'s, T> {
    /// The run's elements, as many as the output slice has.
    Slice(&'s [T]),
    /// The same element for the whole run (a broadcast, zero-stride input).
    Splat(T),
    /// The input is exactly the output: read the output slice before writing it.
    Out,
}

#[derive(Clone, Copy, Debug)]
struct Dim {
    n: usize,
    s: [isize; MAX_OPS],
}

/// An iteration plan over `k` operands (operand 0 is the output).
#[derive(Debug)]
struct Plan {
    k: usize,
    /// Element offset of each operand's first element (after flips).
    base: [isize; MAX_OPS],
    /// Innermost first; at least two (padded with size-1 dims).
    dims: SmallVec<[Dim; 8]>,
    /// Run length along dims[0].
    block: usize,
    /// Whether some input is transposed with respect to the output (its unit
    /// stride is on dims[1]): dims[0] is cut into tiles [`TILE`] wide.
    tiled: bool,
}

impl Plan {
    /// A plan with no dims yet, for [`Plan::fill`].
    #[inline(always)]
    fn empty(k: usize) -> Plan {
        Plan { k, base: [0isize; MAX_OPS], dims: SmallVec::new(), block: 0, tiled: false }
    }

    /// Plans the walk over `shape` of the operands with `strides` (one per
    /// operand, `self.k` of them), in place: a plan is a few hundred bytes, and
    /// a one-element call would otherwise spend a good part of its time
    /// copying it. False: the tensors are empty, nothing to walk.
    #[inline(always)]
    fn fill(&mut self, shape: &[i64], strides: &[&[i64]]) -> bool {
        let k = self.k;
        debug_assert_eq!(k, strides.len());
        debug_assert!(self.dims.is_empty(), "a plan is filled once");
        if shape.contains(&0) {
            return false;
        }
        let (base, dims) = (&mut self.base, &mut self.dims);
        for (d, &n) in shape.iter().enumerate().rev() {
            if n == 1 {
                continue;
            }
            let mut s = [0isize; MAX_OPS];
            for (op, st) in strides.iter().enumerate() {
                s[op] = st[d] as isize;
            }
            if s[0] < 0 {
                for op in 0..k {
                    base[op] += (n as isize - 1) * s[op];
                    s[op] = -s[op];
                }
            }
            dims.push(Dim { n: n as usize, s });
        }
        // Innermost = smallest output stride; ties broken by the inputs' strides.
        dims.sort_by_key(|d| {
            let mut key = [0usize; MAX_OPS];
            for op in 0..k {
                key[op] = d.s[op].unsigned_abs();
            }
            key
        });
        // Merge each dim into the one before it where every operand steps over
        // the inner one exactly (in place: `dims` is a few hundred bytes).
        let mut kept = 0usize;
        for r in 0..dims.len() {
            let d = dims[r];
            match kept.checked_sub(1).map(|m| &mut dims[m]) {
                Some(m) if (0..k).all(|op| d.s[op] == m.s[op] * m.n as isize) => m.n *= d.n,
                _ => {
                    dims[kept] = d;
                    kept += 1;
                }
            }
        }
        dims.truncate(kept);
        // Pad to two dims. A padded innermost dim covers one element, which is
        // contiguous in every operand: stride 1, so nothing is gathered (or allocated).
        if dims.is_empty() {
            dims.push(Dim { n: 1, s: [1; MAX_OPS] });
        }
        while dims.len() < 2 {
            dims.push(Dim { n: 1, s: [0; MAX_OPS] });
        }
        // An input whose unit stride is on an outer dim: bring that dim next to the
        // innermost one and tile the innermost.
        let transposed = (1..k).find_map(|op| {
            let inner = dims[0].s[op].unsigned_abs();
            if inner <= 1 {
                return None;
            }
            (1..dims.len()).find(|&j| dims[j].s[op].unsigned_abs() == 1 && dims[j].n > 1)
        });
        if let Some(j) = transposed {
            let d = dims.remove(j);
            dims.insert(1, d);
        }
        let gathers = dims[0].s[0] != 1 || (1..k).any(|op| !matches!(dims[0].s[op], 0 | 1));
        let block = if transposed.is_some() {
            TILE
        } else if gathers {
            BUF
        } else {
            CHUNK
        }
        .min(dims[0].n);
        self.block = block;
        self.tiled = transposed.is_some();
        true
    }

    fn blocks0(&self) -> usize {
        self.dims[0].n.div_ceil(self.block)
    }

    /// Number of runs: blocks of dims[0] x every outer index.
    fn runs(&self) -> usize {
        self.blocks0() * self.dims[1..].iter().map(|d| d.n).product::<usize>()
    }

    /// The two innermost axes of the run order, fastest first, as (count,
    /// stride per operand): the blocks of dims[0] and dims[1] -- blocks first
    /// (memory order), or dims[1] first when tiled (the runs of a tile).
    fn axes(&self) -> [(usize, [isize; MAX_OPS]); 2] {
        let d1 = self.dims[1];
        let mut sb = [0isize; MAX_OPS];
        for op in 0..self.k {
            sb[op] = self.block as isize * self.dims[0].s[op];
        }
        let blocks = (self.blocks0(), sb);
        if self.tiled { [(d1.n, d1.s), blocks] } else { [blocks, (d1.n, d1.s)] }
    }
}

/// A position in a plan's runs, stepped without divisions: the run's index on
/// the two innermost axes ([`Plan::axes`]) and on dims[2..], and its first
/// element's offset in every operand.
#[derive(Debug)]
struct Cursor<'p> {
    plan: &'p Plan,
    axes: [(usize, [isize; MAX_OPS]); 2],
    idx: [usize; 2],
    outer: SmallVec<[usize; 8]>,
    off: [isize; MAX_OPS],
}

impl<'p> Cursor<'p> {
    /// At run `r`.
    fn new(plan: &'p Plan, r: usize) -> Cursor<'p> {
        let axes = plan.axes();
        if r == 0 {
            // The first run (the only start on one thread): no divisions.
            let outer = SmallVec::from_elem(0, plan.dims.len() - 2);
            return Cursor { plan, axes, idx: [0; 2], outer, off: plan.base };
        }
        let mut off = plan.base;
        let mut rest = r;
        let mut idx = [0usize; 2];
        for (a, &(n, st)) in axes.iter().enumerate() {
            idx[a] = rest % n;
            rest /= n;
            for op in 0..plan.k {
                off[op] += idx[a] as isize * st[op];
            }
        }
        let outer = plan.dims[2..]
            .iter()
            .map(|d| {
                let i = rest % d.n;
                rest /= d.n;
                for op in 0..plan.k {
                    off[op] += i as isize * d.s[op];
                }
                i
            })
            .collect();
        Cursor { plan, axes, idx, outer, off }
    }

    /// The current run's length.
    #[inline(always)]
    fn len(&self) -> usize {
        let b = self.idx[usize::from(self.plan.tiled)];
        self.plan.block.min(self.plan.dims[0].n - b * self.plan.block)
    }

    /// The index along dims[1] (the fastest axis when tiled).
    #[inline(always)]
    fn j(&self) -> usize {
        self.idx[usize::from(!self.plan.tiled)]
    }

    /// The offsets of the run `ahead` runs on, when it is on the same outer
    /// index (else None).
    #[inline(always)]
    fn peek(&self, ahead: usize) -> Option<[isize; MAX_OPS]> {
        let [(n0, s0), (n1, s1)] = self.axes;
        let (i0, i1) = (self.idx[0] + ahead, self.idx[1]);
        let (j0, j1) = (i0 % n0, i1 + i0 / n0);
        if j1 >= n1 {
            return None;
        }
        let mut off = self.off;
        let (d0, d1) = (j0 as isize - self.idx[0] as isize, (j1 - i1) as isize);
        for op in 0..MAX_OPS {
            off[op] += d0 * s0[op] + d1 * s1[op];
        }
        Some(off)
    }

    /// Steps to the next run.
    #[inline(always)]
    fn advance(&mut self) {
        // Every operand slot is stepped (a slot past `k` holds no pointer). The
        // compiler may store the four offsets one by one: `exec_runs` reads them
        // one by one too (a wider load of all four would stall on forwarding).
        for a in 0..2 {
            let (n, st) = self.axes[a];
            self.idx[a] += 1;
            if self.idx[a] < n {
                for op in 0..MAX_OPS {
                    self.off[op] += st[op];
                }
                return;
            }
            self.idx[a] = 0;
            for op in 0..MAX_OPS {
                self.off[op] -= (n as isize - 1) * st[op];
            }
        }
        for (i, d) in self.outer.iter_mut().zip(&self.plan.dims[2..]) {
            *i += 1;
            if *i < d.n {
                for op in 0..MAX_OPS {
                    self.off[op] += d.s[op];
                }
                return;
            }
            *i = 0;
            for op in 0..MAX_OPS {
                self.off[op] -= (d.n as isize - 1) * d.s[op];
            }
        }
    }
}

/// Start and element offset of an operand whose byte extent is `[lo, hi)` relative to `ptr`.
fn byte_range(ptr: usize, lo: isize, hi: isize) -> (usize, usize) {
    (ptr.wrapping_add_signed(lo), ptr.wrapping_add_signed(hi))
}

fn overlap(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

/// Reads a run of `len` elements at stride `s` (any sign, not 0 or 1) into `buf`.
///
/// # Safety
/// `p + i * s` for `i < len` must address readable, initialised `T`s that
/// nobody writes during the call.
#[inline(always)]
unsafe fn gather<T: Element>(p: *const T, s: isize, len: usize, buf: &mut [T]) {
    let buf = &mut buf[..len];
    if s == -1 {
        // SAFETY: the caller's addresses are p - (len-1) ..= p, contiguous.
        let src = unsafe { std::slice::from_raw_parts(p.wrapping_offset(1 - len as isize), len) };
        reverse_into(src, buf);
    } else {
        for (i, o) in buf.iter_mut().enumerate() {
            // SAFETY: p + i*s for i < len is readable (caller contract).
            *o = unsafe { *p.offset(i as isize * s) };
        }
    }
}

/// A slice of 2-byte elements as its unaligned head, its middle read as u32
/// words (two elements each; on a little-endian machine the first of the two
/// in the low half) and its tail.
pub fn as_u32_pairs<T: Element>(x: &[T]) -> (&[T], &[u32], &[T]) {
    assert_eq!(size_of::<T>(), 2, "as_u32_pairs: 2-byte elements only");
    // SAFETY: an `Element` is plain bits without padding (every bit pattern valid, all
    // bytes initialised), and so is u32; `align_to` splits at u32 alignment and keeps
    // every length in bounds. The words borrow the same (shared) memory.
    unsafe { x.align_to::<u32>() }
}

/// `dst[i] = src[len - 1 - i]` (vector permutes where the CPU has AVX2).
#[inline]
fn reverse_into<T: Element>(src: &[T], dst: &mut [T]) {
    #[cfg(target_arch = "x86_64")]
    if simd::avx2() {
        // SAFETY: the CPU has AVX2 (checked at run time).
        return unsafe { simd::reverse(src, dst) };
    }
    for (o, &v) in dst.iter_mut().zip(src.iter().rev()) {
        *o = v;
    }
}

/// `dst[j * ld + i] = src[i * sa + j]` for `i < rows`, `j < cols`: a block whose
/// source rows are contiguous, written transposed (source columns become rows).
/// Register transposes where the CPU has them (8x8 for 2- and 4-byte elements,
/// 4x4 for 8-byte ones), the block's source rows read 8 (or 4) at a time, each
/// row's `cols` elements together (a tile is one cache line of each row).
///
/// # Safety
/// For every `i < rows`, `src + i * sa + j` (`j < cols`) must address readable,
/// initialised `T`s that nobody writes during the call.
#[inline]
unsafe fn transpose_into<T: Element>(src: *const T, sa: isize, rows: usize, cols: usize, dst: &mut [T], ld: usize) {
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(rows <= ld && (cols - 1) * ld + rows <= dst.len(), "transpose_into: destination too small");
    #[cfg(target_arch = "x86_64")]
    {
        let d = dst.as_mut_ptr();
        // In all three arms: the source as the caller promises; the destination's
        // elements j * ld + i (i < rows <= ld, j < cols) lie in `dst` (asserted above),
        // which is exclusively borrowed, so it does not overlap the (shared) source. An
        // `Element` is plain bits of its size, so it moves as a u16 / u32 / u64 (the
        // loads and stores are unaligned ones).
        match size_of::<T>() {
            // SAFETY: see above (SSE2 is part of the x86-64 baseline).
            2 => return unsafe { simd::transpose16(src.cast(), sa, rows, cols, d.cast(), ld) },
            // SAFETY: see above; the CPU has AVX (checked).
            4 if simd::avx() => return unsafe { simd::transpose32(src.cast(), sa, rows, cols, d.cast(), ld) },
            // SAFETY: see above; the CPU has AVX (checked).
            8 if simd::avx() => return unsafe { simd::transpose64(src.cast(), sa, rows, cols, d.cast(), ld) },
            _ => {}
        }
    }
    for i in 0..rows {
        for j in 0..cols {
            // SAFETY: element j of source row i (caller contract).
            dst[j * ld + i] = unsafe { *src.offset(i as isize * sa + j as isize) };
        }
    }
}

/// `f32 -> bf16` over a slice with one vector instruction per 16 elements
/// (AVX512-BF16), where the CPU has it: the same values as
/// [`crate::convert::f32_to_bf16`] element by element (subnormals included), about
/// a third of the instructions. None elsewhere.
pub fn narrow_bf16_fn() -> Option<crate::convert::SliceConv<f32, dlbridge_core::half::bf16>> {
    #[cfg(target_arch = "x86_64")]
    if simd::avx512bf16() {
        // SAFETY: the CPU has every feature `narrow_bf16` is compiled for (checked above).
        return Some(|src, dst| unsafe { simd::narrow_bf16(src, dst) });
    }
    None
}

/// Register transposes and reversals for x86-64 (SSE2 is part of the baseline;
/// AVX and AVX2 are detected at run time by the callers).
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use dlbridge_core::half::bf16;

    pub(super) fn avx() -> bool {
        std::arch::is_x86_feature_detected!("avx")
    }

    pub(super) fn avx2() -> bool {
        std::arch::is_x86_feature_detected!("avx2")
    }

    /// [`super::reverse_into`], compiled for AVX2 (the loop becomes vector loads,
    /// lane permutes and stores).
    #[target_feature(enable = "avx2")]
    pub(super) fn reverse<T: Copy>(src: &[T], dst: &mut [T]) {
        for (o, &v) in dst.iter_mut().zip(src.iter().rev()) {
            *o = v;
        }
    }

    pub(super) fn avx512bf16() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bf16")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
    }

    /// `dst[i] = f32_to_bf16(src[i])` with AVX512-BF16's `vcvtneps2bf16`, 16 at a
    /// time. That instruction rounds to nearest even and quiets NaNs as
    /// [`crate::convert::f32_to_bf16`] does, but flushes subnormals to zero: a block
    /// of 16 holding one goes through the scalar conversion instead.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub(super) fn narrow_bf16(src: &[f32], dst: &mut [bf16]) {
        debug_assert_eq!(src.len(), dst.len(), "narrow_bf16 converts equal lengths");
        let n = src.len().min(dst.len());
        let (exponent, mantissa) = (_mm512_set1_epi32(0x7f80_0000), _mm512_set1_epi32(0x007f_ffff));
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: elements i..i+16 of `src` (i + 16 <= n <= src.len()).
            let v = unsafe { _mm512_loadu_ps(src.as_ptr().add(i)) };
            let b = _mm512_castps_si512(v);
            let subnormal = !_mm512_test_epi32_mask(b, exponent) & _mm512_test_epi32_mask(b, mantissa);
            if subnormal == 0 {
                // SAFETY: __m256bh and __m256i are both 32 bytes of plain bits.
                let h = unsafe { std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(v)) };
                // SAFETY: elements i..i+16 of `dst` (i + 16 <= n <= dst.len()), 32 bytes.
                unsafe { _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), h) };
            } else {
                for j in i..i + 16 {
                    dst[j] = crate::convert::f32_to_bf16(src[j]);
                }
            }
            i += 16;
        }
        for j in i..n {
            dst[j] = crate::convert::f32_to_bf16(src[j]);
        }
    }

    /// Hints the cache line at `p` into L1.
    #[inline]
    #[target_feature(enable = "sse")]
    pub(super) fn prefetch(p: *const u8) {
        _mm_prefetch::<_MM_HINT_T0>(p.cast());
    }

    /// Source rows this far ahead are prefetched: a transposed operand's rows are
    /// often a power of two apart, so their lines share a few cache sets, and what is
    /// fetched much earlier is evicted before use.
    const PREFETCH: usize = 32;

    /// Hints the first and last cache line of source rows `from..to` into L1.
    #[inline]
    #[target_feature(enable = "sse")]
    fn prefetch_rows<U>(src: *const U, sa: isize, from: usize, to: usize, cols: usize) {
        for i in from..to {
            let p = src.wrapping_offset(i as isize * sa);
            // A prefetch never faults, whatever the address (and these are inside the block).
            _mm_prefetch::<_MM_HINT_T1>(p.cast());
            _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(cols - 1).cast());
        }
    }

    /// Num copy of the block's rows `i0..rows` x columns `0..cols`, and columns
    /// `jr..cols` of rows `0..i0`, where `done = (i0, jr)` (what the register blocks
    /// left).
    ///
    /// # Safety
    /// As [`transpose32`].
    #[inline(always)]
    unsafe fn edges<U: Copy>(src: *const U, sa: isize, rows: usize, cols: usize, dst: *mut U, ld: usize, done: (usize, usize)) {
        let (i0, jr) = done;
        for i in 0..rows {
            let j_from = if i < i0 { jr } else { 0 };
            for j in j_from..cols {
                // SAFETY: element j of source row i, and slot j * ld + i of the destination
                // (caller contract).
                unsafe { *dst.add(j * ld + i) = *src.offset(i as isize * sa + j as isize) };
            }
        }
    }

    /// `dst[j * ld + i] = src[i * sa + j]` for 32-bit elements, 8x8 blocks in AVX registers.
    ///
    /// # Safety
    /// Source rows `i < rows` readable for `cols` elements at `src + i * sa`;
    /// `dst + j * ld + i` (`i < rows`, `j < cols`) writable, disjoint from the
    /// source; the CPU has AVX.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn transpose32(src: *const u32, sa: isize, rows: usize, cols: usize, dst: *mut u32, ld: usize) {
        let (s, d) = (src.cast::<f32>(), dst.cast::<f32>());
        let (rb, cb) = (rows / 8 * 8, cols / 8 * 8);
        for i0 in (0..rb).step_by(8) {
            prefetch_rows(src, sa, i0 + PREFETCH, (i0 + PREFETCH + 8).min(rows), cols);
            for j0 in (0..cb).step_by(8) {
                let at = |k: usize| s.wrapping_offset((i0 + k) as isize * sa + j0 as isize);
                // SAFETY: elements j0..j0+8 of source rows i0..i0+8 (inside the block).
                let r = unsafe {
                    [
                        _mm256_loadu_ps(at(0)),
                        _mm256_loadu_ps(at(1)),
                        _mm256_loadu_ps(at(2)),
                        _mm256_loadu_ps(at(3)),
                        _mm256_loadu_ps(at(4)),
                        _mm256_loadu_ps(at(5)),
                        _mm256_loadu_ps(at(6)),
                        _mm256_loadu_ps(at(7)),
                    ]
                };
                // Lane-wise moves only (no arithmetic): any bit pattern passes unchanged.
                let t0 = _mm256_unpacklo_ps(r[0], r[1]);
                let t1 = _mm256_unpackhi_ps(r[0], r[1]);
                let t2 = _mm256_unpacklo_ps(r[2], r[3]);
                let t3 = _mm256_unpackhi_ps(r[2], r[3]);
                let t4 = _mm256_unpacklo_ps(r[4], r[5]);
                let t5 = _mm256_unpackhi_ps(r[4], r[5]);
                let t6 = _mm256_unpacklo_ps(r[6], r[7]);
                let t7 = _mm256_unpackhi_ps(r[6], r[7]);
                let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
                let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
                let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
                let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
                let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
                let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
                let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
                let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
                let o = [
                    _mm256_permute2f128_ps::<0x20>(u0, u4),
                    _mm256_permute2f128_ps::<0x20>(u1, u5),
                    _mm256_permute2f128_ps::<0x20>(u2, u6),
                    _mm256_permute2f128_ps::<0x20>(u3, u7),
                    _mm256_permute2f128_ps::<0x31>(u0, u4),
                    _mm256_permute2f128_ps::<0x31>(u1, u5),
                    _mm256_permute2f128_ps::<0x31>(u2, u6),
                    _mm256_permute2f128_ps::<0x31>(u3, u7),
                ];
                for (k, v) in o.into_iter().enumerate() {
                    // SAFETY: destination row j0 + k, slots i0..i0+8 (inside the block).
                    unsafe { _mm256_storeu_ps(d.add((j0 + k) * ld + i0), v) };
                }
            }
        }
        // SAFETY: the rest of the same block (caller contract).
        unsafe { edges(src, sa, rows, cols, dst, ld, (rb, cb)) };
    }

    /// [`transpose32`] for 16-bit elements: 8x8 blocks in SSE2 registers.
    ///
    /// # Safety
    /// As [`transpose32`] (SSE2 is part of the x86-64 baseline).
    #[target_feature(enable = "sse2")]
    pub(super) unsafe fn transpose16(src: *const u16, sa: isize, rows: usize, cols: usize, dst: *mut u16, ld: usize) {
        let (rb, cb) = (rows / 8 * 8, cols / 8 * 8);
        for i0 in (0..rb).step_by(8) {
            prefetch_rows(src, sa, i0 + PREFETCH, (i0 + PREFETCH + 8).min(rows), cols);
            for j0 in (0..cb).step_by(8) {
                let at = |k: usize| src.wrapping_offset((i0 + k) as isize * sa + j0 as isize).cast::<__m128i>();
                // SAFETY: elements j0..j0+8 of source rows i0..i0+8 (inside the block).
                let r = unsafe {
                    [
                        _mm_loadu_si128(at(0)),
                        _mm_loadu_si128(at(1)),
                        _mm_loadu_si128(at(2)),
                        _mm_loadu_si128(at(3)),
                        _mm_loadu_si128(at(4)),
                        _mm_loadu_si128(at(5)),
                        _mm_loadu_si128(at(6)),
                        _mm_loadu_si128(at(7)),
                    ]
                };
                let a0 = _mm_unpacklo_epi16(r[0], r[1]);
                let a1 = _mm_unpackhi_epi16(r[0], r[1]);
                let a2 = _mm_unpacklo_epi16(r[2], r[3]);
                let a3 = _mm_unpackhi_epi16(r[2], r[3]);
                let a4 = _mm_unpacklo_epi16(r[4], r[5]);
                let a5 = _mm_unpackhi_epi16(r[4], r[5]);
                let a6 = _mm_unpacklo_epi16(r[6], r[7]);
                let a7 = _mm_unpackhi_epi16(r[6], r[7]);
                let b0 = _mm_unpacklo_epi32(a0, a2);
                let b1 = _mm_unpackhi_epi32(a0, a2);
                let b2 = _mm_unpacklo_epi32(a1, a3);
                let b3 = _mm_unpackhi_epi32(a1, a3);
                let b4 = _mm_unpacklo_epi32(a4, a6);
                let b5 = _mm_unpackhi_epi32(a4, a6);
                let b6 = _mm_unpacklo_epi32(a5, a7);
                let b7 = _mm_unpackhi_epi32(a5, a7);
                let o = [
                    _mm_unpacklo_epi64(b0, b4),
                    _mm_unpackhi_epi64(b0, b4),
                    _mm_unpacklo_epi64(b1, b5),
                    _mm_unpackhi_epi64(b1, b5),
                    _mm_unpacklo_epi64(b2, b6),
                    _mm_unpackhi_epi64(b2, b6),
                    _mm_unpacklo_epi64(b3, b7),
                    _mm_unpackhi_epi64(b3, b7),
                ];
                for (k, v) in o.into_iter().enumerate() {
                    // SAFETY: destination row j0 + k, slots i0..i0+8 (inside the block).
                    unsafe { _mm_storeu_si128(dst.add((j0 + k) * ld + i0).cast(), v) };
                }
            }
        }
        // SAFETY: the rest of the same block (caller contract).
        unsafe { edges(src, sa, rows, cols, dst, ld, (rb, cb)) };
    }

    /// [`transpose32`] for 64-bit elements: 4x4 blocks in AVX registers.
    ///
    /// # Safety
    /// As [`transpose32`].
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn transpose64(src: *const u64, sa: isize, rows: usize, cols: usize, dst: *mut u64, ld: usize) {
        let (s, d) = (src.cast::<f64>(), dst.cast::<f64>());
        let (rb, cb) = (rows / 4 * 4, cols / 4 * 4);
        for i0 in (0..rb).step_by(4) {
            prefetch_rows(src, sa, i0 + PREFETCH, (i0 + PREFETCH + 4).min(rows), cols);
            for j0 in (0..cb).step_by(4) {
                let at = |k: usize| s.wrapping_offset((i0 + k) as isize * sa + j0 as isize);
                // SAFETY: elements j0..j0+4 of source rows i0..i0+4 (inside the block).
                let r = unsafe { [_mm256_loadu_pd(at(0)), _mm256_loadu_pd(at(1)), _mm256_loadu_pd(at(2)), _mm256_loadu_pd(at(3))] };
                let t0 = _mm256_unpacklo_pd(r[0], r[1]);
                let t1 = _mm256_unpackhi_pd(r[0], r[1]);
                let t2 = _mm256_unpacklo_pd(r[2], r[3]);
                let t3 = _mm256_unpackhi_pd(r[2], r[3]);
                let o = [
                    _mm256_permute2f128_pd::<0x20>(t0, t2),
                    _mm256_permute2f128_pd::<0x20>(t1, t3),
                    _mm256_permute2f128_pd::<0x31>(t0, t2),
                    _mm256_permute2f128_pd::<0x31>(t1, t3),
                ];
                for (k, v) in o.into_iter().enumerate() {
                    // SAFETY: destination row j0 + k, slots i0..i0+4 (inside the block).
                    unsafe { _mm256_storeu_pd(d.add((j0 + k) * ld + i0), v) };
                }
            }
        }
        // SAFETY: the rest of the same block (caller contract).
        unsafe { edges(src, sa, rows, cols, dst, ld, (rb, cb)) };
    }
}

/// A kernel over one run: `run(out_run, input_runs)`. Called inside `pulp`'s
/// dispatch (the whole loop over runs is compiled for AVX2 / AVX-512 there),
/// so `run` should be `#[inline(always)]` and made of plain loops.
pub trait RunKernel<T, const N: usize>: Sync {
    /// Little arithmetic per element (relu): bound by memory, so f32 runs use
    /// 256-bit vectors, as f32 binary maps do (see `zip_map_impl`).
    const MEMORY_BOUND: bool = false;
    /// Computes one run of the output from the inputs' runs.
    fn run(&self, o: &mut [T], srcs: [Src<'_, T>; N]);
}

/// `k.run(out_run, input_runs)` over every element of `out` and the inputs
/// (same shape as `out`, any strides; an input may be exactly `out`). Runs are
/// split across dlbridge's thread pool above [`PAR_MIN`] elements.
pub fn zip_map<T: Element + Default, const N: usize>(
    out: &mut TensorViewMut<'_>,
    ins: [&TensorView<'_>; N],
    k: &impl RunKernel<T, N>,
) -> Result<()> {
    zip_map_impl(out, ins, false, k)
}

/// [`zip_map`] for an update of `out` in place (`out = g(out, inputs)`, as axpy):
/// the kernel's output run holds `out`'s current values, whatever its strides.
pub fn update_map<T: Element + Default, const N: usize>(
    out: &mut TensorViewMut<'_>,
    ins: [&TensorView<'_>; N],
    k: &impl RunKernel<T, N>,
) -> Result<()> {
    zip_map_impl(out, ins, true, k)
}

/// What every thread's walk over the runs needs (see [`exec_runs`]).
struct Walk<'p, const N: usize> {
    plan: &'p Plan,
    ptrs: [usize; MAX_OPS],
    /// Input i (operand i + 1) is exactly the output.
    alias: [bool; MAX_OPS],
    /// Inputs read through a per-thread buffer: any inner stride but 0 and 1.
    needs_buf: [bool; N],
    /// Inputs read as tiles (transposed with respect to the output).
    tiled: [bool; N],
    /// Runs per tile (one cache line of each source row).
    tile_rows: usize,
    /// The output run must hold the output's values before the kernel runs.
    reads_out: bool,
    /// Contiguous operands whose rows have gaps between them (a sliced operand:
    /// not continued by the next row, nor re-read as a broadcast row is): their
    /// next run is prefetched while a run is computed. All false when tiled.
    prefetch: [bool; MAX_OPS],
}

/// One thread's share of the runs, `lo..hi`, for `pulp`'s dispatch: the walk
/// and the kernel are inlined into one function compiled for the CPU's vector
/// instruction set, so a run costs a few adds and a kernel loop.
struct ExecRuns<'w, 'p, T, K, const N: usize> {
    walk: &'w Walk<'p, N>,
    lo: usize,
    hi: usize,
    k: &'w K,
    _t: std::marker::PhantomData<fn() -> T>,
}

impl<T: Element + Default, K: RunKernel<T, N>, const N: usize> pulp::WithSimd for ExecRuns<'_, '_, T, K, N> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        // Two copies of the walk: the one without prefetches has nothing in its way.
        if self.walk.prefetch.iter().any(|&p| p) {
            exec_runs::<T, K, N, true>(self.walk, self.lo, self.hi, self.k)
        } else {
            exec_runs::<T, K, N, false>(self.walk, self.lo, self.hi, self.k)
        }
    }
}

/// Runs `lo..hi` of the walk's plan (see [`ExecRuns`]).
#[inline(always)]
fn exec_runs<T: Element + Default, K: RunKernel<T, N>, const N: usize, const PREFETCH: bool>(w: &Walk<'_, N>, lo: usize, hi: usize, k: &K) {
    let plan = w.plan;
    let (s0, s1) = (plan.dims[0].s, plan.dims[1].s);
    let (blen, n1, alias, ptrs) = (plan.block, plan.dims[1].n, w.alias, w.ptrs);
    let mut obuf: Vec<T> = if s0[0] != 1 { vec![T::default(); blen] } else { Vec::new() };
    let mut bufs: [Vec<T>; N] = std::array::from_fn(|i| {
        let rows = if w.tiled[i] { w.tile_rows } else { 1 };
        if w.needs_buf[i] { vec![T::default(); blen * rows] } else { Vec::new() }
    });
    // The prefetched operands whose next run does not start inside (or right after)
    // this one: the next run of a sliced operand's row, not the next block of a row.
    let gapped = |off: &[isize; MAX_OPS], next: &[isize; MAX_OPS], len: usize| {
        let mut g = [false; MAX_OPS];
        for op in 0..=N {
            g[op] = w.prefetch[op] && !(0..=len as isize).contains(&(next[op] - off[op]));
        }
        g
    };
    let (mut tile_row, mut tile_cnt) = (0usize, 0usize);
    let mut cur = Cursor::new(plan, lo);
    for r in lo..hi {
        if r > lo {
            cur.advance();
        }
        // By reference: a copy of the array compiled to one 32-byte load of the four
        // offsets `advance` had just stored one by one, a store-forwarding stall
        // (12% of add with a broadcast bias, whose runs are 1024 elements long).
        let (off, len) = (&cur.off, cur.len());
        let s = &s0;
        let at = |op: usize| (ptrs[op] as *mut T).wrapping_offset(off[op]);
        if plan.tiled {
            if tile_row >= tile_cnt {
                // Runs r .. r + tile_cnt share their block and outer index: only dims[1] moves.
                tile_cnt = w.tile_rows.min(n1 - cur.j()).min(hi - r);
                tile_row = 0;
                for (i, buf) in bufs.iter_mut().enumerate() {
                    if !w.tiled[i] {
                        continue;
                    }
                    let (p, sa, sb) = (at(i + 1).cast_const(), s[i + 1], s1[i + 1]);
                    if sb == 1 {
                        // SAFETY: source row c < len of the tile is element c of runs r ..
                        // r + tile_cnt of this input (same block and outer index, so at
                        // p + c*sa + jj for jj < tile_cnt), inside its extent, not written
                        // (the input does not overlap the output).
                        unsafe { transpose_into(p, sa, len, tile_cnt, buf, blen) };
                    } else {
                        for c in 0..len {
                            for jj in 0..tile_cnt {
                                // SAFETY: element c of run r + jj of this input (as above,
                                // with dims[1]'s stride -1), inside its extent, not written.
                                buf[jj * blen + c] = unsafe { *p.offset(c as isize * sa + jj as isize * sb) };
                            }
                        }
                    }
                }
            }
            tile_row += 1;
        }
        let o: &mut [T] = if s[0] == 1 {
            // SAFETY: the run's output elements are contiguous (stride 1), inside the
            // output's extent, writable and exclusive; runs partition the index space,
            // so no other live slice covers them (module invariants).
            unsafe { std::slice::from_raw_parts_mut(at(0), len) }
        } else {
            if w.reads_out || alias[1..=N].iter().any(|&a| a) {
                // SAFETY: output elements of this run, read before being written.
                unsafe { gather(at(0).cast_const(), s[0], len, &mut obuf) };
            }
            &mut obuf[..len]
        };
        // A plain loop, not `bufs.each_mut().map(..)`: LLVM left that closure out of
        // line (compiled for the baseline target, and called per operand per run:
        // 4% of add with a broadcast bias, whose runs are 1024 elements long).
        let mut srcs: [Src<'_, T>; N] = [const { Src::Out }; N];
        for (i, buf) in bufs.iter_mut().enumerate() {
            let op = i + 1;
            if alias[op] {
                continue;
            }
            let p = at(op).cast_const();
            srcs[i] = match s[op] {
                // SAFETY: one element of the input, inside its extent.
                0 => Src::Splat(unsafe { *p }),
                // SAFETY: `len` contiguous input elements inside its extent; the input
                // does not overlap the output (checked above), so nobody writes them.
                1 => Src::Slice(unsafe { std::slice::from_raw_parts(p, len) }),
                _ if w.tiled[i] => Src::Slice(&buf[(tile_row - 1) * blen..][..len]),
                st => {
                    // SAFETY: the run's input elements p + j*st (j < len) lie in its extent
                    // and nobody writes them (the input does not overlap the output).
                    unsafe { gather(p, st, len, buf) };
                    Src::Slice(&buf[..len])
                }
            };
        }
        // The run AHEAD runs on, when it does not continue this one in some contiguous
        // operand: the hardware prefetcher stops at each gap (and at each page), so
        // that run's lines are prefetched a piece at a time while this run is computed
        // piece by piece (a whole run of prefetches at once would fill the miss queue).
        // Each line is hinted twice (presumably a hint that finds the miss queue full
        // is dropped, and the second one lands); on sliced operands this beats hinting
        // the next run once (`compare.py`'s sliced rows). Near the end of a
        // thread's share the next run stands in (its `gapped` test is then looser,
        // which only skips a hint).
        let pf = if PREFETCH && r + 1 < hi { cur.peek(AHEAD).or_else(|| cur.peek(1)) } else { None }
            .map(|next| (next, gapped(off, &next, AHEAD * len)))
            .filter(|(_, g)| g.iter().any(|&g| g));
        match pf {
            None => k.run(o, srcs),
            Some((next, g)) => {
                let piece = (PIECE / size_of::<T>()).max(1);
                let mut i = 0;
                while i < len {
                    let e = (i + piece).min(len);
                    for op in 0..=N {
                        if g[op] {
                            let p = (ptrs[op] as *const T).wrapping_offset(next[op] + i as isize);
                            prefetch_lines::<2>(p.cast(), (e - i) * size_of::<T>());
                        }
                    }
                    // A loop for the reason given where `srcs` is built.
                    let mut part: [Src<'_, T>; N] = [const { Src::Out }; N];
                    for (p, src) in part.iter_mut().zip(&srcs) {
                        *p = match src {
                            Src::Slice(x) => Src::Slice(&x[i..e]),
                            &Src::Splat(v) => Src::Splat(v),
                            Src::Out => Src::Out,
                        };
                    }
                    k.run(&mut o[i..e], part);
                    i = e;
                }
            }
        }
        if s[0] != 1 {
            for (i, &v) in obuf[..len].iter().enumerate() {
                // SAFETY: output element i of this run (stride s[0]), writable and exclusive.
                unsafe { *at(0).offset(i as isize * s[0]) = v };
            }
        }
    }
}

/// Hints the cache lines of `bytes` bytes from `p` into L1, `TIMES` times each
/// (nothing off x86-64).
#[inline(always)]
fn prefetch_lines<const TIMES: usize>(p: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    for l in (0..bytes + LINE - 1).step_by(LINE) {
        for _ in 0..TIMES {
            // SAFETY: x86-64 always has SSE; a prefetch never faults, whatever the address.
            unsafe { simd::prefetch(p.wrapping_add(l)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, bytes);
}

/// `reads_out`: the output run must hold the output's values before the kernel
/// runs (it always does when the output is contiguous; otherwise it is gathered).
fn zip_map_impl<T: Element + Default, K: RunKernel<T, N>, const N: usize>(
    out: &mut TensorViewMut<'_>,
    ins: [&TensorView<'_>; N],
    reads_out: bool,
    k: &K,
) -> Result<()> {
    assert!(N < MAX_OPS, "zip_map takes at most {} inputs", MAX_OPS - 1);
    // Typed checks (dtype, host memory, alignment) before any pointer use.
    out.check_typed::<T>("elementwise")?;
    for x in ins {
        x.check_typed::<T>("elementwise")?;
        if x.shape() != out.shape() {
            return Err(Error::Shape(format!("elementwise: input shape {:?} is not the output's {:?}", x.shape(), out.shape())));
        }
    }
    let numel = out.numel();
    if numel == 0 {
        return Ok(());
    }
    let optr = out.data_ptr_mut() as usize;
    let (oview, ext) = (out.as_view(), out.as_view().extent());
    let orange = byte_range(optr, ext.byte_lo, ext.byte_hi);
    let mut alias = [false; MAX_OPS];
    let mut ptrs = [0usize; MAX_OPS];
    ptrs[0] = optr;
    for (i, x) in ins.iter().enumerate() {
        let ptr = x.data_ptr() as usize;
        let e = x.extent();
        // Exactly the output, byte for byte (the registry's rule): same address,
        // element width and strides. Anything else that overlaps it is refused.
        if ptr == optr && x.dtype().element_bits() == oview.dtype().element_bits() && x.strides() == oview.strides() {
            alias[i + 1] = true;
        } else if overlap(byte_range(ptr, e.byte_lo, e.byte_hi), orange) {
            return Err(Error::InvalidArgument("elementwise: an input overlaps the output without being exactly it".into()));
        }
        ptrs[i + 1] = ptr;
    }
    let mut strides: SmallVec<[&[i64]; MAX_OPS]> = SmallVec::new();
    strides.push(oview.strides());
    strides.extend(ins.iter().map(|x| x.strides()));
    let mut plan = Plan::empty(strides.len());
    if !plan.fill(out.shape(), &strides) {
        return Ok(());
    }

    let (s0, s1) = (plan.dims[0].s, plan.dims[1].s);
    let needs_buf: [bool; N] = std::array::from_fn(|i| !alias[i + 1] && !matches!(s0[i + 1], 0 | 1));
    // Inputs transposed with respect to the output (unit stride on dims[1]) are read
    // as 2-d tiles of `tile_rows` runs, one cache line of each source row, moved with
    // register transposes ([`transpose_into`]); a run-by-run gather would touch one
    // line per element, all in the same cache set.
    let tiled: [bool; N] = std::array::from_fn(|i| needs_buf[i] && plan.tiled && s1[i + 1].unsigned_abs() == 1);
    let tile_rows = if plan.tiled { (LINE / size_of::<T>()).max(1) } else { 1 };
    let row = plan.dims[0].n as isize;
    let prefetch: [bool; MAX_OPS] =
        std::array::from_fn(|op| op <= N && !plan.tiled && plan.dims[1].n > 1 && s0[op] == 1 && !alias[op] && s1[op] != 0 && s1[op] != row);
    let walk = Walk { plan: &plan, ptrs, alias, needs_buf, tiled, tile_rows, reads_out, prefetch };
    let arch = pulp::Arch::new();
    // f32 binary maps and memory-bound unary ones (relu) without tiles run as
    // 256-bit loops, as torch's do: `compare.py` measures them faster that way
    // than as 512-bit loops. bf16, which converts in 512-bit registers, tiled
    // transposes and unary maps with real arithmetic (gelu) are faster with
    // pulp's widest dispatch, and keep it.
    #[cfg(target_arch = "x86_64")]
    let avx2 = (T::DTYPE == dlbridge_core::DType::F32 && (N == 2 || K::MEMORY_BOUND) && !plan.tiled).then(pulp::x86::V3::try_new).flatten();
    let exec = |lo: usize, hi: usize| {
        let job = ExecRuns { walk: &walk, lo, hi, k, _t: std::marker::PhantomData };
        #[cfg(target_arch = "x86_64")]
        if let Some(simd) = avx2 {
            return simd.vectorize(|| pulp::WithSimd::with_simd(job, simd));
        }
        arch.dispatch(job)
    };

    let runs = plan.runs();
    if numel < PAR_MIN || runs < 2 {
        exec(0, runs);
    } else {
        let parts = (crate::threads::budget() * 4).min(runs);
        crate::threads::for_each_part(parts, |p| exec(runs * p / parts, runs * (p + 1) / parts));
    }
    Ok(())
}

/// `cnt` adjacent rows of an input whose last dim is not contiguous but whose
/// innermost batch dim is (a transposed input): element `k` of those rows is
/// one contiguous run, [`Cols::col`]`(k)`. Reductions that do not care about
/// the order of a row's elements read it this way, accumulating whole runs at
/// once (vertically) instead of gathering each row.
#[derive(Debug)]
pub struct Cols<'a, T> {
    p: *const T,
    xs: isize,
    n: usize,
    cnt: usize,
    _input: std::marker::PhantomData<&'a [T]>,
}

impl<'a, T> Cols<'a, T> {
    /// The rows' length (the number of runs).
    #[inline(always)]
    pub fn n(&self) -> usize {
        self.n
    }
    /// The number of rows (each run's length).
    #[inline(always)]
    pub fn width(&self) -> usize {
        self.cnt
    }
    /// Rows `lo .. lo + w` of these (every run narrowed to them).
    #[inline(always)]
    pub fn narrow(&self, lo: usize, w: usize) -> Cols<'a, T> {
        assert!(lo.checked_add(w).is_some_and(|hi| hi <= self.cnt), "rows {lo}..+{w} of {}", self.cnt);
        Cols { p: self.p.wrapping_add(lo), xs: self.xs, n: self.n, cnt: w, _input: std::marker::PhantomData }
    }
    /// Asks the CPU to fetch run `k` (element `k` of each row) into cache
    /// ahead of its use; nothing when `k` is past the last run. A run of a
    /// transposed input starts a page of its own, where the hardware
    /// prefetcher starts cold.
    #[inline(always)]
    pub fn prefetch(&self, k: usize) {
        if k < self.n {
            prefetch_lines::<1>(self.p.wrapping_offset(k as isize * self.xs).cast(), self.cnt * size_of::<T>());
        }
    }
    /// Element `k` of each of the rows, in row order.
    #[inline(always)]
    pub fn col(&self, k: usize) -> &'a [T] {
        assert!(k < self.n);
        // SAFETY: element k of rows r0 .. r0 + cnt of the input, which sit side by side
        // (the innermost batch dim has stride 1): cnt contiguous elements inside its
        // extent, not written while `'a` lasts (the input does not overlap the output).
        unsafe { std::slice::from_raw_parts(self.p.wrapping_offset(k as isize * self.xs), self.cnt) }
    }
}

/// The output side of [`Cols`], for kernels whose output rows are laid out
/// like their transposed input's ([`RowKernel::cols_full`]): element `k` of
/// `cnt` adjacent output rows is one contiguous run, [`ColsMut::col_mut`]`(k)`.
#[derive(Debug)]
pub struct ColsMut<'a, U> {
    p: *mut U,
    ys: isize,
    n: usize,
    cnt: usize,
    _output: std::marker::PhantomData<&'a mut [U]>,
}

impl<U> ColsMut<'_, U> {
    /// Asks the CPU to fetch output run `k` into cache ahead of its use (a
    /// write, or softmax's scaling pass reading it back: the hardware
    /// prefetcher does not follow runs a page or more apart).
    #[inline(always)]
    pub fn prefetch(&self, k: usize) {
        if k < self.n {
            prefetch_lines::<1>(self.p.wrapping_offset(k as isize * self.ys).cast_const().cast(), self.cnt * size_of::<U>());
        }
    }
    /// Element `k` of each of the output rows, in row order.
    #[inline(always)]
    pub fn col_mut(&mut self, k: usize) -> &mut [U] {
        assert!(k < self.n);
        // SAFETY: element k of output rows r0 .. r0 + cnt, which sit side by side (the
        // innermost batch dim has stride 1 in the output too): cnt contiguous elements
        // inside its extent. The output is non-overlapping (a TensorViewMut), so runs of
        // different k are disjoint, and this thread alone writes these rows; `&mut self`
        // keeps one run borrowed at a time.
        unsafe { std::slice::from_raw_parts_mut(self.p.wrapping_offset(k as isize * self.ys), self.cnt) }
    }
}

/// Rows gathered into a row buffer at once.
pub const ROW_BLOCK: usize = 64;

/// Rows of a transposed input read together as [`Cols`]: each run is up to
/// this many adjacent elements (4 KiB of f32), so a block streams whole pages
/// one after the other (the hardware prefetcher follows a long run; it does not
/// follow 64-element runs 16 KiB apart).
pub const COL_BLOCK: usize = 1024;

/// A kernel over the last-dim rows of `x` (see [`map_rows`]). Called inside
/// `pulp`'s dispatch (the loop over rows is compiled for AVX2 / AVX-512 there),
/// so the methods should be `#[inline(always)]`.
pub trait RowKernel<T, U>: Sync {
    /// The element type of the per-thread scratch buffer.
    type S: Copy + Default;
    /// Whether the kernel's result does not depend on the order of a row's
    /// elements (sum, mean): rows of stride 0 and -1 are then passed in memory
    /// order (see [`map_rows`]), and [`RowKernel::cols`] takes blocks of a
    /// transposed input's rows.
    const ORDER_FREE: bool;
    /// One row: `x` (the row; its one element when its stride is 0 and the
    /// kernel is order-free), `n` (the row's length) and the output row `y`
    /// (`n` elements, or one for a reduction).
    fn row<V: pulp::Simd>(&self, simd: V, x: &[T], n: usize, y: &mut [U], scratch: &mut [Self::S]);
    /// One result per row of a block of a transposed input's rows (at most
    /// [`COL_BLOCK`]; only for order-free reductions; the default gathers
    /// nothing and is never called).
    fn cols<V: pulp::Simd>(&self, simd: V, c: &Cols<'_, T>, y: &mut [U]) {
        let _ = (simd, c, y);
        unreachable!("cols on a kernel that is not order-free")
    }
    /// Whether the kernel has [`RowKernel::cols_full`] (softmax).
    const COLS_FULL: bool = false;
    /// The scratch [`RowKernel::cols_full`] needs for `w` rows of `n` elements.
    fn cols_full_scratch(n: usize, w: usize) -> usize {
        w * (n + 2)
    }
    /// A whole block of a transposed input's rows into output rows laid out
    /// alike (an output that follows its input's memory order): `c` holds
    /// the rows (at most [`COL_BLOCK`]), `y` the same rows of the output,
    /// `scratch` [`RowKernel::cols_full_scratch`] elements.
    fn cols_full<V: pulp::Simd>(&self, simd: V, c: &Cols<'_, T>, y: &mut ColsMut<'_, U>, scratch: &mut [Self::S]) {
        let _ = (simd, c, y, scratch);
        unreachable!("cols_full on a kernel without it")
    }
}

/// The batch index of a row and its offsets in `x` and `y`, stepped without
/// divisions (the last batch dim fastest, as rows are numbered).
#[derive(Debug, Clone)]
struct RowCursor<'d> {
    dims: &'d [(usize, isize, isize)],
    idx: SmallVec<[usize; 8]>,
    xo: isize,
    yo: isize,
}

impl<'d> RowCursor<'d> {
    fn new(dims: &'d [(usize, isize, isize)], r: usize) -> RowCursor<'d> {
        let (mut rest, mut xo, mut yo) = (r, 0isize, 0isize);
        let mut idx: SmallVec<[usize; 8]> = SmallVec::from_elem(0, dims.len());
        for (d, &(m, sx, sy)) in dims.iter().enumerate().rev() {
            idx[d] = rest % m;
            xo += idx[d] as isize * sx;
            yo += idx[d] as isize * sy;
            rest /= m;
        }
        RowCursor { dims, idx, xo, yo }
    }

    /// The next row's offset in `x` when it is along the innermost batch dim.
    #[inline(always)]
    fn peek_x(&self) -> Option<isize> {
        let (&(m, sx, _), &i) = (self.dims.last()?, self.idx.last()?);
        (i + 1 < m).then_some(self.xo + sx)
    }

    /// Moves `by` rows on, where `by` does not leave the innermost batch dim's run
    /// (or is 1).
    #[inline(always)]
    fn advance(&mut self, by: usize) {
        let mut by = by;
        for d in (0..self.dims.len()).rev() {
            let (m, sx, sy) = self.dims[d];
            self.idx[d] += by;
            self.xo += by as isize * sx;
            self.yo += by as isize * sy;
            if self.idx[d] < m {
                return;
            }
            self.xo -= m as isize * sx;
            self.yo -= m as isize * sy;
            self.idx[d] -= m;
            by = 1;
        }
    }
}

/// How [`map_rows`] reads and writes rows (shared by its threads).
struct RowWalk<'d> {
    xptr: usize,
    yptr: usize,
    bdims: &'d [(usize, isize, isize)],
    n: usize,
    xs: isize,
    ys: isize,
    ylen: usize,
    /// Order-free and stride 0: the row is its one element.
    constant: bool,
    /// Order-free and stride -1: the row in memory order.
    reversed: bool,
    /// Rows go through the row buffer (any stride but 1, unless constant or reversed).
    xgather: bool,
    /// Size of the innermost batch dim when rows are adjacent there (x stride 1), else 1.
    m_in: usize,
    /// y's stride along that dim.
    sy_in: isize,
    /// Blocks of adjacent rows go to the kernel's `cols`.
    vertical: bool,
    /// Blocks of adjacent rows, whose output rows are adjacent too, go to the kernel's `cols_full`.
    vertical_full: bool,
    /// Rows per block.
    rb: usize,
    scratch_len: usize,
}

/// One thread's rows `lo..hi` for `pulp`'s dispatch (see [`ExecRuns`]).
struct ExecRows<'w, 'd, T, U, K> {
    walk: &'w RowWalk<'d>,
    lo: usize,
    hi: usize,
    k: &'w K,
    _t: std::marker::PhantomData<fn() -> (T, U)>,
}

impl<T: Element + Default, U: Element + Default, K: RowKernel<T, U>> pulp::WithSimd for ExecRows<'_, '_, T, U, K> {
    type Output = ();
    #[inline(always)]
    fn with_simd<V: pulp::Simd>(self, simd: V) {
        exec_rows::<T, U, K, V>(simd, self.walk, self.lo, self.hi, self.k)
    }
}

/// Rows `lo..hi` of the walk (see [`map_rows`]).
#[inline(always)]
fn exec_rows<T: Element + Default, U: Element + Default, K: RowKernel<T, U>, V: pulp::Simd>(
    simd: V,
    w: &RowWalk<'_>,
    lo: usize,
    hi: usize,
    k: &K,
) {
    let (n, xs, ys, ylen, rb) = (w.n, w.xs, w.ys, w.ylen, w.rb);
    let (xp, yp) = (w.xptr as *const T, w.yptr as *mut U);
    let adjacent = w.m_in > 1;
    let ystage = ys != 1 && ylen > 1;
    let mut xbuf: Vec<T> = if w.xgather && !w.vertical && !w.vertical_full { vec![T::default(); rb * n] } else { Vec::new() };
    let mut ybuf: Vec<U> = if (ystage && !w.vertical_full) || w.vertical { vec![U::default(); ylen.max(rb)] } else { Vec::new() };
    let mut scratch: Vec<K::S> = vec![K::S::default(); w.scratch_len];
    // Element offset of a row's lowest element from its first; elements handed over.
    let shift = if w.reversed { 1 - n as isize } else { 0 };
    let xlen = if w.constant { 1 } else { n };
    let mut cur = RowCursor::new(w.bdims, lo);
    let mut offs = [(0isize, 0isize); ROW_BLOCK];
    let mut r0 = lo;
    while r0 < hi {
        // A block never leaves its run of adjacent rows.
        let cnt = if adjacent { rb.min(hi - r0).min(w.m_in - cur.idx.last().copied().unwrap_or(0)) } else { rb.min(hi - r0) };
        if w.vertical_full {
            let c = Cols { p: xp.wrapping_offset(cur.xo), xs, n, cnt, _input: std::marker::PhantomData };
            let mut yc = ColsMut { p: yp.wrapping_offset(cur.yo), ys, n, cnt, _output: std::marker::PhantomData };
            k.cols_full(simd, &c, &mut yc, &mut scratch);
            cur.advance(cnt);
            r0 += cnt;
            continue;
        }
        if w.vertical {
            let c = Cols { p: xp.wrapping_offset(cur.xo), xs, n, cnt, _input: std::marker::PhantomData };
            k.cols(simd, &c, &mut ybuf[..cnt]);
            for (i, &v) in ybuf[..cnt].iter().enumerate() {
                // SAFETY: the output element of row r0 + i (adjacent rows differ along the
                // innermost batch dim only): writable, exclusive; rows are disjoint.
                unsafe { *yp.wrapping_offset(cur.yo + i as isize * w.sy_in) = v };
            }
            cur.advance(cnt);
            r0 += cnt;
            continue;
        }
        // The block's row offsets (the cursor ends on the next block's first row).
        for o in offs[..cnt].iter_mut() {
            *o = (cur.xo, cur.yo);
            cur.advance(1);
        }
        if w.xgather {
            if adjacent {
                // SAFETY: source row k < n is element k of rows r0 .. r0 + cnt, side by side
                // from offs[0] + k*xs: inside x's extent, not written (x and y do not overlap).
                unsafe { transpose_into(xp.wrapping_offset(offs[0].0), xs, n, cnt, &mut xbuf, n) };
            } else if xs == -1 {
                for (i, &(xo, _)) in offs[..cnt].iter().enumerate() {
                    // SAFETY: row r0 + i of x: n contiguous elements ending at its first one
                    // (stride -1), inside its extent, not written.
                    let row = unsafe { std::slice::from_raw_parts(xp.wrapping_offset(xo + 1 - n as isize), n) };
                    reverse_into(row, &mut xbuf[i * n..(i + 1) * n]);
                }
            } else {
                for (i, &(xo, _)) in offs[..cnt].iter().enumerate() {
                    for j in 0..n {
                        // SAFETY: element j of row r0+i of x: inside its extent, not written
                        // (x and y do not overlap).
                        xbuf[i * n + j] = unsafe { *xp.wrapping_offset(xo + j as isize * xs) };
                    }
                }
            }
        }
        for i in 0..cnt {
            let (xo, yo) = offs[i];
            // Contiguous rows with gaps between them (a sliced input): the next row is
            // prefetched while this one is computed (the hardware prefetcher stops at gaps).
            if !w.xgather && xlen > 1 && r0 + i + 1 < hi {
                let next = if i + 1 < cnt { Some(offs[i + 1].0) } else { cur.peek_x() };
                if let Some(nxo) = next.filter(|&nxo| nxo != xo + xlen as isize) {
                    prefetch_lines::<1>(xp.wrapping_offset(nxo + shift).cast(), (xlen * size_of::<T>()).min(ROW_PREFETCH));
                }
            }
            let xrow: &[T] = if xlen == 0 {
                &[]
            } else if w.xgather {
                &xbuf[i * n..(i + 1) * n]
            } else {
                // SAFETY: row r0+i of x is xlen contiguous elements from its lowest one (stride
                // 1, or -1 and `shift` steps back to the lowest, or xlen <= 1) inside its
                // extent; nobody writes them (no overlap with y).
                unsafe { std::slice::from_raw_parts(xp.wrapping_offset(xo + shift), xlen) }
            };
            let yrow_p = yp.wrapping_offset(yo);
            if ystage {
                k.row(simd, xrow, n, &mut ybuf[..ylen], &mut scratch);
                if ys == -1 {
                    // SAFETY: row r0+i of y: ylen contiguous elements ending at its first one
                    // (stride -1), writable, exclusive; rows are disjoint.
                    let yrow = unsafe { std::slice::from_raw_parts_mut(yrow_p.wrapping_offset(1 - ylen as isize), ylen) };
                    reverse_into(&ybuf[..ylen], yrow);
                } else {
                    for (j, &v) in ybuf[..ylen].iter().enumerate() {
                        // SAFETY: element j of row r0+i of y: writable, exclusive; rows are disjoint.
                        unsafe { *yrow_p.offset(j as isize * ys) = v };
                    }
                }
            } else {
                // SAFETY: row r0+i of y: ylen contiguous elements (stride 1 or one element),
                // writable, exclusive; different rows are disjoint (y is non-overlapping).
                let yrow = unsafe { std::slice::from_raw_parts_mut(yrow_p, ylen) };
                k.row(simd, xrow, n, yrow, &mut scratch);
            }
        }
        r0 += cnt;
    }
}

/// `k.row(x_row, n, y_row, scratch)` for every last-dim row of `x` (shape
/// `[..B, N]`) and the matching row of `y`: `y` has shape `[..B, N]` (`y_row`
/// has N elements) or `[..B]` (`y_row` is one element). Rows are slices when
/// their stride is 1, gathered into (or staged in and scattered from)
/// per-thread buffers otherwise: a block of adjacent rows of a transposed input
/// (innermost batch dim of stride 1) is moved with register transposes, each
/// cache line read once; rows of stride -1 with vector reversals. For an
/// kernel with [`RowKernel::cols_full`] (softmax), blocks of adjacent rows of a
/// transposed input whose output rows are adjacent too (an output in the
/// input's memory order) go to it whole. For an
/// order-free kernel ([`RowKernel::ORDER_FREE`]: sum, mean), a row of stride 0
/// is passed as its one element and a row of stride -1 as the slice in memory
/// order (`n` is always the row's length); and when `y` is `[..B]`, blocks of
/// adjacent rows of a transposed input go to [`RowKernel::cols`] instead, as
/// [`Cols`]. `scratch` is a per-thread buffer of `scratch_len` elements for the
/// kernel. Rows run in parallel above [`PAR_MIN`] elements. `x` and `y` must not
/// overlap. Rows of length 0 are still visited (with empty slices).
pub fn map_rows<T: Element + Default, U: Element + Default, K: RowKernel<T, U>>(
    x: &TensorView<'_>,
    y: &mut TensorViewMut<'_>,
    scratch_len: usize,
    k: &K,
) -> Result<()> {
    x.check_typed::<T>("row kernel")?;
    y.check_typed::<U>("row kernel")?;
    let nd = x.ndim();
    let (bshape, n) = match x.shape().split_last() {
        Some((&n, b)) => (b, n as usize),
        None => (&[][..], 1),
    };
    let full = nd > 0 && y.shape() == x.shape();
    let ylen = if full { n } else { 1 };
    if !full && y.shape() != bshape {
        return Err(Error::Shape(format!("rows: output shape {:?} for input {:?}", y.shape(), x.shape())));
    }
    let rows = y.numel() / ylen.max(1);
    if rows == 0 || (y.numel() == 0) {
        return Ok(());
    }
    let (xptr, yptr) = (x.data_ptr() as usize, y.data_ptr_mut() as usize);
    let (xe, ye) = (x.extent(), y.as_view().extent());
    if x.numel() > 0 && overlap(byte_range(xptr, xe.byte_lo, xe.byte_hi), byte_range(yptr, ye.byte_lo, ye.byte_hi)) {
        return Err(Error::InvalidArgument("rows: the output overlaps the input".into()));
    }
    let xs = if nd == 0 { 1 } else { x.strides()[nd - 1] as isize };
    let ys = if full { y.strides()[nd - 1] as isize } else { 1 };
    // Batch dims (outermost first) with both operands' strides.
    let ystrides = y.strides();
    let bdims: SmallVec<[(usize, isize, isize); 8]> =
        bshape.iter().enumerate().map(|(d, &m)| (m as usize, x.strides()[d] as isize, ystrides[d] as isize)).collect();
    let order_free = K::ORDER_FREE;
    let constant = order_free && xs == 0 && n > 1;
    let reversed = order_free && xs == -1 && n > 1;
    let xgather = xs != 1 && n > 1 && !constant && !reversed;
    // Consecutive rows adjacent in x (innermost batch dim of stride 1): a transposed input.
    let (m_in, sy_in) = match bdims.last() {
        Some(&(m, 1, sy)) if xgather && m > 1 => (m, sy),
        _ => (1, 0),
    };
    let vertical = m_in > 1 && !full && order_free;
    // A transposed input whose output is transposed alike (it follows the input):
    // blocks of rows (1 MiB of scratch elements: 256 rows of 1024 f32, which
    // measured fastest beside 64 and 512) go to `cols_full`, each run read and
    // written whole; rows too long for 8 per block do not.
    let full_rows = (1usize << 20) / (n * size_of::<K::S>()).max(1);
    let vertical_full = K::COLS_FULL && m_in > 1 && full && sy_in == 1 && full_rows >= 8;
    // Rows gathered together: a cache line of each element of a transposed input's
    // rows (16 f32 rows), as far as a 256 KiB buffer allows.
    let rb = if vertical_full {
        full_rows.min(COL_BLOCK)
    } else if vertical {
        COL_BLOCK
    } else if xgather {
        let line = if m_in > 1 { (LINE / size_of::<T>()).max(1) } else { 16 };
        line.min((1 << 18) / (n * size_of::<T>()).max(1)).clamp(1, ROW_BLOCK)
    } else {
        ROW_BLOCK
    };
    let scratch_len = if vertical_full { K::cols_full_scratch(n, rb) } else { scratch_len };
    let walk = RowWalk {
        xptr,
        yptr,
        bdims: &bdims,
        n,
        xs,
        ys,
        ylen,
        constant,
        reversed,
        xgather,
        m_in,
        sy_in,
        vertical,
        vertical_full,
        rb,
        scratch_len,
    };
    let arch = pulp::Arch::new();
    let exec = |lo: usize, hi: usize| arch.dispatch(ExecRows { walk: &walk, lo, hi, k, _t: std::marker::PhantomData });
    let work = rows.saturating_mul(n.max(1));
    if work < PAR_MIN || rows < 2 {
        exec(0, rows);
    } else {
        let parts = (crate::threads::budget() * 4).min(rows);
        crate::threads::for_each_part(parts, |p| exec(rows * p / parts, rows * (p + 1) / parts));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector narrowing gives the scalar conversion's bits for every bf16
    /// (the upper half) with low halves around each rounding case (ties, odd and
    /// even, NaN payloads, subnormals), at lengths that leave a tail, and for
    /// blocks where one subnormal sits among normal values.
    #[test]
    fn narrow_bf16_matches_the_scalar_conversion() {
        use crate::convert::f32_to_bf16;
        use dlbridge_core::half::bf16;
        let Some(narrow) = narrow_bf16_fn() else {
            eprintln!("skipped: this CPU has no AVX512-BF16, so narrow_bf16_fn() is None and nothing uses it");
            return;
        };
        let lows = [0u32, 1, 0x7fff, 0x8000, 0x8001, 0xc000, 0xffff, 0x1234];
        let src: Vec<f32> = (0..1u32 << 16).flat_map(|hi| lows.map(|lo| f32::from_bits(hi << 16 | lo))).collect();
        let bits = |v: &[bf16]| v.iter().map(|b| b.to_bits()).collect::<Vec<_>>();
        let expect: Vec<bf16> = src.iter().map(|&v| f32_to_bf16(v)).collect();
        for len in [src.len(), 1000 * 16 + 7, 15, 1, 0] {
            let mut got = vec![bf16::ZERO; len];
            narrow(&src[..len], &mut got);
            assert_eq!(bits(&got), bits(&expect[..len]), "length {len}");
        }
        // One subnormal among normal values, at each position of a block of 16.
        for at in 0..16 {
            let mut block = [1.5f32; 16];
            block[at] = f32::from_bits(0x0001_8000);
            let mut got = [bf16::ZERO; 16];
            narrow(&block, &mut got);
            let want: Vec<bf16> = block.iter().map(|&v| f32_to_bf16(v)).collect();
            assert_eq!(bits(&got), bits(&want), "subnormal at {at}");
            assert_eq!(got[at].to_bits(), 0x0002, "the subnormal is kept (the instruction alone flushes it to zero)");
        }
    }

    /// `peek(k)` is where `k` steps of `advance` land, while they stay on one
    /// outer index (the runs of the two innermost axes), and None past it.
    #[test]
    fn peek_agrees_with_advance() {
        // (shape, output strides, input strides): contiguous, sliced rows, a
        // broadcast row, a transposed (tiled) input, and a 3-d sliced case.
        let cases: [(&[i64], &[i64], &[i64]); 5] = [
            (&[6, 5], &[5, 1], &[5, 1]),
            (&[7, 3000], &[3000, 1], &[4096, 1]),
            (&[9, 2100], &[2100, 1], &[0, 1]),
            (&[300, 40], &[40, 1], &[1, 300]),
            (&[3, 4, 1500], &[6000, 1500, 1], &[20000, 3000, 1]),
        ];
        for (shape, so, si) in cases {
            let mut plan = Plan::empty(2);
            assert!(plan.fill(shape, &[so, si]));
            let [(n0, _), (n1, _)] = plan.axes();
            let per_outer = n0 * n1;
            for r in 0..plan.runs() {
                let cur = Cursor::new(&plan, r);
                for k in 1..=3 {
                    let expect = (r % per_outer + k < per_outer && r + k < plan.runs()).then(|| Cursor::new(&plan, r + k).off);
                    assert_eq!(cur.peek(k), expect, "shape {shape:?}, run {r}, {k} ahead");
                }
            }
        }
    }
}
