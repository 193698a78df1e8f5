//! BM25 over the passages' `contents`, with tantivy (Lucene's scoring: `idf · tf·(k1+1) /
//! (tf + k1·(1 − b + b·len/avglen))`, k1 = 1.2, b = 0.75).
//!
//! Text goes through Lucene's English analysis as pyserini indexes Search-R1's corpora:
//! split on non-alphanumerics, drop tokens over 40 bytes, lowercase, drop Lucene's 33 English
//! stop words, stem (Snowball English). A query is the bag of its analysed terms, each a
//! should-clause (pyserini's default), so punctuation or words like `AND` in a question never
//! parse as query syntax.

use std::path::Path;

use tantivy::collector::TopDocs;
use tantivy::query::{BooleanQuery, Occur, Query, TermQuery};
use tantivy::schema::{Field, IndexRecordOption, NumericOptions, Schema, TextFieldIndexing, TextOptions};
use tantivy::tokenizer::{Language, LowerCaser, RemoveLongFilter, SimpleTokenizer, Stemmer, StopWordFilter, TextAnalyzer};
use tantivy::{doc, Index, IndexReader, ReloadPolicy, Term};

use crate::corpus::Passage;
use crate::{Result, RetrievalError};

/// The analyser's name in the index.
const ANALYZER: &str = "lucene_en";

/// Lucene's `EnglishAnalyzer.ENGLISH_STOP_WORDS_SET`.
pub const STOP_WORDS: [&str; 33] = [
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it", "no", "not", "of", "on", "or",
    "such", "that", "the", "their", "then", "there", "these", "they", "this", "to", "was", "will", "with",
];

fn analyzer() -> TextAnalyzer {
    TextAnalyzer::builder(SimpleTokenizer::default())
        .filter(RemoveLongFilter::limit(40))
        .filter(LowerCaser)
        .filter(StopWordFilter::remove(STOP_WORDS.iter().map(|s| s.to_string())))
        .filter(Stemmer::new(Language::English))
        .build()
}

/// The analysed terms of `text`, in order (what the index stores and a query looks up).
pub fn terms(text: &str) -> Vec<String> {
    let mut a = analyzer();
    let mut stream = a.token_stream(text);
    let mut out = Vec::new();
    while stream.advance() {
        out.push(stream.token().text.clone());
    }
    out
}

fn tantivy_err(what: &str, dir: &Path) -> impl Fn(tantivy::TantivyError) -> RetrievalError {
    let (what, dir) = (what.to_string(), dir.display().to_string());
    move |e| RetrievalError::Index(format!("{what} {dir}: {e}"))
}

fn schema() -> (Schema, Field, Field) {
    let mut b = Schema::builder();
    let text = TextOptions::default()
        .set_indexing_options(TextFieldIndexing::default().set_tokenizer(ANALYZER).set_index_option(IndexRecordOption::WithFreqs));
    let contents = b.add_text_field("contents", text);
    let row = b.add_u64_field("row", NumericOptions::default().set_fast());
    (b.build(), contents, row)
}

/// Builds a BM25 index in `dir` (created) over `passages`, in row order.
pub struct Bm25Builder {
    writer: tantivy::IndexWriter,
    contents: Field,
    row_field: Field,
    rows: u64,
    dir: std::path::PathBuf,
}

impl Bm25Builder {
    /// Starts an index in the empty directory `dir`, indexing with `threads` threads.
    pub fn create(dir: &Path, threads: usize) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| RetrievalError::Io(format!("{}: {e}", dir.display())))?;
        let (schema, contents, row_field) = schema();
        let index = Index::create_in_dir(dir, schema).map_err(tantivy_err("cannot create a BM25 index in", dir))?;
        index.tokenizers().register(ANALYZER, analyzer());
        // 64 MiB per thread at least (tantivy's floor is 15 MB): fewer, larger segments.
        let threads = threads.max(1);
        let writer = index.writer_with_num_threads(threads, (threads * 64) << 20).map_err(tantivy_err("cannot write the BM25 index in", dir))?;
        Ok(Self { writer, contents, row_field, rows: 0, dir: dir.to_path_buf() })
    }

    /// Adds the next passage (its row is the count so far).
    pub fn add(&mut self, p: &Passage) -> Result<()> {
        self.writer
            .add_document(doc!(self.contents => p.contents.as_str(), self.row_field => self.rows))
            .map_err(tantivy_err("indexing into", &self.dir))?;
        self.rows += 1;
        Ok(())
    }

    /// Commits and merges into as few segments as tantivy's merge policy gives.
    pub fn finish(mut self) -> Result<()> {
        self.writer.commit().map_err(tantivy_err("committing the BM25 index in", &self.dir))?;
        self.writer.wait_merging_threads().map_err(tantivy_err("merging the BM25 index in", &self.dir))?;
        Ok(())
    }
}

/// An open BM25 index.
pub struct Bm25Index {
    index: Index,
    reader: IndexReader,
    contents: Field,
}

/// One hit: the passage's row and its score.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hit {
    /// Row in the corpus (and the document store).
    pub row: usize,
    /// BM25 score (or inner product for dense).
    pub score: f32,
}

impl Bm25Index {
    /// Opens the index in `dir`.
    pub fn open(dir: &Path) -> Result<Self> {
        let index = Index::open_in_dir(dir).map_err(tantivy_err("cannot open the BM25 index in", dir))?;
        index.tokenizers().register(ANALYZER, analyzer());
        let contents = index.schema().get_field("contents").map_err(tantivy_err("no `contents` field in", dir))?;
        let reader = index.reader_builder().reload_policy(ReloadPolicy::Manual).try_into().map_err(tantivy_err("cannot read", dir))?;
        Ok(Self { index, reader, contents })
    }

    /// Number of indexed passages.
    pub fn len(&self) -> usize {
        self.reader.searcher().num_docs() as usize
    }

    /// Whether the index holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `k` best passages for `query`, best first (ties: lower row first). A query with
    /// no indexed term (empty, only stop words or punctuation) has no hits.
    pub fn search(&self, query: &str, k: usize) -> Result<Vec<Hit>> {
        let clauses: Vec<(Occur, Box<dyn Query>)> = terms(query)
            .into_iter()
            .map(|t| {
                let q: Box<dyn Query> = Box::new(TermQuery::new(Term::from_field_text(self.contents, &t), IndexRecordOption::WithFreqs));
                (Occur::Should, q)
            })
            .collect();
        if clauses.is_empty() || k == 0 {
            return Ok(Vec::new());
        }
        let searcher = self.reader.searcher();
        let err = |e: tantivy::TantivyError| RetrievalError::Index(format!("BM25 search: {e}"));
        let top = searcher.search(&BooleanQuery::new(clauses), &TopDocs::with_limit(k).order_by_score()).map_err(err)?;
        let mut hits = Vec::with_capacity(top.len());
        for (score, addr) in top {
            let column = searcher.segment_reader(addr.segment_ord).fast_fields().u64("row").map_err(err)?;
            let row = column.first(addr.doc_id).ok_or_else(|| RetrievalError::Index(format!("document {addr:?} has no row")))?;
            hits.push(Hit { row: row as usize, score });
        }
        hits.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.row.cmp(&b.row)));
        Ok(hits)
    }

    /// The underlying tantivy index (for statistics in tests and benches).
    pub fn tantivy(&self) -> &Index {
        &self.index
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn analysis_lowercases_drops_stop_words_and_stems() {
        assert_eq!(terms("The Cats ARE running, into the houses!"), ["cat", "run", "hous"]);
        assert_eq!(terms("What's the capital of France?"), ["what", "s", "capit", "franc"]);
        assert!(terms("the of and").is_empty());
        assert_eq!(terms("Zürich"), ["zürich"]);
    }
}
