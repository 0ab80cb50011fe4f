//! Element-wise reductions on byte buffers, one implementation per dtype × op.
//!
//! The engine moves bytes, so every function takes `&[u8]` / `&mut [u8]` whose
//! lengths are multiples of [`DType::size`]. A length that is not, or slices of
//! different lengths, is a bug in the caller and panics.
//!
//! Semantics (numpy's, where numpy is exact):
//! - integers: `Sum` and `Prod` wrap around (two's complement, fixed width);
//!   `Min` / `Max` are the ordinary ones.
//! - f32 / f64: ordinary IEEE-754 operations, round to nearest-even.
//! - f16 / bf16: both operands are widened to f32, operated on, and rounded back
//!   to nearest-even. For sum/prod/min/max this is the correctly rounded result,
//!   identical to numpy's float16 arithmetic.
//! - `Min` / `Max` on floats propagate NaN: if either operand is NaN the result
//!   is NaN (which of the NaN payloads survives is unspecified). Between +0.0 and
//!   -0.0 (equal values) the second operand (`src`, or `b`) is returned.
//!
//! Buffers are viewed as typed slices (`bytemuck`) when they are aligned for the
//! dtype; misaligned buffers take unaligned or staged paths with identical
//! results. All loops are written so that LLVM vectorizes them.

#[cfg(target_arch = "x86_64")]
mod f16c;
mod halves;
mod kernels;
mod prefetch;
#[cfg(test)]
mod tests;

use crate::types::{DType, ElemOp};
use bytemuck::Pod;
use kernels::{FloatKernel, Kernel, BLOCK};

/// Runs `$body` with the type alias `$T` set to the Rust element type of
/// `$dtype`.
macro_rules! with_elem_type {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            DType::F16 => {
                type $T = half::f16;
                $body
            }
            DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::F64 => {
                type $T = f64;
                $body
            }
            DType::I8 => {
                type $T = i8;
                $body
            }
            DType::U8 => {
                type $T = u8;
                $body
            }
            DType::I32 => {
                type $T = i32;
                $body
            }
            DType::I64 => {
                type $T = i64;
                $body
            }
        }
    };
}

/// Like [`with_elem_type`] for the float dtypes; panics on integer dtypes.
macro_rules! with_float_type {
    ($dtype:expr, $what:literal, $T:ident => $body:expr) => {
        match $dtype {
            DType::F16 => {
                type $T = half::f16;
                $body
            }
            DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::F64 => {
                type $T = f64;
                $body
            }
            d @ (DType::I8 | DType::U8 | DType::I32 | DType::I64) => {
                panic!(
                    concat!("reduce::", $what, ": dtype {} is not a float dtype"),
                    d
                )
            }
        }
    };
}

/// dst = dst ⊕ src, element by element.
pub fn reduce_inplace(dtype: DType, op: ElemOp, dst: &mut [u8], src: &[u8]) {
    check_lens("reduce_inplace", dtype, &[dst.len(), src.len()]);
    with_elem_type!(dtype, T => {
        match (typed_mut::<T>(dst), typed::<T>(src)) {
            (Some(d), Some(s)) => T::reduce_inplace(op, d, s),
            _ => T::reduce_inplace_unaligned(op, dst, src),
        }
    })
}

/// dst = a ⊕ b, element by element (dst cannot alias a or b: the borrows say so).
pub fn reduce_into(dtype: DType, op: ElemOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    check_lens("reduce_into", dtype, &[dst.len(), a.len(), b.len()]);
    with_elem_type!(dtype, T => {
        match (typed_mut::<T>(dst), typed::<T>(a), typed::<T>(b)) {
            (Some(d), Some(a), Some(b)) => T::reduce_into(op, d, a, b),
            _ => T::reduce_into_unaligned(op, dst, a, b),
        }
    })
}

/// buf *= factor. Float dtypes only: panics for integer dtypes (callers reject
/// `premul_sum` on integers). f32 and f64 round `factor` to the dtype and
/// multiply in it (numpy's `array * python_float`); f16 and bf16 multiply in f32
/// (with `factor` rounded to f32) and round the product to the dtype.
pub fn scale(dtype: DType, buf: &mut [u8], factor: f64) {
    check_lens("scale", dtype, &[buf.len()]);
    with_float_type!(dtype, "scale", T => on_typed1::<T>(buf, |b| T::scale(b, factor)))
}

/// dst = src * factor, with the rules of [`scale`].
pub fn scale_into(dtype: DType, dst: &mut [u8], src: &[u8], factor: f64) {
    check_lens("scale_into", dtype, &[dst.len(), src.len()]);
    with_float_type!(dtype, "scale_into", T => {
        on_typed2::<T>(dst, src, |d, s| T::scale_into(d, s, factor))
    })
}

/// buf /= n, for the `avg` operator. Floats divide (x / n with n converted to
/// the dtype for f32/f64; in f32 then rounded for f16/bf16); integers divide
/// truncating toward zero (-7 / 2 = -3). Panics if `n == 0`.
pub fn divide(dtype: DType, buf: &mut [u8], n: usize) {
    check_lens("divide", dtype, &[buf.len()]);
    assert!(n > 0, "reduce::divide: division by a count of 0");
    with_elem_type!(dtype, T => on_typed1::<T>(buf, |b| T::divide(b, n)))
}

/// Panics unless every length is the same multiple of the element size.
fn check_lens(what: &str, dtype: DType, lens: &[usize]) {
    let size = dtype.size();
    for &len in lens {
        assert!(
            len % size == 0,
            "reduce::{what}: buffer of {len} bytes is not a whole number of {dtype} elements ({size} bytes each)"
        );
    }
    assert!(
        lens.iter().all(|&l| l == lens[0]),
        "reduce::{what}: buffers of different lengths {lens:?} (bytes, {dtype})"
    );
}

// ---- byte slices → typed slices ----
//
// Buffers normally come from allocations and chunks at element-multiple
// offsets, so they are aligned for their dtype and viewed as typed slices. For
// misaligned buffers, the reductions (which run on every received chunk) have
// direct unaligned loops (see `kernels`); everything else is staged: copied
// block by block through aligned stack arrays and run through the same kernel,
// so results never depend on alignment.

fn typed<T: Pod>(b: &[u8]) -> Option<&[T]> {
    bytemuck::try_cast_slice(b).ok()
}

fn typed_mut<T: Pod>(b: &mut [u8]) -> Option<&mut [T]> {
    bytemuck::try_cast_slice_mut(b).ok()
}

/// `k(buf)` on `buf` viewed as `[T]`, staged if misaligned.
fn on_typed1<T: Pod>(buf: &mut [u8], k: impl Fn(&mut [T])) {
    if let Some(b) = typed_mut::<T>(buf) {
        return k(b);
    }
    let size = size_of::<T>();
    let mut tb = [T::zeroed(); BLOCK];
    for bc in buf.chunks_mut(BLOCK * size) {
        let tb = &mut tb[..bc.len() / size];
        bytemuck::cast_slice_mut::<T, u8>(tb).copy_from_slice(bc);
        k(tb);
        bc.copy_from_slice(bytemuck::cast_slice(tb));
    }
}

/// `k(dst, src)` on the buffers viewed as `[T]`, staged if either is
/// misaligned. `k` may read `dst`.
fn on_typed2<T: Pod>(dst: &mut [u8], src: &[u8], k: impl Fn(&mut [T], &[T])) {
    if let (Some(d), Some(s)) = (typed_mut::<T>(dst), typed::<T>(src)) {
        return k(d, s);
    }
    let size = size_of::<T>();
    let mut td = [T::zeroed(); BLOCK];
    let mut ts = [T::zeroed(); BLOCK];
    for (dc, sc) in dst.chunks_mut(BLOCK * size).zip(src.chunks(BLOCK * size)) {
        let n = dc.len() / size;
        let (td, ts) = (&mut td[..n], &mut ts[..n]);
        bytemuck::cast_slice_mut::<T, u8>(td).copy_from_slice(dc);
        bytemuck::cast_slice_mut::<T, u8>(ts).copy_from_slice(sc);
        k(td, ts);
        dc.copy_from_slice(bytemuck::cast_slice(td));
    }
}

/// `k(dst, a, b)` on the buffers viewed as `[T]`, staged if any is
/// misaligned. `k` only writes `dst`.
fn on_typed3<T: Pod>(dst: &mut [u8], a: &[u8], b: &[u8], k: impl Fn(&mut [T], &[T], &[T])) {
    if let (Some(d), Some(a), Some(b)) = (typed_mut::<T>(dst), typed::<T>(a), typed::<T>(b)) {
        return k(d, a, b);
    }
    let size = size_of::<T>();
    let mut td = [T::zeroed(); BLOCK];
    let mut ta = [T::zeroed(); BLOCK];
    let mut tb = [T::zeroed(); BLOCK];
    let blk = BLOCK * size;
    for (dc, (ac, bc)) in dst.chunks_mut(blk).zip(a.chunks(blk).zip(b.chunks(blk))) {
        let n = dc.len() / size;
        let (td, ta, tb) = (&mut td[..n], &mut ta[..n], &mut tb[..n]);
        bytemuck::cast_slice_mut::<T, u8>(ta).copy_from_slice(ac);
        bytemuck::cast_slice_mut::<T, u8>(tb).copy_from_slice(bc);
        k(td, ta, tb);
        dc.copy_from_slice(bytemuck::cast_slice(td));
    }
}
