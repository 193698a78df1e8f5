//! `out[m, n] (+)= x[m, k] · W[k, n] + bias` with `W` packed once into column panels.
//!
//! Layout: `W` is cut into panels of [`NR`] output columns; panel `p` holds `k` rows of
//! `NR` contiguous floats (the last panel zero-padded). A micro-kernel keeps `MR × NR`
//! accumulators in registers and streams one panel row per step of `k`, so each weight is read
//! from memory once per call whatever `m` is. Every output element is one sequential sum over
//! `k`, so results do not depend on `m`, on the thread split, or on which other rows share the
//! call: a sequence generates the same tokens alone or in a batch.

use crate::SendPtr;
use rayon::prelude::*;
use std::sync::OnceLock;

/// Output columns per packed panel (two 512-bit registers of f32).
pub const NR: usize = 32;
/// Rows per micro-kernel call.
const MR: usize = 8;

/// The instruction set the kernels run with: the best this CPU has, or the one
/// `REINFORGE_ISA` names (to test and benchmark every path a machine supports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512F (x86-64-v4).
    Avx512,
    /// AVX2 + FMA (x86-64-v3).
    Avx2Fma,
    /// Portable Rust, whatever the compiler vectorises.
    Generic,
}

/// The environment variable that forces a path: `avx512`, `avx2` or `portable`.
pub const ISA_ENV: &str = "REINFORGE_ISA";

thread_local! {
    /// [`Isa::with`]'s override for the calling thread.
    static FORCED: std::cell::Cell<Option<Isa>> = const { std::cell::Cell::new(None) };
}

impl Isa {
    /// The best instruction set this CPU supports.
    pub fn detect() -> Isa {
        static ISA: OnceLock<Isa> = OnceLock::new();
        *ISA.get_or_init(|| Isa::available()[0])
    }

    /// Every path this CPU can run, best first (the portable one always).
    pub fn available() -> Vec<Isa> {
        let mut v = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") {
                v.push(Isa::Avx512);
            }
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                v.push(Isa::Avx2Fma);
            }
        }
        v.push(Isa::Generic);
        v
    }

    /// The path the kernels take: [`Isa::with`]'s override on this thread, else `REINFORGE_ISA`
    /// when it names a path this CPU has, else the best one. (`reinforge` checks the variable
    /// at start-up with [`Isa::from_env`] and refuses a bad value, so nothing falls back silently.)
    pub fn active() -> Isa {
        if let Some(isa) = FORCED.with(|f| f.get()) {
            return isa;
        }
        static ISA: OnceLock<Isa> = OnceLock::new();
        *ISA.get_or_init(|| Isa::from_env().ok().flatten().unwrap_or_else(Isa::detect))
    }

    /// What `REINFORGE_ISA` asks for: `Ok(None)` when unset or empty, an error for an unknown
    /// name or a path this CPU lacks.
    pub fn from_env() -> Result<Option<Isa>, String> {
        match std::env::var(ISA_ENV) {
            Ok(v) if !v.trim().is_empty() => Isa::parse_for_this_cpu(v.trim()).map(Some),
            _ => Ok(None),
        }
    }

    /// Parses a path's name and checks that this CPU can run it.
    pub fn parse_for_this_cpu(name: &str) -> Result<Isa, String> {
        let have: Vec<&str> = Isa::available().iter().map(|i| i.name()).collect();
        let isa = match name.to_ascii_lowercase().as_str() {
            "avx512" | "avx-512" => Isa::Avx512,
            "avx2" => Isa::Avx2Fma,
            "portable" | "generic" => Isa::Generic,
            _ => return Err(format!("{ISA_ENV}={name}: unknown path; use one of {} (this CPU's)", have.join(", "))),
        };
        if !Isa::available().contains(&isa) {
            return Err(format!("{ISA_ENV}={name}: this CPU cannot run the {} path; it has {}", isa.name(), have.join(", ")));
        }
        Ok(isa)
    }

    /// `avx512`, `avx2` or `portable`: the names `REINFORGE_ISA` takes and benchmarks print.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2Fma => "avx2",
            Isa::Generic => "portable",
        }
    }

    /// Runs `f` with the kernels called on this thread taking `isa` (which the CPU must have):
    /// for tests that check every path against a reference in one process.
    pub fn with<R>(isa: Isa, f: impl FnOnce() -> R) -> R {
        assert!(Isa::available().contains(&isa), "{isa:?} is not available on this CPU");
        let before = FORCED.with(|c| c.replace(Some(isa)));
        let out = f();
        FORCED.with(|c| c.set(before));
        out
    }
}

/// A weight matrix `[k, n]` packed for [`PackedMatrix::matmul`], with an optional bias `[n]`.
#[derive(Debug, Clone, Default)]
pub struct PackedMatrix {
    k: usize,
    n: usize,
    panels: Vec<f32>,
    bias: Option<Vec<f32>>,
}

impl PackedMatrix {
    /// Packs (or re-packs in place, reusing the buffer: the rollout engine's weight update)
    /// the matrix `[k, Σ nᵢ]` whose column blocks are given as `[k, nᵢ]` row-major slices,
    /// e.g. the q, k and v projections side by side as one fused projection.
    pub fn repack_in_out(&mut self, k: usize, blocks: &[(&[f32], usize)], bias: Option<&[f32]>) {
        let n: usize = blocks.iter().map(|b| b.1).sum();
        for (i, (data, w)) in blocks.iter().enumerate() {
            assert_eq!(data.len(), k * w, "packed matrix: block {i} has {} values for [{k}, {w}]", data.len());
        }
        if let Some(b) = bias {
            assert_eq!(b.len(), n, "packed matrix: bias of {} for {n} outputs", b.len());
        }
        // Each panel is a few runs of contiguous columns, each from one block: copy runs.
        let mut starts = Vec::with_capacity(blocks.len());
        let mut at = 0;
        for b in blocks {
            starts.push(at);
            at += b.1;
        }
        self.k = k;
        self.n = n;
        self.panels.clear();
        self.panels.resize(n.div_ceil(NR) * k * NR, 0.0);
        self.panels.par_chunks_mut(k * NR).enumerate().for_each(|(p, dst)| {
            let (lo, hi) = (p * NR, (p * NR + NR).min(n));
            for (&(data, w), &start) in blocks.iter().zip(&starts) {
                let (a, b) = (lo.max(start), hi.min(start + w));
                if a >= b {
                    continue;
                }
                for kk in 0..k {
                    dst[kk * NR + a - lo..kk * NR + b - lo].copy_from_slice(&data[kk * w + a - start..kk * w + b - start]);
                }
            }
        });
        match (bias, &mut self.bias) {
            (Some(b), Some(dst)) => {
                dst.clear();
                dst.extend_from_slice(b);
            }
            (Some(b), slot) => *slot = Some(b.to_vec()),
            (None, slot) => *slot = None,
        }
    }

    /// Copies column `c` (the `k` weights feeding output `c`) into `out`: with a tied LM head,
    /// this is token `c`'s embedding.
    pub fn column(&self, c: usize, out: &mut [f32]) {
        assert!(c < self.n && out.len() == self.k, "packed matrix: column {c} of {}", self.n);
        let panel = &self.panels[(c / NR) * self.k * NR..];
        for (kk, o) in out.iter_mut().enumerate() {
            *o = panel[kk * NR + c % NR];
        }
    }

    /// Input width `k`.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Output width `n`.
    pub fn n(&self) -> usize {
        self.n
    }

    /// `out[m, n] = x[m, k] · W + bias`, or `out += …` when `accumulate` (a residual add).
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32], accumulate: bool) {
        self.matmul_with(Isa::active(), x, m, out, accumulate)
    }

    /// [`PackedMatrix::matmul`] on a chosen instruction set (tests compare them).
    pub fn matmul_with(&self, isa: Isa, x: &[f32], m: usize, out: &mut [f32], accumulate: bool) {
        assert!(x.len() >= m * self.k, "matmul: x has {} values, need {m}×{}", x.len(), self.k);
        assert!(out.len() >= m * self.n, "matmul: out has {} values, need {m}×{}", out.len(), self.n);
        if m == 0 || self.n == 0 {
            return;
        }
        let np = self.n.div_ceil(NR);
        let out_ptr = SendPtr(out.as_mut_ptr());
        let run = |p: usize| {
            let cols = NR.min(self.n - p * NR);
            let panel = &self.panels[p * self.k * NR..(p + 1) * self.k * NR];
            let bias = self.bias.as_ref().map(|b| &b[p * NR..p * NR + cols]);
            let mut r0 = 0;
            while r0 < m {
                let rows = MR.min(m - r0);
                let tile = Tile {
                    k: self.k,
                    x: &x[r0 * self.k..(r0 + rows) * self.k],
                    panel,
                    bias,
                    cols,
                    accumulate,
                };
                // SAFETY: this call writes rows r0..r0+rows, columns p*NR..p*NR+cols of `out`;
                // no other panel or row block touches them, and `out` outlives the call.
                unsafe { tile.run(isa, rows, out_ptr.get().add(r0 * self.n + p * NR), self.n) };
                r0 += rows;
            }
        };
        // Below ~1 MFLOP a thread hand-off costs more than it saves.
        if m * self.k * self.n < (1 << 19) || rayon::current_num_threads() == 1 {
            (0..np).for_each(run);
        } else {
            (0..np).into_par_iter().with_min_len(2).for_each(run);
        }
    }
}

/// One micro-kernel's operands: up to `MR` rows of `x` against one panel.
struct Tile<'a> {
    k: usize,
    x: &'a [f32],
    panel: &'a [f32],
    bias: Option<&'a [f32]>,
    cols: usize,
    accumulate: bool,
}

impl Tile<'_> {
    /// # Safety
    /// `out` must be valid for `rows` rows of stride `ldo` and `self.cols` columns.
    unsafe fn run(&self, isa: Isa, rows: usize, out: *mut f32, ldo: usize) {
        macro_rules! by_rows {
            ($f:ident) => {
                match rows {
                    1 => $f::<1>(self, out, ldo),
                    2 => $f::<2>(self, out, ldo),
                    3 => $f::<3>(self, out, ldo),
                    4 => $f::<4>(self, out, ldo),
                    5 => $f::<5>(self, out, ldo),
                    6 => $f::<6>(self, out, ldo),
                    7 => $f::<7>(self, out, ldo),
                    _ => $f::<8>(self, out, ldo),
                }
            };
        }
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => by_rows!(tile_avx512),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2Fma => by_rows!(tile_avx2),
            _ => by_rows!(tile_generic),
        }
    }

    /// Adds bias and (when accumulating) the old output to one row of sums, then stores it.
    ///
    /// # Safety
    /// `out` must be valid for `self.cols` floats.
    #[inline(always)]
    unsafe fn store_row(&self, sums: &[f32; NR], out: *mut f32) {
        for (j, &s) in sums.iter().enumerate().take(self.cols) {
            let mut v = s;
            if let Some(b) = self.bias {
                v += b[j];
            }
            let o = out.add(j);
            *o = if self.accumulate { *o + v } else { v };
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tile_avx512<const R: usize>(t: &Tile<'_>, out: *mut f32, ldo: usize) {
    use std::arch::x86_64::*;
    let (k, x, w) = (t.k, t.x.as_ptr(), t.panel.as_ptr());
    let mut lo = [_mm512_setzero_ps(); R];
    let mut hi = [_mm512_setzero_ps(); R];
    for kk in 0..k {
        let w0 = _mm512_loadu_ps(w.add(kk * NR));
        let w1 = _mm512_loadu_ps(w.add(kk * NR + 16));
        for r in 0..R {
            let xv = _mm512_set1_ps(*x.add(r * k + kk));
            lo[r] = _mm512_fmadd_ps(xv, w0, lo[r]);
            hi[r] = _mm512_fmadd_ps(xv, w1, hi[r]);
        }
    }
    let mut sums = [0f32; NR];
    for r in 0..R {
        _mm512_storeu_ps(sums.as_mut_ptr(), lo[r]);
        _mm512_storeu_ps(sums.as_mut_ptr().add(16), hi[r]);
        t.store_row(&sums, out.add(r * ldo));
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2<const R: usize>(t: &Tile<'_>, out: *mut f32, ldo: usize) {
    // AVX2 has 16 YMM registers: 3 rows × 4 accumulators, 3 broadcasts and one weight vector
    // at a time fill them exactly. (Four rows at a time, with the row count known only at run
    // time, kept the accumulators on the stack: half the speed.)
    let mut r0 = 0;
    while r0 < R {
        r0 += match R - r0 {
            1 => rows_avx2::<1>(t, r0, out, ldo),
            2 => rows_avx2::<2>(t, r0, out, ldo),
            _ => rows_avx2::<3>(t, r0, out, ldo),
        };
    }
}

/// `RR` rows (at most 3) starting at row `r0` of the tile; returns `RR`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
// Register tiles indexed by row and column read best as index loops.
#[allow(clippy::needless_range_loop)]
unsafe fn rows_avx2<const RR: usize>(t: &Tile<'_>, r0: usize, out: *mut f32, ldo: usize) -> usize {
    use std::arch::x86_64::*;
    let (k, w) = (t.k, t.panel.as_ptr());
    let x = t.x.as_ptr().add(r0 * k);
    let mut acc = [[_mm256_setzero_ps(); 4]; RR];
    let mut xv = [_mm256_setzero_ps(); RR];
    for kk in 0..k {
        for r in 0..RR {
            xv[r] = _mm256_set1_ps(*x.add(r * k + kk));
        }
        for c in 0..4 {
            let wv = _mm256_loadu_ps(w.add(kk * NR + 8 * c));
            for r in 0..RR {
                acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
            }
        }
    }
    let mut sums = [0f32; NR];
    for (r, a) in acc.iter().enumerate() {
        for (c, v) in a.iter().enumerate() {
            _mm256_storeu_ps(sums.as_mut_ptr().add(8 * c), *v);
        }
        t.store_row(&sums, out.add((r0 + r) * ldo));
    }
    RR
}

unsafe fn tile_generic<const R: usize>(t: &Tile<'_>, out: *mut f32, ldo: usize) {
    let mut acc = [[0f32; NR]; R];
    for kk in 0..t.k {
        let wrow = &t.panel[kk * NR..(kk + 1) * NR];
        for (r, a) in acc.iter_mut().enumerate() {
            let xv = t.x[r * t.k + kk];
            for (s, &wv) in a.iter_mut().zip(wrow) {
                *s += xv * wv;
            }
        }
    }
    for (r, sums) in acc.iter().enumerate() {
        t.store_row(sums, out.add(r * ldo));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_values as values;

    /// Packs a matrix given in Hugging Face linear layout, `[n (out), k (in)]` row-major.
    fn from_out_in(w: &[f32], n: usize, k: usize, bias: Option<&[f32]>) -> PackedMatrix {
        let mut t = vec![0f32; n * k];
        for (j, row) in w.chunks_exact(k).enumerate() {
            for (kk, &v) in row.iter().enumerate() {
                t[kk * n + j] = v;
            }
        }
        let mut p = PackedMatrix::default();
        p.repack_in_out(k, &[(&t, n)], bias);
        p
    }

    fn naive(x: &[f32], w_out_in: &[f32], bias: Option<&[f32]>, m: usize, n: usize, k: usize) -> Vec<f64> {
        let mut out = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = bias.map_or(0.0, |b| b[j] as f64);
                for kk in 0..k {
                    s += x[i * k + kk] as f64 * w_out_in[j * k + kk] as f64;
                }
                out[i * n + j] = s;
            }
        }
        out
    }

    fn isas() -> Vec<Isa> {
        Isa::available()
    }

    #[test]
    fn paths_are_named_and_checked_against_the_cpu() {
        for isa in Isa::available() {
            assert_eq!(Isa::parse_for_this_cpu(isa.name()), Ok(isa));
        }
        assert!(Isa::parse_for_this_cpu("sse9").unwrap_err().contains("unknown path"));
        if !Isa::available().contains(&Isa::Avx512) {
            assert!(Isa::parse_for_this_cpu("avx512").unwrap_err().contains("cannot run the avx512 path"));
        }
        // The override is per thread and undone afterwards.
        let before = Isa::active();
        assert_eq!(Isa::with(Isa::Generic, Isa::active), Isa::Generic);
        assert_eq!(Isa::active(), before);
    }

    #[test]
    fn matches_a_float64_reference_on_ragged_shapes() {
        for &(m, n, k) in &[(1, 1, 1), (3, 33, 7), (8, 64, 40), (13, 70, 129), (17, 31, 300), (40, 96, 64)] {
            let x = values(m * k, 1);
            let w = values(n * k, 2);
            let b = values(n, 3);
            for bias in [None, Some(b.as_slice())] {
                let packed = from_out_in(&w, n, k, bias);
                let want = naive(&x, &w, bias, m, n, k);
                for isa in isas() {
                    let mut out = vec![f32::NAN; m * n];
                    packed.matmul_with(isa, &x, m, &mut out, false);
                    for (i, (&o, &r)) in out.iter().zip(&want).enumerate() {
                        assert!((o as f64 - r).abs() < 1e-4 * (1.0 + r.abs()), "{isa:?} m{m} n{n} k{k} [{i}]: {o} vs {r}");
                    }
                }
            }
        }
    }

    #[test]
    fn accumulate_adds_to_the_output_and_rows_do_not_depend_on_batch() {
        let (m, n, k) = (11, 100, 90);
        let x = values(m * k, 4);
        let w = values(n * k, 5);
        let packed = from_out_in(&w, n, k, None);
        for isa in isas() {
            let mut all = vec![0f32; m * n];
            packed.matmul_with(isa, &x, m, &mut all, false);
            // The same rows one at a time give bit-identical results.
            for i in 0..m {
                let mut one = vec![0f32; n];
                packed.matmul_with(isa, &x[i * k..(i + 1) * k], 1, &mut one, false);
                assert_eq!(&one[..], &all[i * n..(i + 1) * n], "{isa:?} row {i}");
            }
            let mut acc = vec![1.5f32; m * n];
            packed.matmul_with(isa, &x, m, &mut acc, true);
            for (a, o) in acc.iter().zip(&all) {
                assert_eq!(*a, 1.5 + o);
            }
        }
    }

    #[test]
    fn repack_reuses_the_buffer_with_new_values() {
        let (n, k) = (40, 16);
        let mut p = from_out_in(&values(n * k, 6), n, k, None);
        // Two column blocks [k, 15] and [k, 25] of the [k, 40] matrix wᵀ.
        let w = values(n * k, 7);
        let t: Vec<Vec<f32>> = [(0, 15), (15, 40)]
            .iter()
            .map(|&(a, b)| (0..k).flat_map(|kk| (a..b).map(move |j| (kk, j))).map(|(kk, j)| w[j * k + kk]).collect())
            .collect();
        p.repack_in_out(k, &[(&t[0], 15), (&t[1], 25)], None);
        let mut col = vec![0f32; k];
        p.column(17, &mut col);
        assert_eq!(col, w[17 * k..18 * k]);
        let x = values(k, 8);
        let mut out = vec![0f32; n];
        p.matmul(&x, 1, &mut out, false);
        let want = naive(&x, &w, None, 1, n, k);
        for (o, r) in out.iter().zip(&want) {
            assert!((*o as f64 - r).abs() < 1e-4);
        }
    }
}
