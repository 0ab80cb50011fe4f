//! The decisions of a link with several streams and paths, as a state
//! machine that does no I/O: which stream the next chunk goes to, how fast
//! each stream delivers, when a path has failed and which chunks then go
//! again elsewhere, and when a failed path is taken back.
//!
//! It is fed observations: bytes the sender's sockets took
//! ([`Multipath::on_written`]), readings of their queues (`TIOCOUTQ`,
//! [`Multipath::on_queue`]), the peer's acknowledgement state (`TCP_INFO`,
//! [`PeerAcks`]), errors ([`Multipath::stream_failed`]), and the time as an
//! argument; it never reads a socket or the clock. What it decides shows in
//! its answers and in [`PathEvent`]s, which the link turns into log lines
//! and counters. `multipath_io.rs` is the layer that feeds it.
//!
//! Terms: a **path** is a pair of NICs; each of the link's streams runs on
//! one. Where the cluster's path planner places streams on spines, each
//! stream is a path of its own: a (NIC pair, spine), which the planner can
//! **hold** down while an uplink of it is cut ([`Multipath::hold`]). **Failover** (only with several paths) keeps a copy of every chunk
//! until the peer's kernel acknowledges it, so that a path that goes down
//! loses nothing: its unacknowledged chunks go again on the others.

use super::frame::{TcpHeader, FLAG_RESENT, TCP_HEADER_BYTES};
use super::rate::TxRate;
use super::send::TxChunk;
use crate::error::ErrorKind;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Default for `CADENCE_PATH_TIMEOUT`.
pub const PATH_TIMEOUT: Duration = Duration::from_secs(2);
/// How often paths are checked for failure and recovery (at most).
const PATH_CHECK: Duration = Duration::from_millis(1);
/// Chunk buffers kept for reuse when acknowledged copies are released.
const SPARE_MAX: usize = 64;

/// A chunk's frame, with the link's own copy of the payload: kept until
/// the peer's kernel acknowledges it, or queued to go again.
pub(super) struct ChunkCopy {
    /// Stream position just past the frame (unacknowledged copies only).
    pub end: u64,
    pub hdr: TcpHeader,
    pub data: Vec<u8>,
}

/// What the kernel knows of the peer's acknowledgements on one stream
/// (fields of `TCP_INFO`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct PeerAcks {
    /// Segments sent and not yet acknowledged.
    pub unacked: u32,
    /// Zero-window probes sent without an answer.
    pub probes: u8,
    /// Milliseconds since the last acknowledgement arrived.
    pub last_ack_recv_ms: u32,
}

impl PeerAcks {
    /// Whether the peer has answered nothing for `quiet` while the kernel
    /// has something out to it (bytes in flight, or a zero-window probe).
    /// A live peer answers every retransmission and probe with an ACK, even
    /// when it does not read (its window closed, or its receive memory full
    /// so that it drops what arrives): only a path that carries nothing is
    /// silent. With the retransmission interval bounded (`RTO_MAX` in
    /// `socket.rs`) the kernel retries at least every second, so a live path
    /// is never silent for much longer than that.
    pub fn silent_for(&self, quiet: Duration) -> bool {
        (self.unacked > 0 || self.probes > 0)
            && u128::from(self.last_ack_recv_ms) >= quiet.as_millis()
    }
}

/// What the sender is doing, as far as the failover decisions need it.
pub(super) struct Sending<'a> {
    /// Per stream: the chunk being written, if any.
    pub tx: &'a [Option<TxChunk>],
    /// Number of the next message the link sends.
    pub next_msg: u32,
    /// Whether a control frame is partly written on the control stream (it
    /// must then stay there).
    pub ctl_started: bool,
}

/// A change of a path's state, for the log and the counters.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum PathEvent {
    /// `path` went down for `why`; `chunks` chunks (`bytes` payload bytes)
    /// go again on `others`, the paths still up.
    Down {
        path: usize,
        why: String,
        chunks: usize,
        bytes: usize,
        others: Vec<usize>,
        quiet: bool,
    },
    /// `path` works again after `down_for`.
    Up {
        path: usize,
        down_for: Duration,
        quiet: bool,
    },
}

/// One path's state.
struct PathState {
    up: bool,
    /// Failed with an error (reset, broken pipe): never comes back (taking
    /// it back would need a new connection).
    dead: bool,
    /// Held down from outside (the path planner: an uplink it crosses is
    /// cut): does not come back until released.
    held: bool,
    /// Held, or back from a hold, for the planner's layout (a standby
    /// stream), not a failure: its changes are neither logged nor counted.
    quiet: bool,
    /// Why it went down.
    reason: String,
    /// Down: per stream of the path, the stream position its kernel must
    /// deliver before the path counts as working again.
    probe: Vec<(usize, u64)>,
    since: Instant,
}

/// The multipath state of one link (see the module's opening comment).
pub(super) struct Multipath {
    peer: usize,
    /// Whether failover is on (several paths).
    on: bool,
    /// The path each stream runs on.
    path_of: Vec<usize>,
    /// Per stream: what it has delivered and how fast.
    rate: Vec<TxRate>,
    /// Per stream: frames written whose last byte the peer's kernel has not
    /// acknowledged yet, oldest first (failover on only).
    unacked: Vec<VecDeque<ChunkCopy>>,
    /// Chunks to write again on a path that works, oldest message first.
    resend: VecDeque<ChunkCopy>,
    /// Chunk buffers to reuse.
    spare: Vec<Vec<u8>>,
    paths: Vec<PathState>,
    /// No delivery for this long, with the peer silent: the path is down
    /// (`CADENCE_PATH_TIMEOUT`).
    timeout: Duration,
    /// "10.0.1.2 -> 10.0.1.3" per path, and the peer's host, for log lines
    /// and errors.
    names: Vec<String>,
    peer_host: String,
    last_check: Instant,
    /// The stream control frames (stall notices) go on: one whose path is
    /// up.
    ctl_stream: usize,
    /// Path changes not yet reported (see [`Multipath::poll_event`]).
    events: VecDeque<PathEvent>,
}

impl Multipath {
    /// `nstreams` streams to `peer`, stream s on path s % `npaths`.
    pub fn new(peer: usize, nstreams: usize, npaths: usize, now: Instant) -> Multipath {
        Multipath {
            peer,
            on: npaths > 1,
            path_of: (0..nstreams).map(|s| s % npaths).collect(),
            rate: (0..nstreams).map(|_| TxRate::new(now)).collect(),
            unacked: (0..nstreams).map(|_| VecDeque::new()).collect(),
            resend: VecDeque::new(),
            spare: Vec::new(),
            paths: (0..npaths)
                .map(|_| PathState {
                    up: true,
                    dead: false,
                    held: false,
                    quiet: false,
                    reason: String::new(),
                    probe: Vec::new(),
                    since: now,
                })
                .collect(),
            timeout: PATH_TIMEOUT,
            names: (0..npaths).map(|p| format!("path {p}")).collect(),
            peer_host: String::new(),
            last_check: now,
            ctl_stream: 0,
            events: VecDeque::new(),
        }
    }

    /// Sets the failure timeout, the peer's host and the paths' names (used
    /// only when there is one per path).
    pub fn configure(&mut self, timeout: Duration, peer_host: &str, names: Vec<String>) {
        self.peer_host = peer_host.to_string();
        self.timeout = timeout;
        if names.len() == self.paths.len() {
            self.names = names;
        }
    }

    /// Whether failover is on (several paths).
    pub fn on(&self) -> bool {
        self.on
    }

    pub fn path_of(&self, s: usize) -> usize {
        self.path_of[s]
    }

    pub fn name(&self, p: usize) -> &str {
        &self.names[p]
    }

    /// The streams of path `p`.
    pub fn streams_of(&self, p: usize) -> Vec<usize> {
        (0..self.path_of.len())
            .filter(|&s| self.path_of[s] == p)
            .collect()
    }

    pub fn path_is_up(&self, p: usize) -> bool {
        self.paths[p].up
    }

    /// Whether stream `s`'s path carries chunks.
    pub fn stream_up(&self, s: usize) -> bool {
        self.paths[self.path_of[s]].up
    }

    pub fn ctl_stream(&self) -> usize {
        self.ctl_stream
    }

    /// Says which path each stream really runs on (at set-up, a stream
    /// whose own path did not connect runs on another). A path left with
    /// no stream starts down for good, with the reason given in `why` (or
    /// "no stream connected on it"); returns those paths.
    pub fn place_streams(
        &mut self,
        path_of: Vec<usize>,
        why: &[(usize, String)],
        ctl_started: bool,
    ) -> Vec<usize> {
        assert_eq!(path_of.len(), self.path_of.len());
        self.path_of = path_of;
        let mut empty = Vec::new();
        for p in 0..self.paths.len() {
            if !self.path_of.contains(&p) {
                let st = &mut self.paths[p];
                st.up = false;
                st.dead = true;
                st.reason = why
                    .iter()
                    .find(|(q, _)| *q == p)
                    .map_or_else(|| "no stream connected on it".into(), |(_, w)| w.clone());
                empty.push(p);
            }
        }
        if !ctl_started && !self.stream_up(self.ctl_stream) {
            if let Some(s) = (0..self.path_of.len()).find(|&s| self.stream_up(s)) {
                self.ctl_stream = s;
            }
        }
        empty
    }

    /// Stream `s`'s socket took `bytes` (headers included).
    pub fn on_written(&mut self, s: usize, bytes: u64) {
        self.rate[s].wrote(bytes);
    }

    /// Stream `s` finished writing a chunk's frame whose payload the link
    /// keeps (`data`): it waits until the peer's kernel acknowledges it.
    pub fn on_frame_written(&mut self, s: usize, hdr: TcpHeader, data: Vec<u8>) {
        let end = self.rate[s].written;
        self.unacked[s].push_back(ChunkCopy { end, hdr, data });
    }

    /// A reading of stream `s`'s socket queue at `now`: updates its rate
    /// (see [`TxRate::sample`]) and releases the copies of chunks the
    /// peer's kernel has acknowledged since.
    pub fn on_queue(&mut self, s: usize, queued: u64, now: Instant) {
        let r = &mut self.rate[s];
        r.sample(queued, now);
        let acked = r.acked();
        let q = &mut self.unacked[s];
        while q.front().is_some_and(|c| c.end <= acked) {
            let c = q.pop_front().expect("front exists");
            if self.spare.len() < SPARE_MAX {
                self.spare.push(c.data);
            }
        }
    }

    /// Path `p`'s delivery rate for the counters (its streams' published
    /// rates together).
    pub fn published_bps(&self, p: usize) -> f64 {
        (0..self.rate.len())
            .filter(|&s| self.path_of[s] == p)
            .map(|s| self.rate[s].published_bps())
            .sum()
    }

    /// The working stream expected to deliver a further `len`-byte chunk
    /// first: what it holds (in the kernel, and the unwritten rest of its
    /// chunk in `tx`), plus the chunk, over its rate. Streams not measured
    /// yet count at the fastest measured rate (so each gets tried); ties go
    /// to the lowest stream, which keeps small messages on stream 0.
    pub fn first_to_finish(&self, len: usize, tx: &[Option<TxChunk>], now: Instant) -> usize {
        let up = |s: &usize| self.stream_up(*s);
        let fastest = (0..self.rate.len())
            .filter(up)
            .filter_map(|s| self.rate[s].planning_bps(now))
            .fold(0.0, f64::max);
        let mut best = (f64::INFINITY, usize::MAX);
        for s in (0..self.rate.len()).filter(up) {
            let r = &self.rate[s];
            let pending = tx[s].as_ref().map_or(0, TxChunk::unwritten);
            let bytes = (r.queued as usize + pending + len + TCP_HEADER_BYTES) as f64;
            let bps = r.planning_bps(now).unwrap_or(fastest).max(1.0);
            let t = bytes / bps;
            if t < best.0 {
                best = (t, s);
            }
        }
        best.1
    }

    /// Whether a chunk waits to go again.
    pub fn has_resend(&self) -> bool {
        !self.resend.is_empty()
    }

    /// The next chunk to go again (oldest message first), flagged as such.
    pub fn take_resend(&mut self) -> Option<ChunkCopy> {
        let mut c = self.resend.pop_front()?;
        c.hdr.flags |= FLAG_RESENT;
        Some(c)
    }

    /// An empty buffer for a chunk's copy.
    pub fn take_spare(&mut self) -> Vec<u8> {
        self.spare.pop().unwrap_or_default()
    }

    /// A copy's buffer that is no longer needed.
    pub fn recycle(&mut self, data: Vec<u8>) {
        self.spare.push(data);
    }

    /// Whether the paths are due for a check at `now` (at most every
    /// [`PATH_CHECK`]); if so the check counts as done.
    pub fn check_due(&mut self, now: Instant) -> bool {
        if now.duration_since(self.last_check) >= PATH_CHECK {
            self.last_check = now;
            true
        } else {
            false
        }
    }

    /// Whether the link is at rest: every stream's queue empty at the last
    /// reading with nothing written since, nothing to send again, and no
    /// path down that could come back. Then a check has nothing to find,
    /// and reading every stream's queue (a system call each) is skipped:
    /// a rank's upkeep grows with the links that carry something, not
    /// with all it holds.
    pub fn at_rest(&mut self, now: Instant) -> bool {
        self.quiet() && self.rate.iter_mut().all(|r| r.rest(now))
    }

    /// [`Multipath::at_rest`] without touching the streams' progress. A
    /// held path waits for its release, not for a check.
    pub fn quiet(&self) -> bool {
        self.resend.is_empty()
            && self.paths.iter().all(|p| p.up || p.dead || p.held)
            && self.rate.iter().all(|r| r.queued == 0)
    }

    /// Whether stream `s` holds bytes and has delivered none for the
    /// timeout.
    fn stalled(&self, s: usize, now: Instant) -> bool {
        let r = &self.rate[s];
        r.queued > 0 && now.duration_since(r.progress_at) >= self.timeout
    }

    /// Streams on working paths that have delivered nothing for the
    /// timeout: [`Multipath::check_paths`] needs their [`PeerAcks`] (a
    /// stream whose peer still answers is slow to drain, not cut).
    pub fn stalled_streams(&self, now: Instant) -> Vec<usize> {
        (0..self.rate.len())
            .filter(|&s| self.stream_up(s) && self.stalled(s, now))
            .collect()
    }

    /// Marks paths down that stopped delivering (a stalled stream whose
    /// peer is silent in `acks`), and up those that delivered again
    /// everything they held when they went down. Errs when the last
    /// working path goes down.
    pub fn check_paths(
        &mut self,
        now: Instant,
        acks: &[(usize, PeerAcks)],
        sending: &Sending,
    ) -> Result<(), ErrorKind> {
        let timeout = self.timeout;
        let silent = |s: usize| acks.iter().any(|(t, a)| *t == s && a.silent_for(timeout));
        for p in 0..self.paths.len() {
            if self.paths[p].up {
                let stuck = self
                    .streams_of(p)
                    .into_iter()
                    .find(|&s| self.stalled(s, now) && silent(s));
                if let Some(s) = stuck {
                    let r = &self.rate[s];
                    let why = format!(
                        "no answer for {:.1} s with {} bytes outstanding",
                        now.duration_since(r.progress_at).as_secs_f64(),
                        r.queued
                    );
                    self.path_down(p, why, false, now, sending)?;
                }
            } else if !self.paths[p].dead && !self.paths[p].held && self.owes_nothing(p) {
                self.path_up(p, now);
            }
        }
        Ok(())
    }

    /// Stream `s` failed with an error. With several paths, its path goes
    /// down for good and its chunks go again on the others; otherwise (or
    /// when no path is left) the error is the link's. The caller stops
    /// writing the path's streams.
    pub fn stream_failed(
        &mut self,
        s: usize,
        why: ErrorKind,
        now: Instant,
        sending: &Sending,
    ) -> Result<(), ErrorKind> {
        if !self.on {
            return Err(why);
        }
        let p = self.path_of[s];
        self.paths[p].dead = true;
        self.path_down(p, why.to_string(), true, now, sending)
    }

    /// Takes path `p` out of use (for good when `dead`): every chunk its
    /// streams carry that the peer's kernel has not acknowledged goes again
    /// on the other paths, oldest message first. Errs when no other path
    /// works. Nothing happens to a path already down.
    pub fn path_down(
        &mut self,
        p: usize,
        why: String,
        dead: bool,
        now: Instant,
        sending: &Sending,
    ) -> Result<(), ErrorKind> {
        if !self.paths[p].up {
            return Ok(());
        }
        if !(0..self.paths.len()).any(|q| q != p && self.paths[q].up) && !self.stand_in(p, now) {
            return Err(self.no_path_left(p, &why));
        }
        let mut again = Vec::new();
        let mut probe = Vec::new();
        for s in self.streams_of(p) {
            let acked = self.rate[s].acked();
            for c in self.unacked[s].drain(..) {
                if c.end > acked {
                    again.push(c);
                }
            }
            if let Some(c) = &sending.tx[s] {
                if let Some(data) = &c.copy {
                    again.push(ChunkCopy {
                        end: 0,
                        hdr: c.hdr,
                        data: data.clone(),
                    });
                }
            }
            if self.rate[s].written > acked {
                probe.push((s, self.rate[s].written));
            }
            self.rate[s].forget();
        }
        let bytes: usize = again.iter().map(|c| c.data.len()).sum();
        let chunks = again.len();
        self.resend.extend(again);
        // Oldest message first: the peer waits on it.
        let newest = sending.next_msg;
        self.resend
            .make_contiguous()
            .sort_by_key(|c| (std::cmp::Reverse(newest.wrapping_sub(c.hdr.msg)), c.hdr.off));
        let st = &mut self.paths[p];
        st.up = false;
        st.dead = dead;
        st.reason = why.clone();
        st.probe = probe;
        st.since = now;
        if !sending.ctl_started && !self.stream_up(self.ctl_stream) {
            self.ctl_stream = (0..self.path_of.len())
                .find(|&s| self.stream_up(s))
                .expect("another path works");
        }
        let others = (0..self.paths.len())
            .filter(|&q| self.paths[q].up)
            .collect();
        self.events.push_back(PathEvent::Down {
            path: p,
            why,
            chunks,
            bytes,
            others,
            quiet: self.paths[p].quiet,
        });
        Ok(())
    }

    /// Path `p`, the last working one, is going down: a path held that
    /// owes nothing (a standby first, then one held off a cut) takes over
    /// instead of the link failing. The planner's word is advice: its
    /// event may come after the path timeout, and a link must not die
    /// while it has a stream that can carry. Whether one did.
    fn stand_in(&mut self, p: usize, now: Instant) -> bool {
        let Some(q) = (0..self.paths.len())
            .filter(|&q| {
                q != p && self.paths[q].held && !self.paths[q].dead && self.owes_nothing(q)
            })
            .min_by_key(|&q| !self.paths[q].quiet)
        else {
            return false;
        };
        self.paths[q].held = false;
        // Said, not quiet: the link runs where the planner did not put it.
        self.paths[q].quiet = false;
        self.path_up(q, now);
        true
    }

    /// Holds path `p` down for `why` (its chunks go again on the others, as
    /// when it fails) until [`Multipath::release`]; `quiet`: for the
    /// planner's layout, not a failure. Not the last path that works: that
    /// one carries on whatever `why` says (returns `false`).
    pub fn hold(
        &mut self,
        p: usize,
        why: &str,
        quiet: bool,
        now: Instant,
        sending: &Sending,
    ) -> bool {
        if self.paths[p].held {
            return true;
        }
        if self.paths[p].up {
            if !(0..self.paths.len()).any(|q| q != p && self.paths[q].up) {
                return false;
            }
            self.paths[p].quiet = quiet;
            self.path_down(p, why.to_string(), false, now, sending)
                .expect("another path works");
        }
        self.paths[p].held = true;
        true
    }

    /// Ends the hold of path `p`: it comes back once it has delivered what
    /// it held when it went down, like a path that failed and works again;
    /// at once when it owes nothing (a standby stream), so that a hold in
    /// the same event finds it working.
    pub fn release(&mut self, p: usize, now: Instant) {
        self.paths[p].held = false;
        if !self.paths[p].up && !self.paths[p].dead && self.owes_nothing(p) {
            self.path_up(p, now);
        }
    }

    /// Whether path `p`, down, has delivered everything it held when it
    /// went down (then it may work again).
    fn owes_nothing(&self, p: usize) -> bool {
        self.paths[p]
            .probe
            .iter()
            .all(|&(s, mark)| self.rate[s].acked() >= mark)
    }

    /// Whether path `p` is held down.
    pub fn held(&self, p: usize) -> bool {
        self.paths[p].held
    }

    /// Whether path `p`'s hold is the planner's layout, not a failure.
    pub fn held_quietly(&self, p: usize) -> bool {
        self.paths[p].quiet
    }

    /// The link's error when path `p`, the last one working, goes down for
    /// `why`: names every path and why it failed.
    fn no_path_left(&self, p: usize, why: &str) -> ErrorKind {
        let tried: Vec<String> = (0..self.paths.len())
            .map(|q| {
                let reason = if q == p { why } else { &self.paths[q].reason };
                format!("{} ({reason})", self.names[q])
            })
            .collect();
        ErrorKind::PeerClosed {
            peer: self.peer,
            detail: format!(
                "no path to it works (host {}): {}",
                self.peer_host,
                tried.join("; ")
            ),
        }
    }

    /// Takes path `p` back: it delivered everything it held when it went
    /// down. Its rates are measured afresh (unknown counts as the fastest,
    /// so it is tried at once).
    fn path_up(&mut self, p: usize, now: Instant) {
        let down_for = now.duration_since(self.paths[p].since);
        let st = &mut self.paths[p];
        st.up = true;
        st.reason.clear();
        st.probe.clear();
        for s in self.streams_of(p) {
            let r = &mut self.rate[s];
            r.forget();
            r.measured_at = now;
            r.progress_at = now;
        }
        let quiet = std::mem::take(&mut self.paths[p].quiet);
        self.events.push_back(PathEvent::Up {
            path: p,
            down_for,
            quiet,
        });
    }

    /// The next path change not yet reported, oldest first.
    pub fn poll_event(&mut self) -> Option<PathEvent> {
        self.events.pop_front()
    }
}

#[cfg(test)]
#[path = "multipath_tests.rs"]
mod tests;
