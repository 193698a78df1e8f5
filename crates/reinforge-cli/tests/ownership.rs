//! One writer per run directory, with real `reinforge train` processes on the quickstart's
//! tiny model: two runs started together, a holder killed with SIGKILL, and a holder paused
//! with SIGSTOP past its lease timeout, taken over, then continued with SIGCONT.
//! (The two-host version, and `job submit` of an owned directory, are in multinode.rs.)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_reinforge");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// `reinforge train` of the quickstart in `dir`: `steps` steps, a checkpoint every step.
fn train(dir: &Path, steps: usize, extra: &[&str]) -> Command {
    let r = repo();
    let mut c = Command::new(BIN);
    c.arg("train")
        .arg(r.join("examples/quickstart.toml"))
        .arg(format!("actor.model=\"{}\"", r.join("examples/tiny-arith").display()))
        .arg(format!("trainer.total_steps={steps}"))
        .args(["trainer.test_freq=0", "trainer.val_before_train=false", "trainer.save_freq=1", "trainer.logger=[\"jsonl\",\"tensorboard\"]"])
        .arg(format!("trainer.default_local_dir=\"{}\"", dir.display()))
        .args(extra)
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn report(what: &str, o: &Output) -> String {
    format!("{what}: {}\nstderr:\n{}", o.status, String::from_utf8_lossy(&o.stderr))
}

/// The `step` of every row of `metrics.jsonl`.
fn steps(dir: &Path) -> Vec<u64> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["step"].as_u64().unwrap())
        .collect()
}

fn latest_step(dir: &Path) -> Option<u64> {
    let l = std::fs::read_to_string(dir.join("checkpoints/latest")).ok()?;
    l.trim().strip_prefix("global_step_")?.parse().ok()
}

/// Waits (bounded) until `child` has a complete checkpoint of at least step `at_least`.
fn wait_for_checkpoint(child: &mut Child, dir: &Path, at_least: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while latest_step(dir).is_none_or(|s| s < at_least) {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the holder exited ({status}) before checkpoint {at_least}");
        }
        assert!(Instant::now() < deadline, "no checkpoint {at_least} within 120 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) on our own child's pid, which stays reserved until we wait for it.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, sig) };
    assert_eq!(rc, 0, "kill({}, {sig}): {}", child.id(), std::io::Error::last_os_error());
}

/// Every file under `dir` (size and bytes), leaving out in-flight temporaries, which are
/// private to their writer until renamed.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(d: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        for e in std::fs::read_dir(d).unwrap().flatten() {
            let p = e.path();
            if e.file_name().to_string_lossy().starts_with(".tmp-") {
                continue;
            }
            if p.is_dir() {
                walk(&p, out);
            } else {
                out.insert(p.clone(), std::fs::read(&p).unwrap_or_default());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, &mut out);
    out
}

#[test]
fn two_runs_started_together_on_one_directory_exactly_one_trains() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let a = train(&dir, 2, &["--resume", "none"]).spawn().unwrap();
    let b = train(&dir, 2, &["--resume", "none"]).spawn().unwrap();
    let (pa, pb) = (a.id(), b.id());
    let (oa, ob) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let (winner, loser, winner_pid) = match (oa.status.success(), ob.status.success()) {
        (true, false) => (&oa, &ob, pa),
        (false, true) => (&ob, &oa, pb),
        _ => panic!("exactly one run must train\n{}\n{}", report("first", &oa), report("second", &ob)),
    };
    let err = String::from_utf8_lossy(&loser.stderr);
    let line = err.lines().find(|l| l.starts_with("error:")).unwrap_or_else(|| panic!("{}", report("refused", loser)));
    assert!(line.contains("is in use by another run") && line.contains(&format!("pid {winner_pid} on host")), "{line}");
    assert!(line.contains("trainer.default_local_dir") && line.contains("--takeover"), "{line}");
    assert!(winner.status.success());
    // The directory holds the winner's run alone: two steps, once each.
    assert_eq!(steps(&dir), [1, 2]);
    assert_eq!(latest_step(&dir), Some(2));
    let tb: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().contains("tfevents")).collect();
    assert_eq!(tb.len(), 1, "only the winner writes TensorBoard events");
}

#[test]
fn a_killed_holder_is_taken_over_and_its_run_resumed_from_the_last_complete_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let mut a = train(&dir, 500, &["--resume", "none"]).spawn().unwrap();
    wait_for_checkpoint(&mut a, &dir, 2);
    signal(&a, libc::SIGKILL);
    let _ = a.wait();
    let k = latest_step(&dir).unwrap();

    let t = Instant::now();
    let b = train(&dir, k as usize + 1, &[]).output().unwrap();
    assert!(b.status.success(), "{}", report("resumed run", &b));
    let err = String::from_utf8_lossy(&b.stderr);
    assert!(err.contains(&format!("took over from pid {} on host", a.id())) && err.contains("that process is gone"), "{err}");
    assert!(err.contains(&format!("resuming from {}", dir.join("checkpoints").join(format!("global_step_{k}")).display())), "{err}");
    eprintln!("TIMING took over a killed holder and trained 1 step in {:.1}s", t.elapsed().as_secs_f64());
    // One row per step; rows the killed run logged after its last checkpoint were set aside.
    let all: Vec<u64> = (1..=k + 1).collect();
    assert_eq!(steps(&dir), all);
    if let Ok(aside) = std::fs::read_to_string(dir.join("metrics.jsonl.superseded")) {
        for l in aside.lines().filter(|l| l.ends_with('}')) {
            let s = serde_json::from_str::<serde_json::Value>(l).unwrap()["step"].as_u64().unwrap();
            assert!(s > k, "row of step {s} set aside though checkpoint {k} covers it");
        }
    }
}

#[test]
fn a_paused_holder_taken_over_writes_nothing_after_it_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let mut a = train(&dir, 500, &["--resume", "none", "trainer.lease_timeout_s=2"]).spawn().unwrap();
    wait_for_checkpoint(&mut a, &dir, 2);
    signal(&a, libc::SIGSTOP);
    // Refused while the paused holder's last heartbeat is recent...
    let early = train(&dir, 3, &["trainer.lease_timeout_s=2"]).output().unwrap();
    assert!(!early.status.success(), "{}", report("early", &early));
    assert!(String::from_utf8_lossy(&early.stderr).contains("is in use by another run"), "{}", report("early", &early));
    // ...and taken over once it has been silent past the timeout (2 s, then watched for 1 s).
    std::thread::sleep(Duration::from_millis(2300));
    let k = latest_step(&dir).unwrap();
    let t = Instant::now();
    let b = train(&dir, k as usize + 2, &["trainer.lease_timeout_s=2"]).spawn().unwrap();
    let b_pid = b.id();
    let b = b.wait_with_output().unwrap();
    assert!(b.status.success(), "{}", report("new owner", &b));
    let err = String::from_utf8_lossy(&b.stderr);
    assert!(err.contains(&format!("took over from pid {}", a.id())) && err.contains("no heartbeat for"), "{err}");
    assert!(err.contains("watching it for 1s more before taking over"), "{err}");
    assert!(!err.contains('\x1b'), "no colour escapes when stderr is not a terminal: {err}");
    eprintln!("TIMING took over a paused holder and trained 2 steps in {:.1}s", t.elapsed().as_secs_f64());
    let before = snapshot(&dir);

    // The old holder wakes up: it stops with the fencing error and changes nothing.
    signal(&a, libc::SIGCONT);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = a.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the paused holder kept running after it lost its directory");
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = a.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!status.success(), "{err}");
    let line = err.lines().find(|l| l.starts_with("error:")).unwrap_or_else(|| panic!("no error line: {err}"));
    assert!(line.contains("lost ownership of run directory") && line.contains(&format!("pid {b_pid} on host")), "{line}");
    assert!(line.contains("without writing anything more there") && line.contains("no heartbeat for"), "{line}");
    let after = snapshot(&dir);
    assert_eq!(before.keys().collect::<Vec<_>>(), after.keys().collect::<Vec<_>>(), "files appeared or vanished");
    for (p, bytes) in &before {
        assert!(after[p] == *bytes, "{} changed after the old holder resumed", p.display());
    }
    let all: Vec<u64> = (1..=k + 2).collect();
    assert_eq!(steps(&dir), all, "one row per step, the new owner's");
}

#[test]
fn temporaries_an_earlier_owner_left_half_written_are_removed_by_the_next() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let stall = dir.join("stalls/step-3");
    std::fs::create_dir_all(&stall).unwrap();
    // As a process killed between writing a temporary and renaming it leaves them.
    let left = [dir.join(".tmp-metrics.jsonl-4242-17"), dir.join(".tmp-config.toml-4242-18"), stall.join(".tmp-report.txt-4242-19")];
    for p in &left {
        std::fs::write(p, b"half").unwrap();
    }
    std::fs::write(dir.join("notes.txt"), b"mine").unwrap();
    let o = train(&dir, 1, &["--resume", "none"]).output().unwrap();
    assert!(o.status.success(), "{}", report("run", &o));
    for p in &left {
        assert!(!p.exists(), "{} was left", p.display());
    }
    assert_eq!(std::fs::read(dir.join("notes.txt")).unwrap(), b"mine", "only temporaries go");
    assert_eq!(steps(&dir), [1]);
}
