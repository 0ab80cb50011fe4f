//! Reading ahead on the receive side of a link with several paths. When a
//! path fails, the peer sends its chunks again on the others, behind
//! whatever those streams already carry, which may be later messages. A
//! receive that waits for such a chunk reads the later frames ahead
//! ("parks" them) so that the chunks behind them can arrive; the receive of
//! their own message takes them from here.

use super::frame::{is_later, TcpHeader, CHUNK_BYTES};
use super::recv::{ChunkDest, RxChunk, RxState};
use super::TcpLink;
use crate::error::ErrorKind;
use crate::transport::RecvJob;
use std::time::{Duration, Instant};

/// Later messages' bytes a receiver reads ahead, per link, while it waits
/// for chunks sent again.
const PARK_MAX: usize = 512 << 20;
/// A later message's frame that has waited this long while the message
/// being received stays incomplete is read ahead (parked), since the
/// chunks that complete it may be queued behind it.
const PARK_AFTER: Duration = Duration::from_millis(100);

/// Frames read ahead, and for which receive.
#[derive(Default)]
pub(super) struct Parking {
    /// Frames of later messages read ahead, and their bytes (counting
    /// those still being read).
    pub frames: Vec<(TcpHeader, Vec<u8>)>,
    pub bytes: usize,
    /// The message whose receive reads later frames ahead.
    pub for_msg: Option<u32>,
}

impl TcpLink {
    /// Whether the receive of message `msg` reads ahead the later frame
    /// whose header waits on a stream since `at`. Once one frame is read
    /// ahead for a receive, the rest follow at once: there may be
    /// megabytes of them before the copies sent again.
    pub(super) fn should_park(&self, msg: u32, at: Instant) -> bool {
        let parking = self.parked.for_msg == Some(msg);
        self.multipath.on() && (parking || at.elapsed() >= PARK_AFTER)
    }

    /// Reads the frame whose header waits on stream `s` (a later message's)
    /// into memory, for the receive of message `current`, so that what
    /// follows it on the stream can be read: chunks of the message being
    /// received that were sent again after a path failed may be queued
    /// behind it.
    pub(super) fn park(&mut self, s: usize, h: TcpHeader, current: u32) -> Result<(), ErrorKind> {
        self.parked.for_msg = Some(current);
        let len = h.base.len as usize;
        if len > CHUNK_BYTES {
            return Err(self.garbage(format!("a {len}-byte chunk (at most {CHUNK_BYTES})")));
        }
        if self.parked.bytes + len > PARK_MAX {
            return Err(self.garbage(format!(
                "more than {} MiB of later messages arrived while message {} is incomplete",
                PARK_MAX >> 20,
                self.rx_msg
            )));
        }
        self.parked.bytes += len;
        self.rx[s] = RxState::Chunk(RxChunk {
            hdr: h,
            index: 0,
            off: 0,
            len,
            done: 0,
            to: ChunkDest::Park(vec![0; len]),
        });
        Ok(())
    }

    /// Stream `s`'s read-ahead is cut off (the stream was lost): its bytes
    /// no longer count.
    pub(super) fn unpark_lost(&mut self, s: usize) {
        if let RxState::Chunk(RxChunk {
            to: ChunkDest::Park(_),
            len,
            ..
        }) = &self.rx[s]
        {
            self.parked.bytes -= len;
        }
    }

    /// Applies the read-ahead frames that belong to `job`'s message, and
    /// drops those of messages already complete.
    pub(super) fn take_parked(&mut self, job: &mut RecvJob) -> Result<bool, ErrorKind> {
        let mut moved = false;
        let mut i = 0;
        while i < self.parked.frames.len() {
            let msg = self.parked.frames[i].0.msg;
            if is_later(msg, job.tcp.msg) {
                i += 1;
                continue;
            }
            let (h, data) = self.parked.frames.swap_remove(i);
            self.parked.bytes -= data.len();
            if msg != job.tcp.msg {
                continue;
            }
            moved = true;
            let c = self.begin_chunk(&h, job)?;
            if data.len() != c.len {
                return Err(self.garbage(format!(
                    "a {}-byte frame at byte offset {} of message {msg}",
                    data.len(),
                    c.off
                )));
            }
            if !matches!(c.to, ChunkDest::Discard) {
                job.sink.deliver(c.off, &data);
                job.got += c.len;
                job.tcp.seen[c.index / 64] |= 1 << (c.index % 64);
                job.tcp.received += 1;
            }
            if job.tcp.received == job.tcp.nchunks {
                break;
            }
        }
        Ok(moved)
    }
}
