//! `reinforge reward`: score one response with a reward chosen by name (config debugging).

use anyhow::{Context, Result};
use clap::Args;
use reinforge_reward::{RewardInput, RewardSpec};
use std::process::ExitCode;

#[derive(Args)]
pub struct RewardArgs {
    /// Reward kind: countdown, math, qa_em, qa_f1, format, length, remote, python, combined, router, reward_model.
    #[arg(long)]
    kind: String,
    /// The kind's parameters as JSON (e.g. '{"format_score": 0.1}').
    #[arg(long, default_value = "null")]
    params: String,
    /// The response text to score.
    #[arg(long)]
    response: String,
    /// Reference answer as JSON (a string needs quotes: '"42"').
    #[arg(long, default_value = "null")]
    ground_truth: String,
    /// The row's data_source (used by the router).
    #[arg(long, default_value = "")]
    data_source: String,
}

pub fn run(a: RewardArgs) -> Result<ExitCode> {
    let params = serde_json::from_str(&a.params).context("--params is not valid JSON")?;
    let ground_truth = serde_json::from_str(&a.ground_truth).context("--ground-truth is not valid JSON (quote strings: '\"42\"')")?;
    let reward = reinforge_trainer::reward_model::registry().build(&RewardSpec::with_params(a.kind, params))?;
    let out = reward.score(&RewardInput {
        data_source: a.data_source,
        prompt: String::new(),
        response: a.response,
        ground_truth,
        extra_info: serde_json::Value::Null,
    })?;
    println!("{}", serde_json::to_string(&out)?);
    Ok(ExitCode::SUCCESS)
}
