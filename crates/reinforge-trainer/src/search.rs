//! Search-R1's multi-turn rollouts (`search_r1/llm_agent/generation.py`), token in, token out.
//!
//! Each trajectory starts from its prompt. A turn samples up to `data.max_response_length`
//! tokens and stops at `</search>` or `</answer>`; the turn's text (decoded, special tokens
//! dropped) holds its action, the first `<search>…</search>` or `<answer>…</answer>`:
//!
//! - a search: the queries of every live trajectory go to the retrieval server in one
//!   request, and each gets `\n\n<information>Doc 1(Title: …) …</information>\n\n`, at most
//!   `max_obs_length` tokens of it;
//! - an answer: the trajectory is done;
//! - neither: Search-R1's corrective observation ("My previous action is invalid. …").
//!
//! After `max_turns` such rounds, live trajectories get one last turn without retrieval. The
//! trajectory grows by appending ids: the model's tokens exactly as sampled (the stop
//! string's token included), then the observation's tokens — never by re-rendering text,
//! which changes earlier tokens for some tokenizers. A mask tells model tokens (trained on)
//! from observation tokens (context only).
//!
//! Where this differs from Search-R1, on purpose: a turn that ends with the model's
//! end-of-sequence token ends its trajectory (Search-R1 strips the token, re-tokenises the
//! text and asks again); the sampled tokens are kept as sampled (Search-R1 cuts the text
//! after the first stop string and re-tokenises it).

use std::time::Duration;

use reinforge_engine::{FinishReason, SamplingParams};
use reinforge_retrieval::{RetrievalClient, ScoredDoc};
use reinforge_tokenizer::Tokenizer;
use serde::{Deserialize, Serialize};

use crate::config::SearchConfig;
use crate::error::TrainError;
use crate::multi_turn::{Flavour, Growing, MultiTurnRollout, ToolResults, TurnGenerator};

/// Search-R1's observation after a turn with neither a search nor an answer, verbatim.
pub const INVALID_ACTION: &str = "\nMy previous action is invalid. If I want to search, I should put the query between <search> and </search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again.\n";

/// The strings that end a turn.
pub const TURN_STOPS: [&str; 2] = ["</search>", "</answer>"];

/// What a turn asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// `<search>query</search>` (the query trimmed).
    Search(String),
    /// `<answer>text</answer>`.
    Answer(String),
    /// Neither tag pair.
    Invalid,
}

/// The first `<search>…</search>` or `<answer>…</answer>` of `text`, whichever starts first
/// (Search-R1's `re.search(r'<(search|answer)>(.*?)</\1>', text, re.DOTALL)`).
pub fn parse_action(text: &str) -> Action {
    for (i, _) in text.char_indices() {
        for (tag, make) in [("search", Action::Search as fn(String) -> Action), ("answer", Action::Answer)] {
            let open = format!("<{tag}>");
            if let Some(rest) = text[i..].strip_prefix(&open) {
                if let Some(end) = rest.find(&format!("</{tag}>")) {
                    return make(rest[..end].trim().to_string());
                }
            }
        }
    }
    Action::Invalid
}

/// Passages as Search-R1 shows them: `Doc 1(Title: "T") text\n` each (the title keeps the
/// corpus's quotes).
pub fn format_passages(docs: &[ScoredDoc]) -> String {
    docs.iter().enumerate().map(|(i, d)| format!("Doc {}(Title: {}) {}\n", i + 1, d.document.title(), d.document.text())).collect()
}

/// The observation appended after a search.
pub fn observation(docs: &[ScoredDoc]) -> String {
    format!("\n\n<information>{}</information>\n\n", format_passages(docs).trim())
}

/// The settings a rollout rank needs (sent to remote rollout ranks with each request).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchSettings {
    /// Retrieval server.
    pub url: String,
    /// Passages per query.
    pub topk: usize,
    /// Search rounds.
    pub max_turns: usize,
    /// Observation tokens kept.
    pub max_obs_length: usize,
    /// Seconds per retrieval request.
    pub timeout_s: f64,
    /// Retries of a failed request.
    pub retries: u32,
}

impl From<&SearchConfig> for SearchSettings {
    fn from(c: &SearchConfig) -> Self {
        Self { url: c.url.clone(), topk: c.topk, max_turns: c.max_turns, max_obs_length: c.max_obs_length, timeout_s: c.timeout_s, retries: c.retries }
    }
}

impl SearchSettings {
    /// The HTTP client for these settings.
    pub fn client(&self) -> Result<RetrievalClient, TrainError> {
        RetrievalClient::new(&self.url, self.topk, Duration::from_secs_f64(self.timeout_s), self.retries, Duration::from_millis(500))
            .map_err(|e| TrainError::Other(format!("tools.search: {e}")))
    }
}

/// What a rollout rank needs to run multi-turn rollouts: the settings, the policy's
/// tokenizer (to read turns and tokenize observations) and the retrieval client.
pub struct SearchTool {
    /// The settings.
    pub settings: SearchSettings,
    /// The policy's tokenizer.
    pub tok: Tokenizer,
    /// The retrieval server's client.
    pub client: RetrievalClient,
}

impl SearchTool {
    /// A tool for `settings` with the policy's tokenizer.
    pub fn new(settings: SearchSettings, tok: Tokenizer) -> Result<Self, TrainError> {
        let client = settings.client()?;
        Ok(Self { settings, tok, client })
    }
}

/// A trajectory and Search-R1's counts.
struct Row {
    g: Growing,
    turns: u32,
    valid: u32,
    searches: u32,
}

/// Runs `params.n` trajectories per prompt. `params` is the per-turn sampling (its
/// `max_new_tokens` the per-turn budget, its stop ids the end-of-sequence tokens); seeds key
/// each trajectory by its index in the caller's whole batch (`params.first_prompt` counts
/// prompts before these), so a batch split across rollout ranks samples what one engine
/// would.
pub fn rollout(
    generate: &mut TurnGenerator<'_>,
    tok: &Tokenizer,
    client: &RetrievalClient,
    settings: &SearchSettings,
    prompts: &[Vec<u32>],
    params: &SamplingParams,
) -> Result<MultiTurnRollout, TrainError> {
    let mut rows: Vec<Row> = Growing::batch(prompts.len(), params).into_iter().map(|g| Row { g, turns: 1, valid: 0, searches: 0 }).collect();
    let mut stops: Vec<String> = TURN_STOPS.iter().map(|s| s.to_string()).collect();
    stops.extend(params.stop_strings.iter().filter(|s| !TURN_STOPS.contains(&s.as_str())).cloned());
    let mut out = MultiTurnRollout { flavour: Flavour::SearchR1, ..Default::default() };
    let encode = |text: &str| tok.encode(text, false).map_err(|e| TrainError::Other(format!("tokenizing an observation: {e}")));
    let invalid_ids = encode(INVALID_ACTION)?;

    for turn in 0..=settings.max_turns {
        let live: Vec<usize> = (0..rows.len()).filter(|&i| rows[i].g.live).collect();
        if live.is_empty() {
            break;
        }
        let last = turn == settings.max_turns;
        let contexts: Vec<Vec<u32>> = live.iter().map(|&i| rows[i].g.context(prompts)).collect();
        let turn_params = SamplingParams {
            n: 1,
            stop_strings: stops.clone(),
            // Each turn draws afresh; each trajectory keeps its own stream whichever rows are live.
            seed: params.seed ^ ((turn as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03)),
            first_prompt: 0,
            prompt_keys: live.iter().map(|&i| rows[i].g.key).collect(),
            ..params.clone()
        };
        let comps = generate(&contexts, &turn_params)?;
        if comps.len() != live.len() {
            return Err(TrainError::Other(format!("multi-turn rollout: {} completions for {} live trajectories", comps.len(), live.len())));
        }
        // What each live row asked for; searches are answered together below.
        let mut searching: Vec<(usize, String)> = Vec::new();
        let mut corrected: Vec<usize> = Vec::new();
        for c in comps {
            let i = *live.get(c.prompt_index).ok_or_else(|| TrainError::Other("multi-turn rollout: completion for an unknown trajectory".into()))?;
            let text = tok.decode(&c.token_ids, true).map_err(|e| TrainError::Other(e.to_string()))?;
            let ended = matches!(c.finish_reason, FinishReason::StopToken(_));
            let r = &mut rows[i];
            r.g.sampled(&c.token_ids, &c.logprobs, c.finish_reason);
            match parse_action(&text) {
                Action::Answer(_) => {
                    r.valid += 1;
                    r.g.live = false;
                    r.g.finished = true;
                }
                Action::Search(q) => {
                    r.valid += 1;
                    r.searches += 1;
                    if last {
                        r.g.live = false;
                    } else {
                        searching.push((i, q));
                    }
                }
                Action::Invalid if last || ended => {
                    r.g.live = false;
                    r.g.finished = ended;
                }
                Action::Invalid => corrected.push(i),
            }
        }
        if last {
            break;
        }
        let queries: Vec<String> = searching.iter().map(|(_, q)| q.clone()).collect();
        if !queries.is_empty() {
            let (hits, took) = client.retrieve(&queries).map_err(|e| TrainError::Other(format!("tools.search: {e}")))?;
            out.retrieval_s.push(took.as_secs_f64());
            out.queries += queries.len();
            for ((i, _), docs) in searching.iter().zip(&hits) {
                let mut ids = encode(&observation(docs))?;
                ids.truncate(settings.max_obs_length);
                rows[*i].g.observe(&ids);
            }
        }
        for &i in &corrected {
            let mut ids = invalid_ids.clone();
            ids.truncate(settings.max_obs_length);
            rows[i].g.observe(&ids);
        }
        for r in rows.iter_mut().filter(|r| r.g.live) {
            r.turns += 1;
        }
    }
    out.trajectories = rows.into_iter().map(|r| r.g.into_trajectory(r.turns, r.valid, r.searches, ToolResults::default())).collect();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reinforge_retrieval::Passage;

    #[test]
    fn actions_parse_like_search_r1s_regex() {
        assert_eq!(parse_action("<think>x</think><search> who is Ada </search>"), Action::Search("who is Ada".into()));
        assert_eq!(parse_action("<answer>Paris</answer><search>q</search>"), Action::Answer("Paris".into()));
        assert_eq!(parse_action("<search>a\nb</search>"), Action::Search("a\nb".into()));
        // An unclosed search does not hide a later answer.
        assert_eq!(parse_action("<search>q <answer>x</answer>"), Action::Answer("x".into()));
        assert_eq!(parse_action("just text"), Action::Invalid);
        assert_eq!(parse_action("<search>never closed"), Action::Invalid);
        assert_eq!(parse_action("ünïcode <answer>é</answer>"), Action::Answer("é".into()));
    }

    #[test]
    fn observations_read_as_search_r1s() {
        let docs = [
            ScoredDoc { document: Passage { id: "0".into(), contents: "\"Evan Morris\"\nEvan L. Morris was a lobbyist.".into() }, score: 3.0 },
            ScoredDoc { document: Passage { id: "1".into(), contents: "\"Roche\"\nRoche is a company.\nBased in Basel.".into() }, score: 2.0 },
        ];
        assert_eq!(
            observation(&docs),
            "\n\n<information>Doc 1(Title: \"Evan Morris\") Evan L. Morris was a lobbyist.\nDoc 2(Title: \"Roche\") Roche is a company.\nBased in Basel.</information>\n\n"
        );
        assert_eq!(observation(&[]), "\n\n<information></information>\n\n");
    }
}
