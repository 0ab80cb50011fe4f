//! **Two cores on one single copy.** A message of `HELP_MIN` (2 MiB) or
//! more that goes straight into the destination is offered to the sender
//! too: the receiver writes its destination's address, the length and a
//! chunk size into the ring's control line (`CTL_HELP_*`) and both sides
//! claim chunks from one counter with a compare-and-swap; the receiver
//! reads its chunks (`process_vm_readv`), the sender, which polls its
//! rendezvous while it waits, writes its own (`process_vm_writev`) and
//! counts them done. The receiver releases the rendezvous once every chunk
//! is in, so the sender writes only while the receiver's call is running;
//! a receiver that fails takes the offer back and waits for the chunks the
//! sender has claimed before its caller gets the memory back
//! (`revoke_help`). The offer rings the sender's doorbell: a sender that
//! came early has stopped polling and sleeps (without the wake-up, a late
//! receiver was never helped). A sender that is busy elsewhere claims
//! nothing, and the receiver reads it all. Two cores on a large broadcast
//! are markedly faster than the receiver alone (docs/benchmarks.md).
//!
//! The control words (`layout.rs`): `CTL_HELP_CLAIM` is `tag << 32 | next
//! chunk`, which either side claims with a compare-and-swap;
//! `CTL_HELP_DONE` is `tag << 32 | chunks` the sender has written;
//! `CTL_HELP_DST` and `CTL_HELP_LEN` are where the helped range starts in
//! the receiver's memory and its length; `CTL_HELP_FAILED` is `tag << 32 |
//! chunk + 1` of a chunk the sender failed to write (the receiver reads it
//! itself); `CTL_HELP_CHUNK` is the chunk size. The tag is the rendezvous
//! frame's number + 1 (low 32 bits, never 0), so words left from an earlier
//! message never match.

use super::layout::{
    CTL_HELP_CHUNK, CTL_HELP_CLAIM, CTL_HELP_DONE, CTL_HELP_DST, CTL_HELP_FAILED, CTL_HELP_LEN,
};
use super::single_copy::{CmaDesc, CMA_DIRECT_CHUNK};
use super::sys::{cma_read, cma_write};
use super::ShmLink;
use crate::copy::shifted_ahead;
use crate::error::ErrorKind;
use crate::transport::{RecvJob, SendJob};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Single-copy messages from this size let the sender help.
pub(super) const HELP_MIN: usize = 2 << 20;
/// The helped message goes in chunks, each read by the receiver or written
/// by the sender, whichever claims it first: an eighth of the message (the
/// slower side finishes at most a chunk after the other), from 1 MiB (a
/// system call's fixed cost) to 4 MiB (`CMA_DIRECT_CHUNK`), whole pages.
pub(super) fn help_chunk(len: usize) -> usize {
    (len / 8)
        .clamp(1 << 20, CMA_DIRECT_CHUNK)
        .next_multiple_of(4096)
}
/// How long a failing receiver waits for a chunk the sender is writing
/// into its memory before it gives the memory back to its caller anyway (a
/// chunk takes about 0.1 ms).
const HELP_DRAIN: Duration = Duration::from_secs(1);

/// The receiver's side of a helped single copy (see `CTL_HELP_CLAIM`).
#[derive(Clone, Copy, Debug)]
pub(super) struct HelpRx {
    tag: u32,
    chunk: usize,
    chunks: u64,
    /// Chunks this rank read itself, ...
    mine: u64,
    /// ... of which it claimed these, and read these after the sender
    /// failed to write them.
    claimed: u64,
    redone: u64,
}

fn help_word(tag: u32, n: u64) -> u64 {
    (tag as u64) << 32 | n
}

fn help_count(word: u64, tag: u32) -> Option<u64> {
    (word >> 32 == tag as u64).then_some(word & 0xffff_ffff)
}

/// Claims the next chunk of the helped range `tag` (of `chunks`), if one is left.
fn claim_chunk(claim: &AtomicU64, tag: u32, chunks: u64) -> Option<u64> {
    let mut w = claim.load(Ordering::Acquire);
    loop {
        let k = help_count(w, tag)?;
        if k >= chunks {
            return None;
        }
        match claim.compare_exchange_weak(w, w + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(k),
            Err(now) => w = now,
        }
    }
}

impl ShmLink {
    /// Writes one chunk of the single-copy message the receiver is reading
    /// (frame `until - 1`) straight into its destination, if the receiver
    /// offered the range (`CTL_HELP_CLAIM`) and a chunk is left: the two
    /// cores then copy the message between them, where the sender's would
    /// otherwise wait idle.
    pub(super) fn help_receiver(&mut self, job: &SendJob, until: u64) -> Result<bool, ErrorKind> {
        let tag = until as u32;
        if !self.help_tx_ok || tag == 0 || self.rx.cma_ok().load(Ordering::Relaxed) != 1 {
            return Ok(false);
        }
        let claim = self.tx.ctl_u64(CTL_HELP_CLAIM);
        if help_count(claim.load(Ordering::Acquire), tag).is_none() {
            return Ok(false);
        }
        // Written before the claim word that the acquire above saw.
        let dst = self.tx.ctl_u64(CTL_HELP_DST).load(Ordering::Relaxed);
        let len = self.tx.ctl_u64(CTL_HELP_LEN).load(Ordering::Relaxed) as usize;
        let chunk = self.tx.ctl_u64(CTL_HELP_CHUNK).load(Ordering::Relaxed) as usize;
        if len != job.src.len() || chunk == 0 {
            return Ok(false); // only whole messages are offered
        }
        let Some(k) = claim_chunk(claim, tag, len.div_ceil(chunk) as u64) else {
            return Ok(false);
        };
        let off = k as usize * chunk;
        let n = chunk.min(len - off);
        match cma_write(self.peer_pid, dst + off as u64, job.src.bytes(off, n)) {
            Ok(()) => {
                self.tx
                    .ctl_u64(CTL_HELP_DONE)
                    .fetch_add(1, Ordering::Release);
                self.stats.single_copy_helped.add(n as u64);
            }
            Err(_) => {
                // The receiver reads this chunk itself; we stop helping.
                self.help_tx_ok = false;
                self.tx
                    .ctl_u64(CTL_HELP_FAILED)
                    .store(help_word(tag, k + 1), Ordering::Release);
            }
        }
        // The receiver may sleep waiting for the chunk.
        self.wake_peer();
        Ok(true)
    }

    /// Offers the sender the message whose rendezvous frame this rank is
    /// reading, to copy it with us in chunks (`help_chunk`, `CTL_HELP_CLAIM`):
    /// when the whole message goes straight into the destination (not
    /// reduced, not shifted within a line from the source).
    pub(super) fn offer_help(&mut self, job: &mut RecvJob, desc: &CmaDesc, rest: usize) {
        let tag = (self.rx.mine + 1) as u32;
        if tag == 0 || desc.len != rest as u64 {
            return;
        }
        let Some(dst) = job.sink.direct(job.got, rest) else {
            return;
        };
        if shifted_ahead(dst.as_ptr() as usize, desc.addr as usize) {
            return;
        }
        let at = dst.as_ptr() as u64;
        let chunk = help_chunk(rest);
        let ctl = |off| self.rx.ctl_u64(off);
        ctl(CTL_HELP_DST).store(at, Ordering::Relaxed);
        ctl(CTL_HELP_LEN).store(rest as u64, Ordering::Relaxed);
        ctl(CTL_HELP_CHUNK).store(chunk as u64, Ordering::Relaxed);
        ctl(CTL_HELP_DONE).store(help_word(tag, 0), Ordering::Relaxed);
        ctl(CTL_HELP_FAILED).store(0, Ordering::Relaxed);
        // Publishes the words above to the sender.
        ctl(CTL_HELP_CLAIM).store(help_word(tag, 0), Ordering::Release);
        // A sender that came early has spun, yielded and gone to sleep on
        // its rendezvous: wake it to help (a load when it is awake).
        self.wake_peer();
        self.help_rx = Some(HelpRx {
            tag,
            chunk,
            chunks: rest.div_ceil(chunk) as u64,
            mine: 0,
            claimed: 0,
            redone: 0,
        });
    }

    /// Reads the next unclaimed chunk of a helped message (or one the sender
    /// failed to write): `Some(bytes)`. `None` when none is left: then
    /// `help_rx` is cleared once the sender's chunks are all in too.
    pub(super) fn read_helped(
        &mut self,
        job: &mut RecvJob,
        desc: &CmaDesc,
        start: usize,
        rest: usize,
    ) -> Result<Option<usize>, (std::io::Error, usize)> {
        let Some(mut h) = self.help_rx else {
            return Ok(None);
        };
        let k = match claim_chunk(self.rx.ctl_u64(CTL_HELP_CLAIM), h.tag, h.chunks) {
            Some(k) => {
                h.claimed += 1;
                Some(k)
            }
            None => {
                let failed = self.rx.ctl_u64(CTL_HELP_FAILED);
                match help_count(failed.load(Ordering::Acquire), h.tag) {
                    Some(k1) if k1 > 0 => {
                        failed.store(0, Ordering::Relaxed);
                        h.redone += 1;
                        Some(k1 - 1)
                    }
                    _ => None,
                }
            }
        };
        self.help_rx = Some(h);
        if let Some(k) = k {
            let off = k as usize * h.chunk;
            let n = h.chunk.min(rest - off);
            let dst = job
                .sink
                .direct(start + off, n)
                .expect("a helped receive goes straight into a copy sink");
            cma_read(desc.pid, desc.addr + off as u64, dst).map_err(|e| (e, n))?;
            h.mine += 1;
            self.help_rx = Some(h);
            return Ok(Some(n));
        }
        let done = self.rx.ctl_u64(CTL_HELP_DONE).load(Ordering::Acquire);
        if h.mine + help_count(done, h.tag).unwrap_or(0) >= h.chunks {
            self.help_rx = None;
        }
        Ok(None)
    }

    /// Takes back the range this rank offered its sender, on the way out of
    /// a failed receive (the caller gets its memory back): no chunk can be
    /// claimed any more, and the ones the sender claimed are waited for, up
    /// to `HELP_DRAIN`, so that it writes nothing there afterwards.
    pub(super) fn revoke_help(&mut self) {
        let Some(h) = self.help_rx.take() else {
            return;
        };
        let prev = self
            .rx
            .ctl_u64(CTL_HELP_CLAIM)
            .swap(help_word(h.tag, h.chunks), Ordering::AcqRel);
        let theirs = help_count(prev, h.tag)
            .unwrap_or(0)
            .min(h.chunks)
            .saturating_sub(h.claimed);
        let deadline = Instant::now() + HELP_DRAIN;
        loop {
            let done = help_count(
                self.rx.ctl_u64(CTL_HELP_DONE).load(Ordering::Acquire),
                h.tag,
            );
            let failed = help_count(
                self.rx.ctl_u64(CTL_HELP_FAILED).load(Ordering::Acquire),
                h.tag,
            )
            .is_some_and(|k| k > 0);
            let settled = done.unwrap_or(0) + h.redone + u64::from(failed);
            if settled >= theirs || Instant::now() >= deadline {
                return;
            }
            std::thread::yield_now();
        }
    }
}
