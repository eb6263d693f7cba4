//! The README's tch example ("PyTorch in Rust"), which the README doctests in
//! `tests/` cannot run (they build without libtorch). `tests/readme.rs` checks
//! that every line of that README block appears here, in order, so the two
//! cannot drift apart.
#![forbid(unsafe_code)]

#[test]
fn readme_tch_example_runs() -> dlbridge_core::Result<()> {
    // --- README block begins ---
    let t = tch::Tensor::randn([5, 7], (tch::Kind::Float, tch::Device::Cpu));
    let m = dlbridge_tch::to_dlpack(&t)?; // zero copy; storage lives until the deleter runs
    let back = dlbridge_tch::from_dlpack(m)?; // zero copy; deleter runs when torch frees it
    let k = dlbridge::get_kernel("matmul")?;
    let c = dlbridge_tch::call(&k, &[&t, &t.transpose(0, 1)], &[])?; // outputs allocated by tch
    // --- README block ends ---
    assert_eq!(back.data_ptr(), t.data_ptr(), "from_dlpack(to_dlpack(t)) shares t's memory");
    assert_eq!(c[0].size(), [5, 5]);
    let expected = t.matmul(&t.transpose(0, 1));
    assert!(c[0].allclose(&expected, 1e-5, 1e-5, false), "matmul through dlbridge matches torch");
    Ok(())
}
