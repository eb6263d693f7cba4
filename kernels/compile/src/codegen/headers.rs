//! The C++ of generated kernels that is the same in every source: real header
//! files in `kernels/compile/include/dlbridge_compile/` (an editor, a formatter
//! and a compiler see them; a test compiles each one alone with warnings as
//! errors), pasted into each generated source with dlbridge's own `#include`s
//! resolved, so the system compiler and NVRTC need no include path.

use dlbridge_registry::plugin::PLUGIN_H;

/// Integer division by zero as an error (`dlbridge_divguard::guarded`).
pub(crate) const DIVGUARD_H: &str = include_str!("../../include/dlbridge_compile/divguard.h");
/// `float16` and `bfloat16`, for both backends.
pub(crate) const HALFS_H: &str = include_str!("../../include/dlbridge_compile/halfs.h");
/// The runtime of generated CUDA kernels (on `dlbridge_common.cuh` and the half types).
pub(crate) const CUDA_RUNTIME_CUH: &str = include_str!("../../include/dlbridge_compile/cuda_runtime.cuh");

/// dlbridge's headers by the name an `#include "..."` gives them.
pub(crate) const FILES: [(&str, &str); 10] = [
    ("dlbridge/plugin.h", PLUGIN_H),
    ("dlbridge_common.cuh", dlbridge_cuda::builtins::COMMON),
    ("dlbridge_compile/nvrtc_stdint.cuh", include_str!("../../include/dlbridge_compile/nvrtc_stdint.cuh")),
    ("dlbridge_compile/divguard.h", DIVGUARD_H),
    ("dlbridge_compile/errors.h", include_str!("../../include/dlbridge_compile/errors.h")),
    ("dlbridge_compile/halfs.h", HALFS_H),
    ("dlbridge_compile/libmvec.h", include_str!("../../include/dlbridge_compile/libmvec.h")),
    ("dlbridge_compile/cpu_runtime.h", include_str!("../../include/dlbridge_compile/cpu_runtime.h")),
    ("dlbridge_compile/cuda_runtime.cuh", CUDA_RUNTIME_CUH),
    ("dlbridge_compile/inline_runtime.h", include_str!("../../include/dlbridge_compile/inline_runtime.h")),
];

/// The text of header `name` as it is on disk.
pub(crate) fn text(name: &str) -> &'static str {
    FILES.iter().find(|(n, _)| *n == name).map(|(_, t)| *t).unwrap_or_else(|| panic!("no header {name} among dlbridge's"))
}

/// Header `name` with each `#include "X"` of one of dlbridge's headers
/// replaced by X (expanded the same way), each header pasted at most once.
pub(crate) fn expand(name: &'static str) -> String {
    let mut out = String::new();
    let mut done = Vec::new();
    paste(name, &mut out, &mut done);
    out
}

fn paste(name: &'static str, out: &mut String, done: &mut Vec<&'static str>) {
    if done.contains(&name) {
        return;
    }
    done.push(name);
    // Include guards keep a header pasted twice harmless; `#pragma once` is a
    // warning in what the compiler sees as one main file.
    for line in text(name).lines().filter(|l| l.trim() != "#pragma once") {
        let included = line.trim().strip_prefix("#include \"").and_then(|r| r.strip_suffix('"'));
        match included.and_then(|inc| FILES.iter().find(|(n, _)| *n == inc)) {
            Some((inc, _)) => paste(inc, out, done),
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::process::Command;

    use super::*;

    /// Every header in the folder is one `FILES` knows (none is left out of the pasting).
    #[test]
    fn every_header_of_the_folder_is_known() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("include/dlbridge_compile");
        for e in std::fs::read_dir(&dir).unwrap() {
            let name = format!("dlbridge_compile/{}", e.unwrap().file_name().to_string_lossy());
            assert!(FILES.iter().any(|(n, _)| *n == name), "{name} is not in headers::FILES");
        }
    }

    /// Each C++ header compiles alone, through its own `#include`s, with the
    /// flags generated kernels use and `-Wall -Wextra -Werror`; with and
    /// without glibc's vector math declared.
    #[test]
    fn each_cpu_header_compiles_alone_without_warnings() {
        let Ok(cxx) = crate::builder::toolchain::Compiler::get() else {
            eprintln!("skipped: no C++ compiler");
            return;
        };
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let dir = tempfile::tempdir().unwrap();
        for (name, _) in FILES.iter().filter(|(n, _)| n.ends_with(".h")) {
            for extra in [&[][..], &["-DDLBRIDGE_LIBMVEC"][..]] {
                let cpp = dir.path().join("alone.cpp");
                std::fs::write(&cpp, format!("#include \"{name}\"\n")).unwrap();
                let (prog, pre) = cxx.command.split_first().unwrap();
                let out = Command::new(prog)
                    .args(pre)
                    .args(cxx.flags())
                    .args(["-fsyntax-only", "-Wall", "-Wextra", "-Werror"])
                    .args(extra)
                    .arg("-I")
                    .arg(root.join("include"))
                    .arg("-I")
                    .arg(root.join("../../include"))
                    .arg(&cpp)
                    .output()
                    .unwrap();
                assert!(out.status.success(), "{name} {extra:?}:\n{}", String::from_utf8_lossy(&out.stderr));
            }
        }
    }

    /// The CUDA runtime compiles alone through NVRTC, for the oldest and a recent architecture.
    #[test]
    fn the_cuda_runtime_compiles_alone_through_nvrtc() {
        if let Err(e) = dlbridge_cuda::nvrtc::nvrtc() {
            eprintln!("skipped: {e}");
            return;
        }
        for (name, _) in FILES.iter().filter(|(n, _)| n.ends_with(".cuh") && n.starts_with("dlbridge_compile/")) {
            let text = expand(name);
            for arch in ["--gpu-architecture=compute_75", "--gpu-architecture=compute_90"] {
                let mut options: Vec<String> = crate::codegen::cuda::OPTIONS.iter().map(|s| s.to_string()).collect();
                options.push(arch.into());
                dlbridge_cuda::nvrtc::compile_ptx(&text, name, &options).unwrap_or_else(|e| panic!("{name} for {arch}: {e}"));
            }
        }
    }

    #[test]
    fn own_includes_are_pasted_once_and_others_kept() {
        let cpu = expand("dlbridge_compile/cpu_runtime.h");
        for name in ["dlbridge/plugin.h", "dlbridge_compile/divguard.h", "dlbridge_compile/errors.h", "dlbridge_compile/halfs.h"] {
            assert!(!cpu.contains(&format!("#include \"{name}\"")), "{name} pasted");
        }
        assert_eq!(cpu.matches("#define DLBRIDGE_PLUGIN_H_").count(), 1);
        assert_eq!(cpu.matches("#define DLBRIDGE_COMPILE_HALFS_H_").count(), 1);
        assert!(cpu.contains("#include <cmath>"), "the standard library's includes stay");
    }
}
