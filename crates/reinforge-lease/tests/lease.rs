//! The lease protocol in one process: refusals, release, takeover of a gone, silent or forced
//! holder, racing contenders, and fencing. Holders on "another machine" are records written by
//! hand with a foreign boot id, which is exactly what such a holder looks like from here.
//! (Separate processes, SIGSTOP and kill -9 are in the CLI's ownership tests.)

use reinforge_lease::{inspect, Acquired, Identity, Lease, LeaseError, LeaseOptions, LeaseRecord, Takeover, Verdict, FORMAT};
use std::path::Path;
use std::time::{Duration, Instant};

fn opts(timeout_s: f64) -> LeaseOptions {
    LeaseOptions { timeout: Duration::from_secs_f64(timeout_s), ..LeaseOptions::default() }
}

fn gen_file(dir: &Path, generation: u64) -> std::path::PathBuf {
    dir.join("lease").join(format!("gen-{generation:012}.json"))
}

/// A holder on another machine whose last heartbeat was `age_s` ago.
fn foreign_record(generation: u64, age_s: f64, timeout_s: f64) -> LeaseRecord {
    let now = reinforge_lease::unix_now();
    LeaseRecord {
        format: FORMAT.into(),
        version: 1,
        generation,
        holder: Identity {
            host: "node-7".into(),
            pid: 4242,
            pid_start_ticks: Some(1),
            boot_id: Some("a-boot-of-another-machine".into()),
            pid_ns: Some("pid:[1]".into()),
            started_unix: now - 3600.0,
            job_id: Some("rf-job-9".into()),
            command: "reinforge train cfg.toml".into(),
        },
        heartbeat_unix: now - age_s,
        heartbeat_seq: 5,
        timeout_s,
        released: false,
        began: "new".into(),
    }
}

fn write_record(dir: &Path, rec: &LeaseRecord) {
    std::fs::create_dir_all(dir.join("lease")).unwrap();
    std::fs::write(gen_file(dir, rec.generation), serde_json::to_vec(rec).unwrap()).unwrap();
}

#[test]
fn a_held_directory_is_refused_naming_the_holder_and_released_ones_are_taken_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (lease, how) = Lease::acquire(dir.path(), &opts(30.0)).unwrap();
    assert_eq!(how, Acquired::New);
    assert_eq!(lease.generation(), 1);
    lease.fence().check().unwrap();

    let err = Lease::acquire(dir.path(), &opts(30.0)).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, LeaseError::Held { generation: 1, .. }), "{msg}");
    for part in [
        format!("pid {}", std::process::id()),
        format!("host {}", reinforge_lease::hostname()),
        "another trainer.default_local_dir".into(),
        format!("`kill {}`", std::process::id()),
        "--takeover".into(),
    ] {
        assert!(msg.contains(&part), "{part:?} missing from: {msg}");
    }
    assert!(!msg.contains('\n'), "one line: {msg}");

    lease.release().unwrap();
    assert!(matches!(inspect(dir.path()).unwrap().verdict, Verdict::Released(_)));
    let (again, how) = Lease::acquire(dir.path(), &opts(30.0)).unwrap();
    assert!(matches!(how, Acquired::AfterRelease(_)), "{how:?}");
    assert_eq!(again.generation(), 2);
    // Dropping releases too.
    drop(again);
    let (third, _) = Lease::acquire(dir.path(), &opts(30.0)).unwrap();
    assert_eq!(third.generation(), 3);
    // Only the previous generation's file is kept.
    let mut names: Vec<String> =
        std::fs::read_dir(dir.path().join("lease")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["gen-000000000002.json", "gen-000000000003.json"]);
}

#[test]
fn a_holder_whose_process_is_gone_is_taken_over_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    // This machine, this pid namespace, a pid that has exited: certainly gone.
    let mut rec = foreign_record(4, 0.0, 600.0);
    rec.holder = Identity { pid, job_id: None, ..Identity::current(None) };
    write_record(dir.path(), &rec);
    let t = Instant::now();
    let (lease, how) = Lease::acquire(dir.path(), &opts(600.0)).unwrap();
    assert!(matches!(how, Acquired::HolderGone(ref h) if h.pid == pid), "{how:?}");
    assert!(how.takeover_message().unwrap().contains("that process is gone"));
    assert_eq!(lease.generation(), 5);
    assert!(t.elapsed() < Duration::from_secs(2), "no waiting for a gone holder: {:?}", t.elapsed());
}

#[test]
fn a_remote_holder_is_refused_while_it_heartbeats_and_taken_over_once_silent() {
    let dir = tempfile::tempdir().unwrap();
    // Fresh heartbeat on another machine: refused, naming the Ray job and how to stop it.
    write_record(dir.path(), &foreign_record(1, 0.5, 2.0));
    let err = Lease::acquire(dir.path(), &opts(2.0)).unwrap_err().to_string();
    assert!(err.contains("pid 4242 on host node-7, Ray job rf-job-9") && err.contains("`reinforge job stop rf-job-9`"), "{err}");

    // Silent past its timeout: watched for half the timeout, then taken.
    write_record(dir.path(), &foreign_record(1, 3.0, 2.0));
    assert!(matches!(inspect(dir.path()).unwrap().verdict, Verdict::Stale(..)));
    let t = Instant::now();
    let (lease, how) = Lease::acquire(dir.path(), &opts(2.0)).unwrap();
    let waited = t.elapsed();
    assert!(matches!(how, Acquired::Stale { .. }), "{how:?}");
    assert!(waited >= Duration::from_millis(1000) && waited < Duration::from_secs(3), "watched {waited:?}");
    assert_eq!(lease.generation(), 2);
    let rec: LeaseRecord = serde_json::from_slice(&std::fs::read(gen_file(dir.path(), 2)).unwrap()).unwrap();
    assert_eq!(rec.holder.pid, std::process::id());
    assert!(rec.began.contains("no heartbeat"), "{}", rec.began);
}

#[test]
fn a_silent_looking_holder_that_renews_while_watched_keeps_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let rec = foreign_record(1, 5.0, 2.0);
    write_record(dir.path(), &rec);
    // The holder was only slow (or its clock is behind): it renews during the watch.
    let d = dir.path().to_path_buf();
    let renewer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let mut r = rec;
        r.heartbeat_seq += 1;
        r.heartbeat_unix = reinforge_lease::unix_now();
        write_record(&d, &r);
    });
    let err = Lease::acquire(dir.path(), &opts(2.0)).unwrap_err();
    renewer.join().unwrap();
    assert!(matches!(err, LeaseError::Held { .. }), "{err}");
}

#[test]
fn takeover_forces_a_live_lease_and_the_old_holder_is_fenced() {
    let dir = tempfile::tempdir().unwrap();
    let (old, _) = Lease::acquire(dir.path(), &opts(30.0)).unwrap();
    let old_fence = old.fence();
    let forced = LeaseOptions { takeover: Takeover::Force, ..opts(30.0) };
    let (new, how) = Lease::acquire(dir.path(), &forced).unwrap();
    assert!(matches!(how, Acquired::Forced(_)), "{how:?}");
    assert_eq!(new.generation(), 2);
    new.fence().check().unwrap();
    let err = old_fence.check().unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, LeaseError::Lost { generation: 2, .. }), "{msg}");
    assert!(msg.contains("lost ownership") && msg.contains("--takeover") && msg.contains("without writing"), "{msg}");
    // Once lost, always lost; and giving back a lost lease leaves the new owner's record alone.
    assert!(old_fence.check().is_err());
    drop(old);
    let rec: LeaseRecord = serde_json::from_slice(&std::fs::read(gen_file(dir.path(), 2)).unwrap()).unwrap();
    assert!(!rec.released);
    new.fence().check().unwrap();
}

#[test]
fn of_many_racing_contenders_exactly_one_wins() {
    for _ in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (d, b) = (dir.path().to_path_buf(), barrier.clone());
                std::thread::spawn(move || {
                    b.wait();
                    Lease::acquire(&d, &opts(30.0))
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let winners = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(winners, 1);
        for r in &results {
            if let Err(e) = r {
                assert!(matches!(e, LeaseError::Held { generation: 1, .. }), "{e}");
            }
        }
    }
}

#[test]
fn heartbeats_renew_the_record_and_an_unreadable_one_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    // Renewals every 250 ms, each trusted for 500 ms: a loaded CI machine's slow fsync must
    // not make the holder re-take its own lease (a renewal counts only once written).
    let (lease, _) = Lease::acquire(dir.path(), &opts(1.0)).unwrap();
    let read = || -> LeaseRecord { serde_json::from_slice(&std::fs::read(lease.path()).unwrap()).unwrap() };
    let first = read().heartbeat_seq;
    std::thread::sleep(Duration::from_millis(1100));
    assert!(read().heartbeat_seq >= first + 2, "heartbeats every quarter of the timeout");
    assert_eq!(read().began, "new", "renewals keep how the generation began");
    // Past the timeout, the holder is still the owner: it kept renewing.
    lease.fence().check().unwrap();
    assert!(matches!(inspect(dir.path()).unwrap().verdict, Verdict::Live(..)));
    drop(lease);

    // A record that is not a lease (edited by hand, a torn write on a file system without
    // hard links) and old enough not to be in the middle of its creation.
    let other = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(other.path().join("lease")).unwrap();
    let f = std::fs::File::create(gen_file(other.path(), 3)).unwrap();
    f.set_modified(std::time::SystemTime::now() - Duration::from_secs(60)).unwrap();
    drop(f);
    let (l, how) = Lease::acquire(other.path(), &opts(30.0)).unwrap();
    assert_eq!(how, Acquired::Unreadable);
    assert_eq!(l.generation(), 4);
}

#[test]
fn a_run_dir_is_removed_only_by_its_owner() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let (lease, _) = Lease::acquire(&run, &opts(30.0)).unwrap();
    std::fs::write(run.join("config.toml"), "x").unwrap();
    lease.remove_run_dir().unwrap();
    assert!(!run.exists(), "the owner's failed start leaves nothing behind");

    // Taken over meanwhile: the new owner's directory stays.
    let (lease, _) = Lease::acquire(&run, &opts(30.0)).unwrap();
    let mut rec = foreign_record(lease.generation() + 1, 0.0, 30.0);
    rec.began = "took over".into();
    write_record(&run, &rec);
    let err = lease.remove_run_dir().unwrap_err();
    assert!(matches!(err, LeaseError::Lost { .. }), "{err}");
    assert!(gen_file(&run, rec.generation).is_file(), "the new owner's lease deleted");
}
