//! Dense retrieval as Search-R1's default retriever does it: passages and queries embedded by
//! a BERT-family encoder (mean pooling, L2-normalised), and an exact inner-product search
//! over every passage (FAISS `Flat`, `METRIC_INNER_PRODUCT`).
//!
//! The embeddings are `dense/embeddings.f32` (little-endian f32, `[passages, dim]` row-major,
//! memory-mapped) beside `dense/meta.json` (the model, its width, the prefixes). Queries are
//! scored in one matrix product per request, with burn's GEMM.

use std::io::Write;
use std::path::{Path, PathBuf};

use burn::tensor::{Tensor, TensorData};
use reinforge_engine::TextEncoder;
use serde::{Deserialize, Serialize};

use crate::bm25::Hit;
use crate::{Result, RetrievalError};

/// What `dense/meta.json` records.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DenseMeta {
    /// The encoder's directory (absolute), loaded again to embed queries.
    pub model: PathBuf,
    /// Embedding width.
    pub dim: usize,
    /// Passages embedded.
    pub passages: usize,
    /// Put before each query (e5: `query: `).
    pub query_prefix: String,
    /// Put before each passage (e5: `passage: `).
    pub passage_prefix: String,
    /// Tokens kept per text.
    pub max_len: usize,
}

/// The prefixes Search-R1's encoder uses for a model, by its name: e5 wants `query: ` and
/// `passage: `, bge an instruction before queries, others nothing.
pub fn default_prefixes(model: &Path) -> (String, String) {
    let name = model.to_string_lossy().to_lowercase();
    if name.contains("e5") {
        ("query: ".into(), "passage: ".into())
    } else if name.contains("bge") {
        ("Represent this sentence for searching relevant passages: ".into(), String::new())
    } else {
        (String::new(), String::new())
    }
}

const EMBEDDINGS: &str = "embeddings.f32";
const META: &str = "meta.json";
/// Passages embedded per forward pass while indexing.
const BATCH: usize = 32;

/// Writes `dir/dense/` while an index is built.
pub(crate) struct DenseBuilder {
    encoder: TextEncoder,
    meta: DenseMeta,
    out: std::io::BufWriter<std::fs::File>,
    pending: Vec<String>,
    dir: PathBuf,
}

impl DenseBuilder {
    pub(crate) fn create(dir: &Path, model: &Path, prefixes: Option<(String, String)>, max_len: Option<usize>) -> Result<Self> {
        let model = std::path::absolute(model).unwrap_or_else(|_| model.to_path_buf());
        let mut encoder = TextEncoder::load(&model).map_err(|e| RetrievalError::Encoder(format!("dense encoder: {e}")))?;
        if let Some(n) = max_len {
            encoder.set_max_len(n);
        }
        let (query_prefix, passage_prefix) = prefixes.unwrap_or_else(|| default_prefixes(&model));
        let dir = dir.join("dense");
        std::fs::create_dir_all(&dir).map_err(|e| RetrievalError::Io(format!("{}: {e}", dir.display())))?;
        let f = std::fs::File::create(dir.join(EMBEDDINGS)).map_err(|e| RetrievalError::Io(format!("{}: {e}", dir.join(EMBEDDINGS).display())))?;
        let meta = DenseMeta { model, dim: encoder.dim(), passages: 0, query_prefix, passage_prefix, max_len: encoder.max_len() };
        Ok(Self { encoder, meta, out: std::io::BufWriter::new(f), pending: Vec::with_capacity(BATCH), dir })
    }

    pub(crate) fn add(&mut self, contents: &str) -> Result<()> {
        self.pending.push(format!("{}{contents}", self.meta.passage_prefix));
        if self.pending.len() == BATCH {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let texts: Vec<&str> = self.pending.iter().map(String::as_str).collect();
        let embs = self.encoder.encode(&texts).map_err(|e| RetrievalError::Encoder(format!("embedding passages: {e}")))?;
        for e in embs {
            let bytes: Vec<u8> = e.iter().flat_map(|x| x.to_le_bytes()).collect();
            self.out.write_all(&bytes).map_err(|e| RetrievalError::Io(format!("{}: {e}", self.dir.display())))?;
        }
        self.meta.passages += self.pending.len();
        self.pending.clear();
        Ok(())
    }

    pub(crate) fn finish(mut self) -> Result<DenseMeta> {
        self.flush()?;
        self.out.flush().map_err(|e| RetrievalError::Io(format!("{}: {e}", self.dir.display())))?;
        let json = serde_json::to_vec_pretty(&self.meta).map_err(|e| RetrievalError::Io(e.to_string()))?;
        std::fs::write(self.dir.join(META), json).map_err(|e| RetrievalError::Io(format!("{}: {e}", self.dir.display())))?;
        Ok(self.meta)
    }
}

/// An open dense index: the encoder and the passage embeddings.
pub struct DenseIndex {
    encoder: TextEncoder,
    meta: DenseMeta,
    /// `[passages, dim]`, transposed once at open for the product `queries · Eᵀ`.
    embeddings_t: Tensor<2>,
}

impl DenseIndex {
    /// Opens `dir/dense/`.
    pub fn open(dir: &Path) -> Result<Self> {
        let d = dir.join("dense");
        let meta: DenseMeta = serde_json::from_slice(
            &std::fs::read(d.join(META)).map_err(|e| RetrievalError::Index(format!("{}: {e} (no dense index: build one with --dense-model)", d.join(META).display())))?,
        )
        .map_err(|e| RetrievalError::Index(format!("{}: {e}", d.join(META).display())))?;
        let mut encoder = TextEncoder::load(&meta.model)
            .map_err(|e| RetrievalError::Encoder(format!("the dense index's encoder {}: {e}", meta.model.display())))?;
        encoder.set_max_len(meta.max_len);
        let bytes = std::fs::read(d.join(EMBEDDINGS)).map_err(|e| RetrievalError::Index(format!("{}: {e}", d.join(EMBEDDINGS).display())))?;
        if bytes.len() != meta.passages * meta.dim * 4 || encoder.dim() != meta.dim {
            return Err(RetrievalError::Index(format!(
                "{}: {} bytes for {} passages × {} dims (encoder: {}); build the index again",
                d.display(),
                bytes.len(),
                meta.passages,
                meta.dim,
                encoder.dim()
            )));
        }
        let data: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let device = burn::tensor::Device::default();
        let embeddings_t = Tensor::<2>::from_data(TensorData::new(data, [meta.passages, meta.dim]), &device).transpose();
        Ok(Self { encoder, meta, embeddings_t })
    }

    /// Number of passages.
    pub fn len(&self) -> usize {
        self.meta.passages
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.meta.passages == 0
    }

    /// What the index was built with.
    pub fn meta(&self) -> &DenseMeta {
        &self.meta
    }

    /// The `k` passages with the largest inner product for each query, best first.
    pub fn search(&self, queries: &[&str], k: usize) -> Result<Vec<Vec<Hit>>> {
        if queries.is_empty() || self.is_empty() {
            return Ok(vec![Vec::new(); queries.len()]);
        }
        let texts: Vec<String> = queries.iter().map(|q| format!("{}{q}", self.meta.query_prefix)).collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let embs = self.encoder.encode(&refs).map_err(|e| RetrievalError::Encoder(format!("embedding queries: {e}")))?;
        let q = Tensor::<2>::from_data(TensorData::new(embs.concat(), [queries.len(), self.meta.dim]), &self.embeddings_t.device());
        let scores: Vec<f32> = q
            .matmul(self.embeddings_t.clone())
            .into_data()
            .try_into_vec()
            .map_err(|e| RetrievalError::Index(format!("dense scores: {e:?}")))?;
        Ok(scores.chunks(self.meta.passages).map(|row| top_k(row, k)).collect())
    }
}

/// The `k` largest entries of `scores`, best first (ties: lower row first).
pub fn top_k(scores: &[f32], k: usize) -> Vec<Hit> {
    let k = k.min(scores.len());
    if k == 0 {
        return Vec::new();
    }
    let better = |a: &usize, b: &usize| scores[*b].total_cmp(&scores[*a]).then(a.cmp(b));
    let mut rows: Vec<usize> = (0..scores.len()).collect();
    if k < rows.len() {
        rows.select_nth_unstable_by(k - 1, better);
        rows.truncate(k);
    }
    rows.sort_by(better);
    rows.into_iter().map(|row| Hit { row, score: scores[row] }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_is_the_best_k_in_order() {
        let s = [0.1, 0.9, -1.0, 0.9, 0.5];
        let rows: Vec<usize> = top_k(&s, 3).iter().map(|h| h.row).collect();
        assert_eq!(rows, [1, 3, 4]);
        assert_eq!(top_k(&s, 10).len(), 5);
        assert!(top_k(&s, 0).is_empty());
    }

    #[test]
    fn prefixes_follow_the_model_name() {
        assert_eq!(default_prefixes(Path::new("/m/intfloat/e5-base-v2")).0, "query: ");
        assert_eq!(default_prefixes(Path::new("/m/all-minilm-l6-v2")), (String::new(), String::new()));
    }
}
