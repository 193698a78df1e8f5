//! Filesystem helpers: fsync of files and directories, streaming SHA-256, file-name checks,
//! temporary names and deciding whether a temporary left by another writer is stale.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use crate::error::{io_err, CheckpointError, Result};
use crate::manifest::MANIFEST_FILE;

/// Prefix of every temporary entry this crate makes in a checkpoint root. Names starting with
/// `.` are skipped by the `global_step_*` scan, so a temporary is never mistaken for a checkpoint.
pub(crate) const TMP_PREFIX: &str = ".tmp-";

/// A temporary from a writer whose liveness cannot be checked (no `/proc`) is stale after this long.
#[cfg(not(target_os = "linux"))]
const STALE_AFTER_SECS: u64 = 24 * 3600;

/// Slack when comparing a temporary's creation time with its writer's start time: `/proc/stat`'s
/// boot time has one-second resolution and can drift with clock adjustments.
#[cfg(target_os = "linux")]
const START_TIME_SLACK_SECS: f64 = 5.0;

/// Nanoseconds since the Unix epoch (0 if the clock is before 1970).
pub(crate) fn unix_nanos() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

/// `.tmp-<label>-<pid>-<nanos>`: pid and time let a later writer decide whether it is stale.
pub(crate) fn tmp_name(label: &str) -> String {
    format!("{TMP_PREFIX}{label}-{}-{}", std::process::id(), unix_nanos())
}

/// fsync a directory so that the entries created or renamed in it survive a power cut.
pub(crate) fn fsync_dir(path: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        File::open(path).and_then(|f| f.sync_all()).map_err(io_err("fsync directory", path))
    }
    #[cfg(not(unix))]
    {
        // Windows cannot open a directory as a file to flush it; NTFS journals its metadata.
        let _ = path;
        Ok(())
    }
}

/// fsync a regular file that someone else wrote (a caller's callback).
pub(crate) fn fsync_file(path: &Path) -> Result<()> {
    // POSIX allows fsync on a read-only descriptor; Windows needs write access to flush.
    let mut opts = fs::OpenOptions::new();
    opts.read(true);
    #[cfg(not(unix))]
    opts.write(true);
    opts.open(path).and_then(|f| f.sync_all()).map_err(io_err("fsync", path))
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// Size and hex SHA-256 of a file, streamed so that multi-gigabyte weights use 1 MiB of memory.
pub(crate) fn hash_file(path: &Path) -> Result<(u64, String)> {
    let mut f = File::open(path).map_err(io_err("open", path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_err("read", path)(e)),
        };
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((size, hex(&hasher.finalize())))
}

/// A writer that hashes and counts exactly the bytes that reach the inner writer.
pub(crate) struct HashingWriter<W> {
    pub(crate) inner: W,
    pub(crate) hasher: Sha256,
    pub(crate) size: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Checks that `name` is a safe relative `/`-separated path inside a checkpoint.
pub(crate) fn validate_name(name: &str) -> Result<()> {
    let bad = |reason| Err(CheckpointError::BadName { name: name.to_string(), reason });
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.starts_with('/') {
        return bad("it is absolute");
    }
    if name.contains('\\') || name.contains(':') || name.contains('\0') {
        return bad("it contains `\\`, `:` or NUL, which are not portable");
    }
    for component in name.split('/') {
        if component.is_empty() {
            return bad("it has an empty component (`//` or a trailing `/`)");
        }
        if component == "." || component == ".." {
            return bad("it has a `.` or `..` component");
        }
    }
    if name == MANIFEST_FILE {
        return bad("manifest.json is reserved for the checkpoint's own manifest");
    }
    Ok(())
}

/// Parses `.tmp-<label>-<pid>-<nanos>` into `(pid, nanos)`.
pub(crate) fn parse_tmp_name(name: &str) -> Option<(u32, u128)> {
    let rest = name.strip_prefix(TMP_PREFIX)?;
    let mut parts = rest.rsplitn(3, '-');
    let nanos = parts.next()?.parse().ok()?;
    let pid = parts.next()?.parse().ok()?;
    let label = parts.next()?;
    (!label.is_empty()).then_some((pid, nanos))
}

/// Whether the temporary created at `created_nanos` by process `pid` belongs to a writer that is
/// gone: the pid is not running, is a zombie, or is running but started after the temporary
/// was made (the pid was reused, including by this very process).
#[cfg(target_os = "linux")]
pub(crate) fn tmp_is_stale(pid: u32, created_nanos: u128) -> bool {
    let Some(state) = reinforge_lease::process_state(pid) else {
        return true; // no such process
    };
    if state.zombie {
        return true; // killed, not yet reaped
    }
    let (Some(start_ticks), Some(boot_secs)) = (state.start_ticks, reinforge_lease::boot_time_secs()) else {
        return false;
    };
    // proc(5) reports start time in USER_HZ ticks, which the kernel ABI fixes at 100 per second.
    let started = boot_secs as f64 + start_ticks as f64 / 100.0;
    let created = created_nanos as f64 / 1e9;
    created + START_TIME_SLACK_SECS < started
}

/// Without `/proc`, liveness cannot be checked without unsafe FFI, so a temporary is stale
/// only when it is older than a day (no save takes that long).
#[cfg(not(target_os = "linux"))]
pub(crate) fn tmp_is_stale(_pid: u32, created_nanos: u128) -> bool {
    let age_secs = unix_nanos().saturating_sub(created_nanos) / 1_000_000_000;
    age_secs > STALE_AFTER_SECS as u128
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(validate_name("actor/model.safetensors").is_ok());
        assert!(validate_name("trainer_state.json").is_ok());
        for bad in ["", "/abs", "a//b", "a/", "../x", "a/./b", "manifest.json", "c:\\x"] {
            assert!(validate_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn tmp_names_round_trip() {
        let n = tmp_name("global_step_3");
        let (pid, nanos) = parse_tmp_name(&n).expect("parses");
        assert_eq!(pid, std::process::id());
        assert!(nanos > 0);
        assert_eq!(parse_tmp_name(".tmp-latest-12-34"), Some((12, 34)));
        assert_eq!(parse_tmp_name(".tmp-12-34"), None);
        assert_eq!(parse_tmp_name("global_step_1"), None);
    }

    #[test]
    fn own_fresh_tmp_is_not_stale() {
        assert!(!tmp_is_stale(std::process::id(), unix_nanos()));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn own_pid_before_start_is_stale() {
        // A temporary "made" in 1970 by our pid predates this process: the pid was reused.
        assert!(tmp_is_stale(std::process::id(), 1));
    }

    #[test]
    fn hex_and_hash() {
        assert_eq!(hex(&[0x00, 0xab, 0xff]), "00abff");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        fs::write(&p, b"abc").unwrap();
        let (size, h) = hash_file(&p).unwrap();
        assert_eq!(size, 3);
        assert_eq!(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
