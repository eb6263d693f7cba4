//! Strided iteration over validated views, as NumPy's nditer and torch's
//! TensorIterator do it: the engine of the elementwise kernels ([`zip_map`])
//! and the row access of the last-dim reductions ([`map_rows`]).
//!
//! A plan is built in safe integer arithmetic first: size-1 dims are dropped,
//! dims where the output's stride is negative are flipped for every operand
//! (elementwise work does not care about order), dims are sorted by the
//! output's strides (so the output, and any operand laid out like it, is walked
//! in memory order), and neighbours that are contiguous with respect to each
//! other in every operand are merged. When an input is transposed with
//! respect to the output (its unit stride sits on another dim), that dim is
//! moved next to the innermost one and the innermost dim is cut into tiles, so
//! the transposed reads stay in cache. The kernel then sees runs: the output
//! as a `&mut [T]` and every input as a [`Src`]: a slice (inner stride 1), a
//! scalar (inner stride 0), the output itself (an exactly aliased input), or a
//! slice gathered into a small buffer (any other stride, negative included).
//! Runs are split across rayon above [`PAR_MIN`] elements.
//!
//! Invariants: every view here was validated by dlbridge-core (its layout's
//! logical elements all lie in its extent of host memory, readable for the
//! view's lifetime; a `TensorViewMut` is writable, exclusively held and
//! non-overlapping), and the typed accessors (`iter::<T>` / `iter_mut::<T>`)
//! are called first, so dtype, host memory and alignment are checked. An input
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
use rayon::prelude::*;
use smallvec::SmallVec;

/// Below this many elements a kernel runs on the calling thread.
pub const PAR_MIN: usize = 1 << 16;
/// Longest run when nothing needs gathering (elements).
const CHUNK: usize = 1 << 14;
/// Longest run when something is gathered or tiled (the gather buffers' length).
const BUF: usize = 256;
/// Run length along the innermost dim when an input is transposed: its reads
/// touch one page per element, so a run must stay within the L1 TLB.
const TILE: usize = 64;
/// Runs (along dims[1]) read together as one tile of a transposed input.
const TILE_ROWS: usize = 16;
/// At most this many operands (the output and three inputs).
const MAX_OPS: usize = 4;

/// Where a kernel reads one input over a run.
#[derive(Debug)]
pub enum Src<'s, T> {
    /// The run's elements, as many as the output slice has.
    Slice(&'s [T]),
    /// The same element for the whole run (a broadcast, zero-stride input).
    Scalar(T),
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
    /// stride is on dims[1]): dims[0] is cut into tiles of [`TILE`].
    tiled: bool,
}

impl Plan {
    fn new(shape: &[i64], strides: &[&[i64]]) -> Option<Plan> {
        let k = strides.len();
        if shape.contains(&0) {
            return None;
        }
        let mut base = [0isize; MAX_OPS];
        let mut dims: SmallVec<[Dim; 8]> = SmallVec::new();
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
        let mut merged: SmallVec<[Dim; 8]> = SmallVec::new();
        for d in dims {
            match merged.last_mut() {
                Some(m) if (0..k).all(|op| d.s[op] == m.s[op] * m.n as isize) => m.n *= d.n,
                _ => merged.push(d),
            }
        }
        let mut dims = merged;
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
        Some(Plan { k, base, dims, block, tiled: transposed.is_some() })
    }

    fn blocks0(&self) -> usize {
        self.dims[0].n.div_ceil(self.block)
    }

    /// Number of runs: blocks of dims[0] x every outer index.
    fn runs(&self) -> usize {
        self.blocks0() * self.dims[1..].iter().map(|d| d.n).product::<usize>()
    }

    /// Element offsets of run `r`'s first element in every operand, and its length.
    /// Order: dims[1] fastest (so tiles of a transposed operand are reused), then
    /// the block of dims[0], then dims[2..].
    fn run(&self, r: usize) -> ([isize; MAX_OPS], usize) {
        let mut off = self.base;
        let mut rest = r;
        let (n1, nb) = (self.dims[1].n, self.blocks0());
        let j = rest % n1;
        rest /= n1;
        let b = rest % nb;
        rest /= nb;
        for op in 0..self.k {
            off[op] += (b * self.block) as isize * self.dims[0].s[op] + j as isize * self.dims[1].s[op];
        }
        for d in &self.dims[2..] {
            let i = rest % d.n;
            rest /= d.n;
            for op in 0..self.k {
                off[op] += i as isize * d.s[op];
            }
        }
        (off, self.block.min(self.dims[0].n - b * self.block))
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
        let src = unsafe { std::slice::from_raw_parts(p.offset(1 - len as isize), len) };
        for (o, &v) in buf.iter_mut().zip(src.iter().rev()) {
            *o = v;
        }
    } else {
        for (i, o) in buf.iter_mut().enumerate() {
            // SAFETY: p + i*s for i < len is readable (caller contract).
            *o = unsafe { *p.offset(i as isize * s) };
        }
    }
}

/// `f(out_run, input_runs)` over every element of `out` and the inputs (same
/// shape as `out`, any strides; an input may be exactly `out`). Runs are split
/// across rayon above [`PAR_MIN`] elements.
pub fn zip_map<T: Element + Default, const N: usize>(
    out: &mut TensorViewMut<'_>,
    ins: [&TensorView<'_>; N],
    f: impl Fn(&mut [T], [Src<'_, T>; N]) + Sync,
) -> Result<()> {
    zip_map_impl(out, ins, false, f)
}

/// [`zip_map`] for an update of `out` in place (`out = g(out, inputs)`, as axpy):
/// `f`'s output run holds `out`'s current values, whatever its strides.
pub fn update_map<T: Element + Default, const N: usize>(
    out: &mut TensorViewMut<'_>,
    ins: [&TensorView<'_>; N],
    f: impl Fn(&mut [T], [Src<'_, T>; N]) + Sync,
) -> Result<()> {
    zip_map_impl(out, ins, true, f)
}

/// `reads_out`: the output run must hold the output's values before `f` runs
/// (it always does when the output is contiguous; otherwise it is gathered).
fn zip_map_impl<T: Element + Default, const N: usize>(
    out: &mut TensorViewMut<'_>,
    ins: [&TensorView<'_>; N],
    reads_out: bool,
    f: impl Fn(&mut [T], [Src<'_, T>; N]) + Sync,
) -> Result<()> {
    assert!(N < MAX_OPS, "zip_map takes at most {} inputs", MAX_OPS - 1);
    // Typed checks (dtype, host memory, alignment) before any pointer use.
    out.iter_mut::<T>()?;
    for x in ins {
        x.iter::<T>()?;
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
        if ptr == optr && x.strides() == oview.strides() {
            alias[i + 1] = true;
        } else if overlap(byte_range(ptr, e.byte_lo, e.byte_hi), orange) {
            return Err(Error::InvalidArgument("elementwise: an input overlaps the output without being exactly it".into()));
        }
        ptrs[i + 1] = ptr;
    }
    let mut strides: SmallVec<[&[i64]; MAX_OPS]> = SmallVec::new();
    strides.push(oview.strides());
    strides.extend(ins.iter().map(|x| x.strides()));
    let Some(plan) = Plan::new(out.shape(), &strides) else { return Ok(()) };

    let s0 = plan.dims[0].s;
    let needs_buf: [bool; N] = std::array::from_fn(|i| !alias[i + 1] && s0[i + 1] != 0 && s0[i + 1] != 1);
    let blen = plan.block.min(BUF);
    // Inputs transposed with respect to the output (unit stride on dims[1]) are read
    // as 2-d tiles of TILE_ROWS runs: along their contiguous dim, each cache line once
    // (a run-by-run gather would touch one line per element, all in the same cache set).
    let s1 = plan.dims[1].s;
    let tiled: [bool; N] = std::array::from_fn(|i| needs_buf[i] && plan.tiled && s1[i + 1].unsigned_abs() == 1);
    let n1 = plan.dims[1].n;
    let exec = |lo: usize, hi: usize| {
        let mut obuf: Vec<T> = if s0[0] != 1 { vec![T::default(); blen] } else { Vec::new() };
        let mut bufs: [Vec<T>; N] = std::array::from_fn(|i| {
            let rows = if tiled[i] { TILE_ROWS } else { 1 };
            if needs_buf[i] { vec![T::default(); blen * rows] } else { Vec::new() }
        });
        let (mut tile_row, mut tile_cnt) = (0usize, 0usize);
        for r in lo..hi {
            let (off, len) = plan.run(r);
            let s = &s0;
            let at = |op: usize| (ptrs[op] as *mut T).wrapping_offset(off[op]);
            if plan.tiled {
                if tile_row >= tile_cnt {
                    // Runs r .. r + tile_cnt share their block and outer index: only dims[1] moves.
                    tile_cnt = TILE_ROWS.min(n1 - r % n1).min(hi - r);
                    tile_row = 0;
                    for (i, buf) in bufs.iter_mut().enumerate() {
                        if !tiled[i] {
                            continue;
                        }
                        let (p, sa, sb) = (at(i + 1).cast_const(), s[i + 1], s1[i + 1]);
                        for c in 0..len {
                            for jj in 0..tile_cnt {
                                // SAFETY: element (c, jj) of the tile is element c of run r + jj of
                                // this input (same block and outer index), inside its extent, not
                                // written (the input does not overlap the output).
                                buf[jj * blen + c] = unsafe { *p.offset(c as isize * sa + jj as isize * sb) };
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
                if reads_out || alias[1..=N].iter().any(|&a| a) {
                    // SAFETY: output elements of this run, read before being written.
                    unsafe { gather(at(0).cast_const(), s[0], len, &mut obuf) };
                }
                &mut obuf[..len]
            };
            let mut op = 0;
            let srcs: [Src<'_, T>; N] = bufs.each_mut().map(|buf| {
                op += 1;
                if alias[op] {
                    return Src::Out;
                }
                let p = at(op).cast_const();
                match s[op] {
                    // SAFETY: one element of the input, inside its extent.
                    0 => Src::Scalar(unsafe { *p }),
                    // SAFETY: `len` contiguous input elements inside its extent; the input
                    // does not overlap the output (checked above), so nobody writes them.
                    1 => Src::Slice(unsafe { std::slice::from_raw_parts(p, len) }),
                    _ if tiled[op - 1] => Src::Slice(&buf[(tile_row - 1) * blen..][..len]),
                    st => {
                        // SAFETY: the run's input elements p + j*st (j < len) lie in its extent
                        // and nobody writes them (the input does not overlap the output).
                        unsafe { gather(p, st, len, buf) };
                        Src::Slice(&buf[..len])
                    }
                }
            });
            f(o, srcs);
            if s[0] != 1 {
                for (i, &v) in obuf[..len].iter().enumerate() {
                    // SAFETY: output element i of this run (stride s[0]), writable and exclusive.
                    unsafe { *at(0).offset(i as isize * s[0]) = v };
                }
            }
        }
    };

    let runs = plan.runs();
    if numel < PAR_MIN || runs < 2 {
        exec(0, runs);
    } else {
        let parts = (rayon::current_num_threads() * 4).min(runs);
        (0..parts).into_par_iter().for_each(|p| exec(runs * p / parts, runs * (p + 1) / parts));
    }
    Ok(())
}

/// `f(x_row, n, y_row, scratch)` for every last-dim row of `x` (shape
/// `[..B, N]`) and the matching row of `y`: `y` has shape `[..B, N]` (`y_row`
/// has N elements) or `[..B]` (`y_row` is one element). Rows are slices when
/// their stride is 1, gathered into (or staged in and scattered from)
/// per-thread buffers otherwise. With `order_free` (the kernel's result does not
/// depend on the order of a row's elements: sum, mean), a row of stride 0 is
/// passed as its one element and a row of stride -1 as the slice in memory
/// order (`n` is always the row's length). `scratch` is a
/// per-thread buffer of `scratch_len` elements for the kernel. Rows run in
/// parallel above [`PAR_MIN`] elements. `x` and `y` must not overlap. Rows of
/// length 0 are still visited (with empty slices).
pub fn map_rows<T: Element + Default, U: Element + Default, S: Copy + Default>(
    x: &TensorView<'_>,
    y: &mut TensorViewMut<'_>,
    scratch_len: usize,
    order_free: bool,
    f: impl Fn(&[T], usize, &mut [U], &mut [S]) + Sync,
) -> Result<()> {
    x.iter::<T>()?;
    y.iter_mut::<U>()?;
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
    let offsets = |r: usize| {
        let (mut rest, mut xo, mut yo) = (r, 0isize, 0isize);
        for &(m, sx, sy) in bdims.iter().rev() {
            xo += (rest % m) as isize * sx;
            yo += (rest % m) as isize * sy;
            rest /= m;
        }
        (xo, yo)
    };
    let constant = order_free && xs == 0 && n > 1;
    let reversed = order_free && xs == -1 && n > 1;
    let xgather = xs != 1 && n > 1 && !constant && !reversed;
    // Element offset of a row's lowest element from its first.
    let shift = if reversed { 1 - n as isize } else { 0 };
    let xlen = if constant { 1 } else { n };
    let ystage = ys != 1 && ylen > 1;
    // Rows gathered together: consecutive rows of a transposed input are read as lines.
    let rb = if xgather { (16384 / (n * size_of::<T>()).max(1)).clamp(1, 16) } else { 1 };
    let exec = |lo: usize, hi: usize| {
        let mut xbuf: Vec<T> = if xgather { vec![T::default(); rb * n] } else { Vec::new() };
        let mut ybuf: Vec<U> = if ystage { vec![U::default(); ylen] } else { Vec::new() };
        let mut scratch: Vec<S> = vec![S::default(); scratch_len];
        let mut xoffs = [0isize; 16];
        let mut r0 = lo;
        while r0 < hi {
            let cnt = rb.min(hi - r0);
            if xgather {
                for (i, o) in xoffs[..cnt].iter_mut().enumerate() {
                    *o = offsets(r0 + i).0;
                }
                let p = xptr as *const T;
                for k in 0..n {
                    for i in 0..cnt {
                        // SAFETY: element k of row r0+i of x: inside its extent, not written (x and y
                        // do not overlap).
                        xbuf[i * n + k] = unsafe { *p.wrapping_offset(xoffs[i] + k as isize * xs) };
                    }
                }
            }
            for i in 0..cnt {
                let (xo, yo) = offsets(r0 + i);
                let xrow: &[T] = if xlen == 0 {
                    &[]
                } else if xgather {
                    &xbuf[i * n..(i + 1) * n]
                } else {
                    // SAFETY: row r0+i of x is xlen contiguous elements from its lowest one (stride
                    // 1, or -1 and `shift` steps back to the lowest, or xlen <= 1) inside its
                    // extent; nobody writes them (no overlap with y).
                    unsafe { std::slice::from_raw_parts((xptr as *const T).wrapping_offset(xo + shift), xlen) }
                };
                let yp = (yptr as *mut U).wrapping_offset(yo);
                if ystage {
                    f(xrow, n, &mut ybuf, &mut scratch);
                    for (k, &v) in ybuf.iter().enumerate() {
                        // SAFETY: element k of row r0+i of y: writable, exclusive; rows are disjoint.
                        unsafe { *yp.offset(k as isize * ys) = v };
                    }
                } else {
                    // SAFETY: row r0+i of y: ylen contiguous elements (stride 1 or one element),
                    // writable, exclusive; different rows are disjoint (y is non-overlapping).
                    let yrow = unsafe { std::slice::from_raw_parts_mut(yp, ylen) };
                    f(xrow, n, yrow, &mut scratch);
                }
            }
            r0 += cnt;
        }
    };
    let work = rows.saturating_mul(n.max(1));
    if work < PAR_MIN || rows < 2 {
        exec(0, rows);
    } else {
        let parts = (rayon::current_num_threads() * 4).min(rows);
        (0..parts).into_par_iter().for_each(|p| exec(rows * p / parts, rows * (p + 1) / parts));
    }
    Ok(())
}
