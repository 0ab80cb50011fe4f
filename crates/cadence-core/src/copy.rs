//! Byte copies that stay fast whatever the two buffers' alignment.
//!
//! Every message byte cadence moves inside a host goes through a copy: into
//! a shared-memory ring and out of it, a rank's own block of an all-gather or
//! all-to-all, an input staged for an in-place call. glibc's `memcpy` copies
//! mid-sized blocks (from about 2 KiB to the L2 size) with `rep movsb`, and
//! on AMD Zen cores that instruction runs about 15× slower when the
//! destination sits 1–31 bytes past the source modulo a cache line (on a
//! 2-core EPYC VM: 1.6–1.9 GB/s against 30–60 at 4 KiB–256 KiB; the kernel's
//! copy for `process_vm_readv` has the same fault, 1–2 against 6–7 GB/s).
//! Which case a copy hits depends on where the user's allocator put the
//! buffers: numpy places an array on any 16-byte boundary when it reuses heap
//! memory, so about half the copies between a user's input and output, or
//! between them and a ring (whose payloads start on a line pair), hit it: a
//! 2-rank all-gather of 256 KiB took 92 µs a call in such a job against 20
//! with the buffers lined up (docs/benchmarks.md).
//!
//! [`copy_bytes`] hands copies whose two ends are not line-aligned to each
//! other to `memcpy` in blocks below every glibc's `rep movsb` threshold, so
//! each runs the vector loop, which does not care (measured: 28–58 GB/s at
//! every shift). Hand-rolled rather than a crate's: the fault is in the
//! platform `memcpy` that every copy crate ends in.

/// Copies below this run as one `memcpy`: glibc's `rep movsb` threshold is
/// 2 KiB (SSE2) to 8 KiB (AVX-512), 2112 bytes with fast short `rep movsb`,
/// so a copy this short never reaches it.
const BLOCK: usize = 2048;

/// Copies from this length run as one `memcpy` whatever their alignment:
/// glibc leaves `rep movsb` for its vector loop and non-temporal stores at
/// the L2 size on AMD (`rep_movsb_stop_threshold`; 31–34 GB/s at 1 MiB and a
/// 16-byte shift), and they beat blocks there (22–28 GB/s). So the limit is
/// the L2 size, as glibc reads it; 1 MiB where the system does not say.
fn blocked_below() -> usize {
    static L2: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *L2.get_or_init(|| {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            // SAFETY: sysconf reads a system setting; no pointers involved.
            let l2 = unsafe { libc::sysconf(libc::_SC_LEVEL2_CACHE_SIZE) };
            if l2 > 0 {
                return l2 as usize;
            }
        }
        1 << 20
    })
}

/// Bytes in the cache line that the alignment rule is about.
const LINE: usize = 64;

/// `dst.copy_from_slice(src)`, fast at any relative alignment (see the
/// module notes). Panics when the lengths differ, as `copy_from_slice` does.
pub fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_bytes: lengths differ");
    if !needs_blocks(dst.as_ptr() as usize, src.as_ptr() as usize, src.len()) {
        dst.copy_from_slice(src);
        return;
    }
    for (d, s) in dst.chunks_mut(BLOCK).zip(src.chunks(BLOCK)) {
        // black_box: without it LLVM may fuse the loop back into one memcpy
        // of the whole length, the call this function exists to avoid.
        std::hint::black_box(d).copy_from_slice(s);
    }
}

/// Whether a copy of `len` bytes from `src` to `dst` goes in blocks: on
/// x86-64, when it is in `rep movsb`'s range and the two ends are not
/// aligned to each other within a line. (Zen is slow at shifts 1–31; the
/// other half is taken too, as blocks cost nothing measurable there and
/// other cores' slow shifts are not known.)
pub fn needs_blocks(dst: usize, src: usize, len: usize) -> bool {
    cfg!(target_arch = "x86_64")
        && len > BLOCK
        && len < blocked_below()
        && !dst.wrapping_sub(src).is_multiple_of(LINE)
}

/// Whether `dst` sits 1–31 bytes past `src` modulo a cache line: the
/// shifts at which `rep movsb` is slow on Zen, in the kernel's copies too
/// (`process_vm_readv` of 256 KiB: 1–2 GB/s there, 6–7 at every other shift).
pub fn shifted_ahead(dst: usize, src: usize) -> bool {
    (1..LINE / 2).contains(&(dst.wrapping_sub(src) % LINE))
}

/// `len` bytes of `buf` (grown as needed) that start at the same offset
/// within a line as address `like`: a staging area that a copy from or to
/// `like` finds line-aligned to it.
pub fn window_aligned_like(buf: &mut Vec<u8>, len: usize, like: usize) -> &mut [u8] {
    if buf.len() < len + LINE {
        buf.resize(len + LINE, 0);
    }
    let k = like.wrapping_sub(buf.as_ptr() as usize) % LINE;
    &mut buf[k..k + len]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shift and a spread of lengths, around the block size and the
    /// blocked range's end: the copy is exact and touches nothing else.
    #[test]
    fn copies_exactly_at_every_shift_and_length() {
        let src: Vec<u8> = (0..(blocked_below() + 4 * LINE))
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let mut dst = vec![0u8; src.len() + 2 * LINE];
        let lens = [
            0,
            1,
            BLOCK - 1,
            BLOCK,
            BLOCK + 1,
            3 * BLOCK + 17,
            65_536,
            blocked_below() - 1,
            blocked_below(),
        ];
        for &len in &lens {
            for shift in [0usize, 1, 16, 31, 32, 48, 63] {
                let from = 7;
                dst.fill(0xAA);
                copy_bytes(&mut dst[shift..shift + len], &src[from..from + len]);
                assert_eq!(
                    &dst[shift..shift + len],
                    &src[from..from + len],
                    "len {len} shift {shift}"
                );
                assert!(
                    dst[..shift].iter().all(|&b| b == 0xAA),
                    "wrote before, len {len}"
                );
                assert!(
                    dst[shift + len..].iter().all(|&b| b == 0xAA),
                    "wrote past, len {len}"
                );
            }
        }
    }

    #[test]
    fn blocks_only_shifted_mid_sized_copies() {
        let on_x86 = cfg!(target_arch = "x86_64");
        assert_eq!(needs_blocks(4096 + 16, 4096, 65_536), on_x86);
        assert_eq!(needs_blocks(4096 + 48, 4096, 65_536), on_x86);
        assert!(
            !needs_blocks(4096 + 64, 4096, 65_536),
            "line-aligned: memcpy's own way"
        );
        assert!(!needs_blocks(4096 + 16, 4096, BLOCK), "short: one memcpy");
        assert!(
            !needs_blocks(4096 + 16, 4096, blocked_below()),
            "long: one memcpy"
        );
        assert!(shifted_ahead(4096 + 16, 128));
        assert!(shifted_ahead(4096 + 1, 128) && shifted_ahead(4096 + 31, 128));
        assert!(!shifted_ahead(4096 + 16, 128 + 16), "lined up");
        assert!(!shifted_ahead(4096, 128 + 16), "48 bytes ahead: fast");
    }

    #[test]
    fn a_window_lines_up_with_its_model() {
        let mut buf = Vec::new();
        for like in [0usize, 1, 16, 63, 64, 4096 + 40] {
            let w = window_aligned_like(&mut buf, 1000, like);
            assert_eq!(w.len(), 1000);
            assert_eq!(
                (w.as_ptr() as usize).wrapping_sub(like) % LINE,
                0,
                "like {like}"
            );
        }
    }
}
