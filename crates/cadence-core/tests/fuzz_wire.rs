//! The wire, fuzzed (property-based, stable toolchain):
//!
//! - the handshake machines take random, truncated, oversize and mutated
//!   byte streams: no panic, and success only for the exact legitimate
//!   transcript;
//! - a receiving `TcpLink` with a `RecvJob` waiting reads random and mutated
//!   frame streams (random headers, valid headers with wrong lengths or types,
//!   truncated frames, abort/stall frames with absurd lengths) from a real
//!   loopback socket: every input ends in completion or a clean `ErrorKind`
//!   within a bounded time, and nothing is written outside the sink.
//!
//! `cargo test` runs a small budget (a few seconds). `make fuzz` runs the same
//! properties longer: `PROPTEST_CASES=N` sets the cases per property.

mod common;

use cadence_core::transport::handshake::{
    Acceptor, Connector, JobSecret, Reject, ReplayGuard, Step, ANSWER_BYTES, HELLO_BYTES,
};
use cadence_core::transport::tcp::{TcpHeader, TcpLink, CHUNK_BYTES, TCP_HEADER_BYTES};
use cadence_core::transport::{
    OpMeta, RecvJob, Sink, SinkMode, FRAME_ABORT, FRAME_DATA, FRAME_STALL,
};
use cadence_core::types::ElemOp;
use cadence_core::{DType, ErrorKind};
use common::{cases, meta, receive_i32, socket_pairs, wait_readable};
use proptest::prelude::*;
use std::io::Write;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------- handshake

const ID: &str = "fuzz-comm";
const EXPECTED: [(usize, usize); 2] = [(1, 0), (1, 1)];

fn legit_hello(secret: &JobSecret) -> Vec<u8> {
    Connector::new(secret, ID, 1, 1, 0, [3; 32]).1
}

/// The server's WELCOME (keep) to the legitimate HELLO.
fn legit_server_bytes(secret: &JobSecret) -> Vec<u8> {
    let mut s = Acceptor::new(secret, ID, 0, &EXPECTED);
    let Ok(Step::Verified { .. }) = s.feed(&legit_hello(secret), &mut ReplayGuard::default())
    else {
        unreachable!()
    };
    s.welcome(true).unwrap()
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip { at: usize, bits: u8 },
    Truncate(usize),
    Insert { at: usize, byte: u8 },
    Delete(usize),
    Append(Vec<u8>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1u8..).prop_map(|(at, bits)| Mutation::Flip { at, bits }),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Insert { at, byte }),
        any::<usize>().prop_map(Mutation::Delete),
        prop::collection::vec(any::<u8>(), 1..64).prop_map(Mutation::Append),
    ]
}

fn mutate(mut b: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    for m in muts {
        let n = b.len().max(1);
        match m {
            Mutation::Flip { at, bits } if !b.is_empty() => b[at % n] ^= bits,
            Mutation::Truncate(at) => b.truncate(at % n),
            Mutation::Insert { at, byte } => b.insert(at % (b.len() + 1), *byte),
            Mutation::Delete(at) if !b.is_empty() => {
                b.remove(at % n);
            }
            Mutation::Append(x) => b.extend_from_slice(x),
            _ => {}
        }
    }
    b
}

/// Feeds `input` to a server machine the way the socket loop sees a client:
/// each read takes at most `wants() + 1` bytes (sized by `chunks`), and
/// bytes after a verified HELLO (the client must wait for the answer) are
/// fed too. Returns the final step or rejection.
fn feed_server(
    m: &mut Acceptor,
    input: &[u8],
    chunks: &[usize],
    seen: &mut ReplayGuard,
) -> Result<Step, Reject> {
    let mut last = Ok(Step::NeedMore);
    let (mut off, mut i) = (0, 0);
    while off < input.len() {
        let n = chunks
            .get(i)
            .copied()
            .unwrap_or(usize::MAX)
            .clamp(1, m.wants() + 1)
            .min(input.len() - off);
        i += 1;
        last = m.feed(&input[off..off + n], seen);
        off += n;
        if last.is_err() {
            break;
        }
    }
    last
}

proptest! {
    #![proptest_config(cases(2000))]

    #[test]
    fn handshake_server_survives_random_bytes(
        input in prop::collection::vec(any::<u8>(), 0..400),
        chunks in prop::collection::vec(1usize..100, 0..20),
    ) {
        let k = JobSecret::new(&[1; 32]).unwrap();
        let mut m = Acceptor::new(&k, ID, 0, &EXPECTED);
        let r = feed_server(&mut m, &input, &chunks, &mut ReplayGuard::default());
        prop_assert!(!matches!(r, Ok(Step::Verified { .. })), "{:?}", r);
    }

    /// Sound: only the exact legitimate HELLO is verified, and never twice
    /// by one listener (a replay). Complete: it is verified in any chunks.
    #[test]
    fn handshake_server_accepts_only_the_exact_hello_once(
        muts in prop::collection::vec(mutation(), 0..4),
        chunks in prop::collection::vec(1usize..100, 0..20),
        secret_byte in prop_oneof![Just(1u8), any::<u8>()],
    ) {
        let k = JobSecret::new(&[1; 32]).unwrap();
        let client_k = JobSecret::new(&[secret_byte; 32]).unwrap();
        let legit = legit_hello(&client_k);
        let input = mutate(legit.clone(), &muts);
        let mut seen = ReplayGuard::default();
        let mut m = Acceptor::new(&k, ID, 0, &EXPECTED);
        let r = feed_server(&mut m, &input, &chunks, &mut seen);
        let verified = matches!(r, Ok(Step::Verified { .. }));
        let exact = input == legit && secret_byte == 1;
        prop_assert_eq!(verified, exact, "{:?}", r);
        // The same bytes again, to the same listener: a replay.
        let mut m = Acceptor::new(&k, ID, 0, &EXPECTED);
        let r = feed_server(&mut m, &input, &chunks, &mut seen);
        prop_assert!(!matches!(r, Ok(Step::Verified { .. })), "{:?}", r);
    }

    #[test]
    fn handshake_client_accepts_only_the_exact_answer(
        muts in prop::collection::vec(mutation(), 0..4),
        random in prop::collection::vec(any::<u8>(), 0..200),
        use_random in any::<bool>(),
        chunks in prop::collection::vec(1usize..100, 0..20),
    ) {
        let k = JobSecret::new(&[1; 32]).unwrap();
        let legit = legit_server_bytes(&k);
        prop_assert_eq!(legit.len(), ANSWER_BYTES);
        let input = if use_random { random } else { mutate(legit.clone(), &muts) };
        let (mut c, _) = Connector::new(&k, ID, 1, 1, 0, [3; 32]);
        let mut last = Ok(Step::NeedMore);
        let (mut off, mut i) = (0, 0);
        // The client reads exactly what it wants; feed it the same way.
        while off < input.len() && c.wants() > 0 {
            let n = chunks.get(i).copied().unwrap_or(usize::MAX)
                .clamp(1, c.wants()).min(input.len() - off);
            i += 1;
            last = c.feed(&input[off..off + n]);
            off += n;
            if last.is_err() {
                break;
            }
        }
        let done = matches!(last, Ok(Step::Done { .. }));
        prop_assert_eq!(done, input.len() >= legit.len() && input[..legit.len()] == legit[..]);
        // Surplus in one piece is refused, never read past.
        let (mut c, _) = Connector::new(&k, ID, 1, 1, 0, [3; 32]);
        let big = [legit.clone(), vec![0; 3]].concat();
        prop_assert!(c.feed(&big).is_err());
    }
}

#[test]
fn handshake_message_sizes_are_stable() {
    // The wire format: changing a size is a protocol change (bump
    // HANDSHAKE_VERSION).
    assert_eq!((HELLO_BYTES, ANSWER_BYTES), (120, 48));
}

// ------------------------------------------------------------------- frames

const GUARD: usize = 64;

#[derive(Debug, PartialEq)]
enum Outcome {
    Done,
    Failed(ErrorKind),
}

/// Receives `bytes[s]` on stream `s` into a `len`-byte sink; the sender
/// closes each stream after writing. Panics on a hang (no outcome within
/// `limit`) or a write outside the sink.
fn receive(
    bytes: Vec<Vec<u8>>,
    dtype: DType,
    len: usize,
    reduce: bool,
    chunk: usize,
) -> (Outcome, Vec<u8>, TcpLink) {
    let (tx, rx) = socket_pairs(bytes.len());
    let writer = std::thread::spawn(move || {
        let mut tx = tx;
        for (s, b) in tx.iter_mut().zip(&bytes) {
            for piece in b.chunks(chunk.max(1)) {
                if s.write_all(piece).is_err() {
                    break;
                }
            }
            let _ = s.shutdown(std::net::Shutdown::Write);
        }
        tx
    });
    let mut link = TcpLink::new(1, rx, 1).unwrap();
    // Guard bytes on both sides of the destination catch stray writes.
    let mut mem = vec![0xA5u8; len + 2 * GUARD];
    let mode = if reduce {
        SinkMode::ReduceInPlace
    } else {
        SinkMode::Copy
    };
    mem[GUARD..GUARD + len].fill(0);
    // SAFETY: `mem[GUARD..GUARD + len]` is valid for reads and writes of
    // `len` bytes, outlives the job (dropped after it below), and nothing
    // else touches it while the job runs.
    let sink = unsafe { Sink::new(mem.as_mut_ptr().add(GUARD), len, mode, dtype, ElemOp::Sum) };
    let mut job = RecvJob::new(meta(dtype, len / dtype.size()), sink);
    let limit = Instant::now() + Duration::from_secs(10);
    let outcome = loop {
        match link.recv_progress(&mut job) {
            Ok(_) if job.done => break Outcome::Done,
            Ok(true) => {}
            Ok(false) => {
                assert!(Instant::now() < limit, "hang: no outcome within 10 s");
                wait_readable(&link);
            }
            Err(e) => break Outcome::Failed(e),
        }
    };
    drop(job);
    assert!(
        mem[..GUARD].iter().all(|&b| b == 0xA5) && mem[GUARD + len..].iter().all(|&b| b == 0xA5),
        "write outside the sink"
    );
    // Unblock the writer if the receiver stopped early.
    for fd in link.fds() {
        // SAFETY: `fd` is a socket the link owns and keeps open; shutdown
        // does not close or invalidate it.
        unsafe {
            libc::shutdown(fd, libc::SHUT_RDWR);
        }
    }
    let _ = writer.join().unwrap();
    (outcome, mem[GUARD..GUARD + len].to_vec(), link)
}

fn header(frame: u8, len: u64) -> TcpHeader {
    let mut h = TcpHeader::control(meta(DType::I32, 0).header(0));
    h.base.frame = frame;
    h.base.len = len;
    h
}

/// The header of a data chunk of message 0 at byte offset `off`.
fn chunk_header(m: &OpMeta, len: usize, off: usize) -> TcpHeader {
    let mut h = TcpHeader::control(m.header(len));
    h.off = off as u64;
    h
}

/// One piece of a fuzzed stream.
#[derive(Clone, Debug)]
enum Piece {
    Raw(Vec<u8>),
    Frame {
        magic_ok: bool,
        frame: u8,
        seq_ok: bool,
        sig_ok: bool,
        /// `None`: the receiver's expected length.
        len: Option<u64>,
        payload: usize,
        garble_rest: Option<(usize, u8)>,
        /// A message number other than 0 (a later or earlier message).
        other_msg: Option<u32>,
    },
}

fn piece() -> impl Strategy<Value = Piece> {
    let frame = prop_oneof![
        4 => Just(FRAME_DATA),
        2 => Just(FRAME_ABORT),
        2 => Just(FRAME_STALL),
        1 => any::<u8>(),
    ];
    let len = prop_oneof![
        3 => Just(None),
        1 => Just(Some(0)),
        1 => prop::sample::select(vec![u64::MAX, u64::MAX / 2, 1 << 40, 4097, 65, 63, 7])
            .prop_map(Some),
        2 => (0u64..5000).prop_map(Some),
    ];
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..300).prop_map(Piece::Raw),
        4 => (
            prop::bool::weighted(0.9),
            frame,
            prop::bool::weighted(0.8),
            prop::bool::weighted(0.8),
            len,
            0usize..5000,
            prop::option::weighted(0.2, (0usize..TCP_HEADER_BYTES, 1u8..)),
            prop::option::weighted(0.1, 1u32..),
        )
            .prop_map(|(magic_ok, frame, seq_ok, sig_ok, len, payload, garble_rest, other_msg)| {
                Piece::Frame { magic_ok, frame, seq_ok, sig_ok, len, payload, garble_rest, other_msg }
            }),
    ]
}

/// The bytes of `pieces`; data frames are chunks at byte offset `off`.
fn render(pieces: &[Piece], want_len: usize, off: usize, fill: u8) -> Vec<u8> {
    let mut out = Vec::new();
    for p in pieces {
        match p {
            Piece::Raw(b) => out.extend_from_slice(b),
            Piece::Frame {
                magic_ok,
                frame,
                seq_ok,
                sig_ok,
                len,
                payload,
                garble_rest,
                other_msg,
            } => {
                let mut h = header(*frame, len.unwrap_or(want_len as u64));
                if *frame == FRAME_DATA {
                    h.off = off as u64;
                    h.msg = other_msg.unwrap_or(0);
                }
                if !magic_ok {
                    h.base.magic ^= 0x0101_0000;
                }
                if !seq_ok {
                    h.base.seq = h.base.seq.wrapping_add(1);
                }
                if !sig_ok {
                    h.base.sig ^= 0xff;
                }
                let mut hb = bytemuck::bytes_of(&h).to_vec();
                if let Some((at, x)) = garble_rest {
                    hb[*at] ^= x;
                }
                out.extend_from_slice(&hb);
                out.extend(std::iter::repeat_n(fill, *payload));
            }
        }
    }
    out
}

fn dtype() -> impl Strategy<Value = DType> {
    prop::sample::select(vec![DType::I32, DType::F64, DType::U8, DType::F16])
}

proptest! {
    #![proptest_config(cases(256))]

    #[test]
    fn frames_random_bytes_end_cleanly(
        bytes in prop::collection::vec(any::<u8>(), 0..3000),
        elems in 0usize..700,
        dt in dtype(),
        reduce in any::<bool>(),
        chunk in 1usize..4096,
    ) {
        let len = elems * dt.size();
        let (out, _, _) = receive(vec![bytes], dt, len, reduce, chunk);
        // Random bytes cannot be a header with the right magic, seq and sig
        // (2^-160); only a clean error is possible.
        prop_assert!(matches!(out, Outcome::Failed(_)), "{:?}", out);
    }

    #[test]
    fn frames_mutated_streams_end_cleanly(
        pieces in prop::collection::vec(piece(), 1..5),
        truncate in prop::option::of(any::<usize>()),
        elems in 0usize..700,
        dt in dtype(),
        reduce in any::<bool>(),
        chunk in 1usize..4096,
    ) {
        let len = elems * dt.size();
        let mut bytes = render(&pieces, len, 0, 0x11);
        if let Some(t) = truncate {
            let n = bytes.len() + 1;
            bytes.truncate(t % n);
        }
        // Any outcome is fine (a right data frame may complete, taking the
        // bytes after it as payload); `receive` checks for hangs and stray
        // writes, proptest for panics. Content is checked on valid messages
        // below.
        let _ = receive(vec![bytes], dt, len, reduce, chunk);
    }

    #[test]
    fn frames_on_two_streams_end_cleanly(
        pieces0 in prop::collection::vec(piece(), 1..3),
        pieces1 in prop::collection::vec(piece(), 1..3),
        reduce in any::<bool>(),
    ) {
        // Two chunks: one on each stream.
        let len = CHUNK_BYTES + 4096;
        let b0 = render(&pieces0, CHUNK_BYTES, 0, 0x22);
        let b1 = render(&pieces1, 4096, CHUNK_BYTES, 0x22);
        // `receive` fails the case on a hang or a stray write; beyond that a
        // message can only complete from a frame that carries the right magic
        // (one garbled byte cannot repair the two a bad magic differs in, and
        // raw bytes match it with odds of 2^-32 a position).
        let (out, _, _) = receive(vec![b0, b1], DType::I32, len, reduce, 65536);
        let has_magic = |ps: &[Piece]| {
            ps.iter().any(|p| matches!(p, Piece::Frame { magic_ok: true, .. }))
        };
        if out == Outcome::Done {
            prop_assert!(has_magic(&pieces0) || has_magic(&pieces1), "completed from garbage");
        }
    }

    #[test]
    fn frames_valid_messages_complete_with_their_bytes(
        payload in prop::collection::vec(any::<u8>(), 0..3000),
        stalls in prop::collection::vec(prop::collection::vec(any::<u32>(), 0..7), 0..3),
        reduce in any::<bool>(),
        chunk in 1usize..512,
    ) {
        let len = payload.len() / 4 * 4;
        let payload = &payload[..len];
        let mut bytes = Vec::new();
        for chain in &stalls {
            bytes.extend_from_slice(bytemuck::bytes_of(&header(FRAME_STALL, 4 * chain.len() as u64)));
            for v in chain {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
        }
        bytes.extend_from_slice(bytemuck::bytes_of(&chunk_header(&meta(DType::I32, len / 4), len, 0)));
        bytes.extend_from_slice(payload);
        let (out, data, link) = receive(vec![bytes], DType::I32, len, reduce, chunk);
        prop_assert_eq!(out, Outcome::Done);
        // Onto zeros, an i32 sum is the payload itself.
        prop_assert_eq!(&data[..], payload);
        prop_assert_eq!(link.stall.map(|s| s.chain), stalls.last().cloned());
    }
}

/// Sends, on `nstreams` loopback streams, the chunks of two messages with
/// each chunk on the stream `placement` names (message 0's chunks first on
/// every stream, then message 1's), and receives both on one link.
fn receive_two(
    payloads: [&[u8]; 2],
    placement: &[usize],
    nstreams: usize,
    reduce: bool,
) -> Vec<Result<Vec<u8>, ErrorKind>> {
    let (tx, rx) = socket_pairs(nstreams);
    let mut per_stream = vec![Vec::new(); nstreams];
    let mut k = 0;
    for (msg, payload) in payloads.iter().enumerate() {
        let m = meta(DType::I32, payload.len() / 4);
        let n = payload.len().div_ceil(CHUNK_BYTES).max(1);
        for c in 0..n {
            let off = c * CHUNK_BYTES;
            let len = CHUNK_BYTES.min(payload.len() - off);
            let mut h = chunk_header(&m, len, off);
            h.msg = msg as u32;
            let s = placement[k % placement.len()] % nstreams;
            k += 1;
            per_stream[s].extend_from_slice(bytemuck::bytes_of(&h));
            per_stream[s].extend_from_slice(&payload[off..off + len]);
        }
    }
    let writer = std::thread::spawn(move || {
        let mut tx = tx;
        // Interleave the streams' writes so arrival order is mixed too.
        let mut at = vec![0usize; tx.len()];
        while at.iter().zip(&per_stream).any(|(a, b)| a < &b.len()) {
            for (s, b) in per_stream.iter().enumerate() {
                let end = (at[s] + 50_000).min(b.len());
                if tx[s].write_all(&b[at[s]..end]).is_err() {
                    return tx;
                }
                at[s] = end;
            }
        }
        tx
    });
    let mut link = TcpLink::new(1, rx, 1).unwrap();
    let mut out = Vec::new();
    for payload in payloads {
        let r = receive_i32(&mut link, payload.len(), reduce);
        let failed = r.is_err();
        out.push(r);
        if failed {
            break;
        }
    }
    drop(link);
    let _ = writer.join().unwrap();
    out
}

proptest! {
    #![proptest_config(cases(24))]

    #[test]
    fn chunks_in_any_order_on_any_stream_make_each_message_whole(
        sizes in (0usize..5 * CHUNK_BYTES / 4, 0usize..3 * CHUNK_BYTES / 4),
        placement in prop::collection::vec(0usize..3, 1..12),
        nstreams in 1usize..4,
        reduce in any::<bool>(),
        seed in any::<u8>(),
    ) {
        let a: Vec<u8> = (0..sizes.0 * 4).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect();
        let b: Vec<u8> = (0..sizes.1 * 4).map(|i| (i as u8).wrapping_mul(13) ^ seed).collect();
        let out = receive_two([&a, &b], &placement, nstreams, reduce);
        prop_assert_eq!(out.len(), 2);
        // Onto zeros, an i32 sum is the payload itself.
        prop_assert_eq!(out[0].as_ref().unwrap(), &a);
        prop_assert_eq!(out[1].as_ref().unwrap(), &b);
    }
}

#[test]
fn a_chunk_that_arrives_twice_is_garbage_not_a_double_sum() {
    // Message 0 of two chunks whose second frame repeats the first chunk.
    let (tx, rx) = socket_pairs(2);
    let len = CHUNK_BYTES + 64;
    let m = meta(DType::I32, len / 4);
    let mut bytes = Vec::new();
    for _ in 0..2 {
        bytes.extend_from_slice(bytemuck::bytes_of(&chunk_header(&m, CHUNK_BYTES, 0)));
        bytes.extend(std::iter::repeat_n(1u8, CHUNK_BYTES));
    }
    let mut tx = tx;
    tx[0].write_all(&bytes).unwrap();
    let mut link = TcpLink::new(1, rx, 1).unwrap();
    let mut mem = vec![0u8; len];
    // SAFETY: `mem` is valid for `len` bytes and outlives the job.
    let sink = unsafe {
        Sink::new(
            mem.as_mut_ptr(),
            len,
            SinkMode::ReduceInPlace,
            DType::I32,
            ElemOp::Sum,
        )
    };
    let mut job = RecvJob::new(m, sink);
    let limit = Instant::now() + Duration::from_secs(10);
    let err = loop {
        match link.recv_progress(&mut job) {
            Err(e) => break e,
            Ok(_) => {
                assert!(!job.done, "a repeated chunk completed the message");
                assert!(Instant::now() < limit, "hang");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    };
    assert!(
        matches!(&err, ErrorKind::Garbage { detail, .. } if detail.contains("twice")),
        "{err:?}"
    );
    drop(job);
}

#[test]
fn a_message_on_one_stream_is_received_after_the_peer_closed_another() {
    // The peer sent its last message on stream 1 and closed both streams:
    // the end of stream 0 must not hide the message waiting on stream 1.
    let (tx, rx) = socket_pairs(2);
    let m = meta(DType::I32, 4);
    let mut tx = tx;
    tx[1]
        .write_all(bytemuck::bytes_of(&chunk_header(&m, 16, 0)))
        .unwrap();
    tx[1].write_all(&[7u8; 16]).unwrap();
    for s in &tx {
        s.shutdown(std::net::Shutdown::Write).unwrap();
    }
    let mut link = TcpLink::new(1, rx, 1).unwrap();
    let mut mem = [0u8; 16];
    // SAFETY: `mem` is valid for 16 bytes and outlives the job.
    let sink = unsafe {
        Sink::new(
            mem.as_mut_ptr(),
            16,
            SinkMode::Copy,
            DType::I32,
            ElemOp::Sum,
        )
    };
    let mut job = RecvJob::new(m, sink);
    let limit = Instant::now() + Duration::from_secs(10);
    while !job.done {
        link.recv_progress(&mut job)
            .expect("the message on stream 1 is received");
        assert!(Instant::now() < limit, "hang");
    }
    drop(job);
    assert_eq!(mem, [7u8; 16]);
    // The next receive finds every stream closed: a clean error, no hang.
    let mut mem2 = [0u8; 16];
    // SAFETY: as above.
    let sink = unsafe {
        Sink::new(
            mem2.as_mut_ptr(),
            16,
            SinkMode::Copy,
            DType::I32,
            ElemOp::Sum,
        )
    };
    let mut job = RecvJob::new(m, sink);
    let err = loop {
        match link.recv_progress(&mut job) {
            Err(e) => break e,
            Ok(_) => assert!(Instant::now() < limit, "hang"),
        }
    };
    assert!(matches!(err, ErrorKind::PeerClosed { .. }), "{err:?}");
}
