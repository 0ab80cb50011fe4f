//! The receive path: reads each stream's frames as they come, places every
//! chunk of the message being received at its offset (whichever stream
//! brings it), keeps a later message's header waiting on its stream
//! ("stashed") until that message's receive starts, drops second copies of
//! chunks sent again, and acts on control frames. Reading ahead past
//! stashed headers is in `park.rs`.

use super::frame::{
    control_payload_len, decode_control, is_control, is_later, nchunks, Control, ControlIn,
    TcpHeader, CHUNK_BYTES, FLAG_RESENT, TCP_HEADER_BYTES,
};
use super::TcpLink;
use crate::error::ErrorKind;
use crate::transport::{check_data_frame, ChunkCursor, RecvJob, WireHeader};
use std::io::{self, Read};
use std::time::Instant;

/// Where one stream's incoming bytes stand.
pub(super) enum RxState {
    /// Between frames: the next header, `done` bytes of it so far.
    Header {
        buf: [u8; TCP_HEADER_BYTES],
        done: usize,
    },
    /// Inside a chunk of the message being received.
    Chunk(RxChunk),
    /// The next frame belongs to a later message; its header, read and
    /// checked for sanity, waits here until that message's receive starts
    /// (or, failover on, until it is read ahead: see `park.rs`).
    Stashed { hdr: TcpHeader, at: Instant },
    /// The peer closed the stream between frames. Not an error by itself:
    /// a peer that sent everything and closed may have left the last
    /// message on another stream.
    Closed,
}

impl RxState {
    pub fn idle() -> RxState {
        RxState::Header {
            buf: [0; TCP_HEADER_BYTES],
            done: 0,
        }
    }
}

/// A chunk being read on one stream.
pub(super) struct RxChunk {
    pub hdr: TcpHeader,
    /// The chunk's number in its message.
    pub index: usize,
    /// Its byte offset and length in the message, and bytes read so far.
    pub off: usize,
    pub len: usize,
    pub done: usize,
    pub to: ChunkDest,
}

/// Where a chunk's payload goes as it is read.
pub(super) enum ChunkDest {
    /// Straight into the receive's destination (copying receives).
    Sink,
    /// Into the stream's staging buffer, applied whole at the end
    /// (reducing receives).
    Stage,
    /// Read and dropped: a second copy, or the rest of a chunk whose
    /// message is complete.
    Discard,
    /// Into a buffer kept until that (later) message's receive starts.
    Park(Vec<u8>),
}

impl ChunkDest {
    /// Whether the bytes are the receive's own (not dropped or parked).
    fn delivers(&self) -> bool {
        matches!(self, ChunkDest::Sink | ChunkDest::Stage)
    }
}

/// What reading a stream's next header came to.
enum HeaderStep {
    /// Incomplete: the socket has no more now (`moved`: some bytes came).
    Blocked { moved: bool },
    /// The peer closed the stream between frames.
    Closed,
    /// A control frame's header; its payload is to be read next.
    Control,
    /// A data frame's header.
    Data(TcpHeader),
}

impl TcpLink {
    pub fn recv_progress(&mut self, job: &mut RecvJob) -> Result<bool, ErrorKind> {
        if !job.started {
            let n = nchunks(job.sink.len());
            job.tcp = ChunkCursor {
                msg: self.rx_msg,
                nchunks: n,
                seen: vec![0; n.div_ceil(64)],
                ..Default::default()
            };
            job.started = true;
        }
        let mut progressed = false;
        if !self.parked.frames.is_empty() {
            progressed |= self.take_parked(job)?;
        }
        for s in 0..self.streams.len() {
            if job.tcp.received == job.tcp.nchunks {
                break;
            }
            progressed |= self.recv_stream(s, job)?;
        }
        if job.tcp.received == job.tcp.nchunks {
            self.finish_recv(job);
        } else if self.rx.iter().all(|r| matches!(r, RxState::Closed)) {
            return Err(self.closed());
        } else if !self.multipath.on()
            && self
                .rx
                .iter()
                .all(|r| matches!(r, RxState::Stashed { .. } | RxState::Closed))
        {
            // Each stream is in order, and every open one's next frame
            // belongs to a later message: the rest of this one can never
            // come. (With several paths it may: sent again behind those
            // frames, which are then read ahead; see `park.rs`.)
            if self.rx.iter().any(|r| matches!(r, RxState::Closed)) {
                return Err(self.closed());
            }
            return Err(self.garbage(format!(
                "every stream went on to a later message while message {} still misses {} of \
                 its {} chunks",
                job.tcp.msg,
                job.tcp.nchunks - job.tcp.received,
                job.tcp.nchunks
            )));
        }
        Ok(progressed)
    }

    /// The receive `job` has every chunk. A copy of one of its chunks still
    /// being read on another stream (sent again, or cut off when its path
    /// failed) is read on into nothing: the destination belongs to the
    /// caller again.
    fn finish_recv(&mut self, job: &mut RecvJob) {
        job.done = true;
        self.rx_msg = self.rx_msg.wrapping_add(1);
        self.stats.msgs_recv.add(1);
        for r in &mut self.rx {
            if let RxState::Chunk(c) = r {
                if c.hdr.msg == job.tcp.msg && c.to.delivers() {
                    c.to = ChunkDest::Discard;
                }
            }
        }
    }

    /// Stream `s` broke while receiving (an error, or its end inside a
    /// frame). With several paths that is its path failing: the peer sends
    /// what it carried again on the others, and the path is not written to
    /// either. Otherwise (or when no path is left) the error is the link's.
    fn lose_stream(&mut self, s: usize, why: ErrorKind) -> Result<(), ErrorKind> {
        if !self.multipath.on() {
            return Err(why);
        }
        self.unpark_lost(s);
        self.rx[s] = RxState::Closed;
        self.rx_ctl[s] = None;
        if self.rx.iter().all(|r| matches!(r, RxState::Closed)) {
            return Err(why);
        }
        self.stream_failed(s, why)
    }

    /// Moves what stream `s` has for the receive `job`.
    fn recv_stream(&mut self, s: usize, job: &mut RecvJob) -> Result<bool, ErrorKind> {
        let mut progressed = false;
        loop {
            if self.rx_ctl[s].is_some() {
                let Some(ctl) = self.read_ctl(s)? else {
                    return Ok(progressed);
                };
                progressed = true;
                self.note_control(ctl, job.meta.sig)?;
                continue;
            }
            match &mut self.rx[s] {
                RxState::Stashed { hdr, at } => {
                    if hdr.msg != job.tcp.msg {
                        let (h, at) = (*hdr, *at);
                        if self.should_park(job.tcp.msg, at) {
                            self.park(s, h, job.tcp.msg)?;
                            continue;
                        }
                        return Ok(progressed);
                    }
                    let h = *hdr;
                    let c = self.begin_chunk(&h, job)?;
                    self.rx[s] = RxState::Chunk(c);
                }
                RxState::Closed => return Ok(progressed),
                RxState::Header { .. } => {
                    let h = match self.read_header(s)? {
                        HeaderStep::Blocked { moved } => return Ok(progressed || moved),
                        HeaderStep::Closed => return Ok(true),
                        HeaderStep::Control => {
                            progressed = true;
                            continue;
                        }
                        HeaderStep::Data(h) => h,
                    };
                    progressed = true;
                    if h.msg == job.tcp.msg {
                        let c = self.begin_chunk(&h, job)?;
                        self.rx[s] = RxState::Chunk(c);
                    } else if self.set_aside(s, h, job.tcp.msg)? {
                        return Ok(progressed);
                    }
                }
                RxState::Chunk(c) => {
                    if c.to.delivers() && c.hdr.msg != job.tcp.msg {
                        // A message's chunks are only ever read into its own
                        // receive (see `finish_recv`).
                        c.to = ChunkDest::Discard;
                    }
                    if c.done == c.len {
                        let RxState::Chunk(c) = std::mem::replace(&mut self.rx[s], RxState::idle())
                        else {
                            unreachable!("matched a chunk");
                        };
                        self.chunk_read(s, c, job);
                        if job.tcp.received == job.tcp.nchunks {
                            return Ok(progressed);
                        }
                        continue;
                    }
                    let remaining = c.len - c.done;
                    let stream = &mut self.streams[s];
                    let stage = &mut self.staging[s];
                    if stage.len() < CHUNK_BYTES {
                        stage.resize(CHUNK_BYTES, 0);
                    }
                    let res = match &mut c.to {
                        ChunkDest::Sink => {
                            let dst = job
                                .sink
                                .direct(c.off + c.done, remaining)
                                .expect("copying receives read in place");
                            stream.read(dst)
                        }
                        ChunkDest::Stage => stream.read(&mut stage[c.done..c.len]),
                        ChunkDest::Discard => stream.read(&mut stage[..remaining.min(CHUNK_BYTES)]),
                        ChunkDest::Park(buf) => stream.read(&mut buf[c.done..]),
                    };
                    match res {
                        Ok(0) => {
                            let why = ErrorKind::PeerClosed {
                                peer: self.peer,
                                detail: "end of stream inside a frame".into(),
                            };
                            self.lose_stream(s, why)?;
                            return Ok(true);
                        }
                        Ok(n) => {
                            progressed = true;
                            c.done += n;
                            if c.to.delivers() {
                                job.got += n;
                            }
                            self.stats.bytes_recv.add(n as u64);
                            self.stats.paths[self.multipath.path_of(s)]
                                .bytes_recv
                                .add(n as u64);
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(progressed),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => {
                            let why = self.io_err(e);
                            self.lose_stream(s, why)?;
                            return Ok(true);
                        }
                    }
                }
            }
        }
    }

    /// A chunk's last byte has been read on stream `s`: applies it, unless
    /// a copy of it came first.
    fn chunk_read(&mut self, s: usize, c: RxChunk, job: &mut RecvJob) {
        let bit = 1u64 << (c.index % 64);
        let fresh = c.hdr.msg == job.tcp.msg && job.tcp.seen[c.index / 64] & bit == 0;
        match c.to {
            ChunkDest::Sink | ChunkDest::Stage if fresh => {
                if matches!(c.to, ChunkDest::Stage) {
                    job.sink.deliver(c.off, &self.staging[s][..c.len]);
                }
                job.tcp.seen[c.index / 64] |= bit;
                job.tcp.received += 1;
            }
            ChunkDest::Park(data) => self.parked.frames.push((c.hdr, data)),
            _ => {}
        }
    }

    /// Reads stream `s`'s next frame header (the stream is between frames)
    /// as far as the socket has it. A control frame's header sets the
    /// stream up to read its payload; the end of the stream here marks it
    /// closed; the end inside a header, or an error, is the stream lost
    /// (see [`TcpLink::lose_stream`]).
    fn read_header(&mut self, s: usize) -> Result<HeaderStep, ErrorKind> {
        let mut moved = false;
        loop {
            let RxState::Header { buf, done } = &mut self.rx[s] else {
                unreachable!("read_header on a stream inside a frame");
            };
            let lost = match self.streams[s].read(&mut buf[*done..]) {
                Ok(0) if *done == 0 => {
                    self.rx[s] = RxState::Closed;
                    return Ok(HeaderStep::Closed);
                }
                Ok(0) => ErrorKind::PeerClosed {
                    peer: self.peer,
                    detail: "end of stream inside a frame header".into(),
                },
                Ok(n) => {
                    moved = true;
                    *done += n;
                    if *done < TCP_HEADER_BYTES {
                        continue;
                    }
                    let h: TcpHeader = bytemuck::pod_read_unaligned(&buf[..]);
                    self.rx[s] = RxState::idle();
                    if self.take_control(s, &h.base)? {
                        return Ok(HeaderStep::Control);
                    }
                    if h.flags & FLAG_RESENT != 0 {
                        self.rx_resent = true;
                    }
                    return Ok(HeaderStep::Data(h));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Ok(HeaderStep::Blocked { moved })
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => self.io_err(e),
            };
            self.lose_stream(s, lost)?;
            return Ok(HeaderStep::Closed);
        }
    }

    /// If `h` leads a control frame, sets stream `s` up to read its payload
    /// and returns `true`.
    fn take_control(&mut self, s: usize, h: &WireHeader) -> Result<bool, ErrorKind> {
        if !is_control(h) {
            return Ok(false);
        }
        let len = control_payload_len(h, self.peer)?;
        self.rx_ctl[s] = Some(ControlIn {
            hdr: *h,
            payload: Vec::with_capacity(len),
        });
        Ok(true)
    }

    /// Acts on a complete control frame: notes a stall notice, fails on an
    /// abort (`my_sig`: the signature of the call that receives it).
    fn note_control(&mut self, ctl: ControlIn, my_sig: u64) -> Result<(), ErrorKind> {
        match decode_control(ctl) {
            Control::Abort(notice) => Err(notice.into_error(my_sig)),
            Control::Stall(stall) => {
                self.stall = Some(stall);
                Ok(())
            }
        }
    }

    /// A data frame on stream `s` that is not of the message `current`
    /// being received. A later message's header waits there until its
    /// receive starts (returns `true`). An earlier message's frame is a
    /// copy sent again after a path failed, read and dropped, once the peer
    /// is known to have sent copies again; otherwise, like bytes that are
    /// not a frame, it is garbage.
    fn set_aside(&mut self, s: usize, h: TcpHeader, current: u32) -> Result<bool, ErrorKind> {
        check_data_frame(&h.base, self.peer)?;
        if is_later(h.msg, current) {
            self.rx[s] = RxState::Stashed {
                hdr: h,
                at: Instant::now(),
            };
            return Ok(true);
        }
        if self.rx_resent && h.base.len <= CHUNK_BYTES as u64 {
            self.rx[s] = RxState::Chunk(RxChunk {
                hdr: h,
                index: 0,
                off: 0,
                len: h.base.len as usize,
                done: 0,
                to: ChunkDest::Discard,
            });
            return Ok(false);
        }
        Err(self.garbage(format!(
            "a frame of message {} arrived while message {current} is received",
            h.msg
        )))
    }

    /// Checks the header of a chunk of the message `job` receives and
    /// returns its cursor. A chunk already received is dropped when it may
    /// be a copy sent again, and is garbage otherwise.
    pub(super) fn begin_chunk(&self, h: &TcpHeader, job: &RecvJob) -> Result<RxChunk, ErrorKind> {
        let total = job.sink.len();
        let off = h.off;
        let in_range = off.is_multiple_of(CHUNK_BYTES as u64)
            && (off < total as u64 || (total == 0 && off == 0));
        if !in_range {
            // Arguments that differ are reported as such; otherwise the
            // offset is garbage.
            job.meta.check(&h.base, self.peer, h.base.len as usize)?;
            return Err(self.garbage(format!(
                "chunk at byte offset {off} of a {total}-byte message"
            )));
        }
        let off = off as usize;
        let len = CHUNK_BYTES.min(total - off);
        job.meta.check(&h.base, self.peer, len)?;
        let index = off / CHUNK_BYTES;
        let to = if job.tcp.seen[index / 64] & (1 << (index % 64)) != 0 {
            if !self.rx_resent {
                return Err(self.garbage(format!(
                    "chunk at byte offset {off} of message {} arrived twice",
                    h.msg
                )));
            }
            ChunkDest::Discard
        } else if job.sink.copies() {
            ChunkDest::Sink
        } else {
            ChunkDest::Stage
        };
        Ok(RxChunk {
            hdr: *h,
            index,
            off,
            len,
            done: 0,
            to,
        })
    }

    /// The header of the next message from this peer, without taking it:
    /// headers that have arrived are read and kept for the receive that
    /// will take them (control frames ahead of them are consumed as a
    /// receive would). `None` while none has arrived. Only valid between
    /// receives.
    pub fn peek_header(&mut self) -> Result<Option<WireHeader>, ErrorKind> {
        if let Some((h, _)) = self
            .parked
            .frames
            .iter()
            .find(|(h, _)| h.msg == self.rx_msg)
        {
            return Ok(Some(h.base));
        }
        for s in 0..self.streams.len() {
            loop {
                if self.rx_ctl[s].is_some() {
                    let Some(ctl) = self.read_ctl(s)? else {
                        break;
                    };
                    self.note_control(ctl, 0)?;
                    continue;
                }
                if !matches!(self.rx[s], RxState::Header { .. }) {
                    break;
                }
                let h = match self.read_header(s)? {
                    HeaderStep::Blocked { .. } | HeaderStep::Closed => break,
                    HeaderStep::Control => continue,
                    HeaderStep::Data(h) => h,
                };
                if h.msg == self.rx_msg {
                    check_data_frame(&h.base, self.peer)?;
                    self.rx[s] = RxState::Stashed {
                        hdr: h,
                        at: Instant::now(),
                    };
                } else {
                    self.set_aside(s, h, self.rx_msg)?;
                }
                break;
            }
        }
        let next = self.rx.iter().find_map(|r| match r {
            RxState::Stashed { hdr, .. } if hdr.msg == self.rx_msg => Some(hdr.base),
            _ => None,
        });
        if next.is_none() && self.rx.iter().all(|r| matches!(r, RxState::Closed)) {
            return Err(self.closed());
        }
        Ok(next)
    }

    /// Reads the payload of the control frame pending on stream `s`, as far
    /// as the socket has it; `None` until it is complete.
    fn read_ctl(&mut self, s: usize) -> Result<Option<ControlIn>, ErrorKind> {
        let peer = self.peer;
        let (Some(c), stream) = (self.rx_ctl[s].as_mut(), &mut self.streams[s]) else {
            return Ok(None);
        };
        let want = c.hdr.len as usize;
        let mut buf = [0u8; 512];
        while c.payload.len() < want {
            let k = (want - c.payload.len()).min(buf.len());
            let lost = match stream.read(&mut buf[..k]) {
                Ok(0) => ErrorKind::PeerClosed {
                    peer,
                    detail: "end of stream inside a control frame".into(),
                },
                Ok(n) => {
                    c.payload.extend_from_slice(&buf[..n]);
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => super::socket::io_error(peer, e),
            };
            self.lose_stream(s, lost)?;
            return Ok(None);
        }
        Ok(self.rx_ctl[s].take())
    }
}
