//! Checks every dtype × op against a scalar reference that computes in a wide
//! type (i128 for integers, f64 for floats) and narrows once at the end, on
//! aligned and misaligned buffers.

use super::*;
use half::{bf16, f16};

const LENS: [usize; 6] = [0, 1, 7, 33, 1000, 4097];
const OPS: [ElemOp; 4] = [ElemOp::Sum, ElemOp::Prod, ElemOp::Min, ElemOp::Max];

/// xorshift64*: deterministic test data without a `rand` dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// A value in [-100, 100) with a fractional part.
    fn moderate(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 * 200.0 - 100.0
    }
}

/// A byte buffer whose data starts at `offset` bytes past an 8-aligned address,
/// so offset 1 is misaligned for every dtype wider than a byte.
struct Buf {
    words: Vec<u64>,
    offset: usize,
    len: usize,
}

impl Buf {
    fn new(len: usize, offset: usize) -> Buf {
        Buf {
            words: vec![0; (len + offset).div_ceil(8) + 1],
            offset,
            len,
        }
    }
    fn from(bytes: &[u8], offset: usize) -> Buf {
        let mut b = Buf::new(bytes.len(), offset);
        b.bytes_mut().copy_from_slice(bytes);
        b
    }
    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[self.offset..self.offset + self.len]
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[self.offset..self.offset + self.len]
    }
}

/// One element, widened.
#[derive(Clone, Copy, Debug)]
enum V {
    F(f64),
    I(i128),
}

fn get(dtype: DType, bytes: &[u8], i: usize) -> V {
    let s = dtype.size();
    let b = &bytes[i * s..(i + 1) * s];
    match dtype {
        DType::F16 => V::F(f16::from_ne_bytes(b.try_into().unwrap()).to_f64()),
        DType::BF16 => V::F(bf16::from_ne_bytes(b.try_into().unwrap()).to_f64()),
        DType::F32 => V::F(f32::from_ne_bytes(b.try_into().unwrap()).into()),
        DType::F64 => V::F(f64::from_ne_bytes(b.try_into().unwrap())),
        DType::I8 => V::I(i8::from_ne_bytes(b.try_into().unwrap()).into()),
        DType::U8 => V::I(u8::from_ne_bytes(b.try_into().unwrap()).into()),
        DType::I32 => V::I(i32::from_ne_bytes(b.try_into().unwrap()).into()),
        DType::I64 => V::I(i64::from_ne_bytes(b.try_into().unwrap()).into()),
    }
}

/// Narrows: integers truncate to the low bits (two's complement wrap); floats
/// round to nearest-even (f64 → f32 → 16 bits: each step has more than 2p+2
/// bits, so this is the correctly rounded result of an exact operation).
fn put(dtype: DType, bytes: &mut [u8], i: usize, v: V) {
    let s = dtype.size();
    let b = &mut bytes[i * s..(i + 1) * s];
    match (dtype, v) {
        (DType::F16, V::F(x)) => b.copy_from_slice(&f16::from_f32(x as f32).to_ne_bytes()),
        (DType::BF16, V::F(x)) => b.copy_from_slice(&bf16::from_f32(x as f32).to_ne_bytes()),
        (DType::F32, V::F(x)) => b.copy_from_slice(&(x as f32).to_ne_bytes()),
        (DType::F64, V::F(x)) => b.copy_from_slice(&x.to_ne_bytes()),
        (DType::I8, V::I(x)) => b.copy_from_slice(&(x as i8).to_ne_bytes()),
        (DType::U8, V::I(x)) => b.copy_from_slice(&(x as u8).to_ne_bytes()),
        (DType::I32, V::I(x)) => b.copy_from_slice(&(x as i32).to_ne_bytes()),
        (DType::I64, V::I(x)) => b.copy_from_slice(&(x as i64).to_ne_bytes()),
        _ => unreachable!(),
    }
}

fn ref_op(op: ElemOp, a: V, b: V) -> V {
    match (a, b) {
        (V::I(a), V::I(b)) => V::I(match op {
            ElemOp::Sum => a + b,
            // Operands are at most 64 bits wide: exact in i128.
            ElemOp::Prod => a * b,
            ElemOp::Min => a.min(b),
            ElemOp::Max => a.max(b),
        }),
        (V::F(a), V::F(b)) => V::F(match op {
            ElemOp::Sum => a + b,
            ElemOp::Prod => a * b,
            _ if a.is_nan() || b.is_nan() => f64::NAN,
            ElemOp::Min => a.min(b),
            ElemOp::Max => a.max(b),
        }),
        _ => unreachable!(),
    }
}

fn reference(dtype: DType, op: ElemOp, a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut out = vec![0; a.len()];
    for i in 0..a.len() / dtype.size() {
        put(
            dtype,
            &mut out,
            i,
            ref_op(op, get(dtype, a, i), get(dtype, b, i)),
        );
    }
    out
}

/// Element-wise comparison: any NaN matches any NaN (payloads are not
/// specified); sum and prod must match bit for bit otherwise, min and max by
/// value (the sign of a zero picked between +0.0 and -0.0 is not specified).
fn assert_same(dtype: DType, op: Option<ElemOp>, got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let s = dtype.size();
    for i in 0..got.len() / s {
        let (g, w) = (get(dtype, got, i), get(dtype, want, i));
        let ok = match (g, w) {
            (V::F(g), V::F(w)) if g.is_nan() || w.is_nan() => g.is_nan() && w.is_nan(),
            (V::F(g), V::F(w)) if matches!(op, Some(ElemOp::Min | ElemOp::Max)) => g == w,
            _ => got[i * s..(i + 1) * s] == want[i * s..(i + 1) * s],
        };
        assert!(
            ok,
            "{what}: {dtype} {op:?} element {i}: got {g:?}, want {w:?}"
        );
    }
}

/// Random bytes for `n` elements: integers take all bit patterns; floats mix
/// raw bit patterns (NaN, inf, subnormals, huge and tiny values) with moderate
/// values whose sums and products are ordinary numbers.
fn random_bytes(dtype: DType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let mut out = vec![0; n * dtype.size()];
    for i in 0..n {
        let bits = rng.next().to_ne_bytes();
        let s = dtype.size();
        let raw = dtype.is_float() && rng.next().is_multiple_of(4);
        if dtype.is_float() && !raw {
            put(dtype, &mut out, i, V::F(rng.moderate()));
        } else {
            out[i * s..(i + 1) * s].copy_from_slice(&bits[..s]);
        }
    }
    out
}

/// The byte offsets to try for a dtype: aligned, and misaligned by one;
/// for 2-byte dtypes also aligned for them but not for the u32 pairs the
/// bf16 kernels take (operands then split at different places).
fn offsets(dtype: DType) -> &'static [usize] {
    match dtype.size() {
        1 => &[0],
        2 => &[0, 1, 2],
        _ => &[0, 1],
    }
}

#[test]
fn reduce_inplace_matches_reference() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for dtype in DType::ALL {
        for op in OPS {
            for n in LENS {
                let a = random_bytes(dtype, n, &mut rng);
                let b = random_bytes(dtype, n, &mut rng);
                let want = reference(dtype, op, &a, &b);
                for &od in offsets(dtype) {
                    for &os in offsets(dtype) {
                        let mut dst = Buf::from(&a, od);
                        let src = Buf::from(&b, os);
                        reduce_inplace(dtype, op, dst.bytes_mut(), src.bytes());
                        let what = format!("reduce_inplace n={n} dst+{od} src+{os}");
                        assert_same(dtype, Some(op), dst.bytes(), &want, &what);
                        assert_eq!(src.bytes(), &b[..], "{what}: src modified");
                    }
                }
            }
        }
    }
}

#[test]
fn reduce_into_matches_reference() {
    let mut rng = Rng(0x0bad_cafe_f00d_0001);
    for dtype in DType::ALL {
        for op in OPS {
            for n in LENS {
                let a = random_bytes(dtype, n, &mut rng);
                let b = random_bytes(dtype, n, &mut rng);
                let want = reference(dtype, op, &a, &b);
                for &od in offsets(dtype) {
                    for &oa in offsets(dtype) {
                        for &ob in offsets(dtype) {
                            let mut dst = Buf::new(a.len(), od);
                            dst.bytes_mut().fill(0xa5);
                            let (ba, bb) = (Buf::from(&a, oa), Buf::from(&b, ob));
                            reduce_into(dtype, op, dst.bytes_mut(), ba.bytes(), bb.bytes());
                            let what = format!("reduce_into n={n} dst+{od} a+{oa} b+{ob}");
                            assert_same(dtype, Some(op), dst.bytes(), &want, &what);
                        }
                    }
                }
            }
        }
    }
}

/// Buffers long enough for the half-precision kernels to prefetch
/// (`prefetch.rs`: from 256 KiB), with an odd tail, aligned and not.
#[test]
fn long_half_buffers_match_reference() {
    let mut rng = Rng(0x5eed_0f1a_2b3c_4d5e);
    let n = (256 << 10) / 2 + 37;
    for dtype in [DType::BF16, DType::F16] {
        for op in OPS {
            let a = random_bytes(dtype, n, &mut rng);
            let b = random_bytes(dtype, n, &mut rng);
            let want = reference(dtype, op, &a, &b);
            for (od, os) in [(0, 0), (2, 2), (0, 2)] {
                let mut dst = Buf::from(&a, od);
                let src = Buf::from(&b, os);
                reduce_inplace(dtype, op, dst.bytes_mut(), src.bytes());
                let what = format!("long reduce_inplace dst+{od} src+{os}");
                assert_same(dtype, Some(op), dst.bytes(), &want, &what);
                let mut into = Buf::new(a.len(), od);
                let ba = Buf::from(&a, os);
                reduce_into(dtype, op, into.bytes_mut(), ba.bytes(), src.bytes());
                let what = format!("long reduce_into dst+{od} a+{os} b+{os}");
                assert_same(dtype, Some(op), into.bytes(), &want, &what);
            }
        }
    }
}

/// Reduces single elements given as typed values, in place and into.
fn reduce1<T: bytemuck::Pod>(dtype: DType, op: ElemOp, a: T, b: T) -> T {
    let (a, b) = ([a], [b]);
    let mut dst = a;
    reduce_inplace(
        dtype,
        op,
        bytemuck::cast_slice_mut(&mut dst),
        bytemuck::cast_slice(&b),
    );
    let mut dst2 = a;
    reduce_into(
        dtype,
        op,
        bytemuck::cast_slice_mut(&mut dst2),
        bytemuck::cast_slice(&a),
        bytemuck::cast_slice(&b),
    );
    assert_eq!(
        bytemuck::bytes_of(&dst),
        bytemuck::bytes_of(&dst2),
        "inplace and into disagree"
    );
    dst[0]
}

#[test]
fn integer_sum_and_prod_wrap_around() {
    use ElemOp::{Prod, Sum};
    assert_eq!(reduce1(DType::I8, Sum, 127i8, 1), -128);
    assert_eq!(reduce1(DType::I8, Sum, -128i8, -1), 127);
    assert_eq!(reduce1(DType::I8, Prod, -128i8, -1), -128);
    assert_eq!(reduce1(DType::I8, Prod, 16i8, 16), 0);
    assert_eq!(reduce1(DType::I8, Prod, 100i8, 3), 44);
    assert_eq!(reduce1(DType::U8, Sum, 255u8, 1), 0);
    assert_eq!(reduce1(DType::U8, Sum, 200u8, 100), 44);
    assert_eq!(reduce1(DType::U8, Prod, 16u8, 16), 0);
    assert_eq!(reduce1(DType::U8, Prod, 200u8, 2), 144);
    assert_eq!(reduce1(DType::I32, Sum, i32::MAX, 1), i32::MIN);
    assert_eq!(reduce1(DType::I32, Prod, 65536i32, 65536), 0);
    assert_eq!(reduce1(DType::I32, Prod, i32::MIN, -1), i32::MIN);
    assert_eq!(reduce1(DType::I64, Sum, i64::MAX, 1), i64::MIN);
    assert_eq!(reduce1(DType::I64, Sum, i64::MIN, -1), i64::MAX);
    assert_eq!(reduce1(DType::I64, Prod, 1i64 << 32, 1 << 32), 0);
    assert_eq!(reduce1(DType::I64, Prod, i64::MAX, 2), -2);
    // min / max are the ordinary ones, signed or not.
    assert_eq!(reduce1(DType::I8, ElemOp::Min, -128i8, 127), -128);
    assert_eq!(reduce1(DType::U8, ElemOp::Max, 0u8, 255), 255);
    assert_eq!(
        reduce1(DType::I64, ElemOp::Min, i64::MIN, i64::MAX),
        i64::MIN
    );
}

#[test]
fn f16_rounds_to_nearest_even() {
    use ElemOp::{Prod, Sum};
    let h = |x: f64| f16::from_f64(x);
    let r = |op, a: f64, b: f64| reduce1(DType::F16, op, h(a), h(b));
    let ulp = 2f64.powi(-10); // f16 ulp at 1.0
                              // Ties go to the even neighbour.
    assert_eq!(r(Sum, 1.0, ulp / 2.0), h(1.0));
    assert_eq!(r(Sum, 1.0 + ulp, ulp / 2.0), h(1.0 + 2.0 * ulp));
    // Above a tie rounds up, below rounds down.
    assert_eq!(r(Sum, 1.0, ulp / 2.0 + ulp / 4.0), h(1.0 + ulp));
    assert_eq!(r(Sum, 1.0, ulp / 4.0), h(1.0));
    // Overflow: 65504 is the largest finite f16; 65520 is the tie with 65536.
    assert_eq!(r(Sum, 65504.0, 8.0), h(65504.0));
    assert_eq!(r(Sum, 65504.0, 16.0), f16::INFINITY);
    assert_eq!(r(Prod, 256.0, 256.0), f16::INFINITY);
    assert_eq!(r(Prod, -256.0, 256.0), f16::NEG_INFINITY);
    // Underflow into subnormals: 2^-24 is the smallest; 2^-25 is the tie with 0.
    assert_eq!(r(Prod, 2f64.powi(-14), 2f64.powi(-10)), h(2f64.powi(-24)));
    assert_eq!(r(Prod, 2f64.powi(-14), 2f64.powi(-11)), h(0.0));
    assert_eq!(
        r(Prod, 2f64.powi(-14), 1.5 * 2f64.powi(-11)),
        h(2f64.powi(-24))
    );
    assert_eq!(
        r(Prod, 2f64.powi(-14), 3.0 * 2f64.powi(-11)),
        h(2f64.powi(-23))
    );
    // A product that needs more than 11 bits.
    assert_eq!(r(Prod, 1.0 + ulp, 1.0 + ulp), h(1.0 + 2.0 * ulp));
    assert_eq!(
        r(Prod, 1.0 + 3.0 * ulp, 1.0 + 3.0 * ulp),
        h(1.0 + 6.0 * ulp)
    );
    // Sign of zero: -0 + -0 = -0, -0 + 0 = +0.
    assert_eq!(r(Sum, -0.0, -0.0).to_bits(), 0x8000);
    assert_eq!(r(Sum, -0.0, 0.0).to_bits(), 0x0000);
    // 0.1 + 0.2 in f16 (numpy: float16(0.1) + float16(0.2) == float16(0.2998)).
    assert_eq!(r(Sum, 0.1, 0.2).to_bits(), 0x34cc);
}

#[test]
fn bf16_rounds_to_nearest_even() {
    use ElemOp::{Prod, Sum};
    let h = |x: f64| bf16::from_f64(x);
    let r = |op, a: f64, b: f64| reduce1(DType::BF16, op, h(a), h(b));
    let ulp = 2f64.powi(-7); // bf16 ulp at 1.0
    assert_eq!(r(Sum, 1.0, ulp / 2.0), h(1.0));
    assert_eq!(r(Sum, 1.0 + ulp, ulp / 2.0), h(1.0 + 2.0 * ulp));
    assert_eq!(r(Sum, 1.0, ulp * 0.75), h(1.0 + ulp));
    assert_eq!(r(Prod, 1.0 + ulp, 1.0 + ulp), h(1.0 + 2.0 * ulp));
    assert_eq!(r(Prod, 1e30, 1e30), bf16::INFINITY);
    assert_eq!(r(Sum, f64::from(bf16::MAX.to_f32()), 1e36), bf16::INFINITY);
}

/// Every bf16 against a set of operands that covers the special cases, in
/// both orders, in place and into: each result has the very bits (NaN
/// payloads and signs included) of widening, operating in f32 and rounding
/// with `half`, which the vector kernels' shortcuts must not change. Of two
/// NaN operands, either one's payload (quieted) may come out: the compiler
/// may swap the operands of a vector add, and x86 keeps the first.
#[test]
fn bf16_sum_and_prod_keep_every_bit_of_the_f32_rounding() {
    let others: Vec<u16> = vec![
        0x0000, 0x8000, 0x3f80, 0xbf80, 0x0001, 0x8001, 0x007f, 0x7f7f, 0xff7f, 0x7f80, 0xff80,
        0x7fc0, 0xffc0, 0x7f81, 0xff81, 0x7fff, 0x7fa5, 0x4049, 0x3c01, 0xc2f7,
    ];
    let all: Vec<u16> = (0..=u16::MAX).collect();
    for (op, f) in [
        (ElemOp::Sum, (|a, b| a + b) as fn(f32, f32) -> f32),
        (ElemOp::Prod, |a, b| a * b),
    ] {
        for &o in &others {
            let other = vec![o; all.len()];
            for (a, b) in [(&all, &other), (&other, &all)] {
                let want: Vec<u16> = a
                    .iter()
                    .zip(b)
                    .map(|(&x, &y)| {
                        let (x, y) = (bf16::from_bits(x).to_f32(), bf16::from_bits(y).to_f32());
                        bf16::from_f32(f(x, y)).to_bits()
                    })
                    .collect();
                let mut dst = a.clone();
                reduce_inplace(
                    DType::BF16,
                    op,
                    bytemuck::cast_slice_mut(&mut dst),
                    bytemuck::cast_slice(b),
                );
                let mut into = vec![0u16; a.len()];
                reduce_into(
                    DType::BF16,
                    op,
                    bytemuck::cast_slice_mut(&mut into),
                    bytemuck::cast_slice(a),
                    bytemuck::cast_slice(b),
                );
                let nan = |x: u16| x & 0x7fff > 0x7f80;
                for (i, w) in want.iter().enumerate() {
                    let (x, y) = (a[i], b[i]);
                    for (got, how) in [(dst[i], "in place"), (into[i], "into")] {
                        if nan(x) && nan(y) {
                            let ok = got == x | 0x0040 || got == y | 0x0040;
                            assert!(ok, "{op:?} {x:#06x} {y:#06x} {how}: {got:#06x}");
                        } else {
                            assert_eq!(got, *w, "{op:?} {x:#06x} {y:#06x} {how}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn float_min_max_propagate_nan() {
    use ElemOp::{Max, Min};
    for op in [Min, Max] {
        assert!(reduce1(DType::F32, op, f32::NAN, 1.0).is_nan());
        assert!(reduce1(DType::F32, op, 1.0, f32::NAN).is_nan());
        assert!(reduce1(DType::F64, op, f64::NAN, -1.0).is_nan());
        assert!(reduce1(DType::F64, op, f64::INFINITY, f64::NAN).is_nan());
        assert!(reduce1(DType::F16, op, f16::NAN, f16::ONE).is_nan());
        assert!(reduce1(DType::F16, op, f16::ONE, f16::NAN).is_nan());
        assert!(reduce1(DType::BF16, op, bf16::NAN, bf16::ONE).is_nan());
        assert!(reduce1(DType::BF16, op, bf16::ONE, bf16::NAN).is_nan());
    }
    assert_eq!(
        reduce1(DType::F32, Min, f32::NEG_INFINITY, 1.0),
        f32::NEG_INFINITY
    );
    assert_eq!(reduce1(DType::F32, Max, f32::NEG_INFINITY, 1.0), 1.0);
    assert_eq!(reduce1(DType::F64, Max, f64::INFINITY, 1.0), f64::INFINITY);
    assert_eq!(
        reduce1(DType::F16, Min, f16::from_f32(-2.5), f16::ONE),
        f16::from_f32(-2.5)
    );
    assert_eq!(
        reduce1(DType::BF16, Max, bf16::from_f32(-2.5), bf16::ONE),
        bf16::ONE
    );
}

/// Runs `divide` on `xs` both aligned and misaligned, checks both agree, and
/// returns the result.
fn divide_vec<T: bytemuck::Pod + std::fmt::Debug + PartialEq>(
    dtype: DType,
    xs: &[T],
    n: usize,
) -> Vec<T> {
    let mut out = xs.to_vec();
    divide(dtype, bytemuck::cast_slice_mut(&mut out), n);
    for &off in offsets(dtype) {
        let mut b = Buf::from(bytemuck::cast_slice(xs), off);
        divide(dtype, b.bytes_mut(), n);
        assert_eq!(
            b.bytes(),
            bytemuck::cast_slice::<T, u8>(&out),
            "offset {off}"
        );
    }
    out
}

#[test]
fn divide_integers_truncates_toward_zero() {
    assert_eq!(
        divide_vec(DType::I8, &[-7i8, 7, -8, 8, -1, 1, 0], 2),
        [-3, 3, -4, 4, 0, 0, 0]
    );
    assert_eq!(
        divide_vec(DType::I32, &[-7i32, 7, -8, 9], 3),
        [-2, 2, -2, 3]
    );
    assert_eq!(
        divide_vec(DType::I64, &[-7i64, 7, i64::MIN, i64::MAX], 2),
        [-3, 3, i64::MIN / 2, i64::MAX / 2]
    );
    assert_eq!(divide_vec(DType::I8, &[-128i8, 127], 128), [-1, 0]);
    assert_eq!(divide_vec(DType::I8, &[-128i8, 127], 129), [0, 0]);
    assert_eq!(divide_vec(DType::U8, &[255u8, 254], 255), [1, 0]);
    assert_eq!(divide_vec(DType::U8, &[255u8], 1000), [0]);
    assert_eq!(
        divide_vec(DType::I32, &[i32::MIN, i32::MAX], 1 << 31),
        [-1, 0]
    );
    assert_eq!(
        divide_vec(DType::I32, &[i32::MIN, i32::MAX], usize::MAX),
        [0, 0]
    );
    assert_eq!(
        divide_vec(DType::I64, &[i64::MIN, i64::MAX], 1 << 63),
        [-1, 0]
    );
    assert_eq!(
        divide_vec(DType::I64, &[i64::MIN, i64::MAX], usize::MAX),
        [0, 0]
    );
    assert_eq!(
        divide_vec(DType::I64, &[i64::MIN, i64::MAX, -5], 1),
        [i64::MIN, i64::MAX, -5]
    );

    // Exhaustive for the byte types, every divisor up to past the range.
    let all_i8: Vec<i8> = (i8::MIN..=i8::MAX).collect();
    let all_u8: Vec<u8> = (u8::MIN..=u8::MAX).collect();
    for n in 1..=300usize {
        let got = divide_vec(DType::I8, &all_i8, n);
        let want: Vec<i8> = all_i8
            .iter()
            .map(|&x| (i64::from(x) / n as i64) as i8)
            .collect();
        assert_eq!(got, want, "i8 / {n}");
        let got = divide_vec(DType::U8, &all_u8, n);
        let want: Vec<u8> = all_u8
            .iter()
            .map(|&x| (u64::from(x) / n as u64) as u8)
            .collect();
        assert_eq!(got, want, "u8 / {n}");
    }

    // Random and extreme i32 / i64 against i128 division.
    let mut rng = Rng(42);
    let mut ns: Vec<usize> = vec![
        1,
        2,
        3,
        7,
        8,
        10,
        1000,
        65535,
        1 << 31,
        (1 << 31) + 1,
        1 << 53,
        (1 << 53) + 1,
    ];
    ns.extend((0..40).map(|i| (rng.next() >> (i % 62)) as usize | 1));
    let mut x32: Vec<i32> = vec![i32::MIN, i32::MIN + 1, i32::MAX, i32::MAX - 1, -1, 0, 1];
    x32.extend((0..1000).map(|_| rng.next() as i32));
    x32.extend((0..1000).map(|i| (rng.next() as i32) >> (i % 31)));
    let mut x64: Vec<i64> = vec![i64::MIN, i64::MIN + 1, i64::MAX, i64::MAX - 1, -1, 0, 1];
    x64.extend((0..1000).map(|i| (rng.next() as i64) >> (i % 63)));
    for &n in &ns {
        let got = divide_vec(DType::I32, &x32, n);
        let want: Vec<i32> = x32
            .iter()
            .map(|&x| (i128::from(x) / n as i128) as i32)
            .collect();
        assert_eq!(got, want, "i32 / {n}");
        let got = divide_vec(DType::I64, &x64, n);
        let want: Vec<i64> = x64
            .iter()
            .map(|&x| (i128::from(x) / n as i128) as i64)
            .collect();
        assert_eq!(got, want, "i64 / {n}");
    }
}

#[test]
fn divide_floats_matches_reference() {
    let mut rng = Rng(7);
    for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        for len in LENS {
            let xs = random_bytes(dtype, len, &mut rng);
            for n in [1usize, 2, 3, 7, 8, 1000] {
                // The division of two values of the dtype, correctly rounded
                // (f64 then narrowing has enough bits to round once).
                let mut want = xs.clone();
                for i in 0..len {
                    let V::F(x) = get(dtype, &xs, i) else {
                        unreachable!()
                    };
                    put(dtype, &mut want, i, V::F(x / n as f64));
                }
                for &off in offsets(dtype) {
                    let mut b = Buf::from(&xs, off);
                    divide(dtype, b.bytes_mut(), n);
                    assert_same(
                        dtype,
                        None,
                        b.bytes(),
                        &want,
                        &format!("divide n={n} +{off}"),
                    );
                }
            }
        }
    }
    let third = divide_vec(DType::F32, &[1.0f32, -1.0, 0.0, f32::INFINITY], 3);
    assert_eq!(third, [1.0 / 3.0, -1.0 / 3.0, 0.0, f32::INFINITY]);
    let h = divide_vec(DType::F16, &[f16::from_f32(1.0), f16::from_f32(-7.0)], 2);
    assert_eq!(h, [f16::from_f32(0.5), f16::from_f32(-3.5)]);
}

#[test]
fn scale_matches_reference() {
    let mut rng = Rng(99);
    for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        for len in LENS {
            let xs = random_bytes(dtype, len, &mut rng);
            for factor in [0.5, 1.0 / 3.0, -2.75, 1e-3, 0.0, 1e6] {
                // f16/bf16/f32: factor rounded to f32, the product of two f32
                // is exact in f64, then narrowed once. f64: plain product.
                let f = if dtype == DType::F64 {
                    factor
                } else {
                    f64::from(factor as f32)
                };
                let mut want = xs.clone();
                for i in 0..len {
                    let V::F(x) = get(dtype, &xs, i) else {
                        unreachable!()
                    };
                    put(dtype, &mut want, i, V::F(x * f));
                }
                for &off in offsets(dtype) {
                    let what = format!("{dtype} len={len} factor={factor} +{off}");
                    let mut b = Buf::from(&xs, off);
                    scale(dtype, b.bytes_mut(), factor);
                    assert_same(dtype, None, b.bytes(), &want, &format!("scale {what}"));
                    for &od in offsets(dtype) {
                        let src = Buf::from(&xs, off);
                        let mut dst = Buf::new(xs.len(), od);
                        scale_into(dtype, dst.bytes_mut(), src.bytes(), factor);
                        let what = format!("scale_into {what} dst+{od}");
                        assert_same(dtype, None, dst.bytes(), &want, &what);
                    }
                }
            }
        }
    }
    let mut v = [1.0f32, -3.0, 0.25];
    scale(DType::F32, bytemuck::cast_slice_mut(&mut v), 0.5);
    assert_eq!(v, [0.5, -1.5, 0.125]);
    let mut h = [bf16::from_f32(3.0)];
    scale(DType::BF16, bytemuck::cast_slice_mut(&mut h), 1.0 / 3.0);
    assert_eq!(h, [bf16::ONE]);
}

#[test]
#[should_panic(expected = "not a float dtype")]
fn scale_panics_on_integers() {
    scale(DType::I32, &mut [0u8; 8], 2.0);
}

#[test]
#[should_panic(expected = "not a float dtype")]
fn scale_into_panics_on_integers() {
    scale_into(DType::U8, &mut [0u8; 8], &[0u8; 8], 2.0);
}

#[test]
#[should_panic(expected = "not a whole number of float32 elements")]
fn partial_element_panics() {
    reduce_inplace(DType::F32, ElemOp::Sum, &mut [0u8; 6], &[0u8; 6]);
}

#[test]
#[should_panic(expected = "different lengths")]
fn length_mismatch_panics() {
    reduce_into(DType::I8, ElemOp::Sum, &mut [0u8; 4], &[0u8; 4], &[0u8; 3]);
}

#[test]
#[should_panic(expected = "division by a count of 0")]
fn divide_by_zero_panics() {
    divide(DType::F32, &mut [0u8; 4], 0);
}

/// `cargo test --release -p cadence-core reduce -- --ignored --nocapture`
#[test]
#[ignore]
fn bench_reduce_throughput() {
    use std::time::Instant;
    const BYTES: usize = 64 << 20;
    // Every byte 0x3c: a normal, modest value in every float dtype.
    let src: Vec<u64> = vec![0x3c3c_3c3c_3c3c_3c3c; BYTES / 8];
    let mut dst = src.clone();
    let src = bytemuck::cast_slice::<u64, u8>(&src);
    let dst = bytemuck::cast_slice_mut::<u64, u8>(&mut dst);
    type Case<'a> = (&'a str, &'a dyn Fn(&mut [u8], &[u8]));
    let cases: [Case; 7] = [
        ("f32 sum inplace", &|d, s| {
            reduce_inplace(DType::F32, ElemOp::Sum, d, s)
        }),
        ("f32 max inplace", &|d, s| {
            reduce_inplace(DType::F32, ElemOp::Max, d, s)
        }),
        ("f64 sum inplace", &|d, s| {
            reduce_inplace(DType::F64, ElemOp::Sum, d, s)
        }),
        ("i32 sum inplace", &|d, s| {
            reduce_inplace(DType::I32, ElemOp::Sum, d, s)
        }),
        ("f16 sum inplace", &|d, s| {
            reduce_inplace(DType::F16, ElemOp::Sum, d, s)
        }),
        ("bf16 sum inplace", &|d, s| {
            reduce_inplace(DType::BF16, ElemOp::Sum, d, s)
        }),
        ("f32 sum unaligned", &|d, s| {
            let n = d.len() - 4;
            reduce_inplace(DType::F32, ElemOp::Sum, &mut d[1..n + 1], &s[2..n + 2])
        }),
    ];
    println!("reduce over 64 MiB buffers, best and median of 15 runs (GB/s of buffer; memory traffic is 3x: 2 reads + 1 write)");
    for (name, f) in cases {
        f(dst, src); // warm up: page faults, caches
        let mut secs: Vec<f64> = (0..15)
            .map(|_| {
                let t = Instant::now();
                f(dst, src);
                t.elapsed().as_secs_f64()
            })
            .collect();
        secs.sort_by(f64::total_cmp);
        let gbs = |s: f64| BYTES as f64 / s / 1e9;
        println!(
            "{name:>18}: best {:6.2} GB/s ({:.2} ms), median {:6.2} GB/s",
            gbs(secs[0]),
            secs[0] * 1e3,
            gbs(secs[secs.len() / 2]),
        );
    }
}

/// The kernels' own speed, on buffers that stay in cache (128 KiB): what
/// the CPU work costs per byte, with memory out of the way.
/// `cargo test --release -p cadence-core reduce -- --ignored --nocapture`
#[test]
#[ignore]
fn bench_reduce_in_cache() {
    use std::time::Instant;
    const BYTES: usize = 128 << 10;
    let src: Vec<u64> = vec![0x3c3c_3c3c_3c3c_3c3c; BYTES / 8];
    let mut dst = src.clone();
    let src = bytemuck::cast_slice::<u64, u8>(&src);
    let dst = bytemuck::cast_slice_mut::<u64, u8>(&mut dst);
    println!(
        "sum in place over {} KiB, in cache, best of 50 x 100 calls",
        BYTES >> 10
    );
    for dt in [DType::F32, DType::F16, DType::BF16] {
        let mut best = f64::MAX;
        for _ in 0..50 {
            let t = Instant::now();
            for _ in 0..100 {
                reduce_inplace(dt, ElemOp::Sum, dst, src);
            }
            best = best.min(t.elapsed().as_secs_f64() / 100.0);
        }
        println!("{dt:>9}: {:6.2} GB/s", BYTES as f64 / best / 1e9);
    }
}
