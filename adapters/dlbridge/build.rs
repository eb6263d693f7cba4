//! Passes on the libtorch directory dlbridge-tch linked (feature `tch`) to
//! the build scripts of the packages that depend on this one, as
//! `DEP_DLBRIDGE_LIBTORCH_DIR`: a program's `build.rs` puts it on its rpath
//! (docs/rust.md), since a link argument reaches only its own package. This
//! package's own examples and benches get it on their rpath here.
#![forbid(unsafe_code)]

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_DLBRIDGE_TCH_SHIM_LIBTORCH_DIR");
    if let Ok(dir) = std::env::var("DEP_DLBRIDGE_TCH_SHIM_LIBTORCH_DIR") {
        println!("cargo:libtorch_dir={dir}");
        // This package's own examples and benches (the tch quick start) find it too.
        for kind in ["examples", "benches"] {
            println!("cargo:rustc-link-arg-{kind}=-Wl,-rpath,{dir}");
        }
    }
}
