//! A contiguous (or any-layout) copy for every byte-sized dtype.

use dlbridge_core::Result;
use dlbridge_registry::{Call, KernelOpts, register_kernel};

fn copy(call: &mut Call<'_, '_>) -> Result<()> {
    let (ins, mut outs) = call.io();
    outs.take("y")?.copy_from(ins.tensor("x")?)
}

register_kernel!(
    "copy<T: f32|f64|f16|bf16|i8|i16|i32|i64|u8|u16|u32|u64|bool|c64|c128>(x: T[...S]) -> (y: T[...S])",
    generic copy,
    opts = KernelOpts { row_major_outputs: true, ..KernelOpts::DEFAULT },
    doc = "copies x into y (y allocated contiguous unless given): a contiguous copy of any layout"
);
