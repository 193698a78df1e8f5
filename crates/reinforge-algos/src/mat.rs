//! Small dense f64 containers: [`Mat`] for `(B, T)` data and [`Logits`] for `(B, T, V)`.
//!
//! They exist so the reference implementations are plain, exact f64 code with no tensor
//! library in the way; the burn versions in [`crate::burn_ops`] are checked against them.

use crate::error::{AlgoError, Result};

/// A row-major `rows × cols` matrix of f64, typically `(batch, response_length)`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "MatRepr")]
pub struct Mat {
    rows: usize,
    cols: usize,
    data: Vec<f64>,
}

/// The wire form of a [`Mat`], checked on the way in.
#[derive(serde::Deserialize)]
struct MatRepr {
    rows: usize,
    cols: usize,
    data: Vec<f64>,
}

impl TryFrom<MatRepr> for Mat {
    type Error = AlgoError;
    fn try_from(r: MatRepr) -> Result<Self> {
        Mat::new(r.rows, r.cols, r.data)
    }
}

impl Mat {
    /// Builds a matrix from row-major data; errors when `data.len() != rows * cols`.
    pub fn new(rows: usize, cols: usize, data: Vec<f64>) -> Result<Self> {
        match rows.checked_mul(cols) {
            Some(n) if n == data.len() => Ok(Self { rows, cols, data }),
            _ => Err(AlgoError::shape(
                "Mat::new",
                format!("{} values cannot fill a {rows}x{cols} matrix", data.len()),
            )),
        }
    }

    /// A matrix of zeros.
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Self {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        }
    }

    /// A matrix filled with `value`.
    pub fn full(rows: usize, cols: usize, value: f64) -> Self {
        Self {
            rows,
            cols,
            data: vec![value; rows * cols],
        }
    }

    /// Builds a matrix from rows; errors when rows have different lengths.
    pub fn from_rows<R: AsRef<[f64]>>(rows: &[R]) -> Result<Self> {
        let cols = rows.first().map_or(0, |r| r.as_ref().len());
        let mut data = Vec::with_capacity(rows.len() * cols);
        for (i, r) in rows.iter().enumerate() {
            let r = r.as_ref();
            if r.len() != cols {
                return Err(AlgoError::shape(
                    "Mat::from_rows",
                    format!("row {i} has {} values, row 0 has {cols}", r.len()),
                ));
            }
            data.extend_from_slice(r);
        }
        Ok(Self {
            rows: rows.len(),
            cols,
            data,
        })
    }

    /// A single-row matrix holding `values`.
    pub fn row_vector(values: Vec<f64>) -> Self {
        Self {
            rows: 1,
            cols: values.len(),
            data: values,
        }
    }

    /// Number of rows (batch size).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns (response length).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// `(rows, cols)`.
    pub fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// Total number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True when the matrix holds no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The row-major data.
    pub fn data(&self) -> &[f64] {
        &self.data
    }

    /// Consumes the matrix, returning its row-major data.
    pub fn into_data(self) -> Vec<f64> {
        self.data
    }

    /// The element at `(r, c)`, or `None` out of bounds.
    pub fn get(&self, r: usize, c: usize) -> Option<f64> {
        (r < self.rows && c < self.cols).then(|| self.data[r * self.cols + c])
    }

    /// Row `r` as a slice, or `None` out of bounds.
    pub fn row(&self, r: usize) -> Option<&[f64]> {
        (r < self.rows).then(|| &self.data[r * self.cols..(r + 1) * self.cols])
    }

    /// Iterates over the rows.
    pub fn iter_rows(&self) -> impl Iterator<Item = &[f64]> {
        (0..self.rows).map(move |r| &self.data[r * self.cols..(r + 1) * self.cols])
    }

    /// Same shape, every element mapped through `f`.
    pub fn map(&self, f: impl Fn(f64) -> f64) -> Self {
        Self {
            rows: self.rows,
            cols: self.cols,
            data: self.data.iter().map(|&x| f(x)).collect(),
        }
    }

    /// Elementwise combination of two same-shaped matrices.
    pub fn zip_map(
        &self,
        other: &Mat,
        op: &'static str,
        f: impl Fn(f64, f64) -> f64,
    ) -> Result<Self> {
        self.check_same_shape(other, op, "other")?;
        Ok(Self {
            rows: self.rows,
            cols: self.cols,
            data: self
                .data
                .iter()
                .zip(&other.data)
                .map(|(&a, &b)| f(a, b))
                .collect(),
        })
    }

    /// Errors unless `other` has this matrix's shape; `name` labels `other` in the message.
    pub fn check_same_shape(&self, other: &Mat, op: &'static str, name: &str) -> Result<()> {
        if self.shape() == other.shape() {
            Ok(())
        } else {
            Err(AlgoError::shape(
                op,
                format!(
                    "`{name}` is {}x{} but expected {}x{}",
                    other.rows, other.cols, self.rows, self.cols
                ),
            ))
        }
    }

    pub(crate) fn data_mut(&mut self) -> &mut [f64] {
        &mut self.data
    }
}

/// Row-major `(batch, seq, vocab)` logits in f64.
#[derive(Debug, Clone, PartialEq)]
pub struct Logits {
    batch: usize,
    seq: usize,
    vocab: usize,
    data: Vec<f64>,
}

impl Logits {
    /// Builds logits from row-major data; errors when the length does not match the shape.
    pub fn new(batch: usize, seq: usize, vocab: usize, data: Vec<f64>) -> Result<Self> {
        match batch.checked_mul(seq).and_then(|n| n.checked_mul(vocab)) {
            Some(n) if n == data.len() => Ok(Self {
                batch,
                seq,
                vocab,
                data,
            }),
            _ => Err(AlgoError::shape(
                "Logits::new",
                format!(
                    "{} values cannot fill a {batch}x{seq}x{vocab} tensor",
                    data.len()
                ),
            )),
        }
    }

    /// `(batch, seq, vocab)`.
    pub fn shape(&self) -> (usize, usize, usize) {
        (self.batch, self.seq, self.vocab)
    }

    /// The row-major data.
    pub fn data(&self) -> &[f64] {
        &self.data
    }

    /// The vocabulary row at `(b, t)`, or `None` out of bounds.
    pub fn position(&self, b: usize, t: usize) -> Option<&[f64]> {
        (b < self.batch && t < self.seq).then(|| {
            let start = (b * self.seq + t) * self.vocab;
            &self.data[start..start + self.vocab]
        })
    }
}

/// Integer labels `(batch, seq)` indexing into the vocabulary axis of [`Logits`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Labels {
    rows: usize,
    cols: usize,
    data: Vec<i64>,
}

impl Labels {
    /// Builds labels from row-major data; errors when the length does not match the shape.
    pub fn new(rows: usize, cols: usize, data: Vec<i64>) -> Result<Self> {
        match rows.checked_mul(cols) {
            Some(n) if n == data.len() => Ok(Self { rows, cols, data }),
            _ => Err(AlgoError::shape(
                "Labels::new",
                format!("{} labels cannot fill a {rows}x{cols} matrix", data.len()),
            )),
        }
    }

    /// `(rows, cols)`.
    pub fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// The row-major label ids.
    pub fn data(&self) -> &[i64] {
        &self.data
    }
}
