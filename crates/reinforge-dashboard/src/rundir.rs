//! What the page shows of a run directory, read fresh at each request (the run writes the
//! files; the page never writes): `metrics.jsonl` and `samples.jsonl` rows from an offset,
//! and the run's status — its resolved `config.toml`, `placement.json`, `ranks.json`, the
//! checkpoints, and the last lines of `log.txt`.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::{json, Value};

/// Lines of `log.txt` the status carries.
pub const LOG_LINES: usize = 200;

/// Where the complete rows of the JSONL files served so far lie, so that a poll reads only
/// the bytes it returns plus what was appended since the last one — not the whole file, which
/// grows for the whole run while every open page asks for it every two seconds.
#[derive(Default)]
pub struct RowIndex {
    files: Mutex<HashMap<PathBuf, Indexed>>,
}

/// One file's complete, non-empty lines.
#[derive(Default)]
struct Indexed {
    /// The file's identity (device, inode): a file replaced by a rename is indexed afresh.
    id: (u64, u64),
    /// Bytes read so far: up to just after the last newline.
    scanned: u64,
    /// (start, length) of each line.
    lines: Vec<(u64, u64)>,
}

fn identity(m: &std::fs::Metadata) -> (u64, u64) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        (m.dev(), m.ino())
    }
    #[cfg(not(unix))]
    {
        let _ = m;
        (0, 0)
    }
}

impl RowIndex {
    /// Complete JSON rows of a JSONL file from row `since`, the count of complete rows (the
    /// next `since`) and the file's identity. A row still being written (no newline yet) is
    /// left for the next read. A resume replaces the file (rows after the checkpoint set
    /// aside): a reader whose `file` is not the current one, or whose `since` is past the end,
    /// gets `reset` and reloads from row 0.
    pub fn rows(&self, path: &Path, since: usize, known: Option<&str>) -> Value {
        let empty = json!({"rows": [], "next": 0, "reset": since > 0, "file": ""});
        let Ok(mut file) = std::fs::File::open(path) else { return empty };
        let Ok(meta) = file.metadata() else { return empty };
        let mut files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        let ix = files.entry(path.to_path_buf()).or_default();
        if ix.id != identity(&meta) || meta.len() < ix.scanned {
            *ix = Indexed { id: identity(&meta), ..Default::default() };
        }
        if meta.len() > ix.scanned {
            let mut new = Vec::new();
            if file.seek(SeekFrom::Start(ix.scanned)).is_ok() && file.by_ref().take(meta.len() - ix.scanned).read_to_end(&mut new).is_ok() {
                let mut start = 0usize;
                for (i, b) in new.iter().enumerate() {
                    if *b == b'\n' {
                        if new[start..i].iter().any(|c| !c.is_ascii_whitespace()) {
                            ix.lines.push((ix.scanned + start as u64, (i - start) as u64));
                        }
                        start = i + 1;
                    }
                }
                ix.scanned += start as u64;
            }
        }
        let total = ix.lines.len();
        let id = format!("{}-{}", ix.id.0, ix.id.1);
        if since > total || (since > 0 && known.is_some_and(|f| f != id)) {
            return json!({"rows": [], "next": 0, "reset": true, "file": id});
        }
        let wanted = &ix.lines[since..];
        let (Some(first), Some(last)) = (wanted.first(), wanted.last()) else { return json!({"rows": [], "next": total, "reset": false, "file": id}) };
        let (from, to) = (first.0, last.0 + last.1);
        let mut buf = Vec::new();
        if file.seek(SeekFrom::Start(from)).is_err() || file.take(to - from).read_to_end(&mut buf).is_err() {
            return json!({"rows": [], "next": since, "reset": false, "file": id});
        }
        let rows: Vec<Value> = wanted.iter().filter_map(|(s, n)| serde_json::from_slice(buf.get((s - from) as usize..(s - from + n) as usize)?).ok()).collect();
        json!({"rows": rows, "next": total, "reset": false, "file": id})
    }
}

fn read_json(path: &Path) -> Value {
    std::fs::read_to_string(path).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or(Value::Null)
}

/// The last `n` lines of a text file, reading only its end (it grows a line per step).
fn tail(path: &Path, n: usize) -> Vec<String> {
    const CHUNK: u64 = 64 * 1024;
    let Ok(mut f) = std::fs::File::open(path) else { return Vec::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let mut from = len;
    let mut buf = Vec::new();
    // Back a chunk at a time until the read holds n line breaks before the last line.
    while from > 0 && buf.iter().filter(|b| **b == b'\n').count() <= n {
        let start = from.saturating_sub(CHUNK);
        let mut chunk = Vec::new();
        if f.seek(SeekFrom::Start(start)).is_err() || f.by_ref().take(from - start).read_to_end(&mut chunk).is_err() {
            return Vec::new();
        }
        chunk.extend_from_slice(&buf);
        buf = chunk;
        from = start;
    }
    let text = String::from_utf8_lossy(&buf);
    let mut lines: Vec<&str> = text.lines().collect();
    if from > 0 && !lines.is_empty() {
        lines.remove(0); // cut mid-line
    }
    lines[lines.len().saturating_sub(n)..].iter().map(|s| s.to_string()).collect()
}

/// The checkpoints under `dir/checkpoints`: step, whether complete (has its manifest), and
/// which one `latest` names.
fn checkpoints(dir: &Path) -> Value {
    let root = dir.join("checkpoints");
    let latest = std::fs::read_to_string(root.join("latest")).ok().map(|s| s.trim().to_string());
    let mut out: Vec<(u64, Value)> = std::fs::read_dir(&root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let step: u64 = name.strip_prefix("global_step_")?.parse().ok()?;
            let when = e.metadata().ok().and_then(|m| m.modified().ok()).and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map(|d| d.as_secs_f64());
            let complete = e.path().join("manifest.json").is_file();
            Some((step, json!({"step": step, "name": name, "complete": complete, "latest": latest.as_deref() == Some(name.as_str()), "time": when})))
        })
        .collect();
    out.sort_by_key(|(s, _)| *s);
    Value::Array(out.into_iter().map(|(_, v)| v).collect())
}

/// Everything but the rows.
pub fn status(dir: &Path) -> Value {
    json!({
        "dir": dir.display().to_string(),
        "config": std::fs::read_to_string(dir.join("config.toml")).ok(),
        "placement": read_json(&dir.join("placement.json")),
        "ranks": read_json(&dir.join("ranks.json")),
        "checkpoints": checkpoints(dir),
        "log": tail(&dir.join("log.txt"), LOG_LINES),
    })
}

/// One run the page serves.
#[derive(Debug, Clone)]
pub struct Run {
    /// Its directory.
    pub dir: PathBuf,
    /// Its name on the page (the directory's, made unique).
    pub name: String,
}

impl Run {
    /// Runs for directories, named by their last component (with the parent where two share one).
    pub fn from_dirs(dirs: &[PathBuf]) -> Vec<Run> {
        let base = |d: &Path| d.file_name().map_or_else(|| d.display().to_string(), |n| n.to_string_lossy().into_owned());
        dirs.iter()
            .map(|d| {
                let mut name = base(d);
                if dirs.iter().filter(|o| base(o) == name).count() > 1 {
                    name = d.display().to_string();
                }
                Run { dir: d.clone(), name }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn rows_come_from_an_offset_and_a_half_written_row_waits() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("metrics.jsonl");
        let ix = RowIndex::default();
        let rows = |since, file: Option<&str>| {
            let mut v = ix.rows(&p, since, file);
            let id = v.as_object_mut().unwrap().remove("file").unwrap();
            (v, id.as_str().unwrap().to_string())
        };
        std::fs::write(&p, "{\"step\":1}\n\n{\"step\":2}\n{\"step\":3").unwrap();
        let (v, id) = rows(0, None);
        assert_eq!(v, json!({"rows": [{"step": 1}, {"step": 2}], "next": 2, "reset": false}));
        assert_eq!(rows(1, Some(&id)).0["rows"], json!([{"step": 2}]));
        // The half-written row completes, and another arrives: only the new bytes are read.
        std::fs::OpenOptions::new().append(true).open(&p).unwrap().write_all(b",\"x\":1}\n{\"step\":4}\n").unwrap();
        assert_eq!(rows(2, Some(&id)).0, json!({"rows": [{"step": 3, "x": 1}, {"step": 4}], "next": 4, "reset": false}));
        assert_eq!(rows(4, Some(&id)).0, json!({"rows": [], "next": 4, "reset": false}));
        // A resume replaces the file (rows after the checkpoint set aside) and goes on: every
        // reader of the old file reloads, even one whose `since` the new file has passed.
        let tmp = dir.path().join("m.tmp");
        std::fs::write(&tmp, "{\"step\":1}\n{\"step\":2}\n{\"step\":3}\n{\"step\":4}\n{\"step\":5}\n").unwrap();
        std::fs::rename(&tmp, &p).unwrap();
        let (v, id2) = rows(4, Some(&id));
        assert_eq!(v, json!({"rows": [], "next": 0, "reset": true}), "a resume replaced the file");
        assert_ne!(id, id2);
        assert_eq!(rows(0, Some(&id2)).0["next"], 5);
        assert_eq!(rows(9, Some(&id2)).0["reset"], true, "past the end");
        assert_eq!(ix.rows(&dir.path().join("none.jsonl"), 0, None), json!({"rows": [], "next": 0, "reset": false, "file": ""}));
    }

    #[test]
    fn the_log_tail_reads_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log.txt");
        let text: String = (0..20_000).map(|i| format!("line {i} {}\n", "x".repeat(i % 50))).collect();
        std::fs::write(&p, text).unwrap();
        let t = tail(&p, 200);
        assert_eq!(t.len(), 200);
        assert!(t[0].starts_with("line 19800 ") && t[199].starts_with("line 19999 "), "{:?}", &t[..2]);
        std::fs::write(&p, "a\nb").unwrap();
        assert_eq!(tail(&p, 200), ["a", "b"]);
        assert!(tail(&dir.path().join("none"), 5).is_empty());
    }

    #[test]
    fn runs_are_named_by_their_directories() {
        let r = Run::from_dirs(&["runs/a".into(), "other/a".into(), "runs/b".into()]);
        assert_eq!(r.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["runs/a", "other/a", "b"]);
    }
}
