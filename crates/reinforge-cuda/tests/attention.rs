//! The bf16 attention kernels (on the emulator) against attention computed on the host in
//! f64 from the same bf16 inputs: outputs, log-sum-exps and the q, k, v gradients, over packed
//! sequences that cross the 64-row tiles and key chunks (lengths 1 to 150), with GQA. Head
//! dims 64 and 128 run on the tensor-core kernels (mma.sync, whose fragment layouts the
//! emulator follows) and on the CUDA-core ones; 96, which the tensor-core kernels are not
//! built for, falls back to the CUDA-core ones.

use rand::{Rng, SeedableRng};
use reinforge_cuda::ops::{AttentionKernels, Ops};
use reinforge_cuda::{DType, Gpu, GpuKind, Packed};

fn bf16(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

fn f32_of(b: u16) -> f32 {
    half::bf16::from_bits(b).to_f32()
}

/// Norm-wise relative error of `got` against `want`.
fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - w).powi(2))
        .sum::<f64>()
        .sqrt();
    let den: f64 = want.iter().map(|w| w * w).sum::<f64>().sqrt();
    num / den.max(1e-30)
}

struct Reference {
    out: Vec<f64>,
    lse: Vec<f64>,
    dqkv: Vec<f64>,
}

/// Causal softmax attention and its backward, per sequence and head, in f64.
fn reference(
    qkv: &[f32],
    dout: &[f32],
    seqs: &[(usize, usize)],
    nh: usize,
    kvh: usize,
    hd: usize,
) -> Reference {
    let ld = (nh + 2 * kvh) * hd;
    let n = qkv.len() / ld;
    let scale = 1.0 / (hd as f64).sqrt();
    let (mut out, mut lse, mut dqkv) =
        (vec![0.0; n * nh * hd], vec![0.0; nh * n], vec![0.0; n * ld]);
    let at = |r: usize, c: usize| qkv[r * ld + c] as f64;
    for &(s0, len) in seqs {
        for h in 0..nh {
            let kh = h / (nh / kvh);
            let (qc, kc, vc) = (h * hd, (nh + kh) * hd, (nh + kvh + kh) * hd);
            for q in 0..len {
                let scores: Vec<f64> = (0..=q)
                    .map(|k| {
                        scale
                            * (0..hd)
                                .map(|d| at(s0 + q, qc + d) * at(s0 + k, kc + d))
                                .sum::<f64>()
                    })
                    .collect();
                let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = scores.iter().map(|s| (s - mx).exp()).sum();
                let p: Vec<f64> = scores.iter().map(|s| (s - mx).exp() / sum).collect();
                lse[h * n + s0 + q] = mx + sum.ln();
                let o = &mut out[(s0 + q) * nh * hd + h * hd..][..hd];
                for (k, pk) in p.iter().enumerate() {
                    for (d, od) in o.iter_mut().enumerate() {
                        *od += pk * at(s0 + k, vc + d);
                    }
                }
                let dy = &dout[(s0 + q) * nh * hd + h * hd..][..hd];
                let dp: Vec<f64> = (0..=q)
                    .map(|k| (0..hd).map(|d| dy[d] as f64 * at(s0 + k, vc + d)).sum())
                    .collect();
                let delta: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for k in 0..=q {
                    let ds = p[k] * (dp[k] - delta);
                    for d in 0..hd {
                        dqkv[(s0 + q) * ld + qc + d] += scale * ds * at(s0 + k, kc + d);
                        dqkv[(s0 + k) * ld + kc + d] += scale * ds * at(s0 + q, qc + d);
                        dqkv[(s0 + k) * ld + vc + d] += p[k] * dy[d] as f64;
                    }
                }
            }
        }
    }
    Reference { out, lse, dqkv }
}

fn check(hd: usize, nh: usize, kvh: usize, kernels: AttentionKernels, tensor_cores: bool) {
    let lens = [1usize, 37, 64, 65, 150];
    let seqs: Vec<Vec<u32>> = lens.iter().map(|&l| vec![1; l]).collect();
    let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
    let packed = Packed::new(&refs, 2, 256).expect("valid batch");
    let n = packed.len();
    let ld = (nh + 2 * kvh) * hd;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(hd as u64);
    // Scores of a few units, so the softmax is neither flat nor one-hot.
    let qkv_bits: Vec<u16> = (0..n * ld)
        .map(|_| bf16(rng.random_range(-2.0f32..2.0)))
        .collect();
    let dout_bits: Vec<u16> = (0..n * nh * hd)
        .map(|_| bf16(rng.random_range(-1.0f32..1.0)))
        .collect();
    let qkv: Vec<f32> = qkv_bits.iter().map(|&b| f32_of(b)).collect();
    let dout: Vec<f32> = dout_bits.iter().map(|&b| f32_of(b)).collect();
    let want = reference(&qkv, &dout, &packed.seqs, nh, kvh, hd);

    let gpu = Gpu::open(GpuKind::Emulated).expect("emulator");
    let ops = Ops {
        attention: kernels,
        ..Ops::new(&gpu, DType::Bf16)
    };
    assert_eq!(
        ops.tensor_core_attention(hd),
        tensor_cores,
        "kernel family for head dim {hd}"
    );
    let tiles = packed.tiles(ops.attention_tile(hd));
    let up = |v: &[u16]| gpu.upload_new(v, "test").expect("upload");
    let (qkv_d, dout_d, tiles_d) = (
        up(&qkv_bits),
        up(&dout_bits),
        gpu.upload_new(&tiles.data, "tiles").expect("upload"),
    );
    let out_d = gpu.alloc(n * nh * hd * 2, "out", "").expect("alloc");
    let lse_d = gpu.alloc(n * nh * 4, "lse", "").expect("alloc");
    let dqkv_d = gpu.alloc(n * ld * 2, "dqkv", "").expect("alloc");
    let delta_d = gpu.alloc(n * nh * 4, "delta", "").expect("alloc");
    let n_tiles = tiles.count;
    ops.attention(
        out_d.ptr,
        lse_d.ptr,
        qkv_d.ptr,
        tiles_d.ptr,
        n_tiles,
        n,
        nh,
        kvh,
        hd,
        ld,
    )
    .expect("forward");
    ops.attention_bwd(
        dqkv_d.ptr,
        delta_d.ptr,
        qkv_d.ptr,
        out_d.ptr,
        dout_d.ptr,
        lse_d.ptr,
        tiles_d.ptr,
        n_tiles,
        n,
        nh,
        kvh,
        hd,
        ld,
    )
    .expect("backward");
    let from_bf16 = |p, len| {
        gpu.to_vec::<u16>(p, len)
            .expect("download")
            .into_iter()
            .map(f32_of)
            .collect::<Vec<f32>>()
    };
    let out = from_bf16(out_d.ptr, n * nh * hd);
    let lse = gpu.to_vec::<f32>(lse_d.ptr, n * nh).expect("download");
    let dqkv = from_bf16(dqkv_d.ptr, n * ld);

    // bf16 outputs carry 2⁻⁹ relative rounding; the tensor-core kernels also round p and ds
    // to bf16 before their second products. Every element, not only the norm, must be close:
    // a fragment-layout mistake moves whole 8×8 blocks.
    let e_out = rel_err(&out, &want.out);
    let e_lse = lse
        .iter()
        .zip(&want.lse)
        .map(|(g, w)| (*g as f64 - w).abs())
        .fold(0.0, f64::max);
    let e_d = rel_err(&dqkv, &want.dqkv);
    let worst = |got: &[f32], want: &[f64]| {
        let scale = want.iter().map(|w| w.abs()).fold(0.0, f64::max);
        got.iter()
            .zip(want)
            .map(|(g, w)| (*g as f64 - w).abs() / scale)
            .fold(0.0, f64::max)
    };
    let (w_out, w_d) = (worst(&out, &want.out), worst(&dqkv, &want.dqkv));
    eprintln!("head dim {hd}, {kernels:?}: out {e_out:.2e} (worst {w_out:.2e}), lse max abs {e_lse:.2e}, dqkv {e_d:.2e} (worst {w_d:.2e})");
    assert!(
        e_out < 4e-3 && w_out < 8e-3,
        "attention output off by {e_out:.2e} (worst element {w_out:.2e})"
    );
    assert!(e_lse < 1e-3, "log-sum-exp off by {e_lse:.2e}");
    assert!(
        e_d < 6e-3 && w_d < 1e-2,
        "q/k/v gradients off by {e_d:.2e} (worst element {w_d:.2e})"
    );
}

#[test]
fn tensor_core_attention_head_dim_64_with_gqa() {
    check(64, 4, 2, AttentionKernels::TensorCores, true);
}

#[test]
fn tensor_core_attention_head_dim_128() {
    check(128, 2, 1, AttentionKernels::TensorCores, true);
}

#[test]
fn cuda_core_attention_in_bf16() {
    check(64, 4, 2, AttentionKernels::CudaCores, false);
}

#[test]
fn head_dims_without_tensor_core_kernels_fall_back_to_cuda_cores() {
    check(96, 2, 2, AttentionKernels::TensorCores, false);
}

/// A prompt packed once with its samples after it (`Packed::with_prefixes`) against the same
/// samples each packed after their own copy of the prompt, computed in f64: a sample's rows
/// see the whole prompt, then themselves; the prompt's rows see only the prompt; the prompt's
/// gradients sum over every sample that reads it.
fn check_shared(hd: usize, nh: usize, kvh: usize, kernels: AttentionKernels) {
    let (plen, conts, plain) = (70usize, [1usize, 37, 65], 20usize);
    let mut seqs: Vec<Vec<u32>> = vec![vec![1; plen]];
    seqs.extend(conts.iter().map(|&l| vec![1; l]));
    seqs.push(vec![1; plain]);
    let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
    let prefix = [None, Some(0), Some(0), Some(0), None];
    let packed = Packed::with_prefixes(&refs, &prefix, 2, 256).expect("valid batch");
    let n = packed.len();
    let ld = (nh + 2 * kvh) * hd;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7 + hd as u64);
    let qkv_bits: Vec<u16> = (0..n * ld).map(|_| bf16(rng.random_range(-2.0f32..2.0))).collect();
    let dout_bits: Vec<u16> = (0..n * nh * hd).map(|_| bf16(rng.random_range(-1.0f32..1.0))).collect();
    let qkv: Vec<f32> = qkv_bits.iter().map(|&b| f32_of(b)).collect();
    let dout: Vec<f32> = dout_bits.iter().map(|&b| f32_of(b)).collect();

    // The unshared batch: the prompt alone, then each sample after a copy of the prompt whose
    // output gradients are zero (its outputs are the prompt's own, counted once), then the
    // plain sequence. `src[r]` is the shared row each unshared row copies.
    let (p0, c0) = (packed.seqs[0].0, packed.seqs[4].0);
    let mut src: Vec<usize> = (p0..p0 + plen).collect();
    let mut useq = vec![(0usize, plen)];
    let mut counted = vec![true; plen];
    for &(s, l) in &packed.seqs[1..4] {
        useq.push((src.len(), plen + l));
        src.extend(p0..p0 + plen);
        counted.extend(std::iter::repeat_n(false, plen));
        src.extend(s..s + l);
        counted.extend(std::iter::repeat_n(true, l));
    }
    useq.push((src.len(), plain));
    src.extend(c0..c0 + plain);
    counted.extend(std::iter::repeat_n(true, plain));
    let uq: Vec<f32> = src.iter().flat_map(|&r| qkv[r * ld..(r + 1) * ld].iter().copied()).collect();
    let ud: Vec<f32> = src
        .iter()
        .zip(&counted)
        .flat_map(|(&r, &c)| dout[r * nh * hd..(r + 1) * nh * hd].iter().map(move |&x| if c { x } else { 0.0 }))
        .collect();
    let un = src.len();
    let u = reference(&uq, &ud, &useq, nh, kvh, hd);
    let (mut out, mut lse, mut dqkv) = (vec![0.0; n * nh * hd], vec![0.0; nh * n], vec![0.0; n * ld]);
    for (ur, &r) in src.iter().enumerate() {
        if counted[ur] {
            out[r * nh * hd..(r + 1) * nh * hd].copy_from_slice(&u.out[ur * nh * hd..(ur + 1) * nh * hd]);
            for h in 0..nh {
                lse[h * n + r] = u.lse[h * un + ur];
            }
        }
        for c in 0..ld {
            dqkv[r * ld + c] += u.dqkv[ur * ld + c];
        }
    }

    let gpu = Gpu::open(GpuKind::Emulated).expect("emulator");
    let ops = Ops { attention: kernels, ..Ops::new(&gpu, DType::Bf16) };
    let tiles = packed.tiles(ops.attention_tile(hd));
    let up = |v: &[u16]| gpu.upload_new(v, "test").expect("upload");
    let (qkv_d, dout_d) = (up(&qkv_bits), up(&dout_bits));
    let tiles_d = gpu.upload_new(&tiles.data, "tiles").expect("upload");
    let out_d = gpu.alloc(n * nh * hd * 2, "out", "").expect("alloc");
    let lse_d = gpu.alloc(n * nh * 4, "lse", "").expect("alloc");
    let dqkv_d = gpu.alloc(n * ld * 2, "dqkv", "").expect("alloc");
    let delta_d = gpu.alloc(n * nh * 4, "delta", "").expect("alloc");
    ops.attention(out_d.ptr, lse_d.ptr, qkv_d.ptr, tiles_d.ptr, tiles.count, n, nh, kvh, hd, ld).expect("forward");
    ops.attention_bwd(dqkv_d.ptr, delta_d.ptr, qkv_d.ptr, out_d.ptr, dout_d.ptr, lse_d.ptr, tiles_d.ptr, tiles.count, n, nh, kvh, hd, ld).expect("backward");
    let from_bf16 = |p, len| gpu.to_vec::<u16>(p, len).expect("download").into_iter().map(f32_of).collect::<Vec<f32>>();
    let got_out = from_bf16(out_d.ptr, n * nh * hd);
    let got_lse = gpu.to_vec::<f32>(lse_d.ptr, n * nh).expect("download");
    let got_d = from_bf16(dqkv_d.ptr, n * ld);
    let e_out = rel_err(&got_out, &out);
    let e_lse = got_lse.iter().zip(&lse).map(|(g, w)| (*g as f64 - w).abs()).fold(0.0, f64::max);
    let e_d = rel_err(&got_d, &dqkv);
    // The prompt's rows alone: their gradients are the ones summed over the samples.
    let e_pd = rel_err(&got_d[p0 * ld..(p0 + plen) * ld], &dqkv[p0 * ld..(p0 + plen) * ld]);
    eprintln!("shared prompt, head dim {hd}, {kernels:?}: out {e_out:.2e}, lse {e_lse:.2e}, dqkv {e_d:.2e} (prompt rows {e_pd:.2e})");
    assert!(e_out < 4e-3, "attention output off by {e_out:.2e}");
    assert!(e_lse < 1e-3, "log-sum-exp off by {e_lse:.2e}");
    assert!(e_d < 6e-3 && e_pd < 6e-3, "q/k/v gradients off by {e_d:.2e} (prompt rows {e_pd:.2e})");
}

#[test]
fn samples_packed_after_one_copy_of_their_prompt_on_tensor_cores() {
    check_shared(64, 4, 2, AttentionKernels::TensorCores);
}

#[test]
fn samples_packed_after_one_copy_of_their_prompt_on_cuda_cores() {
    check_shared(32, 4, 1, AttentionKernels::CudaCores);
}
