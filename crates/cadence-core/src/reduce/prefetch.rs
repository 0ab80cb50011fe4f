//! Software prefetch for the reductions that stream from memory. A kernel
//! that does more than a few instructions per cache line (bf16 and f16
//! through f32) leaves too few loads in flight to keep memory busy: the
//! out-of-order window fills with arithmetic, and the hardware's stream
//! prefetchers stop at every 4 KiB page. Asking for each line a few KiB
//! ahead overlaps the memory traffic with the arithmetic (docs/benchmarks.md,
//! "Prefetching the half-precision kernels").
//!
//! The `unsafe` is the CPU-instruction edge, as in `f16c.rs`: a prefetch is a
//! hint that reads nothing into the program and cannot fault, whatever the
//! address; the addresses given are inside the buffer anyway.

/// How far ahead of the work, in bytes, the lines are asked for: about what
/// memory's latency times one core's share of its bandwidth covers (4-8 KiB
/// measured best here).
pub(super) const AHEAD: usize = 4096;

const LINE: usize = 64;

/// Buffers at least this long (bytes) are taken to come from memory and are
/// prefetched; shorter ones are likely in cache, where a prefetch only adds
/// instructions (about one core's share of L2).
const FROM_MEMORY: usize = 256 << 10;

/// Whether a kernel over `len` elements of `T` should prefetch.
#[inline(always)]
pub(super) fn worth<T>(len: usize) -> bool {
    len * size_of::<T>() >= FROM_MEMORY
}

/// Elements of `T` in a cache line.
pub(super) const fn line_of<T>() -> usize {
    LINE / size_of::<T>()
}

/// Asks for the cache line [`AHEAD`] bytes past element `at` of a buffer
/// (its start and length in elements), if the buffer reaches that far. A
/// pointer, not a slice, so that a kernel can ask for lines of a buffer it
/// holds mutably borrowed in pieces.
#[inline(always)]
pub(super) fn ahead<T>(base: *const T, len: usize, at: usize) {
    let offset = at * size_of::<T>() + AHEAD;
    if offset < len * size_of::<T>() {
        line(base.cast::<u8>().wrapping_add(offset));
    }
}

#[inline(always)]
fn line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 (SSE, in the x86-64 baseline) only hints the cache;
    // it reads nothing into the program and does not fault on any address.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
