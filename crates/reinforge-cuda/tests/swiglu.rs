//! SwiGLU's forward and backward kernels (on the emulator) against the same maths in f64 on
//! the host, in f32 and bf16 storage, across what the host splits on: rows of whole 16-byte
//! vectors (moved as vectors), rows that are not (element by element), a pointer that is not
//! 16-byte aligned (element by element although the row is whole vectors), and more rows than
//! a grid's y dimension holds (the kernels stride over the rest).

mod common;
use common::{download, stored};
use rand::{Rng, SeedableRng};
use reinforge_cuda::ops::Ops;
use reinforge_cuda::{DType, Gpu, GpuKind};

/// Largest error relative to the largest reference value.
fn max_rel(got: &[f32], want: &[f64]) -> f64 {
    let scale = want.iter().fold(0f64, |m, w| m.max(w.abs())).max(1e-30);
    got.iter().zip(want).map(|(g, w)| (*g as f64 - w).abs()).fold(0.0, f64::max) / scale
}

/// Forward and backward of `n` rows of width `inter`, every buffer `offset` elements into its
/// allocation.
fn check(gpu: &std::sync::Arc<Gpu>, dt: DType, n: usize, inter: usize, offset: usize) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64((n * 31 + inter * 7 + offset) as u64);
    let mut vals = |k: usize| -> Vec<f32> { (0..k).map(|_| rng.random_range(-3.0f32..3.0)).collect() };
    let (gu, gu_b) = stored(dt, &vals(n * 2 * inter));
    let (dout, dout_b) = stored(dt, &vals(n * inter));
    let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
    let (mut out_ref, mut dgu_ref) = (vec![0f64; n * inter], vec![0f64; n * 2 * inter]);
    for r in 0..n {
        for j in 0..inter {
            let (gi, ui) = (r * 2 * inter + j, r * 2 * inter + inter + j);
            let (g, u, d) = (gu[gi] as f64, gu[ui] as f64, dout[r * inter + j] as f64);
            let s = sig(g);
            out_ref[r * inter + j] = g * s * u;
            dgu_ref[gi] = d * u * s * (1.0 + g * (1.0 - s));
            dgu_ref[ui] = d * g * s;
        }
    }
    let size = dt.size();
    let pad = offset * size;
    let buf = |bytes: &[u8]| {
        let b = gpu.alloc(pad + bytes.len(), "test", "").expect("alloc");
        gpu.upload(b.ptr.add(pad), bytes).expect("upload");
        b
    };
    let (gu_d, dout_d) = (buf(&gu_b), buf(&dout_b));
    let out_d = gpu.alloc(pad + n * inter * size, "out", "").expect("alloc");
    let dgu_d = gpu.alloc(pad + n * 2 * inter * size, "dgu", "").expect("alloc");
    let ops = Ops::new(gpu, dt);
    ops.swiglu(out_d.ptr.add(pad), gu_d.ptr.add(pad), n, inter).expect("forward");
    ops.swiglu_bwd(dgu_d.ptr.add(pad), gu_d.ptr.add(pad), dout_d.ptr.add(pad), n, inter).expect("backward");
    let e_out = max_rel(&download(gpu, dt, out_d.ptr.add(pad), n * inter), &out_ref);
    let e_dgu = max_rel(&download(gpu, dt, dgu_d.ptr.add(pad), n * 2 * inter), &dgu_ref);
    // bf16 output rounds to 8 bits of mantissa: 2⁻⁹ relative, against the largest value.
    let tol = if dt == DType::Bf16 { 4e-3 } else { 1e-6 };
    eprintln!("{dt:?} n {n}, inter {inter}, offset {offset}: out {e_out:.1e}, dgu {e_dgu:.1e}");
    assert!(e_out < tol && e_dgu < tol, "{dt:?} n {n} inter {inter} offset {offset}: out off by {e_out:.2e}, dgu by {e_dgu:.2e}");
}

#[test]
fn swiglu_matches_f64_vectorised_or_not() {
    let gpu = Gpu::open(GpuKind::Emulated).expect("emulator");
    for dt in [DType::F32, DType::Bf16] {
        // Whole 16-byte vectors (4 f32, 8 bf16), over more than one block's columns.
        check(&gpu, dt, 3, 8, 0);
        check(&gpu, dt, 2, 2056, 0);
        // Rows that are not whole vectors in bf16 (12 = 1.5 vectors), and are in f32.
        check(&gpu, dt, 4, 12, 0);
        // Whole vectors, but every pointer one element past 16-byte alignment.
        check(&gpu, dt, 3, 16, 1);
    }
}

#[test]
fn swiglu_covers_rows_past_the_grid() {
    // gridDim.y stops at 65535 rows; a 16 × 4096-token micro-batch is 65536.
    let gpu = Gpu::open(GpuKind::Emulated).expect("emulator");
    check(&gpu, DType::F32, 65_537, 4, 0);
}
