//! `dlbridge::try_kernel` runs a kernel once on arrays its signature
//! describes: a misspelt parameter name in a kernel's body is found by a test,
//! not by the first real call; every built-in passes.
#![forbid(unsafe_code)]

use dlbridge::{Call, register_kernel};

fn scale_typo(call: &mut Call<'_, '_>) -> dlbridge::Result<()> {
    let (ins, mut outs) = call.io();
    let (x, alpha) = (ins.tensor("x")?, ins.f64("alhpa")?); // the signature says `alpha`
    outs.take("y")?.iter_mut::<f32>()?.zip(x.iter::<f32>()?).for_each(|(y, x)| *y = alpha as f32 * x);
    Ok(())
}

fn scale(call: &mut Call<'_, '_>) -> dlbridge::Result<()> {
    let (ins, mut outs) = call.io();
    let (x, alpha) = (ins.tensor("x")?, ins.f64("alpha")?);
    outs.take("y")?.iter_mut::<f32>()?.zip(x.iter::<f32>()?).for_each(|(y, x)| *y = alpha as f32 * x + 1.0);
    Ok(())
}

register_kernel!("try_scale_typo(x: f32[N], alpha: f64) -> (y: f32[N])", generic scale_typo);
register_kernel!("try_scale(x: f32[N], alpha: f64) -> (y: f32[N])", generic scale);

#[test]
fn a_misspelt_parameter_name_is_an_error_naming_it() {
    let e = dlbridge::try_kernel(&dlbridge::get_kernel("try_scale_typo").unwrap()).unwrap_err().to_string();
    assert!(e.contains("alhpa"), "{e}");
    let out = dlbridge::try_kernel(&dlbridge::get_kernel("try_scale").unwrap()).unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), [1.0, 1.0], "ran on x = [0, 0], alpha = 1");
}

#[test]
fn every_builtin_runs_on_the_arrays_its_signature_describes() {
    for k in dlbridge::registry().list() {
        if k.name().starts_with("try_") || !k.devices().any(|d| d == dlbridge::DeviceType::CPU) {
            continue;
        }
        dlbridge::try_kernel(&k).unwrap_or_else(|e| panic!("{}: {e}", k.signature_text()));
    }
}
