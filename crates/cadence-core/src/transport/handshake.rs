//! The connection handshake: every TCP connection proves that it belongs to
//! the job before it carries a single frame.
//!
//! Terms:
//! - **job secret**: 32 random bytes that rank 0 of a communicator makes and
//!   shares through the Store ([`JobSecret`]). It never travels on a cadence
//!   connection; it only keys the MACs below.
//! - **client**: the side that connects; **server**: the side that accepts.
//! - **nonce**: 32 fresh random bytes the client picks per connection.
//! - **binding**: (communicator id, version, client rank, stream, server
//!   rank, client nonce).
//! - **tag**: HMAC-SHA256 under the job secret over a direction label and
//!   the binding (the server's also over its answer).
//!
//! One round trip: the client proves itself in its first message, so a
//! link's streams all connect in one flight and the first message to a new
//! peer waits for one handshake round trip, not two per stream:
//!
//! ```text
//! client                                              server
//!   HELLO     comm id, rank, stream, server rank,
//!             client nonce, client tag            ─▶  right magic/version/
//!                                                     communicator, expected
//!                                                     rank, the client tag, a
//!                                                     nonce never seen before
//!                                                 ◀─  WELCOME  keep or drop,
//!   checks the server tag: the listener knows the         server tag
//!   secret and answered *this* hello                  (or REFUSE  why)
//! ```
//!
//! Freshness: without a server nonce, what stops a recorded HELLO from
//! being replayed on a new connection is the server's memory of the client
//! nonces it accepted ([`ReplayGuard`], one per listener's life: a new
//! communicator has a new id, so a new binding). The two tags use
//! different labels, so neither side's tag can be reflected back as the
//! other's; the server's covers its keep/drop answer. A listener that does
//! not know the secret learns a client tag it can only spend once, at the
//! one listener it names. Nothing here does I/O: [`Acceptor`] and
//! [`Connector`] take the bytes that arrived and say what to send, so they
//! are tested and fuzzed in one process; `transport::setup` drives them
//! over sockets.

use super::MAGIC;
use bytemuck::{Pod, Zeroable};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use std::collections::HashSet;
use std::fmt;

pub const HANDSHAKE_VERSION: u32 = 3;
pub const NONCE_BYTES: usize = 32;
pub const TAG_BYTES: usize = 32;

const KIND_HELLO: u32 = 1;
const KIND_WELCOME: u32 = 4;
const KIND_REFUSE: u32 = 5;

const LABEL_SERVER: &[u8] = b"cadence handshake v3: server";
const LABEL_CLIENT: &[u8] = b"cadence handshake v3: client";

/// (peer rank, stream index) of a connection.
pub type StreamKey = (usize, usize);

/// Which connections an acceptor takes.
#[derive(Clone, Copy)]
pub enum Expected<'a> {
    /// Exactly these streams (set-up: accepting ends once each is in).
    These(&'a [StreamKey]),
    /// Any stream the rule admits (links made on first use: accepting goes
    /// on for the communicator's life; a list would grow with the job).
    Admitted(&'a dyn Fn(StreamKey) -> bool),
}

impl Expected<'_> {
    pub fn admits(&self, key: StreamKey) -> bool {
        match self {
            Expected::These(keys) => keys.contains(&key),
            Expected::Admitted(rule) => rule(key),
        }
    }
}

impl<'a> From<&'a [StreamKey]> for Expected<'a> {
    fn from(keys: &'a [StreamKey]) -> Self {
        Expected::These(keys)
    }
}

impl<'a, const N: usize> From<&'a [StreamKey; N]> for Expected<'a> {
    fn from(keys: &'a [StreamKey; N]) -> Self {
        Expected::These(keys)
    }
}

impl<'a> From<&'a Vec<StreamKey>> for Expected<'a> {
    fn from(keys: &'a Vec<StreamKey>) -> Self {
        Expected::These(keys)
    }
}

/// The per-job secret. Kept in memory only; its `Debug` does not show it.
#[derive(Clone)]
pub struct JobSecret(Box<[u8]>);

impl JobSecret {
    /// Refuses an empty secret: a job without one would accept anybody.
    pub fn new(bytes: &[u8]) -> Result<JobSecret, String> {
        if bytes.is_empty() {
            return Err("the job secret is empty (every communicator needs one; \
                 cadence.init() makes 32 random bytes and shares them through the store)"
                .into());
        }
        Ok(JobSecret(bytes.into()))
    }

    /// 32 bytes from the operating system's random source.
    pub fn random() -> Result<JobSecret, String> {
        let mut b = [0u8; 32];
        getrandom::fill(&mut b).map_err(|e| format!("no randomness: {e}"))?;
        Ok(JobSecret(b.into()))
    }

    fn mac(&self) -> Hmac<Sha256> {
        // HMAC takes keys of any length.
        Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC accepts any key length")
    }
}

impl fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JobSecret({} bytes, hidden)", self.0.len())
    }
}

/// Fresh random bytes for one handshake.
pub fn fresh_nonce() -> Result<[u8; NONCE_BYTES], String> {
    let mut n = [0u8; NONCE_BYTES];
    getrandom::fill(&mut n).map_err(|e| format!("no randomness: {e}"))?;
    Ok(n)
}

/// A communicator id as it travels (padded/truncated to 32 bytes; the
/// bootstrap only accepts ids of at most 32 characters).
pub fn comm_id_bytes(id: &str) -> [u8; 32] {
    let mut out = [0u8; 32];
    let b = id.as_bytes();
    let n = b.len().min(32);
    out[..n].copy_from_slice(&b[..n]);
    out
}

/// Client → server: who it is, and its proof.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct Hello {
    pub magic: u32,
    pub kind: u32,
    pub version: u32,
    pub rank: u32,
    pub stream: u32,
    /// The rank the client believes it is connecting to.
    pub server_rank: u32,
    pub comm_id: [u8; 32],
    pub nonce: [u8; NONCE_BYTES],
    pub tag: [u8; TAG_BYTES],
}

/// Server → client: WELCOME (`word`: 1 keep, 0 drop: the server keeps its
/// own link to the client instead, see `comm/lazy.rs`; `tag`: the server's)
/// or REFUSE (`word`: a [`Reject`] code; `tag` zero). One size, so the
/// client reads exactly one answer and frames follow.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct Answer {
    pub magic: u32,
    pub kind: u32,
    pub version: u32,
    pub word: u32,
    pub tag: [u8; TAG_BYTES],
}

pub const HELLO_BYTES: usize = std::mem::size_of::<Hello>();
pub const ANSWER_BYTES: usize = std::mem::size_of::<Answer>();

/// Why a handshake failed. The `Display` text completes "dropped connection
/// from ADDR: ..." (server) or "rank R at ADDR ..." (client).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Reject {
    #[error("not a cadence handshake (first bytes {0})")]
    Garbage(String),
    #[error("handshake version {theirs} (this build speaks {ours}): a different cadence version")]
    Version { theirs: u32, ours: u32 },
    #[error("member of another communicator ({0:?})")]
    OtherComm(String),
    #[error("meant for rank {meant}, but this is rank {me}")]
    WrongRank { meant: u32, me: u32 },
    #[error("unexpected rank {rank} stream {stream}")]
    Unexpected { rank: u32, stream: u32 },
    #[error("failed to prove membership of the job (wrong job secret, or a forged handshake)")]
    BadProof,
    #[error("replayed a handshake this listener already accepted")]
    Replayed,
    #[error("sent {extra} bytes beyond its handshake message")]
    Oversize { extra: usize },
    #[error("handshake already finished")]
    Finished,
    /// What a client hears when the server refused it (the server's reason).
    #[error("the listener refused this rank's handshake: {0}")]
    Refused(String),
}

impl Reject {
    /// What a REFUSE carries: why, as a code a client of this version can
    /// name (0: a reason this client cannot tell apart).
    fn code(&self) -> u32 {
        match self {
            Reject::Version { .. } => 1,
            Reject::OtherComm(_) => 2,
            Reject::WrongRank { .. } => 3,
            Reject::Unexpected { .. } => 4,
            Reject::BadProof => 5,
            Reject::Replayed => 6,
            _ => 0,
        }
    }

    fn explain(code: u32) -> &'static str {
        match code {
            1 => "it speaks another handshake version (a different cadence version)",
            2 => "it belongs to another communicator (a stale address)",
            3 => "it is not the rank this rank meant to reach (a stale address)",
            4 => "it does not expect this rank's stream",
            5 => {
                "this rank failed to prove membership (a different job secret: \
                  another job's process, or a stale address)"
            }
            6 => "it saw this handshake's nonce before",
            _ => "no reason given",
        }
    }

    /// The REFUSE a server sends before it closes, for rejections of a
    /// well-formed HELLO (garbage and strangers that say nothing get only
    /// the close). A client that is a member learns at once why it is not
    /// let in; anybody else learns nothing a close would not tell.
    pub fn refusal(&self) -> Option<Vec<u8>> {
        let code = self.code();
        (code != 0).then(|| {
            bytemuck::bytes_of(&Answer {
                magic: MAGIC,
                kind: KIND_REFUSE,
                version: HANDSHAKE_VERSION,
                word: code,
                tag: [0; TAG_BYTES],
            })
            .to_vec()
        })
    }
}

fn hex_prefix(b: &[u8]) -> String {
    let mut s: String = b.iter().take(8).map(|x| format!("{x:02x}")).collect();
    if b.len() > 8 {
        s.push('…');
    }
    let printable: String = b
        .iter()
        .take(16)
        .map(|&c| {
            if (0x20..0x7f).contains(&c) {
                c as char
            } else {
                '.'
            }
        })
        .collect();
    format!("{s} {printable:?}")
}

/// The connection's binding, MACed by both sides under their own label.
#[derive(Clone, Copy)]
struct Binding {
    comm_id: [u8; 32],
    client: u32,
    stream: u32,
    server: u32,
    nonce: [u8; NONCE_BYTES],
}

impl Binding {
    /// `answer`: the server's keep word (its tag covers it); none for the
    /// client's.
    fn mac(&self, secret: &JobSecret, label: &[u8], answer: Option<u32>) -> Hmac<Sha256> {
        let mut m = secret.mac();
        m.update(label);
        m.update(&self.comm_id);
        m.update(&HANDSHAKE_VERSION.to_le_bytes());
        m.update(&self.client.to_le_bytes());
        m.update(&self.stream.to_le_bytes());
        m.update(&self.server.to_le_bytes());
        m.update(&self.nonce);
        if let Some(w) = answer {
            m.update(&w.to_le_bytes());
        }
        m
    }
    fn tag(&self, secret: &JobSecret, label: &[u8], answer: Option<u32>) -> [u8; TAG_BYTES] {
        self.mac(secret, label, answer)
            .finalize()
            .into_bytes()
            .into()
    }
    /// Constant-time comparison (the `hmac` crate's).
    fn verify(&self, secret: &JobSecret, label: &[u8], answer: Option<u32>, tag: &[u8]) -> bool {
        self.mac(secret, label, answer).verify_slice(tag).is_ok()
    }
}

/// The client nonces a listener accepted, for its life: a recorded HELLO
/// is refused on any later connection. Grows by one entry per accepted
/// connection (the links a rank's peers make to it), never with the job.
#[derive(Default)]
pub struct ReplayGuard(HashSet<[u8; NONCE_BYTES]>);

impl ReplayGuard {
    /// Whether `nonce` is new (and remembers it).
    pub fn fresh(&mut self, nonce: &[u8; NONCE_BYTES]) -> bool {
        self.0.insert(*nonce)
    }
}

/// What a machine wants after being fed.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// The current message is incomplete: feed more bytes.
    NeedMore,
    /// Server: the client proved itself as `key`, with a nonce the server
    /// has not seen ([`ReplayGuard`]); answer with [`Acceptor::welcome`].
    Verified { key: StreamKey },
    /// Client: the server proved itself and keeps the connection (`keep`)
    /// or drops it for its own; frames follow.
    Done { key: StreamKey, keep: bool },
}

/// Collects one fixed-size message; checks the leading magic and kind as
/// soon as they arrive so garbage is refused at once, not after a timeout.
struct Incoming {
    buf: Vec<u8>,
}

impl Incoming {
    fn new() -> Incoming {
        Incoming {
            buf: Vec::with_capacity(HELLO_BYTES),
        }
    }

    /// Takes bytes towards a `size`-byte message of one of `kinds`. Returns
    /// the whole message once complete.
    fn take(&mut self, data: &[u8], size: usize, kinds: &[u32]) -> Result<Option<Vec<u8>>, Reject> {
        let want = size - self.buf.len();
        self.buf.extend_from_slice(&data[..data.len().min(want)]);
        let b = &self.buf;
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if b.len() >= 4 && word(0) != MAGIC {
            return Err(Reject::Garbage(hex_prefix(b)));
        }
        if b.len() >= 8 && !kinds.contains(&word(4)) {
            return Err(Reject::Garbage(hex_prefix(b)));
        }
        if data.len() > want {
            // Lock-step: the peer must wait for our answer before sending
            // more, so surplus bytes mean it does not speak this protocol.
            return Err(Reject::Oversize {
                extra: data.len() - want,
            });
        }
        if b.len() < size {
            return Ok(None);
        }
        Ok(Some(std::mem::take(&mut self.buf)))
    }

    fn len(&self) -> usize {
        self.buf.len()
    }
}

enum AcceptState {
    AwaitHello,
    Verified(Binding),
    Done,
    Failed(Reject),
}

/// The server side of one connection.
pub struct Acceptor<'a> {
    secret: &'a JobSecret,
    comm_id: [u8; 32],
    my_rank: u32,
    expected: Expected<'a>,
    incoming: Incoming,
    state: AcceptState,
}

impl<'a> Acceptor<'a> {
    pub fn new(
        secret: &'a JobSecret,
        comm_id: &str,
        my_rank: usize,
        expected: impl Into<Expected<'a>>,
    ) -> Acceptor<'a> {
        Acceptor {
            secret,
            comm_id: comm_id_bytes(comm_id),
            my_rank: my_rank as u32,
            expected: expected.into(),
            incoming: Incoming::new(),
            state: AcceptState::AwaitHello,
        }
    }

    /// Bytes still missing from the message being received (0 when none is
    /// expected).
    pub fn wants(&self) -> usize {
        match self.state {
            AcceptState::AwaitHello => HELLO_BYTES - self.incoming.len(),
            _ => 0,
        }
    }

    /// Bytes received so far of the current message (for "timed out after N
    /// bytes").
    pub fn partial(&self) -> usize {
        self.incoming.len()
    }

    /// Feeds bytes from the client; `seen` holds the nonces this listener
    /// accepted. A rejection is final: later calls return it again.
    pub fn feed(&mut self, data: &[u8], seen: &mut ReplayGuard) -> Result<Step, Reject> {
        let r = self.step(data, seen);
        if let Err(e) = &r {
            self.state = AcceptState::Failed(e.clone());
        }
        r
    }

    fn step(&mut self, data: &[u8], seen: &mut ReplayGuard) -> Result<Step, Reject> {
        match &self.state {
            AcceptState::Failed(e) => Err(e.clone()),
            AcceptState::Verified(_) | AcceptState::Done if data.is_empty() => {
                Err(Reject::Finished)
            }
            // The client waits for the answer before sending more.
            AcceptState::Verified(_) | AcceptState::Done => {
                Err(Reject::Oversize { extra: data.len() })
            }
            AcceptState::AwaitHello => {
                let Some(msg) = self.incoming.take(data, HELLO_BYTES, &[KIND_HELLO])? else {
                    return Ok(Step::NeedMore);
                };
                let h: Hello = bytemuck::pod_read_unaligned(&msg);
                if h.version != HANDSHAKE_VERSION {
                    return Err(Reject::Version {
                        theirs: h.version,
                        ours: HANDSHAKE_VERSION,
                    });
                }
                if h.comm_id != self.comm_id {
                    let end = h.comm_id.iter().position(|&c| c == 0).unwrap_or(32);
                    return Err(Reject::OtherComm(
                        String::from_utf8_lossy(&h.comm_id[..end]).into_owned(),
                    ));
                }
                if h.server_rank != self.my_rank {
                    return Err(Reject::WrongRank {
                        meant: h.server_rank,
                        me: self.my_rank,
                    });
                }
                if !self.expected.admits((h.rank as usize, h.stream as usize)) {
                    return Err(Reject::Unexpected {
                        rank: h.rank,
                        stream: h.stream,
                    });
                }
                let b = Binding {
                    comm_id: self.comm_id,
                    client: h.rank,
                    stream: h.stream,
                    server: self.my_rank,
                    nonce: h.nonce,
                };
                if !b.verify(self.secret, LABEL_CLIENT, None, &h.tag) {
                    return Err(Reject::BadProof);
                }
                // Only after the tag: strangers cannot fill the guard.
                if !seen.fresh(&h.nonce) {
                    return Err(Reject::Replayed);
                }
                self.state = AcceptState::Verified(b);
                Ok(Step::Verified {
                    key: (h.rank as usize, h.stream as usize),
                })
            }
        }
    }

    /// The WELCOME for a verified client: `keep` the connection, or drop it
    /// (the server keeps its own link to the client instead). Once only.
    pub fn welcome(&mut self, keep: bool) -> Result<Vec<u8>, Reject> {
        let AcceptState::Verified(b) = self.state else {
            return Err(Reject::Finished);
        };
        self.state = AcceptState::Done;
        let word = u32::from(keep);
        Ok(bytemuck::bytes_of(&Answer {
            magic: MAGIC,
            kind: KIND_WELCOME,
            version: HANDSHAKE_VERSION,
            word,
            tag: b.tag(self.secret, LABEL_SERVER, Some(word)),
        })
        .to_vec())
    }
}

enum ConnectState {
    AwaitAnswer,
    Done,
    Failed(Reject),
}

/// The client side of one connection. Owns a copy of the secret, so a
/// connection under way can outlive the caller's borrow (links made on
/// first use are driven by the engine's loop).
pub struct Connector {
    secret: JobSecret,
    binding: Binding,
    incoming: Incoming,
    state: ConnectState,
}

impl Connector {
    /// Returns the machine and the HELLO to send first. `nonce` must be
    /// fresh for every connection ([`fresh_nonce`]).
    pub fn new(
        secret: &JobSecret,
        comm_id: &str,
        my_rank: usize,
        stream: usize,
        server_rank: usize,
        nonce: [u8; NONCE_BYTES],
    ) -> (Connector, Vec<u8>) {
        let binding = Binding {
            comm_id: comm_id_bytes(comm_id),
            client: my_rank as u32,
            stream: stream as u32,
            server: server_rank as u32,
            nonce,
        };
        let h = Hello {
            magic: MAGIC,
            kind: KIND_HELLO,
            version: HANDSHAKE_VERSION,
            rank: binding.client,
            stream: binding.stream,
            server_rank: binding.server,
            comm_id: binding.comm_id,
            nonce,
            tag: binding.tag(secret, LABEL_CLIENT, None),
        };
        let c = Connector {
            secret: secret.clone(),
            binding,
            incoming: Incoming::new(),
            state: ConnectState::AwaitAnswer,
        };
        (c, bytemuck::bytes_of(&h).to_vec())
    }

    /// Bytes still missing from the answer. The socket driver reads exactly
    /// this many: after WELCOME come frames.
    pub fn wants(&self) -> usize {
        match self.state {
            ConnectState::AwaitAnswer => ANSWER_BYTES - self.incoming.len(),
            _ => 0,
        }
    }

    /// Feeds bytes from the server. A rejection is final.
    pub fn feed(&mut self, data: &[u8]) -> Result<Step, Reject> {
        let r = self.step(data);
        if let Err(e) = &r {
            self.state = ConnectState::Failed(e.clone());
        }
        r
    }

    fn step(&mut self, data: &[u8]) -> Result<Step, Reject> {
        match &self.state {
            ConnectState::Failed(e) => Err(e.clone()),
            ConnectState::Done => Err(Reject::Finished),
            ConnectState::AwaitAnswer => {
                let kinds = [KIND_WELCOME, KIND_REFUSE];
                let Some(msg) = self.incoming.take(data, ANSWER_BYTES, &kinds)? else {
                    return Ok(Step::NeedMore);
                };
                let a: Answer = bytemuck::pod_read_unaligned(&msg);
                if a.kind == KIND_REFUSE {
                    return Err(Reject::Refused(Reject::explain(a.word).into()));
                }
                if a.version != HANDSHAKE_VERSION {
                    return Err(Reject::Version {
                        theirs: a.version,
                        ours: HANDSHAKE_VERSION,
                    });
                }
                if a.word > 1
                    || !self
                        .binding
                        .verify(&self.secret, LABEL_SERVER, Some(a.word), &a.tag)
                {
                    return Err(Reject::BadProof);
                }
                self.state = ConnectState::Done;
                Ok(Step::Done {
                    key: (self.binding.server as usize, self.binding.stream as usize),
                    keep: a.word == 1,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "job-a";

    fn secret(b: u8) -> JobSecret {
        JobSecret::new(&[b; 32]).unwrap()
    }

    /// Runs a whole handshake in memory; returns (server result, client
    /// result, the HELLO).
    fn run(
        server_secret: &JobSecret,
        client_secret: &JobSecret,
        server_id: &str,
        client_id: &str,
    ) -> (Result<Step, Reject>, Result<Step, Reject>, Vec<u8>) {
        let expected = [(1, 0)];
        let mut s = Acceptor::new(server_secret, server_id, 0, &expected);
        let (mut c, hello) = Connector::new(client_secret, client_id, 1, 0, 0, [9; 32]);
        let sv = s.feed(&hello, &mut ReplayGuard::default());
        let answer = match &sv {
            Ok(Step::Verified { .. }) => s.welcome(true).unwrap(),
            Err(r) => match r.refusal() {
                Some(b) => b,
                None => return (sv, Ok(Step::NeedMore), hello),
            },
            _ => return (sv, Ok(Step::NeedMore), hello),
        };
        (sv, c.feed(&answer), hello)
    }

    #[test]
    fn good_pair_completes_both_ways_in_one_round_trip() {
        let k = secret(1);
        let (s, c, _) = run(&k, &k, ID, ID);
        assert_eq!(s, Ok(Step::Verified { key: (1, 0) }));
        assert_eq!(
            c,
            Ok(Step::Done {
                key: (0, 0),
                keep: true
            })
        );
    }

    #[test]
    fn the_servers_drop_reaches_the_client_and_is_covered_by_its_tag() {
        let k = secret(1);
        let expected = [(1, 0)];
        let mut s = Acceptor::new(&k, ID, 0, &expected);
        let (mut c, hello) = Connector::new(&k, ID, 1, 0, 0, [9; 32]);
        s.feed(&hello, &mut ReplayGuard::default()).unwrap();
        let drop = s.welcome(false).unwrap();
        assert_eq!(
            c.feed(&drop),
            Ok(Step::Done {
                key: (0, 0),
                keep: false
            })
        );
        assert_eq!(s.welcome(true), Err(Reject::Finished), "once only");
        // Flipped to keep on the way: the tag no longer matches.
        let mut flipped: Answer = bytemuck::pod_read_unaligned(&drop);
        flipped.word = 1;
        let (mut c, _) = Connector::new(&k, ID, 1, 0, 0, [9; 32]);
        assert_eq!(c.feed(bytemuck::bytes_of(&flipped)), Err(Reject::BadProof));
    }

    #[test]
    fn an_acceptor_by_rule_admits_what_the_rule_admits() {
        let k = secret(1);
        // Ranks 1..4, two streams each, as links made on first use admit.
        let rule = |(rank, stream): StreamKey| (1..4).contains(&rank) && stream < 2;
        for (rank, stream, admitted) in [(1, 0, true), (3, 1, true), (4, 0, false), (2, 2, false)] {
            let mut s = Acceptor::new(&k, ID, 0, Expected::Admitted(&rule));
            let (_, hello) = Connector::new(&k, ID, rank, stream, 0, [9; 32]);
            let got = s.feed(&hello, &mut ReplayGuard::default());
            if admitted {
                assert!(
                    matches!(got, Ok(Step::Verified { .. })),
                    "{rank}/{stream}: {got:?}"
                );
            } else {
                assert!(
                    matches!(got, Err(Reject::Unexpected { .. })),
                    "{rank}/{stream}: {got:?}"
                );
            }
        }
    }

    #[test]
    fn byte_at_a_time_is_the_same() {
        let k = secret(1);
        let expected = [(1, 0)];
        let mut s = Acceptor::new(&k, ID, 0, &expected);
        let (mut c, hello) = Connector::new(&k, ID, 1, 0, 0, [9; 32]);
        let mut seen = ReplayGuard::default();
        let mut last = Step::NeedMore;
        for b in &hello {
            last = s.feed(std::slice::from_ref(b), &mut seen).unwrap();
        }
        assert_eq!(last, Step::Verified { key: (1, 0) });
        for b in &s.welcome(true).unwrap() {
            last = c.feed(std::slice::from_ref(b)).unwrap();
        }
        assert_eq!(
            last,
            Step::Done {
                key: (0, 0),
                keep: true
            }
        );
    }

    #[test]
    fn wrong_secret_is_refused_by_both_sides_and_the_client_hears_why() {
        // The server refuses a client that does not know its secret.
        let (s, c, _) = run(&secret(1), &secret(2), ID, ID);
        assert_eq!(s, Err(Reject::BadProof));
        assert!(
            matches!(&c, Err(Reject::Refused(why)) if why.contains("failed to prove")),
            "{c:?}"
        );
        // A listener that does not know the client's secret cannot make a
        // welcome it accepts.
        let (k_server, k_client) = (secret(1), secret(2));
        let (mut c, hello) = Connector::new(&k_client, ID, 1, 0, 0, [9; 32]);
        let h: Hello = bytemuck::pod_read_unaligned(&hello);
        let forged = Binding {
            comm_id: h.comm_id,
            client: 1,
            stream: 0,
            server: 0,
            nonce: h.nonce,
        };
        let a = Answer {
            magic: MAGIC,
            kind: KIND_WELCOME,
            version: HANDSHAKE_VERSION,
            word: 1,
            tag: forged.tag(&k_server, LABEL_SERVER, Some(1)),
        };
        assert_eq!(c.feed(bytemuck::bytes_of(&a)), Err(Reject::BadProof));
    }

    #[test]
    fn other_communicator_is_refused() {
        let k = secret(1);
        let (s, c, _) = run(&k, &k, ID, "job-b");
        assert_eq!(s, Err(Reject::OtherComm("job-b".into())));
        assert!(matches!(c, Err(Reject::Refused(_))), "{c:?}");
    }

    #[test]
    fn a_replayed_hello_is_refused_and_a_moved_nonce_breaks_the_tag() {
        let k = secret(1);
        let expected = [(1, 0)];
        let (_, hello) = Connector::new(&k, ID, 1, 0, 0, [9; 32]);
        let mut seen = ReplayGuard::default();
        let mut s = Acceptor::new(&k, ID, 0, &expected);
        assert!(matches!(
            s.feed(&hello, &mut seen),
            Ok(Step::Verified { .. })
        ));
        // The same bytes on a new connection to the same listener.
        let mut s = Acceptor::new(&k, ID, 0, &expected);
        assert_eq!(s.feed(&hello, &mut seen), Err(Reject::Replayed));
        // A new nonce under the recorded tag.
        let mut h: Hello = bytemuck::pod_read_unaligned(&hello);
        h.nonce[0] ^= 1;
        let mut s = Acceptor::new(&k, ID, 0, &expected);
        assert_eq!(
            s.feed(bytemuck::bytes_of(&h), &mut seen),
            Err(Reject::BadProof)
        );
        // A forged hello does not take a nonce from the guard.
        let mut s = Acceptor::new(&k, ID, 0, &expected);
        let (_, fresh) = Connector::new(&k, ID, 1, 0, 0, h.nonce);
        assert!(matches!(
            s.feed(&fresh, &mut seen),
            Ok(Step::Verified { .. })
        ));
    }

    #[test]
    fn reflected_client_tag_is_not_a_server_welcome() {
        let k = secret(1);
        let (mut c, hello) = Connector::new(&k, ID, 1, 0, 0, [9; 32]);
        let h: Hello = bytemuck::pod_read_unaligned(&hello);
        for word in [0, 1] {
            let a = Answer {
                magic: MAGIC,
                kind: KIND_WELCOME,
                version: HANDSHAKE_VERSION,
                word,
                tag: h.tag,
            };
            assert_eq!(c.feed(bytemuck::bytes_of(&a)), Err(Reject::BadProof));
            c = Connector::new(&k, ID, 1, 0, 0, [9; 32]).0;
        }
    }

    #[test]
    fn replayed_server_answer_fails_against_a_new_client_nonce() {
        let k = secret(1);
        let expected = [(1, 0)];
        let mut s = Acceptor::new(&k, ID, 0, &expected);
        let (_, hello) = Connector::new(&k, ID, 1, 0, 0, [9; 32]);
        s.feed(&hello, &mut ReplayGuard::default()).unwrap();
        let old = s.welcome(true).unwrap();
        let (mut c, _) = Connector::new(&k, ID, 1, 0, 0, [10; 32]);
        assert_eq!(c.feed(&old), Err(Reject::BadProof));
    }

    #[test]
    fn unexpected_rank_stream_and_wrong_server_are_refused() {
        let k = secret(1);
        let expected = [(1, 0)];
        let mut seen = ReplayGuard::default();
        let mut s = Acceptor::new(&k, ID, 0, &expected);
        let (_, hello) = Connector::new(&k, ID, 1, 3, 0, [9; 32]);
        assert_eq!(
            s.feed(&hello, &mut seen),
            Err(Reject::Unexpected { rank: 1, stream: 3 })
        );
        let mut s = Acceptor::new(&k, ID, 0, &expected);
        let (_, hello) = Connector::new(&k, ID, 1, 0, 5, [9; 32]);
        assert_eq!(
            s.feed(&hello, &mut seen),
            Err(Reject::WrongRank { meant: 5, me: 0 })
        );
    }

    #[test]
    fn garbage_is_refused_as_soon_as_the_magic_is_wrong() {
        let k = secret(1);
        let expected = [(1, 0)];
        let mut seen = ReplayGuard::default();
        for junk in [&b"GET / HTTP/1.1\r\n"[..], &[0u8; 4], &[0xff; 5]] {
            let mut s = Acceptor::new(&k, ID, 0, &expected);
            let r = s.feed(junk, &mut seen);
            assert!(matches!(r, Err(Reject::Garbage(_))), "{junk:?}");
            assert_eq!(r.unwrap_err().refusal(), None, "garbage gets no answer");
            // Final.
            assert!(matches!(s.feed(&[], &mut seen), Err(Reject::Garbage(_))));
        }
        // Right magic, wrong message kind.
        let mut s = Acceptor::new(&k, ID, 0, &expected);
        let mut b = MAGIC.to_le_bytes().to_vec();
        b.extend_from_slice(&KIND_WELCOME.to_le_bytes());
        assert!(matches!(s.feed(&b, &mut seen), Err(Reject::Garbage(_))));
    }

    #[test]
    fn truncated_input_waits_and_old_versions_are_named() {
        let k = secret(1);
        let expected = [(1, 0)];
        let mut seen = ReplayGuard::default();
        let mut s = Acceptor::new(&k, ID, 0, &expected);
        let (_, hello) = Connector::new(&k, ID, 1, 0, 0, [9; 32]);
        assert_eq!(
            s.feed(&hello[..HELLO_BYTES - 1], &mut seen),
            Ok(Step::NeedMore)
        );
        assert_eq!(s.wants(), 1);
        let mut old: Hello = bytemuck::pod_read_unaligned(&hello);
        old.version = 2;
        let mut s = Acceptor::new(&k, ID, 0, &expected);
        let r = s.feed(bytemuck::bytes_of(&old), &mut seen);
        assert_eq!(
            r,
            Err(Reject::Version {
                theirs: 2,
                ours: HANDSHAKE_VERSION
            })
        );
        let (mut c, _) = Connector::new(&k, ID, 1, 0, 0, [9; 32]);
        let told = c.feed(&r.unwrap_err().refusal().unwrap());
        assert!(
            matches!(&told, Err(Reject::Refused(why)) if why.contains("version")),
            "{told:?}"
        );
    }

    #[test]
    fn oversize_input_is_refused() {
        let k = secret(1);
        let expected = [(1, 0)];
        let mut seen = ReplayGuard::default();
        let mut s = Acceptor::new(&k, ID, 0, &expected);
        let (mut c, mut hello) = Connector::new(&k, ID, 1, 0, 0, [9; 32]);
        hello.extend_from_slice(&[0; 100]);
        assert_eq!(
            s.feed(&hello, &mut seen),
            Err(Reject::Oversize { extra: 100 })
        );
        let mut big = vec![0u8; ANSWER_BYTES + 1];
        big[..4].copy_from_slice(&MAGIC.to_le_bytes());
        big[4..8].copy_from_slice(&KIND_WELCOME.to_le_bytes());
        assert_eq!(c.feed(&big), Err(Reject::Oversize { extra: 1 }));
        // After the hello nothing more is accepted before the answer.
        let mut s = Acceptor::new(&k, ID, 0, &expected);
        let (_, hello) = Connector::new(&k, ID, 1, 0, 0, [8; 32]);
        assert!(matches!(
            s.feed(&hello, &mut seen),
            Ok(Step::Verified { .. })
        ));
        assert_eq!(s.feed(&[0], &mut seen), Err(Reject::Oversize { extra: 1 }));
    }

    #[test]
    fn empty_secret_is_refused_and_debug_hides_it() {
        assert!(JobSecret::new(&[]).is_err());
        let k = JobSecret::new(b"sekrit-sekrit").unwrap();
        assert!(!format!("{k:?}").contains("sekrit"));
    }
}
