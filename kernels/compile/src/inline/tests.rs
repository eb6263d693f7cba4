//! The tests of the inline library's helpers.

use super::*;

#[test]
fn a_name_is_found_outside_comments_only() {
    assert!(mentions("void axpy(float* x) {}", "axpy"));
    assert!(!mentions("// axpy\n/* axpy */ void axpy2() {}", "axpy"));
    assert!(!mentions("void my_axpy() {}", "axpy"));
}

#[test]
fn sizes_follow_the_order_of_first_appearance_and_groups_pass_their_count() {
    let lib = InlineLibrary::new(
        "sizes_doc",
        Some("f g"),
        &["f<T: f32|f64>(a: T[...B, M, K], b: T[K, N], s: i64, on: bool) -> (c: T[...B, M, N])", "g(x: i32[3, N])"],
        None,
        InlineOptions::default(),
    )
    .unwrap();
    assert_eq!(
        lib.prototype("f").unwrap(),
        "void f(const T* a, const T* b, long long s, int on, T* c, long long B, long long M, long long K, long long N)"
    );
    assert_eq!(lib.prototype("g").unwrap(), "void g(const int* x, long long N)");
    let f = &lib.inner.functions[0];
    assert_eq!(f.sizes[0].value(&[2, 3, 4, 5]), 6);
    assert_eq!(f.sizes[1].value(&[2, 3, 4, 5]), 4);
    assert_eq!(f.sizes[2].value(&[2, 3, 4, 5]), 5);
    assert_eq!(f.sizes[1].value(&[4, 5]), 4);
    assert_eq!(f.sizes[0].value(&[4, 5]), 1);
}

#[test]
fn a_strided_function_takes_one_strides_array_per_tensor_after_the_sizes() {
    let opts = || InlineOptions { strided: vec!["t".into()], ..Default::default() };
    let lib = InlineLibrary::new("strided_doc", Some("t"), &["t(x: f64[M, N], s: f64) -> (y: f64[N, M])"], None, opts()).unwrap();
    assert_eq!(
        lib.prototype("t").unwrap(),
        "void t(const double* x, double s, double* y, long long M, long long N, const long long* x_strides, const long long* y_strides)"
    );
    assert!(!lib.defs(0)[0].opts.contiguous, "any layout reaches it");
    let e = InlineLibrary::new("strided_cuda", Some("t"), &["t(x: f64[N])"], Some("t"), opts()).unwrap_err();
    assert!(e.to_string().contains("function `t` takes strides, which only C functions (c_source) are passed"), "{e}");
    let e = InlineLibrary::new("strided_none", Some("u"), &["u(x: f64[N])"], None, opts()).unwrap_err();
    assert!(e.to_string().contains("`strided` names `t`, which `functions` does not list"), "{e}");
}
