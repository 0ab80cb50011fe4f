//! Cumulative per-communicator totals: what the flight recorder's ring
//! forgets. Per collective kind, operations completed and failed, bytes, and
//! a histogram of durations; updated once per operation, at its end, under
//! the recorder's lock that the record update takes anyway (a few adds, no
//! allocation). Read by `Comm::metrics` (Prometheus, `docs/diagnosis.md`).
//!
//! Duration buckets are powers of two from 1 µs to 2^27 µs (134 s), plus an
//! overflow bucket: collective durations span eight orders of magnitude (a
//! few µs for a small allreduce in shared memory, seconds for gigabytes over
//! TCP, up to the default 300 s deadline), a factor of two between bounds
//! keeps the same relative resolution across them with 28 buckets, and a
//! duration's bucket is one division and one leading-zeros count.

use crate::types::CollKind;
use serde::Serialize;

/// Upper bounds of the duration buckets: `2^i` µs for `i` in
/// `0..DURATION_BUCKETS`; one more bucket counts longer operations.
pub const DURATION_BUCKETS: usize = 28;

/// The upper bound of bucket `i` in nanoseconds (`i < DURATION_BUCKETS`).
pub const fn bucket_bound_ns(i: usize) -> u64 {
    1000 << i
}

/// The bucket of a duration: the first `i` with `ns <= 2^i µs`, or
/// `DURATION_BUCKETS` (overflow) past the last bound.
pub fn bucket_of(ns: u64) -> usize {
    // ns <= 1000 * 2^i  <=>  ceil(ns / 1000) <= 2^i (2^i is an integer).
    let us = ns.div_ceil(1000);
    let i = if us <= 1 {
        0
    } else {
        (u64::BITS - (us - 1).leading_zeros()) as usize
    };
    i.min(DURATION_BUCKETS)
}

/// Totals of one collective kind. Bytes and durations count completed
/// operations only (a failed one's duration is its deadline, not the
/// collective's speed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KindTotals {
    pub ok: u64,
    pub failed: u64,
    /// The calls' sizes (an operation's `bytes`: the larger of its input
    /// and output), not bytes on the wire.
    pub bytes: u64,
    /// Sum of the completed operations' durations (start to end).
    pub duration_ns: u64,
    /// Completed operations per duration bucket (not cumulative); the last
    /// is the overflow bucket.
    pub buckets: [u64; DURATION_BUCKETS + 1],
}

/// Totals of every collective kind since the communicator was created.
#[derive(Clone, Debug, Default)]
pub struct OpTotals {
    kinds: [KindTotals; CollKind::ALL.len()],
}

impl OpTotals {
    /// Counts one finished operation.
    pub fn add(&mut self, kind: CollKind, bytes: u64, duration_ns: u64, ok: bool) {
        let t = &mut self.kinds[kind.code() as usize];
        if ok {
            t.ok += 1;
            t.bytes += bytes;
            t.duration_ns += duration_ns;
            t.buckets[bucket_of(duration_ns)] += 1;
        } else {
            t.failed += 1;
        }
    }

    pub fn of(&self, kind: CollKind) -> &KindTotals {
        &self.kinds[kind.code() as usize]
    }

    /// Kinds that ran at least one operation, with their totals.
    pub fn used(&self) -> impl Iterator<Item = (CollKind, &KindTotals)> {
        CollKind::ALL
            .into_iter()
            .map(|k| (k, self.of(k)))
            .filter(|(_, t)| t.ok + t.failed > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two_microseconds() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1), 0);
        assert_eq!(bucket_of(1000), 0); // exactly 1 µs: le="1e-06"
        assert_eq!(bucket_of(1001), 1);
        assert_eq!(bucket_of(2000), 1);
        assert_eq!(bucket_of(2001), 2);
        assert_eq!(bucket_of(4000), 2);
        assert_eq!(bucket_of(4001), 3);
        assert_eq!(bucket_of(1_000_000), 10); // 1 ms <= 1024 µs
        assert_eq!(
            bucket_of(bucket_bound_ns(DURATION_BUCKETS - 1)),
            DURATION_BUCKETS - 1
        );
        assert_eq!(
            bucket_of(bucket_bound_ns(DURATION_BUCKETS - 1) + 1),
            DURATION_BUCKETS
        );
        assert_eq!(bucket_of(u64::MAX), DURATION_BUCKETS);
        // Every duration lies within its bucket's bounds.
        for ns in (0..40).map(|s| 3u64.pow(s / 2) * if s % 2 == 0 { 1 } else { 2 }) {
            let i = bucket_of(ns);
            if i < DURATION_BUCKETS {
                assert!(ns <= bucket_bound_ns(i), "{ns} above bucket {i}");
            }
            if i > 0 {
                assert!(ns > bucket_bound_ns(i - 1), "{ns} fits bucket {}", i - 1);
            }
        }
        // The last bound is about 134 s: past the default 300 s deadline's
        // order of magnitude, every longer operation overflows.
        assert_eq!(bucket_bound_ns(DURATION_BUCKETS - 1), 134_217_728_000);
    }

    #[test]
    fn totals_count_per_kind() {
        let mut t = OpTotals::default();
        for _ in 0..7 {
            t.add(CollKind::AllReduce, 4000, 3_000, true);
        }
        t.add(CollKind::AllReduce, 4000, 500_000_000_000, true);
        t.add(CollKind::AllReduce, 4000, 9, false);
        t.add(CollKind::Barrier, 0, 1_500, true);
        let a = t.of(CollKind::AllReduce);
        assert_eq!((a.ok, a.failed, a.bytes), (8, 1, 32_000));
        assert_eq!(a.duration_ns, 7 * 3_000 + 500_000_000_000);
        assert_eq!(a.buckets[2], 7);
        assert_eq!(a.buckets[DURATION_BUCKETS], 1);
        assert_eq!(a.buckets.iter().sum::<u64>(), a.ok);
        let b = t.of(CollKind::Barrier);
        assert_eq!((b.ok, b.bytes, b.buckets[1]), (1, 0, 1));
        let used: Vec<_> = t.used().map(|(k, _)| k).collect();
        assert_eq!(used, [CollKind::AllReduce, CollKind::Barrier]);
    }
}
