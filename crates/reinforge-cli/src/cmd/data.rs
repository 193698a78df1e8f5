//! `reinforge data gen`: write generated task datasets in verl's schema.

use anyhow::{bail, Context, Result};
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
    /// A self-contained search task (Search-R1's format): questions about invented entities
    /// and the corpus that answers them; --out is a directory (train.parquet, test.parquet,
    /// corpus.jsonl).
    Search,
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
        /// search: invented entities in the corpus.
        #[arg(long)]
        entities: Option<usize>,
        /// search: held-out questions (test.parquet).
        #[arg(long)]
        test: Option<usize>,
        /// search: the prompt, with `{question}` where the question goes (default: Search-R1's
        /// instruction template, verbatim).
        #[arg(long)]
        template: Option<String>,
    },
}

pub fn run(c: DataCmd) -> Result<ExitCode> {
    let DataCmd::Gen { task, n, out, seed, max_number, entities, test, template } = c;
    let rows = match task {
        Task::Search => return search(n, &out, seed, entities, test, template),
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

/// `data gen search`: a directory with the questions (train/test, Search-R1's columns) and
/// the corpus to index.
fn search(n: usize, out: &std::path::Path, seed: u64, entities: Option<usize>, test: Option<usize>, template: Option<String>) -> Result<ExitCode> {
    let mut cfg = gen::SearchTaskConfig { template, ..Default::default() };
    if let Some(e) = entities {
        cfg.entities = e;
    }
    if let Some(t) = test {
        cfg.test = t;
    }
    if out.extension().is_some() {
        bail!("{}: `data gen search` writes a directory (train.parquet, test.parquet, corpus.jsonl); give a directory name", out.display());
    }
    let task = gen::search_task(n, seed, &cfg)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    reinforge_data::write_parquet(out.join("train.parquet"), &task.train)?;
    reinforge_data::write_parquet(out.join("test.parquet"), &task.test)?;
    let corpus: String = task
        .corpus
        .iter()
        .map(|(id, contents)| serde_json::json!({"id": id, "contents": contents}).to_string() + "\n")
        .collect();
    let path = out.join("corpus.jsonl");
    let tmp = out.join(".corpus.jsonl.tmp");
    std::fs::write(&tmp, corpus).and_then(|_| std::fs::rename(&tmp, &path)).with_context(|| format!("writing {}", path.display()))?;
    eprintln!(
        "wrote {} train and {} test questions about {} entities, and their corpus, to {}",
        task.train.len(),
        task.test.len(),
        task.corpus.len(),
        out.display()
    );
    eprintln!("next: reinforge retrieval index --corpus {}/corpus.jsonl --out {}/index", out.display(), out.display());
    Ok(ExitCode::SUCCESS)
}
