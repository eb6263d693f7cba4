//! The suite's reference harness: dlbridge's own [`Array`].

use dlbridge_array::Array;
use dlbridge_core::{DType, ManagedTensor, Result};

use crate::cases::{reference, values};
use crate::{Harness, Layout, ReadBack, Spec};

/// dlbridge's Array as a framework under test.
#[derive(Debug)]
pub struct ArrayHarness;

impl Harness for ArrayHarness {
    fn name(&self) -> &str {
        "dlbridge.Array (Rust)"
    }
    fn dtypes(&self) -> Vec<DType> {
        ["f32", "f64", "f16", "bf16", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "bool", "c64", "c128"]
            .iter()
            .map(|d| d.parse().unwrap())
            .collect()
    }
    fn export(&self, spec: &Spec) -> Result<Option<ManagedTensor>> {
        let make = |shape: &[i64]| Array::from_managed(reference(spec.dtype, shape)?);
        let a = match spec.layout {
            Layout::Contiguous => make(&spec.shape)?,
            Layout::Transposed => {
                // Values must read 0, 1, 2.. in the transposed logical order: build the
                // contiguous source holding the transpose's data.
                let (r, c) = (spec.shape[0], spec.shape[1]);
                let src = make(&[r, c])?; // logical values 0..r*c row-major
                src.t()?.contiguous()?.t()?
            }
            Layout::Step2 => {
                let mut big = spec.shape.clone();
                *big.last_mut().unwrap() *= 2;
                let n = spec.numel() as i64;
                // Element i of the view is element 2i of the big one: fill the big one so that holds.
                let base = make(&[n * 2])?;
                let vals: Vec<f32> = (0..n * 2).map(|i| if i % 2 == 0 { (i / 2) as f32 } else { -1.0 }).collect();
                if spec.dtype != DType::F32 {
                    return Ok(None);
                }
                drop(base);
                let big_arr = Array::from_vec(vals, &big)?;
                big_arr.slice(spec.shape.len() - 1, 0, *big.last().unwrap(), 2)?
            }
            Layout::Reversed => {
                if spec.dtype != DType::F32 || spec.shape.len() != 1 {
                    return Ok(None);
                }
                let n = spec.shape[0];
                Array::from_vec((0..n).rev().map(|i| i as f32).collect(), &[n])?.slice(0, -1, -(n + 1), -1)?
            }
            Layout::Offset => {
                let mut big = spec.shape.clone();
                big[0] += 1;
                let n: i64 = big.iter().product();
                let row: i64 = big[1..].iter().product();
                if spec.dtype != DType::F32 {
                    return Ok(None);
                }
                let vals: Vec<f32> = (0..n).map(|i| (i - row) as f32).collect();
                Array::from_vec(vals, &big)?.slice(0, 1, big[0], 1)?
            }
        };
        Ok(Some(a.into_managed()?))
    }
    fn import(&self, tensor: ManagedTensor) -> Result<ReadBack> {
        let a = Array::from_managed(tensor)?;
        let v = a.view();
        Ok(ReadBack { data_ptr: a.data_ptr() as usize, shape: a.shape().to_vec(), dtype: a.dtype(), values: values(&v)? })
    }
}
