//! Compiles example.c into the example plugin and into the malformed plugins
//! the loader tests must refuse, with the system C compiler (found by `cc`).
#![forbid(unsafe_code)]

use std::path::PathBuf;

const VARIANTS: &[(&str, &[&str])] = &[
    ("example_c", &[]),
    ("future_abi", &["-DBROKEN_FUTURE_ABI"]),
    ("small_struct", &["-DBROKEN_SMALL_STRUCT"]),
    ("bad_signature", &["-DBROKEN_BAD_SIGNATURE"]),
    ("no_symbol", &["-DBROKEN_NO_SYMBOL"]),
    ("duplicate", &["-DPLUGIN_NAME=\"duplicate-c\""]),
    ("duplicate_kernel", &["-DBROKEN_DUPLICATE_KERNEL"]),
    ("cuda_add_then_conflict", &["-DBROKEN_CUDA_ADD_THEN_CONFLICT", "-DPLUGIN_NAME=\"cuda-add-c\""]),
    ("cuda_stream_probe", &["-DCUDA_STREAM_PROBE", "-DPLUGIN_NAME=\"cuda-stream-probe\""]),
    ("huge_signature", &["-DBROKEN_HUGE_SIGNATURE"]),
    ("huge_name", &["-DBROKEN_HUGE_NAME"]),
];

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let include = manifest.join("../../include");
    let source = manifest.join("example.c");
    println!("cargo:rerun-if-changed={}", source.display());
    println!("cargo:rerun-if-changed={}", include.join("dlbridge/plugin.h").display());
    let compiler = cc::Build::new().opt_level(2).get_compiler();
    for (name, defines) in VARIANTS {
        let lib = out.join(format!("libdlbridge_plugin_{name}.so"));
        let status = compiler
            .to_command()
            .args(["-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-std=c11"])
            .arg("-I")
            .arg(&include)
            .args(*defines)
            .arg(&source)
            .arg("-o")
            .arg(&lib)
            .arg("-lm")
            .status()
            .expect("running the C compiler");
        assert!(status.success(), "compiling the {name} plugin failed");
    }
    println!("cargo:rustc-env=DLBRIDGE_PLUGIN_C_DIR={}", out.display());
}
