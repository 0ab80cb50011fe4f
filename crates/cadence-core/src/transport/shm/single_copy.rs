//! **Single copy** (large messages): through a ring a message is copied
//! twice, into the slot by the sender and out of it by the receiver. From
//! `ShmConfig::cma_min` bytes (256 KiB) the sender instead publishes one
//! *rendezvous* slot (frame `FRAME_CMA`) that names its buffer (pid, address,
//! length), and the receiver copies straight from the sender's memory into
//! its destination with `process_vm_readv(2)` (cross-memory attach, as Open
//! MPI's shared-memory transport does), reducing on the way when the receive
//! reduces. Releasing the slot tells the sender its buffer is free again. A
//! receiver that can read its sender says so once, at set-up, in the ring's
//! control line (`cma_ok`, after a test read of the sender's inbox through
//! the sender's address space); without it (containers that forbid the
//! call, `CADENCE_SHM_CMA_MIN=0`) the ring carries everything.
//!
//! Single copy leaves the sender's core idle while the receiver copies.
//! Where the sender has nothing else to do or the receiver reduces (reduce,
//! broadcast: `engine::prefers_stream` marks their jobs `prefer_stream`),
//! streaming through the ring puts two cores on each message instead. The
//! collectives in `ShmConfig::stream` (`CADENCE_SHM_STREAM`; default: reduce)
//! then keep such messages in the ring whatever their size. A large message
//! read straight into its destination can put the sender's core to work
//! too: `help.rs`.

use super::help::HELP_MIN;
use super::layout::{INBOX_MAGIC, OFF_SELF_ADDR};
use super::notice::read_abort;
use super::sys::{cma_read, Region};
use super::ShmLink;
use crate::copy::{shifted_ahead, window_aligned_like};
use crate::error::ErrorKind;
use crate::transport::{RecvJob, SendJob, WireHeader, FRAME_CMA, FRAME_DATA};
use std::sync::atomic::Ordering;

/// A rendezvous frame's payload: `[pid u32, pad u32, address u64, length u64]`.
pub(super) const CMA_DESC_BYTES: usize = 24;
/// Bytes a receiver copies per call while it reads a sender's buffer
/// through its scratch buffer (reducing receives, and destinations shifted
/// within a line from the source): the scratch stays in cache, and the
/// engine moves its other transfers in between.
pub(super) const CMA_CHUNK: usize = 256 * 1024;
/// Bytes a receiver reads per call straight into the destination. Each
/// `process_vm_readv` has a fixed cost (the permission check, pinning the
/// first pages), so larger reads are faster (`benchmarks/cma_chunks.py`); a
/// 4 MiB read takes about half a millisecond, which bounds how long the
/// engine leaves its other transfers.
pub(super) const CMA_DIRECT_CHUNK: usize = 4 << 20;

/// A rendezvous slot's description of the sender's buffer.
#[derive(Clone, Copy)]
pub(super) struct CmaDesc {
    pub(super) pid: u32,
    pub(super) addr: u64,
    pub(super) len: u64,
}

impl CmaDesc {
    fn encode(&self) -> [u8; CMA_DESC_BYTES] {
        let mut b = [0u8; CMA_DESC_BYTES];
        b[0..4].copy_from_slice(&self.pid.to_le_bytes());
        b[8..16].copy_from_slice(&self.addr.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b
    }
    fn decode(b: &[u8]) -> CmaDesc {
        let word = |r: std::ops::Range<usize>| {
            let mut w = [0u8; 8];
            w[..r.len()].copy_from_slice(&b[r]);
            u64::from_le_bytes(w)
        };
        CmaDesc {
            pid: word(0..4) as u32,
            addr: word(8..16),
            len: word(16..24),
        }
    }
}

/// Whether this process can read process `peer_pid`'s memory: a test read
/// of the magic of its inbox (`peer_inbox`) through its own address space.
pub(super) fn can_read_peer(peer_inbox: &Region, peer_pid: u32) -> bool {
    let addr = peer_inbox.atomic_u64(OFF_SELF_ADDR).load(Ordering::Relaxed);
    let mut magic = [0u8; 8];
    cma_read(peer_pid, addr, &mut magic).is_ok() && u64::from_ne_bytes(magic) == INBOX_MAGIC
}

impl ShmLink {
    /// Whether `job`, not yet started, goes by single copy: large enough,
    /// not a message its collective streams, and the receiver can read us.
    pub(super) fn goes_by_single_copy(&self, job: &SendJob) -> bool {
        self.cma_min > 0
            && job.src.len() >= self.cma_min
            && !(job.prefer_stream && self.stream.takes(job.meta.coll))
            && self.single_copy()
    }

    /// Starts a single-copy send: publishes a rendezvous frame naming the
    /// job's buffer. False when the ring has no room for it yet.
    pub(super) fn send_rendezvous(&mut self, job: &mut SendJob) -> bool {
        if let Err(need) = self.tx.room(CMA_DESC_BYTES) {
            self.tx_need = need;
            return false;
        }
        let total = job.src.len();
        let desc = CmaDesc {
            pid: std::process::id(),
            addr: job.src.bytes(0, total).as_ptr() as u64,
            len: total as u64,
        };
        let mut hdr = job.meta.header(CMA_DESC_BYTES);
        hdr.frame = FRAME_CMA;
        self.publish(&hdr, &desc.encode());
        self.cma_wait = Some(self.tx.mine);
        job.sent = total;
        job.started = true;
        self.stats.bytes_sent.add(total as u64);
        true
    }

    /// A single-copy send in flight (its rendezvous frame is `until - 1`):
    /// done when the receiver released that frame, for it has read the
    /// whole buffer; until then the sender helps it (`help_receiver`).
    pub(super) fn await_rendezvous(
        &mut self,
        job: &mut SendJob,
        until: u64,
    ) -> Result<bool, ErrorKind> {
        self.tx.theirs = self.tx.tail().load(Ordering::Acquire);
        if self.tx.theirs < until {
            return self.help_receiver(job, until);
        }
        self.cma_wait = None;
        job.done = true;
        self.stats.msgs_sent.add(1);
        self.stats.single_copy_sent.add(1);
        Ok(true)
    }

    /// The description in the receiver's next frame, a rendezvous frame.
    pub(super) fn rendezvous_desc(&self) -> CmaDesc {
        CmaDesc::decode(self.rx.region.read(
            self.rx.payload(self.rx.mine, CMA_DESC_BYTES),
            CMA_DESC_BYTES,
        ))
    }

    /// Reads (a chunk of) a single-copy message from the sender's memory
    /// into the job's sink; releases the rendezvous slot once all is read.
    pub(super) fn recv_single_copy(
        &mut self,
        job: &mut RecvJob,
        hdr: WireHeader,
    ) -> Result<bool, ErrorKind> {
        let total = job.sink.len();
        if hdr.len != CMA_DESC_BYTES as u64 {
            return Err(ErrorKind::Garbage {
                peer: self.peer,
                detail: format!("a {}-byte single-copy frame", hdr.len),
            });
        }
        let desc = self.rendezvous_desc();
        let start = match self.cma_rx_start {
            Some(s) => s,
            None => {
                // Checked like a data frame that carries the whole rest.
                let whole = WireHeader {
                    frame: FRAME_DATA,
                    len: desc.len,
                    ..hdr
                };
                job.meta.check(&whole, self.peer, total - job.got)?;
                if desc.pid != self.peer_pid {
                    return Err(ErrorKind::Garbage {
                        peer: self.peer,
                        detail: format!(
                            "single-copy frame names pid {}, the peer is pid {}",
                            desc.pid, self.peer_pid
                        ),
                    });
                }
                self.cma_rx_start = Some(job.got);
                job.got
            }
        };
        let rest = total - job.got;
        let from = desc.addr + (job.got - start) as u64;
        let peer = self.peer;
        let failed = |e: std::io::Error, n: usize| match e.raw_os_error() {
            Some(libc::ESRCH) => ErrorKind::PeerDied {
                peer,
                pid: desc.pid,
            },
            _ => ErrorKind::Io {
                peer,
                detail: format!("single-copy read of {n} bytes at {from:#x}: {e}"),
            },
        };
        if self.help_rx.is_none() && job.got == start && rest >= HELP_MIN {
            self.offer_help(job, &desc, rest);
        }
        // Straight into the destination, unless it sits 1-31 bytes past the
        // sender's buffer within a line, where the kernel's copy is slow (see
        // `crate::copy`): then, as for reducing receives, through a scratch
        // chunk (kept in cache) lined up with the sender's buffer. A large
        // message read straight goes in chunks that the sender may take
        // too (`offer_help`).
        let big = CMA_DIRECT_CHUNK.min(rest);
        let read = if self.help_rx.is_some() {
            match self.read_helped(job, &desc, start, rest) {
                // A chunk read (the bytes are counted when all are in).
                Ok(Some(_)) => {
                    job.started = true;
                    return Ok(true);
                }
                // Waiting for the chunks the sender is writing.
                Ok(None) if self.help_rx.is_some() => return Ok(false),
                // Every chunk is in (the bytes counted as a whole below).
                Ok(None) => Ok(rest),
                Err(x) => Err(x),
            }
        } else {
            match job.sink.direct(job.got, big) {
                Some(dst) if !shifted_ahead(dst.as_ptr() as usize, from as usize) => {
                    cma_read(desc.pid, from, dst)
                        .map(|_| big)
                        .map_err(|e| (e, big))
                }
                _ => {
                    let n = CMA_CHUNK.min(rest);
                    let buf = window_aligned_like(&mut self.cma_scratch, n, from as usize);
                    match cma_read(desc.pid, from, buf) {
                        Ok(()) => {
                            job.sink.deliver(job.got, buf);
                            Ok(n)
                        }
                        Err(e) => Err((e, n)),
                    }
                }
            }
        };
        let n = match read {
            Ok(n) => n,
            Err((e, n)) => {
                self.revoke_help();
                // A sender that failed leaves its abort notice before it
                // hands its buffer back, so a read that found the buffer
                // gone (EFAULT) is that failure's consequence: report the
                // failure, which names its origin, not this peer's vanished
                // memory.
                if let Some(notice) = read_abort(&self.my_inbox) {
                    return Err(notice.into_error(job.meta.sig));
                }
                return Err(failed(e, n));
            }
        };
        job.got += n;
        job.started = true;
        self.stats.bytes_recv.add(n as u64);
        if job.got < total {
            return Ok(true);
        }
        // A sender that failed may have handed its buffer back to its
        // caller while we read; it leaves its abort notice here before it
        // returns, so none here means what we read was the message.
        if let Some(notice) = read_abort(&self.my_inbox) {
            return Err(notice.into_error(job.meta.sig));
        }
        self.cma_rx_start = None;
        self.release(CMA_DESC_BYTES);
        job.done = true;
        self.stats.msgs_recv.add(1);
        Ok(true)
    }
}
