//! The epoch loader: seeded shuffles, drop_last, epochs, and exact resume.

use reinforge_data::gen::{arith, ArithConfig};
use reinforge_data::{Batch, DataError, Dataset, EpochLoader, LoadOptions, LoaderConfig, LoaderState};

use crate::common::fake_encode;

fn cfg(batch_size: usize, shuffle: bool, drop_last: bool, total_epochs: usize) -> LoaderConfig {
    LoaderConfig { batch_size, shuffle, seed: 42, drop_last, total_epochs }
}

fn all(mut l: EpochLoader) -> Vec<Batch> {
    std::iter::from_fn(|| l.next_batch()).collect()
}

#[test]
fn shuffles_are_seeded_per_epoch_and_cover_the_dataset() {
    let c = cfg(4, true, true, 3);
    let a = all(EpochLoader::new(10, c.clone()).unwrap());
    let b = all(EpochLoader::new(10, c.clone()).unwrap());
    assert_eq!(a, b, "same seed, same batches");
    assert_eq!(a.len(), 6, "2 full batches per epoch, partial dropped");
    let epoch = |e: usize| -> Vec<usize> {
        a.iter().filter(|x| x.epoch == e).flat_map(|x| x.indices.clone()).collect()
    };
    for e in 0..3 {
        let mut seen = epoch(e);
        assert_eq!(seen.len(), 8);
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 8, "no index repeats within an epoch");
    }
    assert_ne!(epoch(0), epoch(1), "each epoch has its own order");

    let other = all(EpochLoader::new(10, LoaderConfig { seed: 43, ..c.clone() }).unwrap());
    assert_ne!(a, other, "different seed, different order");

    // The order is the epoch's own permutation: the full order (no drop) is a permutation of 0..n.
    let full = all(EpochLoader::new(10, cfg(3, true, false, 1)).unwrap());
    let mut idx: Vec<usize> = full.iter().flat_map(|b| b.indices.clone()).collect();
    assert_ne!(idx, (0..10).collect::<Vec<_>>());
    idx.sort();
    assert_eq!(idx, (0..10).collect::<Vec<_>>());
}

#[test]
fn steps_and_positions() {
    let l = EpochLoader::new(10, cfg(4, false, false, 2)).unwrap();
    assert_eq!((l.steps_per_epoch(), l.total_steps()), (3, 6));
    let batches = all(l);
    let sizes: Vec<usize> = batches.iter().map(|b| b.indices.len()).collect();
    assert_eq!(sizes, [4, 4, 2, 4, 4, 2]);
    let pos: Vec<(usize, usize, usize)> = batches.iter().map(|b| (b.epoch, b.step_in_epoch, b.global_step)).collect();
    assert_eq!(pos, [(0, 0, 0), (0, 1, 1), (0, 2, 2), (1, 0, 3), (1, 1, 4), (1, 2, 5)]);
    assert_eq!(batches[0].indices, [0, 1, 2, 3], "no shuffle keeps file order");

    let l = EpochLoader::new(10, cfg(4, true, true, 2)).unwrap();
    assert_eq!((l.steps_per_epoch(), l.total_steps()), (2, 4));
    assert_eq!(l.count(), 4);
}

#[test]
fn resumed_loader_yields_exactly_the_remaining_batches() {
    for c in [cfg(3, true, true, 3), cfg(4, true, false, 2), cfg(5, false, true, 2), cfg(7, true, true, 1)] {
        let n = 17;
        let reference = all(EpochLoader::new(n, c.clone()).unwrap());
        for k in 0..=reference.len() {
            let mut l = EpochLoader::new(n, c.clone()).unwrap();
            for _ in 0..k {
                l.next_batch().unwrap();
            }
            // Through JSON, as a checkpoint would store it.
            let saved = serde_json::to_string(&l.state()).unwrap();
            let state: LoaderState = serde_json::from_str(&saved).unwrap();
            let resumed = EpochLoader::from_state(n, c.clone(), &state).unwrap();
            assert_eq!(all(resumed), reference[k..], "config {c:?}, resumed after {k} batches");
        }
    }
}

#[test]
fn resume_can_extend_epochs_but_not_change_the_order() {
    let c = cfg(4, true, true, 1);
    let mut l = EpochLoader::new(12, c.clone()).unwrap();
    while l.next_batch().is_some() {}
    let state = l.state();
    let longer = LoaderConfig { total_epochs: 2, ..c.clone() };
    let tail = all(EpochLoader::from_state(12, longer.clone(), &state).unwrap());
    let reference = all(EpochLoader::new(12, longer).unwrap());
    assert_eq!(tail, reference[3..]);

    let err = EpochLoader::from_state(13, LoaderConfig { seed: 1, ..c.clone() }, &state).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, DataError::Config(_)));
    assert!(msg.contains("dataset length 12 vs 13") && msg.contains("seed 42 vs 1"), "{msg}");
}

#[test]
fn invalid_configs_are_errors() {
    assert!(EpochLoader::new(10, cfg(0, true, true, 1)).is_err());
    assert!(EpochLoader::new(0, cfg(1, true, true, 1)).is_err());
    let msg = EpochLoader::new(3, cfg(4, true, true, 1)).unwrap_err().to_string();
    assert!(msg.contains("fewer than a batch (4: data.train_batch_size"), "{msg}");
    assert_eq!(all(EpochLoader::new(3, cfg(4, true, false, 1)).unwrap()).len(), 1);
    assert!(all(EpochLoader::new(3, cfg(1, true, true, 0)).unwrap()).is_empty());
}

#[test]
fn validation_loader_is_in_order_with_the_last_partial_batch() {
    let batches = all(EpochLoader::validation(7, Some(3)).unwrap());
    let idx: Vec<Vec<usize>> = batches.iter().map(|b| b.indices.clone()).collect();
    assert_eq!(idx, [vec![0, 1, 2], vec![3, 4, 5], vec![6]]);
    let whole = all(EpochLoader::validation(7, None).unwrap());
    assert_eq!(whole.len(), 1);
    assert_eq!(whole[0].indices, (0..7).collect::<Vec<_>>());
}

#[test]
fn batches_map_to_dataset_items() {
    let recs = arith(6, 3, &ArithConfig::default()).unwrap();
    let ds = Dataset::from_records(recs.clone(), "<gen>", &LoadOptions::default(), &fake_encode).unwrap();
    let mut l = EpochLoader::new(ds.len(), cfg(4, true, true, 1)).unwrap();
    let b = l.next_batch().unwrap();
    let items = ds.batch(&b);
    assert_eq!(items.len(), 4);
    for (item, &i) in items.iter().zip(&b.indices) {
        assert_eq!(item.record, recs[i]);
    }
}

#[test]
fn loader_config_deserializes_with_defaults() {
    let c: LoaderConfig = serde_json::from_value(serde_json::json!({"batch_size": 16, "seed": 7})).unwrap();
    assert_eq!(c, LoaderConfig { batch_size: 16, seed: 7, ..LoaderConfig::default() });
    assert!(c.shuffle && c.drop_last && c.total_epochs == 1);
}
