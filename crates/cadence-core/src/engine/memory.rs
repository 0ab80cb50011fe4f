//! The memory an operation works on: the caller's buffers, and how a
//! schedule's spans resolve to bytes in them (bounds-checked) for the
//! local steps, copy and reduce.

use super::internal;
use crate::copy::copy_bytes;
use crate::error::ErrorKind;
use crate::reduce;
use crate::schedule::lower::Layout;
use crate::schedule::{Buf, Span};
use crate::types::{CollKind, DType, ElemOp};

/// The memory an operation works on. Pointers come from the user's buffers
/// (kept alive by the caller until the operation completes).
#[derive(Clone, Copy)]
pub struct Buffers {
    pub input: *const u8,
    pub input_bytes: usize,
    pub output: *mut u8,
    pub output_bytes: usize,
}

impl Buffers {
    /// How input and output sit relative to each other, for [`lower`];
    /// `own_block` is the byte offset of this rank's block in an allgather's
    /// output.
    ///
    /// [`lower`]: crate::schedule::lower::lower
    pub fn layout(&self, kind: CollKind, own_block: usize, has_output: bool) -> Layout {
        let (a, b) = (self.input as usize, self.output as usize);
        Layout {
            exact_inplace: std::ptr::eq(self.input, self.output)
                && self.input_bytes == self.output_bytes
                && matches!(kind, CollKind::AllReduce | CollKind::Reduce),
            allgather_inplace: kind == CollKind::AllGather
                && std::ptr::eq(self.input, self.output.wrapping_add(own_block)),
            overlap: self.input_bytes > 0
                && self.output_bytes > 0
                && a < b + self.output_bytes
                && b < a + self.input_bytes,
            has_output,
        }
    }

    /// No buffers (barriers, or before a request gets its buffers).
    pub const NONE: Buffers = Buffers {
        input: std::ptr::null(),
        input_bytes: 0,
        output: std::ptr::null_mut(),
        output_bytes: 0,
    };
}

// SAFETY: the buffers are plain memory; whoever made the request they belong
// to guaranteed (`OpRequest`'s borrows, or `OpRequest::raw_buffers`'
// contract) that they stay valid and untouched by others until the operation
// that uses them completes, which may be on the communicator's progress
// thread.
unsafe impl Send for Buffers {}

/// Resolves spans to memory.
pub(super) struct Memory {
    pub(super) bufs: Buffers,
    pub(super) scratch: *mut u8,
    pub(super) scratch_bytes: usize,
    pub(super) esize: usize,
}

impl Memory {
    /// Pointer and byte length of a span, bounds-checked.
    pub(super) fn locate(&self, span: Span) -> Result<(*mut u8, usize), ErrorKind> {
        let (base, cap) = match span.buf {
            Buf::Input => (self.bufs.input as *mut u8, self.bufs.input_bytes),
            Buf::Output => (self.bufs.output, self.bufs.output_bytes),
            Buf::Scratch => (self.scratch, self.scratch_bytes),
        };
        let off = span.off * self.esize;
        let len = span.len * self.esize;
        if off + len > cap {
            return Err(internal(&format!("{span:?} out of bounds ({cap} bytes)")));
        }
        if len == 0 {
            return Ok((std::ptr::NonNull::dangling().as_ptr(), 0));
        }
        // SAFETY: off + len <= cap, the size of the allocation behind `base`.
        Ok((unsafe { base.add(off) }, len))
    }

    pub(super) fn copy(&self, src: Span, dst: Span) -> Result<(), ErrorKind> {
        let (s, n) = self.locate(src)?;
        let (d, m) = self.locate(dst)?;
        if n != m {
            return Err(internal("copy lengths differ"));
        }
        if s == d || n == 0 {
            return Ok(());
        }
        if ranges_overlap(s, d, n) {
            // SAFETY: both ranges are in bounds (`locate`); `copy` tolerates
            // overlap (the in-place case maps Input and Output to one buffer).
            unsafe { std::ptr::copy(s, d, n) };
            return Ok(());
        }
        // SAFETY: in bounds (`locate`), disjoint (checked above), and no
        // other reference to these bytes exists during the call.
        let (src, dst) = unsafe {
            (
                std::slice::from_raw_parts(s as *const u8, n),
                std::slice::from_raw_parts_mut(d, n),
            )
        };
        copy_bytes(dst, src);
        Ok(())
    }

    pub(super) fn reduce(
        &self,
        dtype: DType,
        op: ElemOp,
        src: Span,
        dst: Span,
    ) -> Result<(), ErrorKind> {
        let (s, n) = self.locate(src)?;
        let (d, m) = self.locate(dst)?;
        if n != m {
            return Err(internal("reduce lengths differ"));
        }
        if n == 0 {
            return Ok(());
        }
        if ranges_overlap(s, d, n) {
            return Err(internal("reduce operands overlap"));
        }
        // SAFETY: in bounds (`locate`), disjoint (checked above), and no other
        // reference to these bytes exists during the call.
        let (src, dst) = unsafe {
            (
                std::slice::from_raw_parts(s as *const u8, n),
                std::slice::from_raw_parts_mut(d, n),
            )
        };
        reduce::reduce_inplace(dtype, op, dst, src);
        Ok(())
    }
}

/// Whether `n` bytes at `a` and `n` bytes at `b` share a byte.
pub(super) fn ranges_overlap(a: *const u8, b: *const u8, n: usize) -> bool {
    let (a, b) = (a as usize, b as usize);
    n > 0 && a < b + n && b < a + n
}
