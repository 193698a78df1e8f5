//! A resumable, seeded, multi-epoch batch loader over dataset indices.

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::{DataError, Result};

/// How to iterate a dataset. Field names mirror verl's `data.*` / `trainer.*` keys.
///
/// Unknown keys are ignored so this can be flattened into a `[data]` table next to
/// [`crate::LoadOptions`] (their field names do not overlap).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LoaderConfig {
    /// Prompts per batch (verl `data.train_batch_size`, accepted as an alias).
    #[serde(alias = "train_batch_size")]
    pub batch_size: usize,
    /// Shuffle each epoch with a permutation seeded by `seed + epoch`.
    pub shuffle: bool,
    /// Base seed for shuffling.
    pub seed: u64,
    /// Drop an epoch's final partial batch (verl's train loader does).
    pub drop_last: bool,
    /// Number of passes over the dataset (verl `trainer.total_epochs`).
    pub total_epochs: usize,
}

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig { batch_size: 8, shuffle: true, seed: 1, drop_last: true, total_epochs: 1 }
    }
}

/// One batch: which dataset items, and where it sits in training.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    /// 0-based epoch this batch belongs to.
    pub epoch: usize,
    /// 0-based index of this batch within its epoch.
    pub step_in_epoch: usize,
    /// 0-based index of this batch over the whole run.
    pub global_step: usize,
    /// Dataset indices, in batch order.
    pub indices: Vec<usize>,
}

/// Where a loader is, saved in checkpoints so training resumes on the exact next batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderState {
    /// Current epoch.
    pub epoch: usize,
    /// Position within the current epoch's order (items already handed out).
    pub cursor: usize,
    /// Dataset length the state was taken with (resuming on other data is an error).
    pub dataset_len: usize,
    /// Batch size the state was taken with.
    pub batch_size: usize,
    /// Whether the loader shuffles.
    pub shuffle: bool,
    /// Shuffle seed.
    pub seed: u64,
    /// Whether partial batches are dropped.
    pub drop_last: bool,
}

/// Hands out batches of dataset indices across epochs; see [`LoaderConfig`].
///
/// The order of epoch `e` depends only on `(seed, e, dataset_len)`, so the loader's state is
/// just `(epoch, cursor)` and a resumed loader reproduces an uninterrupted run exactly.
#[derive(Debug, Clone)]
pub struct EpochLoader {
    cfg: LoaderConfig,
    len: usize,
    epoch: usize,
    cursor: usize,
    /// The permutation for `order_epoch` (recomputed lazily when the epoch changes).
    order: Vec<usize>,
    order_epoch: Option<usize>,
}

/// A uniform integer in `0..n` from the raw ChaCha stream by rejection sampling.
///
/// Written out rather than using `rand`'s range sampling so that shuffles (and generated
/// datasets) depend only on the ChaCha stream, not on a rand version's sampling algorithm.
pub(crate) fn below(rng: &mut ChaCha8Rng, n: u64) -> u64 {
    assert!(n > 0, "below(0)");
    let limit = u64::MAX - u64::MAX % n;
    loop {
        let x = rng.next_u64();
        if x < limit {
            return x % n;
        }
    }
}

/// The permutation of `0..len` for one epoch (identity when not shuffling).
fn epoch_order(len: usize, shuffle: bool, seed: u64, epoch: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..len).collect();
    if shuffle {
        let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_add(epoch as u64));
        // Fisher-Yates.
        for i in (1..len).rev() {
            let j = below(&mut rng, i as u64 + 1) as usize;
            order.swap(i, j);
        }
    }
    order
}

impl EpochLoader {
    /// A loader over `dataset_len` items; errors if it could never yield a batch.
    pub fn new(dataset_len: usize, cfg: LoaderConfig) -> Result<EpochLoader> {
        if cfg.batch_size == 0 {
            return Err(DataError::Config("data.train_batch_size must be at least 1".into()));
        }
        if dataset_len == 0 {
            return Err(DataError::Config("cannot iterate an empty dataset".into()));
        }
        if cfg.drop_last && dataset_len < cfg.batch_size {
            return Err(DataError::Config(format!(
                "dataset has {dataset_len} prompts, fewer than a batch ({}: data.train_batch_size, or data.gen_batch_size with dynamic sampling): with drop_last every batch would be dropped",
                cfg.batch_size
            )));
        }
        Ok(EpochLoader { cfg, len: dataset_len, epoch: 0, cursor: 0, order: Vec::new(), order_epoch: None })
    }

    /// A validation loader: every item once, in order, no shuffle, last partial batch kept.
    /// `batch_size = None` gives the whole set as one batch (verl's default val batch).
    pub fn validation(dataset_len: usize, batch_size: Option<usize>) -> Result<EpochLoader> {
        let cfg = LoaderConfig {
            batch_size: batch_size.unwrap_or(dataset_len).max(1),
            shuffle: false,
            seed: 0,
            drop_last: false,
            total_epochs: 1,
        };
        Self::new(dataset_len, cfg)
    }

    /// Restores a loader from a checkpointed state; the next batch is the one an
    /// uninterrupted loader would have produced next.
    ///
    /// `total_epochs` comes from `cfg` (a run may be extended); everything that shapes the
    /// batch order must match the state, or this errors rather than silently changing data.
    pub fn from_state(dataset_len: usize, cfg: LoaderConfig, state: &LoaderState) -> Result<EpochLoader> {
        let mut mismatches = Vec::new();
        if state.dataset_len != dataset_len {
            mismatches.push(format!("dataset length {} vs {}", state.dataset_len, dataset_len));
        }
        if state.batch_size != cfg.batch_size {
            mismatches.push(format!("batch size {} vs {}", state.batch_size, cfg.batch_size));
        }
        if state.shuffle != cfg.shuffle {
            mismatches.push(format!("shuffle {} vs {}", state.shuffle, cfg.shuffle));
        }
        if state.seed != cfg.seed {
            mismatches.push(format!("seed {} vs {}", state.seed, cfg.seed));
        }
        if state.drop_last != cfg.drop_last {
            mismatches.push(format!("drop_last {} vs {}", state.drop_last, cfg.drop_last));
        }
        if state.cursor > dataset_len {
            mismatches.push(format!("cursor {} past the end of {} items", state.cursor, dataset_len));
        }
        if !mismatches.is_empty() {
            return Err(DataError::Config(format!(
                "checkpointed data loader state does not match this run (checkpoint vs now: {})",
                mismatches.join(", ")
            )));
        }
        let mut loader = Self::new(dataset_len, cfg)?;
        loader.epoch = state.epoch;
        loader.cursor = state.cursor;
        Ok(loader)
    }

    /// The state to checkpoint (after handing out the batches so far).
    pub fn state(&self) -> LoaderState {
        LoaderState {
            epoch: self.epoch,
            cursor: self.cursor,
            dataset_len: self.len,
            batch_size: self.cfg.batch_size,
            shuffle: self.cfg.shuffle,
            seed: self.cfg.seed,
            drop_last: self.cfg.drop_last,
        }
    }

    /// The configuration this loader runs with.
    pub fn config(&self) -> &LoaderConfig {
        &self.cfg
    }

    /// Batches per epoch.
    pub fn steps_per_epoch(&self) -> usize {
        if self.cfg.drop_last {
            self.len / self.cfg.batch_size
        } else {
            self.len.div_ceil(self.cfg.batch_size)
        }
    }

    /// Batches over all epochs (verl's total_training_steps when not set explicitly).
    pub fn total_steps(&self) -> usize {
        self.steps_per_epoch() * self.cfg.total_epochs
    }

    /// The next batch, moving to the next epoch as needed; `None` after `total_epochs`.
    pub fn next_batch(&mut self) -> Option<Batch> {
        let bs = self.cfg.batch_size;
        loop {
            if self.epoch >= self.cfg.total_epochs {
                return None;
            }
            let remaining = self.len - self.cursor;
            if remaining == 0 || (self.cfg.drop_last && remaining < bs) {
                self.epoch += 1;
                self.cursor = 0;
                continue;
            }
            if self.order_epoch != Some(self.epoch) {
                self.order = epoch_order(self.len, self.cfg.shuffle, self.cfg.seed, self.epoch);
                self.order_epoch = Some(self.epoch);
            }
            let take = remaining.min(bs);
            let step_in_epoch = self.cursor / bs;
            let indices = self.order[self.cursor..self.cursor + take].to_vec();
            self.cursor += take;
            return Some(Batch {
                epoch: self.epoch,
                step_in_epoch,
                global_step: self.epoch * self.steps_per_epoch() + step_in_epoch,
                indices,
            });
        }
    }
}

impl Iterator for EpochLoader {
    type Item = Batch;

    fn next(&mut self) -> Option<Batch> {
        self.next_batch()
    }
}
