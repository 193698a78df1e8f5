//! `reinforge`: the command line. Parses arguments, sets up logging and turns library errors
//! into one-line messages with a non-zero exit. All logic lives in the library crates.

mod alloc;
mod cmd;

#[global_allocator]
static GLOBAL: alloc::HugePageAlloc = alloc::HugePageAlloc;

use clap::{Parser, Subcommand};
use std::io::IsTerminal;
use std::process::ExitCode;

/// Reinforcement-learning post-training for language models.
#[derive(Parser)]
#[command(name = "reinforge", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a policy with RL (PPO, GRPO, ...) from a TOML config.
    Train(cmd::train::TrainArgs),
    /// Inspect configs.
    #[command(subcommand)]
    Config(cmd::train::ConfigCmd),
    /// Write a checkpoint's policy as a Hugging Face model directory.
    Export(cmd::train::ExportArgs),
    /// Generate datasets.
    #[command(subcommand)]
    Data(cmd::data::DataCmd),
    /// Obtain, import and inspect models.
    #[command(subcommand)]
    Model(cmd::model::ModelCmd),
    /// Generate text from a model with its chat template.
    Generate(cmd::generate::GenerateArgs),
    /// Measure rollout or training throughput and print JSON.
    #[command(subcommand)]
    Bench(cmd::bench::BenchCmd),
    /// Run every case of an RL-algorithm test-vector file; ends with `N passed, M failed`.
    CheckVectors(cmd::vectors::CheckVectorsArgs),
    /// Score a response with a named reward function (for checking reward configs).
    Reward(cmd::reward::RewardArgs),
    /// Serve the live page of run directories (finished, running or copied from a cluster).
    Dashboard(cmd::dashboard::DashboardArgs),
    /// Draw runs' curves into a PNG or SVG figure.
    Plot(cmd::dashboard::PlotArgs),
    /// Search-R1's retrieval server: index a passage corpus (BM25, dense) and serve it.
    #[command(subcommand)]
    Retrieval(cmd::retrieval::RetrievalCmd),
    /// Bring up a Ray cluster (head, workers, token auth), stop it, show its status.
    #[command(subcommand)]
    Cluster(cmd::cluster::ClusterCmd),
    /// Preflight checks on this machine, or on every node of a Ray cluster: placement, memory,
    /// /dev/shm, disk, shared checkpoint directory, binary and versions, ports, interface,
    /// GPUs, clocks. PASS/WARN/FAIL with a fix each; exits non-zero on any FAIL.
    Doctor(cmd::doctor::DoctorArgs),
    /// Submit, list, follow and stop jobs on a Ray cluster.
    #[command(subcommand)]
    Job(cmd::cluster::JobCmd),
    /// Check the CUDA engine against the CPU engine on this node's GPU (logits, greedy
    /// decoding, gradients, AdamW, paged decode, packing); ends with `N passed, M failed`.
    Selftest(cmd::cuda::SelftestArgs),
    /// This node's GPU and CUDA libraries; compile every kernel (the CI check).
    #[command(subcommand)]
    Cuda(cmd::cuda::CudaCmd),
    /// One rank of a worker group (started by Ray for `reinforge train --ray`, not by hand).
    #[command(hide = true)]
    Worker(cmd::train::WorkerArgs),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("REINFORGE_LOG").unwrap_or_else(|_| "warn,reinforge=info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(colour(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR").as_deref()))
        .init();
    // OpenRLHF's flags follow `--openrlhf` and are not ours to parse.
    let (head, tail) = cmd::train::our_words(std::env::args().collect());
    let mut cli = Cli::parse_from(head);
    match &mut cli.command {
        Command::Train(a) => a.openrlhf_args = tail,
        Command::Config(cmd::train::ConfigCmd::Convert(c)) => c.openrlhf_args = tail,
        _ => {}
    }
    // A forced kernel path this CPU lacks is refused before anything runs.
    if let Err(e) = reinforge_kernels::Isa::from_env() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    // The doctor (and the preflight of `train --ray`) looks for the CUDA engine's libraries
    // exactly as the engine does.
    reinforge_cluster::doctor::probe::register_cuda_lib_probe(cmd::cuda::lib_facts);
    let result = match cli.command {
        Command::Train(a) => cmd::train::train(a),
        Command::Config(c) => cmd::train::config(c),
        Command::Export(a) => cmd::train::export(a),
        Command::Data(c) => cmd::data::run(c),
        Command::Model(c) => cmd::model::run(c),
        Command::Generate(a) => cmd::generate::run(a),
        Command::Bench(c) => cmd::bench::run(c),
        Command::CheckVectors(a) => cmd::vectors::run(a),
        Command::Reward(a) => cmd::reward::run(a),
        Command::Retrieval(c) => cmd::retrieval::run(c),
        Command::Dashboard(a) => cmd::dashboard::dashboard(a),
        Command::Plot(a) => cmd::dashboard::plot(a),
        Command::Cluster(c) => cmd::cluster::run_cluster(c),
        Command::Job(c) => cmd::cluster::run_job(c),
        Command::Doctor(a) => cmd::doctor::run(a),
        Command::Selftest(a) => cmd::cuda::selftest(a),
        Command::Cuda(c) => cmd::cuda::run(c),
        Command::Worker(a) => cmd::train::worker(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// Colour escapes only on a terminal, and never when `NO_COLOR` is set to anything non-empty
/// (no-color.org): log files and CI logs get plain text.
fn colour(stderr_is_tty: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_tty && no_color.is_none_or(|v| v.is_empty())
}

/// One line: the chain of causes joined, so the user sees what, where and how to fix — leaving
/// out a cause whose text its parent's message already quotes.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !line.contains(&c) {
            line.push_str(": ");
            line.push_str(&c);
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_lines_do_not_repeat_their_cause() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory (os error 2)");
        let quoted = anyhow::Error::new(io).context("cannot read config /x.toml: No such file or directory (os error 2)");
        assert_eq!(one_line(&quoted), "cannot read config /x.toml: No such file or directory (os error 2)");
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory (os error 2)");
        let plain = anyhow::Error::new(io).context("opening data/x.parquet");
        assert_eq!(one_line(&plain), "opening data/x.parquet: No such file or directory (os error 2)");
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(!colour(false, None));
        assert!(!colour(true, Some(std::ffi::OsStr::new("1"))));
        assert!(colour(true, Some(std::ffi::OsStr::new(""))));
    }
}
