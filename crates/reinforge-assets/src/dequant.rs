//! ggml tensor types and their dequantization to `f32`.
//!
//! The block layouts follow ggml's `ggml-common.h`; the arithmetic follows ggml's reference
//! `dequantize_row_*` functions (and `gguf-py`), in `f32`, so results are bit-identical to
//! what those tools produce.

use std::fmt;

use half::{bf16, f16};

/// A ggml tensor element type, by its GGUF type id.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// 4-bit blocks of 32 with an f16 scale.
    Q4_0,
    /// 4-bit blocks of 32 with an f16 scale and minimum.
    Q4_1,
    /// 5-bit blocks of 32 with an f16 scale.
    Q5_0,
    /// 5-bit blocks of 32 with an f16 scale and minimum.
    Q5_1,
    /// 8-bit blocks of 32 with an f16 scale.
    Q8_0,
    /// 8-bit blocks of 32 with f16 scale and sum (an activation format).
    Q8_1,
    /// 2-bit k-quant super-blocks of 256.
    Q2_K,
    /// 3-bit k-quant super-blocks of 256.
    Q3_K,
    /// 4-bit k-quant super-blocks of 256.
    Q4_K,
    /// 5-bit k-quant super-blocks of 256.
    Q5_K,
    /// 6-bit k-quant super-blocks of 256.
    Q6_K,
    /// 8-bit k-quant super-blocks of 256 (an activation format).
    Q8_K,
    /// i-quant, 2.06 bits per weight.
    IQ2_XXS,
    /// i-quant, 2.31 bits per weight.
    IQ2_XS,
    /// i-quant, 3.06 bits per weight.
    IQ3_XXS,
    /// i-quant, 1.56 bits per weight.
    IQ1_S,
    /// i-quant, 4.5 bits per weight, non-linear.
    IQ4_NL,
    /// i-quant, 3.44 bits per weight.
    IQ3_S,
    /// i-quant, 2.5 bits per weight.
    IQ2_S,
    /// i-quant, 4.25 bits per weight.
    IQ4_XS,
    /// 8-bit integer.
    I8,
    /// 16-bit integer.
    I16,
    /// 32-bit integer.
    I32,
    /// 64-bit integer.
    I64,
    /// 64-bit float.
    F64,
    /// i-quant, 1.75 bits per weight.
    IQ1_M,
    /// bfloat16.
    BF16,
    /// ternary, 1.69 bits per weight.
    TQ1_0,
    /// ternary, 2.06 bits per weight.
    TQ2_0,
    /// microscaling FP4.
    MXFP4,
    /// A type id this crate does not know.
    Unknown(u32),
}

impl GgmlType {
    /// The type for a GGUF type id (unknown ids map to [`GgmlType::Unknown`]).
    pub fn from_id(id: u32) -> Self {
        use GgmlType::*;
        match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2_K,
            11 => Q3_K,
            12 => Q4_K,
            13 => Q5_K,
            14 => Q6_K,
            15 => Q8_K,
            16 => IQ2_XXS,
            17 => IQ2_XS,
            18 => IQ3_XXS,
            19 => IQ1_S,
            20 => IQ4_NL,
            21 => IQ3_S,
            22 => IQ2_S,
            23 => IQ4_XS,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            29 => IQ1_M,
            30 => BF16,
            34 => TQ1_0,
            35 => TQ2_0,
            39 => MXFP4,
            other => Unknown(other),
        }
    }

    /// The GGUF type id.
    pub fn id(self) -> u32 {
        use GgmlType::*;
        match self {
            F32 => 0,
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q5_0 => 6,
            Q5_1 => 7,
            Q8_0 => 8,
            Q8_1 => 9,
            Q2_K => 10,
            Q3_K => 11,
            Q4_K => 12,
            Q5_K => 13,
            Q6_K => 14,
            Q8_K => 15,
            IQ2_XXS => 16,
            IQ2_XS => 17,
            IQ3_XXS => 18,
            IQ1_S => 19,
            IQ4_NL => 20,
            IQ3_S => 21,
            IQ2_S => 22,
            IQ4_XS => 23,
            I8 => 24,
            I16 => 25,
            I32 => 26,
            I64 => 27,
            F64 => 28,
            IQ1_M => 29,
            BF16 => 30,
            TQ1_0 => 34,
            TQ2_0 => 35,
            MXFP4 => 39,
            Unknown(id) => id,
        }
    }

    /// `(elements per block, bytes per block)`, or `None` for unknown type ids.
    ///
    /// Known even for types that cannot be dequantized, so that every tensor's byte range
    /// can be checked against the file.
    pub fn block_layout(self) -> Option<(usize, usize)> {
        use GgmlType::*;
        Some(match self {
            F32 | I32 => (1, 4),
            F16 | BF16 | I16 => (1, 2),
            I8 => (1, 1),
            F64 | I64 => (1, 8),
            Q4_0 | IQ4_NL => (32, 18),
            Q4_1 => (32, 20),
            Q5_0 => (32, 22),
            Q5_1 => (32, 24),
            Q8_0 => (32, 34),
            Q8_1 => (32, 36),
            MXFP4 => (32, 17),
            Q2_K => (256, 84),
            Q3_K => (256, 110),
            Q4_K => (256, 144),
            Q5_K => (256, 176),
            Q6_K => (256, 210),
            Q8_K => (256, 292),
            IQ2_XXS => (256, 66),
            IQ2_XS => (256, 74),
            IQ3_XXS => (256, 98),
            IQ1_S => (256, 50),
            IQ3_S => (256, 110),
            IQ2_S => (256, 82),
            IQ4_XS => (256, 136),
            IQ1_M => (256, 56),
            TQ1_0 => (256, 54),
            TQ2_0 => (256, 66),
            Unknown(_) => return None,
        })
    }

    /// Whether [`dequantize`] implements this type.
    pub fn can_dequantize(self) -> bool {
        use GgmlType::*;
        matches!(
            self,
            F32 | F16 | BF16 | F64 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4_K | Q5_K | Q6_K
        )
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GgmlType::Unknown(id) => write!(f, "unknown ggml type id {id}"),
            other => write!(f, "{other:?}"),
        }
    }
}

/// Why a buffer could not be dequantized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DequantError {
    /// The type has no dequantizer here.
    #[error(
        "tensor type {0} (id {id}) is not supported; supported: F32, F16, BF16, F64, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K",
        id = .0.id()
    )]
    Unsupported(GgmlType),
    /// The element count is not a whole number of blocks.
    #[error("{n_elements} elements is not a multiple of the {ty} block size {block}")]
    PartialBlock {
        /// The type.
        ty: GgmlType,
        /// Elements requested.
        n_elements: usize,
        /// Elements per block.
        block: usize,
    },
    /// The buffer length does not match the element count.
    #[error("{ty} data for {n_elements} elements must be {expected} bytes, got {actual}")]
    Length {
        /// The type.
        ty: GgmlType,
        /// Elements requested.
        n_elements: usize,
        /// Bytes needed.
        expected: usize,
        /// Bytes given.
        actual: usize,
    },
}

/// Number of bytes that `n_elements` values of `ty` occupy.
pub fn byte_size(ty: GgmlType, n_elements: usize) -> Result<usize, DequantError> {
    let (block, bytes) = ty.block_layout().ok_or(DequantError::Unsupported(ty))?;
    if n_elements % block != 0 {
        return Err(DequantError::PartialBlock {
            ty,
            n_elements,
            block,
        });
    }
    // Cannot overflow for real buffers (bytes/block <= 9 bytes/element), but stay checked.
    (n_elements / block)
        .checked_mul(bytes)
        .ok_or(DequantError::Length {
            ty,
            n_elements,
            expected: usize::MAX,
            actual: 0,
        })
}

/// Dequantizes `n_elements` values of type `ty` stored in `data` to `f32`.
///
/// `data` must hold exactly the bytes of those elements.
pub fn dequantize(ty: GgmlType, data: &[u8], n_elements: usize) -> Result<Vec<f32>, DequantError> {
    if !ty.can_dequantize() {
        return Err(DequantError::Unsupported(ty));
    }
    let expected = byte_size(ty, n_elements)?;
    if data.len() != expected {
        return Err(DequantError::Length {
            ty,
            n_elements,
            expected,
            actual: data.len(),
        });
    }
    let mut out = Vec::with_capacity(n_elements);
    match ty {
        GgmlType::F32 => out.extend(
            data.chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
        GgmlType::F16 => out.extend(data.chunks_exact(2).map(|b| f16_at(b, 0))),
        GgmlType::BF16 => out.extend(
            data.chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        ),
        // Precision is lost here on purpose: the import target is an f32 checkpoint.
        GgmlType::F64 => out.extend(data.chunks_exact(8).map(|b| {
            f64::from_le_bytes(b.try_into().expect("chunks_exact(8) yields 8 bytes")) as f32
        })),
        GgmlType::Q4_0 => data.chunks_exact(18).for_each(|b| q4_0_block(b, &mut out)),
        GgmlType::Q4_1 => data.chunks_exact(20).for_each(|b| q4_1_block(b, &mut out)),
        GgmlType::Q5_0 => data.chunks_exact(22).for_each(|b| q5_0_block(b, &mut out)),
        GgmlType::Q5_1 => data.chunks_exact(24).for_each(|b| q5_1_block(b, &mut out)),
        GgmlType::Q8_0 => data.chunks_exact(34).for_each(|b| q8_0_block(b, &mut out)),
        GgmlType::Q4_K => data.chunks_exact(144).for_each(|b| q4_k_block(b, &mut out)),
        GgmlType::Q5_K => data.chunks_exact(176).for_each(|b| q5_k_block(b, &mut out)),
        GgmlType::Q6_K => data.chunks_exact(210).for_each(|b| q6_k_block(b, &mut out)),
        _ => unreachable!("can_dequantize() covers exactly the types handled above"),
    }
    debug_assert_eq!(out.len(), n_elements);
    Ok(out)
}

/// Reads a little-endian f16 at byte offset `at` as f32.
#[inline]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// `d` (f16), then 16 bytes of nibbles: low nibbles are values 0..16, high nibbles 16..32.
fn q4_0_block(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    out.extend(qs.iter().map(|&q| ((q & 0x0F) as i32 - 8) as f32 * d));
    out.extend(qs.iter().map(|&q| ((q >> 4) as i32 - 8) as f32 * d));
}

/// `d`, `m` (f16), then 16 bytes of nibbles; value = d*q + m.
fn q4_1_block(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qs = &b[4..20];
    out.extend(qs.iter().map(|&q| (q & 0x0F) as f32 * d + m));
    out.extend(qs.iter().map(|&q| (q >> 4) as f32 * d + m));
}

/// `d` (f16), 32 high bits `qh` (u32), 16 bytes of low nibbles; value = d*(q - 16).
fn q5_0_block(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    out.extend(qs.iter().enumerate().map(|(j, &q)| {
        let hi = ((qh >> j) << 4) & 0x10;
        (((q & 0x0F) as u32 | hi) as i32 - 16) as f32 * d
    }));
    out.extend(qs.iter().enumerate().map(|(j, &q)| {
        let hi = (qh >> (j + 12)) & 0x10;
        (((q >> 4) as u32 | hi) as i32 - 16) as f32 * d
    }));
}

/// `d`, `m` (f16), `qh` (u32), 16 bytes of low nibbles; value = d*q + m.
fn q5_1_block(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    out.extend(qs.iter().enumerate().map(|(j, &q)| {
        let hi = ((qh >> j) << 4) & 0x10;
        ((q & 0x0F) as u32 | hi) as f32 * d + m
    }));
    out.extend(qs.iter().enumerate().map(|(j, &q)| {
        let hi = (qh >> (j + 12)) & 0x10;
        ((q >> 4) as u32 | hi) as f32 * d + m
    }));
}

/// `d` (f16), then 32 signed bytes; value = d*q.
fn q8_0_block(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    out.extend(b[2..34].iter().map(|&q| q as i8 as f32 * d));
}

/// The 6-bit scale and min of sub-block `j` (0..8) packed in the 12 `scales` bytes of
/// Q4_K/Q5_K (ggml's `get_scale_min_k4`).
#[inline]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// `d`, `dmin` (f16), 12 bytes of packed scales/mins, 128 bytes of nibbles.
fn q4_k_block(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for (g, q) in qs.chunks_exact(32).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * g, scales);
        let (sc2, m2) = scale_min_k4(2 * g + 1, scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        out.extend(q.iter().map(|&v| d1 * (v & 0x0F) as f32 - m1));
        out.extend(q.iter().map(|&v| d2 * (v >> 4) as f32 - m2));
    }
}

/// `d`, `dmin` (f16), 12 bytes of scales/mins, 32 bytes of high bits, 128 bytes of nibbles.
fn q5_k_block(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for (g, q) in qs.chunks_exact(32).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * g, scales);
        let (sc2, m2) = scale_min_k4(2 * g + 1, scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        let (u1, u2) = (1u8 << (2 * g), 2u8 << (2 * g));
        out.extend(q.iter().zip(qh).map(|(&v, &h)| {
            let hi = if h & u1 != 0 { 16 } else { 0 };
            d1 * ((v & 0x0F) + hi) as f32 - m1
        }));
        out.extend(q.iter().zip(qh).map(|(&v, &h)| {
            let hi = if h & u2 != 0 { 16 } else { 0 };
            d2 * ((v >> 4) + hi) as f32 - m2
        }));
    }
}

/// 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales, `d` (f16).
fn q6_k_block(b: &[u8], out: &mut Vec<f32>) {
    let ql_all = &b[0..128];
    let qh_all = &b[128..192];
    let sc_all = &b[192..208];
    let d = f16_at(b, 208);
    let mut y = [0f32; 256];
    for half in 0..2 {
        let ql = &ql_all[64 * half..];
        let qh = &qh_all[32 * half..];
        let sc = &sc_all[8 * half..];
        let y = &mut y[128 * half..];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
    out.extend_from_slice(&y);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn q8_0_block_is_scale_times_int8() {
        let mut b = Vec::new();
        b.extend_from_slice(&h(0.5));
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let v = dequantize(GgmlType::Q8_0, &b, 32).unwrap();
        let want: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) * 0.5).collect();
        assert_eq!(v, want);
    }

    #[test]
    fn q4_1_low_nibbles_first_then_high() {
        let mut b = Vec::new();
        b.extend_from_slice(&h(0.25));
        b.extend_from_slice(&h(-1.0));
        // qs[j] = (15 - j) << 4 | j: value j is j, value 16 + j is 15 - j.
        b.extend((0..16u8).map(|j| ((15 - j) << 4) | j));
        let v = dequantize(GgmlType::Q4_1, &b, 32).unwrap();
        for j in 0..16 {
            assert_eq!(v[j], j as f32 * 0.25 - 1.0);
            assert_eq!(v[16 + j], (15 - j) as f32 * 0.25 - 1.0);
        }
    }

    #[test]
    fn q4_0_is_centred_on_eight() {
        let mut b = Vec::new();
        b.extend_from_slice(&h(2.0));
        b.extend((0..16u8).map(|j| (j << 4) | (15 - j)));
        let v = dequantize(GgmlType::Q4_0, &b, 32).unwrap();
        for j in 0..16 {
            assert_eq!(v[j], ((15 - j) as f32 - 8.0) * 2.0);
            assert_eq!(v[16 + j], (j as f32 - 8.0) * 2.0);
        }
    }

    #[test]
    fn f16_bf16_f32_f64_are_widened() {
        let xs = [0.0f32, -1.5, 65504.0, 1.0e-3];
        let f16b: Vec<u8> = xs.iter().flat_map(|&x| h(x)).collect();
        let v = dequantize(GgmlType::F16, &f16b, 4).unwrap();
        let want: Vec<f32> = xs.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
        assert_eq!(v, want);
        assert_eq!(v[1], -1.5);

        let bf: Vec<u8> = xs
            .iter()
            .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
            .collect();
        let v = dequantize(GgmlType::BF16, &bf, 4).unwrap();
        assert_eq!(v[1], -1.5);

        let f32b: Vec<u8> = xs.iter().flat_map(|&x| x.to_le_bytes()).collect();
        assert_eq!(dequantize(GgmlType::F32, &f32b, 4).unwrap(), xs);

        let f64b: Vec<u8> = [0.5f64, -2.0]
            .iter()
            .flat_map(|&x| x.to_le_bytes())
            .collect();
        assert_eq!(dequantize(GgmlType::F64, &f64b, 2).unwrap(), [0.5, -2.0]);
    }

    #[test]
    fn q5_0_and_q5_1_use_the_high_bits() {
        // All high bits set for values 0..16, none for 16..32.
        let qh = 0x0000_FFFFu32.to_le_bytes();
        let mut b = Vec::new();
        b.extend_from_slice(&h(1.0));
        b.extend_from_slice(&qh);
        b.extend((0..16u8).map(|j| (j << 4) | j));
        let v = dequantize(GgmlType::Q5_0, &b, 32).unwrap();
        for j in 0..16 {
            assert_eq!(v[j], (j as f32 + 16.0) - 16.0);
            assert_eq!(v[16 + j], j as f32 - 16.0);
        }
        let mut b = Vec::new();
        b.extend_from_slice(&h(0.5));
        b.extend_from_slice(&h(1.0));
        b.extend_from_slice(&qh);
        b.extend((0..16u8).map(|j| (j << 4) | j));
        let v = dequantize(GgmlType::Q5_1, &b, 32).unwrap();
        for j in 0..16 {
            assert_eq!(v[j], (j as f32 + 16.0) * 0.5 + 1.0);
            assert_eq!(v[16 + j], j as f32 * 0.5 + 1.0);
        }
    }

    /// Values computed with gguf-py 0.19.0 (`gguf.quants.dequantize`) on the same bytes.
    #[test]
    fn k_quants_match_gguf_py() {
        let block = |n: usize, seed: u32| -> Vec<u8> {
            let mut s = seed;
            (0..n)
                .map(|_| {
                    s = s.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    (s >> 16) as u8
                })
                .collect()
        };
        let fix_f16 = |b: &mut [u8], at: usize, x: f32| b[at..at + 2].copy_from_slice(&h(x));

        let mut q4k = block(144, 1);
        fix_f16(&mut q4k, 0, 0.01);
        fix_f16(&mut q4k, 2, 0.002);
        let v = dequantize(GgmlType::Q4_K, &q4k, 256).unwrap();
        let sum: f64 = v.iter().map(|&x| x as f64).sum();
        assert_close(
            &v[..4],
            &K_QUANT_EXPECT.q4k_first,
            sum,
            K_QUANT_EXPECT.q4k_sum,
        );

        let mut q5k = block(176, 2);
        fix_f16(&mut q5k, 0, 0.01);
        fix_f16(&mut q5k, 2, 0.002);
        let v = dequantize(GgmlType::Q5_K, &q5k, 256).unwrap();
        let sum: f64 = v.iter().map(|&x| x as f64).sum();
        assert_close(
            &v[..4],
            &K_QUANT_EXPECT.q5k_first,
            sum,
            K_QUANT_EXPECT.q5k_sum,
        );

        let mut q6k = block(210, 3);
        fix_f16(&mut q6k, 208, 0.01);
        let v = dequantize(GgmlType::Q6_K, &q6k, 256).unwrap();
        let sum: f64 = v.iter().map(|&x| x as f64).sum();
        assert_close(
            &v[..4],
            &K_QUANT_EXPECT.q6k_first,
            sum,
            K_QUANT_EXPECT.q6k_sum,
        );
    }

    struct KQuantExpect {
        q4k_first: [f64; 4],
        q4k_sum: f64,
        q5k_first: [f64; 4],
        q5k_sum: f64,
        q6k_first: [f64; 4],
        q6k_sum: f64,
    }

    const K_QUANT_EXPECT: KQuantExpect = KQuantExpect {
        q4k_first: [
            0.07000732421875,
            1.6103363037109375,
            0.07000732421875,
            1.5003128051757812,
        ],
        q4k_sum: 814.249755859375,
        q5k_first: [
            13.024776458740234,
            6.723430633544922,
            5.823238372802734,
            8.97391128540039,
        ],
        q5k_sum: 1479.8101501464844,
        q6k_first: [
            29.586318969726562,
            29.586318969726562,
            -29.586318969726562,
            8.1617431640625,
        ],
        q6k_sum: 373.17970275878906,
    };

    fn assert_close(first: &[f32], want_first: &[f64], sum: f64, want_sum: f64) {
        let first: Vec<f64> = first.iter().map(|&x| x as f64).collect();
        assert_eq!(first, want_first);
        assert!(
            (sum - want_sum).abs() <= 1e-9 * want_sum.abs().max(1.0),
            "sum {sum} vs {want_sum}"
        );
    }

    #[test]
    fn errors_name_the_problem() {
        let e = dequantize(GgmlType::Q3_K, &[0; 110], 256).unwrap_err();
        assert!(e.to_string().contains("Q3_K"), "{e}");
        let e = dequantize(GgmlType::Unknown(99), &[], 0).unwrap_err();
        assert!(e.to_string().contains("99"), "{e}");
        let e = dequantize(GgmlType::Q8_0, &[0; 33], 32).unwrap_err();
        assert!(
            matches!(
                e,
                DequantError::Length {
                    expected: 34,
                    actual: 33,
                    ..
                }
            ),
            "{e}"
        );
        let e = dequantize(GgmlType::Q8_0, &[0; 34], 31).unwrap_err();
        assert!(matches!(e, DequantError::PartialBlock { .. }), "{e}");
    }

    #[test]
    fn type_ids_round_trip() {
        for id in 0..64 {
            assert_eq!(GgmlType::from_id(id).id(), id);
        }
    }
}
