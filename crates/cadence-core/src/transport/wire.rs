//! What every frame carries and every receiver checks: the wire header, the
//! operation's signature in it, and the two notices (abort, stall) that
//! travel beside data.

use crate::error::ErrorKind;
use crate::types::{CollKind, DType, RedOp};
use bytemuck::{Pod, Zeroable};

/// "CDNC" little-endian.
pub const MAGIC: u32 = 0x434e_4443;
pub const FRAME_DATA: u8 = 1;
pub const FRAME_ABORT: u8 = 2;
/// "I have been stuck past my deadline; here is who I wait on" (see
/// [`StallNotice`]).
pub const FRAME_STALL: u8 = 3;
/// Shared memory only: "read this message from my memory" (single copy; see
/// `transport::shm`).
pub const FRAME_CMA: u8 = 4;

/// Longest wait-for chain a stall notice carries.
pub const STALL_CHAIN_MAX: usize = 6;

/// Longest abort text (UTF-8 bytes) any transport carries; longer reasons
/// are cut at a character boundary and end in [`TRUNCATED`].
pub const ABORT_TEXT_MAX: usize = 2048;
/// Marks an abort text that was cut to fit [`ABORT_TEXT_MAX`].
pub const TRUNCATED: &str = " \u{2026}[truncated]";

/// A rank stuck past its deadline tells its peers whom it waits on, as a
/// chain `[self, waits_on, that rank's target, ...]` as far as it knows it.
/// A rank that times out waiting on a peer which itself waits on a third
/// blames the end of the chain, not the innocent peer in the middle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StallNotice {
    /// Sequence number of the operation the sender is stuck in ...
    pub seq: u64,
    /// ... and its communicator's tag ([`comm_tag`]): on links shared by
    /// several communicators, a notice of another's operation is not about
    /// the receiver's.
    pub comm: u32,
    pub chain: Vec<u32>,
}

/// A communicator's tag on the wire, from its id (the same on every rank):
/// every data frame and stall notice carries its communicator's, so that
/// on links that several communicators share (a split's, lent by its
/// root) a frame of another communicator is told apart from one of the
/// call running.
pub fn comm_tag(comm_id: &str) -> u32 {
    // FNV-1a over the bytes, folded to 32 bits; never 0, so a frame built
    // without a tag never matches.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in comm_id.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    ((h >> 32) as u32 ^ h as u32).max(1)
}

/// Leads every frame on every transport.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable, PartialEq, Eq)]
pub struct WireHeader {
    pub magic: u32,
    pub frame: u8,
    pub coll: u8,
    pub dtype: u8,
    pub redop: u8,
    /// Root (or p2p peer) of the sender's operation; for ABORT frames the
    /// rank the failure is blamed on.
    pub root: u32,
    /// The communicator's tag ([`comm_tag`]), on data frames and stall
    /// notices.
    pub comm: u32,
    /// Sequence number of the operation on its stream of operations
    /// (collectives, or p2p messages of one direction between two ranks).
    pub seq: u64,
    /// Hash of the operation's full arguments; equal on every rank that
    /// called the same collective with the same arguments.
    pub sig: u64,
    /// The sender's total element count (for error messages).
    pub count: u64,
    /// Payload bytes of this frame.
    pub len: u64,
}

pub const HEADER_BYTES: usize = std::mem::size_of::<WireHeader>();

/// The identity of the operation a message belongs to. The receiver compares
/// it with the header of each incoming frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpMeta {
    pub coll: CollKind,
    pub dtype: DType,
    pub redop: u8,
    pub root: u32,
    pub seq: u64,
    pub sig: u64,
    pub count: u64,
    /// The communicator's tag ([`comm_tag`]).
    pub comm: u32,
}

impl OpMeta {
    pub fn header(&self, len: usize) -> WireHeader {
        WireHeader {
            magic: MAGIC,
            frame: FRAME_DATA,
            coll: self.coll.code(),
            dtype: self.dtype.code(),
            redop: self.redop,
            root: self.root,
            comm: self.comm,
            seq: self.seq,
            sig: self.sig,
            count: self.count,
            len: len as u64,
        }
    }

    /// "allreduce #5 (count=100, float32, sum, root 0)"
    pub fn describe(&self) -> String {
        describe(
            self.coll.code(),
            self.seq,
            self.count,
            self.dtype.code(),
            self.redop,
            self.root,
        )
    }

    /// Checks an incoming frame header against this operation; `want_len` is
    /// the payload length the receiver expects for this frame.
    pub fn check(&self, h: &WireHeader, peer: usize, want_len: usize) -> Result<(), ErrorKind> {
        self.check_len(h, peer, h.len == want_len as u64, || want_len.to_string())
    }

    /// Like [`OpMeta::check`] for a transport whose frames may be shorter
    /// than the rest of the message (shared memory sizes them by the room
    /// in its ring): the frame must carry something of the `left` bytes
    /// still expected, and no more than them.
    pub fn check_frame(&self, h: &WireHeader, peer: usize, left: usize) -> Result<(), ErrorKind> {
        let fits = h.len <= left as u64 && (h.len > 0 || left == 0);
        self.check_len(h, peer, fits, || match left {
            0 => "0".to_string(),
            _ => format!("1 to {left}"),
        })
    }

    /// The checks of both: `want` says what was expected, for the error.
    fn check_len(
        &self,
        h: &WireHeader,
        peer: usize,
        len_ok: bool,
        want: impl FnOnce() -> String,
    ) -> Result<(), ErrorKind> {
        check_data_frame(h, peer)?;
        if h.comm != self.comm {
            return Err(ErrorKind::Mismatch {
                peer,
                ours: self.describe(),
                theirs: format!(
                    "{} of another communicator (tag {:#010x}, this one's {:#010x}): \
                     the ranks call the communicators that share these links in \
                     different orders",
                    describe(h.coll, h.seq, h.count, h.dtype, h.redop, h.root),
                    h.comm,
                    self.comm
                ),
                our_sig: self.sig,
                their_sig: h.sig,
            });
        }
        if h.seq != self.seq || h.sig != self.sig || !len_ok {
            let mut theirs = describe(h.coll, h.seq, h.count, h.dtype, h.redop, h.root);
            if h.seq == self.seq && h.sig == self.sig {
                theirs.push_str(&format!(
                    " but sent a {}-byte frame where {} bytes were expected",
                    h.len,
                    want()
                ));
            }
            return Err(ErrorKind::Mismatch {
                peer,
                ours: self.describe(),
                theirs,
                our_sig: self.sig,
                their_sig: h.sig,
            });
        }
        Ok(())
    }
}

/// Checks that `h` leads a data frame at all (magic, frame type), before
/// anything of the operation it belongs to is compared.
pub fn check_data_frame(h: &WireHeader, peer: usize) -> Result<(), ErrorKind> {
    if h.magic != MAGIC {
        return Err(ErrorKind::Garbage {
            peer,
            detail: format!("bad frame magic {:#010x} (expected {MAGIC:#010x})", h.magic),
        });
    }
    if h.frame != FRAME_DATA {
        return Err(ErrorKind::Garbage {
            peer,
            detail: format!("unknown frame type {}", h.frame),
        });
    }
    Ok(())
}

fn describe(coll: u8, seq: u64, count: u64, dtype: u8, redop: u8, root: u32) -> String {
    let coll_s = CollKind::from_code(coll).map_or("?", |c| c.name());
    let dtype_s = DType::from_code(dtype).map_or("?", |d| d.name());
    let mut s = format!("{coll_s} #{seq} (count={count}, {dtype_s}");
    if CollKind::from_code(coll).is_some_and(|c| c.reduces()) {
        s.push_str(", ");
        s.push_str(RedOp::name_of_code(redop));
    }
    if CollKind::from_code(coll).is_some_and(|c| c.is_rooted()) {
        s.push_str(&format!(", root/peer {root}"));
    }
    s.push(')');
    s
}

/// What a failing rank tells its peers.
#[derive(Clone, Debug, PartialEq)]
pub struct AbortNotice {
    /// The rank the sender blames.
    pub origin: usize,
    pub detail: String,
    /// For argument mismatches: (blamed rank's signature, detecting rank,
    /// detecting rank's signature). A mismatch is symmetric — the detector
    /// cannot know which side is wrong — but a third rank can: the culprit is
    /// the side whose call differs from its own.
    pub mismatch: Option<(u64, usize, u64)>,
}

impl AbortNotice {
    /// The notice a rank sends after failing with `kind`.
    pub fn from_error(kind: &ErrorKind, me: usize) -> AbortNotice {
        let mismatch = match kind {
            ErrorKind::Mismatch {
                our_sig, their_sig, ..
            } => Some((*their_sig, me, *our_sig)),
            _ => None,
        };
        let detail = match kind {
            // Already a relayed report: pass the original on unchanged.
            ErrorKind::Aborted { detail, .. } => detail.clone(),
            k => format!("rank {me} reported: {k}"),
        };
        AbortNotice {
            origin: kind.culprit().unwrap_or(me),
            detail,
            mismatch,
        }
    }

    /// The text as it goes on the wire: whole when it fits in
    /// [`ABORT_TEXT_MAX`] bytes, else cut at a character boundary with a
    /// [`TRUNCATED`] mark, so a receiver never sees half a character.
    pub fn wire_text(&self) -> std::borrow::Cow<'_, str> {
        let d = &self.detail;
        if d.len() <= ABORT_TEXT_MAX {
            return std::borrow::Cow::Borrowed(d);
        }
        let mut end = ABORT_TEXT_MAX - TRUNCATED.len();
        while !d.is_char_boundary(end) {
            end -= 1;
        }
        std::borrow::Cow::Owned(format!("{}{TRUNCATED}", &d[..end]))
    }

    /// The error a receiver raises, given the signature of its own call.
    /// Of a mismatch it judges only what it can: when its call is the
    /// blamed side's, the detector is the odd one out; when it is the
    /// detector's, or neither (the receiver is still at an earlier call,
    /// which a notice overtakes), the detector's blame stands.
    pub fn into_error(self, my_sig: u64) -> ErrorKind {
        let origin = match self.mismatch {
            Some((blamed_sig, detector, detector_sig))
                if blamed_sig == my_sig && detector_sig != my_sig =>
            {
                detector
            }
            _ => self.origin,
        };
        ErrorKind::Aborted {
            origin,
            detail: self.detail,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_third_rank_judges_a_mismatch_only_from_the_same_call() {
        // Rank 0 (call A) found rank 1 (call B) differs, and blames it.
        let notice = || AbortNotice {
            origin: 1,
            detail: "rank 0 reported: mismatch with rank 1".into(),
            mismatch: Some((0xB, 0, 0xA)),
        };
        let origin = |my_sig| match notice().into_error(my_sig) {
            ErrorKind::Aborted { origin, .. } => origin,
            other => panic!("{other:?}"),
        };
        assert_eq!(origin(0xA), 1, "called as the detector did: rank 1 is odd");
        assert_eq!(origin(0xB), 0, "called as rank 1 did: the detector is odd");
        assert_eq!(origin(0xC), 1, "still at an earlier call: the blame stands");
    }
}
