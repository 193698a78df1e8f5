//! Crash safety, tested with real process deaths: each test re-executes this test binary as a
//! child (selected by an environment variable) that saves checkpoints and is then killed with
//! SIGKILL mid-write, or aborts itself at a commit step via [`SaveOptions::crash_at`].

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use reinforge_checkpoint::{
    list_checkpoints, open, read_latest, resolve, save, CheckpointError, CrashPoint, LoadOptions, Resume,
    SaveOptions,
};
use serde_json::json;

/// Set in a child to `<mode>:<root>`; the test function then plays the writer instead of the checker.
const CHILD_ENV: &str = "REINFORGE_CHECKPOINT_TEST_CHILD";

fn child_role() -> Option<(String, PathBuf)> {
    let v = std::env::var(CHILD_ENV).ok()?;
    let (mode, root) = v.split_once(':')?;
    Some((mode.to_string(), PathBuf::from(root)))
}

fn spawn_child(test_name: &str, mode: &str, root: &Path) -> Child {
    Command::new(std::env::current_exe().expect("current_exe"))
        .args(["--exact", test_name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{mode}:{}", root.display()))
        // Any core dump from abort() lands in the temporary directory, not the source tree.
        .current_dir(root.parent().expect("root has a parent"))
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn child test process")
}

fn run_child(test_name: &str, mode: &str, root: &Path) -> ExitStatus {
    spawn_child(test_name, mode, root).wait().expect("wait for child")
}

fn small_save(root: &Path, step: u64, opts: &SaveOptions) {
    save(root, step, json!({"who": "child"}), opts, |w| {
        w.add_bytes("actor/model.safetensors", format!("weights of step {step}").as_bytes())?;
        w.add_bytes("trainer_state.json", format!("{{\"global_step\": {step}}}").as_bytes())
    })
    .expect("child save");
}

fn tmp_entries(root: &Path, prefix: &str) -> Vec<PathBuf> {
    fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path())
        .collect()
}

#[cfg(unix)]
fn killed_by(status: ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status.signal()
}

/// The child: saves step 1, then step 2 as 200 MiB written in slow 1 MiB chunks, and is killed
/// by the parent part-way.
fn slow_writer(root: &Path) {
    small_save(root, 1, &SaveOptions::default());
    let chunk = vec![0xA5u8; 1 << 20];
    let _ = save(root, 2, json!({}), &SaveOptions::default(), |w| {
        w.add_bytes("trainer_state.json", b"{\"global_step\": 2}")?;
        w.add_streamed("actor/model.safetensors", |out| {
            for _ in 0..200 {
                out.write_all(&chunk)?;
                out.flush()?;
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok::<_, std::io::Error>(())
        })
    });
}

#[test]
fn kill_9_during_write() {
    if let Some((mode, root)) = child_role() {
        assert_eq!(mode, "slow-writer");
        slow_writer(&root);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ckpts");
    let mut child = spawn_child("kill_9_during_write", "slow-writer", &root);

    // Wait until step 2's temporary file is visibly growing, then SIGKILL the writer.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut sizes_seen = Vec::new();
    let tmp_dir = loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("writer exited on its own ({status}) before it could be killed");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("step 2's temporary directory never grew; sizes seen: {sizes_seen:?}");
        }
        if let Some(tmp) = root.is_dir().then(|| tmp_entries(&root, ".tmp-global_step_2-")).and_then(|v| v.into_iter().next()) {
            let size = fs::metadata(tmp.join("actor/model.safetensors")).map(|m| m.len()).unwrap_or(0);
            if sizes_seen.last() != Some(&size) {
                sizes_seen.push(size);
            }
            if size >= 4 << 20 && sizes_seen.len() >= 3 {
                break tmp;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    child.kill().expect("SIGKILL the writer");
    let status = child.wait().unwrap();
    assert!(!status.success());
    #[cfg(unix)]
    assert_eq!(killed_by(status), Some(9), "{status}");

    // The interrupted save left only its temporary directory behind.
    assert!(tmp_dir.is_dir());
    let partial = fs::metadata(tmp_dir.join("actor/model.safetensors")).unwrap().len();
    assert!(partial < 200 << 20, "the write finished before the kill ({partial} bytes)");
    assert!(!root.join("global_step_2").exists());
    assert_eq!(read_latest(&root).unwrap().as_deref(), Some("global_step_1"));

    // Auto resume gives step 1, fully verified (hashes included).
    let ckpt = resolve(&root, &Resume::Auto).unwrap().expect("step 1 survives");
    assert_eq!(ckpt.step, 1);
    assert_eq!(ckpt.read("actor/model.safetensors").unwrap(), b"weights of step 1");
    open(root.join("global_step_1"), &LoadOptions { verify_hashes: true }).unwrap();

    // Saving step 2 again succeeds, and removes the dead writer's temporary.
    small_save(&root, 2, &SaveOptions::default());
    assert_eq!(resolve(&root, &Resume::Auto).unwrap().unwrap().step, 2);
    if cfg!(target_os = "linux") {
        assert!(!tmp_dir.exists(), "stale temporary {} not removed", tmp_dir.display());
        assert!(tmp_entries(&root, ".tmp-").is_empty());
    }
}

#[test]
fn abort_between_rename_and_latest() {
    if let Some((mode, root)) = child_role() {
        assert_eq!(mode, "abort-before-latest");
        small_save(&root, 1, &SaveOptions::default());
        small_save(&root, 2, &SaveOptions { keep_last: None, crash_at: Some(CrashPoint::BeforeLatest), ..SaveOptions::default() });
        unreachable!("the save aborts the process");
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ckpts");
    let status = run_child("abort_between_rename_and_latest", "abort-before-latest", &root);
    assert!(!status.success(), "{status}");
    #[cfg(unix)]
    assert_eq!(killed_by(status), Some(6), "expected SIGABRT, got {status}");

    // Step 2 is complete on disk, but `latest` still names step 1: `latest` is the commit
    // point, so Auto resumes from step 1 (documented in the `write` module).
    open(root.join("global_step_2"), &LoadOptions::default()).expect("step 2 is complete");
    assert_eq!(read_latest(&root).unwrap().as_deref(), Some("global_step_1"));
    let ckpt = resolve(&root, &Resume::Auto).unwrap().unwrap();
    assert_eq!(ckpt.step, 1);

    // Without a `latest` the scan finds the finished step 2.
    let latest = fs::read(root.join("latest")).unwrap();
    fs::remove_file(root.join("latest")).unwrap();
    assert_eq!(resolve(&root, &Resume::Auto).unwrap().unwrap().step, 2);
    fs::write(root.join("latest"), latest).unwrap();

    // The trainer redoes step 2 from step 1 and saves it again: the orphan is replaced.
    small_save(&root, 2, &SaveOptions::keep_last(1));
    assert_eq!(read_latest(&root).unwrap().as_deref(), Some("global_step_2"));
    let steps: Vec<u64> = list_checkpoints(&root).unwrap().into_iter().map(|(s, _)| s).collect();
    assert_eq!(steps, [2]);
}

#[test]
fn abort_before_rename() {
    if let Some((mode, root)) = child_role() {
        assert_eq!(mode, "abort-before-rename");
        small_save(&root, 1, &SaveOptions::default());
        small_save(&root, 2, &SaveOptions { keep_last: None, crash_at: Some(CrashPoint::BeforeRename), ..SaveOptions::default() });
        unreachable!("the save aborts the process");
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ckpts");
    let status = run_child("abort_before_rename", "abort-before-rename", &root);
    assert!(!status.success(), "{status}");
    // The temporary holds a full manifest, but is never considered: only its name is a checkpoint.
    let tmps = tmp_entries(&root, ".tmp-global_step_2-");
    assert_eq!(tmps.len(), 1);
    assert!(tmps[0].join("manifest.json").is_file());
    assert_eq!(resolve(&root, &Resume::Auto).unwrap().unwrap().step, 1);
    small_save(&root, 2, &SaveOptions::default());
    if cfg!(target_os = "linux") {
        assert!(tmp_entries(&root, ".tmp-").is_empty());
    }
}

#[test]
fn abort_while_replacing_a_step() {
    if let Some((mode, root)) = child_role() {
        assert_eq!(mode, "abort-during-replace");
        small_save(&root, 1, &SaveOptions::default());
        small_save(&root, 2, &SaveOptions::default());
        small_save(&root, 2, &SaveOptions { keep_last: None, crash_at: Some(CrashPoint::DuringReplace), ..SaveOptions::default() });
        unreachable!("the save aborts the process");
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ckpts");
    let status = run_child("abort_while_replacing_a_step", "abort-during-replace", &root);
    assert!(!status.success(), "{status}");

    // The old step 2 was moved aside and the new one not yet moved in: `latest` names a
    // missing directory, so Auto falls back to step 1.
    assert!(!root.join("global_step_2").exists());
    assert_eq!(read_latest(&root).unwrap().as_deref(), Some("global_step_2"));
    assert_eq!(resolve(&root, &Resume::Auto).unwrap().unwrap().step, 1);
    let err = resolve(&root, &Resume::Path("global_step_2".into())).unwrap_err();
    assert!(matches!(err, CheckpointError::NotACheckpoint { .. }), "{err}");

    small_save(&root, 2, &SaveOptions::default());
    assert_eq!(resolve(&root, &Resume::Auto).unwrap().unwrap().step, 2);
    if cfg!(target_os = "linux") {
        assert!(tmp_entries(&root, ".tmp-").is_empty(), "{:?}", tmp_entries(&root, ".tmp-"));
    }
}
