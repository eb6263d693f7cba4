use std::process::Command;

#[test]
fn demo_command_reports_equal_pointers() {
    let out = Command::new(env!("CARGO_BIN_EXE_dlbridge")).arg("demo").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("pointers equal = true"), "{text}");
    assert!(text.contains("strides [1, 4]"), "{text}");
}

#[test]
fn unknown_command_fails_with_usage() {
    let out = Command::new(env!("CARGO_BIN_EXE_dlbridge")).arg("frobnicate").output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("Usage"));
}

fn dlbridge(args: &[&std::ffi::OsStr]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dlbridge")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn list_prints_every_builtin_kernel_with_signature_and_device() {
    let (ok, text, err) = dlbridge(&["list".as_ref()]);
    assert!(ok, "{err}");
    assert!(text.contains("matmul<T: f32|f64>(a: T[M, K], b: T[K, N]) -> (c: T[M, N])"), "{text}");
    assert!(text.contains("[cpu]"));
    assert!(text.lines().last().unwrap().ends_with("15 kernels"), "{text}");
}

#[test]
fn inspect_shows_a_plugin_and_list_shows_it_beside_the_builtins() {
    let lib = dlbridge_plugin_c::path("example_c");
    let (ok, text, err) = dlbridge(&["inspect".as_ref(), lib.as_os_str()]);
    assert!(ok, "{err}");
    assert!(text.contains("plugin  example-c 1.0.0"), "{text}");
    assert!(text.contains("abi     1"), "{text}");
    assert!(text.contains("c_saxpy(alpha: f64, x: f32[N], y: mut f32[N])  [cpu]"), "{text}");
    let (ok, text, err) = dlbridge(&["list".as_ref(), "--plugin".as_ref(), lib.as_os_str()]);
    assert!(ok, "{err}");
    assert!(text.contains("c_dot(a: f64[N], b: f64[N]) -> (out: f64[])") && text.contains("(plugin example-c 1.0.0)"), "{text}");
    assert!(text.contains("softmax<"), "{text}");
    assert!(text.lines().last().unwrap().ends_with("18 kernels"), "{text}");
}

#[test]
fn list_defines_tensor_comprehensions_from_a_file_and_names_the_file() {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/tc/layers.tc");
    let (ok, text, err) = dlbridge(&["list".as_ref(), "--define".as_ref(), file.as_ref()]);
    assert!(ok, "{err}");
    let line = text.lines().find(|l| l.starts_with("fcrelu<")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("(I: T[B, M], W1: T[N, M], B1: T[N]) -> (O1: T[B, N])") && line.contains("[cpu, cuda]"), "{line}");
    assert!(line.ends_with(&format!("(defined in {file})")), "{line}");
    assert!(text.contains("avgpool<T: f32|f64|f16|bf16>(input: T[B, C, H, W]) -> (output: T[B, C, ((H - 2) / 2 + 1), ((W - 2) / 2 + 1)])"));
    assert!(text.lines().any(|l| l.starts_with("fcrelu_backward<")), "{text}");
    assert!(text.lines().last().unwrap().ends_with("19 kernels"), "{text}");
    // Text that does not parse: the file, the line and the column, and a failure.
    let broken = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("broken.tc");
    std::fs::write(&broken, "def broken(float(N) x) -> (y) {\n  y(i) = x(j\n}\n").unwrap();
    let (ok, _, err) = dlbridge(&["list".as_ref(), "--define".as_ref(), broken.as_os_str()]);
    assert!(!ok && err.contains("broken.tc") && err.contains("line 3, column 1"), "{err}");
    let (ok, _, err) = dlbridge(&["list".as_ref(), "--define".as_ref(), "no/such/file.tc".as_ref()]);
    assert!(!ok && err.contains("no/such/file.tc"), "{err}");
}

#[test]
fn inspect_reports_a_broken_plugin_and_fails() {
    let lib = dlbridge_plugin_c::path("future_abi");
    let (ok, _, err) = dlbridge(&["inspect".as_ref(), lib.as_os_str()]);
    assert!(!ok);
    assert!(err.contains("ABI version 7") && err.contains("libdlbridge_plugin_future_abi.so"), "{err}");
}

#[test]
fn conformance_prints_the_table_and_passes() {
    let (ok, text, err) = dlbridge(&["conformance".as_ref(), "--rust-only".as_ref()]);
    assert!(ok, "{err}\n{text}");
    assert!(text.contains("dlbridge.Array (Rust)"), "{text}");
    assert!(text.contains("deleter_runs_exactly_once") && text.contains("pass"), "{text}");
    assert!(text.contains("1 adapters x 15 cases, 0 failures"), "{text}");
    assert!(text.contains("python libraries: not run (--rust-only)"), "{text}");
}

/// The interpreter the CLI picks by default, and whether it has dlbridge.
fn default_python() -> (String, bool) {
    let python = std::env::var("DLBRIDGE_PYTHON").ok().or_else(|| {
        let venv = std::env::var_os("VIRTUAL_ENV")?;
        let p = std::path::Path::new(&venv).join("bin/python");
        p.exists().then(|| p.to_string_lossy().into_owned())
    });
    let python = python.unwrap_or_else(|| "python3".into());
    let has = Command::new(&python).args(["-c", "import dlbridge"]).output().is_ok_and(|o| o.status.success());
    (python, has)
}

/// The default interpreter where it has dlbridge; else `None`, said as a skip
/// (the test above asserts the error the CLI gives then).
fn python_with_dlbridge() -> Option<String> {
    let (python, has) = default_python();
    if !has {
        eprintln!("skipped: {python} cannot import dlbridge");
    }
    has.then_some(python)
}

/// `dlbridge conformance --python PYTHON ARGS..` run in `dir`: its exit code, stdout and stderr.
fn conformance_in(dir: &std::path::Path, python: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dlbridge"))
        .args(["conformance", "--python", python])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn conformance_runs_the_python_matrix_or_fails_saying_why() {
    let (ok, text, err) = dlbridge(&["conformance".as_ref()]);
    match default_python() {
        // ./dev.sh test: the virtual environment has dlbridge.
        (_, true) => {
            assert!(ok, "{err}\n{text}");
            assert!(text.contains("producer.capsule_is_consumed_once") && text.contains(" rules, 0 failures"), "{text}");
        }
        // A plain `cargo test`: no dlbridge in Python is an error, never a silent skip.
        (python, false) => {
            assert!(!ok, "{text}");
            assert!(err.contains("the Python checks could not run") && err.contains(&python) && err.contains("--rust-only"), "{err}");
        }
    }
    let (ok, _, err) = dlbridge(&["conformance".as_ref(), "--python".as_ref(), "/nonexistent/python".as_ref()]);
    assert!(!ok);
    assert!(err.contains("the Python checks could not run: /nonexistent/python:"), "{err}");
}

#[test]
fn conformance_checks_a_producer_of_your_own() {
    let Some(python) = python_with_dlbridge() else { return };
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/conformance");
    let run = |factory: &str| {
        let (code, text, _) = conformance_in(&dir, &python, &["--producer", factory]);
        (code, text)
    };
    let (code, text) = run("boxed:make");
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("exports_are_zero_copy") && text.trim_end().ends_with("0 failures"), "{text}");
    assert!(!text.contains("dlbridge.Array (Rust)"), "only the library asked about: {text}");
    let (code, text) = run("boxed:make_careless");
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("stream_on_cpu_must_be_none                    fail: stream=5 on a CPU tensor was accepted (f32, f64, i32, i64, u8)"),
        "{text}"
    );
    assert!(text.trim_end().ends_with("3 failures"), "{text}");
    // The three failures share one cause, said first, and each says its rule and its fix.
    assert!(text.contains("root cause: __dlpack__ ignores its keywords"), "{text}");
    assert_eq!(text.matches("      fix:  ").count(), 3, "{text}");
    assert!(text.contains("      rule: array API standard, __dlpack__: stream is None for CPU arrays"), "{text}");
}

#[test]
fn conformance_fails_a_factory_that_exits_or_hangs_and_refuses_a_name_that_names_nothing() {
    let Some(python) = python_with_dlbridge() else { return };
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("conformance_box");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("badlib.py"),
        "import sys, time\n\ndef exits(shape, dtype):\n    sys.exit(0)\n\ndef hangs(shape, dtype):\n    time.sleep(600)\n",
    )
    .unwrap();
    let run = |args: &[&str]| conformance_in(&dir, &python, args);
    // Exiting with status 0 is a failure that says so, never a passing run without a report.
    let (code, text, err) = run(&["--producer", "badlib:exits", "--timeout", "5"]);
    assert_eq!(code, Some(1), "{text}{err}");
    assert!(text.contains("fail: the factory exited with status 0 before reporting"), "{text}");
    assert!(text.trim_end().ends_with("16 rules: 0 passed, 0 skipped, 16 failures"), "{text}");
    let start = std::time::Instant::now();
    let (code, text, err) = run(&["--producer", "badlib:hangs", "--timeout", "1"]);
    assert_eq!(code, Some(1), "{text}{err}");
    assert!(text.contains("fail: the factory did not finish within 1 s"), "{text}");
    assert!(start.elapsed() < std::time::Duration::from_secs(25), "{:?}", start.elapsed());
    // A name that names nothing: one line, exit status 2.
    for (spec, says) in [
        ("badlib", "dlbridge: --producer badlib: no colon: expected MODULE:NAME (e.g. mylib:zeros)"),
        ("badlib:nothing", "dlbridge: --producer badlib:nothing: badlib has no attribute nothing"),
    ] {
        let (code, text, err) = run(&["--producer", spec]);
        assert_eq!(code, Some(2), "{text}{err}");
        assert_eq!(err.trim_end(), says);
    }
    let (code, _, err) = run(&["--producer", "badlib:exits", "--timeout", "0"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("expected a number of seconds above 0"), "{err}");
}

#[cfg(unix)]
#[test]
fn conformance_fails_when_the_python_checks_exit_0_without_their_report() {
    use std::os::unix::fs::PermissionsExt;
    // An "interpreter" that imports anything and exits 0 at once, as a factory calling sys.exit(0) would.
    let fake = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("exits_0_python");
    std::fs::write(&fake, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (ok, text, err) = dlbridge(&["conformance".as_ref(), "--producer".as_ref(), "m:f".as_ref(), "--python".as_ref(), fake.as_os_str()]);
    assert!(!ok, "{text}");
    assert!(text.contains("-m dlbridge.testing exited with status 0 without its report"), "{text}{err}");
}

#[test]
fn inspect_fails_for_every_plugin_that_would_fail_to_load() {
    // A signature that does not parse, a kernel declared twice for one device:
    // inspect runs the loader's checks, not only the table's.
    for (variant, needle) in
        [("bad_signature", "signature error at column"), ("duplicate_kernel", "kernel c_dot on cpu is registered twice")]
    {
        let lib = dlbridge_plugin_c::path(variant);
        let (ok, text, err) = dlbridge(&["inspect".as_ref(), lib.as_os_str()]);
        assert!(!ok, "{variant}: inspect succeeded:\n{text}");
        assert!(err.contains(needle) && err.contains(&format!("libdlbridge_plugin_{variant}.so")), "{variant}: {err}");
    }
    // Conflicts with kernels already registered are the only check left to
    // loading: inspect registers nothing, so this plugin passes it.
    let lib = dlbridge_plugin_c::path("cuda_add_then_conflict");
    let (ok, text, err) = dlbridge(&["inspect".as_ref(), lib.as_os_str()]);
    assert!(ok, "{err}");
    assert!(text.contains("add<T: f32|f64|f16|bf16|i32|i64>(a: T[...S], b: T[...S]) -> (out: T[...S])  [cuda]"), "{text}");
    // ... while `list --plugin` registers it beside the built-ins and fails: the
    // CLI links dlbridge-cuda, whose built-in `cuda` add is already there.
    let (ok, _, err) = dlbridge(&["list".as_ref(), "--plugin".as_ref(), lib.as_os_str()]);
    assert!(!ok);
    assert!(err.contains("kernels[0] (add): kernel add on cuda is registered twice: by built-in (kernels/cuda/"), "{err}");
}

#[test]
fn inspect_refuses_a_one_megabyte_signature_fast_with_a_short_message() {
    let lib = dlbridge_plugin_c::path("huge_signature");
    let start = std::time::Instant::now();
    let (ok, _, err) = dlbridge(&["inspect".as_ref(), lib.as_os_str()]);
    let took = start.elapsed();
    eprintln!("inspect huge_signature: {took:?}, {} bytes on stderr", err.len());
    assert!(!ok);
    assert!(err.contains("`kernels[0].signature` is longer than 4096 bytes"), "{err}");
    assert!(err.len() < 1024, "{} bytes: {}", err.len(), &err[..err.len().min(2000)]);
    assert!(took < std::time::Duration::from_secs(5), "{took:?}");
}

#[test]
fn inspect_of_a_missing_file_fails_and_names_it() {
    let (ok, _, err) = dlbridge(&["inspect".as_ref(), "/nonexistent/libnothing.so".as_ref()]);
    assert!(!ok);
    assert!(err.contains("no such file: /nonexistent/libnothing.so"), "{err}");
}
