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
