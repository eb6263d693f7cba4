//! The built-in CUDA kernels' code run on the CPU (kernels/cuda/cu/host_test.cpp:
//! a fiber per CUDA thread, barriers for `__syncthreads` and the warp
//! shuffles) against double-precision references: index math on random
//! strided layouts, every bf16 rounding, elementwise kernels on strided,
//! negative and broadcast layouts, softmax and sum for every block size.
//! Needs a C++20 compiler (`c++`); without one it prints `skipped: <reason>`.

use std::path::Path;
use std::process::Command;

#[test]
fn kernel_sources_pass_their_host_emulation() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("cu/host_test.cpp");
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dlb_host_test");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let built = Command::new(&cxx).args(["-std=c++20", "-O2", "-pthread", "-o"]).arg(&exe).arg(&src).output();
    let built = match built {
        Err(e) => {
            eprintln!("skipped: no C++ compiler ({cxx}: {e})");
            return;
        }
        Ok(o) => o,
    };
    assert!(built.status.success(), "{cxx} failed:\n{}", String::from_utf8_lossy(&built.stderr));
    let run = Command::new(&exe).output().unwrap();
    let out = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success() && out.contains("all host tests passed"), "{out}\n{}", String::from_utf8_lossy(&run.stderr));
}
