//! The I/O half of the multipath decisions: reads the clock, the sockets'
//! queues (`TIOCOUTQ`) and acknowledgement state (`TCP_INFO`), feeds them to
//! [`Multipath`](super::multipath::Multipath), and turns what it decided
//! into stopped writes, log lines and counters.

use super::multipath::{PathEvent, Sending};
use super::socket::{peer_acks, queued_bytes};
use super::TcpLink;
use crate::error::ErrorKind;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Instant;

impl TcpLink {
    /// Reads every stream's queue into the rates (dropping the copies of
    /// chunks the peer's kernel has acknowledged since) and publishes the
    /// per-path rate counters.
    pub(super) fn sample_rates(&mut self) {
        self.sample_rates_at(Instant::now());
    }

    pub(super) fn sample_rates_at(&mut self, now: Instant) {
        for (s, sock) in self.streams.iter().enumerate() {
            self.multipath.on_queue(s, queued_bytes(sock), now);
        }
        for (p, c) in self.stats.paths.iter().enumerate() {
            c.rate_bps.set(self.multipath.published_bps(p) as u64);
        }
    }

    /// Reads the queues of path `p`'s streams, so that a path about to go
    /// down sends again only what its peer's kernel has not acknowledged.
    fn sample_path(&mut self, p: usize, now: Instant) {
        if self.multipath.path_is_up(p) {
            for s in self.multipath.streams_of(p) {
                self.multipath
                    .on_queue(s, queued_bytes(&self.streams[s]), now);
            }
        }
    }

    /// Background work of a link with several paths (the engine calls it
    /// between rounds and while it waits): checks the paths for failure
    /// and recovery, and writes what the link itself owns — chunks sent
    /// again, and the rest of chunks whose sends have completed. Returns
    /// whether any byte moved.
    pub fn maintain(&mut self) -> Result<bool, ErrorKind> {
        if !self.multipath.on() {
            return Ok(false);
        }
        self.apply_holds();
        let now = Instant::now();
        if self.multipath.check_due(now) && !self.multipath.at_rest(now) {
            self.sample_rates_at(now);
            // TCP_INFO only for the streams that have stopped delivering.
            let acks: Vec<_> = self
                .multipath
                .stalled_streams(now)
                .into_iter()
                .filter_map(|s| peer_acks(&self.streams[s]).map(|a| (s, a)))
                .collect();
            let sending = Sending {
                tx: &self.tx,
                next_msg: self.tx_msg,
                ctl_started: self.tx_ctl_done > 0,
            };
            let checked = self.multipath.check_paths(now, &acks, &sending);
            self.report_path_events();
            checked?;
        }
        let mut moved = false;
        if !self.tx_ctl.is_empty() {
            moved |= self.flush_ctl()?;
        }
        if !self.tx_idle() {
            moved |= self.pump(None)?;
        }
        Ok(moved)
    }

    /// Whether [`TcpLink::maintain`] has nothing to do until the link next
    /// carries something.
    pub fn resting(&self) -> bool {
        !self.multipath.on() || (self.multipath.quiet() && self.tx_ctl.is_empty() && self.tx_idle())
    }

    /// About to carry something after a rest (nobody looked at the link
    /// meanwhile): its streams count as having made progress until `now`,
    /// so that the rest is not taken for a stall.
    pub fn wake(&mut self, now: Instant) {
        self.multipath.at_rest(now);
        self.apply_holds();
    }

    /// Streams the link's own writes wait on (see [`TcpLink::maintain`]).
    pub fn background_fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        let on = self.multipath.on();
        self.streams
            .iter()
            .enumerate()
            .filter(move |(s, _)| on && self.tx[*s].is_some() && self.multipath.stream_up(*s))
            .map(|(_, sock)| sock.as_raw_fd())
    }

    /// Stream `s` failed with an error. With several paths, its path goes
    /// down for good, its chunks go again on the others and its streams are
    /// no longer written; otherwise (or when no path is left) the error is
    /// the link's.
    pub(super) fn stream_failed(&mut self, s: usize, why: ErrorKind) -> Result<(), ErrorKind> {
        if !self.multipath.on() {
            return Err(why);
        }
        let p = self.multipath.path_of(s);
        let now = Instant::now();
        self.sample_path(p, now);
        let sending = Sending {
            tx: &self.tx,
            next_msg: self.tx_msg,
            ctl_started: self.tx_ctl_done > 0,
        };
        let failed = self.multipath.stream_failed(s, why, now, &sending);
        self.report_path_events();
        failed?;
        for s in self.multipath.streams_of(p) {
            if let Some(data) = self.tx[s].take().and_then(|c| c.copy) {
                self.multipath.recycle(data);
            }
        }
        Ok(())
    }

    /// Test hook: takes path `p` down as if it had stopped delivering (its
    /// streams stay open; it comes back once they deliver what they hold).
    pub fn force_path_down(&mut self, p: usize) -> Result<(), ErrorKind> {
        self.sample_rates();
        let now = Instant::now();
        self.sample_path(p, now);
        let sending = Sending {
            tx: &self.tx,
            next_msg: self.tx_msg,
            ctl_started: self.tx_ctl_done > 0,
        };
        let down = self
            .multipath
            .path_down(p, "taken down by a test".into(), false, now, &sending);
        self.report_path_events();
        down
    }

    /// Logs what happened to the paths and updates their counters.
    pub(super) fn report_path_events(&mut self) {
        while let Some(event) = self.multipath.poll_event() {
            match event {
                // The planner's layout moving a standby stream: no failure.
                PathEvent::Down { quiet: true, .. } | PathEvent::Up { quiet: true, .. } => {}
                PathEvent::Down {
                    path,
                    why,
                    chunks,
                    bytes,
                    others,
                    ..
                } => {
                    let c = &self.stats.paths[path];
                    c.down.set(1);
                    c.downs.add(1);
                    c.resent_bytes.add(bytes as u64);
                    let others: Vec<&str> =
                        others.iter().map(|&q| self.multipath.name(q)).collect();
                    self.log(format!(
                        "path {} to rank {} is down ({why}); {chunks} chunks ({bytes} bytes) go \
                         again on {}",
                        self.multipath.name(path),
                        self.peer,
                        others.join(", ")
                    ));
                }
                PathEvent::Up { path, down_for, .. } => {
                    self.stats.paths[path].down.set(0);
                    self.log(format!(
                        "path {} to rank {} works again (down {:.1} s); it carries chunks again",
                        self.multipath.name(path),
                        self.peer,
                        down_for.as_secs_f64()
                    ));
                }
            }
        }
    }
}
