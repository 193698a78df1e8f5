//! `reinforge data gen`: write generated task datasets in verl's schema.

use anyhow::{bail, Result};
use clap::{Subcommand, ValueEnum};
use reinforge_data::gen;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Clone, Copy, ValueEnum)]
pub enum Task {
    /// TinyZero-style Countdown puzzles.
    Countdown,
    /// Small arithmetic questions.
    Arith,
}

#[derive(Subcommand)]
pub enum DataCmd {
    /// Generate a task dataset (.parquet or .jsonl).
    Gen {
        /// Which task.
        task: Task,
        /// Rows.
        #[arg(long)]
        n: usize,
        /// Output file; the extension picks the format.
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Largest operand (arith) or number (countdown).
        #[arg(long)]
        max_number: Option<u64>,
    },
}

pub fn run(c: DataCmd) -> Result<ExitCode> {
    let DataCmd::Gen { task, n, out, seed, max_number } = c;
    let rows = match task {
        Task::Countdown => {
            let mut cfg = gen::CountdownConfig::default();
            if let Some(m) = max_number {
                cfg.max_number = m;
            }
            gen::countdown(n, seed, &cfg)?
        }
        Task::Arith => {
            let mut cfg = gen::ArithConfig::default();
            if let Some(m) = max_number {
                cfg.max_operand = m;
            }
            gen::arith(n, seed, &cfg)?
        }
    };
    match out.extension().and_then(|e| e.to_str()) {
        Some("parquet") => reinforge_data::write_parquet(&out, &rows)?,
        Some("jsonl") => reinforge_data::write_jsonl(&out, &rows)?,
        _ => bail!("{}: use a .parquet or .jsonl file name", out.display()),
    }
    eprintln!("wrote {n} rows to {}", out.display());
    Ok(ExitCode::SUCCESS)
}
