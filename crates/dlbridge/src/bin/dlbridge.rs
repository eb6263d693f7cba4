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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo => dlbridge::demo::array_round_trip().map(|report| print!("{report}")),
        Command::List { plugins } => list(&plugins),
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
