//! The command line's own behaviour: one-line errors that do not repeat their cause, and the
//! kernel path forced with `REINFORGE_ISA` (refused when the CPU lacks it, reported by `bench`).

use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_reinforge");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

#[test]
fn a_missing_config_is_one_line_naming_the_cause_once() {
    let o = Command::new(BIN).args(["config", "show", "/nonexistent/run.toml"]).output().unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("error: cannot read config /nonexistent/run.toml"), "{err}");
    assert_eq!(err.matches("No such file or directory").count(), 1, "the cause is said once: {err}");
    assert!(!err.contains('\x1b'), "{err}");
}

#[test]
fn a_forced_kernel_path_is_checked_and_reported() {
    // An unknown name, and (where the CPU has no AVX-512) a path it cannot run: refused first.
    let o = Command::new(BIN).env("REINFORGE_ISA", "sse9").args(["config", "show", "examples/quickstart.toml"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.starts_with("error: REINFORGE_ISA=sse9: unknown path; use one of") && err.contains("portable"), "{err}");
    let paths = reinforge_kernels::Isa::available();
    if !paths.contains(&reinforge_kernels::Isa::Avx512) {
        let o = Command::new(BIN).env("REINFORGE_ISA", "avx512").args(["config", "show", "x.toml"]).output().unwrap();
        assert!(String::from_utf8_lossy(&o.stderr).contains("this CPU cannot run the avx512 path"));
    }

    // Every path this CPU has runs the rollout bench, which says which one it took and on what CPU.
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    for isa in paths {
        let o = Command::new(BIN)
            .env("REINFORGE_ISA", isa.name())
            .args(["bench", "rollout", "--model"])
            .arg(&model)
            .args(["--batch", "2", "--max-new-tokens", "4", "--repeats", "1"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}: {}", isa.name(), String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["isa"], isa.name());
        assert!(v["cpu"].as_str().is_some_and(|c| !c.is_empty()), "{v}");
        assert!(v["generated_tokens"].as_u64().unwrap() > 0, "{v}");
    }
}

/// `bench rollout --decode-breakdown` on the emulator: the bench's line, then one per op of the
/// decode step with its calls per step, and the tokens unchanged with the op launched twice;
/// refused on the CPU engine and without decode steps, before any work.
#[test]
fn the_decode_breakdown_times_every_op_of_a_step() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let run = |extra: &[&str]| Command::new(BIN).args(["bench", "rollout", "--model"]).arg(&model).args(["--batch", "2", "--repeats", "1", "--decode-breakdown"]).args(extra).output().unwrap();
    let o = run(&["--device", "cuda-emu", "--max-new-tokens", "5"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["bench"], "rollout");
    let b = &lines[1];
    assert_eq!(b["bench"], "rollout-breakdown", "{b}");
    let layers = b["layers"].as_u64().unwrap();
    let ops = b["ops"].as_array().unwrap();
    let names: Vec<&str> = ops.iter().map(|o| o["op"].as_str().unwrap()).collect();
    assert_eq!(names, ["embed", "qkv", "attention", "o_proj", "gate_up", "down", "final_norm", "logits", "sample"]);
    for op in ops {
        let per_layer = ["qkv", "attention", "o_proj", "gate_up", "down"].contains(&op["op"].as_str().unwrap());
        assert_eq!(op["calls_per_step"].as_u64().unwrap(), if per_layer { layers } else { 1 }, "{op}");
        assert_eq!(op["same_tokens"], true, "{op}");
        assert!(op["us_per_call"].as_f64().is_some(), "{op}");
    }
    assert!(String::from_utf8_lossy(&o.stderr).contains("µs per call"), "the table goes to stderr");
    for (extra, want) in [(&["--device", "cuda-emu", "--max-new-tokens", "2"][..], "use --max-new-tokens 3 or more"), (&["--max-new-tokens", "5"][..], "use it with --device cuda")] {
        let o = run(extra);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(want) && o.stdout.is_empty(), "{extra:?}: {err}");
    }
}

/// The quickstart's tiny architecture with random weights, as an HF directory.
fn tiny_model(dir: &Path) -> PathBuf {
    use reinforge_engine::{CausalLm, ModelConfig};
    let src = repo().join("examples/tiny-arith");
    let model = CausalLm::random(ModelConfig::from_dir(&src).unwrap(), 3, &burn::tensor::Device::flex()).unwrap();
    let out = dir.join("tiny");
    std::fs::create_dir_all(&out).unwrap();
    reinforge_engine::weights::write_safetensors(&out.join("model.safetensors"), &model.to_hf_tensors().unwrap(), None).unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), out.join(f)).unwrap();
    }
    out
}

/// `reinforge doctor` on this machine: the quickstart passes; a config whose rollout needs more
/// memory than any machine has fails the memory check with a fix, exit code 1; nothing is left
/// in the run directory's parent.
#[test]
fn doctor_on_this_machine() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let dir = format!("trainer.default_local_dir=\"{}\"", run.display());
    let cfg = repo().join("examples/quickstart.toml");
    let o = Command::new(BIN).current_dir(repo()).arg("doctor").arg(&cfg).arg(&dir).arg("--local").arg("--json").output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<&str> = v["checks"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["binary", "memory", "shm", "disk", "gpu"]);
    assert!(v["checks"][1]["saw"].as_str().unwrap().contains("every role in this process"), "{v}");

    // 2000 prompts × 8192 samples in one rollout: hundreds of GiB of KV cache.
    let o = Command::new(BIN)
        .current_dir(repo())
        .arg("doctor")
        .arg(&cfg)
        .args([&dir, "data.train_batch_size=2000", "rollout.n=8192", "actor.ppo_mini_batch_size=2000", "--local"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let line = out.lines().find(|l| l.starts_with("FAIL  memory")).unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("the run needs about") && line.contains("GiB available"), "{line}");
    assert!(out.contains("fix: fewer ranks on this node"), "{out}");
    assert!(out.contains("0 warning(s), 1 failed on 1 node(s) in "), "{out}");

    // A GPU run looks for the CUDA engine's libraries by the engine's own search: none in the
    // only directory it may look in fails, naming the library, where it looked and the fix.
    let empty = tmp.path().join("no-cuda");
    std::fs::create_dir(&empty).unwrap();
    let o = Command::new(BIN)
        .current_dir(repo())
        .env("REINFORGE_CUDA_LIB_DIRS", &empty)
        .arg("doctor")
        .arg(&cfg)
        .args([&dir, "trainer.device=\"cuda\"", "--local"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let line = out.lines().find(|l| l.starts_with("FAIL  cuda-libs")).unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("cuBLASLt (needed by the CUDA engine): libcublasLt.so.13 not found") && line.contains(&empty.display().to_string()), "{line}");
    assert!(out.contains("fix: install the CUDA toolkit, or `pip install nvidia-cublas`"), "{out}");
    std::fs::remove_dir(&empty).unwrap();
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0, "doctor leaves nothing behind");
}

/// The stall watchdog in a single-process run: step 1 takes longer than
/// trainer.stall_timeout_s = 0.2 s (one row per sample, `actor.share_prompts = false`, keeps it
/// at about 0.5 s: shared prompts make the whole quickstart step shorter than that), so it is
/// reported with the controller's phase and stacks;
/// later steps are judged against 3 × the slowest step and pass. `ranks.json` (what `cluster
/// status` reads) goes when the run ends.
#[test]
fn a_slow_step_is_reported_with_stacks() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let o = Command::new(BIN)
        .current_dir(repo())
        .args(["train", "examples/quickstart.toml", "trainer.total_steps=3", "trainer.logger=[\"jsonl\"]", "trainer.stall_timeout_s=0.2", "actor.share_prompts=false"])
        .arg(format!("trainer.default_local_dir=\"{}\"", run.display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("stall: step 1 has run") && err.contains("trainer.stall_timeout_s = 0.2)); the controller is in "), "{err}");
    assert_eq!(err.matches("stall: step").count(), 1, "only step 1 is over its limit: {err}");
    let controller = std::fs::read_to_string(run.join("stalls/step-1/controller.txt")).unwrap();
    assert!(controller.starts_with("# controller in ") && controller.contains(&"threads of pid".to_string()), "{controller}");
    assert!(run.join("stalls/step-1/report.txt").exists());
    assert!(!run.join("ranks.json").exists(), "a finished run leaves no live status behind");

    let o = Command::new(BIN).current_dir(repo()).args(["config", "show", "examples/quickstart.toml", "trainer.on_stall=panic"]).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("trainer.on_stall = `panic`: use `warn` or `restart`"));
}

#[test]
fn a_gpu_request_without_a_gpu_is_one_line_and_writes_nothing() {
    if reinforge_cuda::libs::driver_present() {
        eprintln!("skipping: this machine has the NVIDIA driver (the GPU paths run in `reinforge selftest`)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    let dir_arg = format!("trainer.default_local_dir=\"{}\"", run_dir.display());
    let tries: [Vec<&str>; 4] = [
        vec!["train", "examples/quickstart.toml", "trainer.device=\"cuda\"", &dir_arg, "--resume", "none"],
        vec!["selftest", "--device", "cuda:1"],
        vec!["bench", "train", "--device", "cuda", "--model", "examples/tiny-arith"],
        vec!["cuda", "info"],
    ];
    for args in tries {
        let o = Command::new(BIN).current_dir(repo()).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?}: {err}");
        let last = err.lines().last().unwrap_or_default();
        assert!(last.starts_with("error: device `cuda:") && last.contains("no NVIDIA driver") && last.contains("use `cpu`"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    assert!(!run_dir.exists(), "a run that cannot start on its device must not create its directory");
    // `cuda info` still lists where it looks, saying it has no driver to choose versions by.
    let o = Command::new(BIN).args(["cuda", "info"]).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("library search directories") && out.contains("driver: not found (libcuda.so.1)"), "{out}");
    let o = Command::new(BIN).args(["selftest", "--device", "cpu"]).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("use `cuda`, `cuda:N` or `cuda-emu`"));
}

#[test]
fn an_override_after_a_bare_ray_flag_keeps_its_place() {
    // `--ray` takes an optional address; an override right after it is an override, and the
    // later of two overrides of one key wins wherever `--ray` stands.
    let show = |args: &[&str]| {
        let o = Command::new(BIN).current_dir(repo()).args(["train", "examples/quickstart.toml", "--dry-run"]).args(args).output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        let cfg: toml::Table = String::from_utf8_lossy(&o.stdout).parse().unwrap();
        let c = &cfg["cluster"];
        (c["backend"].as_str().unwrap().to_string(), c["address"].as_str().unwrap().to_string(), c["actor"]["gpus_per_node"].as_integer().unwrap())
    };
    assert_eq!(show(&["--ray", "cluster.actor.gpus_per_node=2", "cluster.actor.gpus_per_node=1"]), ("ray".into(), "auto".into(), 1));
    assert_eq!(show(&["cluster.actor.gpus_per_node=1", "--ray", "cluster.actor.gpus_per_node=2"]), ("ray".into(), "auto".into(), 2));
    assert_eq!(show(&["--ray", "10.0.0.1:6379", "cluster.actor.gpus_per_node=2"]), ("ray".into(), "10.0.0.1:6379".into(), 2));
}

/// A model named by its Hugging Face Hub id, as verl's `actor_rollout_ref.model.path` names it,
/// trains from the snapshot `huggingface-cli download` left in the Hub cache (files as symlinks
/// into `blobs/`, `refs/main` naming the snapshot); one missing from the cache is one line
/// saying where it looked and how to get it.
#[test]
fn a_hub_model_id_trains_from_the_hugging_face_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = tmp.path().join("hf/hub");
    let repo_dir = hub.join("models--acme--tiny-arith");
    let snap = repo_dir.join("snapshots/0123abcd");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo_dir.join("blobs")).unwrap();
    std::fs::create_dir_all(repo_dir.join("refs")).unwrap();
    std::fs::write(repo_dir.join("refs/main"), "0123abcd").unwrap();
    for (i, f) in ["config.json", "tokenizer.json", "tokenizer_config.json"].iter().enumerate() {
        let blob = repo_dir.join(format!("blobs/{i:040}"));
        std::fs::copy(repo().join("examples/tiny-arith").join(f), &blob).unwrap();
        std::os::unix::fs::symlink(format!("../../blobs/{i:040}"), snap.join(f)).unwrap();
    }
    let train = |model: &str, out: &str| {
        Command::new(BIN)
            .current_dir(tmp.path())
            .env("HF_HOME", tmp.path().join("hf"))
            .env_remove("HF_HUB_CACHE")
            .env_remove("HUGGINGFACE_HUB_CACHE")
            .args(["train"])
            .arg(repo().join("examples/quickstart.toml"))
            .args([format!("actor.model=\"{model}\""), "trainer.total_steps=1".into(), "trainer.test_freq=0".into(), "trainer.val_before_train=false".into(), "trainer.save_freq=0".into()])
            .arg(format!("trainer.default_local_dir=\"{}\"", tmp.path().join(out).display()))
            .args(["--resume", "none"])
            .output()
            .unwrap()
    };
    let o = train("acme/tiny-arith", "run");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(tmp.path().join("run/metrics.jsonl").is_file());
    let o = train("acme/not-downloaded", "missing");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert_eq!(err.lines().filter(|l| l.starts_with("error:")).count(), 1, "{err}");
    assert!(err.contains("model `acme/not-downloaded`") && err.contains(&hub.display().to_string()) && err.contains("hf download acme/not-downloaded"), "{err}");

    // OpenRLHF's `--prompt_data ORG/NAME`: the dataset's snapshot in the same cache.
    let data = hub.join("datasets--acme--arith/snapshots/feed/data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("train-00000-of-00001.jsonl"), "{\"prompt\": \"1+1=\"}\n").unwrap();
    let out = tmp.path().join("converted.toml");
    let convert = |dataset: &str| {
        Command::new(BIN)
            .current_dir(tmp.path())
            .env("HF_HOME", tmp.path().join("hf"))
            .env_remove("HF_HUB_CACHE")
            .env_remove("HUGGINGFACE_HUB_CACHE")
            .args(["config", "convert", "--out"])
            .arg(&out)
            .args(["--openrlhf", "--pretrain", "acme/tiny-arith", "--prompt_data", dataset, "--advantage_estimator", "group_norm", "--n_samples_per_prompt", "4"])
            .output()
            .unwrap()
    };
    let o = convert("acme/arith");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.contains(&data.join("train-00000-of-00001.jsonl").display().to_string()), "{text}");
    let o = convert("acme/absent");
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("hf download --repo-type dataset acme/absent"));
}
