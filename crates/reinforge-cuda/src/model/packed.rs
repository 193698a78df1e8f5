//! A batch as the kernels see it: sequences laid end to end with no padding, the positions of
//! their tokens, the row tiles the attention kernels work on, and the sorted index the
//! embedding gradient uses.

use crate::error::{CudaError, Result};

/// Sequences packed end to end.
#[derive(Debug, Clone, Default)]
pub struct Packed {
    /// Every token, sequence after sequence.
    pub ids: Vec<u32>,
    /// RoPE position of each token (0-based within its sequence).
    pub positions: Vec<i32>,
    /// `(first token, length)` of each sequence.
    pub seqs: Vec<(usize, usize)>,
}

impl Packed {
    /// Packs `seqs` (none may be empty), checking ids against the vocabulary and lengths
    /// against the model's context.
    pub fn new(seqs: &[&[u32]], vocab: usize, max_pos: usize) -> Result<Packed> {
        let mut p = Packed::default();
        for (i, s) in seqs.iter().enumerate() {
            if s.is_empty() {
                return Err(CudaError::Request(format!("sequence {i} is empty")));
            }
            if s.len() > max_pos {
                return Err(CudaError::Request(format!("sequence {i} has {} tokens, more than the model's context of {max_pos}", s.len())));
            }
            if let Some(&bad) = s.iter().find(|&&t| t as usize >= vocab) {
                return Err(CudaError::Request(format!("token id {bad} is outside the vocabulary (size {vocab})")));
            }
            p.seqs.push((p.ids.len(), s.len()));
            p.ids.extend_from_slice(s);
            p.positions.extend(0..s.len() as i32);
        }
        if p.ids.is_empty() {
            return Err(CudaError::Request("empty batch".into()));
        }
        Ok(p)
    }

    /// Tokens in the batch.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The rows that predict each sequence's next token (every position but its last) and
    /// those tokens: what a language-model loss over whole sequences scores.
    pub fn next_token_rows(&self) -> (Vec<usize>, Vec<u32>) {
        let mut rows = Vec::with_capacity(self.ids.len());
        let mut targets = Vec::with_capacity(self.ids.len());
        for &(start, len) in &self.seqs {
            for t in 1..len {
                rows.push(start + t - 1);
                targets.push(self.ids[start + t]);
            }
        }
        (rows, targets)
    }

    /// `(first row, length, offset)` of every `rows`-row tile of every sequence, flattened
    /// (`rows` from [`crate::ops::Ops::attention_tile`]).
    pub fn tiles(&self, rows: usize) -> Vec<i32> {
        let mut t = Vec::new();
        for &(start, len) in &self.seqs {
            for off in (0..len).step_by(rows) {
                t.extend([start as i32, len as i32, off as i32]);
            }
        }
        t
    }

    /// Token ids as the kernels read them.
    pub fn ids_i32(&self) -> Vec<i32> {
        self.ids.iter().map(|&t| t as i32).collect()
    }

    /// The embedding gradient's index: distinct ids, and for each the rows holding it.
    pub fn embed_index(&self) -> EmbedIndex {
        let mut order: Vec<usize> = (0..self.ids.len()).collect();
        order.sort_by_key(|&r| (self.ids[r], r));
        let mut uniq = Vec::new();
        let mut offs = vec![0i32];
        let mut rows = Vec::with_capacity(order.len());
        for (i, &r) in order.iter().enumerate() {
            if i > 0 && self.ids[r] != self.ids[order[i - 1]] {
                offs.push(i as i32);
            }
            if uniq.last() != Some(&(self.ids[r] as i32)) {
                uniq.push(self.ids[r] as i32);
            }
            rows.push(r as i32);
        }
        offs.push(order.len() as i32);
        EmbedIndex { uniq, offs, rows }
    }
}

/// Rows grouped by token id (CSR), for a deterministic embedding gradient.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbedIndex {
    /// Distinct ids, ascending.
    pub uniq: Vec<i32>,
    /// `rows[offs[b]..offs[b+1]]` hold `uniq[b]`.
    pub offs: Vec<i32>,
    /// Row numbers, grouped by id, ascending within a group.
    pub rows: Vec<i32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_tiles_and_groups_rows_by_id() {
        let p = Packed::new(&[&[5, 7, 5], &[7; 20]], 10, 64).expect("valid");
        assert_eq!(p.seqs, vec![(0, 3), (3, 20)]);
        assert_eq!(&p.positions[..5], &[0, 1, 2, 0, 1]);
        assert_eq!(p.tiles(16), vec![0, 3, 0, 3, 20, 0, 3, 20, 16]);
        assert_eq!(p.tiles(64), vec![0, 3, 0, 3, 20, 0]);
        let e = p.embed_index();
        assert_eq!(e.uniq, vec![5, 7]);
        assert_eq!(e.offs, vec![0, 2, 23]);
        assert_eq!(&e.rows[..3], &[0, 2, 1]);
        assert!(Packed::new(&[&[1, 11]], 10, 64).is_err());
        assert!(Packed::new(&[&[]], 10, 64).is_err());
        assert!(Packed::new(&[&[1; 65]], 10, 64).is_err());
    }
}
