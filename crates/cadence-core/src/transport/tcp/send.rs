//! The send path: cuts a message into chunks, gives each to the stream
//! that [`Multipath::first_to_finish`](super::multipath::Multipath) picks,
//! writes as far as the sockets take, and slips control frames (stall
//! notices, aborts) in between chunks, never into one.

use super::frame::TCP_HEADER_BYTES;
use super::frame::{abort_frame, nchunks, stall_frame, TcpHeader, CHUNK_BYTES, FLAG_RESENT};
use super::socket::write_all_now;
use super::TcpLink;
use crate::error::ErrorKind;
use crate::transport::{AbortNotice, ChunkCursor, SendJob, Source, StallNotice};
use std::io::{self, IoSlice, Write};
use std::net::Shutdown;

/// A chunk being written on one stream.
pub(super) struct TxChunk {
    pub hdr: TcpHeader,
    /// Header bytes written so far (of TCP_HEADER_BYTES).
    pub hdr_done: usize,
    /// Payload bytes written so far.
    pub done: usize,
    /// The payload, when the link keeps its own copy (failover on): the
    /// chunk may then outlive its send, and be sent again.
    pub copy: Option<Vec<u8>>,
}

impl TxChunk {
    /// Bytes of the frame not yet written (header and payload).
    pub fn unwritten(&self) -> usize {
        (TCP_HEADER_BYTES - self.hdr_done) + (self.hdr.base.len as usize - self.done)
    }
}

impl TcpLink {
    pub fn send_progress(&mut self, job: &mut SendJob) -> Result<bool, ErrorKind> {
        let total = job.src.len();
        if !job.started {
            job.tcp = ChunkCursor {
                msg: self.tx_msg,
                nchunks: nchunks(total),
                ..Default::default()
            };
            self.tx_msg = self.tx_msg.wrapping_add(1);
            job.started = true;
        }
        let mut progressed = false;
        if !self.tx_ctl.is_empty() {
            // A control frame goes first on its stream, between chunks.
            progressed |= self.flush_ctl()?;
        }
        progressed |= self.pump(Some(job))?;
        if !job.tcp.unassigned() && self.tx_idle() {
            job.done = true;
            self.stats.msgs_sent.add(1);
        }
        Ok(progressed)
    }

    /// Whether nothing is being written: no chunk under way on a working
    /// path, none waiting to go again.
    pub(super) fn tx_idle(&self) -> bool {
        !self.multipath.has_resend()
            && (0..self.streams.len()).all(|s| self.tx[s].is_none() || !self.multipath.stream_up(s))
    }

    /// Writes on every working stream as far as the sockets take it:
    /// first chunks to send again (a path failed), then `job`'s next
    /// chunks, each on the stream expected to deliver it first.
    pub(super) fn pump(&mut self, mut job: Option<&mut SendJob>) -> Result<bool, ErrorKind> {
        // Queues and rates are read once per call, and only when a free
        // stream has to decide whether the next chunk is its own.
        let multi = self.streams.len() > 1;
        let mut sampled = false;
        let mut progressed = false;
        for s in 0..self.streams.len() {
            if !self.multipath.stream_up(s) {
                continue;
            }
            loop {
                if self.tx[s].is_none() {
                    if s == self.multipath.ctl_stream() && !self.tx_ctl.is_empty() {
                        break;
                    }
                    if let Some(c) = self.multipath.take_resend() {
                        self.tx[s] = Some(TxChunk {
                            hdr: c.hdr,
                            hdr_done: 0,
                            done: 0,
                            copy: Some(c.data),
                        });
                    } else {
                        let Some(job) = job.as_deref_mut() else {
                            break;
                        };
                        if !job.tcp.unassigned() {
                            break;
                        }
                        let index = job.tcp.next;
                        let off = index * CHUNK_BYTES;
                        let len = CHUNK_BYTES.min(job.src.len() - off);
                        if multi {
                            if !sampled {
                                self.sample_rates();
                                sampled = true;
                            }
                            let now = std::time::Instant::now();
                            if self.multipath.first_to_finish(len, &self.tx, now) != s {
                                break;
                            }
                        }
                        job.tcp.next += 1;
                        // With failover on, the link keeps its own copy:
                        // the send completes when its chunks are written,
                        // and the caller may then reuse its buffer while a
                        // chunk may still have to go again.
                        let copy = self.multipath.on().then(|| {
                            let mut v = self.multipath.take_spare();
                            v.clear();
                            v.extend_from_slice(job.src.bytes(off, len));
                            v
                        });
                        self.tx[s] = Some(TxChunk {
                            hdr: TcpHeader {
                                base: job.meta.header(len),
                                msg: job.tcp.msg,
                                flags: 0,
                                off: off as u64,
                            },
                            hdr_done: 0,
                            done: 0,
                            copy,
                        });
                    }
                }
                // Whether the chunk is the send's own (not a copy going
                // again, nor the rest of an earlier send's chunk): only
                // those count as the send's progress.
                let own = job.as_deref().is_some_and(|j| {
                    self.tx[s]
                        .as_ref()
                        .is_some_and(|c| c.hdr.msg == j.tcp.msg && c.hdr.flags & FLAG_RESENT == 0)
                });
                match self.write_chunk(s, job.as_deref().map(|j| &j.src)) {
                    Ok(None) => break,
                    Ok(Some(n)) => {
                        progressed = true;
                        if let Some(j) = job.as_deref_mut().filter(|_| own) {
                            j.sent += n;
                        }
                    }
                    Err(e) => {
                        let why = self.io_err(e);
                        self.stream_failed(s, why)?;
                        break;
                    }
                }
            }
        }
        Ok(progressed)
    }

    /// Writes what stream `s`'s socket takes of its chunk. `Ok(None)`: it
    /// took nothing (full, or no chunk); else the payload bytes written. A
    /// finished chunk frees the stream (and, failover on, its copy waits
    /// for the peer's kernel to acknowledge it).
    fn write_chunk(&mut self, s: usize, src: Option<&Source>) -> io::Result<Option<usize>> {
        let Some(c) = self.tx[s].as_mut() else {
            return Ok(None);
        };
        let off = c.hdr.off as usize;
        let len = c.hdr.base.len as usize;
        let payload: &[u8] = match (&c.copy, src) {
            (Some(v), _) => &v[c.done..],
            (None, Some(src)) => src.bytes(off + c.done, len - c.done),
            // A chunk without a copy is written only by its own send.
            (None, None) => return Ok(None),
        };
        let stream = &mut self.streams[s];
        let hdr_bytes = bytemuck::bytes_of(&c.hdr);
        let res = loop {
            let r = if c.hdr_done < TCP_HEADER_BYTES {
                stream.write_vectored(&[
                    IoSlice::new(&hdr_bytes[c.hdr_done..]),
                    IoSlice::new(payload),
                ])
            } else {
                stream.write(payload)
            };
            match r {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => break r,
            }
        };
        let mut n = match res {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(e),
        };
        let h = n.min(TCP_HEADER_BYTES - c.hdr_done);
        c.hdr_done += h;
        let total = n as u64;
        n -= h;
        c.done += n;
        let finished = c.hdr_done == TCP_HEADER_BYTES && c.done == len;
        self.multipath.on_written(s, total);
        self.stats.bytes_sent.add(n as u64);
        self.stats.paths[self.multipath.path_of(s)]
            .bytes_sent
            .add(n as u64);
        if finished {
            let done = self.tx[s].take().expect("the chunk just written");
            if let Some(data) = done.copy {
                self.multipath.on_frame_written(s, done.hdr, data);
            }
        }
        Ok(Some(n))
    }

    /// Whether a frame is partly written on stream `s` (a control frame
    /// must not be spliced into it).
    pub(super) fn tx_mid_frame(&self, s: usize) -> bool {
        self.tx[s].as_ref().is_some_and(|c| c.hdr_done > 0)
    }

    /// Writes queued control bytes on the control stream as far as the
    /// socket takes them, unless a chunk is half-written there. Returns
    /// whether any byte moved. With several paths, a control stream that
    /// fails takes its path down and the notice is dropped (notices are
    /// advice; the next one goes on a path that works).
    pub(super) fn flush_ctl(&mut self) -> Result<bool, ErrorKind> {
        let s = self.multipath.ctl_stream();
        if self.tx_ctl.is_empty() || self.tx_mid_frame(s) {
            return Ok(false);
        }
        let mut moved = false;
        while self.tx_ctl_done < self.tx_ctl.len() {
            let why = match self.streams[s].write(&self.tx_ctl[self.tx_ctl_done..]) {
                Ok(0) => self.closed(),
                Ok(n) => {
                    self.tx_ctl_done += n;
                    moved = true;
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(moved),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => self.io_err(e),
            };
            self.tx_ctl.clear();
            self.tx_ctl_done = 0;
            self.stream_failed(s, why)?;
            return Ok(moved);
        }
        self.tx_ctl.clear();
        self.tx_ctl_done = 0;
        Ok(moved)
    }

    /// Sends what is left of queued control frames (the engine calls this
    /// while it waits; a stall notice must reach the peer even when no data
    /// goes that way). Errors surface on the next data transfer.
    pub fn flush_control(&mut self) {
        let _ = self.flush_ctl();
    }

    /// Queues a stall notice on the control stream and writes what the socket takes
    /// now, never blocking: the rest goes out between chunks. A newer
    /// notice replaces one not yet started.
    pub fn post_stall(&mut self, n: &StallNotice) {
        if self.tx_ctl_done == 0 {
            self.tx_ctl.clear();
        }
        self.tx_ctl.extend_from_slice(&stall_frame(n));
        let _ = self.flush_ctl();
    }

    /// Sends an abort frame on every stream that is between frames, without
    /// blocking. A stream where a frame is half-written, or where the socket
    /// does not take the whole abort frame at once, is shut down instead: the
    /// peer then sees the end of the stream rather than waiting, and never a
    /// frame cut by another. The link is not used after this.
    pub fn send_abort(&mut self, n: &AbortNotice) {
        let frame = abort_frame(n);
        let ctl_mid = self.tx_ctl_done > 0;
        for i in 0..self.streams.len() {
            let mid = self.tx_mid_frame(i) || (i == self.multipath.ctl_stream() && ctl_mid);
            let sock = &mut self.streams[i];
            if mid || !write_all_now(sock, &frame) {
                let _ = sock.shutdown(Shutdown::Both);
            }
        }
    }
}
