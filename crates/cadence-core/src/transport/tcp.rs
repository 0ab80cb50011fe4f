//! TCP transport between ranks on different hosts.
//!
//! Terms:
//! - **stream**: one TCP connection to a peer. A link has `nstreams` of them
//!   (`CADENCE_NSTREAMS`), so one flow's congestion window or one core's
//!   softirq work does not cap a large transfer.
//! - **stripe**: the part of a message one stream carries. Messages below
//!   [`STRIPE_MIN`] travel whole on stream 0 (latency); larger ones are cut into
//!   `nstreams` element-aligned stripes. Both sides compute the same plan, so
//!   each stream stays FIFO without sequence numbers.
//! - **frame**: a stripe on the wire: a [`WireHeader`], then `len` bytes.
//!
//! Sockets are non-blocking; the engine calls `*_progress` and, when nothing
//! moves, waits in `poll(2)` on the streams it needs. Streams are set up (and
//! authenticated) in `tcp_setup.rs`.

use super::{
    AbortNotice, LinkCounters, RecvJob, SendJob, StallNotice, StripeCursor, WireHeader,
    ABORT_TEXT_MAX, FRAME_ABORT, FRAME_STALL, HEADER_BYTES, MAGIC, STALL_CHAIN_MAX,
};
use crate::error::ErrorKind;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

/// Messages smaller than this use one stream.
pub const STRIPE_MIN: usize = 256 * 1024;
/// Receive staging for reducing receives (bytes per stream).
const STAGING: usize = 256 * 1024;
/// Longest payload of a stall notice: its chain of u32 ranks.
const STALL_PAYLOAD_MAX: usize = STALL_CHAIN_MAX * 4;

/// All streams to one peer.
pub struct TcpLink {
    pub peer: usize,
    streams: Vec<TcpStream>,
    rx_hdr: Vec<[u8; HEADER_BYTES]>,
    staging: Vec<Vec<u8>>,
    /// Whether a data frame is partly written on a stream (a control frame
    /// must not be spliced into it).
    tx_mid_frame: Vec<bool>,
    /// Control frames (stall notices) waiting to go on stream 0, whole
    /// frames only, and how many of their bytes are written. A data frame
    /// starts on stream 0 only once this is empty, and a control frame only
    /// between data frames, so neither is ever spliced into the other.
    tx_ctl: Vec<u8>,
    tx_ctl_done: usize,
    /// Per stream: a control frame whose header has arrived and whose
    /// payload is being read (non-blocking, like everything else).
    rx_ctl: Vec<Option<CtlIn>>,
    /// The last stall notice the peer sent.
    pub stall: Option<StallNotice>,
    pub stats: Arc<LinkCounters>,
}

/// A control frame being received: its header and the payload so far.
struct CtlIn {
    hdr: WireHeader,
    payload: Vec<u8>,
}

/// What a finished control frame means for the receive in progress.
enum Ctl {
    /// Noted (a stall notice); go on reading frames.
    Noted,
    /// The peer failed.
    Abort(AbortNotice),
}

/// Checks a control frame's header before its payload is read: the length
/// must be what that kind of frame can carry, or the stream is garbage.
fn control_payload_len(h: &WireHeader, peer: usize) -> Result<usize, ErrorKind> {
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

/// Interprets a complete control frame.
fn decode_control(c: CtlIn) -> (Ctl, Option<StallNotice>) {
    let h = c.hdr;
    match h.frame {
        FRAME_ABORT => (
            // The header carries the blamed rank in `root` and, for
            // mismatches (`redop == 1`), the blamed signature in `seq`, the
            // detector's in `sig` and the detector's rank in `count`.
            Ctl::Abort(AbortNotice {
                origin: h.root as usize,
                detail: String::from_utf8_lossy(&c.payload).into_owned(),
                mismatch: (h.redop == 1).then_some((h.seq, h.count as usize, h.sig)),
            }),
            None,
        ),
        _ => {
            let chain = c
                .payload
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (Ctl::Noted, Some(StallNotice { seq: h.seq, chain }))
        }
    }
}

fn plan(total: usize, elem: usize, nstreams: usize) -> Vec<StripeCursor> {
    if total < STRIPE_MIN || nstreams <= 1 {
        return vec![StripeCursor {
            stream: 0,
            off: 0,
            len: total,
            ..Default::default()
        }];
    }
    let elems = total / elem;
    (0..nstreams)
        .map(|i| {
            let a = i * elems / nstreams * elem;
            let b = if i + 1 == nstreams {
                total
            } else {
                (i + 1) * elems / nstreams * elem
            };
            StripeCursor {
                stream: i,
                off: a,
                len: b - a,
                ..Default::default()
            }
        })
        .collect()
}

impl TcpLink {
    pub fn new(peer: usize, streams: Vec<TcpStream>) -> io::Result<TcpLink> {
        for s in &streams {
            s.set_nonblocking(true)?;
        }
        let n = streams.len();
        Ok(TcpLink {
            peer,
            streams,
            rx_hdr: vec![[0u8; HEADER_BYTES]; n],
            staging: vec![Vec::new(); n],
            tx_mid_frame: vec![false; n],
            tx_ctl: Vec::new(),
            tx_ctl_done: 0,
            rx_ctl: (0..n).map(|_| None).collect(),
            stall: None,
            stats: LinkCounters::new(peer, "tcp"),
        })
    }

    fn io_err(&self, e: io::Error) -> ErrorKind {
        io_error(self.peer, e)
    }

    fn closed(&self) -> ErrorKind {
        ErrorKind::PeerClosed {
            peer: self.peer,
            detail: "end of stream".into(),
        }
    }

    pub fn send_progress(&mut self, job: &mut SendJob) -> Result<bool, ErrorKind> {
        if !job.started {
            job.stripes = plan(job.src.len(), job.meta.dtype.size(), self.streams.len());
            job.started = true;
        }
        let mut progressed = false;
        let mut all_done = true;
        for st in job.stripes.iter_mut() {
            if st.stream == 0 && st.hdr_done == 0 && !self.tx_ctl.is_empty() {
                // A control frame goes first; this frame starts after it.
                progressed |= self.flush_ctl()?;
                if !self.tx_ctl.is_empty() {
                    all_done = false;
                    continue;
                }
            }
            loop {
                let hdr = job.meta.header(st.len);
                let hdr_bytes = bytemuck::bytes_of(&hdr);
                let payload = job.src.bytes(st.off + st.done, st.len - st.done);
                if st.hdr_done == HEADER_BYTES && payload.is_empty() {
                    break;
                }
                let sock = &mut self.streams[st.stream];
                let res = if st.hdr_done < HEADER_BYTES {
                    sock.write_vectored(&[
                        IoSlice::new(&hdr_bytes[st.hdr_done..]),
                        IoSlice::new(payload),
                    ])
                } else {
                    sock.write(payload)
                };
                match res {
                    Ok(0) => return Err(self.closed()),
                    Ok(mut n) => {
                        progressed = true;
                        self.tx_mid_frame[st.stream] = true;
                        let h = n.min(HEADER_BYTES - st.hdr_done);
                        st.hdr_done += h;
                        n -= h;
                        st.done += n;
                        self.stats.bytes_sent.add(n as u64);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(self.io_err(e)),
                }
            }
            if st.hdr_done == HEADER_BYTES && st.done == st.len {
                self.tx_mid_frame[st.stream] = false;
            } else {
                all_done = false;
            }
        }
        if all_done {
            job.done = true;
            self.stats.msgs_sent.add(1);
        }
        Ok(progressed)
    }

    pub fn recv_progress(&mut self, job: &mut RecvJob) -> Result<bool, ErrorKind> {
        if !job.started {
            job.stripes = plan(job.sink.len(), job.meta.dtype.size(), self.streams.len());
            job.started = true;
        }
        let elem = job.sink.elem_size();
        let mut progressed = false;
        let mut all_done = true;
        for st in job.stripes.iter_mut() {
            let s = st.stream;
            loop {
                if self.rx_ctl[s].is_some() {
                    let Some(ctl) = self.read_ctl(s)? else {
                        break;
                    };
                    progressed = true;
                    match decode_control(ctl) {
                        (Ctl::Abort(notice), _) => return Err(notice.into_error(job.meta.sig)),
                        (Ctl::Noted, Some(stall)) => self.stall = Some(stall),
                        (Ctl::Noted, None) => {}
                    }
                    continue;
                }
                if st.hdr_done < HEADER_BYTES {
                    let res = self.streams[s].read(&mut self.rx_hdr[s][st.hdr_done..]);
                    match res {
                        Ok(0) => return Err(self.closed()),
                        Ok(n) => {
                            progressed = true;
                            st.hdr_done += n;
                            if st.hdr_done == HEADER_BYTES {
                                let h: WireHeader = bytemuck::pod_read_unaligned(&self.rx_hdr[s]);
                                if h.magic == MAGIC && matches!(h.frame, FRAME_ABORT | FRAME_STALL)
                                {
                                    // Out of band: read its payload, then the
                                    // next header.
                                    let len = control_payload_len(&h, self.peer)?;
                                    self.rx_ctl[s] = Some(CtlIn {
                                        hdr: h,
                                        payload: Vec::with_capacity(len),
                                    });
                                    st.hdr_done = 0;
                                    continue;
                                }
                                job.meta.check(&h, self.peer, st.len)?;
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(self.io_err(e)),
                    }
                    continue;
                }
                if st.done == st.len {
                    break;
                }
                let remaining = st.len - st.done;
                let res = if let Some(dst) = job.sink.direct(st.off + st.done, remaining) {
                    // Copying receive: straight from the socket into the destination.
                    self.streams[s].read(dst).inspect(|&n| st.done += n)
                } else {
                    // Reducing receive: stage, then reduce whole elements.
                    let stage = &mut self.staging[s];
                    if stage.len() < STAGING {
                        stage.resize(STAGING, 0);
                    }
                    let want = (STAGING - st.carry).min(remaining - st.carry);
                    self.streams[s]
                        .read(&mut stage[st.carry..st.carry + want])
                        .inspect(|&n| {
                            let avail = st.carry + n;
                            let whole = avail - avail % elem;
                            job.sink.deliver(st.off + st.done, &stage[..whole]);
                            st.done += whole;
                            stage.copy_within(whole..avail, 0);
                            st.carry = avail - whole;
                        })
                };
                match res {
                    Ok(0) => return Err(self.closed()),
                    Ok(n) => {
                        progressed = true;
                        self.stats.bytes_recv.add(n as u64);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(self.io_err(e)),
                }
            }
            if !(st.hdr_done == HEADER_BYTES && st.done == st.len) {
                all_done = false;
            }
        }
        if all_done {
            job.done = true;
            self.stats.msgs_recv.add(1);
        }
        Ok(progressed)
    }

    /// The header of the next data frame on stream 0 (where every message's
    /// first stripe travels), read with MSG_PEEK so it stays in the socket.
    /// Control frames ahead of it are consumed as a receive would.
    pub fn peek_header(&mut self) -> Result<Option<WireHeader>, ErrorKind> {
        loop {
            if self.rx_ctl[0].is_some() {
                let Some(ctl) = self.read_ctl(0)? else {
                    return Ok(None);
                };
                match decode_control(ctl) {
                    (Ctl::Abort(notice), _) => return Err(notice.into_error(0)),
                    (Ctl::Noted, Some(stall)) => self.stall = Some(stall),
                    (Ctl::Noted, None) => {}
                }
                continue;
            }
            let mut buf = [0u8; HEADER_BYTES];
            let n = match self.streams[0].peek(&mut buf) {
                Ok(0) => return Err(self.closed()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.io_err(e)),
            };
            if n < HEADER_BYTES {
                return Ok(None);
            }
            let h: WireHeader = bytemuck::pod_read_unaligned(&buf);
            if h.magic != MAGIC || !matches!(h.frame, FRAME_ABORT | FRAME_STALL) {
                return Ok(Some(h));
            }
            // A control frame: take its header for real (it is all there),
            // then its payload.
            let len = control_payload_len(&h, self.peer)?;
            self.streams[0]
                .read_exact(&mut buf)
                .map_err(|e| self.io_err(e))?;
            self.rx_ctl[0] = Some(CtlIn {
                hdr: h,
                payload: Vec::with_capacity(len),
            });
        }
    }

    /// Reads the payload of the control frame pending on stream `s`, as far
    /// as the socket has it; `None` until it is complete.
    fn read_ctl(&mut self, s: usize) -> Result<Option<CtlIn>, ErrorKind> {
        let peer = self.peer;
        let (Some(c), stream) = (self.rx_ctl[s].as_mut(), &mut self.streams[s]) else {
            return Ok(None);
        };
        let want = c.hdr.len as usize;
        let mut buf = [0u8; 512];
        while c.payload.len() < want {
            let k = (want - c.payload.len()).min(buf.len());
            match stream.read(&mut buf[..k]) {
                Ok(0) => {
                    return Err(ErrorKind::PeerClosed {
                        peer,
                        detail: "end of stream inside a control frame".into(),
                    })
                }
                Ok(n) => c.payload.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_error(peer, e)),
            }
        }
        Ok(self.rx_ctl[s].take())
    }

    /// Writes queued control bytes on stream 0 as far as the socket takes
    /// them, unless a data frame is half-written there. Returns whether any
    /// byte moved.
    fn flush_ctl(&mut self) -> Result<bool, ErrorKind> {
        if self.tx_ctl.is_empty() || self.tx_mid_frame[0] {
            return Ok(false);
        }
        let mut moved = false;
        while self.tx_ctl_done < self.tx_ctl.len() {
            match self.streams[0].write(&self.tx_ctl[self.tx_ctl_done..]) {
                Ok(0) => return Err(self.closed()),
                Ok(n) => {
                    self.tx_ctl_done += n;
                    moved = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(moved),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.io_err(e)),
            }
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

    /// Queues a stall notice on stream 0 and writes what the socket takes
    /// now, never blocking: the rest goes out between data frames. A newer
    /// notice replaces one not yet started.
    pub fn post_stall(&mut self, n: &StallNotice) {
        let payload: Vec<u8> = n
            .chain
            .iter()
            .take(STALL_CHAIN_MAX)
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let hdr = WireHeader {
            magic: MAGIC,
            frame: FRAME_STALL,
            seq: n.seq,
            len: payload.len() as u64,
            ..Default::default()
        };
        if self.tx_ctl_done == 0 {
            self.tx_ctl.clear();
        }
        self.tx_ctl.extend_from_slice(bytemuck::bytes_of(&hdr));
        self.tx_ctl.extend_from_slice(&payload);
        let _ = self.flush_ctl();
    }

    /// Sends an abort frame on every stream that is between frames, without
    /// blocking. A stream where a frame is half-written, or where the socket
    /// does not take the whole abort frame at once, is shut down instead: the
    /// peer then sees the end of the stream rather than waiting, and never a
    /// frame cut by another. The link is not used after this.
    pub fn send_abort(&mut self, n: &AbortNotice) {
        let text = n.wire_text();
        let (flag, blamed_sig, detector, detector_sig) = match n.mismatch {
            Some((b, d, ds)) => (1, b, d as u64, ds),
            None => (0, 0, 0, 0),
        };
        let hdr = WireHeader {
            magic: MAGIC,
            frame: FRAME_ABORT,
            redop: flag,
            root: n.origin as u32,
            seq: blamed_sig,
            sig: detector_sig,
            count: detector,
            len: text.len() as u64,
            ..Default::default()
        };
        let mut frame = bytemuck::bytes_of(&hdr).to_vec();
        frame.extend_from_slice(text.as_bytes());
        let ctl_mid = self.tx_ctl_done > 0;
        for (i, sock) in self.streams.iter_mut().enumerate() {
            let mid = self.tx_mid_frame[i] || (i == 0 && ctl_mid);
            if mid || !write_all_now(sock, &frame) {
                let _ = sock.shutdown(Shutdown::Both);
            }
        }
    }

    /// File descriptors to wait on.
    pub fn fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        self.streams.iter().map(|s| s.as_raw_fd())
    }

    /// The streams a transfer with these stripes still waits on (all of
    /// them before it starts). A stream whose stripe is finished must not
    /// be polled: it is writable (or holds the next message) at once, and
    /// poll(2) would return at once until the slowest stripe ends — a spin
    /// that takes cores from the kernel's network work.
    pub fn waiting_fds<'a>(
        &'a self,
        stripes: &'a [StripeCursor],
    ) -> impl Iterator<Item = RawFd> + 'a {
        let all = stripes.is_empty();
        self.streams.iter().enumerate().filter_map(move |(i, s)| {
            let waits = all
                || stripes.iter().any(|st| {
                    st.stream == i && !(st.hdr_done == HEADER_BYTES && st.done == st.len)
                });
            waits.then(|| s.as_raw_fd())
        })
    }

    /// Test hook: writes bytes that are not a frame on stream 0.
    pub fn inject_garbage(&mut self) -> io::Result<()> {
        let _ = self.streams[0].set_nonblocking(false);
        let r = self.streams[0].write_all(&[0xAB; 256]);
        let _ = self.streams[0].set_nonblocking(true);
        r
    }
}

/// The error an I/O failure on a link to `peer` means.
fn io_error(peer: usize, e: io::Error) -> ErrorKind {
    match e.kind() {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionAborted => ErrorKind::PeerClosed {
            peer,
            detail: e.to_string(),
        },
        _ => ErrorKind::Io {
            peer,
            detail: e.to_string(),
        },
    }
}

/// Writes `bytes` whole if the socket takes them without blocking; `false`
/// when it took only part (or failed).
fn write_all_now(sock: &mut TcpStream, bytes: &[u8]) -> bool {
    let mut done = 0;
    while done < bytes.len() {
        match sock.write(&bytes[done..]) {
            Ok(0) => return false,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
    true
}

/// Waits until one of `fds` is ready for `events` or `timeout` passes.
pub fn poll_fds(fds: &mut [libc::pollfd], timeout: Duration) {
    if fds.is_empty() {
        std::thread::sleep(timeout);
        return;
    }
    let ms = timeout.as_millis().clamp(0, i32::MAX as u128) as i32;
    // SAFETY: `fds` is a valid, exclusively borrowed slice of pollfd structs and
    // its length is passed alongside; poll only writes their `revents` fields.
    unsafe {
        libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms);
    }
}
