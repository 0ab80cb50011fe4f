//! f16 reductions with the CPU's own conversions (F16C: eight f16 to f32 and
//! back in one instruction each), used where the CPU has them (checked once,
//! at run time; the wheel is built for baseline x86-64). LLVM does not turn
//! the portable conversions of `halves.rs` into these instructions, and they
//! are several times faster (docs/benchmarks.md, "Half precision at the
//! vector width"). The `unsafe` here is the CPU-feature edge: a function
//! compiled for features the baseline lacks, called once they are checked.
//!
//! Results are exactly the portable kernels': the conversions are exact one
//! way and round to nearest-even the other, and min/max follow `Arith`'s
//! rules (NaN propagates; between equals the second operand).

use super::prefetch;
use crate::types::ElemOp;
use half::f16;
use std::arch::x86_64::{
    __m256, _mm256_add_ps, _mm256_blendv_ps, _mm256_cmp_ps, _mm256_cvtph_ps, _mm256_cvtps_ph,
    _mm256_max_ps, _mm256_min_ps, _mm256_mul_ps, _CMP_UNORD_Q, _MM_FROUND_TO_NEAREST_INT,
};

const LANES: usize = 8;

/// Whether this CPU has F16C (and AVX, which its 256-bit form needs); the
/// standard library caches the answer.
pub(super) fn available() -> bool {
    is_x86_feature_detected!("f16c") && is_x86_feature_detected!("avx")
}

/// dst = dst ⊕ src on whole vectors of 8; returns how many elements it did
/// (the tail is the caller's). None when the CPU lacks F16C.
pub(super) fn reduce_inplace(op: ElemOp, dst: &mut [f16], src: &[f16]) -> Option<usize> {
    if !available() {
        return None;
    }
    // SAFETY: `available()` checked that the CPU has AVX and F16C, the only
    // features `zip` is compiled for.
    Some(unsafe { zip(op, dst, None, src) })
}

/// dst = a ⊕ b, as [`reduce_inplace`].
pub(super) fn reduce_into(op: ElemOp, dst: &mut [f16], a: &[f16], b: &[f16]) -> Option<usize> {
    if !available() {
        return None;
    }
    // SAFETY: as in `reduce_inplace`.
    Some(unsafe { zip(op, dst, Some(a), b) })
}

/// dst = (a or dst) ⊕ b over the whole vectors; the match on `op` runs once.
#[target_feature(enable = "avx,f16c")]
fn zip(op: ElemOp, dst: &mut [f16], a: Option<&[f16]>, b: &[f16]) -> usize {
    match op {
        ElemOp::Sum => lanes(dst, a, b, |x, y| _mm256_add_ps(x, y)),
        ElemOp::Prod => lanes(dst, a, b, |x, y| _mm256_mul_ps(x, y)),
        // minps/maxps give the second operand when either is NaN: a NaN first
        // operand is put back.
        ElemOp::Min => lanes(dst, a, b, |x, y| {
            _mm256_blendv_ps(_mm256_min_ps(x, y), x, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x))
        }),
        ElemOp::Max => lanes(dst, a, b, |x, y| {
            _mm256_blendv_ps(_mm256_max_ps(x, y), x, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x))
        }),
    }
}

#[target_feature(enable = "avx,f16c")]
#[inline]
fn lanes(
    dst: &mut [f16],
    a: Option<&[f16]>,
    b: &[f16],
    f: impl Fn(__m256, __m256) -> __m256,
) -> usize {
    let whole = dst.len() / LANES * LANES;
    let load = |h: &[f16]| -> __m256 {
        let h: [f16; LANES] = h.try_into().expect("a whole vector");
        _mm256_cvtph_ps(bytemuck::cast(h))
    };
    let store = |v: __m256, out: &mut [f16]| {
        let h: [f16; LANES] = bytemuck::cast(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v));
        out.copy_from_slice(&h);
    };
    // From memory, each cache line's first vector asks for the line
    // `prefetch::AHEAD` bytes on in each buffer (see `prefetch.rs`).
    let per_line = prefetch::line_of::<f16>() / LANES;
    let ahead = prefetch::worth::<f16>(dst.len());
    let (len, d0, b0) = (dst.len(), dst.as_ptr(), b.as_ptr());
    let bs = b[..whole].chunks_exact(LANES);
    match a {
        None => {
            for (k, (d, s)) in dst[..whole].chunks_exact_mut(LANES).zip(bs).enumerate() {
                if ahead && k % per_line == 0 {
                    prefetch::ahead(d0, len, k * LANES);
                    prefetch::ahead(b0, len, k * LANES);
                }
                let r = f(load(d), load(s));
                store(r, d);
            }
        }
        Some(a) => {
            let pairs = a[..whole].chunks_exact(LANES).zip(bs);
            for (k, (d, (x, y))) in dst[..whole].chunks_exact_mut(LANES).zip(pairs).enumerate() {
                if ahead && k % per_line == 0 {
                    prefetch::ahead(d0, len, k * LANES);
                    prefetch::ahead(a.as_ptr(), len, k * LANES);
                    prefetch::ahead(b0, len, k * LANES);
                }
                store(f(load(x), load(y)), d);
            }
        }
    }
    whole
}
