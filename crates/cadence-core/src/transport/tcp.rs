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
    AbortNotice, LinkStats, RecvJob, SendJob, StallNotice, StripeCursor, WireHeader, FRAME_ABORT,
    FRAME_STALL, HEADER_BYTES, MAGIC, STALL_CHAIN_MAX,
};
use crate::error::ErrorKind;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

/// Messages smaller than this use one stream.
pub const STRIPE_MIN: usize = 256 * 1024;
/// Receive staging for reducing receives (bytes per stream).
const STAGING: usize = 256 * 1024;
const ABORT_MSG_MAX: u64 = 4096;

/// All streams to one peer.
pub struct TcpLink {
    pub peer: usize,
    streams: Vec<TcpStream>,
    rx_hdr: Vec<[u8; HEADER_BYTES]>,
    staging: Vec<Vec<u8>>,
    /// Whether a frame is partly written on a stream (an abort frame must not
    /// be spliced into it).
    tx_mid_frame: Vec<bool>,
    /// The last stall notice the peer sent.
    pub stall: Option<StallNotice>,
    pub stats: LinkStats,
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
            stall: None,
            stats: LinkStats {
                peer,
                transport: "tcp",
                ..Default::default()
            },
        })
    }

    fn io_err(&self, e: io::Error) -> ErrorKind {
        match e.kind() {
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionAborted => ErrorKind::PeerClosed {
                peer: self.peer,
                detail: e.to_string(),
            },
            _ => ErrorKind::Io {
                peer: self.peer,
                detail: e.to_string(),
            },
        }
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
                        self.stats.bytes_sent += n as u64;
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
            self.stats.msgs_sent += 1;
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
                if st.hdr_done < HEADER_BYTES {
                    let res = self.streams[s].read(&mut self.rx_hdr[s][st.hdr_done..]);
                    match res {
                        Ok(0) => return Err(self.closed()),
                        Ok(n) => {
                            progressed = true;
                            st.hdr_done += n;
                            if st.hdr_done == HEADER_BYTES {
                                let h: WireHeader = bytemuck::pod_read_unaligned(&self.rx_hdr[s]);
                                if h.magic == MAGIC && h.frame == FRAME_ABORT {
                                    return Err(self.read_abort(s, &h).into_error(job.meta.sig));
                                }
                                if h.magic == MAGIC && h.frame == FRAME_STALL {
                                    // Out-of-band: remember it, then read the
                                    // next header.
                                    let chain = self.read_small(s, h.len.min(64) as usize);
                                    self.stall = Some(StallNotice {
                                        seq: h.seq,
                                        chain: chain
                                            .chunks_exact(4)
                                            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                                            .collect(),
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
                        self.stats.bytes_recv += n as u64;
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
            self.stats.msgs_recv += 1;
        }
        Ok(progressed)
    }

    /// Reads an abort frame's text (small; bounded wait). The header carries
    /// the blamed rank in `root` and, for mismatches (`redop == 1`), the
    /// blamed signature in `seq`, the detector's in `sig` and the detector's
    /// rank in `count`.
    fn read_abort(&mut self, s: usize, h: &WireHeader) -> AbortNotice {
        let msg = self.read_small(s, h.len.min(ABORT_MSG_MAX) as usize);
        AbortNotice {
            origin: h.root as usize,
            detail: String::from_utf8_lossy(&msg).into_owned(),
            mismatch: (h.redop == 1).then_some((h.seq, h.count as usize, h.sig)),
        }
    }

    /// Reads a short control payload that follows a header (bounded wait).
    fn read_small(&mut self, s: usize, len: usize) -> Vec<u8> {
        let mut msg = vec![0u8; len];
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut got = 0;
        while got < len && Instant::now() < deadline {
            match self.streams[s].read(&mut msg[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(_) => break,
            }
        }
        msg.truncate(got);
        msg
    }

    /// Sends a stall notice on stream 0 unless a frame is half-written there.
    pub fn post_stall(&mut self, n: &StallNotice) {
        if self.tx_mid_frame[0] {
            return;
        }
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
        let sock = &mut self.streams[0];
        let _ = sock.set_nonblocking(false);
        let _ = sock.set_write_timeout(Some(Duration::from_millis(200)));
        let _ = sock.write_all(bytemuck::bytes_of(&hdr));
        let _ = sock.write_all(&payload);
        let _ = sock.set_nonblocking(true);
    }

    /// Sends an abort frame on every stream that is between frames; shuts the
    /// others down so the peer sees the end of stream instead of waiting.
    pub fn send_abort(&mut self, n: &AbortNotice) {
        let text = &n.detail.as_bytes()[..n.detail.len().min(ABORT_MSG_MAX as usize)];
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
        for (i, sock) in self.streams.iter_mut().enumerate() {
            if self.tx_mid_frame[i] {
                let _ = sock.shutdown(Shutdown::Both);
                continue;
            }
            let _ = sock.set_nonblocking(false);
            let _ = sock.set_write_timeout(Some(Duration::from_millis(500)));
            let _ = sock.write_all(bytemuck::bytes_of(&hdr));
            let _ = sock.write_all(text);
            let _ = sock.set_nonblocking(true);
        }
    }

    /// File descriptors to wait on.
    pub fn fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        self.streams.iter().map(|s| s.as_raw_fd())
    }

    /// Test hook: writes bytes that are not a frame on stream 0.
    pub fn inject_garbage(&mut self) -> io::Result<()> {
        let _ = self.streams[0].set_nonblocking(false);
        let r = self.streams[0].write_all(&[0xAB; 256]);
        let _ = self.streams[0].set_nonblocking(true);
        r
    }
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
