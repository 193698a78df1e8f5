//! The CUDA engine's forward (run by the emulator: the same kernel sources, compiled for the
//! CPU) against the independent NumPy reference of the tiny fixtures: every logit of every
//! case, f32 storage to the fixtures' 1e-4, bf16 storage to bf16's precision.

mod common;
use common::*;
use reinforge_cuda::{DType, DeviceModel, Gpu, GpuKind, Packed};

fn check(name: &str, dt: DType, tol: f32) {
    let gpu = Gpu::open(GpuKind::Emulated).expect("emulator");
    let dir = fixtures().join("models").join(name);
    let golden = read_json(&dir.join("golden.json"));
    let model = DeviceModel::load(&gpu, &dir, dt, false).expect("load");
    let vocab = model.cfg.vocab_size;
    for case in golden["cases"].as_array().expect("cases") {
        let id = case["id"].as_str().unwrap_or("?");
        let ids: Vec<Vec<u32>> = case["input_ids"].as_array().unwrap().iter().map(u32s).collect();
        let mask: Vec<Vec<u32>> = case["attention_mask"].as_array().unwrap().iter().map(u32s).collect();
        let seqs: Vec<Vec<u32>> = ids.iter().zip(&mask).map(|(r, m)| r.iter().zip(m).filter(|(_, &m)| m == 1).map(|(&x, _)| x).collect()).collect();
        let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
        let batch = Packed::new(&refs, vocab, model.cfg.max_position_embeddings).expect("pack");
        let rows: Vec<usize> = (0..batch.len()).collect();
        let logits = model.logits(&batch, &rows).expect("logits");
        let mut worst = 0f32;
        let mut r = 0;
        for (b, exp_rows) in case["logits"].as_array().unwrap().iter().enumerate() {
            let exp_rows = exp_rows.as_array().unwrap();
            assert_eq!(exp_rows.len(), seqs[b].len(), "{name}/{id}: row {b}");
            for exp in exp_rows {
                let exp = f32s(exp);
                let got = &logits[r * vocab..(r + 1) * vocab];
                for v in 0..vocab {
                    worst = worst.max((got[v] - exp[v]).abs());
                }
                r += 1;
            }
        }
        assert!(worst <= tol, "{name}/{id} ({dt:?}): max |logit diff| {worst} > {tol}");
        eprintln!("{name}/{id} ({dt:?}): max |logit diff| {worst:.2e}");
    }
}

#[test]
fn tiny_llama_f32_matches_reference() {
    check("tiny-llama", DType::F32, 1e-4);
}

#[test]
fn tiny_qwen2_f32_matches_reference() {
    check("tiny-qwen2", DType::F32, 1e-4);
}

#[test]
fn tiny_llama_bf16_is_within_bf16_error() {
    check("tiny-llama", DType::Bf16, 0.25);
}

#[test]
fn scoring_refuses_rows_and_targets_the_kernels_cannot_read() {
    let gpu = Gpu::open(GpuKind::Emulated).expect("emulator");
    let model = DeviceModel::load(&gpu, &fixtures().join("models/tiny-llama"), DType::F32, false).expect("load");
    let vocab = model.cfg.vocab_size;
    let batch = Packed::new(&[&[1, 2, 3][..]], vocab, model.cfg.max_position_embeddings).expect("pack");
    fn lm(targets: &[u32]) -> reinforge_cuda::Head<'_> {
        reinforge_cuda::Head::Lm { targets, temperature: 1.0 }
    }
    let err = |rows: &[usize], targets: &[u32]| model.score(&batch, rows, lm(targets)).expect_err("refused").to_string();
    // A target's logit is read by index: one past the vocabulary would be the next row's.
    let e = err(&[0, 1], &[5, vocab as u32]);
    assert!(e.contains(&format!("target token {vocab} is outside the vocabulary of {vocab}")), "{e}");
    assert!(err(&[3], &[1]).contains("outside the batch of 3 tokens"));
    assert!(err(&[1, 1], &[1, 2]).contains("scored twice"));
    assert!(model.score(&batch, &[0, 1], lm(&[5, vocab as u32 - 1])).is_ok());
}
