//! The corpus: Search-R1's JSONL (`{"id": "0", "contents": "\"Title\"\ntext"}` per line,
//! optionally gzipped), and the document store an index keeps beside it so a hit is returned
//! as the corpus row it came from.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Result, RetrievalError};

/// One passage: the corpus row as Search-R1's server returns it (`id`, `contents`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Passage {
    /// The corpus id (a string, as in Search-R1's corpora; numbers are written out).
    pub id: String,
    /// `"Title"\ntext`: the title line keeps its quotes, as Search-R1's corpora do.
    pub contents: String,
}

impl Passage {
    /// The title line (quotes kept, as Search-R1 shows it in `Doc 1(Title: "…")`).
    pub fn title(&self) -> &str {
        self.contents.split('\n').next().unwrap_or_default()
    }

    /// Everything after the title line.
    pub fn text(&self) -> &str {
        self.contents.split_once('\n').map_or("", |(_, t)| t)
    }
}

/// A corpus row as written: `id` may be a number, and `title` + `text` are accepted for
/// corpora that keep them apart (they become `"title"\ntext`).
#[derive(Deserialize)]
struct RawRow {
    id: serde_json::Value,
    contents: Option<String>,
    title: Option<String>,
    text: Option<String>,
}

fn bad(path: &Path, line: usize, why: impl std::fmt::Display) -> RetrievalError {
    RetrievalError::Corpus(format!(
        "{}: line {line}: {why} (each line is a JSON object with \"id\" and \"contents\", as Search-R1's corpora)",
        path.display()
    ))
}

fn parse_row(path: &Path, line: usize, text: &str) -> Result<Passage> {
    let raw: RawRow = serde_json::from_str(text).map_err(|e| bad(path, line, e))?;
    let id = match raw.id {
        serde_json::Value::String(s) => s,
        serde_json::Value::Number(n) => n.to_string(),
        other => return Err(bad(path, line, format!("\"id\" must be a string or a number, got {other}"))),
    };
    let contents = match (raw.contents, raw.title, raw.text) {
        (Some(c), _, _) => c,
        (None, Some(t), Some(x)) => format!("\"{t}\"\n{x}"),
        _ => return Err(bad(path, line, "no \"contents\" (nor \"title\" and \"text\")")),
    };
    Ok(Passage { id, contents })
}

/// Opens a corpus file, gunzipping when it ends in `.gz` (or starts with gzip's magic).
fn open_lines(path: &Path) -> Result<Box<dyn BufRead>> {
    let mut f = File::open(path).map_err(|e| RetrievalError::Corpus(format!("cannot read corpus {}: {e}", path.display())))?;
    let mut magic = [0u8; 2];
    let n = f.read(&mut magic).map_err(|e| RetrievalError::Corpus(format!("{}: {e}", path.display())))?;
    let f = File::open(path).map_err(|e| RetrievalError::Corpus(format!("{}: {e}", path.display())))?;
    let gz = path.extension().is_some_and(|e| e == "gz") || (n == 2 && magic == [0x1f, 0x8b]);
    Ok(if gz { Box::new(BufReader::new(flate2::read::MultiGzDecoder::new(f))) } else { Box::new(BufReader::new(f)) })
}

/// Calls `each` on every passage of a JSONL (or JSONL.gz) corpus, in order. Blank lines are
/// skipped; a malformed line is an error naming its number.
pub fn for_each_passage(path: &Path, mut each: impl FnMut(Passage) -> Result<()>) -> Result<usize> {
    let reader = open_lines(path)?;
    let mut count = 0;
    for (i, line) in reader.lines().enumerate() {
        let line = line.map_err(|e| bad(path, i + 1, format!("unreadable ({e})")))?;
        if line.trim().is_empty() {
            continue;
        }
        each(parse_row(path, i + 1, &line)?)?;
        count += 1;
    }
    Ok(count)
}

/// Reads a whole corpus into memory.
pub fn read_corpus(path: &Path) -> Result<Vec<Passage>> {
    let mut out = Vec::new();
    for_each_passage(path, |p| {
        out.push(p);
        Ok(())
    })?;
    Ok(out)
}

/// The passages of an index, by row: `docs.jsonl` (one normalised row per line) and
/// `docs.offsets` (little-endian u64 start of each line, and the end), both memory-mapped so
/// a large corpus is not held in memory.
pub struct DocStore {
    docs: memmap2::Mmap,
    offsets: memmap2::Mmap,
    len: usize,
}

/// File names inside an index directory.
pub(crate) const DOCS: &str = "docs.jsonl";
pub(crate) const OFFSETS: &str = "docs.offsets";

/// Writes the document store while an index is built.
pub(crate) struct DocStoreWriter {
    docs: BufWriter<File>,
    offsets: BufWriter<File>,
    at: u64,
    dir: PathBuf,
}

impl DocStoreWriter {
    pub(crate) fn create(dir: &Path) -> Result<Self> {
        let open = |name: &str| {
            File::create(dir.join(name)).map(BufWriter::new).map_err(|e| RetrievalError::Io(format!("{}: {e}", dir.join(name).display())))
        };
        let mut w = Self { docs: open(DOCS)?, offsets: open(OFFSETS)?, at: 0, dir: dir.to_path_buf() };
        w.offsets.write_all(&0u64.to_le_bytes()).map_err(|e| w.io(e))?;
        Ok(w)
    }

    fn io(&self, e: std::io::Error) -> RetrievalError {
        RetrievalError::Io(format!("writing the document store in {}: {e}", self.dir.display()))
    }

    /// Appends a passage; returns its row.
    pub(crate) fn push(&mut self, p: &Passage) -> Result<()> {
        let mut line = serde_json::to_vec(p).map_err(|e| RetrievalError::Io(e.to_string()))?;
        line.push(b'\n');
        self.docs.write_all(&line).map_err(|e| self.io(e))?;
        self.at += line.len() as u64;
        self.offsets.write_all(&self.at.to_le_bytes()).map_err(|e| self.io(e))?;
        Ok(())
    }

    pub(crate) fn finish(mut self) -> Result<()> {
        self.docs.flush().map_err(|e| self.io(e))?;
        self.offsets.flush().map_err(|e| self.io(e))?;
        Ok(())
    }
}

impl DocStore {
    /// Opens the store of index directory `dir`.
    pub fn open(dir: &Path) -> Result<Self> {
        let map = |name: &str| -> Result<memmap2::Mmap> {
            let path = dir.join(name);
            let f = File::open(&path).map_err(|e| RetrievalError::Index(format!("{}: {e}", path.display())))?;
            // SAFETY: the index directory is ours and read-only once built; a file changed
            // under a running server is outside what it supports (it is documented).
            unsafe { memmap2::Mmap::map(&f) }.map_err(|e| RetrievalError::Index(format!("{}: {e}", path.display())))
        };
        let (docs, offsets) = (map(DOCS)?, map(OFFSETS)?);
        if offsets.len() < 8 || offsets.len() % 8 != 0 {
            return Err(RetrievalError::Index(format!("{}: {OFFSETS} is damaged; build the index again", dir.display())));
        }
        let len = offsets.len() / 8 - 1;
        let s = Self { docs, offsets, len };
        if s.offset(len) as usize != s.docs.len() {
            return Err(RetrievalError::Index(format!("{}: {DOCS} and {OFFSETS} disagree; build the index again", dir.display())));
        }
        Ok(s)
    }

    fn offset(&self, i: usize) -> u64 {
        let b = &self.offsets[i * 8..i * 8 + 8];
        u64::from_le_bytes(b.try_into().unwrap_or([0; 8]))
    }

    /// Number of passages.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The passage at `row`.
    pub fn get(&self, row: usize) -> Result<Passage> {
        if row >= self.len {
            return Err(RetrievalError::Index(format!("row {row} is past the {} passages", self.len)));
        }
        let (a, b) = (self.offset(row) as usize, self.offset(row + 1) as usize);
        serde_json::from_slice(&self.docs[a..b]).map_err(|e| RetrievalError::Index(format!("passage {row}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_parse_like_search_r1_corpora() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.jsonl");
        std::fs::write(
            &p,
            "{\"id\": \"0\", \"contents\": \"\\\"Evan Morris\\\"\\nEvan L. Morris was a lobbyist.\"}\n\n{\"id\": 7, \"title\": \"T\", \"text\": \"x y\"}\n",
        )
        .unwrap();
        let c = read_corpus(&p).unwrap();
        assert_eq!(c[0].id, "0");
        assert_eq!(c[0].title(), "\"Evan Morris\"");
        assert_eq!(c[0].text(), "Evan L. Morris was a lobbyist.");
        assert_eq!(c[1], Passage { id: "7".into(), contents: "\"T\"\nx y".into() });

        std::fs::write(&p, "{\"id\": \"0\", \"contents\": \"a\"}\n{\"id\": \"1\"}\n").unwrap();
        let e = read_corpus(&p).unwrap_err().to_string();
        assert!(e.contains("c.jsonl: line 2: no \"contents\""), "{e}");
    }

    #[test]
    fn gzip_corpora_read_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.jsonl.gz");
        let mut gz = flate2::write::GzEncoder::new(File::create(&p).unwrap(), flate2::Compression::fast());
        gz.write_all(b"{\"id\": \"a\", \"contents\": \"\\\"A\\\"\\nalpha\"}\n").unwrap();
        gz.finish().unwrap();
        assert_eq!(read_corpus(&p).unwrap(), vec![Passage { id: "a".into(), contents: "\"A\"\nalpha".into() }]);
    }

    #[test]
    fn the_store_returns_each_row_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let rows: Vec<Passage> = (0..5).map(|i| Passage { id: format!("{i}"), contents: format!("\"T{i}\"\nüñí {i}\n2nd line") }).collect();
        let mut w = DocStoreWriter::create(dir.path()).unwrap();
        for r in &rows {
            w.push(r).unwrap();
        }
        w.finish().unwrap();
        let s = DocStore::open(dir.path()).unwrap();
        assert_eq!(s.len(), 5);
        for (i, r) in rows.iter().enumerate() {
            assert_eq!(&s.get(i).unwrap(), r);
        }
        assert!(s.get(5).is_err());
    }
}
