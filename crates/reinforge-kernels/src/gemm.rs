//! General f32 matrix multiply for the training step: `C[m, n] (+)= A[m, k] · B[k, n]`, with
//! `A` and `B` strided views (a transposed operand is a view, never a copy).
//!
//! Why ours and not the `gemm` crate the tensor library uses: that crate picks its vector path
//! with `is_x86_feature_detected!` inside, so a machine with AVX-512 cannot run (test, or
//! benchmark against PyTorch) the AVX2 path users without AVX-512 get; and on AVX2 its f32
//! micro-kernel was the training step's bottleneck. Here the path is [`Isa::active`] like the
//! rest of this crate, and each path has a micro-kernel sized to its register file.
//!
//! The structure is BLIS's: `B` is packed per `KC × NC` block into column panels of `NR`
//! (shared by the threads), each thread packs its `MC × KC` block of `A` into row panels of
//! `MR`, and a micro-kernel keeps an `MR × NR` tile of `C` in registers while it streams one
//! panel of each. Every element of `C` is summed in one fixed order (over `k`, block by block),
//! whatever `m`, the thread count or the split: results are reproducible run to run, and a row
//! does not depend on which other rows share the call.

use crate::matmul::Isa;
use crate::SendPtr;
use rayon::prelude::*;
use std::cell::RefCell;

/// A read-only strided matrix: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a> View<'a> {
    /// A row-major `[rows, cols]` matrix.
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self::strided(data, rows, cols, cols, 1)
    }

    /// A matrix with the given row and column strides (elements).
    pub fn strided(data: &'a [f32], rows: usize, cols: usize, rs: usize, cs: usize) -> Self {
        if rows > 0 && cols > 0 {
            let last = (rows - 1) * rs + (cols - 1) * cs;
            assert!(last < data.len(), "gemm: a [{rows}, {cols}] view with strides ({rs}, {cs}) needs {} values, has {}", last + 1, data.len());
        }
        View { data, rows, cols, rs, cs }
    }

    /// The transpose (a view of the same values).
    pub fn t(self) -> Self {
        View { rows: self.cols, cols: self.rows, rs: self.cs, cs: self.rs, ..self }
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The values the view reads.
    pub fn data(&self) -> &'a [f32] {
        self.data
    }

    /// Row stride (elements).
    pub fn rs(&self) -> usize {
        self.rs
    }

    /// Column stride (elements).
    pub fn cs(&self) -> usize {
        self.cs
    }

    #[inline(always)]
    fn at(&self, i: usize, j: usize) -> f32 {
        self.data[i * self.rs + j * self.cs]
    }
}

/// Register tile (rows × columns of `C`) of each path's micro-kernel: the blocking and the
/// kernels read these, so they cannot disagree.
const AVX512_TILE: (usize, usize) = (12, 32);
const AVX2_TILE: (usize, usize) = (6, 16);
const GENERIC_TILE: (usize, usize) = (4, 16);
/// The most rows any tile has ([`pack_a`] gathers that many row streams at once).
const MAX_MR: usize = 12;

/// Block sizes of one path.
#[derive(Debug, Clone, Copy)]
struct Blocking {
    /// Rows of the register tile.
    mr: usize,
    /// Columns of the register tile.
    nr: usize,
    /// Depth of one packed block: a `KC × NR` panel of `B` stays near the core while the
    /// tiles of a row block stream past it. (Sizes chosen by `examples/gemm_bench.rs` on the
    /// training step's shapes: deeper blocks mean fewer passes over `C`.)
    kc: usize,
    /// Rows of `A` one thread packs at a time (in L2); small, so the row blocks split evenly
    /// over the threads.
    mc: usize,
    /// Columns of `B` packed at a time (shared by the threads).
    nc: usize,
}

impl Blocking {
    /// The blocking shrunk to split `k` into equal depths (576 = 2 × 288, not 256 + 256 + 64:
    /// a thin last block pays the tile loads and stores for little arithmetic) and `m` into a
    /// multiple of `threads` row blocks (15 blocks on 2 threads idle one thread for a block).
    fn fit(self, m: usize, k: usize, threads: usize) -> Blocking {
        let kc = k.div_ceil(k.div_ceil(self.kc));
        let blocks = m.div_ceil(self.mc).next_multiple_of(threads.max(1));
        let mc = m.div_ceil(blocks).next_multiple_of(self.mr).min(self.mc);
        Blocking { kc, mc, ..self }
    }

    fn of(isa: Isa) -> Blocking {
        match isa {
            // 12 × 2 ZMM accumulators + 2 panel vectors + a broadcast: 27 of 32 registers.
            Isa::Avx512 => Blocking { mr: AVX512_TILE.0, nr: AVX512_TILE.1, kc: 512, mc: 96, nc: 3072 },
            // 6 × 2 YMM accumulators + 2 panel vectors + a broadcast: 15 of 16 registers.
            Isa::Avx2Fma => Blocking { mr: AVX2_TILE.0, nr: AVX2_TILE.1, kc: 384, mc: 48, nc: 3072 },
            Isa::Generic => Blocking { mr: GENERIC_TILE.0, nr: GENERIC_TILE.1, kc: 256, mc: 64, nc: 3072 },
        }
    }
}

/// `c[m, n] = a · b`, or `c += a · b` when `accumulate`; `c` is row-major with row stride `ldc`.
pub fn gemm(a: View<'_>, b: View<'_>, c: &mut [f32], ldc: usize, accumulate: bool) {
    gemm_with(Isa::active(), a, b, c, ldc, accumulate)
}

/// [`gemm`] on a chosen instruction set (tests compare them).
pub fn gemm_with(isa: Isa, a: View<'_>, b: View<'_>, c: &mut [f32], ldc: usize, accumulate: bool) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "gemm: [{m}, {k}] · [{}, {n}]", b.rows);
    assert!(ldc >= n, "gemm: row stride {ldc} below {n} columns");
    if m == 0 || n == 0 {
        return;
    }
    assert!(c.len() >= (m - 1) * ldc + n, "gemm: c has {} values for [{m}, {n}] with stride {ldc}", c.len());
    if k == 0 {
        if !accumulate {
            for row in c.chunks_mut(ldc).take(m) {
                row[..n].fill(0.0);
            }
        }
        return;
    }
    let threads = if m * n * k < (1 << 20) { 1 } else { rayon::current_num_threads() };
    let bl = Blocking::of(isa).fit(m, k, threads);
    let c_ptr = SendPtr(c.as_mut_ptr());
    let mut packed_b = Vec::new();
    for jc in (0..n).step_by(bl.nc) {
        let nc = bl.nc.min(n - jc);
        let panels = nc.div_ceil(bl.nr);
        for pc in (0..k).step_by(bl.kc) {
            let kc = bl.kc.min(k - pc);
            packed_b.clear();
            packed_b.resize(panels * kc * bl.nr, 0.0);
            let pack = |(p, dst): (usize, &mut [f32])| pack_b(&b, pc, kc, jc + p * bl.nr, bl.nr.min(nc - p * bl.nr), bl.nr, dst);
            if threads > 1 {
                packed_b.par_chunks_mut(kc * bl.nr).enumerate().for_each(pack);
            } else {
                packed_b.chunks_mut(kc * bl.nr).enumerate().for_each(pack);
            }
            let load = accumulate || pc > 0;
            let row_blocks = m.div_ceil(bl.mc);
            // Too few row blocks to keep every thread busy: split the panels too (each task
            // then packs its row block itself, a small cost next to its share of the multiply).
            let groups = if threads > 1 { (2 * threads).div_ceil(row_blocks).min(panels) } else { 1 };
            let per_group = panels.div_ceil(groups);
            let task = |t: usize| {
                let (ib, g) = (t / groups, t % groups);
                let (ic, mc) = (ib * bl.mc, bl.mc.min(m - ib * bl.mc));
                let (p0, p1) = (g * per_group, ((g + 1) * per_group).min(panels));
                PACKED_A.with(|buf| {
                    let mut buf = buf.borrow_mut();
                    let row_panels = mc.div_ceil(bl.mr);
                    buf.clear();
                    buf.resize(row_panels * kc * bl.mr, 0.0);
                    for (r, dst) in buf.chunks_mut(kc * bl.mr).enumerate() {
                        pack_a(&a, ic + r * bl.mr, bl.mr.min(mc - r * bl.mr), pc, kc, bl.mr, dst);
                    }
                    for p in p0..p1 {
                        let (j, cols) = (jc + p * bl.nr, bl.nr.min(nc - p * bl.nr));
                        let bp = &packed_b[p * kc * bl.nr..(p + 1) * kc * bl.nr];
                        for r in 0..row_panels {
                            let (i, rows) = (ic + r * bl.mr, bl.mr.min(mc - r * bl.mr));
                            let ap = &buf[r * kc * bl.mr..(r + 1) * kc * bl.mr];
                            // SAFETY: this tile is rows i..i+rows, columns j..j+cols of `c`
                            // (inside it: checked above); tasks cover disjoint tiles.
                            unsafe { micro(isa, kc, ap, bp, c_ptr.get().add(i * ldc + j), ldc, rows, cols, load) };
                        }
                    }
                });
            };
            let tasks = row_blocks * groups;
            if threads > 1 {
                (0..tasks).into_par_iter().for_each(task);
            } else {
                (0..tasks).for_each(task);
            }
        }
    }
}

thread_local! {
    /// Each thread's packed block of `A`, reused across calls.
    static PACKED_A: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Packs `B[pc..pc+kc, j..j+cols]` as `kc` rows of `nr` floats (zero past `cols`).
fn pack_b(b: &View<'_>, pc: usize, kc: usize, j: usize, cols: usize, nr: usize, dst: &mut [f32]) {
    if b.cs == 1 {
        for kk in 0..kc {
            let src = &b.data[(pc + kk) * b.rs + j..][..cols];
            dst[kk * nr..kk * nr + cols].copy_from_slice(src);
        }
    } else if b.rs == 1 {
        // A transpose (the backward's `Wᵀ`): each column is a contiguous run.
        for jj in 0..cols {
            let src = &b.data[(j + jj) * b.cs + pc..][..kc];
            for (d, &v) in dst.iter_mut().skip(jj).step_by(nr).zip(src) {
                *d = v;
            }
        }
    } else {
        for jj in 0..cols {
            for kk in 0..kc {
                dst[kk * nr + jj] = b.at(pc + kk, j + jj);
            }
        }
    }
}

/// Packs `A[i..i+rows, pc..pc+kc]` as `kc` columns of `mr` floats (zero past `rows`).
fn pack_a(a: &View<'_>, i: usize, rows: usize, pc: usize, kc: usize, mr: usize, dst: &mut [f32]) {
    if a.cs == 1 && rows == mr {
        // Whole panel of row-major rows: gather one column of `mr` values at a time, so the
        // writes are contiguous and the reads are `mr` sequential streams.
        let row = |r: usize| &a.data[(i + r) * a.rs + pc..][..kc];
        let srcs: [&[f32]; MAX_MR] = std::array::from_fn(|r| if r < mr { row(r) } else { &[][..] });
        for (kk, col) in dst.chunks_exact_mut(mr).take(kc).enumerate() {
            for (d, src) in col.iter_mut().zip(&srcs) {
                *d = src[kk];
            }
        }
    } else if a.cs == 1 {
        for r in 0..rows {
            let src = &a.data[(i + r) * a.rs + pc..][..kc];
            for (kk, &v) in src.iter().enumerate() {
                dst[kk * mr + r] = v;
            }
        }
    } else if a.rs == 1 {
        // A transpose (the backward's `xᵀ`): each packed column is a contiguous run.
        for (kk, col) in dst.chunks_exact_mut(mr).take(kc).enumerate() {
            col[..rows].copy_from_slice(&a.data[(pc + kk) * a.cs + i..][..rows]);
        }
    } else {
        for kk in 0..kc {
            for r in 0..rows {
                dst[kk * mr + r] = a.at(i + r, pc + kk);
            }
        }
    }
}

/// One register tile: `C[rows, cols] (+)= Apanel · Bpanel`.
///
/// # Safety
/// `c` must be valid for `rows` rows of stride `ldc` and `cols` columns; the panels hold
/// `kc · MR` and `kc · NR` floats of the path's blocking.
#[allow(clippy::too_many_arguments)]
unsafe fn micro(isa: Isa, kc: usize, a: &[f32], b: &[f32], c: *mut f32, ldc: usize, rows: usize, cols: usize, load: bool) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => micro_avx512(kc, a.as_ptr(), b.as_ptr(), c, ldc, rows, cols, load),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma => micro_avx2(kc, a.as_ptr(), b.as_ptr(), c, ldc, rows, cols, load),
        _ => micro_generic(kc, a, b, c, ldc, rows, cols, load),
    }
}

/// Writes a finished tile: straight into `c` when it is whole, else the valid corner.
///
/// # Safety
/// As [`micro`]; `tile` is `MR × NR` row-major.
#[inline(always)]
unsafe fn store<const MR: usize, const NR: usize>(tile: &[[f32; NR]; MR], c: *mut f32, ldc: usize, rows: usize, cols: usize, load: bool) {
    for (r, row) in tile.iter().enumerate().take(rows) {
        let dst = c.add(r * ldc);
        for (j, &v) in row.iter().enumerate().take(cols) {
            *dst.add(j) = if load { *dst.add(j) + v } else { v };
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn micro_avx512(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, rows: usize, cols: usize, load: bool) {
    use std::arch::x86_64::*;
    const MR: usize = AVX512_TILE.0;
    const NR: usize = AVX512_TILE.1;
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    for kk in 0..kc {
        let b0 = _mm512_loadu_ps(b.add(kk * NR));
        let b1 = _mm512_loadu_ps(b.add(kk * NR + 16));
        for (r, acc) in acc.iter_mut().enumerate() {
            let av = _mm512_set1_ps(*a.add(kk * MR + r));
            acc[0] = _mm512_fmadd_ps(av, b0, acc[0]);
            acc[1] = _mm512_fmadd_ps(av, b1, acc[1]);
        }
    }
    if rows == MR && cols == NR {
        for (r, acc) in acc.iter().enumerate() {
            let dst = c.add(r * ldc);
            let (mut v0, mut v1) = (acc[0], acc[1]);
            if load {
                v0 = _mm512_add_ps(_mm512_loadu_ps(dst), v0);
                v1 = _mm512_add_ps(_mm512_loadu_ps(dst.add(16)), v1);
            }
            _mm512_storeu_ps(dst, v0);
            _mm512_storeu_ps(dst.add(16), v1);
        }
    } else {
        let mut tile = [[0f32; NR]; MR];
        for (t, acc) in tile.iter_mut().zip(&acc) {
            _mm512_storeu_ps(t.as_mut_ptr(), acc[0]);
            _mm512_storeu_ps(t.as_mut_ptr().add(16), acc[1]);
        }
        store(&tile, c, ldc, rows, cols, load);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn micro_avx2(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, rows: usize, cols: usize, load: bool) {
    use std::arch::x86_64::*;
    const MR: usize = AVX2_TILE.0;
    const NR: usize = AVX2_TILE.1;
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    for kk in 0..kc {
        let b0 = _mm256_loadu_ps(b.add(kk * NR));
        let b1 = _mm256_loadu_ps(b.add(kk * NR + 8));
        for (r, acc) in acc.iter_mut().enumerate() {
            let av = _mm256_broadcast_ss(&*a.add(kk * MR + r));
            acc[0] = _mm256_fmadd_ps(av, b0, acc[0]);
            acc[1] = _mm256_fmadd_ps(av, b1, acc[1]);
        }
    }
    if rows == MR && cols == NR {
        for (r, acc) in acc.iter().enumerate() {
            let dst = c.add(r * ldc);
            let (mut v0, mut v1) = (acc[0], acc[1]);
            if load {
                v0 = _mm256_add_ps(_mm256_loadu_ps(dst), v0);
                v1 = _mm256_add_ps(_mm256_loadu_ps(dst.add(8)), v1);
            }
            _mm256_storeu_ps(dst, v0);
            _mm256_storeu_ps(dst.add(8), v1);
        }
    } else {
        let mut tile = [[0f32; NR]; MR];
        for (t, acc) in tile.iter_mut().zip(&acc) {
            _mm256_storeu_ps(t.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(t.as_mut_ptr().add(8), acc[1]);
        }
        store(&tile, c, ldc, rows, cols, load);
    }
}

#[allow(clippy::too_many_arguments)]
unsafe fn micro_generic(kc: usize, a: &[f32], b: &[f32], c: *mut f32, ldc: usize, rows: usize, cols: usize, load: bool) {
    const MR: usize = GENERIC_TILE.0;
    const NR: usize = GENERIC_TILE.1;
    let mut tile = [[0f32; NR]; MR];
    for kk in 0..kc {
        let brow = &b[kk * NR..(kk + 1) * NR];
        for (r, t) in tile.iter_mut().enumerate() {
            let av = a[kk * MR + r];
            for (s, &bv) in t.iter_mut().zip(brow) {
                *s += av * bv;
            }
        }
    }
    store(&tile, c, ldc, rows, cols, load);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_values as values;

    fn naive(a: &View<'_>, b: &View<'_>) -> Vec<f64> {
        let (m, k, n) = (a.rows, a.cols, b.cols);
        let mut out = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k).map(|kk| a.at(i, kk) as f64 * b.at(kk, j) as f64).sum();
            }
        }
        out
    }

    #[test]
    fn every_path_and_layout_matches_a_float64_reference() {
        // Shapes around every block edge: tiles (6/12 × 16/32), KC = 256, row blocks, a
        // product large enough to go parallel.
        let shapes = [(1, 1, 1), (5, 17, 3), (13, 33, 257), (97, 70, 300), (145, 65, 513), (300, 200, 40), (7, 3100, 20)];
        for &(m, n, k) in &shapes {
            let (av, bv, init) = (values(m * k, 1), values(k * n, 2), values(m * n, 3));
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let a = if ta { View::row_major(&av, k, m).t() } else { View::row_major(&av, m, k) };
                let b = if tb { View::row_major(&bv, n, k).t() } else { View::row_major(&bv, k, n) };
                let want = naive(&a, &b);
                for isa in Isa::available() {
                    for accumulate in [false, true] {
                        let mut c = if accumulate { init.clone() } else { vec![f32::NAN; m * n] };
                        gemm_with(isa, a, b, &mut c, n, accumulate);
                        for (i, (&got, &w)) in c.iter().zip(&want).enumerate() {
                            let w = w + if accumulate { init[i] as f64 } else { 0.0 };
                            let tol = 2e-6 * (k as f64).sqrt() * (1.0 + w.abs());
                            assert!((got as f64 - w).abs() < tol, "{isa:?} {m}×{k}·{k}×{n} ta={ta} tb={tb} acc={accumulate} [{i}]: {got} vs {w}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_row_does_not_depend_on_its_batch_mates_or_the_split() {
        let (m, n, k) = (300, 96, 600);
        let (av, bv) = (values(m * k, 4), values(k * n, 5));
        let b = View::row_major(&bv, k, n);
        for isa in Isa::available() {
            let mut all = vec![0f32; m * n];
            gemm_with(isa, View::row_major(&av, m, k), b, &mut all, n, false);
            for i in [0, 7, 150, 299] {
                let mut one = vec![0f32; n];
                gemm_with(isa, View::row_major(&av[i * k..(i + 1) * k], 1, k), b, &mut one, n, false);
                assert_eq!(one, all[i * n..(i + 1) * n], "{isa:?} row {i}");
            }
        }
    }

    #[test]
    fn a_strided_output_leaves_the_gaps_alone_and_k_zero_clears() {
        let (m, n, k, ldc) = (20, 40, 30, 50);
        let (av, bv) = (values(m * k, 6), values(k * n, 7));
        let mut c = vec![9f32; m * ldc];
        gemm(View::row_major(&av, m, k), View::row_major(&bv, k, n), &mut c, ldc, false);
        assert!(c.chunks(ldc).all(|r| r[n..].iter().all(|&v| v == 9.0)));
        gemm(View::row_major(&[], m, 0), View::row_major(&[], 0, n), &mut c, ldc, false);
        assert!(c.chunks(ldc).all(|r| r[..n].iter().all(|&v| v == 0.0) && r[n..].iter().all(|&v| v == 9.0)));
    }
}
