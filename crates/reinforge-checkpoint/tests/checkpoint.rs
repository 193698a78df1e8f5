//! Save/resolve behaviour without crashes: round trip, pruning, replacement, corruption.

use std::fs;
use std::path::Path;

use reinforge_checkpoint::{
    list_checkpoints, open, read_latest, resolve, resolve_with, save, CheckpointError, CheckpointWriter,
    LoadOptions, Resume, SaveOptions,
};
use serde_json::json;

fn save_simple(root: &Path, step: u64, opts: &SaveOptions) -> reinforge_checkpoint::Checkpoint {
    save(root, step, json!({"step_note": step}), opts, |w| {
        w.add_bytes("actor/model.safetensors", format!("model weights {step}").as_bytes())?;
        w.add_bytes("trainer_state.json", format!("{{\"global_step\": {step}}}").as_bytes())?;
        Ok::<_, CheckpointError>(())
    })
    .expect("save")
}

fn tmp_entries(root: &Path) -> Vec<String> {
    fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp-"))
        .collect()
}

#[test]
fn round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ckpts");
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let saved = save(&root, 7, json!({"config_sha": "abc", "n": 1}), &SaveOptions::default(), |w| {
        w.add_bytes("trainer_state.json", b"{\"global_step\": 7}")?;
        // A library that writes to a path (like safetensors::serialize_to_file).
        w.add_file_with("actor/model.safetensors", |p| fs::write(p, &big))?;
        // A streamed writer.
        w.add_streamed("critic/optimizer.safetensors", |out| out.write_all(b"critic optim"))?;
        Ok::<_, CheckpointError>(())
    })
    .unwrap();
    assert_eq!(saved.step, 7);
    assert_eq!(saved.dir, root.join("global_step_7"));
    assert_eq!(read_latest(&root).unwrap().as_deref(), Some("global_step_7"));
    assert!(tmp_entries(&root).is_empty(), "temporaries left: {:?}", tmp_entries(&root));

    let ckpt = resolve(&root, &Resume::Auto).unwrap().expect("a checkpoint");
    assert_eq!(ckpt.step, 7);
    assert_eq!(ckpt.manifest, saved.manifest);
    assert_eq!(ckpt.read("actor/model.safetensors").unwrap(), big);
    assert_eq!(ckpt.read("trainer_state.json").unwrap(), b"{\"global_step\": 7}");
    assert_eq!(ckpt.read("critic/optimizer.safetensors").unwrap(), b"critic optim");
    assert_eq!(ckpt.meta()["config_sha"], "abc");
    assert!(ckpt.contains("actor/model.safetensors"));
    let paths: Vec<&str> = ckpt.manifest.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["actor/model.safetensors", "critic/optimizer.safetensors", "trainer_state.json"]);
    assert_eq!(ckpt.manifest.file("actor/model.safetensors").unwrap().size, 3_000_000);
    // sha256("critic optim") recorded from the streamed bytes matches an independent hash.
    let entry = ckpt.manifest.file("critic/optimizer.safetensors").unwrap();
    let want = {
        use sha2::Digest;
        sha2::Sha256::digest(b"critic optim")
    };
    let want_hex: String = want.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(entry.sha256, want_hex);

    let missing = ckpt.path("critic/model.safetensors").unwrap_err();
    assert!(matches!(missing, CheckpointError::NotInCheckpoint { .. }));
    assert!(missing.to_string().contains("actor/model.safetensors"), "{missing}");

    // The manifest on disk has the documented shape.
    let m: serde_json::Value =
        serde_json::from_slice(&fs::read(root.join("global_step_7/manifest.json")).unwrap()).unwrap();
    assert_eq!(m["format"], "reinforge-checkpoint");
    assert_eq!(m["version"], 1);
    assert_eq!(m["step"], 7);
    assert!(m["created_unix"].as_u64().unwrap() > 1_600_000_000);
    assert_eq!(m["files"][0]["path"], "actor/model.safetensors");

    // Resume::Path, absolute and relative to the root; Resume::None.
    assert_eq!(resolve(&root, &Resume::Path(root.join("global_step_7"))).unwrap().unwrap().step, 7);
    assert_eq!(resolve(&root, &Resume::Path("global_step_7".into())).unwrap().unwrap().step, 7);
    assert!(resolve(&root, &Resume::None).unwrap().is_none());
}

#[test]
fn empty_or_missing_root_means_no_resume() {
    let dir = tempfile::tempdir().unwrap();
    assert!(resolve(dir.path().join("nope"), &Resume::Auto).unwrap().is_none());
    assert!(resolve(dir.path(), &Resume::Auto).unwrap().is_none());
}

#[test]
fn resume_parses_like_verl_resume_mode() {
    assert_eq!("auto".parse::<Resume>().unwrap(), Resume::Auto);
    assert_eq!("disable".parse::<Resume>().unwrap(), Resume::None);
    assert_eq!("none".parse::<Resume>().unwrap(), Resume::None);
    assert_eq!("ck/global_step_3".parse::<Resume>().unwrap(), Resume::Path("ck/global_step_3".into()));
}

#[test]
fn keep_last_k() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for step in 1..=5 {
        save_simple(root, step * 10, &SaveOptions::keep_last(2));
    }
    let steps: Vec<u64> = list_checkpoints(root).unwrap().into_iter().map(|(s, _)| s).collect();
    assert_eq!(steps, [40, 50]);
    assert_eq!(read_latest(root).unwrap().as_deref(), Some("global_step_50"));
    assert!(tmp_entries(root).is_empty());

    // Resumed from an older step: the new save is what `latest` names, so it survives even
    // though two higher steps exist.
    save_simple(root, 20, &SaveOptions::keep_last(2));
    let steps: Vec<u64> = list_checkpoints(root).unwrap().into_iter().map(|(s, _)| s).collect();
    assert_eq!(steps, [20, 40, 50]);
    assert_eq!(resolve(root, &Resume::Auto).unwrap().unwrap().step, 20);

    // keep_last = 0 would delete what was just saved: refused before writing anything.
    let err = save(root, 60, json!({}), &SaveOptions::keep_last(0), |_| Ok::<_, CheckpointError>(())).unwrap_err();
    assert!(matches!(err, CheckpointError::InvalidOptions(_)), "{err}");
    assert!(!root.join("global_step_60").exists());
}

#[test]
fn replacing_an_existing_step() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    save(root, 3, json!({"v": "old"}), &SaveOptions::default(), |w| {
        w.add_bytes("a.bin", b"old a")?;
        w.add_bytes("only_in_old.bin", b"x")
    })
    .unwrap();
    save(root, 3, json!({"v": "new"}), &SaveOptions::default(), |w| w.add_bytes("a.bin", b"new a, longer")).unwrap();
    let ckpt = resolve(root, &Resume::Auto).unwrap().unwrap();
    assert_eq!(ckpt.step, 3);
    assert_eq!(ckpt.meta()["v"], "new");
    assert_eq!(ckpt.read("a.bin").unwrap(), b"new a, longer");
    assert!(!ckpt.contains("only_in_old.bin"));
    assert!(!root.join("global_step_3/only_in_old.bin").exists());
    assert!(tmp_entries(root).is_empty(), "{:?}", tmp_entries(root));
}

#[test]
fn corrupt_file_detected_by_hash() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    save_simple(root, 1, &SaveOptions::default());
    save_simple(root, 2, &SaveOptions::default());
    // Same size, different bytes: only the hash can tell.
    let victim = root.join("global_step_2/actor/model.safetensors");
    let mut bytes = fs::read(&victim).unwrap();
    bytes[0] ^= 0xff;
    fs::write(&victim, &bytes).unwrap();

    let err = open(root.join("global_step_2"), &LoadOptions::default()).unwrap_err();
    assert!(matches!(err, CheckpointError::HashMismatch { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("actor/model.safetensors") && msg.contains("sha256"), "{msg}");
    assert!(!msg.contains('\n'));

    // Explicit path: an error naming the file.
    let err = resolve(root, &Resume::Path(root.join("global_step_2"))).unwrap_err();
    assert!(err.to_string().contains("actor/model.safetensors"), "{err}");

    // Auto: `latest` names step 2, which is corrupt, so it falls back to step 1.
    assert_eq!(resolve(root, &Resume::Auto).unwrap().unwrap().step, 1);

    // Without hash verification the corruption goes unnoticed (sizes match).
    let fast = LoadOptions { verify_hashes: false };
    assert_eq!(resolve_with(root, &Resume::Auto, &fast).unwrap().unwrap().step, 2);

    // A size change is caught even without hashes.
    fs::write(&victim, b"short").unwrap();
    let err = open(root.join("global_step_2"), &fast).unwrap_err();
    assert!(matches!(err, CheckpointError::SizeMismatch { .. }), "{err}");
    assert!(err.to_string().contains("actor/model.safetensors"));

    // A deleted file.
    fs::remove_file(&victim).unwrap();
    let err = open(root.join("global_step_2"), &fast).unwrap_err();
    assert!(matches!(err, CheckpointError::MissingFile { .. }), "{err}");

    // Every candidate broken: an error, not a silent restart from scratch.
    fs::remove_file(root.join("global_step_1/trainer_state.json")).unwrap();
    let err = resolve(root, &Resume::Auto).unwrap_err();
    assert!(matches!(err, CheckpointError::NoUsableCheckpoint { .. }), "{err}");
}

#[test]
fn missing_manifest_is_incomplete() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    save_simple(root, 1, &SaveOptions::default());
    save_simple(root, 2, &SaveOptions::default());
    fs::remove_file(root.join("global_step_2/manifest.json")).unwrap();

    let err = resolve(root, &Resume::Path(root.join("global_step_2"))).unwrap_err();
    assert!(matches!(err, CheckpointError::Incomplete { .. }), "{err}");
    assert!(err.to_string().contains("interrupted"), "{err}");
    assert_eq!(resolve(root, &Resume::Auto).unwrap().unwrap().step, 1);

    // A garbled manifest.
    fs::write(root.join("global_step_1/manifest.json"), b"{\"format\": ").unwrap();
    let err = open(root.join("global_step_1"), &LoadOptions::default()).unwrap_err();
    assert!(matches!(err, CheckpointError::BadManifest { .. }), "{err}");

    // The root itself is not a checkpoint, and the error says what to pass instead.
    let err = resolve(root, &Resume::Path(root.to_path_buf())).unwrap_err();
    assert!(err.to_string().contains("checkpoint root"), "{err}");
    let err = resolve(root, &Resume::Path(root.join("global_step_9"))).unwrap_err();
    assert!(err.to_string().contains("does not exist"), "{err}");
}

#[test]
fn broken_latest_falls_back_to_newest_complete() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    save_simple(root, 1, &SaveOptions::default());
    save_simple(root, 2, &SaveOptions::default());
    fs::write(root.join("latest"), "../../etc").unwrap();
    assert!(matches!(read_latest(root), Err(CheckpointError::BadLatest { .. })));
    assert_eq!(resolve(root, &Resume::Auto).unwrap().unwrap().step, 2);
    fs::remove_file(root.join("latest")).unwrap();
    assert_eq!(resolve(root, &Resume::Auto).unwrap().unwrap().step, 2);
    fs::write(root.join("latest"), "global_step_99\n").unwrap();
    assert_eq!(resolve(root, &Resume::Auto).unwrap().unwrap().step, 2);
    // The next save rewrites `latest`.
    save_simple(root, 3, &SaveOptions::default());
    assert_eq!(read_latest(root).unwrap().as_deref(), Some("global_step_3"));
}

#[test]
fn failed_save_leaves_nothing_and_keeps_latest() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    save_simple(root, 1, &SaveOptions::default());

    // The caller's own error type comes back wrapped with the step.
    let err = save(root, 2, json!({}), &SaveOptions::default(), |w| {
        w.add_bytes("a.bin", b"partial").map_err(|e| e.to_string())?;
        Err::<(), _>("optimizer state unavailable".to_string())
    })
    .unwrap_err();
    assert!(matches!(err, CheckpointError::Caller { step: 2, .. }), "{err}");
    assert!(err.to_string().contains("optimizer state unavailable"));

    // This crate's errors pass through unwrapped.
    let err = save(root, 2, json!({}), &SaveOptions::default(), |w| w.add_bytes("../escape", b"x")).unwrap_err();
    assert!(matches!(err, CheckpointError::BadName { .. }), "{err}");
    let err = save(root, 2, json!({}), &SaveOptions::default(), |w| {
        w.add_bytes("a", b"x")?;
        w.add_bytes("a", b"y")
    })
    .unwrap_err();
    assert!(err.to_string().contains("already written"), "{err}");

    // A callback that fails.
    let err = save(root, 2, json!({}), &SaveOptions::default(), |w| {
        w.add_file_with("actor/model.safetensors", |_p| Err::<(), _>(std::io::Error::other("disk on fire")))
    })
    .unwrap_err();
    assert!(matches!(err, CheckpointError::Write { .. }), "{err}");
    assert!(err.to_string().contains("actor/model.safetensors") && err.to_string().contains("disk on fire"));

    assert!(tmp_entries(root).is_empty(), "{:?}", tmp_entries(root));
    assert!(!root.join("global_step_2").exists());
    assert_eq!(resolve(root, &Resume::Auto).unwrap().unwrap().step, 1);
}

#[test]
fn side_files_written_by_a_callback_are_in_the_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut w = CheckpointWriter::begin(root, 5).unwrap();
    w.add_file_with("actor/model.safetensors", |p| {
        fs::write(p, b"shard index")?;
        fs::write(p.with_file_name("model-00001.safetensors"), b"shard 1")
    })
    .unwrap();
    let ckpt = w.commit(&SaveOptions::default()).unwrap();
    assert!(ckpt.contains("actor/model-00001.safetensors"));
    assert_eq!(open(&ckpt.dir, &LoadOptions::default()).unwrap().read("actor/model-00001.safetensors").unwrap(), b"shard 1");

    // An abandoned writer cleans up after itself.
    let w = CheckpointWriter::begin(root, 6).unwrap();
    let tmp = w.tmp_dir().to_path_buf();
    assert!(tmp.is_dir());
    drop(w);
    assert!(!tmp.exists());
}

#[test]
fn stale_temporaries_of_dead_writers_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // pid 4194304 is above Linux's pid_max limit, so it cannot be running; time 1 is 1970.
    let dead = root.join(".tmp-global_step_9-4194304-1");
    fs::create_dir_all(dead.join("actor")).unwrap();
    fs::write(dead.join("actor/model.safetensors"), b"half").unwrap();
    let dead_latest = root.join(".tmp-latest-4194304-1");
    fs::write(&dead_latest, b"global_step_9").unwrap();
    // A live writer's (this process, now) must be left alone.
    let live = root.join(format!(
        ".tmp-global_step_8-{}-{}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
    ));
    fs::create_dir(&live).unwrap();
    // Something that is not ours is left alone too.
    fs::create_dir(root.join(".tmp-something-else")).unwrap();

    save_simple(root, 1, &SaveOptions::default());
    if cfg!(target_os = "linux") {
        assert!(!dead.exists());
        assert!(!dead_latest.exists());
    }
    assert!(live.exists());
    assert!(root.join(".tmp-something-else").exists());
}

#[test]
fn a_writer_that_lost_its_run_directory_publishes_nothing() {
    use reinforge_lease::{Lease, LeaseOptions, Takeover};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("checkpoints");
    let (old, _) = Lease::acquire(dir.path(), &LeaseOptions::default()).unwrap();
    let fenced = SaveOptions { keep_last: Some(1), fence: Some(old.fence()), ..SaveOptions::default() };
    save_simple(&root, 1, &fenced);

    let forced = LeaseOptions { takeover: Takeover::Force, ..LeaseOptions::default() };
    let (new, _) = Lease::acquire(dir.path(), &forced).unwrap();
    let err = save(&root, 2, json!({}), &fenced, |w| w.add_bytes("trainer_state.json", b"{}")).unwrap_err();
    assert!(matches!(err, CheckpointError::Fenced(_)), "{err}");
    assert!(err.to_string().contains("lost ownership"), "{err}");
    // No step 2, `latest` still names step 1, step 1 not pruned, no temporary left behind.
    assert_eq!(list_checkpoints(&root).unwrap().iter().map(|(s, _)| *s).collect::<Vec<_>>(), [1]);
    assert_eq!(read_latest(&root).unwrap().as_deref(), Some("global_step_1"));
    assert!(tmp_entries(&root).is_empty(), "{:?}", tmp_entries(&root));

    // The new owner saves as usual (and prunes step 1 under keep_last = 1).
    let owned = SaveOptions { keep_last: Some(1), fence: Some(new.fence()), ..SaveOptions::default() };
    save_simple(&root, 2, &owned);
    assert_eq!(list_checkpoints(&root).unwrap().iter().map(|(s, _)| *s).collect::<Vec<_>>(), [2]);
}
