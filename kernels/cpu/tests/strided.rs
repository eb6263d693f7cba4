//! The strided paths against a naive reference: random shapes, and for every
//! operand a random layout (dims permuted in memory, steps of either sign,
//! zero-stride broadcast dims for inputs, an offset), for each kernel and dtype.
//! Plus the in-place case (the output exactly an input).

use dlbridge_core::half::bf16;
use dlbridge_core::{DType, Device, Element, Flags, TensorView, TensorViewMut};
use dlbridge_registry::{Arg, Registry};
use proptest::prelude::*;

/// One operand's memory and layout over a logical shape.
#[derive(Debug, Clone)]
struct Layout {
    strides: Vec<i64>,
    offset: usize,
    len: usize,
}

impl Layout {
    /// `perm` orders dims in memory (last = fastest); `steps[d]` in {-2,-1,1,2}, 0 = broadcast.
    fn new(shape: &[i64], perm: &[usize], steps: &[i64]) -> Layout {
        let nd = shape.len();
        let mut strides = vec![0i64; nd];
        let mut acc = 1i64;
        for &d in perm.iter().rev() {
            let extent = if steps[d] == 0 || shape[d] == 0 { 1 } else { (shape[d] - 1) * steps[d].abs() + 1 };
            strides[d] = acc * steps[d];
            acc *= extent.max(1);
        }
        let offset: i64 = (0..nd).filter(|&d| strides[d] < 0 && shape[d] > 0).map(|d| (shape[d] - 1) * -strides[d]).sum();
        let len = if shape.contains(&0) { 0 } else { acc as usize };
        Layout { strides, offset: if len == 0 { 0 } else { offset as usize }, len }
    }
    /// Memory index of each logical element, in row-major order.
    fn indices(&self, shape: &[i64]) -> Vec<usize> {
        let n: i64 = shape.iter().product();
        let mut out = Vec::with_capacity(n as usize);
        for mut lin in 0..n {
            let mut off = self.offset as i64;
            for d in (0..shape.len()).rev() {
                off += (lin % shape[d]) * self.strides[d];
                lin /= shape[d];
            }
            out.push(off as usize);
        }
        out
    }
}

fn layout_strategy(shape: Vec<i64>, broadcast: bool) -> impl Strategy<Value = Layout> {
    let nd = shape.len();
    let step = if broadcast {
        prop_oneof![Just(-2i64), Just(-1), Just(1), Just(1), Just(2), Just(0)].boxed()
    } else {
        prop_oneof![Just(-2i64), Just(-1), Just(1), Just(1), Just(2)].boxed()
    };
    (Just((0..nd).collect::<Vec<usize>>()).prop_shuffle(), proptest::collection::vec(step, nd))
        .prop_map(move |(perm, steps)| Layout::new(&shape, &perm, &steps))
}

fn shape_strategy(min_nd: usize) -> impl Strategy<Value = Vec<i64>> {
    proptest::collection::vec(prop_oneof![Just(0i64), 1i64..4, 1i64..40], min_nd..4)
}

use dlbridge_core::testing::values;

/// Element conversions for the test's dtypes (the reference side uses `half`'s own).
trait TestElem: Element + Default + PartialEq + std::fmt::Debug {
    fn of(x: f32) -> Self;
    fn f(self) -> f64;
    /// Relative tolerance of one rounding in this type.
    const EPS: f64;
}
impl TestElem for f32 {
    fn of(x: f32) -> f32 {
        x
    }
    fn f(self) -> f64 {
        self as f64
    }
    const EPS: f64 = 1.2e-7;
}
impl TestElem for f64 {
    fn of(x: f32) -> f64 {
        x as f64
    }
    fn f(self) -> f64 {
        self
    }
    const EPS: f64 = 2.3e-16;
}
impl TestElem for bf16 {
    fn of(x: f32) -> bf16 {
        bf16::from_f32(x)
    }
    fn f(self) -> f64 {
        self.to_f64()
    }
    const EPS: f64 = 7.9e-3;
}
impl TestElem for i32 {
    fn of(x: f32) -> i32 {
        (x * 100.0) as i32
    }
    fn f(self) -> f64 {
        self as f64
    }
    const EPS: f64 = 0.0;
}

fn call<'a>(name: &str, args: &mut [Arg<'a>], out: TensorViewMut<'a>) {
    dlbridge_cpu::link();
    Registry::global().get(name).unwrap().call(args, &mut [out]).unwrap();
}

fn close(got: f64, want: f64, rel: f64, abs: f64, what: &str) {
    let ok = (got.is_nan() && want.is_nan()) || (got - want).abs() <= rel * want.abs() + abs;
    assert!(ok, "{what}: got {got}, want {want}");
}

fn gelu_ref(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

/// Elementwise kernels on random layouts of each operand (the output too).
fn check_elementwise<T: TestElem>(shape: &[i64], la: &Layout, lb: &Layout, lo: &Layout, seed: u64) {
    let a: Vec<T> = values(la.len, seed).into_iter().map(T::of).collect();
    let b: Vec<T> = values(lb.len, seed ^ 0x9e37).into_iter().map(T::of).collect();
    let (ia, ib, io) = (la.indices(shape), lb.indices(shape), lo.indices(shape));
    let va = TensorView::from_slice_strided(&a, shape, Some(&la.strides), la.offset).unwrap();
    let vb = TensorView::from_slice_strided(&b, shape, Some(&lb.strides), lb.offset).unwrap();
    let floats = T::EPS > 0.0;
    let ops: &[&str] = if floats { &["add", "sub", "mul", "maximum", "relu", "gelu"] } else { &["add", "mul", "relu"] };
    for &name in ops {
        let mut o = vec![T::default(); lo.len];
        let out = TensorViewMut::from_slice_strided_mut(&mut o, shape, Some(&lo.strides), lo.offset).unwrap();
        let unary = matches!(name, "relu" | "gelu");
        let mut args = if unary { vec![Arg::Tensor(va.clone())] } else { vec![Arg::Tensor(va.clone()), Arg::Tensor(vb.clone())] };
        call(name, &mut args, out);
        for k in 0..ia.len() {
            let (x, y, got) = (a[ia[k]], b[ib[k]], o[io[k]]);
            let want = match name {
                "add" => x.f() + y.f(),
                "sub" => x.f() - y.f(),
                "mul" => x.f() * y.f(),
                "maximum" => x.f().max(y.f()),
                "relu" => x.f().max(0.0),
                _ => gelu_ref(x.f()),
            };
            let (rel, abs) = if name == "gelu" { (T::EPS.max(1e-5), 2e-6) } else { (T::EPS, 0.0) };
            if T::EPS == 0.0 && name != "relu" {
                // Integers wrap.
                let w = if name == "add" { (x.f() as i32).wrapping_add(y.f() as i32) } else { (x.f() as i32).wrapping_mul(y.f() as i32) };
                assert_eq!(got.f() as i32, w, "{name} at {k}");
            } else {
                close(got.f(), want, rel, abs, &format!("{name} at {k} of {shape:?} a {la:?} b {lb:?} out {lo:?}"));
            }
        }
    }
}

/// sum, mean, softmax over the last dim on random input and output layouts.
fn check_rows<T: TestElem>(shape: &[i64], lx: &Layout, lo: &Layout, lr: &Layout, seed: u64) {
    let x: Vec<T> = values(lx.len, seed).into_iter().map(T::of).collect();
    let ix = lx.indices(shape);
    let vx = TensorView::from_slice_strided(&x, shape, Some(&lx.strides), lx.offset).unwrap();
    let n = *shape.last().unwrap() as usize;
    let rows: Vec<&[usize]> = if n == 0 { vec![] } else { ix.chunks(n).collect() };
    let bshape = &shape[..shape.len() - 1];
    let floats = T::EPS > 0.0;
    for name in ["sum", "mean"] {
        if name == "mean" && !floats {
            continue;
        }
        let mut o = vec![T::default(); lr.len];
        let out = TensorViewMut::from_slice_strided_mut(&mut o, bshape, Some(&lr.strides), lr.offset).unwrap();
        call(name, &mut [Arg::Tensor(vx.clone())], out);
        let ir = lr.indices(bshape);
        for (r, row) in rows.iter().enumerate() {
            let s: f64 = row.iter().map(|&i| x[i].f()).sum();
            let want = if name == "mean" { s / n as f64 } else { s };
            let mag: f64 = row.iter().map(|&i| x[i].f().abs()).sum::<f64>() / if name == "mean" { n as f64 } else { 1.0 };
            close(o[ir[r]].f(), want, T::EPS, 1e-6 * mag + T::EPS * mag, &format!("{name} row {r} of {shape:?} x {lx:?}"));
        }
    }
    if !floats {
        return;
    }
    let mut o = vec![T::default(); lo.len];
    let out = TensorViewMut::from_slice_strided_mut(&mut o, shape, Some(&lo.strides), lo.offset).unwrap();
    call("softmax", &mut [Arg::Tensor(vx.clone())], out);
    let io = lo.indices(shape);
    for (r, row) in rows.iter().enumerate() {
        let m = row.iter().map(|&i| x[i].f()).fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = row.iter().map(|&i| (x[i].f() - m).exp()).sum();
        for (k, &i) in row.iter().enumerate() {
            let want = (x[i].f() - m).exp() / z;
            close(o[io[r * n + k]].f(), want, 4.0 * T::EPS.max(1e-6), 1e-7, &format!("softmax row {r} elem {k} of {shape:?}"));
        }
    }
}

fn elementwise_case() -> impl Strategy<Value = (Vec<i64>, Layout, Layout, Layout, u64)> {
    shape_strategy(0).prop_flat_map(|shape| {
        (
            Just(shape.clone()),
            layout_strategy(shape.clone(), true),
            layout_strategy(shape.clone(), true),
            layout_strategy(shape, false),
            any::<u64>(),
        )
    })
}

fn rows_case() -> impl Strategy<Value = (Vec<i64>, Layout, Layout, Layout, u64)> {
    shape_strategy(1).prop_flat_map(|shape| {
        let b = shape[..shape.len() - 1].to_vec();
        (Just(shape.clone()), layout_strategy(shape.clone(), true), layout_strategy(shape, false), layout_strategy(b, false), any::<u64>())
    })
}

/// `check::<T>(args)` for each element type the layout tests cover: one of
/// each family (f32, bf16 through f32, f64, wrapping i32).
macro_rules! each_dtype {
    ($check:ident($($arg:expr),*)) => {
        $check::<f32>($($arg),*);
        $check::<bf16>($($arg),*);
        $check::<f64>($($arg),*);
        $check::<i32>($($arg),*);
    };
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn elementwise_kernels_match_the_naive_reference_on_any_layout((shape, la, lb, lo, seed) in elementwise_case()) {
        each_dtype!(check_elementwise(&shape, &la, &lb, &lo, seed));
    }

    #[test]
    fn last_dim_reductions_match_the_naive_reference_on_any_layout((shape, lx, lo, lr, seed) in rows_case()) {
        each_dtype!(check_rows(&shape, &lx, &lo, &lr, seed));
    }
}

/// Large enough to take the tiled and the multi-threaded paths.
#[test]
fn large_transposed_broadcast_and_flipped_operands_match_the_reference() {
    let shape = [300i64, 700];
    for (sa, sb) in [(vec![1i64, 300], vec![0i64, 1]), (vec![-700i64, -1], vec![1, 300]), (vec![1400, 2], vec![0, 0])] {
        let la = Layout::new(&shape, &[1, 0], &[1, 1]);
        let la = if sa == vec![1, 300] { la } else { Layout::new(&shape, &[0, 1], &[sa[0].signum() * (sa[0].abs() / 700).max(1), sa[1]]) };
        let lb = if sb == vec![0, 0] {
            Layout::new(&shape, &[0, 1], &[0, 0])
        } else if sb == vec![0, 1] {
            Layout::new(&shape, &[0, 1], &[0, 1])
        } else {
            Layout::new(&shape, &[1, 0], &[1, 1])
        };
        let lo = Layout::new(&shape, &[0, 1], &[1, 1]);
        check_elementwise::<f32>(&shape, &la, &lb, &lo, 7);
        check_elementwise::<bf16>(&shape, &la, &lb, &lo, 8);
        let lr = Layout::new(&shape[..1], &[0], &[1]);
        check_rows::<f32>(&shape, &la, &lo, &lr, 9);
        check_rows::<bf16>(&shape, &lb, &lo, &lr, 10);
    }
}

#[test]
#[allow(unsafe_code)]
fn an_output_that_is_exactly_an_input_is_computed_in_place_on_any_layout() {
    let shape = [50i64, 60];
    for (perm, steps) in [([0usize, 1], [1i64, 1]), ([1, 0], [1, 1]), ([0, 1], [-1, 2]), ([1, 0], [2, -1])] {
        let l = Layout::new(&shape, &perm, &steps);
        let idx = l.indices(&shape);
        let b: Vec<f32> = values(3000, 3);
        let vb = TensorView::from_slice(&b, &shape).unwrap();
        for (name, first) in [("add", true), ("sub", false), ("gelu", true)] {
            let mut a: Vec<f32> = values(l.len, 5);
            let before = a.clone();
            let p = a.as_mut_ptr();
            // SAFETY: the layout's elements lie in `a` (Layout::new sized it), which nothing
            // else touches until the views are gone; the view is validated here.
            let va = unsafe {
                TensorView::from_raw_parts(
                    p.cast(),
                    (l.offset * 4) as u64,
                    &shape,
                    Some(&l.strides),
                    DType::F32,
                    Device::CPU,
                    Flags::empty(),
                )
            }
            .unwrap();
            // SAFETY: the only other user of this memory is `va`, the one alias the registry
            // allows (output == input); the kernel computes in place.
            let out = unsafe { TensorViewMut::from_view(va.clone()) }.unwrap();
            let mut args = if name == "gelu" {
                vec![Arg::Tensor(va.clone())]
            } else if first {
                vec![Arg::Tensor(va.clone()), Arg::Tensor(vb.clone())]
            } else {
                vec![Arg::Tensor(vb.clone()), Arg::Tensor(va.clone())]
            };
            call(name, &mut args, out);
            drop((args, va));
            let a2 = &a;
            for (k, &i) in idx.iter().enumerate() {
                let (x, y) = (before[i] as f64, b[k] as f64);
                let want = match name {
                    "add" => x + y,
                    "sub" => y - x,
                    _ => gelu_ref(x),
                };
                close(a2[i] as f64, want, 1.2e-7, 2e-6, &format!("{name} in place, element {k}, layout {l:?}"));
            }
        }
    }
}

/// A layout with `extra` unused elements before its first one (to move its alignment).
fn shifted(l: Layout, extra: usize) -> Layout {
    Layout { strides: l.strides, offset: l.offset + extra, len: l.len + extra }
}

/// Transposed inputs whose rows are adjacent in memory (the innermost batch dim
/// has stride 1): sum and mean add whole blocks of rows at once (full blocks
/// of 1024 rows -- `COL_BLOCK` -- and partial ones, widths that leave rows past
/// the last whole vector, odd numbers of runs after the 32-run chunks, across
/// outer batch dims and thread splits); softmax into a row-major output
/// gathers row blocks with register transposes, and into an output laid out
/// as its input (what the adapters allocate) computes whole blocks of rows
/// across the rows (`cols_full`), but for rows too long for 8 to a block
/// (`[20, 9000]`), which take the gathering path. bf16 at odd and even offsets
/// (the word-pair sums need 4-byte alignment, else take the generic path).
#[test]
fn reductions_over_transposed_inputs_match_the_reference_in_full_and_partial_blocks() {
    // (shape, perm): perm puts the innermost batch dim last in memory (stride 1).
    let cases: [(&[i64], &[usize]); 8] = [
        (&[20, 9000], &[1, 0]),
        (&[2100, 37], &[1, 0]),
        (&[2, 1030, 35], &[0, 2, 1]),
        (&[130, 70], &[1, 0]),
        (&[64, 33], &[1, 0]),
        (&[3, 100, 50], &[0, 2, 1]),
        (&[3, 200, 150], &[0, 2, 1]),
        (&[2, 9, 5, 70], &[0, 1, 3, 2]),
    ];
    for (i, (shape, perm)) in cases.into_iter().enumerate() {
        let ones = vec![1i64; shape.len()];
        let lx = Layout::new(shape, perm, &ones);
        let b = &shape[..shape.len() - 1];
        let lo = Layout::new(shape, &(0..shape.len()).collect::<Vec<_>>(), &ones);
        let lr = Layout::new(b, &(0..b.len()).collect::<Vec<_>>(), &ones[..b.len()]);
        let seed = 40 + i as u64;
        check_rows::<f32>(shape, &lx, &lo, &lr, seed);
        check_rows::<f64>(shape, &lx, &lo, &lr, seed);
        check_rows::<i32>(shape, &lx, &lo, &lr, seed);
        check_rows::<bf16>(shape, &lx, &lo, &lr, seed);
        check_rows::<bf16>(shape, &shifted(lx.clone(), 1), &lo, &lr, seed);
        // A strided output of the reduction (every other element, reversed).
        let lr2 = Layout::new(b, &(0..b.len()).collect::<Vec<_>>(), &vec![-2i64; b.len()]);
        check_rows::<f32>(shape, &lx, &lo, &lr2, seed);
        check_rows::<bf16>(shape, &lx, &lo, &lr2, seed);
        // The output laid out as the input (the rows of a block adjacent in both).
        let lxo = Layout::new(shape, perm, &ones);
        check_rows::<f32>(shape, &lx, &lxo, &lr, seed);
        check_rows::<f64>(shape, &lx, &lxo, &lr, seed);
        check_rows::<bf16>(shape, &lx, &lxo, &lr, seed);
        check_rows::<bf16>(shape, &shifted(lx.clone(), 1), &shifted(lxo.clone(), 1), &lr, seed);
    }
}

/// Contiguous rows at every alignment of the row's start and every length
/// around the vector loops' steps: bf16 summed as u32 word pairs (head, words,
/// tail), f32 in eight vector accumulators (full groups, leftover vectors, tail).
#[test]
fn row_sums_match_the_reference_at_every_alignment_and_length() {
    for n in [1i64, 2, 3, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 143, 1023, 1024, 1025, 2049] {
        for extra in 0..4 {
            let shape = [3, n];
            let lx = shifted(Layout::new(&shape, &[0, 1], &[1, 1]), extra);
            let lo = Layout::new(&shape, &[0, 1], &[1, 1]);
            let lr = Layout::new(&shape[..1], &[0], &[1]);
            check_rows::<bf16>(&shape, &lx, &lo, &lr, 60 + n as u64);
            check_rows::<f32>(&shape, &lx, &lo, &lr, 160 + n as u64);
        }
    }
}

/// Rows of stride -1 (and outputs of stride -1): softmax reverses them with
/// vector permutes, sum and mean read them in memory order.
#[test]
fn reversed_rows_match_the_reference() {
    for shape in [[5i64, 1000], [70, 33], [3, 7]] {
        let lx = Layout::new(&shape, &[0, 1], &[1, -1]);
        let lo = Layout::new(&shape, &[0, 1], &[-1, -1]);
        let lr = Layout::new(&shape[..1], &[0], &[-1]);
        check_rows::<f32>(&shape, &lx, &lo, &lr, 70);
        check_rows::<bf16>(&shape, &lx, &lo, &lr, 71);
        check_rows::<f64>(&shape, &lx, &lo, &lr, 72);
    }
}

/// Long contiguous runs with gaps between them (sliced operands): computed
/// piece by piece while the next run is prefetched; rows of the reductions
/// likewise. Also runs longer than one block, and the last run of a thread.
#[test]
fn sliced_operands_with_long_rows_match_the_reference() {
    for shape in [[6i64, 3000], [40, 700], [2, 20000], [300, 257]] {
        // Every other row (step 2 on dim 0): rows of stride 1 with gaps.
        let la = Layout::new(&shape, &[0, 1], &[2, 1]);
        let lb = Layout::new(&shape, &[0, 1], &[1, 1]);
        let lb0 = Layout::new(&shape, &[0, 1], &[0, 1]);
        let lo = Layout::new(&shape, &[0, 1], &[3, 1]);
        check_elementwise::<f32>(&shape, &la, &lb, &lo, 80);
        check_elementwise::<bf16>(&shape, &la, &lb0, &lo, 81);
        check_elementwise::<i32>(&shape, &lb0, &la, &lo, 82);
        let lr = Layout::new(&shape[..1], &[0], &[1]);
        check_rows::<f32>(&shape, &la, &lo, &lr, 83);
        check_rows::<bf16>(&shape, &la, &lo, &lr, 84);
    }
}

/// Transposed inputs of every element size (2, 4 and 8 bytes) in tiles with
/// ragged edges (shapes that are not multiples of the 8x8 / 4x4 register
/// blocks), a transposed input that is also reversed along its contiguous dim
/// (its tile is filled element by element), and a transposed output.
#[test]
fn tiles_of_transposed_operands_of_every_element_size_match_the_reference() {
    for shape in [[37i64, 300], [300, 37], [8, 8], [9, 1000], [1000, 3]] {
        let t = Layout::new(&shape, &[1, 0], &[1, 1]);
        let t_rev = Layout::new(&shape, &[1, 0], &[-1, 1]);
        let c = Layout::new(&shape, &[0, 1], &[1, 1]);
        check_elementwise::<f32>(&shape, &t, &c, &c, 90);
        check_elementwise::<bf16>(&shape, &t, &t, &c, 91);
        check_elementwise::<f64>(&shape, &c, &t, &c, 92);
        check_elementwise::<i32>(&shape, &t_rev, &t, &c, 93);
        check_elementwise::<f32>(&shape, &t_rev, &c, &c, 94);
        check_elementwise::<f32>(&shape, &c, &c, &t, 95);
        check_elementwise::<bf16>(&shape, &shifted(t.clone(), 1), &c, &shifted(t.clone(), 3), 96);
    }
}

/// Runs longer than one block of the innermost dim, several outer dims and
/// every kind of operand at once (the run cursor's carries).
#[test]
fn many_dims_and_split_blocks_match_the_reference() {
    let shape = [3i64, 2, 5, 20000];
    let n = shape.len();
    let c = Layout::new(&shape, &(0..n).collect::<Vec<_>>(), &[1, 1, 1, 1]);
    let b = Layout::new(&shape, &(0..n).collect::<Vec<_>>(), &[0, 1, 0, 1]);
    let s = Layout::new(&shape, &[2, 0, 1, 3], &[1, 2, 1, 1]);
    let o = Layout::new(&shape, &[1, 0, 2, 3], &[1, 1, 1, 1]);
    check_elementwise::<f32>(&shape, &c, &b, &o, 100);
    check_elementwise::<bf16>(&shape, &s, &b, &c, 101);
    check_elementwise::<f64>(&shape, &s, &c, &o, 102);
}
