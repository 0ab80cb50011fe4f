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

use cadence_core::transport::handshake::{
    Acceptor, Connector, JobSecret, Reject, Step, CHALLENGE_BYTES, HELLO_BYTES, PROOF_BYTES,
    WELCOME_BYTES,
};
use cadence_core::transport::tcp::{poll_fds, TcpLink, STRIPE_MIN};
use cadence_core::transport::{
    OpMeta, RecvJob, Sink, SinkMode, WireHeader, FRAME_ABORT, FRAME_DATA, FRAME_STALL, HEADER_BYTES,
};
use cadence_core::types::ElemOp;
use cadence_core::{CollKind, DType, ErrorKind, RedOp};
use proptest::prelude::*;
use proptest::test_runner::Config as PtConfig;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Cases per property: `PROPTEST_CASES`, else `default` (the `cargo test`
/// budget).
fn cases(default: u32) -> PtConfig {
    let n = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    PtConfig {
        cases: n,
        failure_persistence: None,
        ..PtConfig::default()
    }
}

// ---------------------------------------------------------------- handshake

const ID: &str = "fuzz-comm";
const EXPECTED: [(usize, usize); 2] = [(1, 0), (1, 1)];

fn legit_client_bytes(secret: &JobSecret, server_nonce: [u8; 32]) -> (Vec<u8>, Vec<u8>) {
    let mut s = Acceptor::new(secret, ID, 0, &EXPECTED, server_nonce);
    let (mut c, hello) = Connector::new(secret, ID, 1, 1, 0, [3; 32]);
    let Ok(Step::Send(ch)) = s.feed(&hello) else {
        unreachable!()
    };
    let Ok(Step::Send(proof)) = c.feed(&ch) else {
        unreachable!()
    };
    (hello, proof)
}

fn legit_server_bytes(secret: &JobSecret) -> Vec<u8> {
    let mut s = Acceptor::new(secret, ID, 0, &EXPECTED, [4; 32]);
    let (mut c, hello) = Connector::new(secret, ID, 1, 1, 0, [3; 32]);
    let Ok(Step::Send(mut ch)) = s.feed(&hello) else {
        unreachable!()
    };
    let Ok(Step::Send(proof)) = c.feed(&ch) else {
        unreachable!()
    };
    let Ok(Step::Done { send, .. }) = s.feed(&proof) else {
        unreachable!()
    };
    ch.extend_from_slice(&send);
    ch
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
/// `input[..turn]` arrives before the server answers, the rest after; each
/// read takes at most `wants() + 1` bytes (sized by `chunks`). Returns the
/// final step or rejection.
fn feed_server(
    m: &mut Acceptor,
    input: &[u8],
    turn: usize,
    chunks: &[usize],
) -> Result<Step, Reject> {
    let turn = turn.min(input.len());
    let mut last = Ok(Step::NeedMore);
    let mut i = 0;
    for part in [&input[..turn], &input[turn..]] {
        let mut off = 0;
        while off < part.len() {
            let n = chunks
                .get(i)
                .copied()
                .unwrap_or(usize::MAX)
                .clamp(1, m.wants() + 1)
                .min(part.len() - off);
            i += 1;
            last = m.feed(&part[off..off + n]);
            off += n;
            match &last {
                Err(_) => return last,
                // Bytes after the proof, before our welcome: refused.
                Ok(Step::Done { .. }) if off < part.len() => return m.feed(&part[off..]),
                _ => {}
            }
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
        turn in any::<usize>(),
    ) {
        let k = JobSecret::new(&[1; 32]).unwrap();
        let mut m = Acceptor::new(&k, ID, 0, &EXPECTED, [4; 32]);
        let r = feed_server(&mut m, &input, turn, &chunks);
        prop_assert!(!matches!(r, Ok(Step::Done { .. })), "{:?}", r);
    }

    /// Sound: only the exact legitimate transcript succeeds, and never
    /// against another server nonce (a replay). Complete: it succeeds when
    /// the client waits its turn.
    #[test]
    fn handshake_server_accepts_only_the_exact_transcript(
        muts in prop::collection::vec(mutation(), 0..4),
        chunks in prop::collection::vec(1usize..100, 0..20),
        secret_byte in prop_oneof![Just(1u8), any::<u8>()],
        turn in prop_oneof![Just(HELLO_BYTES), any::<usize>()],
    ) {
        let k = JobSecret::new(&[1; 32]).unwrap();
        let client_k = JobSecret::new(&[secret_byte; 32]).unwrap();
        let (hello, proof) = legit_client_bytes(&client_k, [4; 32]);
        let legit: Vec<u8> = [hello, proof].concat();
        let input = mutate(legit.clone(), &muts);
        let mut m = Acceptor::new(&k, ID, 0, &EXPECTED, [4; 32]);
        let r = feed_server(&mut m, &input, turn, &chunks);
        let done = matches!(r, Ok(Step::Done { .. }));
        let exact = input == legit && secret_byte == 1;
        prop_assert!(!done || exact, "{:?}", r);
        prop_assert!(done || !(exact && turn == HELLO_BYTES), "{:?}", r);
        // A different server nonce (a new connection) refuses even the
        // exact transcript: a replay.
        let mut m = Acceptor::new(&k, ID, 0, &EXPECTED, [5; 32]);
        let r = feed_server(&mut m, &input, turn, &chunks);
        prop_assert!(!matches!(r, Ok(Step::Done { .. })), "{:?}", r);
    }

    #[test]
    fn handshake_client_accepts_only_the_exact_answers(
        muts in prop::collection::vec(mutation(), 0..4),
        random in prop::collection::vec(any::<u8>(), 0..200),
        use_random in any::<bool>(),
        chunks in prop::collection::vec(1usize..100, 0..20),
    ) {
        let k = JobSecret::new(&[1; 32]).unwrap();
        let legit = legit_server_bytes(&k);
        prop_assert_eq!(legit.len(), CHALLENGE_BYTES + WELCOME_BYTES);
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
    assert_eq!(
        (HELLO_BYTES, CHALLENGE_BYTES, PROOF_BYTES, WELCOME_BYTES),
        (88, 80, 40, 8)
    );
}

// ------------------------------------------------------------------- frames

const SEQ: u64 = 5;
const SIG: u64 = 0x5151_abcd_0000_1234;
const GUARD: usize = 64;

fn meta(dtype: DType, count: usize) -> OpMeta {
    OpMeta {
        coll: CollKind::AllReduce,
        dtype,
        redop: RedOp::Sum.code(),
        root: 0,
        seq: SEQ,
        sig: SIG,
        count: count as u64,
    }
}

/// `n` connected loopback pairs: (sending ends, receiving ends).
fn socket_pairs(n: usize) -> (Vec<TcpStream>, Vec<TcpStream>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let mut tx = Vec::new();
    let mut rx = Vec::new();
    for _ in 0..n {
        tx.push(TcpStream::connect(addr).unwrap());
        rx.push(l.accept().unwrap().0);
    }
    (tx, rx)
}

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
    let mut link = TcpLink::new(1, rx).unwrap();
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
                let mut fds: Vec<libc::pollfd> = link
                    .fds()
                    .map(|fd| libc::pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    })
                    .collect();
                poll_fds(&mut fds, Duration::from_millis(10));
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

fn header(frame: u8, len: u64) -> WireHeader {
    let mut h = meta(DType::I32, 0).header(0);
    h.frame = frame;
    h.len = len;
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
            prop::option::weighted(0.2, (0usize..HEADER_BYTES, 1u8..)),
        )
            .prop_map(|(magic_ok, frame, seq_ok, sig_ok, len, payload, garble_rest)| {
                Piece::Frame { magic_ok, frame, seq_ok, sig_ok, len, payload, garble_rest }
            }),
    ]
}

fn render(pieces: &[Piece], want_len: usize, fill: u8) -> Vec<u8> {
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
            } => {
                let mut h = header(*frame, len.unwrap_or(want_len as u64));
                if !magic_ok {
                    h.magic ^= 0x0101_0000;
                }
                if !seq_ok {
                    h.seq = h.seq.wrapping_add(1);
                }
                if !sig_ok {
                    h.sig ^= 0xff;
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
        let mut bytes = render(&pieces, len, 0x11);
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
        // Large enough to stripe over both streams.
        let len = STRIPE_MIN + 4096;
        let half = len / 2;
        let b0 = render(&pieces0, half, 0x22);
        let b1 = render(&pieces1, len - half, 0x22);
        let (_out, _, _) = receive(vec![b0, b1], DType::I32, len, reduce, 65536);
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
        bytes.extend_from_slice(bytemuck::bytes_of(&meta(DType::I32, len / 4).header(len)));
        bytes.extend_from_slice(payload);
        let (out, data, link) = receive(vec![bytes], DType::I32, len, reduce, chunk);
        prop_assert_eq!(out, Outcome::Done);
        // Onto zeros, an i32 sum is the payload itself.
        prop_assert_eq!(&data[..], payload);
        prop_assert_eq!(link.stall.map(|s| s.chain), stalls.last().cloned());
    }
}
