//! Where every byte of an inbox file lives. These offsets are the protocol
//! between the processes of a host (each maps the same file), so they are
//! listed once, here, and compile-time checks prove that no two fields of
//! the header, of a stall slot, of a ring's control line or of a header
//! slot overlap: a field placed inside another corrupts both, silently.
//!
//! ```text
//! inbox: [header, header_size(nrings)] [ring 0] [ring 1] ...   ring k: from local rank k
//! ring:  [control, RING_CTL] [nframes header slots, SLOT_HDR each]
//!        [payload space, ring_bytes] [spill room, frame_bytes]
//! ```

use super::ShmConfig;
use crate::transport::{ABORT_TEXT_MAX, HEADER_BYTES, STALL_CHAIN_MAX};

pub(super) const INBOX_MAGIC: u64 = 0x5842_4e49_4e44_4443; // "CDNINBX" + tag
/// The smallest header (one page); a file shorter than this is not an inbox yet.
pub(super) const MIN_HDR_SIZE: usize = 4096;

// The inbox header. Every field is listed in `HEADER_FIELDS` below.
pub(super) const OFF_MAGIC: usize = 0;
pub(super) const OFF_PID: usize = 8;
pub(super) const OFF_NRINGS: usize = 16;
// The rings' geometry ([`ShmConfig`]), which senders read from here.
pub(super) const OFF_FRAME_BYTES: usize = 20;
pub(super) const OFF_NFRAMES: usize = 24;
pub(super) const OFF_RING_BYTES: usize = 28;
/// Where the owner mapped this inbox in its own address space: a peer reads
/// the magic there through `process_vm_readv` to learn whether it may read
/// the owner's memory (single copy).
pub(super) const OFF_SELF_ADDR: usize = 32;
pub(super) const OFF_ABORT_FLAG: usize = 64;
pub(super) const OFF_ABORT_ORIGIN: usize = 68;
pub(super) const OFF_ABORT_LEN: usize = 72;
pub(super) const OFF_ABORT_MISMATCH: usize = 76; // u32: 1 when the three fields below are set
pub(super) const OFF_ABORT_BLAMED_SIG: usize = 80;
pub(super) const OFF_ABORT_DETECTOR_SIG: usize = 88;
pub(super) const OFF_ABORT_DETECTOR: usize = 96;
/// Doorbell: a futex word peers bump (and wake) after publishing something
/// this rank may be sleeping on, and the flag saying it sleeps. On its own
/// cache line: peers read the flag after every publish, and it only changes
/// when this rank goes to sleep, so the read is a cache hit.
pub(super) const OFF_DOORBELL: usize = 128;
pub(super) const OFF_SLEEPING: usize = 132;
/// Where this rank stands in its collectives (`Progress`), on a line of
/// its own: written by the owner at each operation's start, phase and end,
/// read by a peer only when it times out waiting for the owner.
pub(super) const OFF_PROGRESS: usize = 192;
/// The abort notice's text (UTF-8, `OFF_ABORT_LEN` bytes).
pub(super) const OFF_ABORT_MSG: usize = 256;
pub(super) const ABORT_MSG_MAX: usize = ABORT_TEXT_MAX;
/// Stall table: one slot per ring, i.e. per same-host sender by local index
/// (the header grows with the number of rings: see [`header_size`]).
pub(super) const OFF_STALL: usize = 2304;
pub(super) const STALL_SLOT: usize = 48;
/// A stall slot: `[len u32 (0 = empty; written last), pad u32, seq u64,
/// chain u32 × STALL_CHAIN_MAX]`.
pub(super) const STALL_LEN: usize = 0;
pub(super) const STALL_SEQ: usize = 8;
pub(super) const STALL_CHAIN: usize = 16;

/// The header's size for `nrings` rings: the fixed fields, then one stall
/// slot per ring, rounded up to a page (one page up to 37 rings).
pub(super) fn header_size(nrings: usize) -> usize {
    (OFF_STALL + nrings * STALL_SLOT)
        .next_multiple_of(4096)
        .max(MIN_HDR_SIZE)
}

/// (offset, bytes) of every fixed header field, in address order.
const HEADER_FIELDS: [(usize, usize); 18] = [
    (OFF_MAGIC, 8),
    (OFF_PID, 4),
    (OFF_NRINGS, 4),
    (OFF_FRAME_BYTES, 4),
    (OFF_NFRAMES, 4),
    (OFF_RING_BYTES, 4),
    (OFF_SELF_ADDR, 8),
    (OFF_ABORT_FLAG, 4),
    (OFF_ABORT_ORIGIN, 4),
    (OFF_ABORT_LEN, 4),
    (OFF_ABORT_MISMATCH, 4),
    (OFF_ABORT_BLAMED_SIG, 8),
    (OFF_ABORT_DETECTOR_SIG, 8),
    (OFF_ABORT_DETECTOR, 4),
    (OFF_DOORBELL, 4),
    (OFF_SLEEPING, 4),
    (OFF_PROGRESS, 8),
    (OFF_ABORT_MSG, ABORT_MSG_MAX),
];

/// The unit the rings are laid out in: two cache lines, the pair that
/// x86's spatial prefetcher fetches together. Keeping what one side writes
/// and what the other side polls in different pairs keeps the prefetcher
/// from pulling a line into the reader's cache just before the writer needs
/// it back (64-byte header slots in a row made small messages measurably
/// slower).
pub(super) const LINE_PAIR: usize = 128;
/// Ring control: the receiver's `tail` (frames consumed), alone on its
/// line pair's first line with `CTL_CMA_OK` (written once at set-up:
/// whether the receiver can read the sender's memory).
pub(super) const RING_CTL: usize = LINE_PAIR;
pub(super) const CTL_TAIL: usize = 0;
pub(super) const CTL_CMA_OK: usize = 8;
/// The ring control's second line: a single-copy receive that lets its
/// sender help (the words' meaning: `help.rs`). The chunk size comes last.
pub(super) const CTL_HELP_CLAIM: usize = 64;
pub(super) const CTL_HELP_DONE: usize = 72;
pub(super) const CTL_HELP_DST: usize = 80;
pub(super) const CTL_HELP_LEN: usize = 88;
pub(super) const CTL_HELP_FAILED: usize = 96;
pub(super) const CTL_HELP_CHUNK: usize = 104;

/// (offset, bytes) of every ring control word, in address order.
const RING_CTL_FIELDS: [(usize, usize); 8] = [
    (CTL_TAIL, 8),
    (CTL_CMA_OK, 4),
    (CTL_HELP_CLAIM, 8),
    (CTL_HELP_DONE, 8),
    (CTL_HELP_DST, 8),
    (CTL_HELP_LEN, 8),
    (CTL_HELP_FAILED, 8),
    (CTL_HELP_CHUNK, 8),
];

/// A header slot, a line pair: the frame header (48 bytes), the stamp (8
/// bytes) and up to 72 bytes of inline payload. Payloads of at most
/// `INLINE_MAX` bytes live in the slot, so small messages cost the
/// receiver the two lines the prefetcher brings together; larger ones live
/// in the payload space.
pub(super) const SLOT_HDR: usize = LINE_PAIR;
pub(super) const OFF_STAMP: usize = 48;
pub(super) const OFF_INLINE: usize = 56;
pub(super) const INLINE_MAX: usize = SLOT_HDR - OFF_INLINE;

/// Each field ends before the next begins, and the last by `end`.
const fn disjoint(fields: &[(usize, usize)], end: usize) -> bool {
    let mut i = 1;
    while i < fields.len() {
        let (prev_off, prev_len) = fields[i - 1];
        if prev_off + prev_len > fields[i].0 {
            return false;
        }
        i += 1;
    }
    let (last_off, last_len) = fields[fields.len() - 1];
    last_off + last_len <= end
}
const _: () = assert!(
    disjoint(&HEADER_FIELDS, OFF_STALL),
    "inbox header fields overlap"
);
const _: () = assert!(
    disjoint(
        &[
            (STALL_LEN, 4),
            (STALL_SEQ, 8),
            (STALL_CHAIN, 4 * STALL_CHAIN_MAX)
        ],
        STALL_SLOT
    ),
    "stall slot fields overlap"
);
const _: () = assert!(
    disjoint(&RING_CTL_FIELDS, RING_CTL),
    "ring control words overlap"
);
const _: () = assert!(
    disjoint(&[(0, HEADER_BYTES), (OFF_STAMP, 8)], OFF_INLINE),
    "a header slot's header and stamp overlap"
);

/// A ring's bytes: control line, header slots, payload space and the spill
/// room a frame that starts near the end runs on into.
pub(super) fn ring_size(cfg: &ShmConfig) -> usize {
    let spill = cfg.frame_bytes.next_multiple_of(LINE_PAIR);
    (RING_CTL + cfg.nframes * SLOT_HDR + cfg.ring_bytes + spill).next_multiple_of(4096)
}

/// Where ring `index` of an inbox of `nrings` rings of geometry `cfg` starts.
pub(super) fn ring_offset(nrings: usize, cfg: &ShmConfig, index: usize) -> usize {
    header_size(nrings) + index * ring_size(cfg)
}

/// An inbox file's bytes.
pub(super) fn inbox_size(nrings: usize, cfg: &ShmConfig) -> usize {
    ring_offset(nrings, cfg, nrings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_grows_with_the_rings() {
        assert_eq!(header_size(1), 4096);
        assert_eq!(header_size(37), 4096); // 2304 + 37 * 48 = 4080
        assert_eq!(header_size(38), 8192);
        assert_eq!(header_size(128), 12288); // 2304 + 128 * 48 = 8448
        for n in 1..300 {
            assert!(OFF_STALL + n * STALL_SLOT <= header_size(n));
        }
    }
}
