//! The lease: generation files in `<run dir>/lease/`, created exclusively, renewed by a
//! heartbeat thread, checked by [`Fence::check`] before every write that publishes state.
//!
//! Why it is safe without an OS lock (which NFS, Lustre and cloud file stores do not keep
//! reliably):
//! - **Taking a generation is a compare-and-swap.** Generation `g + 1` is taken by hard-linking
//!   a fully written temporary file to `gen-<g+1>.json` (`link(2)` fails if the name exists: the
//!   classic NFS-safe lock file; `O_EXCL` where hard links are not supported). Of any number of
//!   processes that try, exactly one wins; the others look again.
//! - **The highest generation owns the directory.** A process that sees a higher generation
//!   than its own has lost, and says so instead of writing.
//! - **A holder trusts its lease only for half the timeout after its last renewal**, by its own
//!   monotonic clock. After that (it was paused, its disk stalled) it must win the next
//!   generation before it writes again.
//! - **A contender takes over a live-looking lease only after watching it not change for half
//!   the timeout** (on its own clock), and only once the heartbeat is older than the timeout
//!   by the wall clock. So when the contender takes over, the holder's own trust has already
//!   run out, whatever the skew between the two machines' clocks.
//! - **A holder on this machine whose process is gone** (checked through `/proc`, same boot and
//!   pid namespace) is taken over at once: a killed run restarts without waiting.
//!
//! What remains is the instant between a fence check and the write it guards: a process
//! paused exactly there for longer than half the timeout could still write once. Checks sit
//! immediately before each publishing call — for a file replaced whole, after its temporary's
//! `fsync` and before the rename (the heartbeat's own rewrite, [`Fence::publish`], `latest`,
//! the metrics' truncation) — so that window is a few system calls wide. A check before the
//! write left the whole `fsync` in it: the CLI's SIGSTOP test once caught a paused holder
//! renaming a heartbeat it had written before the takeover.

use crate::error::{io_err, LeaseError};
use crate::identity::{fmt_age, unix_now, Identity};
use serde::{Deserialize, Serialize};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The lease's directory inside a run directory.
pub const LEASE_DIR: &str = "lease";

/// `format` of every lease record.
pub const FORMAT: &str = "reinforge-lease";

/// The default staleness timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Tries before [`LeaseError::Contended`].
const MAX_ATTEMPTS: usize = 16;

/// An unreadable generation file younger than this is being written (file systems without
/// hard links create it empty, then fill it).
const WRITING_GRACE: Duration = Duration::from_secs(5);

/// One generation's record: `<run dir>/lease/gen-<generation>.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// Always [`FORMAT`].
    pub format: String,
    /// Record version (1).
    pub version: u32,
    /// The generation this record owns.
    pub generation: u64,
    /// Who holds it.
    pub holder: Identity,
    /// Last renewal, by the holder's clock (Unix seconds).
    pub heartbeat_unix: f64,
    /// Renewals so far: watchers see it change even when clocks disagree.
    pub heartbeat_seq: u64,
    /// Seconds without a heartbeat after which others may take the lease.
    pub timeout_s: f64,
    /// The holder finished and gave the directory back.
    #[serde(default)]
    pub released: bool,
    /// How this generation began, for people reading the file.
    #[serde(default)]
    pub began: String,
}

/// What to do when the directory is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Takeover {
    /// Take it only when its holder is gone or silent past the timeout.
    #[default]
    IfStale,
    /// Take it now, whatever its state (`--takeover`); the old holder stops at its next check.
    Force,
}

/// How to take a run directory.
#[derive(Debug, Clone)]
pub struct LeaseOptions {
    /// Silence after which others may take the lease; heartbeats go every quarter of it.
    pub timeout: Duration,
    /// Whether to force the takeover of a live lease.
    pub takeover: Takeover,
    /// The Ray job this process runs as, recorded for the refusal message.
    pub job_id: Option<String>,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions { timeout: DEFAULT_TIMEOUT, takeover: Takeover::IfStale, job_id: None }
    }
}

/// How a run directory came to be this process's.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Acquired {
    /// No run had owned it.
    New,
    /// The previous run finished and gave it back.
    AfterRelease(Box<Identity>),
    /// The previous holder's process is gone (seen through `/proc` on this machine).
    HolderGone(Box<Identity>),
    /// The previous holder stopped heartbeating.
    Stale {
        /// The previous holder.
        holder: Box<Identity>,
        /// Seconds since its last heartbeat when it was taken.
        heartbeat_age_s: f64,
    },
    /// Taken from a live holder with `--takeover`.
    Forced(Box<Identity>),
    /// The previous generation's file could not be read.
    Unreadable,
}

impl Acquired {
    /// A sentence for the log, or `None` when nothing was taken from anyone.
    pub fn takeover_message(&self) -> Option<String> {
        match self {
            Acquired::New | Acquired::AfterRelease(_) => None,
            Acquired::HolderGone(h) => Some(format!("took over from {}: that process is gone", h.describe())),
            Acquired::Stale { holder, heartbeat_age_s } => {
                Some(format!("took over from {}: no heartbeat for {}", holder.describe(), fmt_age(*heartbeat_age_s)))
            }
            Acquired::Forced(h) => Some(format!("took over from {} with --takeover; it stops at its next write", h.describe())),
            Acquired::Unreadable => Some("took over: the previous lease file could not be read".into()),
        }
    }

    fn began(&self) -> String {
        self.takeover_message().unwrap_or_else(|| match self {
            Acquired::AfterRelease(h) => format!("after {} released it", h.describe()),
            _ => "new".into(),
        })
    }
}

/// The state of a run directory's lease, as one process sees it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Verdict {
    /// No lease was ever taken.
    Free,
    /// The last holder gave it back.
    Released(Box<LeaseRecord>),
    /// The holder's process is gone (checked on this machine).
    HolderGone(Box<LeaseRecord>),
    /// The holder has not renewed for longer than its timeout (by this machine's clock): it can
    /// be taken after watching it for half the timeout.
    Stale(Box<LeaseRecord>, f64),
    /// The holder is alive as far as anyone can tell.
    Live(Box<LeaseRecord>, f64),
    /// The newest file is unreadable and older than the grace period for being written.
    Unreadable,
    /// The newest file is unreadable and new: someone is creating it.
    Writing,
}

/// A run directory's lease state: the newest generation and what it means.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseView {
    /// The run directory.
    pub run_dir: PathBuf,
    /// The newest generation (0 when there is none).
    pub generation: u64,
    /// What it means.
    pub verdict: Verdict,
}

impl LeaseView {
    /// The refusal a new run would get, if any: the one check both `train` and `job submit` make.
    pub fn refusal(&self) -> Option<LeaseError> {
        match &self.verdict {
            Verdict::Live(rec, age) => Some(LeaseError::Held {
                run_dir: self.run_dir.clone(),
                holder: Box::new(rec.holder.clone()),
                generation: self.generation,
                heartbeat_age_s: *age,
                timeout_s: rec.timeout_s,
            }),
            _ => None,
        }
    }

    /// The holder's record, when there is a readable one.
    pub fn record(&self) -> Option<&LeaseRecord> {
        match &self.verdict {
            Verdict::Released(r) | Verdict::HolderGone(r) | Verdict::Stale(r, _) | Verdict::Live(r, _) => Some(r),
            _ => None,
        }
    }
}

/// Reads a run directory's lease without taking it.
pub fn inspect(run_dir: &Path) -> Result<LeaseView, LeaseError> {
    Dir::new(run_dir).view(&Identity::current(None))
}

/// Ownership of a run directory. Heartbeats run in a thread while it lives; dropping it gives
/// the directory back.
#[derive(Debug)]
pub struct Lease {
    shared: Arc<Shared>,
    heartbeat: Option<JoinHandle<()>>,
}

/// A cheap handle that says whether this process still owns the run directory.
#[derive(Clone)]
pub struct Fence(Arc<Shared>);

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fence({})", self.0.dir.run_dir.display())
    }
}

impl Fence {
    /// `Ok` while this process owns the run directory; call it right before each write that
    /// publishes state. Once it fails it keeps failing.
    pub fn check(&self) -> Result<(), LeaseError> {
        self.0.check()
    }

    /// Writes `bytes` to `path` whole (a synced `.tmp-` file beside it, then a rename) if this
    /// process still owns the run directory. The check sits between the write (the slow part)
    /// and the rename, so that a process paused while writing publishes nothing when it wakes
    /// up without the directory; the temporary is deleted then.
    pub fn publish(&self, path: &Path, bytes: &[u8]) -> Result<(), LeaseError> {
        let name = path.file_name().map_or("file".into(), |n| n.to_string_lossy().into_owned());
        let tmp = tmp_path(path.parent().unwrap_or(Path::new(".")), &name);
        replace_synced(&tmp, path, bytes, || self.check().map(|()| true)).map(|_| ())
    }

    /// The generation this process holds.
    pub fn generation(&self) -> u64 {
        self.0.lock().generation
    }

    /// The run directory.
    pub fn run_dir(&self) -> &Path {
        &self.0.dir.run_dir
    }

    /// Deletes the `.tmp-` files directly in `dir` (in the run directory) that another process
    /// left: written by an earlier owner that died or lost the directory mid-write, they can
    /// never be published. Only while this process owns the directory; returns how many went.
    pub fn sweep_temporaries(&self, dir: &Path) -> Result<usize, LeaseError> {
        self.check()?;
        let Ok(entries) = fs::read_dir(dir) else { return Ok(0) };
        let mut removed = 0;
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            let theirs = name.starts_with(".tmp-") && tmp_pid(name) != Some(std::process::id());
            if theirs && e.file_type().is_ok_and(|t| t.is_file()) && fs::remove_file(e.path()).is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// The longest this process may stop every thread (a debugger reading its stacks) without
    /// another run being able to take the directory meanwhile: a contender waits for a heartbeat
    /// older than the timeout, then watches half a timeout more, and the last heartbeat may be a
    /// quarter timeout old when the stop begins.
    pub fn max_freeze(&self) -> Duration {
        self.0.timeout.mul_f64(1.25)
    }
}

/// The lease directory's files.
#[derive(Debug)]
struct Dir {
    run_dir: PathBuf,
    path: PathBuf,
}

impl Dir {
    fn new(run_dir: &Path) -> Dir {
        Dir { run_dir: run_dir.to_path_buf(), path: run_dir.join(LEASE_DIR) }
    }

    fn gen_path(&self, generation: u64) -> PathBuf {
        self.path.join(format!("gen-{generation:012}.json"))
    }

    /// Generations present, ascending.
    fn generations(&self) -> Result<Vec<u64>, LeaseError> {
        let entries = match fs::read_dir(&self.path) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err("list", &self.path)(e)),
        };
        let mut gens: Vec<u64> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str()?.strip_prefix("gen-")?.strip_suffix(".json")?.parse().ok())
            .collect();
        gens.sort_unstable();
        Ok(gens)
    }

    fn newest(&self) -> Result<u64, LeaseError> {
        Ok(self.generations()?.last().copied().unwrap_or(0))
    }

    /// The record of `generation`: `Ok(None)` if unreadable, `Err` only for I/O failures other
    /// than the file having gone (it is then reported as unreadable too).
    fn read(&self, generation: u64) -> Result<Option<(LeaseRecord, Duration)>, LeaseError> {
        let path = self.gen_path(generation);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err("read", &path)(e)),
        };
        let modified_age = fs::metadata(&path).and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok()).unwrap_or_default();
        Ok(serde_json::from_slice::<LeaseRecord>(&bytes)
            .ok()
            .filter(|r| r.format == FORMAT && r.generation == generation)
            .map(|r| (r, modified_age)))
    }

    /// The newest generation and its verdict, as `observer` sees it.
    fn view(&self, observer: &Identity) -> Result<LeaseView, LeaseError> {
        let generation = self.newest()?;
        let verdict = if generation == 0 {
            Verdict::Free
        } else {
            match self.read(generation)? {
                None => {
                    let age = fs::metadata(self.gen_path(generation))
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .unwrap_or(WRITING_GRACE);
                    if age < WRITING_GRACE {
                        Verdict::Writing
                    } else {
                        Verdict::Unreadable
                    }
                }
                Some((rec, _)) => {
                    let age = (unix_now() - rec.heartbeat_unix).max(0.0);
                    if rec.released {
                        Verdict::Released(Box::new(rec))
                    } else if rec.holder.is_alive_seen_from(observer) == Some(false) {
                        Verdict::HolderGone(Box::new(rec))
                    } else if age > rec.timeout_s {
                        Verdict::Stale(Box::new(rec), age)
                    } else {
                        Verdict::Live(Box::new(rec), age)
                    }
                }
            }
        };
        Ok(LeaseView { run_dir: self.run_dir.clone(), generation, verdict })
    }

    /// Creates `gen-<generation>.json` holding `rec` if no one has: `Ok(true)` if this call did.
    fn create(&self, rec: &LeaseRecord) -> Result<bool, LeaseError> {
        fs::create_dir_all(&self.path).map_err(io_err("create directory", &self.path))?;
        let target = self.gen_path(rec.generation);
        let tmp = tmp_path(&self.path, &format!("gen-{}", rec.generation));
        write_synced(&tmp, &record_bytes(rec, &tmp)?)?;
        let won = match fs::hard_link(&tmp, &target) {
            Ok(()) => Ok(true),
            // Over NFS a retransmitted link can report EEXIST for our own success: the link
            // count of the temporary says who made the name.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(link_count(&tmp) == Some(2)),
            Err(e) if hard_links_unsupported(&e) => create_exclusive(&target, rec),
            Err(e) => Err(io_err("link", &target)(e)),
        };
        let _ = fs::remove_file(&tmp);
        if matches!(won, Ok(true)) {
            sync_dir(&self.path);
        }
        won
    }

    /// Rewrites `rec`'s generation file (heartbeats, release): temporary file, then rename.
    /// `still_ours` decides between the two: `Ok(false)` leaves the file as it was and
    /// returns `Ok(false)`.
    ///
    /// Why the decision sits there: writing the temporary (create, write, fsync) is the slow
    /// part, and a process paused inside it (SIGSTOP, a stalled disk) must not publish a
    /// heartbeat on waking when the lease went to another meanwhile. Deciding after the fsync
    /// leaves only a directory listing and the rename between the decision and what others see.
    fn rewrite(&self, rec: &LeaseRecord, still_ours: impl FnOnce() -> Result<bool, LeaseError>) -> Result<bool, LeaseError> {
        let tmp = tmp_path(&self.path, &format!("hb-{}", rec.generation));
        replace_synced(&tmp, &self.gen_path(rec.generation), &record_bytes(rec, &tmp)?, still_ours)
    }

    /// Deletes generations before `keep_from` and leftover temporaries older than an hour.
    fn prune(&self, keep_from: u64) {
        let Ok(entries) = fs::read_dir(&self.path) else { return };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            let old_gen = name.strip_prefix("gen-").and_then(|n| n.strip_suffix(".json")?.parse::<u64>().ok()).is_some_and(|g| g < keep_from);
            let old_tmp = name.starts_with(".tmp-")
                && e.metadata().and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok()).is_some_and(|a| a > Duration::from_secs(3600));
            if old_gen || old_tmp {
                let _ = fs::remove_file(e.path());
            }
        }
    }
}

/// `<dir>/.tmp-<label>-<pid>-<nanos>`: never mistaken for a generation file, and skipped by
/// readers of a run directory.
fn tmp_path(dir: &Path, label: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    dir.join(format!(".tmp-{label}-{}-{nanos}", std::process::id()))
}

/// The writer's pid in a name [`tmp_path`] made (`.tmp-<label>-<pid>-<nanos>`).
fn tmp_pid(name: &str) -> Option<u32> {
    let mut back = name.strip_prefix(".tmp-")?.rsplitn(3, '-');
    let (_nanos, pid) = (back.next()?, back.next()?);
    back.next()?;
    pid.parse().ok()
}

fn record_bytes(rec: &LeaseRecord, path: &Path) -> Result<Vec<u8>, LeaseError> {
    serde_json::to_vec_pretty(rec).map_err(|e| io_err("serialize", path)(e.into()))
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), LeaseError> {
    let mut f = File::create(path).map_err(io_err("create", path))?;
    f.write_all(bytes).map_err(io_err("write", path))?;
    f.sync_all().map_err(io_err("fsync", path))
}

/// Writes `bytes` to `tmp` (synced), then asks `decide` and renames `tmp` over `target` only
/// on `Ok(true)`: the decision sits after the slow part (the fsync), immediately before what
/// others see. The temporary is gone afterwards whatever happened.
fn replace_synced(tmp: &Path, target: &Path, bytes: &[u8], decide: impl FnOnce() -> Result<bool, LeaseError>) -> Result<bool, LeaseError> {
    let result = write_synced(tmp, bytes).and_then(|()| {
        #[cfg(test)]
        tests::before_publish();
        if !decide()? {
            return Ok(false);
        }
        fs::rename(tmp, target).map_err(io_err("rename to", target))?;
        Ok(true)
    });
    if !matches!(result, Ok(true)) {
        let _ = fs::remove_file(tmp);
    }
    result
}

/// `O_EXCL` creation, for file systems without hard links (some FUSE stores): the file exists
/// empty for a moment, which readers treat as [`Verdict::Writing`].
fn create_exclusive(target: &Path, rec: &LeaseRecord) -> Result<bool, LeaseError> {
    let mut f = match fs::OpenOptions::new().write(true).create_new(true).open(target) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
        Err(e) => return Err(io_err("create", target)(e)),
    };
    f.write_all(&record_bytes(rec, target)?).map_err(io_err("write", target))?;
    f.sync_all().map_err(io_err("fsync", target))?;
    Ok(true)
}

fn hard_links_unsupported(e: &std::io::Error) -> bool {
    // EPERM, ENOTSUP/EOPNOTSUPP and ENOSYS are what FUSE stores and some SMB mounts answer.
    e.kind() == std::io::ErrorKind::Unsupported || matches!(e.raw_os_error(), Some(1) | Some(38) | Some(95))
}

#[cfg(unix)]
fn link_count(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(path).ok().map(|m| m.nlink())
}

#[cfg(not(unix))]
fn link_count(_path: &Path) -> Option<u64> {
    None
}

/// Best effort: makes a new name durable; a failure only weakens crash safety, not exclusion.
fn sync_dir(path: &Path) {
    #[cfg(unix)]
    if let Ok(f) = File::open(path) {
        let _ = f.sync_all();
    }
    #[cfg(not(unix))]
    let _ = path;
}

/// What a held lease shares between its heartbeat thread and its fences.
#[derive(Debug)]
struct Shared {
    dir: Dir,
    me: Identity,
    timeout: Duration,
    state: Mutex<State>,
    /// Set (under its mutex) to stop the heartbeat thread.
    stop: (Mutex<bool>, Condvar),
}

#[derive(Debug)]
struct State {
    generation: u64,
    seq: u64,
    /// When the last successful renewal started: the lease is trusted for half the timeout after.
    renewed: Instant,
    /// Set once another process owns the directory; every later check fails with it.
    lost: Option<Lost>,
    released: bool,
    /// How this generation began (kept in every rewrite of its record).
    began: String,
}

#[derive(Debug, Clone)]
struct Lost {
    by: Option<Box<Identity>>,
    generation: u64,
    why: String,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves consistent plain data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long a renewal is trusted.
    fn valid_for(&self) -> Duration {
        self.timeout / 2
    }

    fn record(&self, generation: u64, seq: u64, began: &str, released: bool) -> LeaseRecord {
        LeaseRecord {
            format: FORMAT.into(),
            version: 1,
            generation,
            holder: self.me.clone(),
            heartbeat_unix: unix_now(),
            heartbeat_seq: seq,
            timeout_s: self.timeout.as_secs_f64(),
            released,
            began: began.to_string(),
        }
    }

    fn lost_error(&self, l: &Lost) -> LeaseError {
        LeaseError::Lost { run_dir: self.dir.run_dir.clone(), by: l.by.clone(), generation: l.generation, why: l.why.clone() }
    }

    /// Marks the lease lost to `generation` and returns the error.
    fn lose(&self, st: &mut State, generation: u64, why: String) -> LeaseError {
        let rec = self.dir.read(generation).ok().flatten().map(|(r, _)| r);
        // Without a reason of our own, the new owner's record says how it took over.
        let why = match &rec {
            Some(r) if why.is_empty() => r.began.clone(),
            _ => why,
        };
        let l = Lost { by: rec.map(|r| Box::new(r.holder)), generation, why };
        let e = self.lost_error(&l);
        st.lost = Some(l);
        e
    }

    fn check(&self) -> Result<(), LeaseError> {
        let mut st = self.lock();
        if let Some(l) = &st.lost {
            return Err(self.lost_error(l));
        }
        if st.released {
            return Err(LeaseError::Lost {
                run_dir: self.dir.run_dir.clone(),
                by: None,
                generation: st.generation,
                why: "this run already gave it back".into(),
            });
        }
        // The listing (a round trip on NFS) before the clock check, so that nothing slow sits
        // between the clock check and the write the caller does next.
        let newest = self.dir.newest()?;
        if newest > st.generation {
            return Err(self.lose(&mut st, newest, String::new()));
        }
        if st.renewed.elapsed() >= self.valid_for() {
            return self.renew(&mut st);
        }
        Ok(())
    }

    /// One heartbeat: rewrite this generation's record, or, if this process's trust in its
    /// lease has run out, win the next generation before going on.
    fn renew(&self, st: &mut State) -> Result<(), LeaseError> {
        if let Some(l) = &st.lost {
            return Err(self.lost_error(l));
        }
        let newest = self.dir.newest()?;
        if newest > st.generation {
            return Err(self.lose(st, newest, String::new()));
        }
        let started = Instant::now();
        let gap = st.renewed.elapsed();
        if gap >= self.valid_for() {
            return self.retake(st, started, gap);
        }
        let (generation, renewed) = (st.generation, st.renewed);
        let rec = self.record(generation, st.seq + 1, &st.began, false);
        // Published only if, once the record is on disk, no higher generation exists and this
        // process still trusts its lease (see `Dir::rewrite`); the listing first, since on NFS
        // it is a round trip, which must not fall after the clock check.
        let published = self.dir.rewrite(&rec, || Ok(self.dir.newest()? == generation && renewed.elapsed() < self.valid_for()))?;
        if published {
            st.seq += 1;
            st.renewed = started;
            return Ok(());
        }
        let newest = self.dir.newest()?;
        if newest > generation {
            return Err(self.lose(st, newest, String::new()));
        }
        // The write outlasted this process's trust (it was paused, or its disk stalled).
        self.retake(st, Instant::now(), renewed.elapsed())
    }

    /// Renewal after `gap` without one, longer than the lease is trusted for: others may be
    /// taking over right now (they waited for exactly this silence), so only a generation this
    /// process wins decides who goes on.
    fn retake(&self, st: &mut State, started: Instant, gap: Duration) -> Result<(), LeaseError> {
        let next = st.generation + 1;
        let began = format!("re-taken by its holder after {} without a heartbeat", fmt_age(gap.as_secs_f64()));
        if self.dir.create(&self.record(next, 0, &began, false))? {
            tracing::warn!(
                run_dir = %self.dir.run_dir.display(),
                "this run went {} without renewing its lease (paused, or its file system stalled); re-took it as generation {next}",
                fmt_age(gap.as_secs_f64())
            );
            st.generation = next;
            st.seq = 0;
            st.renewed = started;
            st.began = began;
            self.dir.prune(next.saturating_sub(1));
            return Ok(());
        }
        let why = format!(
            "this run went {} without renewing its lease (paused, or its file system stalled) and another took it meanwhile",
            fmt_age(gap.as_secs_f64())
        );
        Err(self.lose(st, next, why))
    }

    fn heartbeat_loop(&self) {
        let interval = self.timeout / 4;
        let (lock, cv) = &self.stop;
        let mut stopped = lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            // Checked before waiting too: a stop requested before this thread first took the
            // lock would otherwise wait out a whole interval.
            if *stopped {
                return;
            }
            stopped = cv.wait_timeout(stopped, interval).unwrap_or_else(|p| p.into_inner()).0;
            if *stopped {
                return;
            }
            let mut st = self.lock();
            match self.renew(&mut st) {
                Ok(()) => {}
                Err(e @ LeaseError::Lost { .. }) => {
                    // Said now, since the run may be in the middle of a long step; it stops
                    // with this error at its next write.
                    tracing::error!("{e}");
                    return;
                }
                // A failed write (a file system hiccup) is retried at the next beat; if they
                // keep failing, the lease lapses and the next fence check says so.
                Err(e) => tracing::warn!("lease heartbeat: {e}"),
            }
        }
    }

    /// Gives the directory back (marks the record released) if it is still ours.
    fn release(&self) -> Result<(), LeaseError> {
        let mut st = self.lock();
        if st.lost.is_some() || st.released {
            return Ok(());
        }
        if st.renewed.elapsed() >= self.valid_for() {
            // Trust ran out (a pause, a stalled disk): a contender may be taking over right
            // now, so give back only a generation won anew.
            match self.renew(&mut st) {
                Ok(()) => {}
                Err(LeaseError::Lost { .. }) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        let generation = st.generation;
        if self.dir.newest()? != generation {
            return Ok(());
        }
        if self.dir.rewrite(&self.record(generation, st.seq + 1, &st.began, true), || Ok(self.dir.newest()? == generation))? {
            st.seq += 1;
            st.released = true;
        }
        Ok(())
    }
}

impl Lease {
    /// Takes ownership of `run_dir` (its `lease/` subdirectory is created), or explains who
    /// holds it. May wait up to half the holder's timeout to confirm that a silent holder is
    /// gone; says so on the log first.
    pub fn acquire(run_dir: &Path, opts: &LeaseOptions) -> Result<(Lease, Acquired), LeaseError> {
        let dir = Dir::new(run_dir);
        let me = Identity::current(opts.job_id.clone());
        for _ in 0..MAX_ATTEMPTS {
            let view = dir.view(&me)?;
            let how = match (&view.verdict, opts.takeover) {
                (Verdict::Free, _) => Acquired::New,
                (Verdict::Released(r), _) => Acquired::AfterRelease(Box::new(r.holder.clone())),
                (Verdict::HolderGone(r), _) => Acquired::HolderGone(Box::new(r.holder.clone())),
                (Verdict::Unreadable, _) => Acquired::Unreadable,
                (Verdict::Writing, _) => {
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
                (Verdict::Live(r, _) | Verdict::Stale(r, _), Takeover::Force) => Acquired::Forced(Box::new(r.holder.clone())),
                (Verdict::Live(..), Takeover::IfStale) => return Err(view.refusal().expect("a live lease has a refusal")),
                (Verdict::Stale(r, age), Takeover::IfStale) => {
                    if !confirm_silent(&dir, view.generation, r) {
                        continue;
                    }
                    Acquired::Stale { holder: Box::new(r.holder.clone()), heartbeat_age_s: *age + r.timeout_s / 2.0 }
                }
            };
            let generation = view.generation + 1;
            let began = how.began();
            let shared = Arc::new(Shared {
                dir: Dir::new(run_dir),
                me: me.clone(),
                timeout: opts.timeout,
                state: Mutex::new(State { generation, seq: 0, renewed: Instant::now(), lost: None, released: false, began: began.clone() }),
                stop: (Mutex::new(false), Condvar::new()),
            });
            if !dir.create(&shared.record(generation, 0, &began, false))? {
                continue; // another process took this generation first: look again
            }
            dir.prune(view.generation);
            let hb = shared.clone();
            let heartbeat = std::thread::Builder::new()
                .name("lease-heartbeat".into())
                .spawn(move || hb.heartbeat_loop())
                .map_err(io_err("start heartbeat thread for", &dir.path))?;
            return Ok((Lease { shared, heartbeat: Some(heartbeat) }, how));
        }
        Err(LeaseError::Contended { run_dir: run_dir.to_path_buf(), attempts: MAX_ATTEMPTS })
    }

    /// A handle for checks before writes.
    pub fn fence(&self) -> Fence {
        Fence(self.shared.clone())
    }

    /// The generation this process holds.
    pub fn generation(&self) -> u64 {
        self.shared.lock().generation
    }

    /// The lease's file of the current generation.
    pub fn path(&self) -> PathBuf {
        self.shared.dir.gen_path(self.generation())
    }

    /// Stops the heartbeat and gives the directory back, so the next run takes it at once.
    pub fn release(mut self) -> Result<(), LeaseError> {
        self.stop_heartbeat();
        self.shared.release()
    }

    /// Deletes the run directory while still holding it, for a run that failed while starting
    /// in a directory it created (it leaves nothing behind): deleting after giving it back
    /// could delete a run that took it in between. Refused, deleting nothing, if this process
    /// no longer owns it; if the deletion fails, what is left is given back as usual.
    pub fn remove_run_dir(mut self) -> Result<(), LeaseError> {
        self.stop_heartbeat();
        self.shared.check()?;
        let run_dir = self.shared.dir.run_dir.clone();
        fs::remove_dir_all(&run_dir).map_err(io_err("remove", &run_dir))?;
        // Nothing to give back once the directory is gone: `Drop` must not re-create it.
        self.shared.lock().released = true;
        Ok(())
    }

    fn stop_heartbeat(&mut self) {
        if let Some(h) = self.heartbeat.take() {
            let (lock, cv) = &self.shared.stop;
            *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
            cv.notify_all();
            let _ = h.join();
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.stop_heartbeat();
        if let Err(e) = self.shared.release() {
            tracing::warn!("giving the run directory back: {e} (the next run takes it over after the lease timeout)");
        }
    }
}

/// Watches a stale-looking generation for half its timeout (this machine's monotonic clock):
/// `true` if it stayed silent, `false` if it changed (renewed, released, superseded).
fn confirm_silent(dir: &Dir, generation: u64, rec: &LeaseRecord) -> bool {
    let watch = Duration::from_secs_f64((rec.timeout_s / 2.0).max(0.0));
    tracing::warn!(
        run_dir = %dir.run_dir.display(),
        "the run that holds this directory ({}) has had no heartbeat for {} (timeout {}s); watching it for {} more before taking over",
        rec.holder.describe(),
        fmt_age(unix_now() - rec.heartbeat_unix),
        rec.timeout_s.round(),
        fmt_age(watch.as_secs_f64())
    );
    let deadline = Instant::now() + watch;
    loop {
        let unchanged = dir.newest().ok() == Some(generation)
            && dir.read(generation).ok().flatten().is_some_and(|(r, _)| r.heartbeat_seq == rec.heartbeat_seq && !r.released);
        if !unchanged {
            return false;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
}

#[cfg(test)]
mod tests {
    //! A pause inside a heartbeat's write, which separate processes (the CLI's SIGSTOP test)
    //! hit only by chance: a hook runs between the temporary file's fsync and the rename.
    use super::*;
    use std::cell::RefCell;

    thread_local! {
        static HOOK: RefCell<Option<Box<dyn FnOnce()>>> = RefCell::new(None);
    }

    /// Runs (once) what the test on this thread set, as if the process stopped there.
    pub(super) fn before_publish() {
        if let Some(f) = HOOK.with(|h| h.borrow_mut().take()) {
            f();
        }
    }

    fn pause_inside_next_write(f: impl FnOnce() + 'static) {
        HOOK.with(|h| *h.borrow_mut() = Some(Box::new(f)));
    }

    fn lease_files(run: &Path) -> Vec<(String, Vec<u8>)> {
        let mut v: Vec<_> = fs::read_dir(run.join(LEASE_DIR))
            .unwrap()
            .flatten()
            .map(|e| (e.file_name().to_string_lossy().into_owned(), fs::read(e.path()).unwrap()))
            .collect();
        v.sort();
        v
    }

    /// While this thread's next write is paused, another process takes generation 2.
    fn another_takes_over_inside_next_write(run: &Path) {
        let run = run.to_path_buf();
        pause_inside_next_write(move || {
            let d = Dir::new(&run);
            let mut rec = d.read(1).unwrap().unwrap().0;
            rec.generation = 2;
            rec.holder.pid += 1;
            assert!(d.create(&rec).unwrap());
        });
    }

    fn take(run: &Path, timeout: Duration) -> Lease {
        Lease::acquire(run, &LeaseOptions { timeout, ..LeaseOptions::default() }).unwrap().0
    }

    #[test]
    fn a_temporary_names_its_writer() {
        let p = tmp_path(Path::new("/run"), "metrics.jsonl-old");
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        assert_eq!(tmp_pid(name), Some(std::process::id()));
        assert_eq!(tmp_pid(".tmp-config.toml-4242-18"), Some(4242));
        assert_eq!(tmp_pid(".tmp-17"), None);
        assert_eq!(tmp_pid("config.toml"), None);
    }

    #[test]
    fn a_heartbeat_written_while_another_took_over_is_not_published() {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path().join("run");
        // A long timeout: the heartbeat thread stays asleep, this thread renews.
        let lease = take(&run, Duration::from_secs(60));
        let shared = lease.shared.clone();
        another_takes_over_inside_next_write(&run);
        let before = fs::read(Dir::new(&run).gen_path(1)).unwrap();
        let err = shared.renew(&mut shared.lock()).unwrap_err();
        assert!(matches!(err, LeaseError::Lost { generation: 2, .. }), "{err}");
        assert_eq!(fs::read(Dir::new(&run).gen_path(1)).unwrap(), before, "generation 1 rewritten after it was superseded");
        let names: Vec<String> = lease_files(&run).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["gen-000000000001.json", "gen-000000000002.json"], "temporaries left behind");
        // Dropping the lost lease leaves generation 2 as it is.
        let gen2 = fs::read(Dir::new(&run).gen_path(2)).unwrap();
        drop(lease);
        assert_eq!(fs::read(Dir::new(&run).gen_path(2)).unwrap(), gen2);
    }

    #[test]
    fn a_heartbeat_whose_write_outlasted_the_trust_retakes_instead_of_publishing() {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path().join("run");
        // A long timeout keeps the heartbeat thread asleep; the last renewal is made to look
        // nearly as old as the trust lasts (30 s), so the write's pause outlasts it.
        let lease = take(&run, Duration::from_secs(60));
        let shared = lease.shared.clone();
        let mut st = shared.lock();
        st.renewed = Instant::now().checked_sub(Duration::from_millis(29_500)).expect("a monotonic clock 30 s past its origin");
        let before = lease_files(&run);
        pause_inside_next_write(|| std::thread::sleep(Duration::from_millis(700)));
        shared.renew(&mut st).unwrap();
        assert_eq!(st.generation, 2, "the stalled holder wins the next generation before going on");
        assert!(st.began.starts_with("re-taken by its holder after"), "{}", st.began);
        let after = lease_files(&run);
        assert_eq!(after[0], before[0], "generation 1 rewritten by a heartbeat the holder no longer trusted");
        assert_eq!(after.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["gen-000000000001.json", "gen-000000000002.json"]);
        drop(st);
        drop(lease);
    }

    #[test]
    fn a_file_written_while_another_took_over_is_not_published() {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path().join("run");
        let lease = take(&run, Duration::from_secs(60));
        let fence = lease.fence();
        fence.publish(&run.join("status.json"), b"1").unwrap();
        assert_eq!(fs::read(run.join("status.json")).unwrap(), b"1");
        another_takes_over_inside_next_write(&run);
        let err = fence.publish(&run.join("status.json"), b"2").unwrap_err();
        assert!(matches!(err, LeaseError::Lost { generation: 2, .. }), "{err}");
        assert_eq!(fs::read(run.join("status.json")).unwrap(), b"1", "published after the directory was lost");
        let names: Vec<String> = fs::read_dir(&run).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        assert!(!names.iter().any(|n| n.starts_with(".tmp-")), "temporary left behind: {names:?}");
    }

    #[test]
    fn a_release_after_a_takeover_leaves_the_new_owner_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path().join("run");
        let lease = take(&run, Duration::from_secs(60));
        another_takes_over_inside_next_write(&run);
        let before = lease_files(&run);
        lease.release().unwrap();
        assert_eq!(lease_files(&run)[0], before[0], "generation 1 marked released after generation 2 was taken");
    }
}
