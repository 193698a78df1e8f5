//! An index directory: the passages (`docs.jsonl` + offsets), a BM25 index (`bm25/`) and,
//! when asked for, a dense one (`dense/`), described by `meta.json`. It is built in a temporary
//! directory beside the target and renamed into place when complete, so a directory that
//! exists is a whole index.

use std::path::{Path, PathBuf};
use std::time::Instant;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::bm25::{Bm25Builder, Bm25Index, Hit};
use crate::corpus::{for_each_passage, DocStore, DocStoreWriter, Passage};
use crate::dense::{DenseBuilder, DenseIndex, DenseMeta};
use crate::{Result, RetrievalError};

/// How to build an index.
#[derive(Debug, Clone, Default)]
pub struct IndexOptions {
    /// Also embed every passage with this BERT-family encoder (a model directory).
    pub dense_model: Option<PathBuf>,
    /// Query and passage prefixes for the encoder (default: by its name, as Search-R1's).
    pub prefixes: Option<(String, String)>,
    /// Tokens kept per text by the encoder (default: its `max_seq_length`).
    pub max_len: Option<usize>,
    /// Indexing threads for BM25.
    pub threads: usize,
    /// Replace an existing index directory.
    pub force: bool,
}

/// `meta.json` of an index directory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IndexMeta {
    /// Layout version of this directory.
    pub format: u32,
    /// Passages indexed.
    pub passages: usize,
    /// The corpus it was built from.
    pub corpus: PathBuf,
    /// The dense index, if built.
    pub dense: Option<DenseMeta>,
}

const FORMAT: u32 = 1;

/// Builds an index of `corpus` in `out`; returns what it wrote. Progress goes to `log`.
pub fn build(corpus: &Path, out: &Path, opts: &IndexOptions, log: &dyn Fn(&str)) -> Result<IndexMeta> {
    if out.exists() && !opts.force {
        return Err(RetrievalError::Index(format!("{} already exists: choose another --out, or pass --force to replace it", out.display())));
    }
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| RetrievalError::Io(format!("{}: {e}", parent.display())))?;
    let name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "index".into());
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    // Whatever happens below, a half-built index is removed rather than left looking valid.
    struct Cleanup<'a>(&'a Path, bool);
    impl Drop for Cleanup<'_> {
        fn drop(&mut self) {
            if !self.1 {
                let _ = std::fs::remove_dir_all(self.0);
            }
        }
    }
    let mut guard = Cleanup(&tmp, false);
    std::fs::create_dir_all(&tmp).map_err(|e| RetrievalError::Io(format!("{}: {e}", tmp.display())))?;

    let t0 = Instant::now();
    let mut docs = DocStoreWriter::create(&tmp)?;
    let mut bm25 = Bm25Builder::create(&tmp.join("bm25"), opts.threads)?;
    let mut dense = match &opts.dense_model {
        Some(m) => Some(DenseBuilder::create(&tmp, m, opts.prefixes.clone(), opts.max_len)?),
        None => None,
    };
    let n = for_each_passage(corpus, |p| {
        docs.push(&p)?;
        bm25.add(&p)?;
        if let Some(d) = dense.as_mut() {
            d.add(&p.contents)?;
        }
        Ok(())
    })
    .inspect(|&n| log(&format!("read {n} passages from {} in {:.1}s", corpus.display(), t0.elapsed().as_secs_f64())))?;
    if n == 0 {
        return Err(RetrievalError::Corpus(format!("{}: no passages", corpus.display())));
    }
    docs.finish()?;
    bm25.finish()?;
    let dense = dense.map(DenseBuilder::finish).transpose()?;
    let meta = IndexMeta {
        format: FORMAT,
        passages: n,
        corpus: std::path::absolute(corpus).unwrap_or_else(|_| corpus.to_path_buf()),
        dense,
    };
    let json = serde_json::to_vec_pretty(&meta).map_err(|e| RetrievalError::Io(e.to_string()))?;
    std::fs::write(tmp.join("meta.json"), json).map_err(|e| RetrievalError::Io(format!("{}: {e}", tmp.display())))?;
    if out.exists() {
        std::fs::remove_dir_all(out).map_err(|e| RetrievalError::Io(format!("replacing {}: {e}", out.display())))?;
    }
    std::fs::rename(&tmp, out).map_err(|e| RetrievalError::Io(format!("{} → {}: {e}", tmp.display(), out.display())))?;
    guard.1 = true;
    log(&format!("index of {n} passages written to {} in {:.1}s", out.display(), t0.elapsed().as_secs_f64()));
    Ok(meta)
}

/// Which index answers queries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RetrieverKind {
    /// BM25 (Search-R1's `--retriever_name bm25`).
    Bm25,
    /// The dense index (Search-R1's default, e5).
    Dense,
}

impl std::str::FromStr for RetrieverKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "bm25" => Ok(Self::Bm25),
            "dense" | "e5" => Ok(Self::Dense),
            other => Err(format!("unknown retriever `{other}`: use bm25 or dense")),
        }
    }
}

impl std::fmt::Display for RetrieverKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Bm25 => "bm25",
            Self::Dense => "dense",
        })
    }
}

enum Engine {
    Bm25(Bm25Index),
    Dense(Box<DenseIndex>),
}

/// An open index answering queries: the passages and one of its retrievers.
pub struct Retriever {
    docs: DocStore,
    engine: Engine,
    kind: RetrieverKind,
    dir: PathBuf,
}

impl Retriever {
    /// Opens index directory `dir` with retriever `kind`.
    pub fn open(dir: &Path, kind: RetrieverKind) -> Result<Self> {
        let meta_path = dir.join("meta.json");
        let meta: IndexMeta = serde_json::from_slice(&std::fs::read(&meta_path).map_err(|e| {
            RetrievalError::Index(format!("{}: {e} (build an index with `reinforge retrieval index --corpus corpus.jsonl --out DIR`)", meta_path.display()))
        })?)
        .map_err(|e| RetrievalError::Index(format!("{}: {e}", meta_path.display())))?;
        if meta.format != FORMAT {
            return Err(RetrievalError::Index(format!("{}: index format {} (this build reads {FORMAT}); build it again", dir.display(), meta.format)));
        }
        let docs = DocStore::open(dir)?;
        let engine = match kind {
            RetrieverKind::Bm25 => Engine::Bm25(Bm25Index::open(&dir.join("bm25"))?),
            RetrieverKind::Dense if meta.dense.is_none() => {
                return Err(RetrievalError::Index(format!(
                    "{} has no dense index: build it with `reinforge retrieval index --corpus … --out {} --dense-model MODEL_DIR --force`, or serve --retriever bm25",
                    dir.display(),
                    dir.display()
                )))
            }
            RetrieverKind::Dense => Engine::Dense(Box::new(DenseIndex::open(dir)?)),
        };
        let n = match &engine {
            Engine::Bm25(b) => b.len(),
            Engine::Dense(d) => d.len(),
        };
        if n != docs.len() {
            return Err(RetrievalError::Index(format!("{}: the {kind} index has {n} passages, the store {}; build it again", dir.display(), docs.len())));
        }
        Ok(Self { docs, engine, kind, dir: dir.to_path_buf() })
    }

    /// Number of passages.
    pub fn len(&self) -> usize {
        self.docs.len()
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.docs.is_empty()
    }

    /// Which retriever answers.
    pub fn kind(&self) -> RetrieverKind {
        self.kind
    }

    /// The index directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The `k` best passages for each query, with scores, in query order.
    pub fn retrieve(&self, queries: &[String], k: usize) -> Result<Vec<Vec<(Passage, f32)>>> {
        let hits: Vec<Vec<Hit>> = match &self.engine {
            // Queries of one request in parallel: tantivy's searcher is shared and read-only
            // (one query is searched here: a pool hand-off costs more than the search).
            Engine::Bm25(b) if queries.len() == 1 => vec![b.search(&queries[0], k)?],
            Engine::Bm25(b) => queries.par_iter().map(|q| b.search(q, k)).collect::<Result<_>>()?,
            Engine::Dense(d) => {
                let refs: Vec<&str> = queries.iter().map(String::as_str).collect();
                d.search(&refs, k)?
            }
        };
        hits.into_iter().map(|hs| hs.into_iter().map(|h| Ok((self.docs.get(h.row)?, h.score))).collect()).collect()
    }
}
