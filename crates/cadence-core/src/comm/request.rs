//! What the user asks for: one operation and the memory it works on, with
//! the lifetime rules that decide whether it may run asynchronously.

use crate::engine::Buffers;
use crate::schedule::Algo;
use crate::types::{CollKind, DType, RedOp};

/// One operation as the user asked for it, with the memory it works on.
///
/// The lifetime `'a` is that of the borrowed buffers: a request made with
/// [`OpRequest::input`], [`OpRequest::output`] or [`OpRequest::inout`] can
/// only run synchronously ([`Comm::run`](super::Comm::run)) while those borrows last. An
/// asynchronous operation ([`Comm::submit`](super::Comm::submit)) needs an `OpRequest<'static>`:
/// no buffers, or raw ones given through the `unsafe`
/// [`OpRequest::raw_buffers`] together with an owner that keeps them alive,
/// which the communicator drops only once the operation has finished.
pub struct OpRequest<'a> {
    pub kind: CollKind,
    pub dtype: DType,
    pub op: RedOp,
    pub root: usize,
    pub counts: Vec<usize>,
    /// Algorithm forced by the caller (beats `CADENCE_ALGO`).
    pub algo: Option<Algo>,
    pub(super) bufs: Buffers,
    /// Whether the caller passed an input / an output buffer at all.
    pub(super) has_input: bool,
    pub(super) has_output: bool,
    /// Dropped after the operation finished (see [`OpRequest::raw_buffers`]).
    keep_alive: Option<Box<dyn std::any::Any + Send>>,
    _borrow: std::marker::PhantomData<&'a mut [u8]>,
}

impl OpRequest<'static> {
    /// A request with no buffers yet.
    pub fn new(kind: CollKind, dtype: DType, op: RedOp, root: usize, counts: Vec<usize>) -> Self {
        OpRequest {
            kind,
            dtype,
            op,
            root,
            counts,
            algo: None,
            bufs: Buffers::NONE,
            has_input: false,
            has_output: false,
            keep_alive: None,
            _borrow: std::marker::PhantomData,
        }
    }

    pub fn barrier() -> Self {
        OpRequest::new(CollKind::Barrier, DType::U8, RedOp::Sum, 0, vec![])
    }
}

impl<'a> OpRequest<'a> {
    /// Forces an algorithm (`None`: the communicator chooses).
    pub fn with_algo(mut self, algo: Option<Algo>) -> Self {
        self.algo = algo;
        self
    }

    /// Reads the input from `data` (borrowed while the request lives).
    pub fn input<'b>(mut self, data: &'b [u8]) -> OpRequest<'b>
    where
        'a: 'b,
    {
        self.bufs.input = data.as_ptr();
        self.bufs.input_bytes = data.len();
        self.has_input = true;
        self.reborrow()
    }

    /// Writes the result into `data`.
    pub fn output<'b>(mut self, data: &'b mut [u8]) -> OpRequest<'b>
    where
        'a: 'b,
    {
        self.bufs.output = data.as_mut_ptr();
        self.bufs.output_bytes = data.len();
        self.has_output = true;
        self.reborrow()
    }

    /// Reads the input from `data` and writes the result over it (in place).
    pub fn inout<'b>(mut self, data: &'b mut [u8]) -> OpRequest<'b>
    where
        'a: 'b,
    {
        self.bufs.input = data.as_ptr();
        self.bufs.input_bytes = data.len();
        self.bufs.output = data.as_mut_ptr();
        self.bufs.output_bytes = data.len();
        self.has_input = true;
        self.has_output = true;
        self.reborrow()
    }

    /// Gives the operation raw buffers (`None`: that buffer is not passed;
    /// the communicator allocates an output it needs) and an owner,
    /// `keep_alive`, that the communicator drops only after the operation
    /// finished, on whichever thread ran it.
    ///
    /// # Safety
    /// Until the operation has finished (its [`Comm::run`](super::Comm::run) returned, or its
    /// [`Completion`](super::Completion) reports done; or, when `keep_alive` is given, until that
    /// owner is dropped), the input must be valid for reads of its length
    /// and not written by anyone, and the output valid for reads and writes
    /// of its length and not accessed by anyone else. The output may be the
    /// input (in place) or overlap it.
    pub unsafe fn raw_buffers(
        self,
        input: Option<(*const u8, usize)>,
        output: Option<(*mut u8, usize)>,
        keep_alive: Option<Box<dyn std::any::Any + Send>>,
    ) -> OpRequest<'static> {
        let (ip, ib) = input.unwrap_or((std::ptr::null(), 0));
        let (op, ob) = output.unwrap_or((std::ptr::null_mut(), 0));
        OpRequest {
            kind: self.kind,
            dtype: self.dtype,
            op: self.op,
            root: self.root,
            counts: self.counts,
            algo: self.algo,
            bufs: Buffers {
                input: ip,
                input_bytes: ib,
                output: op,
                output_bytes: ob,
            },
            has_input: input.is_some(),
            has_output: output.is_some(),
            keep_alive,
            _borrow: std::marker::PhantomData,
        }
    }

    /// The same request with its borrows' lifetime forgotten, to queue a
    /// synchronous operation behind asynchronous ones.
    ///
    /// # Safety
    /// The caller must not return (nor drop the borrowed buffers) before the
    /// operation has finished.
    pub(super) unsafe fn detach(self) -> OpRequest<'static> {
        self.reborrow_unchecked()
    }

    fn reborrow<'b>(self) -> OpRequest<'b>
    where
        'a: 'b,
    {
        self.reborrow_unchecked()
    }

    fn reborrow_unchecked<'b>(self) -> OpRequest<'b> {
        OpRequest {
            kind: self.kind,
            dtype: self.dtype,
            op: self.op,
            root: self.root,
            counts: self.counts,
            algo: self.algo,
            bufs: self.bufs,
            has_input: self.has_input,
            has_output: self.has_output,
            keep_alive: self.keep_alive,
            _borrow: std::marker::PhantomData,
        }
    }
}
