//! Search-R1's multi-turn rollouts: the turn loop against a real retrieval server (trajectories
//! finishing at different turns, one batched request per turn, the tokens trained on equal
//! the tokens sampled, observations as Search-R1 writes them), and state masking in the
//! actor's update (observation tokens carry no gradient; the loss is over model tokens only).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use reinforge_algos::Mat;
use reinforge_engine::{Completion, FinishReason, SamplingParams};
use reinforge_retrieval::index::{self, IndexOptions};
use reinforge_retrieval::server::{self, ServeOptions};
use reinforge_retrieval::{Passage, Retriever, RetrieverKind};
use reinforge_tokenizer::Tokenizer;
use reinforge_trainer::roles::{ActorMiniBatch, SeqBatch};
use reinforge_trainer::search::{observation, rollout, SearchSettings, SearchTool, INVALID_ACTION};
use reinforge_trainer::TrainConfig;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tiny_search() -> PathBuf {
    repo().join("examples/tiny-search")
}

/// A BM25 server over `rows` on a free port (it lives until the test process ends).
fn server(dir: &Path, rows: &[Passage]) -> String {
    let corpus = dir.join("corpus.jsonl");
    std::fs::write(&corpus, rows.iter().map(|r| serde_json::to_string(r).unwrap() + "\n").collect::<String>()).unwrap();
    index::build(&corpus, &dir.join("idx"), &IndexOptions { threads: 1, ..Default::default() }, &|_| {}).unwrap();
    let r = Arc::new(Retriever::open(&dir.join("idx"), RetrieverKind::Bm25).unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || server::serve(r, ServeOptions { host: "127.0.0.1".into(), port: 0, ..Default::default() }, move |a| tx.send(a).unwrap(), None));
    format!("http://{}/retrieve", rx.recv().unwrap())
}

#[test]
fn trajectories_grow_by_the_sampled_tokens_and_the_observations() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = [
        Passage { id: "0".into(), contents: "\"Quenul\"\nThe quenul is blue.".into() },
        Passage { id: "1".into(), contents: "\"Velkov\"\nThe velkov is green.".into() },
    ];
    let url = server(tmp.path(), &rows);
    let tok = Tokenizer::from_dir(tiny_search()).unwrap();
    let id = |t: &str| tok.token_to_id(t).unwrap_or_else(|| panic!("no token {t}"));
    let settings = SearchSettings { url, topk: 1, max_turns: 1, max_obs_length: 12, timeout_s: 10.0, retries: 0 };
    let tool = SearchTool::new(settings.clone(), tok.clone()).unwrap();

    // What each trajectory (keyed as the loop keys them: prompt × n + sample) samples per turn.
    let script: HashMap<u64, Vec<Vec<u32>>> = HashMap::from([
        (0, vec![vec![id("<answer> red </answer>")]]),                                          // answers at once
        (1, vec![vec![id("<search> quenul </search>")], vec![id("<answer> blue </answer>")]]), // searches, then answers
        (2, vec![vec![id("the")], vec![id("<eos>")]]),                                          // invalid, then stops
        (3, vec![vec![id("<search> velkov </search>")], vec![id("<search> quenul </search>")]]), // searches twice: the last turn retrieves nothing
    ]);
    let mut calls: Vec<Vec<u64>> = Vec::new();
    let mut generate = |ctx: &[Vec<u32>], p: &SamplingParams| -> Result<Vec<Completion>, reinforge_trainer::TrainError> {
        assert_eq!((p.n, p.first_prompt), (1, 0));
        assert!(p.stop_strings.iter().any(|s| s == "</search>") && p.stop_strings.iter().any(|s| s == "</answer>"));
        let turn = calls.len();
        calls.push(p.prompt_keys.clone());
        Ok(ctx
            .iter()
            .enumerate()
            .map(|(i, _)| {
                let token_ids = script[&p.prompt_keys[i]][turn].clone();
                let finish = if token_ids == [id("<eos>")] { FinishReason::StopToken(id("<eos>")) } else { FinishReason::Length };
                Completion { prompt_index: i, sample_index: 0, logprobs: vec![-0.5; token_ids.len()], token_ids, finish_reason: finish }
            })
            .collect())
    };
    let prompts = vec![tok.encode("what color is the quenul ?", false).unwrap(), tok.encode("what color is the velkov ?", false).unwrap()];
    let params = SamplingParams { n: 2, max_new_tokens: 1, stop_token_ids: vec![id("<eos>")], seed: 9, ..Default::default() };
    let out = rollout(&mut generate, &tool.tok, &tool.client, &settings, &prompts, &params).unwrap();

    // Turn 0 saw every trajectory; turn 1 only the live ones.
    assert_eq!(calls, vec![vec![0, 1, 2, 3], vec![1, 2, 3]]);
    // One request in turn 0 for both searches; the last turn retrieves nothing.
    assert_eq!((out.retrieval_s.len(), out.queries), (1, 2));
    let t = &out.trajectories;
    assert_eq!(t.iter().map(|x| (x.completion.prompt_index, x.completion.sample_index)).collect::<Vec<_>>(), [(0, 0), (0, 1), (1, 0), (1, 1)]);

    let obs = |passage: &Passage| {
        let docs = [reinforge_retrieval::ScoredDoc { document: passage.clone(), score: 1.0 }];
        let mut ids = tok.encode(&observation(&docs), false).unwrap();
        ids.truncate(12);
        ids
    };
    let mut invalid = tok.encode(INVALID_ACTION, false).unwrap();
    invalid.truncate(12);
    for (k, traj) in t.iter().enumerate() {
        // The tokens trained on are exactly the tokens sampled, turn after turn.
        let trained: Vec<u32> = traj.completion.token_ids.iter().zip(&traj.model_mask).filter(|(_, &m)| m).map(|(&x, _)| x).collect();
        let sampled: Vec<u32> = script[&(k as u64)].iter().take(calls.iter().filter(|c| c.contains(&(k as u64))).count()).flatten().copied().collect();
        assert_eq!(trained, sampled, "trajectory {k}");
        assert_eq!(traj.completion.logprobs.len(), traj.completion.token_ids.len());
        assert!(traj.completion.logprobs.iter().zip(&traj.model_mask).all(|(&l, &m)| if m { l == -0.5 } else { l == 0.0 }));
    }
    let a = id("<answer> blue </answer>");
    assert_eq!(t[0].completion.token_ids, [id("<answer> red </answer>")]);
    assert_eq!(t[1].completion.token_ids, [vec![id("<search> quenul </search>")], obs(&rows[0]), vec![a]].concat());
    assert_eq!(t[1].model_mask, [vec![true], vec![false; obs(&rows[0]).len()], vec![true]].concat());
    assert_eq!(t[2].completion.token_ids, [vec![id("the")], invalid.clone(), vec![id("<eos>")]].concat());
    assert_eq!(t[3].completion.token_ids, [vec![id("<search> velkov </search>")], obs(&rows[1]), vec![id("<search> quenul </search>")]].concat());
    // Search-R1's statistics.
    let stats: Vec<(u32, u32, u32, bool)> = t.iter().map(|x| (x.turns, x.valid_actions, x.tool_calls, x.finished)).collect();
    assert_eq!(stats, [(1, 1, 0, true), (2, 2, 1, true), (2, 0, 0, true), (2, 2, 2, false)]);
    assert_eq!(t[1].obs_lengths, [obs(&rows[0]).len() as u32]);
    let mut m = reinforge_metrics::Metrics::new();
    out.metrics(&mut m);
    assert_eq!(m.get("env/number_of_valid_search"), Some(0.75));
    assert_eq!(m.get("env/finish_ratio"), Some(0.75));
    assert_eq!(m.get("retrieval/queries"), Some(2.0));
}

#[test]
fn a_retrieval_server_that_stays_down_stops_the_rollout_naming_it() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let settings = SearchSettings { url: format!("http://{closed}/retrieve"), topk: 1, max_turns: 1, max_obs_length: 8, timeout_s: 1.0, retries: 1 };
    let tok = Tokenizer::from_dir(tiny_search()).unwrap();
    let tool = SearchTool::new(settings.clone(), tok.clone()).unwrap();
    let search = tok.token_to_id("<search> quenul </search>").unwrap();
    let mut generate = |ctx: &[Vec<u32>], _: &SamplingParams| -> Result<Vec<Completion>, reinforge_trainer::TrainError> {
        Ok((0..ctx.len()).map(|i| Completion { prompt_index: i, sample_index: 0, token_ids: vec![search], logprobs: vec![0.0], finish_reason: FinishReason::Length }).collect())
    };
    let params = SamplingParams { n: 1, max_new_tokens: 1, ..Default::default() };
    let e = rollout(&mut generate, &tool.tok, &tool.client, &settings, &[vec![3]], &params).unwrap_err().to_string();
    assert!(e.contains(&format!("http://{closed}/retrieve")) && e.contains("did not answer after 2 attempt(s)"), "{e}");
}

fn actor_config(dir: &Path) -> TrainConfig {
    let text = format!(
        r#"
[data]
generate = {{ kind = "arith", n = 8, seed = 1 }}
max_prompt_length = 64
max_response_length = 8
train_batch_size = 2
[actor]
model = "{}"
init = "random"
init_seed = 3
lr = 1e-2
ppo_mini_batch_size = 2
ppo_micro_batch_size = 4
[rollout]
n = 2
[trainer]
default_local_dir = "{}"
"#,
        tiny_search().display(),
        dir.display()
    );
    TrainConfig::from_str_with(&text, "test", &[]).unwrap()
}

#[test]
fn observation_tokens_carry_no_gradient_and_the_loss_is_over_model_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = actor_config(tmp.path());
    // Four responses; positions marked false are observations (and padding).
    let prompts: Vec<Vec<u32>> = vec![vec![5, 6, 7], vec![8, 9], vec![10, 11, 12, 13], vec![14]];
    let responses: Vec<Vec<u32>> = vec![vec![20, 21, 22, 23, 24], vec![25, 26], vec![27, 28, 29, 30, 31, 32], vec![33]];
    let masks: Vec<Vec<bool>> = vec![
        vec![true, false, false, false, true],
        vec![true, true],
        vec![true, false, false, true, false, true],
        vec![true],
    ];
    let p: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let r: Vec<&[u32]> = responses.iter().map(Vec::as_slice).collect();
    let batch = SeqBatch::build_masked(&p, &r, 0, Some(&masks));
    let plain = SeqBatch::build(&p, &r, 0);
    // The model sees every token either way; only the loss mask differs.
    assert_eq!((batch.ids.clone(), batch.attention.clone()), (plain.ids.clone(), plain.attention.clone()));
    let width = batch.response_len;
    let mut model_tokens = 0;
    for (i, m) in masks.iter().enumerate() {
        for (j, &on) in m.iter().enumerate() {
            assert_eq!(batch.response_mask.data()[i * width + j], if on { 1.0 } else { 0.0 });
            model_tokens += on as usize;
        }
    }

    let advantages = |obs_value: f64| {
        let mut a = Vec::with_capacity(4 * width);
        for (i, m) in masks.iter().enumerate() {
            for j in 0..width {
                a.push(if m.get(j) == Some(&true) { 0.1 * (i + 1) as f64 - 0.05 * j as f64 } else { obs_value });
            }
        }
        Mat::new(4, width, a).unwrap()
    };
    let rows: Vec<usize> = (0..4).collect();
    let run = |obs_value: f64| {
        let model_dir = tiny_search();
        let mut policy = reinforge_trainer::build::policy_group(&cfg, &model_dir, None).unwrap();
        let old = policy.logprobs(&batch, reinforge_trainer::roles::MicroBatching::Seqs(4)).unwrap();
        let adv = advantages(obs_value);
        let mini = ActorMiniBatch { rows: &rows, old_log_probs: Some(&old), advantages: &adv, ref_log_probs: None, norm: None };
        let m = policy.update(&batch, &mini, 1e-2).unwrap();
        let weights: Vec<f32> = policy.state().unwrap().tensors.into_values().flat_map(|t| t.data).collect();
        (m.get("actor/pg_loss").unwrap(), weights)
    };
    let (loss_a, w_a) = run(0.0);
    let (loss_b, w_b) = run(123.0);
    // Whatever the observations' advantages, the update is the same: their tokens carry no gradient.
    assert_eq!(w_a, w_b, "observation tokens changed the update");
    assert_eq!(loss_a, loss_b);
    // On-policy (ratio 1, nothing clipped), the token-mean loss is −mean(A) over model tokens only.
    let adv = advantages(0.0);
    let want = -(0..4 * width).filter(|&k| batch.response_mask.data()[k] > 0.0).map(|k| adv.data()[k]).sum::<f64>() / model_tokens as f64;
    assert!((loss_a - want).abs() < 1e-5, "pg_loss {loss_a}, model-token mean {want}");
}
