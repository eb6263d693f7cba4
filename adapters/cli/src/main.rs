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
    },
    /// Run the DLPack conformance suite and print the table adapter x case.
    Conformance,
    /// Check a plugin as loading it would (every check but conflicts with kernels already registered) and
    /// show its name, version, ABI version and kernels, without registering them; fails if a check fails.
    Inspect {
        /// Path of the plugin shared library.
        path: std::path::PathBuf,
    },
}

fn list(plugins: &[std::path::PathBuf]) -> dlbridge::Result<()> {
    let reg = dlbridge::registry();
    for p in plugins {
        reg.load_plugin(p)?;
    }
    let kernels = reg.list();
    let width = kernels.iter().map(|k| k.signature_text().len()).max().unwrap_or(0);
    for k in &kernels {
        let devices: Vec<String> = k.devices().map(|d| d.to_string()).collect();
        let origin = k.origins().next().map(|(_, o)| o).unwrap_or("");
        let from =
            if origin.starts_with("plugin ") { format!("  ({})", origin.split(" (").next().unwrap_or(origin)) } else { String::new() };
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

/// The adapters this binary links: dlbridge's own Array. (tch and the Python paths
/// run the same suite from their own tests: `cargo test -p dlbridge-tch`, pytest.)
fn conformance() -> dlbridge::Result<()> {
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
    // The Python libraries (torch, NumPy, JAX, pyarrow, array-api-strict, PaddlePaddle,
    // dlbridge.Array) as producers and consumers run through dlbridge.testing, in the
    // interpreter named by DLBRIDGE_PYTHON (default python3).
    let python = std::env::var("DLBRIDGE_PYTHON").unwrap_or_else(|_| "python3".into());
    println!();
    failures += python_conformance(&python);
    if failures == 0 { Ok(()) } else { Err(dlbridge::Error::Runtime(format!("{failures} conformance failures"))) }
}

/// `python -m dlbridge.testing`: the failures it adds (0 or 1). An interpreter that is missing
/// or cannot import dlbridge is a skip; a child that dies by a signal (a library crashing the
/// process) or exits with anything but 0 or 3 (3: checks failed) is a failure, never a skip.
fn python_conformance(python: &str) -> usize {
    use std::process::Command;
    let last_line = |bytes: &[u8]| String::from_utf8_lossy(bytes).lines().last().unwrap_or("").to_string();
    match Command::new(python).args(["-c", "import dlbridge"]).output() {
        Err(e) => {
            println!("python libraries: skipped ({python}: {e})");
            return 0;
        }
        Ok(out) if signal_of(&out.status).is_some() => {
            let sig = signal_of(&out.status).unwrap_or_default();
            println!("python libraries: FAIL ({python} died of {} importing dlbridge)", signal_name(sig));
            return 1;
        }
        Ok(out) if !out.status.success() => {
            println!("python libraries: skipped ({python} cannot import dlbridge: {})", last_line(&out.stderr));
            return 0;
        }
        Ok(_) => {}
    }
    match Command::new(python).args(["-m", "dlbridge.testing"]).output() {
        Err(e) => {
            println!("python libraries: FAIL ({python}: {e})");
            1
        }
        Ok(out) => {
            print!("{}", String::from_utf8_lossy(&out.stdout));
            if out.status.success() {
                0
            } else if let Some(sig) = signal_of(&out.status) {
                println!("python libraries: FAIL ({python} -m dlbridge.testing died of {})", signal_name(sig));
                1
            } else if out.status.code() == Some(3) {
                1
            } else {
                println!("python libraries: FAIL ({python} -m dlbridge.testing exited with {}: {})", out.status, last_line(&out.stderr));
                1
            }
        }
    }
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
        Command::Demo => dlbridge::demo::array_round_trip().map(|report| print!("{report}")),
        Command::List { plugins } => list(&plugins),
        Command::Conformance => conformance(),
        Command::Inspect { path } => dlbridge::registry_crate::Plugin::open(&path).map(|p| print!("{}", p.info())),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dlbridge: {e}");
            ExitCode::FAILURE
        }
    }
}
