//! GFLOPS of this crate's GEMM on every path this CPU has, next to the `gemm` crate (what the
//! tensor library calls), on the training step's shapes (SmolLM2-135M, 8 × 256 tokens):
//! `cargo run --release -p reinforge-kernels --example gemm_bench`.

use reinforge_kernels::gemm::{gemm_with, View};
use reinforge_kernels::Isa;
use std::time::Instant;

fn best_of(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let rows = 2048;
    // (what, m, k, n, a transposed, b transposed)
    let cases = [
        ("fwd x·W q/o", rows, 576, 576, false, false),
        ("fwd x·W gate_up", rows, 576, 3072, false, false),
        ("fwd x·W down", rows, 1536, 576, false, false),
        ("bwd dY·Wᵀ gate_up", rows, 3072, 576, false, true),
        ("bwd Xᵀ·dY gate_up", 576, rows, 3072, true, false),
        ("bwd Xᵀ·dY down", 1536, rows, 576, true, false),
    ];
    println!("cpu paths: {:?}, threads {}", Isa::available(), rayon::current_num_threads());
    for (what, m, k, n, ta, tb) in cases {
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 13.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 11.0).collect();
        let av = if ta { View::row_major(&a, k, m).t() } else { View::row_major(&a, m, k) };
        let bv = if tb { View::row_major(&b, n, k).t() } else { View::row_major(&b, k, n) };
        let mut c = vec![0f32; m * n];
        let flops = 2.0 * (m * k * n) as f64;
        let mut line = format!("{what:20} [{m}×{k}]·[{k}×{n}]");
        for isa in Isa::available() {
            let s = best_of(5, || gemm_with(isa, av, bv, &mut c, n, false));
            line += &format!("  ours {} {:6.1}", isa.name(), flops / s / 1e9);
        }
        let (a_rs, a_cs) = if ta { (1, m) } else { (k, 1) };
        let (b_rs, b_cs) = if tb { (1, k) } else { (n, 1) };
        let s = best_of(5, || unsafe {
            gemm::gemm(m, n, k, c.as_mut_ptr(), 1, n as isize, false, a.as_ptr(), a_cs as isize, a_rs as isize, b.as_ptr(), b_cs as isize, b_rs as isize, 1.0, 1.0, false, false, false, gemm::Parallelism::Rayon(0))
        });
        line += &format!("  gemm-crate {:6.1} GFLOPS", flops / s / 1e9);
        println!("{line}");
    }
}
