//! `reinforge generate`: chat with a model (greedy by default, so answers are reproducible).

use super::load_model;
use anyhow::{bail, Result};
use clap::Args;
use reinforge_engine::{generate, SamplingParams};
use reinforge_tokenizer::RenderOptions;
use serde_json::json;
use std::process::ExitCode;

#[derive(Args)]
pub struct GenerateArgs {
    /// Model name (see `reinforge model list`) or Hugging Face directory.
    #[arg(long)]
    model: String,
    /// The user message (repeat for a batch of prompts).
    #[arg(long, required = true)]
    prompt: Vec<String>,
    /// A system message (else the template's default).
    #[arg(long)]
    system: Option<String>,
    /// Feed the prompt as raw text, without the chat template.
    #[arg(long)]
    raw: bool,
    /// New tokens at most.
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// 0 = off.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Samples per prompt.
    #[arg(long, default_value_t = 1)]
    n: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop when the text contains this string (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Print JSON (ids, log-probs, finish reasons) instead of text.
    #[arg(long)]
    json: bool,
    /// `cpu` (default) or `cuda[:N]`.
    #[arg(long, default_value = "cpu")]
    device: String,
}

pub fn run(a: GenerateArgs) -> Result<ExitCode> {
    let loaded = load_model(&a.model, &a.device, false)?;
    let tok = loaded.tok.tokenizer();
    let mut prompts = Vec::new();
    for p in &a.prompt {
        let ids = if a.raw {
            tok.encode(p, true)?
        } else {
            let mut msgs = Vec::new();
            if let Some(s) = &a.system {
                msgs.push(json!({"role": "system", "content": s}));
            }
            msgs.push(json!({"role": "user", "content": p}));
            loaded.tok.encode_chat(&msgs, &RenderOptions::generation(true))?
        };
        if ids.is_empty() {
            bail!("prompt {p:?} encodes to no tokens");
        }
        prompts.push(ids);
    }
    let stop_ids = if a.ignore_eos { Vec::new() } else { reinforge_engine::stop_token_ids(tok, &loaded.model.config) };
    let params = SamplingParams {
        n: a.n,
        temperature: a.temperature,
        top_p: a.top_p,
        top_k: a.top_k,
        max_new_tokens: a.max_new_tokens,
        stop_token_ids: stop_ids,
        stop_strings: a.stop.clone(),
        seed: a.seed,
        first_prompt: 0,
        prompt_keys: Vec::new(),
        max_new_tokens_per_prompt: Vec::new(),
    };
    let (outs, _) = generate(&loaded.model, &prompts, &params, Some(tok))?;
    for c in outs {
        let text = tok.decode(&c.token_ids, true)?;
        if a.json {
            println!("{}", json!({"prompt_index": c.prompt_index, "sample_index": c.sample_index, "text": text,
                "token_ids": c.token_ids, "logprobs": c.logprobs, "finish_reason": c.finish_reason}));
        } else {
            println!("{text}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
