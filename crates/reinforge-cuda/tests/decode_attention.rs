//! Decode attention over a paged cache (on the emulator) against softmax attention computed on
//! the host in f64 from the same stored values: rows whose contexts end anywhere in a 32-key
//! chunk and span several splits (one of a single position), blocks scattered through the
//! cache, GQA groups of 1 to 16 query heads. Both kernels: the tensor-core one (bf16, head dims
//! 16 to 128: groups of 1, 3, 6 and 16 heads) and the CUDA-core one, with head dims whose keys
//! and values load a chunk ahead into registers (bf16 64, 80 and 128, f32 64) as well as ones
//! that load element by element (f32 128, bf16 36). Each case runs twice on the same buffers (the split counters
//! must be back at zero, as a replayed graph needs them), and under both of the emulator's
//! thread schedules, which must give the same bits (no race in the shared-memory chunks).
//!
//! A decode step's new tokens (not yet rotated, not yet cached) through both routes — RoPE and
//! the cache store inside the tensor-core kernel, and rope_kv_store's launch first — against
//! an f64 reference that rotates them itself; the two routes must give the same bits, in the
//! output and in every cache slot.

mod common;
use common::{download, stored};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use reinforge_cuda::ops::{decode_split_keys, AttentionKernels, DecodeRope, NewTokens, Ops, TC_HEAD_DIMS};
use reinforge_cuda::gpu::set_emulator_schedule_mirrored;
use reinforge_cuda::{DType, Gpu, GpuKind};

const BLOCK: usize = 16;
const CTX: [usize; 7] = [1, 5, 32, 33, 100, 257, 300];

/// Every row's block table ([rows, max_blocks]), its blocks drawn from a shuffled pool with
/// `spare` blocks no row owns scattered among them; and max_blocks and the pool's size.
fn block_tables(rng: &mut rand_chacha::ChaCha8Rng, spare: usize) -> (Vec<i32>, usize, usize) {
    let max_blocks = CTX.iter().max().unwrap().div_ceil(BLOCK);
    let pool_blocks = CTX.iter().map(|c| c.div_ceil(BLOCK)).sum::<usize>() + spare;
    let mut pool: Vec<usize> = (0..pool_blocks).collect();
    pool.shuffle(rng);
    let mut tables = vec![0i32; CTX.len() * max_blocks];
    let mut next = pool.into_iter();
    for (r, &c) in CTX.iter().enumerate() {
        for b in 0..c.div_ceil(BLOCK) {
            tables[r * max_blocks + b] = next.next().unwrap() as i32;
        }
    }
    (tables, max_blocks, pool_blocks)
}

/// ‖got − want‖ / ‖want‖.
fn relative_error(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(a, b)| (*a as f64 - b).powi(2)).sum::<f64>().sqrt();
    num / want.iter().map(|b| b * b).sum::<f64>().sqrt()
}

/// Output of one case (as f32), and its norm-wise relative error against the f64 reference.
fn case(gpu: &std::sync::Arc<Gpu>, kernels: AttentionKernels, dt: DType, hd: usize, nh: usize, kvh: usize) -> (Vec<u32>, f64) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64((hd * 100 + nh * 10 + kvh) as u64);
    let rows = CTX.len();
    let g = nh / kvh;
    let ld = (nh + 2 * kvh) * hd;
    let (tables, max_blocks, pool_blocks) = block_tables(&mut rng, 9);
    let slots = pool_blocks * BLOCK;
    let draw = |n: usize, a: f32, rng: &mut rand_chacha::ChaCha8Rng| -> Vec<f32> { (0..n).map(|_| rng.random_range(-a..a)).collect() };
    let (k, k_bytes) = stored(dt, &draw(slots * kvh * hd, 2.0, &mut rng));
    let (v, v_bytes) = stored(dt, &draw(slots * kvh * hd, 1.0, &mut rng));
    let (qkv, qkv_bytes) = stored(dt, &draw(rows * ld, 2.0, &mut rng));

    let scale = 1.0 / (hd as f64).sqrt();
    let mut want = vec![0f64; rows * nh * hd];
    for (r, &c) in CTX.iter().enumerate() {
        for h in 0..nh {
            let kh = h / g;
            let q = &qkv[r * ld + h * hd..][..hd];
            let at = |p: usize| (tables[r * max_blocks + p / BLOCK] as usize * BLOCK + p % BLOCK) * kvh * hd + kh * hd;
            let s: Vec<f64> = (0..c).map(|p| (0..hd).map(|d| q[d] as f64 * k[at(p) + d] as f64).sum::<f64>() * scale).collect();
            let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
            let sum: f64 = e.iter().sum();
            for d in 0..hd {
                want[(r * nh + h) * hd + d] = (0..c).map(|p| e[p] * v[at(p) + d] as f64).sum::<f64>() / sum;
            }
        }
    }

    let ops = Ops { attention: kernels, ..Ops::new(gpu, dt) };
    assert_eq!(ops.tensor_core_attention(hd), kernels == AttentionKernels::TensorCores && dt == DType::Bf16 && TC_HEAD_DIMS.contains(&hd));
    let split_keys = decode_split_keys(max_blocks * BLOCK).expect("split keys");
    let splits = (max_blocks * BLOCK).div_ceil(split_keys);
    assert!(splits > 1, "the longest context should span several splits");
    let up = |b: &[u8]| gpu.upload_new(b, "test").expect("upload");
    let (qkv_d, k_d, v_d) = (up(&qkv_bytes), up(&k_bytes), up(&v_bytes));
    let tables_d = gpu.upload_new(&tables, "tables").expect("upload");
    let ctx: Vec<i32> = CTX.iter().map(|&c| c as i32).collect();
    let ctx_d = gpu.upload_new(&ctx, "ctx").expect("upload");
    let part = gpu.alloc(rows * nh * splits * (hd + 2) * 4, "part", "").expect("alloc");
    let done = gpu.alloc(rows * kvh * 4, "done", "").expect("alloc");
    let out = gpu.alloc(rows * nh * hd * dt.size(), "out", "").expect("alloc");
    let mut runs = Vec::new();
    for _ in 0..2 {
        ops.decode_attention(out.ptr, part.ptr, done.ptr, qkv_d.ptr, k_d.ptr, v_d.ptr, tables_d.ptr, ctx_d.ptr, None, rows, max_blocks, BLOCK, (nh, kvh, hd, ld), (split_keys, splits))
            .expect("decode attention");
        let got = download(gpu, dt, out.ptr, rows * nh * hd);
        let counts: Vec<u32> = gpu.to_vec(done.ptr, rows * kvh).unwrap();
        assert!(counts.iter().all(|&c| c == 0), "{dt:?} hd {hd}: split counters left at {counts:?}");
        runs.push(got);
    }
    assert_eq!(runs[0].iter().map(|x| x.to_bits()).collect::<Vec<_>>(), runs[1].iter().map(|x| x.to_bits()).collect::<Vec<_>>(), "{dt:?} hd {hd}: a second step differs");
    let got = runs.pop().unwrap();
    (got.iter().map(|x| x.to_bits()).collect(), relative_error(&got, &want))
}

#[test]
fn decode_attention_equals_softmax_attention_over_the_pages() {
    use AttentionKernels::{CudaCores, TensorCores};
    let cases = [
        (TensorCores, DType::Bf16, 64, 9, 3),
        (TensorCores, DType::Bf16, 128, 12, 2),
        (TensorCores, DType::Bf16, 32, 16, 1),
        (TensorCores, DType::Bf16, 16, 4, 4),
        (CudaCores, DType::Bf16, 128, 12, 2),
        (TensorCores, DType::Bf16, 80, 8, 8),
        (TensorCores, DType::Bf16, 36, 8, 1),
        (TensorCores, DType::F32, 64, 6, 2),
        (TensorCores, DType::F32, 128, 4, 4),
    ];
    let mut bits = Vec::new();
    for mirrored in [false, true] {
        set_emulator_schedule_mirrored(mirrored);
        let gpu = Gpu::open(GpuKind::Emulated).expect("emulator");
        let mut these = Vec::new();
        for &(kernels, dt, hd, nh, kvh) in &cases {
            let (b, err) = case(&gpu, kernels, dt, hd, nh, kvh);
            let bound = if dt == DType::Bf16 { 1e-2 } else { 1e-6 };
            eprintln!("{kernels:?} {dt:?} hd {hd}, {nh} heads on {kvh} KV heads: relative error {err:.2e} (≤ {bound:.0e})");
            assert!(err <= bound, "{dt:?} hd {hd}, {nh}/{kvh} heads: relative error {err:.2e} > {bound:.0e}");
            these.push(b);
        }
        bits.push(these);
    }
    set_emulator_schedule_mirrored(false);
    for (i, (a, b)) in bits[0].iter().zip(&bits[1]).enumerate() {
        assert!(a == b, "case {:?}: the two thread schedules give different bits (a race)", cases[i]);
    }
}

/// Output bits, k and v cache bits, and the relative error of one step whose new tokens are
/// rotated and cached by decode attention (`route`), against f64.
fn new_token_case(gpu: &std::sync::Arc<Gpu>, kernels: AttentionKernels, route: DecodeRope, dt: DType, hd: usize, nh: usize, kvh: usize) -> (Vec<u32>, Vec<u32>, Vec<u32>, f64) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64((hd * 1000 + nh * 10 + kvh) as u64);
    let rows = CTX.len();
    let g = nh / kvh;
    let ld = (nh + 2 * kvh) * hd;
    let half = hd / 2;
    let (tables, max_blocks, pool_blocks) = block_tables(&mut rng, 5);
    let slot_of = |r: usize, p: usize| tables[r * max_blocks + p / BLOCK] as usize * BLOCK + p % BLOCK;
    let slots: Vec<i32> = CTX.iter().enumerate().map(|(r, &c)| slot_of(r, c - 1) as i32).collect();
    // Positions other than ctx − 1, so a kernel that took the angle from the context would fail.
    let pos: Vec<i32> = CTX.iter().enumerate().map(|(r, &c)| (c - 1 + 3 * r) as i32).collect();
    let max_pos = *pos.iter().max().unwrap() as usize + 1;
    let angles: Vec<f64> = (0..max_pos * half).map(|_| rng.random_range(-3.0..3.0)).collect();
    let cos: Vec<f32> = angles.iter().map(|a| a.cos() as f32).collect();
    let sin: Vec<f32> = angles.iter().map(|a| a.sin() as f32).collect();
    let n_slots = pool_blocks * BLOCK;
    let draw = |n: usize, a: f32, rng: &mut rand_chacha::ChaCha8Rng| -> Vec<f32> { (0..n).map(|_| rng.random_range(-a..a)).collect() };
    // The new tokens' slots hold stale values, which the step must overwrite before reading.
    let (k, k_bytes) = stored(dt, &draw(n_slots * kvh * hd, 2.0, &mut rng));
    let (v, v_bytes) = stored(dt, &draw(n_slots * kvh * hd, 1.0, &mut rng));
    let (qkv, qkv_bytes) = stored(dt, &draw(rows * ld, 2.0, &mut rng));

    let rotate = |x: &[f32], p: usize| -> Vec<f64> {
        let mut y = vec![0f64; hd];
        for i in 0..half {
            let (c, s) = (cos[p * half + i] as f64, sin[p * half + i] as f64);
            let (a, b) = (x[i] as f64, x[i + half] as f64);
            y[i] = a * c - b * s;
            y[i + half] = b * c + a * s;
        }
        y
    };
    let scale = 1.0 / (hd as f64).sqrt();
    let mut want = vec![0f64; rows * nh * hd];
    for (r, &c) in CTX.iter().enumerate() {
        let row = &qkv[r * ld..][..ld];
        for h in 0..nh {
            let kh = h / g;
            let q = rotate(&row[h * hd..][..hd], pos[r] as usize);
            let new_k = rotate(&row[(nh + kh) * hd..][..hd], pos[r] as usize);
            let key = |p: usize| -> Vec<f64> { if p + 1 == c { new_k.clone() } else { k[slot_of(r, p) * kvh * hd + kh * hd..][..hd].iter().map(|&x| x as f64).collect() } };
            let val = |p: usize, d: usize| -> f64 { if p + 1 == c { row[(nh + kvh + kh) * hd + d] as f64 } else { v[slot_of(r, p) * kvh * hd + kh * hd + d] as f64 } };
            let s: Vec<f64> = (0..c).map(|p| key(p).iter().zip(&q).map(|(a, b)| a * b).sum::<f64>() * scale).collect();
            let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
            let sum: f64 = e.iter().sum();
            for d in 0..hd {
                want[(r * nh + h) * hd + d] = (0..c).map(|p| e[p] * val(p, d)).sum::<f64>() / sum;
            }
        }
    }

    let ops = Ops { attention: kernels, decode_rope: route, ..Ops::new(gpu, dt) };
    let split_keys = decode_split_keys(max_blocks * BLOCK).expect("split keys");
    let splits = (max_blocks * BLOCK).div_ceil(split_keys);
    let up = |b: &[u8]| gpu.upload_new(b, "test").expect("upload");
    let (qkv_d, k_d, v_d) = (up(&qkv_bytes), up(&k_bytes), up(&v_bytes));
    let tables_d = gpu.upload_new(&tables, "tables").expect("upload");
    let ctx: Vec<i32> = CTX.iter().map(|&c| c as i32).collect();
    let ctx_d = gpu.upload_new(&ctx, "ctx").expect("upload");
    let (cos_d, sin_d) = (gpu.upload_new(&cos, "cos").expect("upload"), gpu.upload_new(&sin, "sin").expect("upload"));
    let (pos_d, slots_d) = (gpu.upload_new(&pos, "pos").expect("upload"), gpu.upload_new(&slots, "slots").expect("upload"));
    let new = NewTokens { cos: cos_d.ptr, sin: sin_d.ptr, pos: pos_d.ptr, slots: slots_d.ptr };
    let part = gpu.alloc(rows * nh * splits * (hd + 2) * 4, "part", "").expect("alloc");
    let done = gpu.alloc(rows * kvh * 4, "done", "").expect("alloc");
    let out = gpu.alloc(rows * nh * hd * dt.size(), "out", "").expect("alloc");
    ops.decode_attention(out.ptr, part.ptr, done.ptr, qkv_d.ptr, k_d.ptr, v_d.ptr, tables_d.ptr, ctx_d.ptr, Some(&new), rows, max_blocks, BLOCK, (nh, kvh, hd, ld), (split_keys, splits))
        .expect("decode attention");
    let got = download(gpu, dt, out.ptr, rows * nh * hd);
    let counts: Vec<u32> = gpu.to_vec(done.ptr, rows * kvh).unwrap();
    assert!(counts.iter().all(|&c| c == 0), "{dt:?} hd {hd}: split counters left at {counts:?}");
    let bits = |x: Vec<f32>| x.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let k_after = download(gpu, dt, k_d.ptr, n_slots * kvh * hd);
    let v_after = download(gpu, dt, v_d.ptr, n_slots * kvh * hd);
    // Only the new tokens' slots changed, and v went in as it was.
    for s in 0..n_slots {
        let mine = slots.iter().position(|&x| x as usize == s);
        for e in s * kvh * hd..(s + 1) * kvh * hd {
            match mine {
                None => assert!(k_after[e].to_bits() == k[e].to_bits() && v_after[e].to_bits() == v[e].to_bits(), "{route:?} hd {hd}: slot {s}, which no new token owns, changed"),
                Some(r) => assert_eq!(v_after[e].to_bits(), qkv[r * ld + nh * hd + kvh * hd + e - s * kvh * hd].to_bits(), "{route:?} hd {hd}: row {r}'s value in slot {s}"),
            }
        }
    }
    let err = relative_error(&got, &want);
    (bits(got), bits(k_after), bits(v_after), err)
}

#[test]
fn new_tokens_are_rotated_and_cached_the_same_inside_the_kernel_and_by_rope_kv_store() {
    use AttentionKernels::{CudaCores, TensorCores};
    let cases = [
        (TensorCores, DType::Bf16, 16, 4, 4),
        (TensorCores, DType::Bf16, 32, 16, 1),
        (TensorCores, DType::Bf16, 64, 9, 3),
        (TensorCores, DType::Bf16, 128, 12, 2),
        (CudaCores, DType::Bf16, 64, 9, 3),
        (TensorCores, DType::F32, 64, 6, 2),
    ];
    for mirrored in [false, true] {
        set_emulator_schedule_mirrored(mirrored);
        let gpu = Gpu::open(GpuKind::Emulated).expect("emulator");
        for &(kernels, dt, hd, nh, kvh) in &cases {
            let fused = new_token_case(&gpu, kernels, DecodeRope::Fused, dt, hd, nh, kvh);
            let separate = new_token_case(&gpu, kernels, DecodeRope::Separate, dt, hd, nh, kvh);
            let bound = if dt == DType::Bf16 { 1e-2 } else { 1e-6 };
            eprintln!("{kernels:?} {dt:?} hd {hd}, {nh}/{kvh} heads, new tokens (mirrored {mirrored}): relative error {:.2e} (≤ {bound:.0e})", fused.3);
            assert!(fused.3 <= bound, "{kernels:?} {dt:?} hd {hd}: relative error {:.2e} > {bound:.0e}", fused.3);
            assert!(fused.0 == separate.0, "{kernels:?} {dt:?} hd {hd}: the fused route's output differs from rope_kv_store's");
            assert!(fused.1 == separate.1 && fused.2 == separate.2, "{kernels:?} {dt:?} hd {hd}: the fused route's cache differs from rope_kv_store's");
        }
    }
    set_emulator_schedule_mirrored(false);
}
