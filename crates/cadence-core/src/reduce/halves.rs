//! bf16 and f16 to and from f32, branch-free so that LLVM vectorizes the
//! loops they are inlined into (with AVX2 or AVX-512 in the kernels'
//! multiversioned clones). `half` converts with branches per element (its
//! slice conversions use F16C, but per call, through scratch blocks); these
//! give exactly `half`'s results (the tests check every bf16 and f16, and
//! the rounding boundaries of f32).

use half::{bf16, f16};

/// bf16 → f32, exact: bf16 is the top half of an f32. A NaN keeps its payload;
/// any arithmetic on it, and `f32_to_bf16`, quiet it.
#[inline(always)]
pub(super) fn bf16_to_f32(h: bf16) -> f32 {
    f32::from_bits(u32::from(h.to_bits()) << 16)
}

/// f32 → bf16, round to nearest-even; NaN stays NaN (quieted, payload kept).
#[inline(always)]
pub(super) fn f32_to_bf16(f: f32) -> bf16 {
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

/// f16 → f32, exact. A NaN is quieted, its payload kept (as `half` does).
#[inline(always)]
pub(super) fn f16_to_f32(h: f16) -> f32 {
    let h = u32::from(h.to_bits());
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    let exp = em & 0x7c00;
    // Normal: the exponent rebased from 15 to 127.
    let normal = (em << 13) + (112 << 23);
    // Subnormal (and zero): m × 2^-24, exact in f32.
    let sub = (em as i32 as f32 * f32::from_bits(103 << 23)).to_bits();
    let quiet = if em & 0x03ff != 0 { 0x0040_0000 } else { 0 };
    let special = 0x7f80_0000 | quiet | (em & 0x03ff) << 13;
    let bits = if exp == 0x7c00 {
        special
    } else if exp == 0 {
        sub
    } else {
        normal
    };
    f32::from_bits(bits | sign)
}

/// f32 → f16, round to nearest-even (overflow to infinity); NaN stays NaN
/// (quieted, the payload's top bits kept, as `half` does).
#[inline(always)]
pub(super) fn f32_to_f16(f: f32) -> f16 {
    let x = f.to_bits();
    let sign = (x >> 16) & 0x8000;
    let a = x & 0x7fff_ffff;
    let nan = 0x7e00 | (a & 0x007f_ffff) >> 13;
    // Normal: the exponent rebased from 127 to 15, rounded on the 13 dropped
    // bits (a carry moves into the exponent, up to infinity at 65520).
    let normal = a
        .wrapping_sub(112 << 23)
        .wrapping_add(0x0fff + ((a >> 13) & 1))
        >> 13;
    // Subnormal (under 2^-14): adding 0.5 lines the f16 subnormal's bits up
    // with the f32 mantissa's low bits, and the FPU rounds to nearest-even.
    let half_magic = 126 << 23;
    let sub = (f32::from_bits(a) + f32::from_bits(half_magic))
        .to_bits()
        .wrapping_sub(half_magic);
    let bits = if a > 0x7f80_0000 {
        nan
    } else if a >= 0x4780_0000 {
        0x7c00
    } else if a < 0x3880_0000 {
        sub
    } else {
        normal
    };
    f16::from_bits((bits | sign) as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every f32 exponent and sign with the dropped low bits at every
    /// rounding boundary of bf16 (16 bits) and f16 (13 bits, and the
    /// subnormals' wider ones), and a random one.
    fn boundary_f32s() -> impl Iterator<Item = f32> {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        (0..=u32::from(u16::MAX)).flat_map(move |high| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let random_low = (state >> 48) as u32;
            let mut lows = vec![
                0u32, 1, 0x3fff, 0x7ffe, 0x7fff, 0x8000, 0x8001, 0xbfff, 0xc000, 0xfffe, 0xffff,
                random_low,
            ];
            for bit in 10..16 {
                // f16's halfway points: 13 dropped bits in the normal
                // range, more below 2^-14.
                let half = 1u32 << (bit - 1);
                lows.extend([half - 1, half, half + 1, (1 << bit) | half]);
            }
            for m in [0x0fffu32, 0x1000, 0x1001, 0x1fff, 0x2fff, 0x3000, 0x3001] {
                lows.push(m);
            }
            lows.into_iter()
                .map(move |low| f32::from_bits(high << 16 | (low & 0xffff)))
        })
    }

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
        for f in boundary_f32s() {
            let (mine, theirs) = (f32_to_bf16(f), bf16::from_f32(f));
            assert_eq!(mine.to_bits(), theirs.to_bits(), "{:#010x}", f.to_bits());
        }
    }

    #[test]
    fn f16_conversions_match_half() {
        for bits in 0..=u16::MAX {
            let h = f16::from_bits(bits);
            let (mine, theirs) = (f16_to_f32(h), h.to_f32());
            assert_eq!(mine.to_bits(), theirs.to_bits(), "{bits:#06x}");
            let back = if mine.is_nan() {
                f16::from_f32(theirs).to_bits() // quieted
            } else {
                bits
            };
            assert_eq!(f32_to_f16(mine).to_bits(), back, "{bits:#06x} round trip");
        }
        for f in boundary_f32s() {
            let (mine, theirs) = (f32_to_f16(f), f16::from_f32(f));
            assert_eq!(mine.to_bits(), theirs.to_bits(), "{:#010x}", f.to_bits());
        }
    }
}
