//! Failover on a TCP link with several paths, without root: the receiver
//! side driven by hand-made byte streams (a path that stops mid-frame,
//! copies sent again behind a later message, duplicates, a path that comes
//! back), and a sending link whose path is taken down mid-message.
//! The emulated-cluster test (`tests/test_multinic.py`) cuts a real NIC.

mod common;

use cadence_core::transport::tcp::{TcpHeader, TcpLink, CHUNK_BYTES, FLAG_RESENT};
use cadence_core::transport::{RecvJob, SendJob, Sink, SinkMode, Source};
use cadence_core::types::ElemOp;
use cadence_core::{DType, ErrorKind};
use common::{cases, meta, receive_i32, socket_pairs};
use proptest::prelude::*;
use std::io::Write;
use std::time::{Duration, Instant};

/// A frame: chunk `c` of message `msg` (of `payload`).
fn frame(msg: u32, payload: &[u8], c: usize, resent: bool) -> Vec<u8> {
    let off = c * CHUNK_BYTES;
    let len = CHUNK_BYTES.min(payload.len() - off);
    let mut h = TcpHeader::control(meta(DType::I32, payload.len() / 4).header(len));
    h.msg = msg;
    h.off = off as u64;
    if resent {
        h.flags = FLAG_RESENT;
    }
    let mut v = bytemuck::bytes_of(&h).to_vec();
    v.extend_from_slice(&payload[off..off + len]);
    v
}

fn nchunks(len: usize) -> usize {
    len.div_ceil(CHUNK_BYTES).max(1)
}

fn payload(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i >> 9) as u8)
        .collect()
}

/// The streams of one failover, as a sender would have written them:
/// message 0's chunks alternate between stream 0 and stream 1; stream 1
/// stops after `cut` of its bytes (mid-frame or not: its path failed);
/// stream 0 then carries message 1 and, behind it, message 0's chunks of
/// stream 1 again (flagged), plus a copy of one of stream 0's own chunks
/// (`dup`). With `back`, stream 1 later delivers the rest of what it held
/// and then carries message 2.
fn failover_streams(
    m: [&[u8]; 3],
    cut_frac: f64,
    dup: bool,
    back: bool,
) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let (mut s0, mut s1) = (Vec::new(), Vec::new());
    let mut on1 = Vec::new();
    for c in 0..nchunks(m[0].len()) {
        if c % 2 == 1 {
            s1.extend(frame(0, m[0], c, false));
            on1.push(c);
        } else {
            s0.extend(frame(0, m[0], c, false));
        }
    }
    let cut = ((s1.len() as f64) * cut_frac) as usize;
    let tail = s1.split_off(cut);
    for c in 0..nchunks(m[1].len()) {
        s0.extend(frame(1, m[1], c, false));
    }
    for &c in &on1 {
        s0.extend(frame(0, m[0], c, true));
    }
    if dup {
        s0.extend(frame(0, m[0], 0, true));
    }
    let mut late = Vec::new();
    if back {
        late = tail;
        for c in 0..nchunks(m[2].len()) {
            late.extend(frame(2, m[2], c, false));
        }
    }
    (s0, s1, late)
}

proptest! {
    #![proptest_config(cases(12))]

    /// Whatever byte a path stops at, and whether or not it comes back,
    /// every message comes out whole and each chunk is applied once.
    #[test]
    fn a_path_that_stops_anywhere_loses_nothing_and_sums_nothing_twice(
        chunks0 in 2usize..7,
        tail0 in 0usize..CHUNK_BYTES / 4,
        len1 in 1usize..3 * CHUNK_BYTES / 4,
        cut_frac in 0.0f64..1.0,
        dup in any::<bool>(),
        back in any::<bool>(),
        reduce in any::<bool>(),
        seed in any::<u8>(),
    ) {
        let m0 = payload(((chunks0 - 1) * CHUNK_BYTES + tail0 * 4).max(4), seed);
        let m1 = payload(len1 * 4, seed ^ 0x55);
        let m2 = payload(CHUNK_BYTES + 400, seed ^ 0xAA);
        let (s0, s1, late) = failover_streams([&m0, &m1, &m2], cut_frac, dup, back);
        let (tx, rx) = socket_pairs(2);
        let writer = std::thread::spawn(move || {
            let mut tx = tx;
            tx[1].write_all(&s1).unwrap();
            tx[0].write_all(&s0).unwrap();
            if !late.is_empty() {
                std::thread::sleep(Duration::from_millis(50));
                tx[1].write_all(&late).unwrap();
            }
            tx
        });
        let mut link = TcpLink::new(1, rx, 2).unwrap();
        let got0 = receive_i32(&mut link, m0.len(), reduce).unwrap();
        let got1 = receive_i32(&mut link, m1.len(), reduce).unwrap();
        prop_assert!(got0 == m0, "message 0 differs");
        prop_assert!(got1 == m1, "message 1 differs");
        if back {
            let got2 = receive_i32(&mut link, m2.len(), reduce).unwrap();
            prop_assert!(got2 == m2, "message 2 differs");
        }
        let _tx = writer.join().unwrap();
    }
}

/// Drives a sending and a receiving link in one thread until the receive
/// completes; `hook` runs once after the sender has written `after` bytes,
/// and the receiver starts reading after that.
fn transfer(
    tx: &mut TcpLink,
    rx: &mut TcpLink,
    data: &[u8],
    after: Option<usize>,
    hook: &mut dyn FnMut(&mut TcpLink),
) -> Vec<u8> {
    let len = data.len();
    let mut mem = vec![0u8; len];
    // SAFETY: `data` and `mem` are valid for `len` bytes and outlive both
    // jobs (dropped at the end of this function); `mem` is touched by the
    // receive only.
    let (src, sink) = unsafe {
        (
            Source::new(data.as_ptr(), len),
            Sink::new(
                mem.as_mut_ptr(),
                len,
                SinkMode::ReduceInPlace,
                DType::I32,
                ElemOp::Sum,
            ),
        )
    };
    let mut send = SendJob::new(meta(DType::I32, len / 4), src);
    let mut recv = RecvJob::new(meta(DType::I32, len / 4), sink);
    let mut hooked = after.is_none();
    let limit = Instant::now() + Duration::from_secs(20);
    while !recv.done {
        assert!(
            Instant::now() < limit,
            "hang: sent {} chunks of {} (done {}), received {} of {}; {:?}",
            send.tcp.next,
            send.tcp.nchunks,
            send.done,
            recv.tcp.received,
            recv.tcp.nchunks,
            tx.stats.snapshot().paths
        );
        if !send.done {
            tx.send_progress(&mut send).unwrap();
        }
        tx.maintain().unwrap();
        if !hooked && send.sent >= after.unwrap() {
            hooked = true;
            hook(tx);
        }
        // The receiver reads only after the hook: the sender's sockets then
        // hold bytes the peer has not acknowledged.
        if hooked {
            rx.recv_progress(&mut recv).unwrap();
        }
    }
    // The send may finish after the receive when copies went again.
    while !send.done {
        assert!(Instant::now() < limit, "hang");
        tx.send_progress(&mut send).unwrap();
    }
    drop((send, recv));
    mem
}

#[test]
fn a_path_taken_down_mid_message_loses_nothing_and_comes_back() {
    let (a, b) = socket_pairs(2);
    let mut tx = TcpLink::new(1, a, 2).unwrap();
    let mut rx = TcpLink::new(0, b, 2).unwrap();
    let msgs: Vec<Vec<u8>> = (0..3).map(|k| payload(8 << 20, k as u8)).collect();
    for (k, m) in msgs.iter().enumerate() {
        let after = (k == 0).then_some(256 << 10);
        let got = transfer(&mut tx, &mut rx, m, after, &mut |l| {
            l.force_path_down(1).unwrap()
        });
        assert!(got == *m, "message {k} differs");
    }
    let paths = tx.stats.snapshot().paths;
    assert_eq!(paths[1].downs, 1, "{paths:?}");
    assert!(paths[1].resent_bytes > 0, "{paths:?}");
    // Loopback delivers what the 'failed' path held: it comes back.
    let limit = Instant::now() + Duration::from_secs(10);
    while !tx.stats.snapshot().paths[1].up {
        assert!(Instant::now() < limit, "path 1 never came back");
        tx.maintain().unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    // And carries chunks again.
    let before = tx.stats.snapshot().paths[1].bytes_sent;
    let m = payload(8 << 20, 9);
    assert!(transfer(&mut tx, &mut rx, &m, None, &mut |_| {}) == m);
    assert!(tx.stats.snapshot().paths[1].bytes_sent > before);
}

#[test]
fn taking_the_last_path_down_is_an_error_naming_the_peer_and_paths() {
    let (a, _b) = socket_pairs(2);
    let mut tx = TcpLink::new(5, a, 2).unwrap();
    tx.set_failover(
        Duration::from_secs(1),
        "node7",
        vec!["10.0.0.1 -> 10.0.0.2".into(), "10.0.1.1 -> 10.0.1.2".into()],
        None,
    );
    tx.force_path_down(0).unwrap();
    let err = tx.force_path_down(1).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, ErrorKind::PeerClosed { peer: 5, .. }),
        "{text}"
    );
    assert!(
        text.contains("node7")
            && text.contains("10.0.0.1 -> 10.0.0.2")
            && text.contains("10.0.1.1 -> 10.0.1.2"),
        "{text}"
    );
}

#[test]
fn a_peer_that_stops_reading_is_not_a_failed_path() {
    // The receiver reads nothing for several path timeouts: its window
    // closes and the sender's queues stop shrinking, but its kernel answers
    // every zero-window probe (sent at least once a second), so no path
    // may go down.
    let (a, b) = socket_pairs(2);
    let mut tx = TcpLink::new(1, a, 2).unwrap();
    tx.set_failover(
        Duration::from_millis(1500),
        "b",
        vec!["a".into(), "b".into()],
        None,
    );
    let mut rx = TcpLink::new(0, b, 2).unwrap();
    let data = payload(32 << 20, 1);
    let len = data.len();
    // SAFETY: `data` is valid for `len` bytes and outlives the job.
    let src = unsafe { Source::new(data.as_ptr(), len) };
    let mut send = SendJob::new(meta(DType::I32, len / 4), src);
    let stop = Instant::now() + Duration::from_millis(4000);
    while Instant::now() < stop {
        tx.send_progress(&mut send).unwrap();
        tx.maintain().unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        !send.done,
        "the socket buffers took 32 MiB: the test proves nothing"
    );
    let paths = tx.stats.snapshot().paths;
    assert!(paths.iter().all(|p| p.up && p.downs == 0), "{paths:?}");
    let mut mem = vec![0u8; len];
    // SAFETY: `mem` is valid for `len` bytes and outlives the job.
    let sink = unsafe {
        Sink::new(
            mem.as_mut_ptr(),
            len,
            SinkMode::Copy,
            DType::I32,
            ElemOp::Sum,
        )
    };
    let mut recv = RecvJob::new(meta(DType::I32, len / 4), sink);
    let limit = Instant::now() + Duration::from_secs(20);
    while !recv.done || !send.done {
        assert!(Instant::now() < limit, "hang");
        if !send.done {
            tx.send_progress(&mut send).unwrap();
        }
        tx.maintain().unwrap();
        if !recv.done {
            rx.recv_progress(&mut recv).unwrap();
        }
    }
    drop((send, recv));
    assert!(mem == data);
    assert_eq!(
        tx.stats
            .snapshot()
            .paths
            .iter()
            .map(|p| p.downs)
            .sum::<u64>(),
        0
    );
}
