//! What travels on a TCP stream: chunks of messages, each led by a
//! [`TcpHeader`], and control frames (stall notices, aborts) that are encoded
//! and decoded here. No socket is touched in this file.

use crate::error::ErrorKind;
use crate::transport::{
    AbortNotice, StallNotice, WireHeader, ABORT_TEXT_MAX, FRAME_ABORT, FRAME_STALL, MAGIC,
    STALL_CHAIN_MAX,
};
use bytemuck::{Pod, Zeroable};

/// Bytes per chunk. Large enough that a header per chunk costs nothing
/// (64 bytes in 64 KiB), small enough that a ring step's 1 MiB slice is 16
/// chunks to spread over the paths in proportion to their rates. Every
/// element size divides it, so chunks hold whole elements. Messages below
/// it travel whole, as one frame.
pub const CHUNK_BYTES: usize = 64 * 1024;
/// Longest payload of a stall notice: its chain of u32 ranks.
const STALL_PAYLOAD_MAX: usize = STALL_CHAIN_MAX * 4;

/// Header flag: the chunk is sent again, after the path that carried it
/// first failed. A copy may then arrive twice.
pub const FLAG_RESENT: u32 = 1;

/// Leads every frame on a TCP stream: the common header, then what only a
/// multi-stream transport needs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable, PartialEq, Eq)]
pub struct TcpHeader {
    pub base: WireHeader,
    /// The message's number on this link and direction (wrapping); 0 on
    /// control frames.
    pub msg: u32,
    /// [`FLAG_RESENT`] or 0.
    pub flags: u32,
    /// Byte offset of this chunk in its message.
    pub off: u64,
}

pub const TCP_HEADER_BYTES: usize = std::mem::size_of::<TcpHeader>();

impl TcpHeader {
    /// A control frame's header (no message, no offset).
    pub fn control(base: WireHeader) -> TcpHeader {
        TcpHeader {
            base,
            ..Default::default()
        }
    }
}

/// How many chunks a message of `total` bytes travels as (a 0-byte message
/// still sends one frame: its header is the signal).
pub fn nchunks(total: usize) -> usize {
    total.div_ceil(CHUNK_BYTES).max(1)
}

/// Whether message number `msg` comes after `current` (wrapping: up to half
/// the number space ahead).
pub(super) fn is_later(msg: u32, current: u32) -> bool {
    let d = msg.wrapping_sub(current);
    d != 0 && d <= u32::MAX / 2
}

/// A stall notice as a whole frame: header, then the chain as u32s.
pub(super) fn stall_frame(n: &StallNotice) -> Vec<u8> {
    let payload: Vec<u8> = n
        .chain
        .iter()
        .take(STALL_CHAIN_MAX)
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let hdr = TcpHeader::control(WireHeader {
        magic: MAGIC,
        frame: FRAME_STALL,
        seq: n.seq,
        comm: n.comm,
        len: payload.len() as u64,
        ..Default::default()
    });
    let mut frame = bytemuck::bytes_of(&hdr).to_vec();
    frame.extend_from_slice(&payload);
    frame
}

/// An abort notice as a whole frame: header, then the reason's text. The
/// header carries the blamed rank in `root` and, for mismatches
/// (`redop == 1`), the blamed signature in `seq`, the detector's in `sig`
/// and the detector's rank in `count`.
pub(super) fn abort_frame(n: &AbortNotice) -> Vec<u8> {
    let text = n.wire_text();
    let (flag, blamed_sig, detector, detector_sig) = match n.mismatch {
        Some((b, d, ds)) => (1, b, d as u64, ds),
        None => (0, 0, 0, 0),
    };
    let hdr = TcpHeader::control(WireHeader {
        magic: MAGIC,
        frame: FRAME_ABORT,
        redop: flag,
        root: n.origin as u32,
        seq: blamed_sig,
        sig: detector_sig,
        count: detector,
        len: text.len() as u64,
        ..Default::default()
    });
    let mut frame = bytemuck::bytes_of(&hdr).to_vec();
    frame.extend_from_slice(text.as_bytes());
    frame
}

/// Whether `h` leads a control frame (rather than a chunk).
pub(super) fn is_control(h: &WireHeader) -> bool {
    h.magic == MAGIC && matches!(h.frame, FRAME_ABORT | FRAME_STALL)
}

/// A control frame being received: its header and the payload so far.
pub(super) struct ControlIn {
    pub hdr: WireHeader,
    pub payload: Vec<u8>,
}

/// What a finished control frame means for the receive in progress.
pub(super) enum Control {
    /// A stall notice: noted, and frames are read on.
    Stall(StallNotice),
    /// The peer failed.
    Abort(AbortNotice),
}

/// Checks a control frame's header before its payload is read: the length
/// must be what that kind of frame can carry, or the stream is garbage.
pub(super) fn control_payload_len(h: &WireHeader, peer: usize) -> Result<usize, ErrorKind> {
    let max = match h.frame {
        FRAME_STALL => STALL_PAYLOAD_MAX,
        FRAME_ABORT => ABORT_TEXT_MAX,
        _ => unreachable!("only control frames are checked here"),
    };
    if h.len > max as u64 || (h.frame == FRAME_STALL && !h.len.is_multiple_of(4)) {
        return Err(ErrorKind::Garbage {
            peer,
            detail: format!(
                "control frame {} with a {}-byte payload (at most {max})",
                h.frame, h.len
            ),
        });
    }
    Ok(h.len as usize)
}

/// Interprets a complete control frame (see [`abort_frame`] for the
/// abort header's fields).
pub(super) fn decode_control(c: ControlIn) -> Control {
    let h = c.hdr;
    match h.frame {
        FRAME_ABORT => Control::Abort(AbortNotice {
            origin: h.root as usize,
            detail: String::from_utf8_lossy(&c.payload).into_owned(),
            mismatch: (h.redop == 1).then_some((h.seq, h.count as usize, h.sig)),
        }),
        _ => {
            let chain = c
                .payload
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            Control::Stall(StallNotice {
                seq: h.seq,
                comm: h.comm,
                chain,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splits an encoded control frame the way the receiver reads it.
    fn receive(frame: &[u8]) -> Control {
        let hdr: TcpHeader = bytemuck::pod_read_unaligned(&frame[..TCP_HEADER_BYTES]);
        assert!(is_control(&hdr.base));
        let len = control_payload_len(&hdr.base, 3).unwrap();
        assert_eq!(len, frame.len() - TCP_HEADER_BYTES);
        decode_control(ControlIn {
            hdr: hdr.base,
            payload: frame[TCP_HEADER_BYTES..].to_vec(),
        })
    }

    #[test]
    fn a_stall_notice_survives_the_wire() {
        let n = StallNotice {
            seq: 42,
            comm: 0xc0ffee,
            chain: vec![3, 1, 7],
        };
        match receive(&stall_frame(&n)) {
            Control::Stall(got) => assert_eq!(got, n),
            Control::Abort(_) => panic!("decoded as an abort"),
        }
    }

    #[test]
    fn an_abort_notice_survives_the_wire() {
        let n = AbortNotice {
            origin: 2,
            detail: "rank 2 failed".into(),
            mismatch: Some((11, 4, 13)),
        };
        match receive(&abort_frame(&n)) {
            Control::Abort(got) => {
                assert_eq!(got.origin, 2);
                assert_eq!(got.mismatch, Some((11, 4, 13)));
                assert_eq!(got.detail, n.wire_text());
            }
            Control::Stall(_) => panic!("decoded as a stall notice"),
        }
    }

    #[test]
    fn a_control_frame_longer_than_its_kind_allows_is_garbage() {
        let h = WireHeader {
            magic: MAGIC,
            frame: FRAME_STALL,
            len: STALL_PAYLOAD_MAX as u64 + 4,
            ..Default::default()
        };
        assert!(matches!(
            control_payload_len(&h, 3),
            Err(ErrorKind::Garbage { peer: 3, .. })
        ));
    }

    #[test]
    fn message_numbers_wrap() {
        assert!(is_later(1, 0));
        assert!(is_later(0, u32::MAX));
        assert!(!is_later(5, 5));
        assert!(!is_later(4, 5));
    }
}
