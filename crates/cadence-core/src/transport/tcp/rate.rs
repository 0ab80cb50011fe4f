//! One stream's delivery rate, measured from what its socket still holds.
//! Fed readings of the kernel's queue (`TIOCOUTQ`) and the time; reads
//! neither itself.

use std::time::{Duration, Instant};

/// How often a stream's delivery rate is sampled (at most).
const RATE_SAMPLE: Duration = Duration::from_millis(2);
/// How far back the published rate looks (see [`TxRate::published_bps`]).
const PUBLISHED_WINDOW: Duration = Duration::from_secs(1);
/// Weight of a new rate sample in the running estimate.
const RATE_GAIN: f64 = 0.3;
/// A rate estimate this old counts double, and so on (see
/// [`TxRate::planning_bps`]).
const RATE_STALE: Duration = Duration::from_millis(250);

/// What one stream has delivered to the peer, and its measured rate.
#[derive(Clone, Debug)]
pub(super) struct TxRate {
    /// Bytes (headers included) written to the socket, ever.
    pub written: u64,
    /// Bytes the kernel still holds (unsent or unacknowledged), as last
    /// read.
    pub queued: u64,
    /// At the last sample: delivered bytes (written - queued), the time,
    /// and whether the stream had bytes queued.
    delivered: u64,
    at: Instant,
    backlogged: bool,
    /// Bytes per second; 0 until measured.
    pub bps: f64,
    /// When `bps` last rested on a sample.
    pub measured_at: Instant,
    /// When the stream last delivered a byte or had nothing queued, and
    /// what it had delivered then (failure detection).
    pub progress_at: Instant,
    progress_mark: u64,
    /// Bytes delivered and seconds spent while backlogged, recent ones
    /// weighing most (see [`TxRate::published_bps`]).
    busy_bytes: f64,
    busy_secs: f64,
}

impl TxRate {
    pub fn new(now: Instant) -> TxRate {
        TxRate {
            written: 0,
            queued: 0,
            delivered: 0,
            at: now,
            backlogged: false,
            bps: 0.0,
            measured_at: now,
            progress_at: now,
            progress_mark: 0,
            busy_bytes: 0.0,
            busy_secs: 0.0,
        }
    }

    /// The socket took `bytes` more (they count as queued until a reading
    /// of the queue says otherwise).
    pub fn wrote(&mut self, bytes: u64) {
        self.written += bytes;
        self.queued += bytes;
    }

    /// The delivery rate the counters show: bytes over time while the
    /// stream was backlogged, over about the last [`PUBLISHED_WINDOW`] of
    /// such time. Steadier than `bps`, whose short samples follow bursts
    /// of acknowledgements (fine for choosing the next chunk's stream, not
    /// for a figure a user reads).
    pub fn published_bps(&self) -> f64 {
        if self.busy_secs > 0.0 {
            self.busy_bytes / self.busy_secs
        } else {
            0.0
        }
    }

    /// Nothing written since a reading found the queue empty: the stream
    /// is idle, and counts as making progress (what a reading would say).
    pub fn rest(&mut self, now: Instant) -> bool {
        if self.queued > 0 {
            return false;
        }
        self.progress_at = now;
        self.progress_mark = self.written;
        true
    }

    /// Bytes the peer's kernel has acknowledged, as last read.
    pub fn acked(&self) -> u64 {
        self.written - self.queued
    }

    /// Takes a reading of the socket's queue (`queued`: what `TIOCOUTQ`
    /// said) and, at most every [`RATE_SAMPLE`], folds what the stream
    /// delivered since the last sample into the rate. Only a stream that
    /// had bytes queued from start to end of the interval shows its rate;
    /// one that ran dry delivered all it had, faster than it seems, so its
    /// sample can only raise an estimate, never start one (a 48-byte
    /// barrier message over an idle millisecond is no measure of a path).
    pub fn sample(&mut self, queued: u64, now: Instant) {
        self.queued = queued.min(self.written);
        if self.queued == 0 || self.acked() > self.progress_mark {
            self.progress_at = now;
            self.progress_mark = self.acked();
        }
        let dt = now.duration_since(self.at);
        if dt < RATE_SAMPLE {
            return;
        }
        let delivered = self.written - self.queued;
        let inst = delivered.saturating_sub(self.delivered) as f64 / dt.as_secs_f64();
        if self.backlogged && self.queued > 0 {
            // The published rate: bytes over time while backlogged, with
            // older intervals fading over about a second.
            let fade = (-dt.as_secs_f64() / PUBLISHED_WINDOW.as_secs_f64()).exp();
            self.busy_bytes = self.busy_bytes * fade + inst * dt.as_secs_f64();
            self.busy_secs = self.busy_secs * fade + dt.as_secs_f64();
            self.bps = if self.bps == 0.0 {
                inst
            } else {
                self.bps + RATE_GAIN * (inst - self.bps)
            };
            self.measured_at = now;
        } else if self.backlogged && self.bps > 0.0 && inst > self.bps {
            // Smoothed too: a burst of acknowledgements (delayed ACKs, a
            // shaper's bucket) can make one short interval look far faster
            // than the path.
            self.bps += RATE_GAIN * (inst - self.bps);
            self.measured_at = now;
        }
        self.delivered = delivered;
        self.at = now;
        self.backlogged = self.queued > 0;
    }

    /// The rate to plan with: the estimate, doubled for every
    /// [`RATE_STALE`] without a sample. A path that gets no chunks because
    /// it measured slow is thus offered one now and then, and a path that
    /// has recovered is found again. `None` until first measured.
    pub fn planning_bps(&self, now: Instant) -> Option<f64> {
        if self.bps == 0.0 {
            return None;
        }
        let stale = now.duration_since(self.measured_at).as_secs_f64() / RATE_STALE.as_secs_f64();
        Some(self.bps * 2f64.powf(stale.floor().min(30.0)))
    }

    /// Forgets the estimate: the path is measured afresh (unknown counts as
    /// the fastest when planning).
    pub fn forget(&mut self) {
        self.bps = 0.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_that_ran_dry_never_starts_an_estimate() {
        let t0 = Instant::now();
        let mut r = TxRate::new(t0);
        r.wrote(48);
        r.sample(0, t0 + Duration::from_millis(3));
        assert_eq!(r.bps, 0.0);
        assert_eq!(r.planning_bps(t0 + Duration::from_millis(3)), None);
    }

    #[test]
    fn a_backlogged_stream_shows_its_rate_and_an_old_estimate_doubles() {
        let t0 = Instant::now();
        let mut r = TxRate::new(t0);
        r.wrote(1 << 20);
        r.sample(1 << 20, t0);
        // 10 kB per 2 ms = 5 MB/s, backlogged throughout.
        let mut queued = 1u64 << 20;
        let mut t = t0;
        for _ in 0..50 {
            t += Duration::from_millis(2);
            queued -= 10_000;
            r.sample(queued, t);
        }
        let bps = r.planning_bps(t).unwrap();
        assert!((bps - 5e6).abs() < 1e3, "{bps}");
        assert!((r.published_bps() - 5e6).abs() < 1e3);
        let later = t + RATE_STALE * 2;
        assert!((r.planning_bps(later).unwrap() - 4.0 * bps).abs() < 1.0);
    }
}
