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
    /// Show a plugin's name, version, ABI version and kernels (without registering them).
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
        let from = if origin.starts_with("plugin ") { format!("  ({})", origin.split(" (").next().unwrap_or(origin)) } else { String::new() };
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
    // The Python producers (torch, NumPy, dlbridge.Array) run the same rules through
    // dlbridge.testing, in the interpreter named by DLBRIDGE_PYTHON (default python3).
    let python = std::env::var("DLBRIDGE_PYTHON").unwrap_or_else(|_| "python3".into());
    println!();
    match std::process::Command::new(&python).args(["-m", "dlbridge.testing"]).output() {
        Ok(out) if out.status.success() || out.status.code() == Some(3) => {
            print!("{}", String::from_utf8_lossy(&out.stdout));
            if !out.status.success() {
                failures += 1;
            }
        }
        Ok(out) => println!("python producers: skipped ({python} cannot import dlbridge: {})", String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")),
        Err(e) => println!("python producers: skipped ({python}: {e})"),
    }
    if failures == 0 { Ok(()) } else { Err(dlbridge::Error::Runtime(format!("{failures} conformance failures"))) }
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
