//! Typed kernels: the loops that do the arithmetic, on typed slices of equal
//! lengths (`mod.rs` views the byte slices as these), plus unaligned variants
//! of the reductions on byte slices.
//!
//! Every inner loop is a zip over slices with a select-only (branch-free) body,
//! so LLVM drops the bounds checks and vectorizes it. The reductions are
//! compiled once per CPU level (`multiversion`: AVX-512, AVX2, ... and the
//! baseline) and the best the CPU has is picked at run time, once: the wheel
//! stays portable, and bf16/f16, whose conversions cost a few instructions
//! per element, get the widest vectors.

use super::halves::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use super::prefetch;
use crate::types::ElemOp;
use bytemuck::{bytes_of, pod_read_unaligned, Pod};
use half::{bf16, f16};
use multiversion::multiversion;

/// Compiles a kernel once per CPU level and picks the best the CPU has at
/// run time (once): AVX-512, AVX2, SSE4.2, and the baseline the wheel is
/// built for.
macro_rules! vectorized {
    ($($item:item)*) => {$(
        #[multiversion(targets(
            "x86_64+avx512f+avx512bw+avx512vl+avx512dq",
            "x86_64+avx2+fma",
            "x86_64+sse4.2"
        ))]
        $item
    )*};
}

/// Elements per block, for staging misaligned data (see `mod.rs`): small
/// enough to stay in L1, big enough that the per-block overhead (an op
/// dispatch, a CPU feature check) vanishes.
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

/// bf16 and f16: widen both operands to f32, operate, round back to
/// nearest-even.
macro_rules! half_arith {
    ($($t:ty: $widen:ident, $narrow:ident);*) => {$(
        impl Arith for $t {
            #[inline(always)]
            fn op_sum(self, o: Self) -> Self {
                $narrow($widen(self) + $widen(o))
            }
            #[inline(always)]
            fn op_prod(self, o: Self) -> Self {
                $narrow($widen(self) * $widen(o))
            }
            #[inline(always)]
            fn op_min(self, o: Self) -> Self {
                $narrow($widen(self).op_min($widen(o)))
            }
            #[inline(always)]
            fn op_max(self, o: Self) -> Self {
                $narrow($widen(self).op_max($widen(o)))
            }
        }
    )*};
}
half_arith!(bf16: bf16_to_f32, f32_to_bf16; f16: f16_to_f32, f32_to_f16);

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

/// `zip_inplace` for kernels with many instructions a cache line (bf16):
/// a line at a time, asking for the line [`prefetch::AHEAD`] bytes on in
/// each buffer (`prefetch.rs`); the loop over one line is unrolled and
/// vectorized. Short buffers (likely in cache) take the plain loop, and so
/// do cheap kernels (float32): the hardware keeps enough of their loads in
/// flight, and a prefetch costs more in cache than it gains from memory.
#[inline(always)]
fn zip_inplace_ahead<T: Copy>(dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    if !prefetch::worth::<T>(dst.len()) {
        return zip_inplace(dst, src, f);
    }
    let (n, len) = (prefetch::line_of::<T>(), dst.len());
    let (d0, s0) = (dst.as_ptr(), src.as_ptr());
    let mut ds = dst.chunks_exact_mut(n);
    let mut ss = src.chunks_exact(n);
    for (i, (dl, sl)) in (&mut ds).zip(&mut ss).enumerate() {
        prefetch::ahead(d0, len, i * n);
        prefetch::ahead(s0, len, i * n);
        zip_inplace(dl, sl, &f);
    }
    zip_inplace(ds.into_remainder(), ss.remainder(), f);
}

/// `zip_into` as [`zip_inplace_ahead`].
#[inline(always)]
fn zip_into_ahead<T: Copy>(dst: &mut [T], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
    if !prefetch::worth::<T>(dst.len()) {
        return zip_into(dst, a, b, f);
    }
    let (n, len) = (prefetch::line_of::<T>(), dst.len());
    let (d0, a0, b0) = (dst.as_ptr(), a.as_ptr(), b.as_ptr());
    let mut ds = dst.chunks_exact_mut(n);
    let (mut xs, mut ys) = (a.chunks_exact(n), b.chunks_exact(n));
    for (i, (dl, (xl, yl))) in (&mut ds).zip((&mut xs).zip(&mut ys)).enumerate() {
        prefetch::ahead(d0, len, i * n);
        prefetch::ahead(a0, len, i * n);
        prefetch::ahead(b0, len, i * n);
        zip_into(dl, xl, yl, &f);
    }
    zip_into(ds.into_remainder(), xs.remainder(), ys.remainder(), f);
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

vectorized! {
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
// Element by element through f32 with the branch-free conversions of
// `halves.rs`, which LLVM inlines and vectorizes; two to a u32 lane where the
// operands allow (`bf16x2`). For sum/prod of two bf16 operands, rounding the
// f32 result again to bf16 gives the correctly rounded bf16 result (f32 has
// more than 2p+2 bits, so the double rounding is innocuous).

impl Kernel for bf16 {
    fn reduce_inplace(op: ElemOp, dst: &mut [Self], src: &[Self]) {
        let (dh, dm, dt) = bytemuck::pod_align_to_mut::<bf16, u32>(dst);
        let (sh, sm, st) = bytemuck::pod_align_to::<bf16, u32>(src);
        if dh.len() != sh.len() {
            return arith_inplace(op, dst, src);
        }
        arith_inplace(op, dh, sh);
        bf16_pairs_inplace(op, dm, sm);
        arith_inplace(op, dt, st);
    }
    fn reduce_into(op: ElemOp, dst: &mut [Self], a: &[Self], b: &[Self]) {
        let (dh, dm, dt) = bytemuck::pod_align_to_mut::<bf16, u32>(dst);
        let (ah, am, at) = bytemuck::pod_align_to::<bf16, u32>(a);
        let (bh, bm, bt) = bytemuck::pod_align_to::<bf16, u32>(b);
        if dh.len() != ah.len() || dh.len() != bh.len() {
            return arith_into(op, dst, a, b);
        }
        arith_into(op, dh, ah, bh);
        bf16_pairs_into(op, dm, am, bm);
        arith_into(op, dt, at, bt);
    }
    fn reduce_inplace_unaligned(op: ElemOp, dst: &mut [u8], src: &[u8]) {
        arith_inplace_bytes::<Self>(op, dst, src)
    }
    fn reduce_into_unaligned(op: ElemOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
        arith_into_bytes::<Self>(op, dst, a, b)
    }
    /// x / n in f32 (n converted to f32), rounded to bf16.
    fn divide(buf: &mut [Self], n: usize) {
        let d = n as f32;
        map_inplace(buf, |x| f32_to_bf16(bf16_to_f32(x) / d))
    }
}

/// Two bf16 in one u32 (either order: both operands are viewed alike), each
/// operated on in f32 and rounded back, without taking the pair apart into
/// two lanes: the high one is the f32 whose low bits are cleared, the low
/// one is shifted up. Vector code then has no widening or narrowing
/// shuffles, which cap the one-per-lane kernel on x86.
#[inline(always)]
fn bf16x2(a: u32, b: u32, f: impl Fn(f32, f32) -> f32) -> u32 {
    let hi = f(
        f32::from_bits(a & 0xffff_0000),
        f32::from_bits(b & 0xffff_0000),
    );
    let lo = f(f32::from_bits(a << 16), f32::from_bits(b << 16));
    u32::from(f32_to_bf16(hi).to_bits()) << 16 | u32::from(f32_to_bf16(lo).to_bits())
}

/// `bf16x2` for sum and product, in fewer instructions: the rounding needs
/// no NaN case, since an f32 sum or product of two bf16 is a NaN only as a
/// quiet NaN whose low 16 bits are clear (an operand's, quieted, or the
/// default one), which the rounding leaves as it is: the same bits as
/// `f32_to_bf16`. The high result is rounded in place and masked, not
/// shifted down and up again.
#[inline(always)]
fn bf16x2_arith(a: u32, b: u32, f: impl Fn(f32, f32) -> f32) -> u32 {
    #[inline(always)]
    fn round_high(x: u32) -> u32 {
        x.wrapping_add(0x7fff + ((x >> 16) & 1))
    }
    let hi = f(
        f32::from_bits(a & 0xffff_0000),
        f32::from_bits(b & 0xffff_0000),
    );
    let lo = f(f32::from_bits(a << 16), f32::from_bits(b << 16));
    round_high(hi.to_bits()) & 0xffff_0000 | round_high(lo.to_bits()) >> 16
}

vectorized! {
    fn bf16_pairs_inplace(op: ElemOp, dst: &mut [u32], src: &[u32]) {
        match op {
            ElemOp::Sum => zip_inplace_ahead(dst, src, |a, b| bf16x2_arith(a, b, f32::op_sum)),
            ElemOp::Prod => zip_inplace_ahead(dst, src, |a, b| bf16x2_arith(a, b, f32::op_prod)),
            ElemOp::Min => zip_inplace_ahead(dst, src, |a, b| bf16x2(a, b, f32::op_min)),
            ElemOp::Max => zip_inplace_ahead(dst, src, |a, b| bf16x2(a, b, f32::op_max)),
        }
    }

    fn bf16_pairs_into(op: ElemOp, dst: &mut [u32], a: &[u32], b: &[u32]) {
        match op {
            ElemOp::Sum => zip_into_ahead(dst, a, b, |a, b| bf16x2_arith(a, b, f32::op_sum)),
            ElemOp::Prod => zip_into_ahead(dst, a, b, |a, b| bf16x2_arith(a, b, f32::op_prod)),
            ElemOp::Min => zip_into_ahead(dst, a, b, |a, b| bf16x2(a, b, f32::op_min)),
            ElemOp::Max => zip_into_ahead(dst, a, b, |a, b| bf16x2(a, b, f32::op_max)),
        }
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
// As bf16, element by element through f32, which is the correctly rounded f16
// result and what numpy's float16 computes (it converts through f32 the same
// way); with the CPU's F16C conversions where it has them (`f16c.rs`), and the
// branch-free ones of `halves.rs` for the rest.

impl Kernel for f16 {
    fn reduce_inplace(op: ElemOp, dst: &mut [Self], src: &[Self]) {
        let done = f16c_inplace(op, dst, src);
        arith_inplace(op, &mut dst[done..], &src[done..])
    }
    fn reduce_into(op: ElemOp, dst: &mut [Self], a: &[Self], b: &[Self]) {
        let done = f16c_into(op, dst, a, b);
        arith_into(op, &mut dst[done..], &a[done..], &b[done..])
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
        map_inplace(buf, |x| f32_to_f16(f16_to_f32(x) / d))
    }
}

/// The elements the F16C kernels did (0 without them).
fn f16c_inplace(op: ElemOp, dst: &mut [f16], src: &[f16]) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        super::f16c::reduce_inplace(op, dst, src).unwrap_or(0)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (op, dst, src);
        0
    }
}

fn f16c_into(op: ElemOp, dst: &mut [f16], a: &[f16], b: &[f16]) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        super::f16c::reduce_into(op, dst, a, b).unwrap_or(0)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (op, dst, a, b);
        0
    }
}

/// x * factor in f32 (factor rounded to f32, not to f16), rounded to f16.
impl FloatKernel for f16 {
    fn scale(buf: &mut [Self], factor: f64) {
        let f = factor as f32;
        map_inplace(buf, |x| f32_to_f16(f16_to_f32(x) * f))
    }
    fn scale_into(dst: &mut [Self], src: &[Self], factor: f64) {
        let f = factor as f32;
        map_into(dst, src, |x| f32_to_f16(f16_to_f32(x) * f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The portable f16 kernels (the tails, and CPUs without F16C) give
    /// bit for bit what the dispatched ones do on whole vectors (F16C here),
    /// NaN for NaN.
    #[test]
    fn portable_f16_kernels_match_the_dispatched_ones() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut draw = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            f16::from_bits(state as u16)
        };
        let a: Vec<f16> = (0..4099).map(|_| draw()).collect();
        let b: Vec<f16> = (0..4099).map(|_| draw()).collect();
        let same = |x: f16, y: f16| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan());
        for op in [ElemOp::Sum, ElemOp::Prod, ElemOp::Min, ElemOp::Max] {
            let mut portable = a.clone();
            arith_inplace(op, &mut portable, &b);
            let mut dispatched = a.clone();
            f16::reduce_inplace(op, &mut dispatched, &b);
            let mut into = vec![f16::ZERO; a.len()];
            f16::reduce_into(op, &mut into, &a, &b);
            for i in 0..a.len() {
                assert!(same(portable[i], dispatched[i]), "{op:?} [{i}]");
                assert!(same(portable[i], into[i]), "{op:?} into [{i}]");
            }
        }
    }
}
