//! A call's checks run through a plan compiled from the signature first
//! (`T[...S]` types compare whole shapes); whatever it decides must be what
//! the general checks ([`bind`] then [`check_outputs`]) decide: the same
//! acceptance, the same bindings, the same error text. Random calls of
//! random dtypes, devices, shapes, scalar kinds and read-only or writable
//! views, against signatures the plan covers and one it does not.

use std::cell::Cell;

use dlbridge_core::testing::{Fields, ForeignTensor};
use dlbridge_core::{DType, DeviceType, ManagedTensor, Result};
use dlbridge_registry::solution::{check_outputs, solve};
use dlbridge_registry::{Arg, Call, Impl, KernelDef, KernelOpts, Registry};
use proptest::prelude::*;

thread_local! {
    /// The dtypes the last call's implementation saw bound to T and U.
    static SEEN: Cell<Option<(Option<DType>, Option<DType>)>> = const { Cell::new(None) };
}

fn record(call: &mut Call<'_, '_>) -> Result<()> {
    SEEN.with(|s| s.set(Some((call.dtype(0), call.dtype(1)))));
    Ok(())
}

const SIGNATURES: [&str; 5] = [
    "p1<T: f32|f64>(a: T[...S], b: T[...S]) -> (out: T[...S])",
    "p2<T: f32|f64, U: i32|f32>(a: T[...S], b: U[...R], c: f32[...S]) -> (out: U[...R], o2: T[...S])",
    "p3<T: f32|f64>(alpha: f64, x: T[...S], y: mut T[...S])",
    "p4<T: f32|f64|i32>(a: T[...S], n: i64) -> (out: f32[...S])",
    // Not covered by the plan: the general checks alone.
    "p5<T: f32|f64>(a: T[...B, N], b: T[N]) -> (out: T[...B])",
];

fn registry() -> Registry {
    let reg = Registry::new();
    for sig in SIGNATURES {
        for device in [DeviceType::CPU, DeviceType::CUDA] {
            reg.register(KernelDef {
                signature: sig.into(),
                device,
                imp: Impl::Generic(record),
                opts: KernelOpts::ELEMENTWISE,
                origin: "test".into(),
                doc: String::new(),
                identity: String::new(),
            })
            .unwrap();
        }
    }
    reg
}

/// One random tensor: dtype (f32, f64, i32), device (cpu, cuda:0, cuda:1), shape, writable.
#[derive(Debug, Clone)]
struct Spec {
    dtype: u8,
    device: u8,
    shape: Vec<i64>,
    writable: bool,
}

fn spec(base: Vec<i64>) -> impl Strategy<Value = Spec> {
    // Mostly valid calls (f32 on the CPU, the common shape), else anything.
    let dtype = prop_oneof![6 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8)];
    let device = prop_oneof![8 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8)];
    let shape = prop_oneof![6 => Just(base), 1 => proptest::collection::vec(0i64..3, 0..3)];
    (dtype, device, shape, any::<bool>()).prop_map(|(dtype, device, shape, writable)| Spec { dtype, device, shape, writable })
}

fn foreign(s: &Spec) -> ForeignTensor {
    let (code, bits) = [(2u8, 32u8), (2, 64), (0, 32)][s.dtype as usize];
    let device = [(1u32, 0i32), (2, 0), (2, 1)][s.device as usize];
    let numel: i64 = s.shape.iter().product();
    ForeignTensor::new(&Fields { dtype: (code, bits, 1), device, buffer_bytes: numel.max(0) as usize * 8, ..Fields::f32(&s.shape) })
}

#[derive(Debug, Clone)]
struct Case {
    sig: usize,
    tensors: Vec<Spec>,
    outputs: Vec<Spec>,
    scalars: Vec<bool>,
}

fn case() -> impl Strategy<Value = Case> {
    (0..SIGNATURES.len(), proptest::collection::vec(0i64..3, 0..3)).prop_flat_map(|(sig, base)| {
        let (nt, no) = [(2, 1), (3, 2), (2, 0), (1, 1), (2, 1)][sig];
        // Sometimes one tensor too few or too many, or a scalar where a tensor goes.
        let nt = prop_oneof![8 => Just(nt), 1 => Just(nt + 1), 1 => Just(nt.max(1) - 1)];
        (Just(sig), nt, Just(no), Just(base)).prop_flat_map(|(sig, nt, no, base)| {
            let tensors = proptest::collection::vec(spec(base.clone()), nt);
            let outputs = proptest::collection::vec(spec(base), no);
            let scalars = proptest::collection::vec(prop_oneof![6 => Just(true), 1 => Just(false)], 2);
            (Just(sig), tensors, outputs, scalars).prop_map(|(sig, tensors, outputs, scalars)| Case { sig, tensors, outputs, scalars })
        })
    })
}

/// The arguments in signature order: tensors where the signature has tensors,
/// scalars (f64 if `true`, else i64) where it has scalars, extra tensors last.
fn run(reg: &Registry, c: &Case) {
    let name = format!("p{}", c.sig + 1);
    let kernel = reg.get(&name).unwrap();
    let sig = kernel.signature();
    let mut foreign_ins: Vec<ForeignTensor> = c.tensors.iter().map(foreign).collect();
    let mut foreign_outs: Vec<ForeignTensor> = c.outputs.iter().map(foreign).collect();
    // SAFETY: every ForeignTensor outlives its ManagedTensor; no memory is read
    // or written (the implementation only records the bound dtypes).
    let mut ins: Vec<ManagedTensor> =
        foreign_ins.iter_mut().map(|f| unsafe { ManagedTensor::from_raw_versioned(f.versioned_ptr()) }.unwrap()).collect();
    // SAFETY: as above.
    let mut outs: Vec<ManagedTensor> =
        foreign_outs.iter_mut().map(|f| unsafe { ManagedTensor::from_raw_versioned(f.versioned_ptr()) }.unwrap()).collect();
    let mut tensor_args: Vec<Arg<'_>> = ins
        .iter_mut()
        .zip(&c.tensors)
        .map(|(m, s)| if s.writable { Arg::TensorMut(m.view_mut().unwrap()) } else { Arg::Tensor(m.view().clone()) })
        .collect::<Vec<_>>();
    tensor_args.reverse();
    let mut scalars = c.scalars.iter();
    let mut args: Vec<Arg<'_>> = Vec::new();
    for p in &sig.params {
        if p.tensor().is_some() {
            if let Some(t) = tensor_args.pop() {
                args.push(t);
            }
        } else if *scalars.next().unwrap_or(&true) {
            args.push(Arg::f64(0.5));
        } else {
            args.push(Arg::i64(2));
        }
    }
    args.extend(tensor_args.into_iter().rev());
    let mut out_views: Vec<_> = outs.iter_mut().map(|m| m.view_mut().unwrap()).collect();

    let general = solve(sig, &args).and_then(|mut b| check_outputs(sig, &mut b, &args, &out_views).map(|()| b));
    SEEN.with(|s| s.set(None));
    let planned = kernel.call(&mut args, &mut out_views);
    match (general, planned) {
        (Ok(b), Ok(())) => {
            assert_eq!(SEEN.with(Cell::get), Some((b.dtype(0), b.dtype(1))), "{name}: {c:?}");
        }
        (Err(g), Err(p)) => assert_eq!(g.to_string(), p.to_string(), "{name}: {c:?}"),
        (g, p) => panic!("{name}: the general checks say {:?}, the call says {p:?}: {c:?}", g.map(|_| ())),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn planned_checks_decide_and_bind_as_the_general_checks_do(c in case()) {
        thread_local! {
            static REG: Registry = registry();
        }
        REG.with(|reg| run(reg, &c));
    }
}

#[test]
fn a_valid_elementwise_call_takes_the_plan_and_binds_its_dtype() {
    let reg = registry();
    run(
        &reg,
        &Case {
            sig: 0,
            tensors: vec![Spec { dtype: 1, device: 1, shape: vec![2, 2], writable: false }; 2],
            outputs: vec![Spec { dtype: 1, device: 1, shape: vec![2, 2], writable: true }],
            scalars: vec![],
        },
    );
    assert_eq!(SEEN.with(Cell::get), Some((Some(DType::F64), None)));
}
