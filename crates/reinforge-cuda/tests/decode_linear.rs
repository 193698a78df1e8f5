//! The fused RMSNorm + linear kernels of decode steps (decode_linear.cu, on the emulator)
//! against the same layer computed on the host in f64 from the stored bf16 values: the QKV
//! form (with and without bias) and the gate/up form with SwiGLU, for row counts that fill
//! one to four 16-row tiles partly or wholly, and widths from one 32-wide step per warp to
//! SmolLM2's 576 and the 1024 limit. The separate route (norm kernel, GEMM, SwiGLU kernel)
//! must agree element by element within an ulp of bf16 (the norm's bits are the same; only the
//! GEMM's order of summation differs), and the fused route must leave the separate route's
//! scratch untouched (so it is the fused kernel that ran). Both emulator schedules give the
//! same bits. The few-rows linear layer (`linear_rows`: o_proj and down with the residual)
//! is checked the same way against f64 and cuBLASLt, split over k and not.

mod common;
use common::{download, stored};
use rand::{Rng, SeedableRng};
use reinforge_cuda::gpu::set_emulator_schedule_mirrored;
use reinforge_cuda::ops::{DecodeLinear, Ops};
use reinforge_cuda::{DType, Gpu, GpuKind};

const EPS: f64 = 1e-5;

struct Case {
    m: usize,
    n: usize,
    k: usize,
    bias: bool,
    swiglu: bool,
}

/// The fused route's output bits, and the relative errors of both routes against f64.
fn run(gpu: &std::sync::Arc<Gpu>, c: &Case) -> (Vec<u32>, f64, f64) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64((c.m * 7919 + c.n * 31 + c.k + c.swiglu as usize) as u64);
    let n_w = if c.swiglu { 2 * c.n } else { c.n };
    let draw = |n: usize, a: f32, rng: &mut rand_chacha::ChaCha8Rng| -> Vec<f32> { (0..n).map(|_| rng.random_range(-a..a)).collect() };
    let dt = DType::Bf16;
    // Rows of different scales, so a norm taken over the wrong row would show.
    let mut xv = draw(c.m * c.k, 1.0, &mut rng);
    for (r, row) in xv.chunks_mut(c.k).enumerate() {
        row.iter_mut().for_each(|v| *v *= 0.25 + r as f32);
    }
    let (x, x_b) = stored(dt, &xv);
    let (gamma, gamma_b) = stored(dt, &draw(c.k, 1.5, &mut rng));
    let (w, w_b) = stored(dt, &draw(n_w * c.k, 0.1, &mut rng));
    let (bias, bias_b) = stored(dt, &draw(n_w, 0.5, &mut rng));

    let mut want = vec![0f64; c.m * c.n];
    for r in 0..c.m {
        let row = &x[r * c.k..][..c.k];
        let rstd = 1.0 / (row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / c.k as f64 + EPS).sqrt();
        let out = |j: usize| -> f64 {
            let dot: f64 = (0..c.k).map(|i| row[i] as f64 * rstd * gamma[i] as f64 * w[j * c.k + i] as f64).sum();
            dot + if c.bias { bias[j] as f64 } else { 0.0 }
        };
        for j in 0..c.n {
            want[r * c.n + j] = if c.swiglu {
                let (g, u) = (out(j), out(c.n + j));
                g / (1.0 + (-g).exp()) * u
            } else {
                out(j)
            };
        }
    }

    let up = |b: &[u8]| gpu.upload_new(b, "test").expect("upload");
    let (x_d, gamma_d, w_d, bias_d) = (up(&x_b), up(&gamma_b), up(&w_b), up(&bias_b));
    let alloc = |bytes: usize| gpu.alloc(bytes, "test", "").expect("alloc");
    let sentinel = vec![0x5a5au16; c.m * c.k.max(2 * c.n)];
    let (hn, gu) = (gpu.upload_new(&sentinel, "hn").expect("upload"), gpu.upload_new(&sentinel, "gu").expect("upload"));
    let rstd = alloc(4 * c.m);
    let err = |got: &[f32]| -> f64 {
        let num: f64 = got.iter().zip(&want).map(|(a, b)| (*a as f64 - b).powi(2)).sum::<f64>().sqrt();
        num / want.iter().map(|b| b * b).sum::<f64>().sqrt()
    };
    let mut outs = Vec::new();
    for route in [DecodeLinear::Fused, DecodeLinear::Cublas] {
        let ops = Ops { decode_linear: route, ..Ops::new(gpu, dt) };
        let y = alloc(2 * c.m * c.n);
        ops.norm_linear(y.ptr, x_d.ptr, (gamma_d.ptr, EPS), w_d.ptr, c.bias.then_some(bias_d.ptr), (c.m, c.n, c.k), c.swiglu.then_some(gu.ptr), (hn.ptr, rstd.ptr))
            .expect("norm_linear");
        if route == DecodeLinear::Fused {
            let untouched = |p: reinforge_cuda::DevPtr| gpu.to_vec::<u16>(p, sentinel.len()).expect("download") == sentinel;
            assert!(untouched(hn.ptr) && untouched(gu.ptr), "m {} n {} k {}: the fused route wrote the separate route's scratch (did it run?)", c.m, c.n, c.k);
        }
        outs.push(download(gpu, dt, y.ptr, c.m * c.n));
    }
    // The fused kernel normalises as the norm kernel does (same bits), so the two routes differ
    // only in the GEMM's order of summation: an ulp of bf16 here and there (two for SwiGLU,
    // whose gate and up each round).
    let ulps = if c.swiglu { 2.0 } else { 1.0 };
    for (i, (a, b)) in outs[0].iter().zip(&outs[1]).enumerate() {
        let bound = ulps * a.abs().max(b.abs()) / 128.0 + 1e-6;
        assert!((a - b).abs() <= bound, "m {} n {} k {}: output {i}: fused {a} against separate {b}", c.m, c.n, c.k);
    }
    (outs[0].iter().map(|v| v.to_bits()).collect(), err(&outs[0]), err(&outs[1]))
}

#[test]
fn fused_norm_linear_matches_the_layer_in_f64_and_the_separate_kernels() {
    let cases = [
        Case { m: 1, n: 16, k: 32, bias: false, swiglu: false },
        Case { m: 5, n: 48, k: 256, bias: true, swiglu: false },
        Case { m: 16, n: 960, k: 576, bias: true, swiglu: false },
        Case { m: 33, n: 32, k: 1024, bias: false, swiglu: false },
        Case { m: 64, n: 64, k: 576, bias: false, swiglu: false },
        Case { m: 3, n: 16, k: 64, bias: false, swiglu: true },
        Case { m: 64, n: 96, k: 576, bias: true, swiglu: true },
        Case { m: 20, n: 48, k: 288, bias: false, swiglu: true },
    ];
    let mut bits = Vec::new();
    for mirrored in [false, true] {
        set_emulator_schedule_mirrored(mirrored);
        let gpu = Gpu::open(GpuKind::Emulated).expect("emulator");
        let mut these = Vec::new();
        for c in &cases {
            let (b, fused, separate) = run(&gpu, c);
            eprintln!("m {} n {} k {} bias {} swiglu {}: relative error fused {fused:.2e}, separate {separate:.2e}", c.m, c.n, c.k, c.bias, c.swiglu);
            // bf16 operands (x·γ or the normalised rows, and W) and a bf16 output: a few ulps.
            assert!(fused <= 1e-2, "m {} n {} k {}: fused relative error {fused:.2e}", c.m, c.n, c.k);
            assert!(separate <= 1e-2, "m {} n {} k {}: separate relative error {separate:.2e}", c.m, c.n, c.k);
            these.push(b);
        }
        bits.push(these);
    }
    set_emulator_schedule_mirrored(false);
    assert!(bits[0] == bits[1], "the two thread schedules give different bits (a race)");
}

#[test]
fn shapes_the_fused_kernels_do_not_take_go_to_the_separate_kernels() {
    // k not a multiple of 32, more rows than 64, n not a multiple of 16, rows past 96 KB of
    // shared memory: the separate route, which writes `hn`.
    let gpu = Gpu::open(GpuKind::Emulated).expect("emulator");
    let ops = Ops { decode_linear: DecodeLinear::Fused, ..Ops::new(&gpu, DType::Bf16) };
    for (m, n, k) in [(4, 16, 48), (65, 16, 64), (4, 24, 64), (64, 16, 1024)] {
        let ones = vec![0x3f80u16; m * k.max(n)];
        let (x, g, w) = (gpu.upload_new(&ones, "x").unwrap(), gpu.upload_new(&ones, "g").unwrap(), gpu.upload_new(&vec![0x3f80u16; n * k], "w").unwrap());
        let zeros = vec![0u16; m * k];
        let hn = gpu.upload_new(&zeros, "hn").unwrap();
        let rstd = gpu.alloc(4 * m, "rstd", "").unwrap();
        let y = gpu.alloc(2 * m * n, "y", "").unwrap();
        ops.norm_linear(y.ptr, x.ptr, (g.ptr, EPS), w.ptr, None, (m, n, k), None, (hn.ptr, rstd.ptr)).expect("norm_linear");
        assert_ne!(gpu.to_vec::<u16>(hn.ptr, m * k).unwrap(), zeros, "m {m} n {n} k {k}: expected the separate route");
        // Rows of ones normalise to ones: every output is k (to bf16).
        let got = download(&gpu, DType::Bf16, y.ptr, m * n);
        assert!(got.iter().all(|&v| (v - k as f32).abs() <= k as f32 * 1e-2), "m {m} n {n} k {k}: {:?}", &got[..4]);
    }
}

/// The kernels a call launched (names, as the op profile counts them).
fn launched(gpu: &Gpu, f: impl FnOnce() -> reinforge_cuda::Result<()>) -> Vec<String> {
    let ((), prof) = gpu.profile(f).expect("profiled call");
    prof.ops.into_iter().map(|o| o.op).collect()
}

struct RowsCase {
    m: usize,
    n: usize,
    k: usize,
    bias: bool,
    residual: bool,
}

/// `linear_rows`' output bits, its splits, and the relative errors of it and of cuBLASLt's
/// route against f64.
fn run_rows(gpu: &std::sync::Arc<Gpu>, c: &RowsCase) -> (Vec<u32>, usize, f64, f64) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64((c.m * 7919 + c.n * 31 + c.k) as u64 ^ 0x5eed);
    let draw = |n: usize, a: f32, rng: &mut rand_chacha::ChaCha8Rng| -> Vec<f32> { (0..n).map(|_| rng.random_range(-a..a)).collect() };
    let dt = DType::Bf16;
    let (x, x_b) = stored(dt, &draw(c.m * c.k, 1.0, &mut rng));
    let (w, w_b) = stored(dt, &draw(c.n * c.k, 0.1, &mut rng));
    let (bias, bias_b) = stored(dt, &draw(c.n, 0.5, &mut rng));
    let (res, res_b) = stored(dt, &draw(c.m * c.n, 2.0, &mut rng));
    let want: Vec<f64> = (0..c.m * c.n)
        .map(|e| {
            let (r, j) = (e / c.n, e % c.n);
            let dot: f64 = (0..c.k).map(|i| x[r * c.k + i] as f64 * w[j * c.k + i] as f64).sum();
            dot + if c.bias { bias[j] as f64 } else { 0.0 } + if c.residual { res[e] as f64 } else { 0.0 }
        })
        .collect();
    let up = |b: &[u8]| gpu.upload_new(b, "test").expect("upload");
    let (x_d, w_d, bias_d, res_d) = (up(&x_b), up(&w_b), up(&bias_b), up(&res_b));
    let fused = Ops { decode_linear: DecodeLinear::Fused, ..Ops::new(gpu, dt) };
    let splits = fused.linear_rows_splits(c.m, c.n, c.k).expect("a shape the kernel takes");
    let scratch = fused.linear_rows_scratch(c.m, &[(c.n, c.k)]);
    let part = gpu.alloc(scratch, "part", "").expect("alloc");
    let done = gpu.alloc(4 * c.n / 16, "done", "").expect("alloc");
    let err = |got: &[f32]| -> f64 {
        let num: f64 = got.iter().zip(&want).map(|(a, b)| (*a as f64 - b).powi(2)).sum::<f64>().sqrt();
        num / want.iter().map(|b| b * b).sum::<f64>().sqrt()
    };
    let mut outs = Vec::new();
    for ops in [&fused, &Ops::new(gpu, dt)] {
        let y = gpu.alloc(2 * c.m * c.n, "y", "").expect("alloc");
        let call = || ops.linear_rows(y.ptr, x_d.ptr, w_d.ptr, c.bias.then_some(bias_d.ptr), c.residual.then_some(res_d.ptr), (c.m, c.n, c.k), (part.ptr, done.ptr));
        let kernels = launched(gpu, call);
        let fused_ran = kernels.iter().any(|k| k == "linear_rows_bf16");
        assert_eq!(fused_ran, ops.decode_linear == DecodeLinear::Fused, "m {} n {} k {}: launched {kernels:?}", c.m, c.n, c.k);
        let first = download(gpu, dt, y.ptr, c.m * c.n);
        if fused_ran {
            // The counters are back at zero (a graph replays the launch), and a second launch
            // over them gives the same bits.
            assert!(gpu.to_vec::<u32>(done.ptr, c.n / 16).expect("download").iter().all(|&d| d == 0), "m {} n {} k {}: counters left set", c.m, c.n, c.k);
            call().expect("second launch");
            assert_eq!(download(gpu, dt, y.ptr, c.m * c.n), first, "m {} n {} k {}: a second launch differs", c.m, c.n, c.k);
        }
        outs.push(first);
    }
    // Only the order of summation differs from cuBLASLt's (and where bias and residual join
    // the f32 sum): an ulp of bf16 at most.
    for (i, (a, b)) in outs[0].iter().zip(&outs[1]).enumerate() {
        let bound = a.abs().max(b.abs()) / 128.0 + 1e-6;
        assert!((a - b).abs() <= bound, "m {} n {} k {}: output {i}: linear_rows {a} against cuBLASLt {b}", c.m, c.n, c.k);
    }
    (outs[0].iter().map(|v| v.to_bits()).collect(), splits, err(&outs[0]), err(&outs[1]))
}

#[test]
fn few_rows_linear_matches_f64_and_cublaslt_split_or_not() {
    let cases = [
        RowsCase { m: 1, n: 16, k: 32, bias: false, residual: false },
        // SmolLM2's o_proj and down, with the residual, at a full batch (down's slices of x
        // take 69.6 KB: past the 48 KB a block gets without opting in).
        RowsCase { m: 64, n: 576, k: 576, bias: false, residual: true },
        RowsCase { m: 64, n: 576, k: 1536, bias: false, residual: true },
        // A partial batch over a ragged split (k slices of 96, 96, 96 and 32: 3 steps, an odd
        // count, which pads the rows in shared memory by 64 more bytes).
        RowsCase { m: 37, n: 528, k: 320, bias: false, residual: true },
        // Qwen2's o_proj has no bias; its q/k/v do, so bias is checked on its own shape.
        RowsCase { m: 9, n: 48, k: 2048, bias: true, residual: true },
        RowsCase { m: 17, n: 32, k: 96, bias: true, residual: false },
        // 128 column blocks on the emulator's 132 SMs: one split.
        RowsCase { m: 2, n: 2048, k: 64, bias: false, residual: true },
    ];
    let mut bits = Vec::new();
    let mut splits_seen = std::collections::BTreeSet::new();
    for mirrored in [false, true] {
        set_emulator_schedule_mirrored(mirrored);
        let gpu = Gpu::open(GpuKind::Emulated).expect("emulator");
        let mut these = Vec::new();
        for c in &cases {
            let (b, splits, fused, cublas) = run_rows(&gpu, c);
            eprintln!("m {} n {} k {}: {splits} splits; relative error linear_rows {fused:.2e}, cuBLASLt {cublas:.2e}", c.m, c.n, c.k);
            assert!(fused <= 1e-2 && cublas <= 1e-2, "m {} n {} k {}: relative errors {fused:.2e}, {cublas:.2e}", c.m, c.n, c.k);
            splits_seen.insert(splits);
            these.push(b);
        }
        bits.push(these);
    }
    set_emulator_schedule_mirrored(false);
    assert!(bits[0] == bits[1], "the two thread schedules give different bits (a race)");
    assert!(splits_seen.contains(&1) && splits_seen.iter().any(|&s| s >= 3), "cases should run unsplit and split: {splits_seen:?}");
}

#[test]
fn few_rows_linear_keeps_cublaslt_for_shapes_it_does_not_take() {
    // More than 64 rows, k past 2048 or off the 32-wide steps, n off the 16-column blocks,
    // a misaligned operand, or not chosen: cuBLASLt, with the same result.
    let gpu = Gpu::open(GpuKind::Emulated).expect("emulator");
    let fused = Ops { decode_linear: DecodeLinear::Fused, ..Ops::new(&gpu, DType::Bf16) };
    let plain = Ops::new(&gpu, DType::Bf16);
    for (m, n, k, offset, ops) in [(65, 16, 64, 0, &fused), (4, 16, 2080, 0, &fused), (4, 16, 48, 0, &fused), (4, 24, 64, 0, &fused), (4, 16, 64, 2, &fused), (4, 16, 64, 0, &plain)] {
        let x = gpu.upload_new(&vec![0x3f80u16; m * k + 8], "x").unwrap();
        let w = gpu.upload_new(&vec![0x3f80u16; n * k], "w").unwrap();
        let y = gpu.alloc(2 * m * n, "y", "").unwrap();
        let part = gpu.alloc(1, "part", "").unwrap();
        let done = gpu.alloc(4 * n.div_ceil(16), "done", "").unwrap();
        let xp = reinforge_cuda::DevPtr(x.ptr.0 + offset);
        let kernels = launched(&gpu, || ops.linear_rows(y.ptr, xp, w.ptr, None, None, (m, n, k), (part.ptr, done.ptr)));
        assert!(!kernels.iter().any(|k| k == "linear_rows_bf16"), "m {m} n {n} k {k} offset {offset}: launched {kernels:?}");
        let got = download(&gpu, DType::Bf16, y.ptr, m * n);
        assert!(got.iter().all(|&v| (v - k as f32).abs() <= k as f32 * 1e-2), "m {m} n {n} k {k}: {:?}", &got[..4]);
    }
}
