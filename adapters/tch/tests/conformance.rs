//! The shared DLPack conformance suite against the tch adapter.

use dlbridge_conformance::cases::{reference, values};
use dlbridge_conformance::{Harness, Layout, ReadBack, Spec};
use dlbridge_core::{DType, ManagedTensor, Result};
use tch::{Device, Kind, Tensor};

#[derive(Debug)]
struct TchHarness;

fn kind(d: DType) -> Kind {
    dlbridge_tch::kind_of(d).expect("harness dtypes all have a tch kind")
}

impl Harness for TchHarness {
    fn name(&self) -> &str {
        "tch"
    }
    fn dtypes(&self) -> Vec<DType> {
        ["f32", "f64", "f16", "bf16", "i8", "i16", "i32", "i64", "u8", "bool", "c64", "c128"].iter().map(|d| d.parse().unwrap()).collect()
    }
    fn export(&self, spec: &Spec) -> Result<Option<ManagedTensor>> {
        // Build through a dlbridge reference tensor (values 0, 1, ..), so every dtype gets the same data.
        let logical = |shape: &[i64]| -> Result<Tensor> { dlbridge_tch::from_dlpack(reference(spec.dtype, shape)?).map(|t| t.copy()) };
        let t = match spec.layout {
            Layout::Contiguous => logical(&spec.shape)?,
            Layout::Transposed => logical(&spec.shape)?.transpose(0, 1).contiguous().transpose(0, 1),
            Layout::Step2 => {
                let flat = logical(&[spec.numel() as i64])?;
                let big = Tensor::zeros([spec.numel() as i64 * 2], (kind(spec.dtype), Device::Cpu));
                big.slice(0, 0, None, 2).copy_(&flat);
                let mut shape = spec.shape.clone();
                *shape.last_mut().unwrap() *= 2;
                big.reshape(&shape[..]).slice(spec.shape.len() as i64 - 1, 0, None, 2)
            }
            Layout::Reversed => return Ok(None), // torch tensors cannot have negative strides
            Layout::Offset => {
                let mut big = spec.shape.clone();
                big[0] += 1;
                let t = Tensor::zeros(&big[..], (kind(spec.dtype), Device::Cpu));
                t.narrow(0, 1, spec.shape[0]).copy_(&logical(&spec.shape)?);
                t.narrow(0, 1, spec.shape[0])
            }
        };
        dlbridge_tch::to_dlpack(&t).map(Some)
    }
    fn import(&self, tensor: ManagedTensor) -> Result<ReadBack> {
        let t = dlbridge_tch::from_dlpack(tensor)?;
        // Read back through a fresh export of the tch tensor (dlbridge reads every dtype).
        let back = dlbridge_tch::to_dlpack(&t)?;
        Ok(ReadBack { data_ptr: t.data_ptr() as usize, shape: t.size(), dtype: back.dtype(), values: values(back.view())? })
    }
    fn accepts_read_only(&self) -> bool {
        false
    }
    fn known_failures(&self) -> Vec<(&'static str, &'static str)> {
        Vec::new()
    }
}

dlbridge_conformance::conformance_tests!(TchHarness);
