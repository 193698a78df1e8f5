//! Masked statistics (verl `torch_functional.masked_*`), the base of every estimator and loss.
//!
//! Masks are float multipliers; a non-zero entry marks a valid token. Entries outside the
//! mask are replaced by 0 *before* multiplying, so NaN/inf in padding never leaks in.

use crate::error::{AlgoError, Result};
use crate::mat::Mat;

/// verl adds this to every mask count in `masked_mean`; reproducing it exactly matters for
/// degenerate whitening (see the `count_eps_sensitive` test vectors).
pub const COUNT_EPS: f64 = 1e-8;

/// Added to the variance before the reciprocal square root in [`masked_whiten`].
pub const WHITEN_EPS: f64 = 1e-8;

/// verl's `where(mask, v, 0) * mask` for one element.
#[inline]
pub(crate) fn masked_value(v: f64, m: f64) -> f64 {
    if m != 0.0 {
        v * m
    } else {
        0.0
    }
}

/// Sum of `values * mask` over masked entries (NaN-safe for masked-out slots).
pub fn masked_sum(values: &Mat, mask: &Mat) -> Result<f64> {
    values.check_same_shape(mask, "masked_sum", "mask")?;
    Ok(values
        .data()
        .iter()
        .zip(mask.data())
        .map(|(&v, &m)| masked_value(v, m))
        .sum())
}

/// Masked mean over the whole tensor: `masked_sum / (mask.sum() + 1e-8)`; an empty mask gives 0.
pub fn masked_mean(values: &Mat, mask: &Mat) -> Result<f64> {
    let s = masked_sum(values, mask)?;
    let count: f64 = mask.data().iter().sum();
    Ok(s / (count + COUNT_EPS))
}

/// Masked mean of each row (verl `masked_mean(..., axis=-1)`), with the same `+1e-8` count.
pub fn masked_mean_rows(values: &Mat, mask: &Mat) -> Result<Vec<f64>> {
    values.check_same_shape(mask, "masked_mean_rows", "mask")?;
    Ok(values
        .iter_rows()
        .zip(mask.iter_rows())
        .map(|(v, m)| {
            let s: f64 = v.iter().zip(m).map(|(&v, &m)| masked_value(v, m)).sum();
            let count: f64 = m.iter().sum();
            s / (count + COUNT_EPS)
        })
        .collect())
}

/// Masked variance over the whole tensor. With `unbiased` the result is scaled by `n/(n-1)`
/// and a mask count `n` of 0 or 1 is an error, as in verl.
pub fn masked_var(values: &Mat, mask: &Mat, unbiased: bool) -> Result<f64> {
    let mean = masked_mean(values, mask)?;
    let centered_sq = values.map(|v| (v - mean) * (v - mean));
    let variance = masked_mean(&centered_sq, mask)?;
    if !unbiased {
        return Ok(variance);
    }
    let n: f64 = mask.data().iter().sum();
    if n == 0.0 {
        return Err(AlgoError::invalid(
            "masked_var",
            "the mask selects no element; at least one element in the mask has to be 1 \
             (unbiased variance needs 2 valid tokens)",
        ));
    }
    if n == 1.0 {
        return Err(AlgoError::invalid(
            "masked_var",
            "the mask selects exactly one element, so the unbiased variance divides by zero; \
             at least 2 valid tokens are needed",
        ));
    }
    Ok(variance * (n / (n - 1.0)))
}

/// `(x - mean) / sqrt(var + 1e-8)` at every position (masked ones included, not re-masked),
/// with mean and unbiased variance taken over the masked entries of the whole tensor.
/// With `shift_mean = false` the mean is added back.
pub fn masked_whiten(values: &Mat, mask: &Mat, shift_mean: bool) -> Result<Mat> {
    let mean = masked_mean(values, mask)?;
    let var = masked_var(values, mask, true)?;
    let inv_std = 1.0 / (var + WHITEN_EPS).sqrt();
    Ok(values.map(|v| {
        let w = (v - mean) * inv_std;
        if shift_mean {
            w
        } else {
            w + mean
        }
    }))
}
