//! Multi-turn rollouts: what the two agent loops share and how the trainer picks one.
//!
//! Two loops exist, each faithful to the framework it comes from:
//! - [`crate::search`]: Search-R1's `<search>`/`<answer>` loop against a retrieval server
//!   (`[tools.search]`);
//! - [`crate::tool_calls`]: verl's tool agent (`ToolAgentLoop`), OpenAI-style function calls in
//!   Hermes `<tool_call>` blocks answered by tools from verl's tool config (`[tools.calls]`).
//!
//! Both grow each trajectory by appending token ids (the model's tokens as sampled, then the
//! environment's), keep a mask of which tokens the model wrote, and return a
//! [`MultiTurnRollout`]. An [`Agent`] is what a rollout rank holds; its [`AgentSettings`] are
//! what a remote rank is sent to build its own.

use reinforge_engine::{Completion, FinishReason, SamplingParams};
use reinforge_metrics::Metrics;
use reinforge_tokenizer::ChatTokenizer;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::error::TrainError;
use crate::search::{SearchSettings, SearchTool};
use crate::tool_calls::{ToolAgent, ToolCallSettings};

/// A turn's generator: the completions (one per context, `n` = 1) of `contexts`.
pub type TurnGenerator<'a> = dyn FnMut(&[Vec<u32>], &SamplingParams) -> Result<Vec<Completion>, TrainError> + 'a;

/// Which loop made a rollout (it decides the metrics' names).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Flavour {
    /// Search-R1's loop: `env/…` and `state_tokens/…` metrics.
    #[default]
    SearchR1,
    /// verl's tool agent: `num_turns/…` and `tool_calls/…` metrics.
    ToolCalls,
}

/// One multi-turn trajectory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Trajectory {
    /// The response: every turn's tokens and every observation's, in order, with the sampled
    /// log-probs on model tokens (0 on observations) and the last turn's finish reason.
    pub completion: Completion,
    /// Per response token: true for the model's tokens, false for observations.
    pub model_mask: Vec<bool>,
    /// Search-R1's `turns_stats` (1 plus the rounds after which the trajectory was live), or
    /// verl's `num_turns` (assistant turns + tool turns + 1).
    pub turns: u32,
    /// Turns with a search or an answer (Search-R1); tool calls parsed (verl).
    pub valid_actions: u32,
    /// Searches made (Search-R1); tool calls executed (verl).
    pub tool_calls: u32,
    /// Whether it ended with an answer or end-of-sequence (Search-R1's finish ratio), or the
    /// model stopped calling tools (verl).
    pub finished: bool,
    /// Tokens of each observation appended.
    pub obs_lengths: Vec<u32>,
    /// Each executed tool call's step reward (verl's `tool_rewards`: logged, and in the reward
    /// function's `extra_info`).
    #[serde(default)]
    pub tool_rewards: Vec<f64>,
    /// Tool calls answered with an error text (unknown tool, bad arguments, a failed request).
    #[serde(default)]
    pub tool_errors: u32,
    /// Each simulated-user turn's score (verl's `turn_scores`: logged, and in the reward
    /// function's `extra_info`).
    #[serde(default)]
    pub turn_scores: Vec<f64>,
}

/// A batch of trajectories and the tool requests made for it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MultiTurnRollout {
    /// The loop that made it.
    #[serde(default)]
    pub flavour: Flavour,
    /// `n` per prompt, prompt-major (as completions are).
    pub trajectories: Vec<Trajectory>,
    /// Seconds each retrieval request took (one per turn with searches).
    pub retrieval_s: Vec<f64>,
    /// Queries sent.
    pub queries: usize,
}

impl MultiTurnRollout {
    /// Appends a rank's share, whose prompts start at `first_prompt` of the whole batch.
    pub fn extend(&mut self, share: MultiTurnRollout, first_prompt: usize) {
        self.flavour = share.flavour;
        self.trajectories.extend(share.trajectories.into_iter().map(|mut t| {
            t.completion.prompt_index += first_prompt;
            t
        }));
        self.retrieval_s.extend(share.retrieval_s);
        self.queries += share.queries;
    }

    /// The loop's metrics, named as its framework names them, plus retrieval latency.
    pub fn metrics(&self, m: &mut Metrics) {
        let t = &self.trajectories;
        if t.is_empty() {
            return;
        }
        let f = |x: &dyn Fn(&Trajectory) -> f64| t.iter().map(x).collect::<Vec<f64>>();
        let mean = |v: Vec<f64>| v.iter().sum::<f64>() / v.len().max(1) as f64;
        match self.flavour {
            Flavour::SearchR1 => {
                m.add_stats("env/number_of_actions", &f(&|x| x.turns as f64));
                m.insert("env/finish_ratio", mean(f(&|x| x.finished as u8 as f64)));
                m.insert("env/number_of_valid_action", mean(f(&|x| x.valid_actions as f64)));
                m.insert("env/ratio_of_valid_action", mean(f(&|x| x.valid_actions as f64 / x.turns.max(1) as f64)));
                m.insert("env/number_of_valid_search", mean(f(&|x| x.tool_calls as f64)));
                let obs: Vec<f64> = t.iter().flat_map(|x| x.obs_lengths.iter().map(|&l| l as f64)).collect();
                if !obs.is_empty() {
                    m.add_stats("env/obs_length", &obs);
                }
                let model: usize = t.iter().map(|x| x.model_mask.iter().filter(|&&b| b).count()).sum();
                let all: usize = t.iter().map(|x| x.model_mask.len()).sum();
                m.insert("state_tokens/total", model as f64);
                m.insert("state_tokens/coverage", model as f64 / all.max(1) as f64);
            }
            Flavour::ToolCalls => {
                // verl's `num_turns/{min,max,mean}` (from `__num_turns__`).
                let turns = f(&|x| x.turns as f64);
                m.insert("num_turns/min", turns.iter().cloned().fold(f64::INFINITY, f64::min));
                m.insert("num_turns/max", turns.iter().cloned().fold(f64::NEG_INFINITY, f64::max));
                m.insert("num_turns/mean", mean(turns));
                m.insert("tool_calls/mean", mean(f(&|x| x.tool_calls as f64)));
                m.insert("tool_calls/parsed_mean", mean(f(&|x| x.valid_actions as f64)));
                m.insert("tool_calls/errors", t.iter().map(|x| x.tool_errors as f64).sum());
                m.insert("tool_calls/finish_ratio", mean(f(&|x| x.finished as u8 as f64)));
                let rewards: Vec<f64> = t.iter().flat_map(|x| x.tool_rewards.iter().copied()).collect();
                if !rewards.is_empty() {
                    m.insert("tool_calls/reward_mean", mean(rewards));
                }
                let scores: Vec<f64> = t.iter().flat_map(|x| x.turn_scores.iter().copied()).collect();
                if !scores.is_empty() {
                    m.insert("interaction/score_mean", mean(scores));
                    m.insert("interaction/turns_mean", mean(f(&|x| x.turn_scores.len() as f64)));
                }
            }
        }
        if !self.retrieval_s.is_empty() || self.flavour == Flavour::SearchR1 {
            m.insert("timing_s/retrieval", self.retrieval_s.iter().sum::<f64>());
            m.insert("retrieval/queries", self.queries as f64);
        }
        if !self.retrieval_s.is_empty() {
            m.add_stats("timing_s/retrieval_request", &self.retrieval_s);
        }
    }
}

/// A trajectory as it grows, whichever loop grows it: the tokens after the prompt (the model's
/// as sampled, then the environment's), their log-probs (0 on the environment's) and which
/// the model wrote.
pub(crate) struct Growing {
    /// Its prompt, in the caller's batch.
    pub prompt: usize,
    /// Which of the prompt's `n`.
    pub sample: usize,
    /// Its sampling key: its index in the caller's whole batch, so its draws are the same
    /// whichever rank or call samples it.
    pub key: u64,
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
    pub mask: Vec<bool>,
    /// Still taking turns.
    pub live: bool,
    /// The last turn's finish reason.
    pub finish: FinishReason,
    /// Whether it ended as the loop means to end (an answer, no more tool calls).
    pub finished: bool,
    /// Tokens of each observation appended.
    pub obs_lengths: Vec<u32>,
}

impl Growing {
    /// `params.n` per prompt, prompt-major, keyed by their index in the caller's whole batch
    /// (`params.first_prompt` counts the prompts before these).
    pub fn batch(prompts: usize, params: &SamplingParams) -> Vec<Self> {
        let n = params.n.max(1);
        (0..prompts)
            .flat_map(|p| (0..n).map(move |k| (p, k)))
            .map(|(p, k)| Growing {
                prompt: p,
                sample: k,
                key: ((params.first_prompt + p) * n + k) as u64,
                tokens: Vec::new(),
                logprobs: Vec::new(),
                mask: Vec::new(),
                live: true,
                finish: FinishReason::Length,
                finished: false,
                obs_lengths: Vec::new(),
            })
            .collect()
    }

    /// The prompt and everything since: what the next turn continues.
    pub fn context(&self, prompts: &[Vec<u32>]) -> Vec<u32> {
        [prompts[self.prompt].as_slice(), &self.tokens].concat()
    }

    /// Appends a turn's tokens as sampled.
    pub fn sampled(&mut self, ids: &[u32], logprobs: &[f32], finish: FinishReason) {
        self.tokens.extend_from_slice(ids);
        self.logprobs.extend_from_slice(&logprobs[..ids.len().min(logprobs.len())]);
        self.mask.extend(std::iter::repeat_n(true, ids.len()));
        self.finish = finish;
    }

    /// Appends context tokens (masked out of the losses).
    pub fn observe(&mut self, ids: &[u32]) {
        self.tokens.extend_from_slice(ids);
        self.logprobs.extend(std::iter::repeat_n(0.0, ids.len()));
        self.mask.extend(std::iter::repeat_n(false, ids.len()));
        self.obs_lengths.push(ids.len() as u32);
    }

    /// The trajectory with the loop's counts (`turns`, `valid_actions`, `tool_calls`) and
    /// tool results.
    pub fn into_trajectory(self, turns: u32, valid_actions: u32, tool_calls: u32, tools: ToolResults) -> Trajectory {
        Trajectory {
            completion: Completion { prompt_index: self.prompt, sample_index: self.sample, token_ids: self.tokens, logprobs: self.logprobs, finish_reason: self.finish },
            model_mask: self.mask,
            turns,
            valid_actions,
            tool_calls,
            finished: self.finished,
            obs_lengths: self.obs_lengths,
            tool_rewards: tools.rewards,
            tool_errors: tools.errors,
            turn_scores: tools.turn_scores,
        }
    }
}

/// What tools and a simulated user said along a trajectory (verl's tool agent).
#[derive(Default)]
pub(crate) struct ToolResults {
    pub rewards: Vec<f64>,
    pub errors: u32,
    pub turn_scores: Vec<f64>,
}

/// What a remote rollout rank is sent to build its [`Agent`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AgentSettings {
    /// Search-R1's loop.
    Search(SearchSettings),
    /// verl's tool agent.
    ToolCalls(ToolCallSettings),
}

/// A multi-turn loop ready to run: its settings, the policy's tokenizer, its clients (boxed:
/// each holds a whole tokenizer).
pub enum Agent {
    /// Search-R1's loop.
    Search(Box<SearchTool>),
    /// verl's tool agent.
    ToolCalls(Box<ToolAgent>),
}

impl Agent {
    /// Builds the agent for `settings` with the policy's tokenizer.
    pub fn new(settings: AgentSettings, tok: &ChatTokenizer) -> Result<Self, TrainError> {
        Ok(match settings {
            AgentSettings::Search(s) => Agent::Search(Box::new(SearchTool::new(s, tok.tokenizer().clone())?)),
            AgentSettings::ToolCalls(s) => Agent::ToolCalls(Box::new(ToolAgent::new(s, tok.clone())?)),
        })
    }

    /// Whether it was built from `settings` (a worker keeps its agent while they stay).
    pub fn built_from(&self, settings: &AgentSettings) -> bool {
        match (self, settings) {
            (Agent::Search(t), AgentSettings::Search(s)) => t.settings == *s,
            (Agent::ToolCalls(a), AgentSettings::ToolCalls(s)) => a.settings == *s,
            _ => false,
        }
    }

    /// The settings it was built from.
    pub fn settings(&self) -> AgentSettings {
        match self {
            Agent::Search(t) => AgentSettings::Search(t.settings.clone()),
            Agent::ToolCalls(a) => AgentSettings::ToolCalls(a.settings.clone()),
        }
    }

    /// `params.n` trajectories per prompt; `agent_kwargs[p]` is prompt `p`'s
    /// `{"tools_kwargs": …, "interaction_kwargs": …}` (from verl's `extra_info`; read by the
    /// tool agent only).
    pub fn rollout(&self, generate: &mut TurnGenerator<'_>, prompts: &[Vec<u32>], agent_kwargs: &[Json], params: &SamplingParams) -> Result<MultiTurnRollout, TrainError> {
        match self {
            Agent::Search(t) => crate::search::rollout(generate, &t.tok, &t.client, &t.settings, prompts, params),
            Agent::ToolCalls(a) => crate::tool_calls::rollout(generate, a, prompts, agent_kwargs, params),
        }
    }

    /// Whether the losses skip observation tokens (Search-R1's `state_masking`; verl's tool
    /// agent always masks them).
    pub fn masks_observations(&self, search_state_masking: bool) -> bool {
        match self {
            Agent::Search(_) => search_state_masking,
            Agent::ToolCalls(_) => true,
        }
    }
}
