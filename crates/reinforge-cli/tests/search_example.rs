//! `examples/search.toml` end to end, as the README runs it: `data gen search`, `retrieval
//! index`, `retrieval serve` (started here, on a free port), `train`. The tiny model learns to
//! search: the reward rises by a clear margin and it still searches at the end.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_reinforge");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// The server process, stopped however the test ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ok(c: &mut Command) -> String {
    let o = c.output().unwrap();
    assert!(o.status.success(), "{c:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn mean(rows: &[serde_json::Value], key: &str) -> f64 {
    rows.iter().map(|r| r[key].as_f64().unwrap_or_else(|| panic!("{key} missing: {r}"))).sum::<f64>() / rows.len() as f64
}

#[test]
fn the_search_example_learns_to_search() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("search");
    ok(Command::new(BIN).args(["data", "gen", "search", "--n", "4000", "--seed", "1", "--entities", "16", "--template", "{question}", "--out"]).arg(&data));
    ok(Command::new(BIN).args(["retrieval", "index", "--corpus"]).arg(data.join("corpus.jsonl")).arg("--out").arg(data.join("index")));
    let mut child = Command::new(BIN)
        .args(["retrieval", "serve", "--host", "127.0.0.1", "--port", "0", "--index"])
        .arg(data.join("index"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let _server = Server(child);
    let url = line.trim().to_string();
    assert!(url.starts_with("http://127.0.0.1:") && url.ends_with("/retrieve"), "{url}");

    let out = tmp.path().join("run");
    let o = Command::new(BIN)
        .current_dir(repo())
        .args(["train", "examples/search.toml"])
        .arg(format!("data.train_files=[\"{}\"]", data.join("train.parquet").display()))
        .arg(format!("data.val_files=[\"{}\"]", data.join("test.parquet").display()))
        .arg(format!("tools.search.url=\"{url}\""))
        .arg(format!("trainer.default_local_dir=\"{}\"", out.display()))
        .args(["trainer.total_steps=300", "trainer.test_freq=300", "trainer.save_freq=0", "trainer.logger=[\"jsonl\"]"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let steps: Vec<serde_json::Value> = rows.iter().filter(|r| r["step"].as_u64().unwrap() > 0).cloned().collect();
    assert_eq!(steps.len(), 300);
    let (first, last) = (mean(&steps[..10], "critic/score/mean"), mean(&steps[280..], "critic/score/mean"));
    let searches = mean(&steps[280..], "env/number_of_valid_search");
    let (val0, val1) = (rows[0]["val/reward/mean"].as_f64().unwrap(), rows.last().unwrap()["val/reward/mean"].as_f64().unwrap());
    eprintln!("reward {first:.3} → {last:.3}, searches per sample at the end {searches:.2}, validation {val0:.3} → {val1:.3}");
    assert!(last > first + 0.5, "the reward did not rise: {first:.3} → {last:.3}");
    assert!(searches > 0.5, "it stopped searching: {searches:.2} searches per sample");
    assert!(val1 > val0 + 0.5, "validation did not improve: {val0:.3} → {val1:.3}");
}
