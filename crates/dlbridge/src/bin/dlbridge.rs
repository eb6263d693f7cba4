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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo => dlbridge::demo::array_round_trip().map(|report| print!("{report}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dlbridge: {e}");
            ExitCode::FAILURE
        }
    }
}
