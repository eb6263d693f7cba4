//! The `dlbridge` command-line tool.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "dlbridge", version, about = "DLPack interop hub: kernels, adapters and conformance checks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build an Array, export it as DLPack, re-import it and show that no byte was copied.
    Demo,
    /// List every registered kernel with its signature and device.
    List {
        /// Also load this plugin library (repeatable) and list its kernels beside the built-in ones.
        #[arg(long = "plugin", value_name = "PATH")]
        plugins: Vec<std::path::PathBuf>,
        /// Also define the Tensor Comprehensions in this file (repeatable; the language of
        /// `dlbridge.define`) and list each definition and its derived backward.
        #[arg(long = "define", value_name = "FILE")]
        defines: Vec<std::path::PathBuf>,
    },
    /// Run the DLPack conformance suite: the Rust cases on dlbridge.Array and the Python matrix
    /// library x rule; or, with --producer / --consumer, the checks on your own library.
    Conformance(ConformanceArgs),
    /// Check a plugin as loading it would (every check but conflicts with kernels already registered) and
    /// show its name, version, ABI version and kernels, without registering them; fails if a check fails.
    Inspect {
        /// Path of the plugin shared library.
        path: std::path::PathBuf,
    },
}

#[derive(clap::Args)]
struct ConformanceArgs {
    /// Check your producer: `module:factory`, where `factory(shape, dtype)` returns a new array
    /// (`dtype` dlbridge's name: f32, i64, ...). Runs only your checks.
    #[arg(long, value_name = "MODULE:FACTORY")]
    producer: Option<String>,
    /// With --producer: `module:factory` making read-only arrays, for the READ_ONLY rules.
    #[arg(long, value_name = "MODULE:FACTORY", requires = "producer")]
    read_only: Option<String>,
    /// With --producer: the dtypes to export, comma-separated (default f32,f64,i32,i64,u8).
    #[arg(long, value_name = "LIST", requires = "producer")]
    dtypes: Option<String>,
    /// Check your consumer: `module:function`, a `from_dlpack` taking any DLPack producer.
    #[arg(long, value_name = "MODULE:FUNCTION")]
    consumer: Option<String>,
    /// The Python interpreter to run the Python checks in (default: $DLBRIDGE_PYTHON, else the
    /// active virtual environment's python, else python3); one that cannot import dlbridge is an error.
    #[arg(long, value_name = "PATH")]
    python: Option<String>,
    /// How long each Python check (and importing your module) may run, in seconds, before it
    /// fails as hung (default 30). The code under test runs in child interpreters: one that
    /// exits, crashes or hangs fails the check it was running, naming how.
    #[arg(long, value_name = "SECONDS", value_parser = positive_seconds)]
    timeout: Option<f64>,
    /// Run only the Rust cases (no Python).
    #[arg(long, conflicts_with_all = ["producer", "consumer", "python", "timeout"])]
    rust_only: bool,
}

fn positive_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s > 0.0 && s.is_finite() => Ok(s),
        _ => Err(format!("expected a number of seconds above 0, got {text:?}")),
    }
}

/// How a command fails: an error (exit status 1), or a command line naming nothing usable
/// (exit status 2, as for any wrong option).
enum Failure {
    Error(dlbridge::Error),
    Usage(String),
}

impl From<dlbridge::Error> for Failure {
    fn from(e: dlbridge::Error) -> Self {
        Failure::Error(e)
    }
}

fn list(plugins: &[std::path::PathBuf], defines: &[std::path::PathBuf]) -> dlbridge::Result<()> {
    let reg = dlbridge::registry();
    for p in plugins {
        reg.load_plugin(p)?;
    }
    let mut defined = std::collections::HashMap::new();
    for file in defines {
        let shown = file.display().to_string();
        let lang = std::fs::read_to_string(file).map_err(|e| dlbridge::Error::InvalidArgument(format!("--define {shown}: {e}")))?;
        for d in dlbridge::compile::tc::define_in(reg, &lang).map_err(|e| e.context(format!("--define {shown}")))? {
            defined.insert(d.registered.name().to_owned(), shown.clone());
            match &d.backward {
                Ok(b) => {
                    defined.insert(b.name().to_owned(), shown.clone());
                }
                Err(why) => eprintln!("{}: no backward: {why}", d.registered.name()),
            }
        }
    }
    let kernels = reg.list();
    // Columns as wide as the longest signature, up to 80 characters (a longer one runs over).
    let width = kernels.iter().map(|k| k.signature_text().len()).max().unwrap_or(0).min(80);
    for k in &kernels {
        let devices: Vec<String> = k.devices().map(|d| d.to_string()).collect();
        let origin = k.origins().next().map(|(_, o)| o).unwrap_or("");
        let from = if origin.starts_with("plugin ") {
            format!("  ({})", origin.split(" (").next().unwrap_or(origin))
        } else if let Some(file) = defined.get(k.name()) {
            format!("  (defined in {file})")
        } else {
            String::new()
        };
        println!("{:<width$}  [{}]  {}{from}", k.signature_text(), devices.join(", "), k.doc());
    }
    println!("{} kernels", kernels.len());
    let problems = reg.problems();
    for p in &problems {
        eprintln!("problem: {p}");
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(dlbridge::Error::Runtime(format!("{} kernel registrations were rejected", problems.len())))
    }
}

/// The Rust cases on the adapters this binary links (dlbridge's own Array; tch and
/// the Python paths run the same suite from their own tests: `cargo test -p
/// dlbridge-tch`, pytest), then the Python checks (see [`python_conformance`]).
fn conformance(args: &ConformanceArgs) -> Result<(), Failure> {
    let mut failures = 0;
    let yours = args.producer.is_some() || args.consumer.is_some();
    if !yours {
        failures += rust_conformance();
        println!();
    }
    if args.rust_only {
        println!("python libraries: not run (--rust-only)");
    } else {
        failures += python_conformance(args)?;
    }
    if failures == 0 { Ok(()) } else { Err(dlbridge::Error::Runtime(format!("{failures} conformance failures")).into()) }
}

fn rust_conformance() -> usize {
    use dlbridge_conformance::{Harness, all_cases, check};
    let harnesses: Vec<Box<dyn Harness>> = vec![Box::new(dlbridge_conformance::array::ArrayHarness)];
    let cases = all_cases();
    let width = cases.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    let mut failures = 0;
    for h in &harnesses {
        println!("{}", h.name());
        for (name, case) in &cases {
            let line = match check(h.as_ref(), name, *case) {
                Ok(report) => report,
                Err(e) => {
                    failures += 1;
                    format!("FAIL: {e}")
                }
            };
            println!("  {name:<width$}  {line}");
        }
    }
    println!("{} adapters x {} cases, {failures} failures", harnesses.len(), cases.len());
    failures
}

/// The interpreter of the Python checks: `--python`, else `$DLBRIDGE_PYTHON`, else the
/// active virtual environment's, else `python3`.
fn python_of(args: &ConformanceArgs) -> String {
    if let Some(p) = &args.python {
        return p.clone();
    }
    if let Ok(p) = std::env::var("DLBRIDGE_PYTHON") {
        return p;
    }
    if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
        let p = std::path::Path::new(&venv).join("bin").join("python");
        if p.exists() {
            return p.to_string_lossy().into_owned();
        }
    }
    "python3".into()
}

/// `python -m dlbridge.testing` (the matrix of every Python library installed, or
/// the checks on `--producer` / `--consumer`): the failures it adds (0 or 1). An
/// interpreter that is missing or cannot import dlbridge is an error (`--rust-only`
/// runs without Python); a `MODULE:NAME` that names nothing usable is a usage error
/// (its one line from Python); a child that dies by a signal, exits with anything but
/// 0 or 3 (3: checks failed), or exits 0 without its report's last line
/// (`... 0 failures`) is a failure.
fn python_conformance(args: &ConformanceArgs) -> Result<usize, Failure> {
    use std::process::Command;
    let python = python_of(args);
    let last_line = |bytes: &[u8]| String::from_utf8_lossy(bytes).lines().last().unwrap_or("").to_string();
    let cannot = |why: String| {
        dlbridge::Error::Runtime(format!(
            "the Python checks could not run: {why} (give an interpreter that has dlbridge with --python or DLBRIDGE_PYTHON, \
             or pass --rust-only)"
        ))
    };
    match Command::new(&python).args(["-c", "import dlbridge"]).output() {
        Err(e) => return Err(cannot(format!("{python}: {e}")).into()),
        Ok(out) if signal_of(&out.status).is_some() => {
            let sig = signal_of(&out.status).unwrap_or_default();
            return Err(cannot(format!("{python} died of {} importing dlbridge", signal_name(sig))).into());
        }
        Ok(out) if !out.status.success() => {
            return Err(cannot(format!("{python} cannot import dlbridge: {}", last_line(&out.stderr))).into());
        }
        Ok(_) => {}
    }
    let mut cmd = Command::new(&python);
    cmd.args(["-m", "dlbridge.testing"]);
    let timeout = args.timeout.map(|s| s.to_string());
    for (flag, value) in [
        ("--producer", &args.producer),
        ("--read-only", &args.read_only),
        ("--dtypes", &args.dtypes),
        ("--consumer", &args.consumer),
        ("--timeout", &timeout),
    ] {
        if let Some(v) = value {
            cmd.args([flag, v]);
        }
    }
    let out = cmd.output().map_err(|e| cannot(format!("{python}: {e}")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    print!("{text}");
    let reported = text.lines().last().is_some_and(|l| l == "0 failures" || l.ends_with(" 0 failures"));
    Ok(if out.status.success() && reported {
        0
    } else if out.status.success() {
        println!("python libraries: FAIL ({python} -m dlbridge.testing exited with status 0 without its report)");
        1
    } else if let Some(sig) = signal_of(&out.status) {
        println!("python libraries: FAIL ({python} -m dlbridge.testing died of {})", signal_name(sig));
        1
    } else if out.status.code() == Some(3) {
        1
    } else if out.status.code() == Some(2) {
        let line = last_line(&out.stderr);
        return Err(Failure::Usage(line.strip_prefix("python -m dlbridge.testing: error: ").unwrap_or(&line).to_string()));
    } else {
        println!("python libraries: FAIL ({python} -m dlbridge.testing exited with {}: {})", out.status, last_line(&out.stderr));
        1
    })
}

/// The signal that killed a child process, if one did.
#[cfg(unix)]
fn signal_of(status: &std::process::ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status.signal()
}

#[cfg(not(unix))]
fn signal_of(_status: &std::process::ExitStatus) -> Option<i32> {
    None
}

fn signal_name(sig: i32) -> String {
    let name = match sig {
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        15 => "SIGTERM",
        _ => return format!("signal {sig}"),
    };
    format!("{name} (signal {sig})")
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo => dlbridge::demo::array_round_trip().map(|report| print!("{report}")).map_err(Failure::from),
        Command::List { plugins, defines } => list(&plugins, &defines).map_err(Failure::from),
        Command::Conformance(args) => conformance(&args),
        Command::Inspect { path } => dlbridge::registry_crate::Plugin::open(&path).map(|p| print!("{}", p.info())).map_err(Failure::from),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Error(e)) => {
            eprintln!("dlbridge: {e}");
            ExitCode::FAILURE
        }
        Err(Failure::Usage(why)) => {
            eprintln!("dlbridge: {why}");
            ExitCode::from(2)
        }
    }
}
