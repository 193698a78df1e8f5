//! `trainer.logger = ["wandb", "mlflow"]` against the real trackers: W&B in offline mode (its
//! run read back with the `wandb` package) and a real `mlflow server` started here (read back
//! with MLflow's Python client). Every step and the config arrive, a resumed run continues the
//! same tracker runs, a run that lost its directory to another leaves them to the new owner,
//! and a tracker that cannot start is one line before any step.
//!
//! The trackers' Python packages are installed once into `target/loggers-venv` from
//! python/requirements-loggers.txt (as `.ci/run` does), so a fresh machine with Python runs this.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_reinforge");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

static INSTALL: Once = Once::new();

/// The Python of `target/loggers-venv`, with wandb and mlflow.
fn loggers_python() -> PathBuf {
    let venv = repo().join("target/loggers-venv");
    let py = venv.join("bin/python");
    INSTALL.call_once(|| {
        let ready = || Command::new(&py).args(["-c", "import wandb, mlflow"]).output().is_ok_and(|o| o.status.success());
        if !ready() {
            eprintln!("installing wandb and mlflow into {} (once)", venv.display());
            let ok = Command::new("python3").args(["-m", "venv"]).arg(&venv).status().is_ok_and(|s| s.success())
                && Command::new(venv.join("bin/pip"))
                    .args(["install", "-q", "-r"])
                    .arg(repo().join("python/requirements-loggers.txt"))
                    .status()
                    .is_ok_and(|s| s.success());
            assert!(ok, "could not install the trackers: pip install -r python/requirements-loggers.txt (needs python3 with venv and PyPI)");
        }
        assert!(ready(), "wandb/mlflow do not import in {}", venv.display());
    });
    py
}

/// A process killed when the test ends, however it ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn http_ok(port: u16, path: &str) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    if s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).is_err() {
        return false;
    }
    let mut head = String::new();
    let _ = s.read_to_string(&mut head);
    head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200")
}

/// A real MLflow tracking server on a free port (SQLite store under `dir`).
fn mlflow_server(py: &Path, dir: &Path) -> (Server, String) {
    let port = free_port();
    let child = Command::new(py)
        .args(["-m", "mlflow", "server", "--host", "127.0.0.1", "--port", &port.to_string(), "--workers", "1"])
        .arg("--backend-store-uri")
        .arg(format!("sqlite:///{}", dir.join("mlflow.db").display()))
        .arg("--default-artifact-root")
        .arg(dir.join("artifacts"))
        .env("MLFLOW_DISABLE_TELEMETRY", "true")
        .env("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = Server(child);
    let t0 = Instant::now();
    while !http_ok(port, "/health") {
        assert!(t0.elapsed() < Duration::from_secs(120), "mlflow server did not answer /health in 120 s");
        std::thread::sleep(Duration::from_millis(300));
    }
    (server, format!("http://127.0.0.1:{port}"))
}

/// `reinforge train` on the quickstart with W&B offline and MLflow, in `dir/run`.
fn train(py: &Path, uri: Option<&str>, dir: &Path, steps: usize, loggers: &str, env: &[(&str, &str)]) -> Output {
    train_cmd(py, uri, dir, steps, loggers, env).output().unwrap()
}

fn train_cmd(py: &Path, uri: Option<&str>, dir: &Path, steps: usize, loggers: &str, env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(BIN);
    c.current_dir(repo())
        .args(["train", "examples/quickstart.toml"])
        .arg(format!("trainer.total_steps={steps}"))
        .arg(format!("trainer.logger={loggers}"))
        .arg(format!("trainer.default_local_dir=\"{}\"", dir.join("run").display()))
        .args(["trainer.project_name=proj", "trainer.experiment_name=exp", "trainer.val_before_train=false", "trainer.test_freq=0"])
        .env("REINFORGE_PYTHON", py)
        .env("WANDB_MODE", "offline")
        .env("HOME", dir)
        .env("WANDB_CONFIG_DIR", dir.join("wandb-config"))
        .env("WANDB_CACHE_DIR", dir.join("wandb-cache"))
        .env_remove("WANDB_API_KEY")
        .env_remove("MLFLOW_TRACKING_URI")
        .stdin(Stdio::null());
    if let Some(u) = uri {
        c.env("MLFLOW_TRACKING_URI", u);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

fn readback(py: &Path, args: &[&str]) -> serde_json::Value {
    let o = Command::new(py).arg(repo().join("crates/reinforge-cli/tests/support/readback.py")).args(args).output().unwrap();
    assert!(o.status.success(), "readback {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// `critic/score/mean` of every row of metrics.jsonl, by step.
fn jsonl_scores(run: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|r| (r["step"].as_u64().unwrap(), r["critic/score/mean"].as_f64().unwrap()))
        .collect()
}

fn ids(run: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(run.join("trackers.json")).unwrap()).unwrap()
}

#[test]
fn wandb_offline_and_a_real_mlflow_server_get_every_step_the_config_and_the_resume() {
    let py = loggers_python();
    let tmp = tempfile::tempdir().unwrap();
    let (_server, uri) = mlflow_server(&py, tmp.path());
    let loggers = r#"["console","jsonl","wandb","mlflow"]"#;
    let o = train(&py, Some(&uri), tmp.path(), 3, loggers, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("mlflow: run ") && err.contains("wandb: run "), "{err}");
    let run = tmp.path().join("run");
    let first = ids(&run);

    // Continue to step 5 from the step-3 checkpoint: the same tracker runs go on.
    let o = train(&py, Some(&uri), tmp.path(), 5, loggers, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("resuming from") && err.contains("mlflow: continuing run"), "{err}");
    assert_eq!(ids(&run), first, "a resumed run keeps its W&B and MLflow runs");

    let want = jsonl_scores(&run);
    assert_eq!(want.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);

    let m = readback(&py, &["mlflow", &uri, first["mlflow"].as_str().unwrap(), "critic/score/mean"]);
    assert_eq!((m["status"].as_str(), m["run_name"].as_str(), m["experiment"].as_str()), (Some("FINISHED"), Some("exp"), Some("proj")));
    let got: Vec<(u64, f64)> = m["history"].as_array().unwrap().iter().map(|h| (h["step"].as_u64().unwrap(), h["value"].as_f64().unwrap())).collect();
    assert_eq!(got, want, "MLflow has every step once, with the values of metrics.jsonl");
    assert_eq!(m["params"]["actor.lr"], "0.002", "the resolved config is the run's params");
    assert_eq!(m["params"]["trainer.experiment_name"], "exp");

    let w = readback(&py, &["wandb", run.to_str().unwrap()]);
    assert_eq!((w["project"].as_str(), w["name"].as_str()), (Some("proj"), Some("exp")));
    assert_eq!(w["runs"], 2, "one offline log per attempt, both for run {}", first["wandb"]);
    assert_eq!(w["config"]["actor"]["lr"], 0.002);
    let got: Vec<(u64, f64)> = w["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (h["step"].as_u64().unwrap(), h["critic/score/mean"].as_f64().unwrap()))
        .collect();
    assert_eq!(got, want, "W&B has every step once, with the values of metrics.jsonl");
}

#[test]
fn a_tracker_that_cannot_start_is_one_line_before_any_step_and_leaves_nothing() {
    let py = loggers_python();
    let tmp = tempfile::tempdir().unwrap();
    let fails = |uri: Option<&str>, loggers: &str, env: &[(&str, &str)], expect: &str| {
        let o = train(&py, uri, tmp.path(), 2, loggers, env);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{loggers}: should fail: {err}");
        let last = err.lines().last().unwrap_or_default();
        assert!(last.starts_with("error: ") && last.contains(expect), "{loggers}: {err}");
        assert!(!tmp.path().join("run").exists(), "{loggers}: a run that never started left its directory");
    };
    fails(None, r#"["mlflow"]"#, &[], "MLFLOW_TRACKING_URI is not set");
    let closed = format!("http://127.0.0.1:{}", free_port());
    fails(Some(&closed), r#"["mlflow"]"#, &[], "cannot use the tracking server");
    fails(None, r#"["wandb"]"#, &[("WANDB_MODE", "online")], "no W&B API key");
    fails(None, r#"["wandb"]"#, &[("REINFORGE_PYTHON", "/nonexistent/python3")], "cannot run `/nonexistent/python3`");
    // A Python without the package (a bare venv).
    let bare = tmp.path().join("bare");
    assert!(Command::new("python3").args(["-m", "venv", "--without-pip"]).arg(&bare).status().unwrap().success());
    let bare_py = bare.join("bin/python3");
    fails(None, r#"["wandb"]"#, &[("REINFORGE_PYTHON", bare_py.to_str().unwrap())], "the `wandb` package is not installed");
}

fn latest_step(run: &Path) -> Option<u64> {
    std::fs::read_to_string(run.join("checkpoints/latest")).ok()?.trim().strip_prefix("global_step_")?.parse().ok()
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) on our own child's pid, which stays reserved until we wait for it.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, sig) };
    assert_eq!(rc, 0, "kill({}, {sig}): {}", child.id(), std::io::Error::last_os_error());
}

#[test]
fn a_run_that_lost_its_directory_leaves_its_tracker_runs_to_the_new_owner() {
    let py = loggers_python();
    let tmp = tempfile::tempdir().unwrap();
    let (_server, uri) = mlflow_server(&py, tmp.path());
    let run = tmp.path().join("run");
    let loggers = r#"["jsonl","wandb","mlflow"]"#;
    let lease = ["trainer.lease_timeout_s=2", "trainer.save_freq=1"];
    // A holder paused (SIGSTOP) past its lease timeout, as in ownership.rs, and taken over by a
    // run that resumes the same W&B and MLflow runs from trackers.json and finishes them.
    let mut a = train_cmd(&py, Some(&uri), tmp.path(), 500, loggers, &[]).args(lease).args(["--resume", "none"]).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(180);
    while latest_step(&run).is_none_or(|s| s < 2) {
        if let Ok(Some(status)) = a.try_wait() {
            panic!("the first run exited ({status}) before its checkpoint of step 2");
        }
        assert!(Instant::now() < deadline, "no checkpoint of step 2 within 180 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(&a, libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(2300));
    let k = latest_step(&run).unwrap();
    let b = train_cmd(&py, Some(&uri), tmp.path(), k as usize + 2, loggers, &[]).args(lease).output().unwrap();
    let err = String::from_utf8_lossy(&b.stderr);
    assert!(b.status.success(), "{err}");
    assert!(err.contains(&format!("took over from pid {}", a.id())) && err.contains("mlflow: continuing run"), "{err}");
    let id = ids(&run)["mlflow"].as_str().unwrap().to_string();
    let owner = readback(&py, &["mlflow", &uri, &id, "critic/score/mean"]);
    assert_eq!(owner["status"], "FINISHED", "the new owner ended the MLflow run");

    // The old holder wakes up, stops on the lost lease, and neither logs its queued rows nor
    // marks the MLflow run FAILED over the new owner's FINISHED.
    signal(&a, libc::SIGCONT);
    let out = a.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.lines().any(|l| l.starts_with("error:") && l.contains("lost ownership of run directory")), "{err}");
    let after = readback(&py, &["mlflow", &uri, &id, "critic/score/mean"]);
    assert_eq!((&after["status"], &after["history"]), (&owner["status"], &owner["history"]), "the MLflow run is as the new owner left it");
    assert!(err.contains(&format!("mlflow: this run lost its directory to another, which continues MLflow run {id}")), "{err}");
    assert!(err.contains("wandb: this run lost its directory to another"), "{err}");

    // W&B (offline: one log per process): the new owner's ends with exit code 0; the old
    // holder's keeps what it logged and ends marked preempting, not as the run's failure.
    let w = readback(&py, &["wandb", run.to_str().unwrap()]);
    let endings = w["endings"].as_array().unwrap();
    assert_eq!(endings.len(), 2, "{w}");
    let superseded: Vec<_> = endings.iter().filter(|e| e["preempting"] == true).collect();
    let owned: Vec<_> = endings.iter().filter(|e| e["preempting"] == false).collect();
    assert_eq!(superseded.len(), 1, "{endings:?}");
    assert_eq!(owned.len(), 1, "{endings:?}");
    assert_eq!(owned[0]["exit_code"], 0, "{endings:?}");
}
