//! End-to-end invariants of the training loop on the tiny random-init model:
//! determinism, resume == uninterrupted, export round trip, and a GAE/critic run.

use burn::tensor::Device;
use reinforge_checkpoint::Resume;
use reinforge_engine::{CausalLm, ForwardInput};
use reinforge_trainer::{train, TrainConfig};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn config(dir: &Path, extra: &[&str]) -> TrainConfig {
    let overrides: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    TrainConfig::from_str_with(&config_text(dir), "test", &overrides).expect("valid test config")
}

fn config_text(dir: &Path) -> String {
    let model = repo().join("examples/tiny-arith");
    format!(
        r#"
[data]
generate = {{ kind = "arith", n = 64, seed = 3, params = {{ max_operand = 4 }} }}
val_generate = {{ kind = "arith", n = 8, seed = 4, params = {{ max_operand = 4 }} }}
max_prompt_length = 64
max_response_length = 3
train_batch_size = 8
[actor]
model = "{}"
init = "random"
init_seed = 5
lr = 5e-3
ppo_mini_batch_size = 4
ppo_micro_batch_size = 8
ppo_epochs = 2
[rollout]
n = 4
[reward]
kind = "qa_em"
params = {{ extract = "whole" }}
[trainer]
default_local_dir = "{}"
total_steps = 6
save_freq = 3
test_freq = 3
logger = ["jsonl", "tensorboard"]
"#,
        model.display(),
        dir.display()
    )
}

/// Metrics that must repeat exactly (timings and throughput never do).
fn stable(h: &[reinforge_metrics::Metrics]) -> Vec<Vec<(String, f64)>> {
    h.iter()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| !k.starts_with("timing_s/") && !k.starts_with("perf/"))
                .map(|(k, v)| (k.to_string(), v))
                .collect()
        })
        .collect()
}

fn weights(dir: &Path) -> Vec<f32> {
    CausalLm::load(dir, &Device::flex()).unwrap().to_hf_tensors().unwrap().into_values().flat_map(|t| t.data).collect()
}

fn no_stop() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(false))
}

#[test]
fn same_seed_same_metrics_and_resume_equals_uninterrupted() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b, c) = (tmp.path().join("a"), tmp.path().join("b"), tmp.path().join("c"));
    let full = train(&config(&a, &[]), &Resume::None, no_stop()).unwrap();
    assert_eq!(full.steps, 6);
    let again = train(&config(&b, &[]), &Resume::None, no_stop()).unwrap();
    assert_eq!(stable(&full.history), stable(&again.history), "same seed and config must give the same metrics");

    // 3 steps, stop, resume for the other 3.
    let first = train(&config(&c, &["trainer.total_steps=3"]), &Resume::None, no_stop()).unwrap();
    assert_eq!(first.steps, 3);
    let rest = train(&config(&c, &[]), &Resume::Auto, no_stop()).unwrap();
    assert_eq!(rest.steps, 6);
    let mut joined = first.history.clone();
    joined.extend(rest.history.clone());
    assert_eq!(stable(&full.history), stable(&joined), "resumed run must match the uninterrupted one");
    let (wa, wc) = (weights(&a.join("checkpoints/global_step_6/actor")), weights(&c.join("checkpoints/global_step_6/actor")));
    assert_eq!(wa, wc, "final weights differ after resume");

    // metrics.jsonl holds each step once, also across the resume.
    let lines = std::fs::read_to_string(c.join("metrics.jsonl")).unwrap();
    let steps: Vec<u64> = lines.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, vec![1, 2, 3, 4, 5, 6]);
    assert!(std::fs::read_dir(&c).unwrap().any(|e| e.unwrap().file_name().to_string_lossy().starts_with("events.out.tfevents")));
    // Validation ran at steps 3 and 6.
    assert!(full.history[2].get("val/reward/mean").is_some() && full.history[5].get("val/reward/mean").is_some());
}

#[test]
fn export_loads_back_with_identical_logits() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    train(&config(&run, &["trainer.total_steps=2", "trainer.save_freq=2", "trainer.test_freq=0"]), &Resume::None, no_stop()).unwrap();
    let ckpt = run.join("checkpoints/global_step_2");
    let out = tmp.path().join("hf");
    reinforge_trainer::export_hf(&ckpt, &out).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        assert!(out.join(f).is_file(), "export lacks {f}");
    }
    assert!(!out.join("optimizer.safetensors").exists());
    let input = ForwardInput::from_mask(vec![vec![5, 6, 7, 8]], vec![vec![true; 4]]);
    let a: Vec<f32> = CausalLm::load(&ckpt.join("actor"), &Device::flex()).unwrap().forward(&input).unwrap().into_data().try_into_vec().unwrap();
    let b: Vec<f32> = CausalLm::load(&out, &Device::flex()).unwrap().forward(&input).unwrap().into_data().try_into_vec().unwrap();
    assert_eq!(a, b);
    // Exporting onto an existing directory is refused, not merged.
    assert!(reinforge_trainer::export_hf(&ckpt, &out).unwrap_err().to_string().contains("already exists"));
}

#[test]
fn gae_with_critic_and_kl_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("gae");
    let s = train(
        &config(
            &run,
            &[
                "algorithm.adv_estimator=gae",
                "algorithm.use_kl_in_reward=true",
                "actor.use_kl_loss=true",
                "actor.entropy_coeff=0.01",
                "trainer.total_steps=2",
                "trainer.test_freq=0",
            ],
        ),
        &Resume::None,
        no_stop(),
    )
    .unwrap();
    let m = &s.history[1];
    for k in ["critic/vf_loss", "critic/values/mean", "actor/kl_loss", "actor/reward_kl_penalty", "actor/pg_loss", "actor/entropy"] {
        assert!(m.get(k).is_some_and(f64::is_finite), "missing or non-finite {k}");
    }
    assert!(run.join("checkpoints/global_step_2/critic/model.safetensors").is_file());
}

#[test]
fn quickstart_reward_rises() {
    // The README's first command, verbatim config, into a temporary directory.
    let tmp = tempfile::tempdir().unwrap();
    let cfg_path = repo().join("examples/quickstart.toml");
    let mut cfg = TrainConfig::load(&cfg_path, &[format!("trainer.default_local_dir=\"{}\"", tmp.path().display())]).unwrap();
    cfg.actor.model = repo().join(&cfg.actor.model).display().to_string();
    cfg.trainer.logger = vec!["jsonl".into()];
    let s = train(&cfg, &Resume::None, no_stop()).unwrap();
    // History also holds the validation-before-training record, which has no training score.
    let scores: Vec<f64> = s.history.iter().filter_map(|m| m.get("critic/score/mean")).collect();
    assert_eq!(scores.len(), s.steps);
    let n = scores.len();
    let first: f64 = scores[..10].iter().sum::<f64>() / 10.0;
    let last: f64 = scores[n - 10..].iter().sum::<f64>() / 10.0;
    eprintln!("quickstart: mean reward first 10 steps {first:.3}, last 10 steps {last:.3}");
    assert!(first < 0.2, "the task should start near 0 (got {first})");
    assert!(last > first + 0.4, "reward did not rise clearly: {first:.3} → {last:.3}");
}

#[test]
fn reward_model_scores_last_token_and_plugs_into_config() {
    use reinforge_reward::{RewardFn, RewardInput, RewardSpec};
    // A reward model: tiny-llama's weights plus a `score.weight` head.
    let tmp = tempfile::tempdir().unwrap();
    let fixtures = repo().join("../shared/fixtures/models/tiny-llama");
    let model = CausalLm::load(&fixtures, &Device::flex()).unwrap();
    let mut tensors = model.to_hf_tensors().unwrap();
    let h = model.config.hidden_size;
    let head: Vec<f32> = (0..h).map(|i| ((i as f32) * 0.37).sin() * 0.1).collect();
    tensors.insert("score.weight".into(), reinforge_engine::HostTensor { shape: vec![1, h], data: head.clone() });
    let rm = tmp.path().join("rm");
    std::fs::create_dir_all(&rm).unwrap();
    reinforge_engine::weights::write_safetensors(&rm.join("model.safetensors"), &tensors, None).unwrap();
    std::fs::copy(fixtures.join("config.json"), rm.join("config.json")).unwrap();
    std::fs::copy(repo().join("examples/tiny-arith/tokenizer.json"), rm.join("tokenizer.json")).unwrap();
    std::fs::copy(repo().join("examples/tiny-arith/tokenizer_config.json"), rm.join("tokenizer_config.json")).unwrap();

    let scorer = reinforge_trainer::reward_model::registry()
        .build(&RewardSpec::with_params("reward_model", serde_json::json!({"path": rm.display().to_string(), "batch_size": 2})))
        .unwrap();
    // Three samples of one prompt among others: on the CUDA engine they share its ids.
    let inputs: Vec<RewardInput> = [("What is 2?", " 7"), ("Hi", " 7"), ("What is 2?", " 12"), ("abc", " 7"), ("What is 2?", " 7 7")]
        .iter()
        .map(|(p, r)| RewardInput { prompt: p.to_string(), ..RewardInput::new("x", *r, serde_json::Value::Null) })
        .collect();
    let got: Vec<f64> = scorer.score_batch(&inputs).unwrap().iter().map(|o| o.score).collect();
    // Independent path: the final hidden state of each text alone, dotted with the head.
    let tok = reinforge_tokenizer::Tokenizer::from_dir(&rm).unwrap();
    for (inp, g) in inputs.iter().zip(&got) {
        let ids = tok.encode(&format!("{}{}", inp.prompt, inp.response), false).unwrap();
        let n = ids.len();
        let hidden: Vec<f32> = model
            .net
            .hidden_states(&model.config, &ForwardInput::from_mask(vec![ids], vec![vec![true; n]]))
            .unwrap()
            .into_data()
            .try_into_vec()
            .unwrap();
        let last = &hidden[(n - 1) * h..n * h];
        let want: f64 = last.iter().zip(&head).map(|(a, b)| (*a as f64) * (*b as f64)).sum();
        assert!((g - want).abs() < 1e-4, "{}: {g} vs {want}", inp.prompt);
    }
    // With trainer.device on the CUDA engine (its emulator here) the reward model scores there,
    // packed, the samples of a prompt after one copy of it: the same scores.
    let mut cfg = reinforge_trainer::config::TrainConfig::default();
    cfg.trainer.device = "cuda-emu".into();
    cfg.trainer.dtype = "f32".into();
    let on_gpu = reinforge_trainer::reward_model::registry_on(&cfg)
        .build(&RewardSpec::with_params("reward_model", serde_json::json!({"path": rm.display().to_string(), "batch_size": 5})))
        .unwrap();
    let gpu_scores: Vec<f64> = on_gpu.score_batch(&inputs).unwrap().iter().map(|o| o.score).collect();
    for (c, g) in got.iter().zip(&gpu_scores) {
        assert!((c - g).abs() < 1e-4, "CPU {c} vs CUDA engine {g}");
    }
    // Without a head it is refused with the reason.
    let err = reinforge_trainer::reward_model::registry()
        .build(&RewardSpec::with_params("reward_model", serde_json::json!({"path": fixtures.display().to_string()})))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("score.weight"), "{err}");
}

#[test]
fn every_estimator_runs_a_step() {
    for est in ["rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "gpg", "grpo"] {
        let tmp = tempfile::tempdir().unwrap();
        let mut extra = vec![format!("algorithm.adv_estimator={est}"), "trainer.total_steps=1".into(), "trainer.test_freq=0".into()];
        if est == "grpo" {
            // Dr.GRPO, cosine schedule with warmup, normalised rewards, seq-mean loss.
            extra.extend([
                "algorithm.norm_adv_by_std_in_grpo=false".into(),
                "actor.lr_scheduler=cosine".into(),
                "actor.lr_warmup_steps=2".into(),
                "reward.normalize=true".into(),
                "actor.loss_agg_mode=seq-mean-token-mean".into(),
            ]);
        }
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let s = train(&config(tmp.path(), &extra), &Resume::None, no_stop()).unwrap_or_else(|e| panic!("{est}: {e}"));
        let m = &s.history[0];
        assert!(m.get("actor/pg_loss").is_some_and(f64::is_finite), "{est}: pg_loss");
        assert!(m.get("critic/advantages/mean").is_some_and(f64::is_finite), "{est}: advantages");
    }
}

#[test]
fn every_policy_loss_mode_trains_and_logs_what_verl_logs() {
    let modes = ["vanilla", "dppo_tv", "dppo_kl", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "dro", "cispo"];
    for mode in modes {
        let tmp = tempfile::tempdir().unwrap();
        let mut extra = vec![format!("actor.policy_loss.loss_mode={mode}"), "trainer.total_steps=2".into(), "trainer.test_freq=0".into()];
        if mode == "dro" {
            extra.push("actor.policy_loss.dro_beta=0.5".into());
        }
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let cfg = config(tmp.path(), &extra);
        let s = train(&cfg, &Resume::None, no_stop()).unwrap_or_else(|e| panic!("{mode}: {e}"));
        for m in &s.history {
            assert!(m.get("actor/pg_loss").is_some_and(f64::is_finite), "{mode}: pg_loss");
            // Zero when every group's rewards tie (advantages 0): the losses' gradients are
            // checked against verl's in reinforge-algos; here, that the update ran.
            assert!(m.get("actor/grad_norm").is_some_and(f64::is_finite), "{mode}: grad_norm");
            let has = |k: &str| m.get(k).is_some();
            let (clipfrac, kl, lower) = match mode {
                "gpg" => (false, false, false),
                "kl_cov" | "dro" => (false, true, false),
                "clip_cov" => (true, true, false),
                _ => (true, true, true),
            };
            assert_eq!(
                (has("actor/pg_clipfrac"), has("actor/ppo_kl"), has("actor/pg_clipfrac_lower")),
                (clipfrac, kl, lower),
                "{mode}: metrics {:?}",
                m.iter().map(|(k, _)| k).filter(|k| k.starts_with("actor/")).collect::<Vec<_>>()
            );
        }
    }
}

#[test]
fn dapo_overlong_penalty_is_part_of_the_score() {
    // verl's dapo manager: expected = max_resp_len - len; penalty = min(-(tokens - expected)
    // / len * factor, 0).
    let ob = reinforge_trainer::config::OverlongBuffer { enable: true, len: 4, penalty_factor: 1.0, max_resp_len: Some(8) };
    let got: Vec<f64> = [2, 4, 6, 8].iter().map(|&t| ob.penalty(t, 100).unwrap()).collect();
    assert_eq!(got, [0.0, 0.0, -0.5, -1.0]);
    let half = reinforge_trainer::config::OverlongBuffer { penalty_factor: 0.5, max_resp_len: None, ..ob.clone() };
    assert_eq!(half.penalty(7, 8), Some(-0.375));
    assert_eq!(reinforge_trainer::config::OverlongBuffer::default().penalty(8, 8), None);

    // Responses of at most 3 tokens, the penalty over the last 2: a 3-token answer loses 1.
    let tmp = tempfile::tempdir().unwrap();
    let extra = ["reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=2", "trainer.total_steps=2", "trainer.test_freq=0"];
    let s = train(&config(tmp.path(), &extra), &Resume::None, no_stop()).unwrap();
    for m in &s.history {
        let (lo, hi) = (m.get("reward/overlong_penalty/min").unwrap(), m.get("reward/overlong_penalty/max").unwrap());
        assert!((-1.0..=0.0).contains(&lo) && (-1.0..=0.0).contains(&hi), "penalties {lo}..{hi}");
        let frac = m.get("reward/overlong_frac").unwrap();
        assert!(frac > 0.0, "a random model runs into a 3-token limit");
        // qa_em scores are 0 or 1, so a penalised score is below 1 or negative.
        assert!(m.get("critic/score/min").unwrap() <= lo + 1.0);
    }
    let tmp = tempfile::tempdir().unwrap();
    let cfg = TrainConfig::from_str_with(&config_text(tmp.path()), "test", &["reward.overlong_buffer.enable=true".into()]);
    let e = cfg.map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("reward.overlong_buffer.len = 0"), "{e}");
}

/// A reward that differs between a prompt's samples now and then: the response's length in
/// characters, away from 2.
fn length_config(dir: &Path, extra: &[&str]) -> TrainConfig {
    let text = config_text(dir).replace(
        "kind = \"qa_em\"\nparams = { extract = \"whole\" }",
        "kind = \"length\"\nparams = { target = 2, unit = \"chars\", mode = \"distance\" }",
    );
    assert!(text.contains("\"length\""), "the test config's reward section moved");
    let overrides: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    TrainConfig::from_str_with(&text, "test", &overrides).expect("valid test config")
}

#[test]
fn dynamic_sampling_keeps_groups_that_differ_and_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, c) = (tmp.path().join("a"), tmp.path().join("c"));
    let on = ["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=seq_reward", "data.gen_batch_size=4", "trainer.total_epochs=4", "trainer.test_freq=0", "trainer.save_freq=2"];
    fn with<'a>(on: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        [on, extra].concat()
    }
    let full = train(&length_config(&a, &with(&on, &["trainer.total_steps=4"])), &Resume::None, no_stop()).unwrap();
    assert_eq!(full.steps, 4);
    let mut rounds = 0.0;
    for m in &full.history {
        let r = m.get("train/num_gen_batches").expect("rounds are logged");
        // 8 prompts a step from rounds of 4: at least 2 rounds.
        assert!(r >= 2.0, "{r} rounds");
        rounds += r;
        // Every kept group's scores differ, so GRPO gives none of its samples a zero
        // advantage... unless a sample sits exactly at its group's mean; the spread is wide.
        assert!(m.get("critic/advantages/max").unwrap() > 0.0 && m.get("critic/advantages/min").unwrap() < 0.0);
    }
    assert!(full.history.iter().any(|m| m.get("train/filtered_groups").unwrap() > 0.0), "some group should tie");
    eprintln!("dynamic sampling: {rounds} rounds for 4 steps");

    // Stop after 2 steps and resume: the loader position and the rounds' seeds come back.
    let first = train(&length_config(&c, &with(&on, &["trainer.total_steps=2"])), &Resume::None, no_stop()).unwrap();
    let rest = train(&length_config(&c, &with(&on, &["trainer.total_steps=4"])), &Resume::Auto, no_stop()).unwrap();
    let mut joined = first.history.clone();
    joined.extend(rest.history.clone());
    assert_eq!(stable(&full.history), stable(&joined), "resumed run must match the uninterrupted one");

    // OpenRLHF's rule: the mean inside (lo, hi), even when the samples tie.
    use reinforge_trainer::config::FilterGroups;
    let verl = FilterGroups::default();
    assert!(!verl.keeps(&[1.0, 1.0, 1.0]) && verl.keeps(&[1.0, 0.0]) && verl.keeps(&[5.0]));
    let orlhf = FilterGroups { reward_range: Some([0.0, 1.0]), ..FilterGroups::default() };
    assert!(!orlhf.keeps(&[0.0, 0.0]) && !orlhf.keeps(&[1.0, 1.0]) && orlhf.keeps(&[0.0, 1.0]) && orlhf.keeps(&[0.5, 0.5]));
    let tmp = tempfile::tempdir().unwrap();
    let ranged = train(&length_config(tmp.path(), &with(&on, &["trainer.total_steps=2", "algorithm.filter_groups.reward_range=[-0.9, -0.1]"])), &Resume::None, no_stop()).unwrap();
    assert_eq!(ranged.steps, 2);

    // One epoch of 16 rounds runs out mid-step, before the 16 steps planned: the last step
    // done still gets its checkpoint (no save_freq here).
    let tmp = tempfile::tempdir().unwrap();
    let once = train(&length_config(tmp.path(), &with(&on, &["trainer.total_epochs=1", "trainer.save_freq=0", "trainer.total_steps=100"])), &Resume::None, no_stop()).unwrap();
    assert!(once.steps > 0 && once.steps < 16, "{} steps", once.steps);
    let last = once.last_checkpoint.expect("a checkpoint at the end");
    assert!(last.ends_with(format!("global_step_{}", once.steps)), "{}", last.display());

    // Out of data exactly at a step's end: a range every mean is in keeps every prompt, so 16
    // rounds of 4 make 8 steps of 8, and the 9th finds no round. The 8th still gets saved.
    let tmp = tempfile::tempdir().unwrap();
    let all = ["trainer.total_epochs=1", "trainer.save_freq=0", "trainer.total_steps=100", "algorithm.filter_groups.reward_range=[-100.0, 100.0]"];
    let exact = train(&length_config(tmp.path(), &with(&on, &all)), &Resume::None, no_stop()).unwrap();
    assert_eq!(exact.steps, 8);
    assert!(exact.last_checkpoint.expect("a checkpoint at the end").ends_with("global_step_8"));

    // A reward that never differs (no length penalty: every response scores the bonus) fills
    // no step.
    let tmp = tempfile::tempdir().unwrap();
    let tie = ["reward.params.scale=0.0", "algorithm.filter_groups.max_num_gen_batches=3"];
    let err = train(&length_config(tmp.path(), &with(&on, &tie)), &Resume::None, no_stop()).unwrap_err().to_string();
    assert!(err.contains("3 generation rounds") && err.contains("max_num_gen_batches"), "{err}");
}

#[test]
fn mini_batches_counted_in_sequences_may_split_a_prompts_samples() {
    let base = ["rollout.n=3", "actor.ppo_micro_batch_size=4", "trainer.total_steps=2", "trainer.test_freq=0"];
    let tmp = tempfile::tempdir().unwrap();
    let run = |dir: &str, extra: &[&str]| {
        let all: Vec<&str> = base.iter().chain(extra).copied().collect();
        train(&config(&tmp.path().join(dir), &all), &Resume::None, no_stop()).unwrap()
    };
    // 12 sequences are 4 prompts × 3: the same updates as ppo_mini_batch_size = 4.
    let prompts = run("a", &["actor.ppo_mini_batch_size=4"]);
    let seqs = run("b", &["actor.ppo_mini_batch_sequences=12"]);
    assert_eq!(stable(&prompts.history), stable(&seqs.history));
    // 8 sequences: 3 updates per step of 24, the second taking one prompt's samples from
    // each side (Search-R1's 256 of n_agent 5 do the same).
    let straddling = run("c", &["actor.ppo_mini_batch_sequences=8"]);
    assert_ne!(stable(&straddling.history), stable(&prompts.history));
    assert!(straddling.history.iter().all(|m| m.get("actor/pg_loss").is_some_and(f64::is_finite)));
    let e = TrainConfig::from_str_with(&config_text(tmp.path()), "test", &["rollout.n=3".into(), "actor.ppo_mini_batch_sequences=7".into()])
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("actor.ppo_mini_batch_sequences = 7") && e.contains("24 sequences"), "{e}");
}

#[test]
fn bad_policy_loss_settings_are_refused_with_their_key() {
    let tmp = tempfile::tempdir().unwrap();
    let err = |extra: &[&str]| {
        let overrides: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        TrainConfig::from_str_with(&config_text(tmp.path()), "test", &overrides).map(|_| ()).unwrap_err().to_string()
    };
    let e = err(&["actor.policy_loss.loss_mode=gspoo"]);
    assert!(e.contains("actor.policy_loss.loss_mode") && e.contains("gspo"), "{e}");
    let e = err(&["actor.policy_loss.loss_mode=dro"]);
    assert!(e.contains("dro_beta"), "{e}");
    let e = err(&["actor.policy_loss.loss_mode=kl_cov", "actor.policy_loss.kl_cov_ratio=0"]);
    assert!(e.contains("kl_cov_ratio"), "{e}");
    let e = err(&["actor.policy_loss.los_mode=gspo"]);
    assert!(e.contains("actor.policy_loss.loss_mode"), "{e}");
}

/// One epoch over one mini-batch: no old-log-prob pass (TRL skips it too), and the update it
/// makes is the one made with the old log-probs computed by a pass of their own.
#[test]
fn an_on_policy_step_skips_the_old_log_prob_pass_and_updates_the_same() {
    use reinforge_algos::Mat;
    use reinforge_trainer::roles::{ActorMiniBatch, SeqBatch};
    let tmp = tempfile::tempdir().unwrap();
    let on_policy = ["actor.ppo_epochs=1", "actor.ppo_mini_batch_size=8", "actor.use_kl_loss=true"];
    let cfg = config(tmp.path(), &on_policy);
    assert!(!cfg.old_log_probs_needed());
    assert!(config(tmp.path(), &[]).old_log_probs_needed(), "two epochs need the old policy");
    assert!(config(tmp.path(), &["actor.ppo_epochs=1", "actor.ppo_mini_batch_size=8", "algorithm.use_kl_in_reward=true"]).old_log_probs_needed());

    // The role: the same update from the same start, with and without the old log-probs.
    let prompts: Vec<Vec<u32>> = vec![vec![5, 6, 7], vec![8, 9], vec![10, 11, 12, 13], vec![14]];
    let responses: Vec<Vec<u32>> = vec![vec![20, 21, 22], vec![25, 26], vec![27, 28, 29], vec![33]];
    let p: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let r: Vec<&[u32]> = responses.iter().map(Vec::as_slice).collect();
    let batch = SeqBatch::build(&p, &r, 0);
    let width = batch.response_len;
    let adv = Mat::new(4, width, (0..4 * width).map(|k| 0.3 - 0.07 * k as f64).collect()).unwrap();
    let rows: Vec<usize> = (0..4).collect();
    let model_dir = repo().join("examples/tiny-arith");
    let update = |with_old: bool| {
        let mut policy = reinforge_trainer::build::policy_group(&cfg, &model_dir, None).unwrap();
        let old = policy.logprobs(&batch, reinforge_trainer::roles::MicroBatching::Seqs(8)).unwrap();
        // A reference a little off the policy, so the KL terms are not zero.
        let reference = Mat::new(4, width, old.data().iter().map(|x| x - 0.05).collect()).unwrap();
        let mini = ActorMiniBatch { rows: &rows, old_log_probs: with_old.then_some(&old), advantages: &adv, ref_log_probs: Some(&reference), norm: None };
        let m = policy.update(&batch, &mini, 1e-2).unwrap();
        let kl = reinforge_algos::kl_penalty(&old, &reference, "kl".parse().unwrap()).unwrap();
        let mask = batch.response_mask.data();
        let kl_ref = kl.data().iter().zip(mask).map(|(k, m)| k * m).sum::<f64>() / mask.iter().sum::<f64>();
        let weights: Vec<f32> = policy.state().unwrap().tensors.into_values().flat_map(|t| t.data).collect();
        (m, weights, kl_ref)
    };
    let (with, w_with, kl_ref) = update(true);
    let (without, w_without, _) = update(false);
    for k in ["actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"] {
        let (a, b) = (with.get(k).unwrap(), without.get(k).unwrap());
        assert!((a - b).abs() <= 1e-6 * a.abs().max(1.0), "{k}: {a} with the old log-probs, {b} without");
    }
    assert_eq!(without.get("actor/pg_clipfrac"), Some(0.0));
    assert_eq!(without.get("actor/ppo_kl"), Some(0.0));
    let measured = without.get("actor/kl_ref").expect("the update measures the KL to the reference");
    assert!((measured - kl_ref).abs() <= 1e-6, "kl_ref {measured}, from the old log-probs {kl_ref}");
    // The separate pass (no autodiff) and the update's forward agree to ~1e-7, not bit for
    // bit, so the ratio there is 1 ± 1e-7; Adam's first step (lr · g/|g|) magnifies that only
    // in weights whose gradient is near zero. The same update: every weight within 1 % of a
    // step (lr = 1e-2), almost all of them exactly.
    assert!(with.get("actor/ppo_kl").is_some_and(|k| k.abs() < 1e-6), "{with:?}");
    let diffs: Vec<f32> = w_with.iter().zip(&w_without).map(|(a, b)| (a - b).abs()).collect();
    let worst = diffs.iter().copied().fold(0f32, f32::max);
    let moved = diffs.iter().filter(|d| **d > 1e-7).count();
    eprintln!("weights: {} of {} differ by more than 1e-7, at most {worst}", moved, diffs.len());
    assert!(worst <= 1e-4, "the updates differ by up to {worst}");
    assert!(moved * 1000 <= diffs.len(), "{moved} of {} weights differ", diffs.len());

    // The loop: no old-log-prob pass, the KL to the reference still reported.
    let s = train(&config(tmp.path(), &[&on_policy[..], &["trainer.total_steps=2", "trainer.test_freq=0"]].concat()), &Resume::None, no_stop()).unwrap();
    for m in &s.history {
        assert!(m.get("timing_s/old_log_prob").is_none(), "an old-log-prob pass ran");
        assert!(m.get("actor/kl_ref").is_some_and(f64::is_finite));
    }
}

#[test]
fn token_budget_micro_batches_give_the_same_log_probs_and_update() {
    use reinforge_algos::Mat;
    use reinforge_trainer::roles::{ActorMiniBatch, MicroBatching, SeqBatch};
    let tmp = tempfile::tempdir().unwrap();
    let fixed = config(tmp.path(), &["actor.use_kl_loss=true", "actor.entropy_coeff=0.01"]);
    let budget = fixed.data.max_prompt_length + fixed.data.max_response_length;
    let dynamic = config(tmp.path(), &["actor.use_kl_loss=true", "actor.entropy_coeff=0.01", "actor.use_dynamic_bsz=true", &format!("actor.ppo_max_token_len_per_gpu={budget}")]);
    // The CPU engine pads rows, so every sample counts its whole prompt.
    assert_eq!(dynamic.actor_micro(), MicroBatching::Tokens { max: budget, shared_prompts: false });
    // Prompts of 5 to 40 tokens (two samples share each), responses of 1 to 3.
    let prompt = |len: usize, k: u32| (0..len as u32).map(|i| 3 + (i * 7 + k) % 90).collect::<Vec<u32>>();
    let prompts: Vec<Vec<u32>> = [30, 30, 31, 31, 10, 25, 40, 40, 5].iter().zip([1, 1, 2, 2, 3, 4, 5, 5, 6]).map(|(&l, k)| prompt(l, k)).collect();
    let responses: Vec<Vec<u32>> = (0..prompts.len() as u32).map(|i| (0..1 + i % 3).map(|j| 10 + i + j).collect()).collect();
    let p: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let r: Vec<&[u32]> = responses.iter().map(Vec::as_slice).collect();
    let batch = SeqBatch::build(&p, &r, 0);
    let n = batch.len();
    let rows: Vec<usize> = (0..n).collect();
    let split = batch.micro_batches(&rows, dynamic.actor_micro());
    assert!(split.len() >= 4, "the budget should split the batch: {split:?}");
    let width = batch.response_len;
    let adv = Mat::new(n, width, (0..n * width).map(|k| 0.3 - 0.05 * k as f64).collect()).unwrap();
    let model_dir = repo().join("examples/tiny-arith");
    let run = |cfg: &reinforge_trainer::TrainConfig| {
        let mut policy = reinforge_trainer::build::policy_group(cfg, &model_dir, None).unwrap();
        let old = policy.logprobs(&batch, cfg.actor_micro()).unwrap();
        let reference = Mat::new(n, width, old.data().iter().map(|x| x - 0.05).collect()).unwrap();
        let mini = ActorMiniBatch { rows: &rows, old_log_probs: Some(&old), advantages: &adv, ref_log_probs: Some(&reference), norm: None };
        let m = policy.update(&batch, &mini, 1e-2).unwrap();
        let weights: Vec<f32> = policy.state().unwrap().tensors.into_values().flat_map(|t| t.data).collect();
        (old, m, weights)
    };
    let (lp_fixed, m_fixed, w_fixed) = run(&fixed);
    let (lp_dyn, m_dyn, w_dyn) = run(&dynamic);
    // Response tokens only: past a response, the entries are whatever each layout leaves.
    let mask = batch.response_mask.data();
    let worst_lp = lp_fixed.data().iter().zip(lp_dyn.data()).zip(mask).filter(|(_, &m)| m > 0.0).map(|((a, b), _)| (a - b).abs()).fold(0.0, f64::max);
    assert!(worst_lp <= 1e-5, "log-probs differ by up to {worst_lp}");
    for k in ["actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"] {
        let (a, b) = (m_fixed.get(k).unwrap(), m_dyn.get(k).unwrap());
        assert!((a - b).abs() <= 1e-5 * a.abs().max(1.0), "{k}: {a} in micro-batches of 8 sequences, {b} by token budget");
    }
    // As in the on-policy test above: Adam's first step (lr · g/(|g| + ε)) magnifies rounding
    // only where a gradient is near zero: a handful of weights within 2 % of a step (lr 1e-2).
    let diffs: Vec<f32> = w_fixed.iter().zip(&w_dyn).map(|(a, b)| (a - b).abs()).collect();
    let worst = diffs.iter().copied().fold(0f32, f32::max);
    let moved = diffs.iter().filter(|d| **d > 1e-7).count();
    eprintln!("{} micro-batches by budget; weights: {moved} of {} differ by more than 1e-7, at most {worst}", split.len(), diffs.len());
    assert!(worst <= 2e-4, "the updates differ by up to {worst}");
    assert!(moved * 1000 <= diffs.len(), "{moved} of {} weights differ", diffs.len());

    // A budget below the longest sequence is refused, naming the fix.
    let e = reinforge_trainer::TrainConfig::from_str_with(&fixed.to_toml(), "t", &["actor.use_dynamic_bsz=true".into(), "actor.ppo_max_token_len_per_gpu=40".into()]).unwrap_err().to_string();
    assert!(e.contains("actor.ppo_max_token_len_per_gpu") && e.contains(&budget.to_string()), "{e}");
    // The loop runs with it, a critic included.
    let s = train(&config(tmp.path(), &["actor.use_dynamic_bsz=true", "actor.ppo_max_token_len_per_gpu=100", "algorithm.adv_estimator=\"gae\"", "critic.use_dynamic_bsz=true", "critic.ppo_max_token_len_per_gpu=100", "trainer.total_steps=2", "trainer.test_freq=0", "trainer.save_freq=0"]), &Resume::None, no_stop()).unwrap();
    assert_eq!(s.steps, 2);
    assert!(s.history[1].get("critic/vf_loss").is_some_and(f64::is_finite));
}

/// Validation samples with a top-k and top-p of its own (verl's `val_kwargs`), not the
/// rollout's: top-k 1 at temperature 1 gives greedy decoding's responses.
#[test]
fn validation_samples_with_its_own_top_k_and_top_p() {
    let val_responses = |extra: &[&str]| -> Vec<String> {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path().join("run");
        let mut all = vec!["trainer.total_steps=1", "trainer.test_freq=1", "trainer.save_freq=0", "trainer.log_val_generations=8"];
        all.extend(extra);
        train(&config(&run, &all), &Resume::None, no_stop()).unwrap();
        let text = std::fs::read_to_string(run.join(reinforge_metrics::SAMPLES_FILE)).unwrap();
        let rows: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let val: Vec<String> = rows.iter().filter(|r| r["split"] == "val").map(|r| r["response"].as_str().unwrap().to_string()).collect();
        assert_eq!(val.len(), 8, "{text}");
        val
    };
    let greedy = val_responses(&["rollout.val_temperature=0"]);
    assert_eq!(val_responses(&["rollout.val_temperature=1.0", "rollout.val_top_k=1", "rollout.top_k=0", "rollout.top_p=1.0"]), greedy);
    assert_eq!(val_responses(&["rollout.val_temperature=1.0", "rollout.val_top_p=0.001", "rollout.top_p=1.0"]), greedy);
    // The rollout's own top-k is not validation's.
    assert_ne!(val_responses(&["rollout.val_temperature=1.0", "rollout.val_top_k=0", "rollout.top_k=1"]), greedy);
}

#[test]
fn val_only_validates_the_resumed_weights_and_trains_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let trained = train(&config(&run, &["trainer.total_steps=3"]), &Resume::None, no_stop()).unwrap();
    let at_3 = trained.history[2].get("val/reward/mean").expect("validated at step 3");
    let ckpts = || std::fs::read_dir(run.join("checkpoints")).unwrap().map(|e| e.unwrap().file_name()).collect::<std::collections::BTreeSet<_>>();
    let before = (ckpts(), weights(&run.join("checkpoints/global_step_3/actor")));

    // Same directory, val_only: the step-3 checkpoint's weights give step 3's validation.
    let only = train(&config(&run, &["trainer.val_only=true"]), &Resume::Auto, no_stop()).unwrap();
    assert_eq!((only.steps, only.history.len(), only.last_checkpoint.clone()), (3, 1, None));
    assert_eq!(only.history[0].get("val/reward/mean"), Some(at_3));
    assert!(only.history[0].get("actor/pg_loss").is_none(), "no training step");
    assert_eq!((ckpts(), weights(&run.join("checkpoints/global_step_3/actor"))), before, "nothing saved");

    // A fresh model: the same numbers as the validation before training.
    let fresh = train(&config(&tmp.path().join("a"), &["trainer.val_only=true"]), &Resume::None, no_stop()).unwrap();
    let first = train(&config(&tmp.path().join("b"), &["trainer.val_before_train=true", "trainer.total_steps=1"]), &Resume::None, no_stop()).unwrap();
    assert_eq!((fresh.steps, fresh.history.len()), (0, 1));
    assert_eq!(fresh.history[0].get("val/reward/mean"), first.history[0].get("val/reward/mean"));

    // Nothing to validate on is a config error, by key.
    let text = config_text(&tmp.path().join("c")).replace("val_generate = ", "# ");
    let err = TrainConfig::from_str_with(&text, "test", &["trainer.val_only=true".into()]).unwrap_err().to_string();
    assert!(err.contains("trainer.val_only") && err.contains("data.val_files"), "{err}");
}

#[test]
fn stop_properly_penalty_scales_or_replaces_truncated_scores() {
    // OpenRLHF's apply_stop_properly_penalty, after its overlong penalty.
    let mut r = reinforge_trainer::config::RewardConfig { stop_properly_penalty_coef: Some(0.5), ..Default::default() };
    assert_eq!((r.shaped(0.8, 8, 8, true), r.shaped(0.8, 8, 8, false)), (0.4, 0.8));
    r.stop_properly_penalty_coef = Some(-0.5);
    assert_eq!((r.shaped(0.8, 8, 8, true), r.shaped(0.8, 8, 8, false)), (-0.5, 0.8));
    r.overlong_buffer = reinforge_trainer::config::OverlongBuffer { enable: true, len: 4, penalty_factor: 1.0, max_resp_len: None };
    r.stop_properly_penalty_coef = Some(0.5);
    assert_eq!(r.shaped(1.0, 6, 8, false), 0.5, "overlong alone");
    assert_eq!(r.shaped(1.0, 8, 8, true), 0.0, "(1 - 1) × 0.5");

    // A random model runs into the 3-token limit: those responses score -0.5 (qa_em gives 0/1).
    let tmp = tempfile::tempdir().unwrap();
    let s = train(&config(tmp.path(), &["reward.stop_properly_penalty_coef=-0.5", "trainer.total_steps=1", "trainer.test_freq=0"]), &Resume::None, no_stop()).unwrap();
    let m = &s.history[0];
    assert!(m.get("reward/stop_properly_penalized_frac").unwrap() > 0.0);
    assert_eq!(m.get("critic/score/min"), Some(-0.5));
    for bad in ["1.5", "nan"] {
        let e = TrainConfig::from_str_with(&config_text(tmp.path()), "test", &[format!("reward.stop_properly_penalty_coef={bad}")]).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("reward.stop_properly_penalty_coef"), "{e}");
    }
}

#[test]
fn chat_template_kwargs_reach_the_template() {
    // tiny-arith with a template that reads a variable, as Qwen3's reads enable_thinking.
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    std::fs::create_dir(&model).unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(repo().join("examples/tiny-arith").join(f), model.join(f)).unwrap();
    }
    let mut tc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(repo().join("examples/tiny-arith/tokenizer_config.json")).unwrap()).unwrap();
    tc["chat_template"] = "{% if think is defined and not think %}#{% endif %}{% for message in messages %}{{ message['content'] }}{% endfor %}{% if add_generation_prompt %} {% endif %}".into();
    std::fs::write(model.join("tokenizer_config.json"), tc.to_string()).unwrap();
    let prompts = |dir: &str, extra: &[&str]| {
        let run = tmp.path().join(dir);
        let text = config_text(&run).replace(&repo().join("examples/tiny-arith").display().to_string(), &model.display().to_string());
        let mut o: Vec<String> = vec!["trainer.total_steps=1".into(), "trainer.test_freq=0".into(), "trainer.log_train_samples=4".into()];
        o.extend(extra.iter().map(|s| s.to_string()));
        train(&TrainConfig::from_str_with(&text, "test", &o).unwrap(), &Resume::None, no_stop()).unwrap();
        let lines = std::fs::read_to_string(run.join("samples.jsonl")).unwrap();
        lines.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["prompt"].as_str().unwrap().to_string()).collect::<Vec<_>>()
    };
    let plain = prompts("a", &[]);
    let off = prompts("b", &["data.apply_chat_template_kwargs={ think = false }"]);
    assert!(!plain.is_empty() && plain.len() == off.len());
    for (p, o) in plain.iter().zip(&off) {
        assert!(!p.starts_with('#'), "{p}");
        assert_eq!(o, &format!("#{p}"), "the variable reached the template");
    }
    let e = TrainConfig::from_str_with(&config_text(tmp.path()), "test", &["data.apply_chat_template_kwargs={ add_generation_prompt = false }".into()]).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("data.apply_chat_template_kwargs.add_generation_prompt"), "{e}");
}

#[test]
fn a_verl_python_reward_function_trains_as_the_same_builtin_reward() {
    // The test config's reward (qa_em on the whole response), written as a verl
    // compute_score: the run must repeat the built-in's numbers exactly.
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("my_reward.py");
    std::fs::write(&file, r#"
import re, string
def norm(s):
    s = "".join(c for c in s.lower() if c not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())
def compute_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):
    return scale * float(norm(solution_str) == norm(str(ground_truth)))
"#).unwrap();
    let steps = ["trainer.total_steps=2", "trainer.test_freq=2"];
    let builtin = train(&config(&tmp.path().join("a"), &steps), &Resume::None, no_stop()).unwrap();
    let text = config_text(&tmp.path().join("b")).replace(
        "kind = \"qa_em\"\nparams = { extract = \"whole\" }",
        &format!("kind = \"python\"\nparams = {{ path = {:?}, kwargs = {{ scale = 1.0 }} }}", file.display().to_string()),
    );
    assert!(text.contains("\"python\""), "the test config's reward section moved");
    let py = train(&TrainConfig::from_str_with(&text, "test", &steps.map(String::from)).unwrap(), &Resume::None, no_stop()).unwrap();
    let (a, b) = (stable(&builtin.history), stable(&py.history));
    assert_eq!(a.len(), b.len());
    assert!(py.history[1].get("val/reward/mean").is_some());
    assert!(py.history.iter().any(|m| m.get("critic/score/max") == Some(1.0)), "some answer is right, so the comparison is not of zeros");
    for (sa, sb) in a.iter().zip(&b) {
        let theirs: BTreeMap<&str, f64> = sb.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        let shared: Vec<_> = sa.iter().filter(|(k, _)| theirs.contains_key(k.as_str())).collect();
        assert!(shared.iter().any(|(k, _)| k == "critic/score/mean"));
        for (k, v) in shared {
            assert_eq!(theirs[k.as_str()], *v, "{k}");
        }
    }
    // A file that does not load stops the run before training, naming the cause.
    std::fs::write(&file, "import not_a_module_anywhere\n").unwrap();
    let cfg = TrainConfig::from_str_with(&text.replace("/b\"", "/c\""), "test", &steps.map(String::from)).unwrap();
    let err = train(&cfg, &Resume::None, no_stop()).map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("ModuleNotFoundError") && err.contains("my_reward.py"), "{err}");
}

#[test]
fn validation_scores_with_its_own_reward_when_one_is_named() {
    // Search-R1 trains with format scores and validates with plain EM: [reward.val].
    let tmp = tempfile::tempdir().unwrap();
    let steps = ["trainer.total_steps=1", "trainer.test_freq=1"];
    let same = train(&config(&tmp.path().join("a"), &steps), &Resume::None, no_stop()).unwrap();
    let own = [&steps[..], &["reward.val.kind=\"format\"", "reward.val.params={ pattern = \".*\", match_score = 0.75 }"]].concat();
    let other = train(&config(&tmp.path().join("b"), &own), &Resume::None, no_stop()).unwrap();
    assert_eq!(other.history[0].get("val/reward/mean"), Some(0.75), "every response matches `.*`");
    assert_ne!(same.history[0].get("val/reward/mean"), Some(0.75));
    // Training scores stay [reward]'s.
    assert_eq!(other.history[0].get("critic/score/mean"), same.history[0].get("critic/score/mean"));
}

#[test]
fn python_rewards_get_ground_truths_as_stored() {
    // A struct serialised into a string column reaches verl's compute_score as that string.
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d.jsonl");
    let rows: String = (0..8).map(|i| format!("{{\"prompt\": \"{i}+1=\", \"data_source\": \"x\", \"reward_model\": {{\"ground_truth\": \"{{\\\"target\\\": {}}}\"}}}}\n", i + 1)).collect();
    std::fs::write(&data, rows).unwrap();
    let file = tmp.path().join("r.py");
    std::fs::write(&file, "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return float(isinstance(ground_truth, str))\n").unwrap();
    let text = config_text(&tmp.path().join("run"))
        .replace("\ngenerate = {", &format!("\ntrain_files = [{:?}]\n# generate = {{", data.display().to_string()))
        .replace("kind = \"qa_em\"\nparams = { extract = \"whole\" }", &format!("kind = \"python\"\nparams = {{ path = {:?} }}", file.display().to_string()));
    let run = |extra: &[&str], dir: &str| {
        let mut o: Vec<String> = vec!["trainer.total_steps=1".into(), "trainer.test_freq=0".into(), format!("trainer.default_local_dir={:?}", tmp.path().join(dir).display().to_string())];
        o.extend(extra.iter().map(|s| s.to_string()));
        train(&TrainConfig::from_str_with(&text, "test", &o).unwrap(), &Resume::None, no_stop()).unwrap().history[0].get("critic/score/mean")
    };
    assert_eq!(run(&[], "a"), Some(1.0), "the string, as verl passes it");
    assert_eq!(run(&["data.decode_json_ground_truth=true"], "b"), Some(0.0), "decoded on request");
}

#[test]
fn dynamic_sampling_reads_the_rewards_own_acc() {
    // verl's DAPO filter reads the `acc` a compute_score returns in its dict, not the score:
    // here every score is 1 and only `acc` tells a prompt's samples apart.
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("r.py");
    std::fs::write(&file, "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return {\"score\": 1.0, \"acc\": float(len(solution_str) % 2)}\n").unwrap();
    let text = config_text(&tmp.path().join("run"))
        .replace("kind = \"qa_em\"\nparams = { extract = \"whole\" }", &format!("kind = \"python\"\nparams = {{ path = {:?} }}", file.display().to_string()));
    let o: Vec<String> = ["trainer.total_steps=1", "trainer.test_freq=0", "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=\"acc\""].map(String::from).to_vec();
    let s = train(&TrainConfig::from_str_with(&text, "test", &o).unwrap(), &Resume::None, no_stop()).unwrap();
    let m = &s.history[0];
    assert_eq!(m.get("critic/score/mean"), Some(1.0));
    let acc = m.get("reward/acc/mean").expect("the dict's other numbers are logged");
    assert!(acc > 0.0 && acc < 1.0, "acc varies where the score does not: {acc}");
}

#[test]
fn lora_trains_the_adapter_only_resumes_exactly_and_exports_merged() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, c) = (tmp.path().join("a"), tmp.path().join("c"));
    let lora = ["actor.lora_rank=4", "actor.lora_alpha=8", "actor.target_modules=\"all-linear\"", "actor.lr=2e-2"];
    let with = |extra: &[&str]| -> Vec<String> { lora.iter().chain(extra).map(|s| s.to_string()).collect() };
    let cfg = |dir: &Path, extra: &[&str]| {
        let o = with(extra);
        config(dir, &o.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let full = train(&cfg(&a, &[]), &Resume::None, no_stop()).unwrap();
    let first = train(&cfg(&c, &["trainer.total_steps=3"]), &Resume::None, no_stop()).unwrap();
    let rest = train(&cfg(&c, &[]), &Resume::Auto, no_stop()).unwrap();
    let mut joined = first.history.clone();
    joined.extend(rest.history.clone());
    assert_eq!(stable(&full.history), stable(&joined), "a resumed LoRA run must match the uninterrupted one");

    let ck = a.join("checkpoints/global_step_6/actor");
    // The model's own weights never move: the checkpoint holds the random init as it was.
    let mcfg = reinforge_engine::ModelConfig::from_dir(&repo().join("examples/tiny-arith")).unwrap();
    let init: Vec<f32> = CausalLm::random(mcfg, 5, &Device::flex()).unwrap().to_hf_tensors().unwrap().into_values().flat_map(|t| t.data).collect();
    let base_weights = |dir: &Path| -> Vec<f32> { CausalLm::load_base(dir, &Device::flex()).unwrap().to_hf_tensors().unwrap().into_values().flat_map(|t| t.data).collect() };
    assert_eq!(base_weights(&ck), init, "LoRA moved a frozen weight");
    assert_eq!(base_weights(&ck), base_weights(&c.join("checkpoints/global_step_6/actor")));
    // Loaded as a plain model, the directory would be the untrained base: refused.
    let e = CausalLm::load(&ck, &Device::flex()).unwrap_err().to_string();
    assert!(e.contains("holds a LoRA adapter") && e.contains("reinforge export"), "{e}");
    // The adapter is PEFT's files; it trained (B starts at zero) and resumed to the same values.
    let adapter = reinforge_engine::Adapter::read(&ck).unwrap();
    assert_eq!((adapter.config.rank, adapter.config.alpha, adapter.config.targets.len()), (4, 8.0, 7));
    assert!(adapter.tensors.iter().any(|(k, t)| k.ends_with("lora_B.weight") && t.data.iter().any(|&x| x != 0.0)), "the adapter did not train");
    let resumed = reinforge_engine::Adapter::read(&c.join("checkpoints/global_step_6/actor")).unwrap();
    for (k, t) in &adapter.tensors {
        assert_eq!(t.data, resumed.tensors[k].data, "{k} differs after resume");
    }
    let opt = reinforge_engine::OptimizerState::read(&std::fs::read(ck.join("optimizer.safetensors")).unwrap(), &ck).unwrap();
    assert!(!opt.exp_avg.is_empty() && opt.exp_avg.keys().all(|k| reinforge_engine::lora::is_lora_name(k)), "optimizer state beyond the adapter");

    // Export: the adapter merged into a plain model, and kept under lora_adapter/.
    let out = tmp.path().join("hf");
    reinforge_trainer::export_hf(&a.join("checkpoints/global_step_6"), &out).unwrap();
    assert!(out.join("lora_adapter/adapter_config.json").is_file() && out.join("lora_adapter/adapter_model.safetensors").is_file());
    assert!(!out.join("adapter_config.json").exists());
    let input = ForwardInput::from_mask(vec![vec![5, 6, 7, 8]], vec![vec![true; 4]]);
    let logits = |m: &CausalLm| -> Vec<f32> { m.forward(&input).unwrap().into_data().try_into_vec().unwrap() };
    let base = CausalLm::load_base(&ck, &Device::flex()).unwrap();
    let tuned = logits(&CausalLm::load_base(&ck, &Device::flex()).unwrap().with_lora(&adapter).unwrap());
    let merged = logits(&CausalLm::load(&out, &Device::flex()).unwrap());
    assert!(tuned.iter().zip(&merged).all(|(x, y)| (x - y).abs() < 1e-5), "the merged export differs from base + adapter");
    assert!(logits(&base).iter().zip(&merged).any(|(x, y)| (x - y).abs() > 1e-4), "the export is the base model");

    // A PEFT adapter directory starts a new run (verl's lora_adapter_path: its own rank and
    // alpha apply); at lr 1e-30 (no change in f32) the run's first checkpoint holds it as it was.
    let b = tmp.path().join("b");
    let from = format!("actor.lora_adapter_path=\"{}\"", ck.display());
    train(&config(&b, &[&from, "actor.lr=1e-30", "trainer.total_steps=1", "trainer.save_freq=1", "trainer.test_freq=0"]), &Resume::None, no_stop()).unwrap();
    let started = reinforge_engine::Adapter::read(&b.join("checkpoints/global_step_1/actor")).unwrap();
    assert_eq!(started.config, adapter.config);
    for (k, t) in &adapter.tensors {
        assert_eq!(t.data, started.tensors[k].data, "{k} of the adapter the run started from");
    }

    // A LoRA checkpoint does not continue as full fine-tuning by accident.
    let e = train(&config(&c, &["trainer.total_steps=7"]), &Resume::Auto, no_stop()).unwrap_err().to_string();
    assert!(e.contains("trains a LoRA adapter") && e.contains("lora_rank"), "{e}");
    // Nor does a full fine-tuning checkpoint continue as LoRA.
    let d = tmp.path().join("d");
    train(&config(&d, &["trainer.total_steps=1", "trainer.save_freq=1", "trainer.test_freq=0"]), &Resume::None, no_stop()).unwrap();
    let e = train(&cfg(&d, &["trainer.total_steps=2"]), &Resume::Auto, no_stop()).unwrap_err().to_string();
    assert!(e.contains("fine-tunes every weight") && e.contains("--resume none"), "{e}");
}
