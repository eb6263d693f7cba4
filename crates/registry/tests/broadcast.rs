//! Broadcast groups (`*S`): the inputs' shapes broadcast together as NumPy
//! broadcasts them, outputs are allocated (or checked) with the result, and a
//! `mut` input must already have it.
use dlbridge_array::Array;
use dlbridge_core::{DType, ErrorKind};
use dlbridge_registry::solution::broadcast_shapes;
use dlbridge_registry::{Arg, Call, KernelDef, KernelOpts, Registry, Signature};

fn reg_with(sig: &str) -> Registry {
    let reg = Registry::new();
    reg.register(KernelDef { opts: KernelOpts::ELEMENTWISE, ..KernelDef::cpu(sig, |_: &mut Call<'_, '_>| Ok(())) }).unwrap();
    reg
}

fn zeros(shape: &[i64]) -> Array {
    Array::zeros(DType::F32, shape).unwrap()
}

#[test]
fn broadcast_groups_parse_and_print_back() {
    let text = "fma<T: f32|f64>(x: T[*S], y: T[*S], b: mut T[*S], r: T[...R]) -> (z: T[*S])";
    let sig = Signature::parse(text).unwrap();
    assert_eq!(sig.to_string(), text);
    assert_eq!(sig.broadcast, vec![true, false]);
}

#[test]
fn broadcast_groups_are_whole_shapes_and_one_kind_of_group() {
    let err = |t: &str| Signature::parse(t).unwrap_err().to_string();
    let e = err("k(x: f32[N, *S]) -> (y: f32[N, *S])");
    assert!(e.contains("`*S` broadcasts whole shapes: it must be the tensor's only dim"), "{e}");
    let e = err("k(x: f32[*S, N]) -> (y: f32[*S])");
    assert!(e.contains("must be the tensor's only dim"), "{e}");
    let e = err("k(x: f32[*S], y: f32[...S]) -> (z: f32[*S])");
    assert!(e.contains("`*S` is written `...S` here"), "{e}");
    let e = err("k(x: f32[*S], y: f32[*B]) -> (z: f32[*S])");
    assert!(e.contains("at most one broadcast group"), "{e}");
    let e = err("k(x: f32[N]) -> (z: f32[*S])");
    assert!(e.contains("output `z`: `*S` is not bound by any input"), "{e}");
}

#[test]
fn numpy_broadcasting_rules() {
    let b = |a: &[i64], c: &[i64]| broadcast_shapes(a, c).map(|s| s.to_vec());
    assert_eq!(b(&[3, 1], &[1, 4]), Some(vec![3, 4]));
    assert_eq!(b(&[5, 3, 4], &[4]), Some(vec![5, 3, 4]));
    assert_eq!(b(&[], &[2, 2]), Some(vec![2, 2]));
    assert_eq!(b(&[0], &[1]), Some(vec![0]));
    assert_eq!(b(&[3], &[4]), None);
    assert_eq!(b(&[2, 3], &[3, 3]), None);
}

#[test]
fn outputs_get_the_broadcast_shape_of_all_inputs() {
    let reg = reg_with("sqdiff<T: f32|f64>(x: T[*S], y: T[*S]) -> (z: T[*S])");
    let k = reg.get("sqdiff").unwrap();
    let (x, y) = (zeros(&[3, 1]), zeros(&[1, 4]));
    let specs = k.prepare_outputs(&[Arg::Tensor(x.view()), Arg::Tensor(y.view())]).unwrap();
    assert_eq!(&specs[0].shape[..], &[3, 4]);
    let (x, y) = (zeros(&[2, 5, 1]), zeros(&[]));
    let specs = k.prepare_outputs(&[Arg::Tensor(x.view()), Arg::Tensor(y.view())]).unwrap();
    assert_eq!(&specs[0].shape[..], &[2, 5, 1]);
    // Same shapes: the planned fast path binds it.
    let (x, y, mut z) = (zeros(&[2, 2]), zeros(&[2, 2]), zeros(&[2, 2]));
    k.call(&mut [Arg::Tensor(x.view()), Arg::Tensor(y.view())], &mut [z.view_mut().unwrap()]).unwrap();
    // Broadcast inputs, a matching out=.
    let (x, y, mut z) = (zeros(&[3, 1]), zeros(&[4]), zeros(&[3, 4]));
    k.call(&mut [Arg::Tensor(x.view()), Arg::Tensor(y.view())], &mut [z.view_mut().unwrap()]).unwrap();
}

#[test]
fn shapes_that_do_not_broadcast_and_wrong_outputs_are_named() {
    let reg = reg_with("sqdiff<T: f32|f64>(x: T[*S], y: T[*S]) -> (z: T[*S])");
    let k = reg.get("sqdiff").unwrap();
    let (x, y) = (zeros(&[3, 2]), zeros(&[4]));
    let e = k.prepare_outputs(&[Arg::Tensor(x.view()), Arg::Tensor(y.view())]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Value);
    assert_eq!(e.to_string(), "sqdiff: argument y: shape [4] does not broadcast with [3, 2] (*S so far, from the inputs before it)");
    // An output never broadcasts: it must have the whole shape.
    let (x, y, mut z) = (zeros(&[3, 1]), zeros(&[4]), zeros(&[4]));
    let e = k.call(&mut [Arg::Tensor(x.view()), Arg::Tensor(y.view())], &mut [z.view_mut().unwrap()]).unwrap_err();
    assert_eq!(e.to_string(), "sqdiff: output z: *S = [3, 4] (bound by the inputs, broadcast) but got [4]");
}

#[test]
fn an_in_place_input_must_already_have_the_broadcast_shape() {
    let reg = reg_with("iadd<T: f32|f64>(x: mut T[*S], y: T[*S])");
    let k = reg.get("iadd").unwrap();
    let (mut x, y) = (zeros(&[3, 4]), zeros(&[4]));
    k.call(&mut [Arg::TensorMut(x.view_mut().unwrap()), Arg::Tensor(y.view())], &mut []).unwrap();
    let (mut x, y) = (zeros(&[4]), zeros(&[3, 4]));
    let e = k.call(&mut [Arg::TensorMut(x.view_mut().unwrap()), Arg::Tensor(y.view())], &mut []).unwrap_err();
    assert_eq!(
        e.to_string(),
        "iadd: argument x: the parameter is `mut` (written in place), so its shape must be the inputs' broadcast shape *S = [3, 4], but it is [4]"
    );
}
