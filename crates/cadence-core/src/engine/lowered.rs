//! Running an operation as lowered (`schedule::lower`): the input prepared
//! before the schedule runs, a temporary output where the caller gave none,
//! and the division of an average after it.

use super::{Buffers, Engine, OpCtx};
use crate::copy::copy_bytes;
use crate::error::ErrorKind;
use crate::reduce;
use crate::schedule::lower::{InputPrep, Lowering};
use crate::schedule::Schedule;
use crate::transport::OpMeta;
use crate::types::ElemOp;
use std::time::Instant;

impl Engine {
    /// Runs an operation as lowered (`schedule::lower`): prepares the input
    /// (scaled, or copied away from an overlapping output), gives the
    /// schedule a temporary output if the caller passed none, runs it, and
    /// divides the output for an average.
    #[allow(clippy::too_many_arguments)]
    pub fn run_lowered(
        &mut self,
        sched: &Schedule,
        low: &Lowering,
        meta: &OpMeta,
        elem_op: ElemOp,
        mut bufs: Buffers,
        deadline: Instant,
        ctx: OpCtx,
    ) -> Result<(), ErrorKind> {
        let dtype = meta.dtype;
        // The temporaries live in the engine from call to call: a fresh one
        // each call pays the page faults of a fresh mapping (glibc maps large
        // allocations anew every time). Their old contents do not matter: no
        // schedule reads an output it has not written (verified), and the
        // input copy is overwritten whole. They are taken out for the call
        // (`run` borrows the engine) and put back after it; moving a Vec
        // leaves its buffer where it is.
        let mut tmp_out = std::mem::take(&mut self.tmp_out);
        let mut tmp_in = std::mem::take(&mut self.tmp_in);
        if let Some(n) = low.temp_output {
            let need = n * dtype.size();
            if tmp_out.len() < need {
                tmp_out.resize(need, 0);
            }
            bufs.output = tmp_out.as_mut_ptr();
            bufs.output_bytes = need;
        }
        match low.input {
            InputPrep::AsIs => {}
            InputPrep::ScaleInPlace(f) => {
                // SAFETY: the request's contract: the output is valid and
                // exclusively this operation's until it completes (here the
                // input is the same bytes).
                let out = unsafe { slice_mut_or_empty(bufs.output, bufs.output_bytes) };
                reduce::scale(dtype, out, f);
            }
            InputPrep::Copy | InputPrep::ScaleCopy(_) => {
                // SAFETY: the request's contract: the input is valid for
                // reads until the operation completes.
                let inp = unsafe { slice_or_empty(bufs.input, bufs.input_bytes) };
                if tmp_in.len() < inp.len() {
                    tmp_in.resize(inp.len(), 0);
                }
                let copy = &mut tmp_in[..inp.len()];
                match low.input {
                    InputPrep::ScaleCopy(f) => reduce::scale_into(dtype, copy, inp, f),
                    _ => copy_bytes(copy, inp),
                }
                bufs.input = tmp_in.as_ptr();
            }
        }
        let result = self.run(sched, meta, elem_op, bufs, deadline, ctx);
        self.tmp_out = tmp_out;
        self.tmp_in = tmp_in;
        result?;
        if let Some(n) = low.divide_by {
            // SAFETY: as above, for the output.
            let out = unsafe { slice_mut_or_empty(bufs.output, bufs.output_bytes) };
            reduce::divide(dtype, out, n);
        }
        Ok(())
    }
}

/// # Safety
/// `p` must be valid for reads of `n` bytes (or `n == 0`).
unsafe fn slice_or_empty<'a>(p: *const u8, n: usize) -> &'a [u8] {
    if n == 0 {
        &[]
    } else {
        // SAFETY: per the function's contract.
        unsafe { std::slice::from_raw_parts(p, n) }
    }
}

/// # Safety
/// `p` must be valid for reads and writes of `n` bytes (or `n == 0`), with
/// no other live reference to them.
unsafe fn slice_mut_or_empty<'a>(p: *mut u8, n: usize) -> &'a mut [u8] {
    if n == 0 {
        &mut []
    } else {
        // SAFETY: per the function's contract.
        unsafe { std::slice::from_raw_parts_mut(p, n) }
    }
}
