//! NVRTC on this machine: every built-in kernel source compiles to PTX with
//! every entry point, compile errors carry NVRTC's log, and the disk cache
//! serves a second process (a second cache) without compiling.
//! Without NVRTC each test prints `skipped: <reason>` and returns.

use dlbridge_cuda::builtins::{self, SOURCES};
use dlbridge_cuda::nvrtc::{self, PtxCache};
use sha2::Digest;

use dlbridge_cuda::nvrtc::available_or_skip as nvrtc_or_skip;

#[test]
fn every_builtin_source_compiles_to_ptx_with_all_its_entry_points() {
    if !nvrtc_or_skip() {
        return;
    }
    let cache = PtxCache::new(None);
    for arch in ["--gpu-architecture=compute_75", "--gpu-architecture=compute_90"] {
        for src in SOURCES {
            let ptx = src.ptx(&cache, arch).unwrap_or_else(|e| panic!("{} for {arch}: {e}", src.name));
            assert!(ptx.contains(&format!(".target sm_{}", &arch[arch.len() - 2..])), "{}", src.name);
            for entry in src.entry_points() {
                assert!(ptx.contains(&format!(".entry {entry}(")), "{} lacks {entry} for {arch}", src.name);
            }
        }
    }
    assert_eq!(cache.stats().compiled, 6);
    assert_eq!(SOURCES.iter().map(|s| s.entry_points().len()).sum::<usize>(), 40);
}

/// The PTX of one entry point (from `.entry NAME(` to the next `.entry`).
fn entry_ptx<'p>(ptx: &'p str, entry: &str) -> &'p str {
    let start = ptx.find(&format!(".entry {entry}(")).unwrap_or_else(|| panic!("no {entry}"));
    let rest = &ptx[start + 1..];
    &ptx[start..start + 1 + rest.find(".entry").unwrap_or(rest.len())]
}

#[test]
fn the_row_and_elementwise_kernels_use_128_bit_loads_on_contiguous_memory_and_no_local_memory() {
    if !nvrtc_or_skip() {
        return;
    }
    let cache = PtxCache::new(None);
    for name in ["softmax", "sum", "add"] {
        let src = builtins::source_of(name).unwrap();
        let ptx = src.ptx(&cache, "--gpu-architecture=compute_90").unwrap();
        for entry in src.entry_points() {
            let body = entry_ptx(&ptx, &entry);
            let ops: std::collections::BTreeSet<&str> =
                body.split_whitespace().filter(|w| w.starts_with("ld.") || w.starts_with("st.")).collect();
            // Everything in registers: no stack frame (local memory) for the unpacked vectors or the statistics.
            assert!(!body.contains(".local"), "{entry} uses local memory");
            // 128 bits: four 32-bit lanes or two 64-bit ones.
            let wide = |o: &&&str| o.contains(".v4.") && o.ends_with("32") || o.contains(".v2.") && o.ends_with("64");
            assert!(ops.iter().filter(|o| o.starts_with("ld.global")).any(|o| wide(&o)), "{entry} has no 128-bit load: {ops:?}");
            // Entries that write rows (not one partial result a row or piece) store 16 bytes too.
            if !(name == "sum" || entry.contains("_partial_")) {
                assert!(ops.iter().filter(|o| o.starts_with("st.global")).any(|o| wide(&o)), "{entry} has no 128-bit store: {ops:?}");
            }
        }
    }
}

#[test]
fn a_compile_error_carries_nvrtcs_log() {
    if !nvrtc_or_skip() {
        return;
    }
    let e = nvrtc::compile_ptx("extern \"C\" __global__ void k(float* x) { x[0] = undefined_name; }", "broken.cu", &[]).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("broken.cu") && msg.contains("undefined_name") && msg.contains("NVRTC_ERROR_COMPILATION"), "{msg}");
    let e = nvrtc::compile_ptx("extern \"C\" __global__ void k() {}", "opts.cu", &["--no-such-option".into()]).unwrap_err();
    assert!(e.to_string().contains("opts.cu"), "{e}");
}

#[test]
fn the_disk_cache_serves_another_cache_and_replaces_a_damaged_file() {
    if !nvrtc_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = "extern \"C\" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }";
    let opts = builtins::options("--gpu-architecture=compute_80");
    let first = PtxCache::new(Some(dir.path().to_path_buf()));
    let a = first.get_or_compile(src, "twice.cu", &opts).unwrap();
    let again = first.get_or_compile(src, "twice.cu", &opts).unwrap();
    assert_eq!(a, again);
    assert_eq!((first.stats().compiled, first.stats().memory_hits), (1, 1));

    // Another process (another cache over the same folder) reads the file.
    let second = PtxCache::new(Some(dir.path().to_path_buf()));
    let b = second.get_or_compile(src, "twice.cu", &opts).unwrap();
    assert_eq!(&*a, &*b);
    assert_eq!((second.stats().compiled, second.stats().disk_hits), (0, 1));

    // A damaged file is compiled again and rewritten.
    let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().map(|e| e.path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    // A file with the right key but PTX that is not what was hashed (a torn write, an edit).
    let good = std::fs::read_to_string(&files[0]).unwrap();
    std::fs::write(&files[0], good.replace(".entry twice(", ".entry twicf(")).unwrap();
    let third = PtxCache::new(Some(dir.path().to_path_buf()));
    let c = third.get_or_compile(src, "twice.cu", &opts).unwrap();
    assert_eq!(&*c, &*a);
    assert_eq!((third.stats().compiled, third.stats().disk_hits), (1, 0));
    assert!(std::fs::read_to_string(&files[0]).unwrap().contains(".entry twice("));

    // An edited image with a header recomputed the way anyone can (the
    // image's SHA-256 in place of the seal) is not loaded either.
    let good = std::fs::read_to_string(&files[0]).unwrap();
    let (header, image) = good.split_once('\n').unwrap();
    let planted = image.replace(".entry twice(", ".entry twicf(");
    let key = header.split(' ').nth(2).unwrap();
    let sha: String = sha2::Sha256::digest(planted.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(&files[0], format!("// dlbridge-ptx {key} {sha}\n{planted}")).unwrap();
    let fourth = PtxCache::new(Some(dir.path().to_path_buf()));
    assert_eq!(&*fourth.get_or_compile(src, "twice.cu", &opts).unwrap(), &*a);
    assert_eq!((fourth.stats().compiled, fourth.stats().disk_hits), (1, 0));

    // Another architecture is another entry.
    third.get_or_compile(src, "twice.cu", &builtins::options("--gpu-architecture=compute_90")).unwrap();
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
}

#[test]
fn every_builtin_source_compiles_to_a_cubin_for_exact_architectures() {
    if !nvrtc_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = PtxCache::new(Some(dir.path().to_path_buf()));
    for arch in ["--gpu-architecture=sm_75", "--gpu-architecture=sm_90"] {
        for src in SOURCES {
            let bin = src.cubin(&cache, arch).unwrap_or_else(|e| panic!("{} for {arch}: {e}", src.name));
            assert_eq!(&bin[..4], b"\x7fELF", "{} for {arch} is not an ELF CUBIN", src.name);
            for entry in src.entry_points() {
                let needle = entry.as_bytes();
                assert!(bin.windows(needle.len()).any(|w| w == needle), "{} lacks {entry} for {arch}", src.name);
            }
        }
    }
    assert_eq!(cache.stats().compiled, 6);
    // A second cache over the same folder reads the binaries back whole.
    let again = PtxCache::new(Some(dir.path().to_path_buf()));
    let a = SOURCES[0].cubin(&cache, "--gpu-architecture=sm_90").unwrap();
    let b = SOURCES[0].cubin(&again, "--gpu-architecture=sm_90").unwrap();
    assert_eq!(a, b);
    assert_eq!((again.stats().compiled, again.stats().disk_hits), (0, 1));
    // PTX and CUBIN of the same source and options are different entries.
    assert!(SOURCES[0].ptx(&again, "--gpu-architecture=compute_90").unwrap().contains(".entry"));
    assert_eq!(again.stats().compiled, 1);
}

/// ptxas's report for every kernel of `source` built as an sm_90 CUBIN: (kernel, registers, spill bytes).
fn ptxas_report(source: &str, name: &str) -> Vec<(String, u32, u32)> {
    let options = ["--gpu-architecture=sm_90".to_string(), "--std=c++17".into(), "-default-device".into(), "--ptxas-options=-v".into()];
    let (_, log) = nvrtc::compile_with_log(source, name, &options, nvrtc::Output::Cubin).unwrap();
    let mut out: Vec<(String, u32, u32)> = Vec::new();
    let number_before = |line: &str, what: &str| -> Option<u32> {
        let at = line.find(what)?;
        line[..at].split_whitespace().last()?.parse().ok()
    };
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            out.push((rest.split('\'').next().unwrap().to_string(), 0, 0));
        } else if let Some(last) = out.last_mut() {
            if let Some(spill) = number_before(line, "bytes spill stores") {
                last.2 = spill;
            }
            if let Some(regs) = number_before(line, "registers") {
                last.1 = regs;
            }
        }
    }
    out
}

#[test]
fn every_builtin_kernel_fits_its_largest_block_in_registers_without_spilling() {
    if !nvrtc_or_skip() {
        return;
    }
    for src in SOURCES {
        let report = ptxas_report(&src.text(), src.name);
        assert_eq!(report.len(), src.entry_points().len(), "{}: {report:?}", src.name);
        for (kernel, regs, spill) in &report {
            // The largest block each is launched with: softmax 512 threads, the rest 1024.
            let block = if kernel.starts_with("dlbridge_softmax") { dlbridge_cuda::launch::SOFTMAX_MAX_BLOCK } else { 1024 };
            assert!(*regs > 0 && regs * block <= 65_536, "{kernel}: {regs} registers a thread, {block} threads a block");
            assert_eq!(*spill, 0, "{kernel} spills {spill} bytes to local memory");
        }
    }
}
