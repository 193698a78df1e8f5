//! The sampling kernel (on the emulator) against the CPU engine's rule, computed here in f64:
//! top-k keeps the k largest logits, top-p the smallest set of the heaviest kept tokens whose
//! probability reaches top_p, and the draw follows the kept tokens' renormalised
//! probabilities. Every pick must be a kept token, pick frequencies over many rows must match
//! those probabilities, and each log-prob is the token's under the full softmax.

use rand::{Rng, SeedableRng};
use reinforge_cuda::ops::Ops;
use reinforge_cuda::{DType, Gpu, GpuKind};

/// The kept tokens and their probabilities (renormalised over the kept set), by the CPU
/// engine's rule.
fn kept(z: &[f32], temperature: f64, top_k: usize, top_p: f64) -> Vec<(usize, f64)> {
    let mx = z.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let mut cand: Vec<(usize, f64)> = z.iter().enumerate().map(|(i, &x)| (i, ((x as f64 - mx) / temperature).exp())).collect();
    cand.sort_by(|a, b| b.1.total_cmp(&a.1));
    if top_k > 0 && top_k < cand.len() {
        cand.truncate(top_k);
    }
    if top_p < 1.0 {
        let total: f64 = cand.iter().map(|c| c.1).sum();
        let mut acc = 0.0;
        let cut = cand
            .iter()
            .position(|c| {
                acc += c.1 / total;
                acc >= top_p
            })
            .map_or(cand.len(), |i| i + 1);
        cand.truncate(cut);
    }
    let total: f64 = cand.iter().map(|c| c.1).sum();
    cand.into_iter().map(|(i, w)| (i, w / total)).collect()
}

/// A vocabulary that is a multiple of 4 (rows read in 16-byte loads) and one that is not.
#[test]
fn top_k_top_p_and_the_draw_follow_the_cpu_engines_rule() {
    follow_the_rule(700);
    follow_the_rule(701);
}

fn follow_the_rule(v: usize) {
    let gpu = Gpu::open(GpuKind::Emulated).unwrap();
    let ops = Ops::new(&gpu, DType::F32);
    let rows = 768;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(17);
    // Logits of a trained model's shape: a long tail and a few strong candidates; the same row
    // for every sampled row, each with its own random key.
    let mut z: Vec<f32> = (0..v).map(|_| rng.random_range(-4.0f32..2.0)).collect();
    for (i, bump) in [(3usize, 4.5f32), (77, 4.2), (150, 3.9), (151, 3.5), (420, 3.3), (v - 1, 3.0), (5, 2.6)] {
        z[i] = bump;
    }
    let zs: Vec<f32> = (0..rows).flat_map(|_| z.iter().copied()).collect();
    let keys: Vec<u64> = (0..rows).map(|_| rng.random()).collect();
    let z_d = gpu.upload_new(&zs, "logits").unwrap();
    let keys_d = gpu.upload_new(&keys, "keys").unwrap();
    let tok_d = gpu.alloc(rows * 4, "tokens", "").unwrap();
    let lp_d = gpu.alloc(rows * 4, "log-probs", "").unwrap();
    let full_lse = |t: f64| {
        let mx = z.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64 / t;
        mx + z.iter().map(|&x| (x as f64 / t - mx).exp()).sum::<f64>().ln()
    };
    for (temperature, top_k, top_p) in [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.0, 0, 0.9), (1.3, 50, 0.8), (1.0, 1, 1.0), (0.8, 3, 0.5)] {
        let what = format!("vocabulary {v}, temperature {temperature}, top_k {top_k}, top_p {top_p}");
        ops.sample(tok_d.ptr, lp_d.ptr, z_d.ptr, keys_d.ptr, rows, v, (1.0 / temperature) as f32, false, top_k, top_p as f32).unwrap();
        let toks: Vec<i32> = gpu.to_vec(tok_d.ptr, rows).unwrap();
        let lps: Vec<f32> = gpu.to_vec(lp_d.ptr, rows).unwrap();
        let want = kept(&z, temperature, top_k, top_p);
        let lse = full_lse(temperature);
        let mut counts = std::collections::BTreeMap::new();
        for (&t, &lp) in toks.iter().zip(&lps) {
            assert!(want.iter().any(|&(i, _)| i as i32 == t), "{what}: token {t} is not among the {} kept", want.len());
            let exact = z[t as usize] as f64 / temperature - lse;
            assert!((lp as f64 - exact).abs() < 1e-4, "{what}: log-prob {lp} of token {t}, want {exact}");
            *counts.entry(t as usize).or_insert(0usize) += 1;
        }
        for &(i, p) in &want {
            let got = *counts.get(&i).unwrap_or(&0) as f64 / rows as f64;
            let sigma = (p * (1.0 - p) / rows as f64).sqrt();
            assert!((got - p).abs() <= 5.0 * sigma + 2e-3, "{what}: token {i} drawn {got:.3} of the time, probability {p:.3}");
        }
        eprintln!("{what}: {} kept, frequencies match", want.len());
        // The same keys give the same tokens.
        ops.sample(tok_d.ptr, lp_d.ptr, z_d.ptr, keys_d.ptr, rows, v, (1.0 / temperature) as f32, false, top_k, top_p as f32).unwrap();
        assert_eq!(gpu.to_vec::<i32>(tok_d.ptr, rows).unwrap(), toks, "{what}: not reproducible");
    }
}

/// Vocabularies read in one step per warp (37), in several steps of 128 tokens (300 000: 37
/// steps of 256, two groups of four per lane), and not a multiple of 4 with two groups per
/// lane (262 147), with peaks on the edges of warps' parts and of steps, and at the very end.
#[test]
fn draws_are_exact_across_warps_and_steps() {
    // Equal maxima over a tail too light to hold any mass: the draw replayed on the host
    // (`selftest::exact_draws`, also run by `reinforge selftest`).
    let gpu = Gpu::open(GpuKind::Emulated).unwrap();
    let check = |v: usize, peaks: &[usize]| reinforge_cuda::selftest::exact_draws(&gpu, v, peaks, 48).unwrap_or_else(|e| panic!("{e}"));
    check(37, &[17, 0, 36]);
    check(300_000, &[5, 150_001, 299_999]);
    // 262 147 tokens: each warp's part is 33 steps of 256 (8448 tokens).
    check(262_147, &[8447, 0, 8448, 8448 + 255, 8448 + 256, 262_146]);
}
