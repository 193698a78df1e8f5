//! RMSNorm's forward and backward kernels (on the emulator) against the same maths in f64 on
//! the host, f32 storage: y, dx (written and accumulated) and dw, summed over rows through
//! the per-block partials and reduce_rows. The shapes cross what the kernels split on: more
//! rows than backward blocks (each block then owns several rows) and a hidden size past what
//! a thread keeps in registers (the rest summed in the partial rows), the forward's two
//! kernels (a warp per row for rows of whole 16-byte vectors up to 2048 f32, else a block per
//! row), the backward's two (16-byte vectors up to 2 per thread, 2048 f32, else element by
//! element), and the gradient norm
//! over more values than its partial-sum blocks cover at once.

use rand::{Rng, SeedableRng};
use reinforge_cuda::ops::Ops;
use reinforge_cuda::{DType, Gpu, GpuKind};

fn max_rel(got: &[f32], want: &[f64]) -> f64 {
    let scale = want.iter().fold(0f64, |m, w| m.max(w.abs())).max(1e-30);
    got.iter().zip(want).map(|(g, w)| (*g as f64 - w).abs()).fold(0.0, f64::max) / scale
}

fn check(n: usize, h: usize) {
    let eps = 1e-6;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64((n * 7919 + h) as u64);
    let mut vals = |k: usize| -> Vec<f32> { (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect() };
    let (x, w, dy, dx0) = (vals(n * h), vals(h), vals(n * h), vals(n * h));

    // f64 reference.
    let mut y_ref = vec![0f64; n * h];
    let mut dx_ref = vec![0f64; n * h];
    let mut dw_ref = vec![0f64; h];
    for r in 0..n {
        let row = &x[r * h..(r + 1) * h];
        let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / h as f64;
        let rs = 1.0 / (ms + eps).sqrt();
        let mut dot = 0.0;
        for i in 0..h {
            let xh = row[i] as f64 * rs;
            y_ref[r * h + i] = w[i] as f64 * xh;
            dot += dy[r * h + i] as f64 * w[i] as f64 * xh;
            dw_ref[i] += dy[r * h + i] as f64 * xh;
        }
        let mean = dot / h as f64;
        for i in 0..h {
            let xh = row[i] as f64 * rs;
            dx_ref[r * h + i] = rs * (dy[r * h + i] as f64 * w[i] as f64 - xh * mean);
        }
    }

    let gpu = Gpu::open(GpuKind::Emulated).expect("emulator");
    let ops = Ops::new(&gpu, DType::F32);
    let up = |v: &[f32]| gpu.upload_new(v, "test").expect("upload");
    let (x_d, w_d, dy_d) = (up(&x), up(&w), up(&dy));
    let y_d = gpu.alloc(n * h * 4, "y", "").expect("alloc");
    let rstd_d = gpu.alloc(n * 4, "rstd", "").expect("alloc");
    ops.rmsnorm(y_d.ptr, rstd_d.ptr, x_d.ptr, w_d.ptr, n, h, eps).expect("forward");
    let part = gpu.alloc(Ops::norm_parts(n) * h * 4, "parts", "").expect("alloc");
    // dx written, then accumulated onto dx0; dw accumulates onto 0.5.
    let dx_d = gpu.alloc(n * h * 4, "dx", "").expect("alloc");
    let dw_d = up(&vec![0.5f32; h]);
    ops.rmsnorm_bwd(dx_d.ptr, Some(dw_d.ptr), part.ptr, dy_d.ptr, x_d.ptr, w_d.ptr, rstd_d.ptr, n, h, false).expect("backward");
    let dx_acc = up(&dx0);
    ops.rmsnorm_bwd(dx_acc.ptr, Some(dw_d.ptr), part.ptr, dy_d.ptr, x_d.ptr, w_d.ptr, rstd_d.ptr, n, h, true).expect("backward");

    let got = |p, k| gpu.to_vec::<f32>(p, k).expect("download");
    let e_y = max_rel(&got(y_d.ptr, n * h), &y_ref);
    let e_dx = max_rel(&got(dx_d.ptr, n * h), &dx_ref);
    let dx_acc_ref: Vec<f64> = dx_ref.iter().zip(&dx0).map(|(a, b)| a + *b as f64).collect();
    let e_acc = max_rel(&got(dx_acc.ptr, n * h), &dx_acc_ref);
    let dw_want: Vec<f64> = dw_ref.iter().map(|d| 0.5 + 2.0 * d).collect();
    let e_dw = max_rel(&got(dw_d.ptr, h), &dw_want);
    eprintln!("n {n}, h {h}: y {e_y:.1e}, dx {e_dx:.1e}, dx accumulated {e_acc:.1e}, dw {e_dw:.1e}");
    for (what, e) in [("y", e_y), ("dx", e_dx), ("dx accumulated", e_acc), ("dw", e_dw)] {
        assert!(e < 1e-5, "n {n}, h {h}: {what} off by {e:.2e}");
    }
}

#[test]
fn rmsnorm_matches_f64_in_every_split() {
    // The forward's warp-per-row kernel: a lane with one vector, one lane idle; and rows at
    // its widest (16 vectors per lane).
    check(5, 64);
    check(3, 36);
    check(6, 2048);
    // More rows than backward blocks (512), and rows wider than a thread's registers hold
    // (8 · 256 columns), which the forward's block-per-row kernel takes.
    check(700, 96);
    check(520, 2100);
    // Rows not of whole 16-byte vectors: the block-per-row forward, the element backward
    // (as for 2100, 525 vectors, past the vector backward's 512).
    check(4, 90);
}

#[test]
fn gradient_norm_sums_every_value() {
    let gpu = Gpu::open(GpuKind::Emulated).expect("emulator");
    let ops = Ops::new(&gpu, DType::F32);
    // More values than the partial-sum blocks' threads cover in one sweep (1024 × 256).
    let n = 300_001;
    let x: Vec<f32> = (0..n).map(|i| ((i % 97) as f32 - 48.0) / 50.0).collect();
    let want: f64 = x.iter().map(|&v| (v as f64).powi(2)).sum();
    let x_d = gpu.upload_new(&x, "x").expect("upload");
    let scratch = gpu.alloc(Ops::sum_sq_scratch() * 4, "scratch", "").expect("alloc");
    let got = ops.sum_sq(x_d.ptr, n, scratch.ptr).expect("sumsq");
    assert!((got - want).abs() / want < 1e-5, "Σx² {got} vs {want}");
}
