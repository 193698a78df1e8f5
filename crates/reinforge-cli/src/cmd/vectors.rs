//! `reinforge check-vectors FILE`.

use anyhow::Result;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct CheckVectorsArgs {
    /// A test-vector file in the `rl-algorithms-testvectors` format.
    file: PathBuf,
    /// Print every case, not only failures.
    #[arg(long, short)]
    verbose: bool,
}

pub fn run(a: CheckVectorsArgs) -> Result<ExitCode> {
    let report = reinforge_algos::run_vector_file(&a.file)?;
    for c in &report.cases {
        if !c.passed {
            println!("FAIL {} ({}): {}", c.id, c.function, c.detail);
        } else if a.verbose {
            println!("ok   {} ({})", c.id, c.function);
        }
    }
    println!("{} passed, {} failed", report.passed, report.failed);
    Ok(if report.failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
