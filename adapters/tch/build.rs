//! Compiles shim.cpp against the libtorch that torch-sys links (the torch==2.13.0
//! Python package when LIBTORCH_USE_PYTORCH=1), and puts that libtorch's
//! directory on the rpath so tests and examples run without LD_LIBRARY_PATH.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::Command;

const PROBE: &str = r"
import torch
from torch.utils import cpp_extension
print('LIB', cpp_extension.library_paths()[0])
print('ABI', int(torch._C._GLIBCXX_USE_CXX11_ABI))
for p in cpp_extension.include_paths():
    print('INC', p)
";

fn main() {
    println!("cargo:rerun-if-changed=shim.cpp");
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=LIBTORCH_USE_PYTORCH");
    println!("cargo:rerun-if-env-changed=PYTHON_SYS_EXECUTABLE");
    let python = std::env::var("PYTHON_SYS_EXECUTABLE").unwrap_or_else(|_| "python".into());
    let out = Command::new(&python).arg("-c").arg(PROBE).output().unwrap_or_else(|e| panic!("running {python}: {e}"));
    assert!(out.status.success(), "{python} could not import torch: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let mut includes = Vec::new();
    let mut lib = None;
    let mut abi = "1".to_owned();
    for line in text.lines() {
        if let Some(p) = line.strip_prefix("INC ") {
            includes.push(PathBuf::from(p));
        } else if let Some(p) = line.strip_prefix("LIB ") {
            lib = Some(PathBuf::from(p));
        } else if let Some(a) = line.strip_prefix("ABI ") {
            abi = a.to_owned();
        }
    }
    let lib = lib.expect("torch library path");
    let mut build = cc::Build::new();
    build.cpp(true).file("shim.cpp").flag("-std=c++17").flag_if_supported("-w").define("_GLIBCXX_USE_CXX11_ABI", abi.as_str());
    for inc in &includes {
        build.include(inc);
    }
    build.compile("dlbridge_tch_shim");
    println!("cargo:rustc-link-search=native={}", lib.display());
    for l in ["torch_cpu", "c10"] {
        println!("cargo:rustc-link-lib=dylib={l}");
    }
    // Tests, examples and benches find libtorch without LD_LIBRARY_PATH; the
    // CUDA libraries torch ships stay linked through libtorch itself.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    println!("cargo:rustc-env=DLBRIDGE_TCH_LIBTORCH={}", lib.display());
    // A link argument reaches this package's own binaries only: a program that
    // depends on it puts the directory on its rpath from its build script, where
    // this line is `DEP_DLBRIDGE_TCH_SHIM_LIBTORCH_DIR` (and, through the facade's
    // `tch` feature, `DEP_DLBRIDGE_LIBTORCH_DIR`).
    println!("cargo:libtorch_dir={}", lib.display());
}
