//! Typed kernels: the loops that do the arithmetic, on typed slices of equal
//! lengths (`mod.rs` views the byte slices as these), plus unaligned variants
//! of the reductions on byte slices.
//!
//! Every inner loop is a zip over slices with a select-only (branch-free) body,
//! so LLVM drops the bounds checks and vectorizes it.

use crate::types::ElemOp;
use bytemuck::{bytes_of, pod_read_unaligned, Pod};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// Elements per block: for staging misaligned data (see `mod.rs`) and for the
/// f32 scratch arrays of f16. Small enough to stay in L1, big enough that the
/// per-block overhead (an op dispatch, a CPU feature check) vanishes.
pub(super) const BLOCK: usize = 256;

/// Element-wise arithmetic of one element type.
trait Arith: Copy {
    fn op_sum(self, o: Self) -> Self;
    fn op_prod(self, o: Self) -> Self;
    fn op_min(self, o: Self) -> Self;
    fn op_max(self, o: Self) -> Self;
}

macro_rules! int_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            // Fixed-width two's complement wrap-around, like numpy's integers.
            #[inline(always)]
            fn op_sum(self, o: Self) -> Self { self.wrapping_add(o) }
            #[inline(always)]
            fn op_prod(self, o: Self) -> Self { self.wrapping_mul(o) }
            #[inline(always)]
            fn op_min(self, o: Self) -> Self { Ord::min(self, o) }
            #[inline(always)]
            fn op_max(self, o: Self) -> Self { Ord::max(self, o) }
        }
    )*};
}
int_arith!(i8, u8, i32, i64);

macro_rules! float_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)]
            fn op_sum(self, o: Self) -> Self { self + o }
            #[inline(always)]
            fn op_prod(self, o: Self) -> Self { self * o }
            // NaN propagates (like numpy's `minimum`/`maximum`): if either side
            // is NaN the result is NaN, whatever the order of the operands.
            // For equal operands (only visible with +0.0 vs -0.0) the second
            // operand wins.
            #[inline(always)]
            fn op_min(self, o: Self) -> Self {
                if self < o || self.is_nan() { self } else { o }
            }
            #[inline(always)]
            fn op_max(self, o: Self) -> Self {
                if self > o || self.is_nan() { self } else { o }
            }
        }
    )*};
}
float_arith!(f32, f64);

/// bf16: widen both operands to f32, operate, round back to nearest-even.
impl Arith for bf16 {
    #[inline(always)]
    fn op_sum(self, o: Self) -> Self {
        f32_to_bf16(bf16_to_f32(self) + bf16_to_f32(o))
    }
    #[inline(always)]
    fn op_prod(self, o: Self) -> Self {
        f32_to_bf16(bf16_to_f32(self) * bf16_to_f32(o))
    }
    #[inline(always)]
    fn op_min(self, o: Self) -> Self {
        f32_to_bf16(bf16_to_f32(self).op_min(bf16_to_f32(o)))
    }
    #[inline(always)]
    fn op_max(self, o: Self) -> Self {
        f32_to_bf16(bf16_to_f32(self).op_max(bf16_to_f32(o)))
    }
}

#[inline(always)]
fn zip_inplace<T: Copy>(dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f(*d, s);
    }
}

#[inline(always)]
fn zip_into<T: Copy>(dst: &mut [T], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
    for (d, (&x, &y)) in dst.iter_mut().zip(a.iter().zip(b)) {
        *d = f(x, y);
    }
}

/// `zip_inplace` on byte slices of any alignment: unaligned loads and stores,
/// which vectorize just as well.
#[inline(always)]
fn zip_inplace_bytes<T: Pod>(dst: &mut [u8], src: &[u8], f: impl Fn(T, T) -> T) {
    let n = size_of::<T>();
    for (d, s) in dst.chunks_exact_mut(n).zip(src.chunks_exact(n)) {
        let r = f(pod_read_unaligned(d), pod_read_unaligned(s));
        d.copy_from_slice(bytes_of(&r));
    }
}

/// `zip_into` on byte slices of any alignment.
#[inline(always)]
fn zip_into_bytes<T: Pod>(dst: &mut [u8], a: &[u8], b: &[u8], f: impl Fn(T, T) -> T) {
    let n = size_of::<T>();
    for (d, (x, y)) in dst
        .chunks_exact_mut(n)
        .zip(a.chunks_exact(n).zip(b.chunks_exact(n)))
    {
        let r = f(pod_read_unaligned(x), pod_read_unaligned(y));
        d.copy_from_slice(bytes_of(&r));
    }
}

#[inline(always)]
fn map_inplace<T: Copy>(buf: &mut [T], f: impl Fn(T) -> T) {
    for x in buf {
        *x = f(*x);
    }
}

#[inline(always)]
fn map_into<T: Copy>(dst: &mut [T], src: &[T], f: impl Fn(T) -> T) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f(s);
    }
}

/// One monomorphized loop per operator; the `match` runs once per call.
fn arith_inplace<T: Arith>(op: ElemOp, dst: &mut [T], src: &[T]) {
    match op {
        ElemOp::Sum => zip_inplace(dst, src, T::op_sum),
        ElemOp::Prod => zip_inplace(dst, src, T::op_prod),
        ElemOp::Min => zip_inplace(dst, src, T::op_min),
        ElemOp::Max => zip_inplace(dst, src, T::op_max),
    }
}

fn arith_into<T: Arith>(op: ElemOp, dst: &mut [T], a: &[T], b: &[T]) {
    match op {
        ElemOp::Sum => zip_into(dst, a, b, T::op_sum),
        ElemOp::Prod => zip_into(dst, a, b, T::op_prod),
        ElemOp::Min => zip_into(dst, a, b, T::op_min),
        ElemOp::Max => zip_into(dst, a, b, T::op_max),
    }
}

fn arith_inplace_bytes<T: Arith + Pod>(op: ElemOp, dst: &mut [u8], src: &[u8]) {
    match op {
        ElemOp::Sum => zip_inplace_bytes(dst, src, T::op_sum),
        ElemOp::Prod => zip_inplace_bytes(dst, src, T::op_prod),
        ElemOp::Min => zip_inplace_bytes(dst, src, T::op_min),
        ElemOp::Max => zip_inplace_bytes(dst, src, T::op_max),
    }
}

fn arith_into_bytes<T: Arith + Pod>(op: ElemOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    match op {
        ElemOp::Sum => zip_into_bytes(dst, a, b, T::op_sum),
        ElemOp::Prod => zip_into_bytes(dst, a, b, T::op_prod),
        ElemOp::Min => zip_into_bytes(dst, a, b, T::op_min),
        ElemOp::Max => zip_into_bytes(dst, a, b, T::op_max),
    }
}

/// What every dtype supports. Slices passed in have equal lengths (the public
/// functions in `mod.rs` check).
pub(super) trait Kernel: Pod {
    fn reduce_inplace(op: ElemOp, dst: &mut [Self], src: &[Self]);
    fn reduce_into(op: ElemOp, dst: &mut [Self], a: &[Self], b: &[Self]);
    /// `reduce_inplace` on byte slices not both aligned for `Self`.
    fn reduce_inplace_unaligned(op: ElemOp, dst: &mut [u8], src: &[u8]);
    /// `reduce_into` on byte slices not all aligned for `Self`.
    fn reduce_into_unaligned(op: ElemOp, dst: &mut [u8], a: &[u8], b: &[u8]);
    /// `n >= 1`.
    fn divide(buf: &mut [Self], n: usize);
}

/// The [`Kernel`] reductions of a type with [`Arith`].
macro_rules! arith_reductions {
    () => {
        fn reduce_inplace(op: ElemOp, dst: &mut [Self], src: &[Self]) {
            arith_inplace(op, dst, src)
        }
        fn reduce_into(op: ElemOp, dst: &mut [Self], a: &[Self], b: &[Self]) {
            arith_into(op, dst, a, b)
        }
        fn reduce_inplace_unaligned(op: ElemOp, dst: &mut [u8], src: &[u8]) {
            arith_inplace_bytes::<Self>(op, dst, src)
        }
        fn reduce_into_unaligned(op: ElemOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
            arith_into_bytes::<Self>(op, dst, a, b)
        }
    };
}

/// What only the float dtypes support.
pub(super) trait FloatKernel: Kernel {
    fn scale(buf: &mut [Self], factor: f64);
    fn scale_into(dst: &mut [Self], src: &[Self], factor: f64);
}

// ---- integers ----

// i8, u8 and i32 divide through f64, which vectorizes (integer division does
// not). It is exact. Let q = x / n with |x| < 2^32. If n < 2^53 it converts
// exactly and the f64 quotient is within |q| * 2^-53 = |x| / n * 2^-53 < 1 / n
// of q, while a non-integer q lies at least 1 / n from every integer: rounding
// never reaches or crosses an integer, so `as` (truncation toward zero) yields
// the exact integer quotient (an integer q is representable, so exact). If
// n >= 2^53, both |q| and the computed quotient are below 1 and truncate to 0.
macro_rules! int_kernel_via_f64 {
    ($($t:ty),*) => {$(
        impl Kernel for $t {
            arith_reductions!();
            fn divide(buf: &mut [Self], n: usize) {
                let d = n as f64;
                map_inplace(buf, |x| (f64::from(x) / d) as $t)
            }
        }
    )*};
}
int_kernel_via_f64!(i8, u8, i32);

impl Kernel for i64 {
    arith_reductions!();
    fn divide(buf: &mut [Self], n: usize) {
        // Rust's `/` truncates toward zero; n > 0 so it cannot overflow.
        match i64::try_from(n) {
            Ok(d) => map_inplace(buf, |x| x / d),
            // n >= 2^63: only i64::MIN / 2^63 = -1 is nonzero; i128 gets it right.
            Err(_) => map_inplace(buf, |x| (i128::from(x) / n as i128) as i64),
        }
    }
}

// ---- f32, f64 ----

macro_rules! float_kernel {
    ($($t:ty),*) => {$(
        impl Kernel for $t {
            arith_reductions!();
            /// x / n with n converted to the dtype (as numpy does for
            /// `array / int`); a true division, not a multiply by 1/n.
            fn divide(buf: &mut [Self], n: usize) {
                let d = n as $t;
                map_inplace(buf, |x| x / d)
            }
        }

        /// The factor is rounded to the dtype first (numpy's rule for
        /// `array * python_float`).
        impl FloatKernel for $t {
            fn scale(buf: &mut [Self], factor: f64) {
                let f = factor as $t;
                map_inplace(buf, |x| x * f)
            }
            fn scale_into(dst: &mut [Self], src: &[Self], factor: f64) {
                let f = factor as $t;
                map_into(dst, src, |x| x * f)
            }
        }
    )*};
}
float_kernel!(f32, f64);

// ---- bf16 ----
//
// Element by element through f32 with the branch-free conversions below, which
// LLVM inlines and vectorizes with baseline SIMD (`half` converts bf16 with a
// scalar loop with branches, about 3x slower here). Their results are exactly
// `half`'s (the tests check every bf16, and the rounding boundaries of f32).
// For sum/prod of two bf16 operands, rounding the f32 result again to bf16
// gives the correctly rounded bf16 result (f32 has more than 2p+2 bits, so the
// double rounding is innocuous).

/// bf16 → f32, exact: bf16 is the top half of an f32. A NaN keeps its payload;
/// any arithmetic on it, and `f32_to_bf16`, quiet it.
#[inline(always)]
fn bf16_to_f32(h: bf16) -> f32 {
    f32::from_bits(u32::from(h.to_bits()) << 16)
}

/// f32 → bf16, round to nearest-even; NaN stays NaN (quieted, payload kept).
#[inline(always)]
fn f32_to_bf16(f: f32) -> bf16 {
    let x = f.to_bits();
    let nan = (x >> 16) | 0x0040;
    // Round on the 16 dropped bits; a carry moves into the exponent (up to
    // infinity). It can only wrap for NaN, whose result is not used.
    let rounded = x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16;
    let bits = if x & 0x7fff_ffff > 0x7f80_0000 {
        nan
    } else {
        rounded
    };
    bf16::from_bits(bits as u16)
}

impl Kernel for bf16 {
    arith_reductions!();
    /// x / n in f32 (n converted to f32), rounded to bf16.
    fn divide(buf: &mut [Self], n: usize) {
        let d = n as f32;
        map_inplace(buf, |x| f32_to_bf16(bf16_to_f32(x) / d))
    }
}

/// x * factor in f32 (factor rounded to f32, not to bf16), rounded to bf16.
impl FloatKernel for bf16 {
    fn scale(buf: &mut [Self], factor: f64) {
        let f = factor as f32;
        map_inplace(buf, |x| f32_to_bf16(bf16_to_f32(x) * f))
    }
    fn scale_into(dst: &mut [Self], src: &[Self], factor: f64) {
        let f = factor as f32;
        map_into(dst, src, |x| f32_to_bf16(bf16_to_f32(x) * f))
    }
}

// ---- f16 ----
//
// Blocks of BLOCK elements are widened into f32 scratch arrays on the stack
// with `half`'s slice conversions (F16C where the CPU has it, detected at run
// time), operated on with the f32 loops, and rounded back to nearest-even. As
// for bf16, this is the correctly rounded f16 result, which is also what numpy's
// float16 computes (it converts through f32 the same way).

impl Kernel for f16 {
    fn reduce_inplace(op: ElemOp, dst: &mut [Self], src: &[Self]) {
        let mut x = [0f32; BLOCK];
        let mut y = [0f32; BLOCK];
        for (d, s) in dst.chunks_mut(BLOCK).zip(src.chunks(BLOCK)) {
            let (x, y) = (&mut x[..d.len()], &mut y[..d.len()]);
            d.convert_to_f32_slice(x);
            s.convert_to_f32_slice(y);
            arith_inplace(op, x, y);
            d.convert_from_f32_slice(x);
        }
    }

    fn reduce_into(op: ElemOp, dst: &mut [Self], a: &[Self], b: &[Self]) {
        let mut x = [0f32; BLOCK];
        let mut y = [0f32; BLOCK];
        let blocks = a.chunks(BLOCK).zip(b.chunks(BLOCK));
        for (d, (a, b)) in dst.chunks_mut(BLOCK).zip(blocks) {
            let (x, y) = (&mut x[..d.len()], &mut y[..d.len()]);
            a.convert_to_f32_slice(x);
            b.convert_to_f32_slice(y);
            arith_inplace(op, x, y);
            d.convert_from_f32_slice(x);
        }
    }

    fn reduce_inplace_unaligned(op: ElemOp, dst: &mut [u8], src: &[u8]) {
        super::on_typed2::<f16>(dst, src, |d, s| f16::reduce_inplace(op, d, s))
    }

    fn reduce_into_unaligned(op: ElemOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
        super::on_typed3::<f16>(dst, a, b, |d, a, b| f16::reduce_into(op, d, a, b))
    }

    /// x / n in f32 (n converted to f32), rounded to f16.
    fn divide(buf: &mut [Self], n: usize) {
        let d = n as f32;
        f16_map_into_self(buf, |x| x / d)
    }
}

/// x * factor in f32 (factor rounded to f32, not to f16), rounded to f16.
impl FloatKernel for f16 {
    fn scale(buf: &mut [Self], factor: f64) {
        let f = factor as f32;
        f16_map_into_self(buf, |x| x * f)
    }

    fn scale_into(dst: &mut [Self], src: &[Self], factor: f64) {
        let f = factor as f32;
        let mut x = [0f32; BLOCK];
        for (d, s) in dst.chunks_mut(BLOCK).zip(src.chunks(BLOCK)) {
            let x = &mut x[..d.len()];
            s.convert_to_f32_slice(x);
            map_inplace(x, |v| v * f);
            d.convert_from_f32_slice(x);
        }
    }
}

/// buf[i] = f(buf[i]), computed in f32.
fn f16_map_into_self(buf: &mut [f16], f: impl Fn(f32) -> f32) {
    let mut x = [0f32; BLOCK];
    for d in buf.chunks_mut(BLOCK) {
        let x = &mut x[..d.len()];
        d.convert_to_f32_slice(x);
        map_inplace(x, &f);
        d.convert_from_f32_slice(x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The branch-free bf16 conversions give exactly `half`'s results.
    #[test]
    fn bf16_conversions_match_half() {
        for bits in 0..=u16::MAX {
            let h = bf16::from_bits(bits);
            let (mine, theirs) = (bf16_to_f32(h), h.to_f32());
            if theirs.is_nan() {
                assert!(mine.is_nan(), "{bits:#06x}");
                // Same bf16 after the round trip (both quiet the NaN).
                assert_eq!(
                    f32_to_bf16(mine).to_bits(),
                    bf16::from_f32(theirs).to_bits()
                );
            } else {
                assert_eq!(mine.to_bits(), theirs.to_bits(), "{bits:#06x}");
            }
        }
        // Every f32 exponent and sign (all high 16 bits) with the dropped low
        // 16 bits at every rounding boundary, and then some.
        let lows = [
            0u32, 1, 0x3fff, 0x7ffe, 0x7fff, 0x8000, 0x8001, 0xbfff, 0xc000, 0xfffe, 0xffff,
        ];
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for high in 0..=u32::from(u16::MAX) {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let random_low = (state >> 48) as u32;
            for low in lows.iter().copied().chain([random_low]) {
                let f = f32::from_bits(high << 16 | low);
                assert_eq!(
                    f32_to_bf16(f).to_bits(),
                    bf16::from_f32(f).to_bits(),
                    "{:#010x}",
                    f.to_bits()
                );
            }
        }
    }
}
