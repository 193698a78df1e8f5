//! A batch as the kernels see it: sequences laid end to end with no padding, the positions of
//! their tokens, the row tiles the attention kernels work on, and the sorted index the
//! embedding gradient uses.

use crate::error::{CudaError, Result};

/// Sequences packed end to end.
#[derive(Debug, Clone, Default)]
pub struct Packed {
    /// Every token, sequence after sequence.
    pub ids: Vec<u32>,
    /// RoPE position of each token (0-based within its sequence, after its prefix's).
    pub positions: Vec<i32>,
    /// `(first token, length)` of each sequence.
    pub seqs: Vec<(usize, usize)>,
    /// The sequence each one continues (a prompt its samples share), if any: it attends to all
    /// of that sequence, then to itself causally, as if the two were one sequence.
    pub prefix: Vec<Option<usize>>,
}

/// Attention work items of a batch for the kernels (attention_tc.cu explains the layout):
/// `count` tiles of 6 ints, then the lists of sequences continuing each prefix.
#[derive(Debug, Clone, PartialEq)]
pub struct Tiles {
    /// Tiles, then continuation lists, as the kernels read them.
    pub data: Vec<i32>,
    /// Tiles (the kernels' grid size).
    pub count: usize,
}

impl Packed {
    /// Packs `seqs` (none may be empty), checking ids against the vocabulary and lengths
    /// against the model's context.
    pub fn new(seqs: &[&[u32]], vocab: usize, max_pos: usize) -> Result<Packed> {
        Packed::with_prefixes(seqs, &vec![None; seqs.len()], vocab, max_pos)
    }

    /// Packs `seqs` where `prefix[i] = Some(j)` makes sequence `i` continue sequence `j` (the
    /// samples of a prompt after one copy of it): `j` comes before `i` and continues nothing
    /// itself, and together they fit the model's context.
    pub fn with_prefixes(seqs: &[&[u32]], prefix: &[Option<usize>], vocab: usize, max_pos: usize) -> Result<Packed> {
        if prefix.len() != seqs.len() {
            return Err(CudaError::Request(format!("{} prefixes for {} sequences", prefix.len(), seqs.len())));
        }
        let mut p = Packed::default();
        for (i, s) in seqs.iter().enumerate() {
            if s.is_empty() {
                return Err(CudaError::Request(format!("sequence {i} is empty")));
            }
            let before = match prefix[i] {
                None => 0,
                Some(j) if j < i && prefix[j].is_none() => seqs[j].len(),
                Some(j) => return Err(CudaError::Request(format!("sequence {i} continues sequence {j}, which is not an earlier sequence of its own"))),
            };
            if before + s.len() > max_pos {
                return Err(CudaError::Request(format!("sequence {i} has {} tokens, more than the model's context of {max_pos}", before + s.len())));
            }
            if let Some(&bad) = s.iter().find(|&&t| t as usize >= vocab) {
                return Err(CudaError::Request(format!("token id {bad} is outside the vocabulary (size {vocab})")));
            }
            p.seqs.push((p.ids.len(), s.len()));
            p.ids.extend_from_slice(s);
            p.positions.extend(before as i32..(before + s.len()) as i32);
        }
        if p.ids.is_empty() {
            return Err(CudaError::Request("empty batch".into()));
        }
        p.prefix = prefix.to_vec();
        Ok(p)
    }

    /// `(tokens, context)` of each sequence: its length, and the keys its last token attends
    /// to (a continuation's prefix included).
    pub fn contexts(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.seqs.iter().enumerate().map(|(i, &(_, len))| (len, len + self.prefix.get(i).copied().flatten().map_or(0, |j| self.seqs[j].1)))
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

    /// `(first row, length, offset, prefix row, prefix length, continuations)` of every
    /// `rows`-row tile of every sequence (`rows` from [`crate::ops::Ops::attention_tile`]),
    /// then for each sequence that others continue: their count and `(first row, length)`s,
    /// at the index a tile's `continuations` entry gives (into the whole buffer).
    pub fn tiles(&self, rows: usize) -> Tiles {
        let mut conts: Vec<Vec<usize>> = vec![Vec::new(); self.seqs.len()];
        for (i, j) in self.prefix.iter().enumerate() {
            if let Some(j) = *j {
                conts[j].push(i);
            }
        }
        // Continuation lists follow the tiles, and `x` indexes the whole buffer, so a kernel
        // finds them whatever grid it was launched with.
        let count: usize = self.seqs.iter().map(|&(_, len)| len.div_ceil(rows)).sum();
        let mut ext = Vec::new();
        let mut ext_at = vec![-1i32; self.seqs.len()];
        for (at, c) in ext_at.iter_mut().zip(&conts).filter(|(_, c)| !c.is_empty()) {
            *at = (6 * count + ext.len()) as i32;
            ext.push(c.len() as i32);
            ext.extend(c.iter().flat_map(|&i| [self.seqs[i].0 as i32, self.seqs[i].1 as i32]));
        }
        let mut data = Vec::new();
        for (i, &(start, len)) in self.seqs.iter().enumerate() {
            let (ps, plen) = match self.prefix.get(i).copied().flatten() {
                Some(j) => self.seqs[j],
                None => (start, 0),
            };
            for off in (0..len).step_by(rows) {
                data.extend([start as i32, len as i32, off as i32, ps as i32, plen as i32, ext_at[i]]);
            }
        }
        debug_assert_eq!(data.len(), 6 * count);
        data.extend(ext);
        Tiles { data, count }
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
        assert_eq!(p.tiles(16), Tiles { data: vec![0, 3, 0, 0, 0, -1, 3, 20, 0, 3, 0, -1, 3, 20, 16, 3, 0, -1], count: 3 });
        assert_eq!(p.tiles(64).count, 2);
        let e = p.embed_index();
        assert_eq!(e.uniq, vec![5, 7]);
        assert_eq!(e.offs, vec![0, 2, 23]);
        assert_eq!(&e.rows[..3], &[0, 2, 1]);
        assert!(Packed::new(&[&[1, 11]], 10, 64).is_err());
        assert!(Packed::new(&[&[]], 10, 64).is_err());
        assert!(Packed::new(&[&[1; 65]], 10, 64).is_err());
    }

    #[test]
    fn continuations_follow_their_prefix_in_positions_and_tiles() {
        // A prompt of 5 tokens continued by two samples of 2 and 20 tokens, and a plain sequence.
        let seqs: [&[u32]; 4] = [&[1; 5], &[2; 2], &[3; 20], &[4; 3]];
        let p = Packed::with_prefixes(&seqs, &[None, Some(0), Some(0), None], 10, 64).expect("valid");
        assert_eq!(&p.positions[5..7], &[5, 6]);
        assert_eq!(&p.positions[7..9], &[5, 6]);
        assert_eq!(&p.positions[27..], &[0, 1, 2]);
        let t = p.tiles(16);
        assert_eq!(t.count, 5);
        assert_eq!(&t.data[..6], &[0, 5, 0, 0, 0, 30]); // the prompt: its continuations at data[30], after the tiles
        assert_eq!(&t.data[6..12], &[5, 2, 0, 0, 5, -1]);
        assert_eq!(&t.data[12..24], &[7, 20, 0, 0, 5, -1, 7, 20, 16, 0, 5, -1]);
        assert_eq!(&t.data[30..], &[2, 5, 2, 7, 20]);
        // A prefix must come first and continue nothing; together they fit the context.
        assert!(Packed::with_prefixes(&seqs[..2], &[Some(1), None], 10, 64).is_err());
        assert!(Packed::with_prefixes(&seqs[..3], &[None, Some(0), Some(1)], 10, 64).is_err());
        assert!(Packed::with_prefixes(&[&[1; 40], &[2; 30]], &[None, Some(0)], 10, 64).is_err());
    }
}
