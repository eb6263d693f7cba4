//! Registry call overhead, and kernel throughput on every layout.
//!
//! `cargo bench -p dlbridge-cpu --bench kernels` (filter with a
//! trailing argument: `... -- 'gelu/f32'`). The kernels' thread count follows
//! `DLBRIDGE_NUM_THREADS`: `python/bench/compare_kernels.py` runs this bench at 1 and 2
//! threads beside `python/bench/torch_kernels.py` (torch's medians for the same
//! cases at the same thread count) and prints the ratios, ours/torch and
//! each layout over the contiguous case.
//!
//! Layouts, for an operand of logical shape 4096x1024 (`DLBRIDGE_BENCH_ROWS` rows
//! instead of 4096 when set: the tests' smoke runs take few; the output is laid out
//! as the adapters allocate it: `Kernel::prepare_outputs`' memory order, so an
//! elementwise or softmax output follows its operands, NumPy's `order='K'`; every buffer
//! starts 64-byte aligned, as torch's do):
//! * `contiguous`: row-major;
//! * `transposed`: the `.t()` of a contiguous 1024x4096 (strides `[1, 4096]`);
//! * `into_contiguous` (add, relu, gelu, softmax): the same operands written into a
//!   given row-major output (`out=`): a transpose;
//! * `broadcast`: one 1024-row expanded to 4096 rows (strides `[0, 1]`); for
//!   `add` only the second operand is broadcast (a bias), the first is contiguous;
//! * `sliced`: `base[::2, 256:1280]` of a contiguous 8192x2048 (strides `[4096, 1]`);
//! * `flipped`: `base[::-1, ::-1]` (strides `[-1024, -1]`).
#![forbid(unsafe_code)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use dlbridge_array::Array;
use dlbridge_core::half::bf16;
use dlbridge_core::{DType, Element, TensorView, TensorViewMut};
use dlbridge_cpu::elementwise::map2;
use dlbridge_cpu::num::Num;
use dlbridge_registry::{Arg, Registry};

const C: usize = 1024;

/// The operands' rows: 4096, or `DLBRIDGE_BENCH_ROWS` (the smoke runs of the
/// tests take a few, whose figures are not to be read).
fn rows() -> usize {
    std::env::var("DLBRIDGE_BENCH_ROWS").ok().and_then(|v| v.parse().ok()).filter(|&r| r > 0).unwrap_or(4096)
}

fn overhead(c: &mut Criterion) {
    dlbridge_cpu::link();
    let add = Registry::global().get("add").unwrap();
    let a = Array::from_slice(&[1.0f32], &[1]).unwrap();
    let b = Array::from_slice(&[2.0f32], &[1]).unwrap();
    let mut out = Array::zeros(DType::F32, &[1]).unwrap();
    let mut g = c.benchmark_group("call_overhead_3_tiny_arrays");
    g.bench_function("direct_kernel_fn", |bench| {
        bench.iter(|| {
            let mut o = out.view_mut().unwrap();
            map2::<f32>(&black_box(&a).view(), &black_box(&b).view(), &mut o, f32::add).unwrap();
        })
    });
    g.bench_function("registry_call", |bench| {
        bench.iter(|| {
            add.call(&mut [Arg::Tensor(black_box(&a).view()), Arg::Tensor(black_box(&b).view())], &mut [out.view_mut().unwrap()]).unwrap();
        })
    });
    g.finish();
}

/// Deterministic values in [-4, 4) (so gelu and softmax do real work).
fn values<T: Element>(n: usize, conv: fn(f32) -> T) -> Vec<T> {
    dlbridge_core::testing::values(n, 0x2545_f491_4f6c_dd1d).into_iter().map(conv).collect()
}

/// `n` values in a buffer whose first element (at the returned index) is
/// 64-byte aligned, as torch's and dlbridge's own allocations are (a `Vec` of
/// 16 MiB from the system allocator starts 16 bytes past a page).
fn aligned<T: Element>(n: usize, conv: fn(f32) -> T) -> (Vec<T>, usize) {
    let size = std::mem::size_of::<T>();
    let data = values(n + 64 / size, conv);
    let pad = (64 - data.as_ptr() as usize % 64) % 64 / size;
    (data, pad)
}

/// A 4096x1024 operand's memory and layout.
struct Operand<T> {
    data: Vec<T>,
    strides: [i64; 2],
    offset: usize,
    shape: [i64; 2],
}

impl<T: Element> Operand<T> {
    fn new(layout: &str, conv: fn(f32) -> T) -> Operand<T> {
        let rows = rows();
        let (c, r) = (C as i64, rows as i64);
        let (n, strides, offset) = match layout {
            "contiguous" => (rows * C, [c, 1], 0),
            "transposed" | "into_contiguous" => (rows * C, [1, r], 0),
            "broadcast" => (C, [0, 1], 0),
            "sliced" => (4 * rows * C, [4 * c, 1], 256),
            "flipped" => (rows * C, [-c, -1], rows * C - 1),
            _ => unreachable!("{layout}"),
        };
        let (data, pad) = aligned(n, conv);
        Operand { data, strides, offset: offset + pad, shape: [r, c] }
    }
    fn view(&self) -> TensorView<'_> {
        TensorView::from_slice_strided(&self.data, &self.shape, Some(&self.strides), self.offset).unwrap()
    }
}

const LAYOUTS: [&str; 6] = ["contiguous", "transposed", "into_contiguous", "broadcast", "sliced", "flipped"];

fn bench_dtype<T: Element>(c: &mut Criterion, dtype: &str, conv: fn(f32) -> T) {
    dlbridge_cpu::link();
    let reg = Registry::global();
    let r = rows();
    let (shape, row_shape) = ([r as i64, C as i64], [r as i64]);
    let (mut out, out_at) = aligned(r * C, conv);
    let (mut rows, rows_at) = aligned(r, conv);
    for name in ["add", "relu", "gelu", "softmax", "sum", "mean"] {
        let k = reg.get(name).unwrap();
        let mut g = c.benchmark_group(format!("{name}/{dtype}"));
        g.throughput(Throughput::Elements((r * C) as u64));
        // Kernels whose output follows the input's layout (the rest are row-major).
        let follows = matches!(name, "add" | "relu" | "gelu" | "softmax");
        for layout in LAYOUTS {
            if layout == "into_contiguous" && !follows {
                continue; // the same as `transposed`: these outputs are row-major anyway
            }
            let x = Operand::new(layout, conv);
            // add: both operands in the layout, except `broadcast` (a contiguous
            // matrix plus a broadcast bias row).
            let a = if name == "add" && layout == "broadcast" { Some(Operand::new("contiguous", conv)) } else { None };
            let reduces = matches!(name, "sum" | "mean");
            let args = || match &a {
                Some(a) => vec![Arg::Tensor(a.view()), Arg::Tensor(x.view())],
                None if name == "add" => vec![Arg::Tensor(x.view()), Arg::Tensor(x.view())],
                None => vec![Arg::Tensor(x.view())],
            };
            // The output's strides: what an adapter would allocate, or row-major when given.
            let spec = k.prepare_outputs(&args()).unwrap().remove(0);
            let strides = if layout == "into_contiguous" { vec![C as i64, 1] } else { spec.strides().to_vec() };
            g.bench_function(layout, |bench| {
                bench.iter(|| {
                    let mut args = args();
                    let o = if reduces {
                        TensorViewMut::from_slice_mut(&mut rows[rows_at..rows_at + r], &row_shape).unwrap()
                    } else {
                        TensorViewMut::from_slice_strided_mut(&mut out[out_at..out_at + r * C], &shape, Some(&strides), 0).unwrap()
                    };
                    k.call(&mut args, &mut [o]).unwrap();
                    black_box(&out);
                })
            });
        }
        g.finish();
    }
}

fn layouts_f32(c: &mut Criterion) {
    bench_dtype::<f32>(c, "f32", |v| v);
}

fn layouts_bf16(c: &mut Criterion) {
    bench_dtype::<bf16>(c, "bf16", bf16::from_f32);
}

fn matmul(c: &mut Criterion) {
    dlbridge_cpu::link();
    let mut g = c.benchmark_group("matmul/f32");
    let m = 1024;
    let a = Array::from_vec((0..m * m).map(|i| (i % 17) as f32 * 0.1).collect(), &[m, m]).unwrap();
    let b = Array::from_vec((0..m * m).map(|i| (i % 13) as f32 * 0.1).collect(), &[m, m]).unwrap();
    let mut c_out = Array::zeros(DType::F32, &[m, m]).unwrap();
    let mm = Registry::global().get("matmul").unwrap();
    g.throughput(Throughput::Elements(2 * (m * m * m) as u64));
    g.bench_function("1024", |bench| {
        bench.iter(|| mm.call(&mut [Arg::Tensor(a.view()), Arg::Tensor(b.view())], &mut [c_out.view_mut().unwrap()]).unwrap())
    });
    g.finish();
}

fn config() -> Criterion {
    Criterion::default().sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_millis(800))
}

criterion_group!(name = benches; config = config(); targets = overhead, layouts_f32, layouts_bf16, matmul);
criterion_main!(benches);
