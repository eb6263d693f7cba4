//! The system C++ compiler: which one (`$CXX`, else `c++`, `g++`,
//! `clang++` on `PATH`), its identity (for cache keys), and one compilation
//! of a generated translation unit into a plugin library, with its
//! diagnostics mapped back to the user's text.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use dlbridge_core::{Error, ErrorKind, Result};

/// Flags every CPU kernel is compiled with. Optimised and vectorised for the
/// machine it runs on (`-march=native`: the cache key carries the CPU's
/// features), IEEE semantics kept: no `-ffast-math`, and no contraction of
/// `x * y + b` into one fused multiply-add (`-ffp-contract=off`), so a kernel
/// gives exactly what its expression says, rounding for rounding, as NumPy and
/// torch eager compute it. Signed integers wrap (`-fwrapv`), as NumPy's and
/// torch's do, instead of overflow being undefined (which lets the compiler
/// fold `x + 1 > x` to true).
pub const CXX_FLAGS: &[&str] =
    &["-O3", "-march=native", "-ffp-contract=off", "-fwrapv", "-std=c++17", "-shared", "-fPIC", "-pthread", "-fvisibility=hidden"];

/// Added when the compiler takes them: integer division or modulo by zero in
/// a kernel becomes an error instead of a SIGFPE (see `include/dlbridge_compile/divguard.h`). The
/// check calls a handler the generated source defines, so no sanitizer
/// runtime is linked (`-static-libubsan` keeps GCC from adding libubsan).
pub const DIVGUARD_FLAGS: &[&str] =
    &["-fsanitize=integer-divide-by-zero", "-fno-sanitize-recover=integer-divide-by-zero", "-static-libubsan"];

/// Added with the guard's flags where the linker takes `--wrap` (GNU ld,
/// gold, lld): calls to the C library's integer divisions reach checked
/// versions in `divguard.h` (a `std::div(x, 0)` is then an error too).
pub const DIVGUARD_WRAP: &[&str] = &["-Wl,--wrap=div,--wrap=ldiv,--wrap=lldiv,--wrap=imaxdiv"];

/// [`DIVGUARD_FLAGS`] for compilers without `-static-libubsan` (clang, which
/// links no sanitizer runtime into shared libraries anyway).
pub const DIVGUARD_FLAGS_NO_STATIC: &[&str] = &["-fsanitize=integer-divide-by-zero", "-fno-sanitize-recover=integer-divide-by-zero"];

/// Added when the C library has vector math functions (glibc's libmvec): the
/// generated source then declares their vector variants (`DLBRIDGE_LIBMVEC`).
pub const LIBMVEC_FLAGS: &[&str] = &["-fopenmp-simd", "-DDLBRIDGE_LIBMVEC=1"];

/// The C++ compiler found on this machine.
#[derive(Debug, Clone)]
pub struct Compiler {
    /// The program and any arguments `$CXX` carried (`ccache g++`).
    pub command: Vec<String>,
    /// `--version`'s first line.
    pub version: String,
    /// What the cache key holds of it: the resolved path, the whole `--version`
    /// text and what `-march=native` expands to here.
    pub identity: String,
    /// Whether loops calling libm functions can use glibc's libmvec.
    pub libmvec: bool,
    /// The flags that turn integer division by zero in a kernel into an
    /// error instead of a SIGFPE ([`DIVGUARD_FLAGS`], or the variant this
    /// compiler takes); empty when it takes neither.
    pub divguard: &'static [&'static str],
    /// The directories it searches for `#include <...>` (`-v`'s list),
    /// resolved: what lies there is the system's, not a kernel's text.
    pub system_dirs: Vec<PathBuf>,
}

/// The environment variable that sets how long one run of the compiler (or
/// its preprocessor) may take, in seconds.
pub const TIME_LIMIT_VAR: &str = "DLBRIDGE_COMPILE_TIMEOUT";

/// How long one run of the compiler may take: [`TIME_LIMIT_VAR`] seconds
/// (a positive number), else ten minutes.
pub fn time_limit() -> std::time::Duration {
    limit_from(std::env::var(TIME_LIMIT_VAR).ok().as_deref())
}

/// [`time_limit`] for the variable's text: a positive number of seconds a
/// `Duration` holds, else (unset, garbage, zero, NaN, 1e30) ten minutes.
fn limit_from(text: Option<&str>) -> std::time::Duration {
    text.and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .and_then(|s| std::time::Duration::try_from_secs_f64(s).ok())
        .unwrap_or(std::time::Duration::from_secs(600))
}

/// What [`Compiler::compile_text`] is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// C++ source.
    Source,
    /// C++ already preprocessed (`$CXX -E`'s output).
    Preprocessed,
}

/// Environment variables GCC, Clang and the linker read that change what a
/// build makes (search paths, the driver's prefix and arguments, run paths,
/// dependency output, timestamps). A build is defined by the inputs of its
/// key, never by the caller's environment: none of these reaches the compiler.
const BUILD_ENVIRONMENT: &[&str] = &[
    "CPATH",
    "C_INCLUDE_PATH",
    "CPLUS_INCLUDE_PATH",
    "OBJC_INCLUDE_PATH",
    "OBJCPLUS_INCLUDE_PATH",
    "LIBRARY_PATH",
    "COMPILER_PATH",
    "GCC_EXEC_PREFIX",
    "GCC_COMPARE_DEBUG",
    "GCC_EXTRA_DIAGNOSTIC_OUTPUT",
    "DEPENDENCIES_OUTPUT",
    "SUNPRO_DEPENDENCIES",
    "SOURCE_DATE_EPOCH",
    "CCC_OVERRIDE_OPTIONS",
    "LD_RUN_PATH",
];

/// A command running the compiler `program`, with none of [`BUILD_ENVIRONMENT`].
pub(crate) fn compiler(program: &str) -> Command {
    let mut c = Command::new(program);
    for v in BUILD_ENVIRONMENT {
        c.env_remove(v);
    }
    c
}

/// The directories `command` searches for `#include <...>`, resolved (from
/// `-v`'s "#include <...> search starts here:" list).
fn system_include_dirs(command: &[String]) -> Vec<PathBuf> {
    let Some((program, pre)) = command.split_first() else { return Vec::new() };
    let Ok(out) = compiler(program).args(pre).args(["-E", "-v", "-x", "c++", "/dev/null"]).env("LC_ALL", "C").output() else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&out.stderr);
    text.lines()
        .skip_while(|l| !l.starts_with("#include <...> search starts here:"))
        .skip(1)
        .take_while(|l| !l.starts_with("End of search list."))
        // clang marks framework directories: `/path (framework directory)`.
        .filter_map(|l| std::fs::canonicalize(l.trim().trim_end_matches(" (framework directory)")).ok())
        .collect()
}

/// What to install when no compiler is found.
const INSTALL_HINT: &str = "dlbridge compiles CPU kernels from source with the system C++ compiler: set $CXX to one, or install one \
     (Debian/Ubuntu: `apt install g++`; Fedora: `dnf install gcc-c++`; macOS: `xcode-select --install`)";

impl Compiler {
    /// The process's compiler: found once.
    pub fn get() -> Result<&'static Compiler> {
        static FOUND: OnceLock<std::result::Result<Compiler, String>> = OnceLock::new();
        FOUND.get_or_init(Compiler::find).as_ref().map_err(|m| Error::Coded { kind: ErrorKind::Runtime, message: m.clone() })
    }

    fn find() -> std::result::Result<Compiler, String> {
        let from_env = std::env::var("CXX").ok().filter(|s| !s.trim().is_empty());
        let candidates: Vec<Vec<String>> = match &from_env {
            Some(cxx) => vec![cxx.split_whitespace().map(str::to_owned).collect()],
            None => ["c++", "g++", "clang++"].iter().map(|c| vec![(*c).to_owned()]).collect(),
        };
        // A response file's flags would act on every build unseen by the kernel cache's key.
        if let Some(arg) = candidates.iter().flatten().find(|a| a.starts_with('@')) {
            return Err(format!(
                "CXX names the response file `{arg}`, whose flags the kernel cache's key cannot see: give the flags themselves in CXX"
            ));
        }
        let mut tried = Vec::new();
        for command in candidates {
            let Some(program) = command.first() else { continue };
            match compiler(program).args(&command[1..]).arg("--version").output() {
                Ok(out) if out.status.success() => {
                    let text = String::from_utf8_lossy(&out.stdout).into_owned();
                    let version = text.lines().next().unwrap_or("").trim().to_owned();
                    let resolved = which(program);
                    let path = resolved.as_ref().map_or_else(|| program.clone(), |p| p.display().to_string());
                    // The bytes of the program itself (a wrapper script's flags are in them), and of
                    // every file an argument names (`-specs=FILE`, `-include FILE`).
                    let bytes = resolved.and_then(|p| std::fs::read(p).ok()).map_or_else(String::new, |b| hex_digest(&b));
                    let named: String = command[1..]
                        .iter()
                        .filter_map(|a| named_file(a))
                        .map(|(f, b)| format!("\n{f}: SHA-256 {}", hex_digest(&b)))
                        .collect();
                    let native = native_target(&command);
                    let system_dirs = system_include_dirs(&command);
                    let mut c = Compiler {
                        identity: format!("{path} (SHA-256 {bytes})\n{}{named}\n{text}\n-march=native: {native}", command.join(" ")),
                        command,
                        version,
                        libmvec: false,
                        divguard: &[],
                        system_dirs,
                    };
                    c.libmvec = c.probe_cached("libmvec", Compiler::probe_libmvec);
                    c.divguard = if c.probe_cached("divguard-linked", |c| c.probe_divguard(DIVGUARD_FLAGS)) {
                        DIVGUARD_FLAGS
                    } else if c.probe_cached("divguard-nostatic", |c| c.probe_divguard(DIVGUARD_FLAGS_NO_STATIC)) {
                        DIVGUARD_FLAGS_NO_STATIC
                    } else {
                        &[]
                    };
                    return Ok(c);
                }
                Ok(out) => tried.push(format!("`{} --version` exited with {}", command.join(" "), out.status)),
                Err(e) => tried.push(format!("`{}`: {e}", command.join(" "))),
            }
        }
        let what = if from_env.is_some() { "$CXX does not run" } else { "no C++ compiler found" };
        Err(format!("{what} ({}). {INSTALL_HINT}", tried.join("; ")))
    }

    /// A probe's answer, remembered in the cache directory per compiler
    /// identity (a process that finds its kernels on disk should not pay a
    /// probe compilation).
    /// Only in a directory [`trusted_dir`](dlbridge_registry::trust::trusted_dir) accepts,
    /// only from a regular file, and only an answer sealed by this user's
    /// secret ([`dlbridge_registry::trust::seal`]; a planted "0" could turn the
    /// integer-division guard off).
    fn probe_cached(&self, what: &str, probe: fn(&Compiler) -> bool) -> bool {
        use dlbridge_registry::trust::{TrustedDir, seal, sealed};
        use sha2::{Digest, Sha256};
        let Ok(dir) = TrustedDir::open(&crate::builder::dirs::cpu_cache_dir()) else {
            return probe(self);
        };
        let hash: String = Sha256::digest(self.identity.as_bytes()).iter().take(16).map(|b| format!("{b:02x}")).collect();
        let name = format!("toolchain-{hash}.{what}");
        let sealed_as = |answer: &str| format!("probe {name} {} {answer}", self.identity);
        if let Some(bytes) = dir.read(&name)
            && let Ok(text) = String::from_utf8(bytes)
            && let Some((answer, tag)) = text.trim().split_once(' ')
            && (answer == "1" || answer == "0")
            && sealed(&sealed_as(answer), b"", tag)
        {
            return answer == "1";
        }
        let found = probe(self);
        let answer = if found { "1" } else { "0" };
        // Written whole under an unpredictable name, then renamed, like the libraries.
        let _ = dir.write(&name, format!("{answer} {}\n", seal(&sealed_as(answer), b"")).as_bytes());
        found
    }

    /// Whether a loop calling `tanhf` compiles and links against libmvec
    /// (glibc >= 2.35 on x86-64 has its vector variants; elsewhere this is
    /// false and kernels call the scalar functions).
    fn probe_libmvec(&self) -> bool {
        if !cfg!(all(target_os = "linux", target_arch = "x86_64")) {
            return false;
        }
        let text = "#include <cmath>\nextern \"C\" {\n#pragma omp declare simd notinbranch\nfloat tanhf(float);\n}\n\
                    extern \"C\" void probe(const float* x, float* y, long n) { for (long i = 0; i < n; i++) y[i] = tanhf(x[i]); }\n";
        self.probe_builds(text, LIBMVEC_FLAGS, &["-lmvec"])
    }

    /// Whether a function with an integer division compiles with `flags` and
    /// links with no undefined symbol left (the check must call the handler
    /// the generated sources define, not one of a sanitizer runtime).
    fn probe_divguard(&self, flags: &[&str]) -> bool {
        let text = format!(
            "{}\nextern \"C\" void probe(const int* x, const int* y, int* z, long n) {{\n  \
             dlbridge_divguard::guarded([&] {{ for (long i = 0; i < n; i++) z[i] = x[i] / y[i]; }});\n}}\n",
            include_str!("../../include/dlbridge_compile/divguard.h")
        );
        let link: &[&str] = if cfg!(target_os = "linux") { &["-Wl,--no-undefined", DIVGUARD_WRAP[0]] } else { &[] };
        self.probe_builds(&text, flags, link)
    }

    /// Whether `text` compiles into a shared library with [`CXX_FLAGS`] and
    /// `flags` (in a fresh private directory, removed after), `link` last.
    fn probe_builds(&self, text: &str, flags: &[&str], link: &[&str]) -> bool {
        let Some((program, pre)) = self.command.split_first() else { return false };
        let Ok(dir) = tempfile::Builder::new().prefix("dlbridge-probe-").tempdir() else { return false };
        let (src, so) = (dir.path().join("probe.cpp"), dir.path().join("probe.so"));
        let ok = std::fs::write(&src, text).is_ok()
            && compiler(program)
                .args(pre)
                .args(CXX_FLAGS)
                .args(flags)
                .arg("-o")
                .arg(&so)
                .arg(&src)
                .args(link)
                .output()
                .is_ok_and(|o| o.status.success());
        drop(dir);
        ok
    }

    /// Every flag a kernel is compiled with (the cache key holds them).
    pub fn flags(&self) -> Vec<&'static str> {
        let mut f = CXX_FLAGS.to_vec();
        if self.libmvec {
            f.extend_from_slice(LIBMVEC_FLAGS);
        }
        f.extend_from_slice(self.divguard);
        if !self.divguard.is_empty() && cfg!(target_os = "linux") {
            f.extend_from_slice(DIVGUARD_WRAP);
        }
        f
    }

    /// What the preprocessor makes of `text` (C++ read from a pipe, never
    /// from a path) with every flag a compilation would use and `extra`.
    /// Quoted `#include`s resolve from the root directory (nothing is taken
    /// from a directory another user may change).
    pub fn preprocess_text(&self, text: &str, what: &str, user: &[(&str, &str)], extra: &[String]) -> Result<String> {
        let out = self.run_with_input(&["-E", "-x", "c++", "-"], extra, text, what)?;
        if out.status.success() {
            return String::from_utf8(out.stdout).map_err(|_| Error::Coded {
                kind: ErrorKind::Value,
                message: format!("{what}: the preprocessed kernel is not UTF-8 text"),
            });
        }
        let diag = String::from_utf8_lossy(&out.stderr);
        Err(Error::Coded { kind: ErrorKind::Value, message: explain(what, &self.version, &diag, user) })
    }

    /// Compiles `text` (read from a pipe: C++, or C++ already preprocessed)
    /// into the shared library `so`, with [`Compiler::flags`] and `extra`.
    pub fn compile_text(&self, text: &str, input: Input, so: &Path, what: &str, user: &[(&str, &str)], extra: &[String]) -> Result<()> {
        let lang = match input {
            Input::Source => "c++",
            Input::Preprocessed => "c++-cpp-output",
        };
        let mut args: Vec<String> = extra.to_vec();
        args.extend([
            "-o".to_owned(),
            so.display().to_string(),
            "-x".to_owned(),
            lang.to_owned(),
            "-".to_owned(),
            "-x".to_owned(),
            "none".to_owned(),
        ]);
        if self.libmvec {
            args.push("-lmvec".to_owned());
        }
        let out = self.run_with_input(&[], &args, text, what)?;
        if out.status.success() {
            return Ok(());
        }
        let diag = String::from_utf8_lossy(&out.stderr);
        Err(Error::Coded { kind: ErrorKind::Value, message: explain(what, &self.version, &diag, user) })
    }

    /// Runs the compiler with its flags, `first`, then `rest`, `input` on its
    /// standard input, in the root directory.
    fn run_with_input(&self, first: &[&str], rest: &[String], input: &str, what: &str) -> Result<std::process::Output> {
        use std::io::Write as _;
        use std::process::Stdio;
        let (program, pre) = self.command.split_first().ok_or_else(|| Error::Runtime("empty compiler command".into()))?;
        let mut child = compiler(program)
            .args(pre)
            .args(self.flags())
            .args(rest)
            .args(first)
            .process_group(0)
            .current_dir("/")
            // Diagnostics in English and ASCII quotes, as `explain` reads them.
            .env("LC_ALL", "C")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Error::Runtime(format!("{what}: cannot run `{}`: {e}", self.command.join(" "))))?;
        // Written from another thread: the compiler may fill its output pipes
        // before it has read all of its input.
        let mut stdin = child.stdin.take();
        let text = input.to_owned();
        let writer = std::thread::spawn(move || stdin.take().map(|mut s| s.write_all(text.as_bytes())));
        let out = self.finish(child, what, if first.contains(&"-E") { "the C++ preprocessor" } else { "the C++ compiler" });
        let _ = writer.join();
        out
    }

    /// The output of `child`, a run of this compiler, once it exits; killed
    /// and an error naming `stage` when it runs past [`time_limit`] (a text
    /// that includes a FIFO or a device never finishes preprocessing).
    fn finish(&self, mut child: std::process::Child, what: &str, stage: &str) -> Result<std::process::Output> {
        fn drain<R: std::io::Read + Send + 'static>(r: Option<R>) -> std::thread::JoinHandle<Vec<u8>> {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                if let Some(mut r) = r {
                    let _ = r.read_to_end(&mut buf);
                }
                buf
            })
        }
        let (stdout, stderr) = (drain(child.stdout.take()), drain(child.stderr.take()));
        let limit = time_limit();
        let start = std::time::Instant::now();
        let failed = |e: std::io::Error| Error::Runtime(format!("{what}: `{}` failed: {e}", self.command.join(" ")));
        let status = loop {
            if let Some(status) = child.try_wait().map_err(failed)? {
                break status;
            }
            if start.elapsed() >= limit {
                // The driver and what it started (`cc1plus`, `as`, `ld`): its own
                // process group, so none is left blocked on a FIFO or running on.
                let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", child.id())]).output();
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Coded {
                    kind: ErrorKind::Value,
                    message: format!(
                        "{what}: {stage} did not finish within {} s and was stopped (does the text `#include` a FIFO, a device or \
                         another file that never ends?); {TIME_LIMIT_VAR} sets the limit in seconds",
                        limit.as_secs_f64()
                    ),
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(5).max(start.elapsed() / 50).min(std::time::Duration::from_millis(100)));
        };
        let stdout = stdout.join().unwrap_or_default();
        let stderr = stderr.join().unwrap_or_default();
        Ok(std::process::Output { status, stdout, stderr })
    }

    /// Compiles `source` (written to `cpp`) into the shared library `so`.
    /// A failure is an error carrying the diagnostics, those about the user's
    /// own text first, each with the line it points at.
    pub fn compile(&self, cpp: &Path, so: &Path, what: &str, user: &[(&str, &str)]) -> Result<()> {
        self.compile_with(cpp, so, what, user, &[])
    }

    /// [`Compiler::compile`] with `extra` flags after [`Compiler::flags`]
    /// (`dlbridge.load_inline`'s `extra_cflags`).
    pub fn compile_with(&self, cpp: &Path, so: &Path, what: &str, user: &[(&str, &str)], extra: &[String]) -> Result<()> {
        let (program, pre) = self.command.split_first().ok_or_else(|| Error::Runtime("empty compiler command".into()))?;
        let child = compiler(program)
            .env("LC_ALL", "C")
            .args(pre)
            .args(self.flags())
            .args(extra)
            .arg("-o")
            .arg(so)
            .arg(cpp)
            .args(if self.libmvec { &["-lmvec"][..] } else { &[] })
            .process_group(0)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| Error::Runtime(format!("{what}: cannot run `{}`: {e}", self.command.join(" "))))?;
        let out = self.finish(child, what, "the C++ compiler")?;
        if out.status.success() {
            return Ok(());
        }
        let diag = String::from_utf8_lossy(&out.stderr);
        Err(Error::Coded { kind: ErrorKind::Value, message: explain(what, &self.version, &diag, user) })
    }
}

/// What `-march=native` means to this compiler on this machine: the target
/// options it expands to (GCC: `-march=znver4 -mavx512f ... --param
/// l1-cache-size=32`; clang: `-target-cpu znver4 -target-feature +avx512f
/// ...`), from its `-###` dry run. Two machines whose CPUs differ in any
/// feature the generated code may use get different answers, so different
/// cache keys: a shared or copied cache never runs code the CPU lacks.
fn native_target(command: &[String]) -> String {
    let Some((program, pre)) = command.split_first() else { return String::new() };
    let Ok(out) = compiler(program).args(pre).args(["-march=native", "-###", "-E", "-x", "c++", "/dev/null"]).output() else {
        return String::new();
    };
    let text = String::from_utf8_lossy(&out.stderr);
    let mut options = Vec::new();
    let mut value_of = false;
    for t in text.split_whitespace().map(|t| t.trim_matches('"')) {
        if std::mem::take(&mut value_of) {
            options.push(t);
        } else if matches!(t, "-target-cpu" | "-target-feature" | "--param") {
            options.push(t);
            value_of = true;
        } else if t.starts_with("-m") && !t.starts_with("-mllvm") {
            options.push(t);
        }
    }
    options.join(" ")
}

/// The first `program` on `PATH` (or `program` itself when it has a slash).
/// The file a compiler argument names, and its bytes: the argument itself,
/// a program of that name on `PATH` (`env NAME`), or any part of it after a
/// `=` or a `,` (`-specs=FILE`, `-wrapper sh,FILE`). A directory (`-BDIR`)
/// is none.
fn named_file(arg: &str) -> Option<(String, Vec<u8>)> {
    let parts = std::iter::once(arg).chain(arg.split(['=', ',']).skip(1));
    parts.filter(|p| !p.is_empty()).find_map(|p| {
        let path = if p.contains('/') { Some(PathBuf::from(p)) } else { which(p).or_else(|| Some(PathBuf::from(p))) };
        path.filter(|f| f.is_file()).and_then(|f| std::fs::read(&f).ok().map(|b| (f.display().to_string(), b)))
    })
}

/// The SHA-256 of `bytes`, in hex.
fn hex_digest(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn which(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Path::new(program).canonicalize().ok();
    }
    // The first executable file of that name, as the exec that runs it finds it.
    let executable = |p: &Path| {
        p.is_file() && std::fs::metadata(p).is_ok_and(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0)
    };
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(program)).find(|p| executable(p)).and_then(|p| p.canonicalize().ok())
}

/// Most diagnostic lines an error carries.
pub(crate) const MAX_DIAG_LINES: usize = 40;

/// The error text of a failed compilation: every diagnostic the compiler gave
/// about the user's text (`operation:1:9: error: ...`) as `operation line 1,
/// column 9: error: ...` with that line of the user's text and a caret under
/// the column, then the compiler's own output (capped).
pub fn explain(what: &str, version: &str, diag: &str, user: &[(&str, &str)]) -> String {
    let mut msg = format!("{what}: the C++ compiler ({version}) rejected the kernel");
    let mut mapped = 0;
    for line in diag.lines() {
        let Some((file, rest)) = line.split_once(':') else { continue };
        let Some(text) = user.iter().find(|(f, _)| *f == file).map(|(_, t)| *t) else { continue };
        let mut parts = rest.splitn(3, ':');
        let (Some(l), Some(c), Some(m)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let (Ok(l), Ok(c)) = (l.trim().parse::<usize>(), c.trim().parse::<usize>()) else { continue };
        let m = m.trim();
        if !(m.starts_with("error") || m.starts_with("fatal error")) {
            continue;
        }
        mapped += 1;
        msg.push_str(&format!("\n  {file} line {l}, column {c}: {m}"));
        if m.contains("read-only") {
            msg.push_str(" (inputs are read-only: declare the parameter `mut` to write it in place)");
        }
        if let Some(src) = text.lines().nth(l.saturating_sub(1)) {
            msg.push_str(&format!("\n    {src}\n    {}^", " ".repeat(src.chars().take(c.saturating_sub(1)).count())));
        }
    }
    let lines: Vec<&str> = diag.lines().collect();
    finish_explanation(&mut msg, mapped > 0, "compiler output", &lines);
    msg
}

/// The end of a compile error's explanation, for the system compiler and
/// NVRTC alike: a note when no diagnostic pointed into the user's text, then
/// the compiler's own output under `label`, its first [`MAX_DIAG_LINES`] lines.
pub(crate) fn finish_explanation(msg: &mut String, mapped: bool, label: &str, lines: &[&str]) {
    if !mapped {
        msg.push_str(" (no diagnostic points into the kernel's own text; the generated code failed to compile)");
    }
    msg.push_str(&format!("\n{label}:"));
    for l in lines.iter().take(MAX_DIAG_LINES) {
        msg.push_str("\n  ");
        msg.push_str(l);
    }
    if lines.len() > MAX_DIAG_LINES {
        msg.push_str(&format!("\n  ... ({} more lines)", lines.len() - MAX_DIAG_LINES));
    }
}

/// What `-march=native` means on this machine, for cache keys: the CPU
/// features the code may use.
pub fn cpu_fingerprint() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let feats = [
            ("sse4.2", std::arch::is_x86_feature_detected!("sse4.2")),
            ("avx", std::arch::is_x86_feature_detected!("avx")),
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("fma", std::arch::is_x86_feature_detected!("fma")),
            ("f16c", std::arch::is_x86_feature_detected!("f16c")),
            ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
            ("avx512bw", std::arch::is_x86_feature_detected!("avx512bw")),
            ("avx512vl", std::arch::is_x86_feature_detected!("avx512vl")),
            ("avx512dq", std::arch::is_x86_feature_detected!("avx512dq")),
        ];
        let on: Vec<&str> = feats.iter().filter(|(_, on)| *on).map(|(n, _)| *n).collect();
        // The model too: -march=native tunes for it.
        let model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|t| t.lines().find(|l| l.starts_with("model name")).map(|l| l.to_owned()))
            .unwrap_or_default();
        format!("x86_64 {} {model}", on.join(","))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        std::env::consts::ARCH.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diagnostics_about_the_users_text_point_at_its_line_and_column() {
        let diag = "dlbridge_generated.cpp: In function 'int32_t run(...)':\n\
                    operation:2:9: error: 'q' was not declared in this scope\n\
                    operation:1:3: warning: unused\n";
        let op = "float t = x;\nz = t * q;";
        let m = explain("ElementwiseKernel k (f32)", "g++ 12", diag, &[("operation", op)]);
        assert!(m.starts_with("ElementwiseKernel k (f32): the C++ compiler (g++ 12) rejected the kernel"), "{m}");
        assert!(m.contains("operation line 2, column 9: error: 'q' was not declared in this scope\n    z = t * q;\n            ^"), "{m}");
        assert!(!m.contains("line 1, column 3"), "warnings are not listed as errors: {m}");
        assert!(m.contains("compiler output:\n  dlbridge_generated.cpp: In function"), "{m}");
    }

    #[test]
    fn the_identity_holds_what_march_native_expands_to() {
        let c = Compiler::get().expect("this machine has a C++ compiler (the set-up needs one)");
        let native = c.identity.split("-march=native: ").nth(1).unwrap_or("");
        assert!(native.contains("-march=") || native.contains("-target-cpu"), "no expansion of -march=native in {:?}", c.identity);
    }

    #[test]
    fn writing_an_input_suggests_mut() {
        let diag = "operation:1:3: error: assignment of read-only reference 'x'\n";
        let m = explain("k", "g++", diag, &[("operation", "x = 1")]);
        assert!(m.contains("declare the parameter `mut`"), "{m}");
    }

    #[test]
    fn a_failure_outside_the_users_text_says_so_and_caps_the_output() {
        let diag: String = (0..100).map(|i| format!("gen.cpp:{i}: error: x\n")).collect();
        let m = explain("k", "g++", &diag, &[("operation", "z = x")]);
        assert!(m.contains("no diagnostic points into the kernel's own text"), "{m}");
        assert!(m.contains("(60 more lines)"), "{m}");
    }

    #[test]
    fn glibcs_vector_math_is_used_where_the_c_library_has_it() {
        let lib = std::path::Path::new("/lib/x86_64-linux-gnu/libmvec.so.1");
        let has_tanhf = std::fs::read(lib).is_ok_and(|b| b.windows(14).any(|w| w == b"_ZGVdN8v_tanhf"));
        let c = Compiler::get().expect("a C++ compiler");
        if has_tanhf {
            assert!(c.libmvec, "libmvec has tanhf's vector variants, but the probe did not find them");
            assert!(c.flags().contains(&"-DDLBRIDGE_LIBMVEC=1"));
        } else {
            eprintln!("skipped: no libmvec with tanhf's vector variants at {}", lib.display());
        }
    }

    #[test]
    fn the_time_limit_is_any_positive_number_of_seconds_else_ten_minutes() {
        use std::time::Duration;
        assert_eq!(limit_from(Some(" 2.5 ")), Duration::from_millis(2500));
        for bad in [None, Some(""), Some("soon"), Some("0"), Some("-3"), Some("NaN"), Some("inf"), Some("1e30")] {
            assert_eq!(limit_from(bad), Duration::from_secs(600), "{bad:?}");
        }
    }

    #[test]
    fn the_machines_compiler_is_found_and_identified() {
        match Compiler::get() {
            Ok(c) => {
                assert!(!c.version.is_empty());
                assert!(c.identity.contains(&c.version));
            }
            Err(e) => panic!("this machine has a C++ compiler (the README's set-up needs one): {e}"),
        }
    }
}
