//! The connection handshake: every TCP connection proves that it belongs to
//! the job before it carries a single frame.
//!
//! Terms:
//! - **job secret**: 32 random bytes that rank 0 of a communicator makes and
//!   shares through the Store ([`JobSecret`]). It never travels on a cadence
//!   connection; it only keys the MACs below.
//! - **client**: the side that connects (the higher rank); **server**: the
//!   side that accepts (the lower rank).
//! - **nonce**: 32 fresh random bytes each side picks per connection, so a
//!   recorded handshake proves nothing on a later connection.
//! - **tag**: HMAC-SHA256 under the job secret over a direction label and the
//!   connection's *binding* — (communicator id, client rank, stream, server
//!   rank, client nonce, server nonce).
//!
//! The protocol is lock-step; each side sends one message, then waits:
//!
//! ```text
//! client                                              server
//!   HELLO     comm id, rank, stream, server rank,
//!             client nonce                        ─▶  right magic/version/
//!                                                     communicator, expected rank
//!                                                 ◀─  CHALLENGE  server nonce,
//!                                                     server tag  (the server
//!   checks the server tag: the listener knows the         knows the secret, and
//!   secret and answered *this* hello)                     answers this hello now)
//!   PROOF     client tag  (the client knows the   ─▶  checks the client tag:
//!             secret, and answers *this* challenge)   a member, not a replay
//!                                                 ◀─  WELCOME
//! ```
//!
//! The two tags use different labels, so neither side's tag can be reflected
//! back as the other's. Nothing here does I/O: [`Acceptor`] and [`Connector`]
//! take the bytes that arrived and say what to send, so they are tested and
//! fuzzed in one process; `transport::setup` drives them over sockets.

use super::MAGIC;
use bytemuck::{Pod, Zeroable};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use std::fmt;

pub const HANDSHAKE_VERSION: u32 = 2;
pub const NONCE_BYTES: usize = 32;
pub const TAG_BYTES: usize = 32;

const KIND_HELLO: u32 = 1;
const KIND_CHALLENGE: u32 = 2;
const KIND_PROOF: u32 = 3;
const KIND_WELCOME: u32 = 4;

const LABEL_SERVER: &[u8] = b"cadence handshake v2: server";
const LABEL_CLIENT: &[u8] = b"cadence handshake v2: client";

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

/// Client → server, first.
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
}

/// Server → client.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct Challenge {
    pub magic: u32,
    pub kind: u32,
    pub version: u32,
    pub server_rank: u32,
    pub nonce: [u8; NONCE_BYTES],
    pub tag: [u8; TAG_BYTES],
}

/// Client → server, second.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct Proof {
    pub magic: u32,
    pub kind: u32,
    pub tag: [u8; TAG_BYTES],
}

/// Server → client: accepted.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct Welcome {
    pub magic: u32,
    pub kind: u32,
}

pub const HELLO_BYTES: usize = std::mem::size_of::<Hello>();
pub const CHALLENGE_BYTES: usize = std::mem::size_of::<Challenge>();
pub const PROOF_BYTES: usize = std::mem::size_of::<Proof>();
pub const WELCOME_BYTES: usize = std::mem::size_of::<Welcome>();

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
    #[error("failed to prove membership of the job (wrong job secret, or a replayed handshake)")]
    BadProof,
    #[error("sent {extra} bytes beyond its handshake message")]
    Oversize { extra: usize },
    #[error("handshake already finished")]
    Finished,
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
struct Binding {
    comm_id: [u8; 32],
    client: u32,
    stream: u32,
    server: u32,
    client_nonce: [u8; NONCE_BYTES],
    server_nonce: [u8; NONCE_BYTES],
}

impl Binding {
    fn mac(&self, secret: &JobSecret, label: &[u8]) -> Hmac<Sha256> {
        let mut m = secret.mac();
        m.update(label);
        m.update(&self.comm_id);
        m.update(&HANDSHAKE_VERSION.to_le_bytes());
        m.update(&self.client.to_le_bytes());
        m.update(&self.stream.to_le_bytes());
        m.update(&self.server.to_le_bytes());
        m.update(&self.client_nonce);
        m.update(&self.server_nonce);
        m
    }
    fn tag(&self, secret: &JobSecret, label: &[u8]) -> [u8; TAG_BYTES] {
        self.mac(secret, label).finalize().into_bytes().into()
    }
    /// Constant-time comparison (the `hmac` crate's).
    fn verify(&self, secret: &JobSecret, label: &[u8], tag: &[u8]) -> bool {
        self.mac(secret, label).verify_slice(tag).is_ok()
    }
}

/// What a machine wants after being fed.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// The current message is incomplete: feed more bytes.
    NeedMore,
    /// Send these bytes, then feed the peer's answer.
    Send(Vec<u8>),
    /// The handshake succeeded with peer `key`; send `send` (possibly
    /// empty), after which the connection carries frames.
    Done { key: StreamKey, send: Vec<u8> },
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

    /// Takes bytes towards a `size`-byte message of `kind`. Returns the whole
    /// message once complete.
    fn take(&mut self, data: &[u8], size: usize, kind: u32) -> Result<Option<Vec<u8>>, Reject> {
        let want = size - self.buf.len();
        self.buf.extend_from_slice(&data[..data.len().min(want)]);
        let b = &self.buf;
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if b.len() >= 4 && word(0) != MAGIC {
            return Err(Reject::Garbage(hex_prefix(b)));
        }
        if b.len() >= 8 && word(4) != kind {
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
        Ok(Some(std::mem::replace(
            &mut self.buf,
            Vec::with_capacity(HELLO_BYTES),
        )))
    }

    fn len(&self) -> usize {
        self.buf.len()
    }
}

enum AcceptState {
    AwaitHello,
    AwaitProof(Binding),
    Done,
    Failed(Reject),
}

/// The server side of one connection.
pub struct Acceptor<'a> {
    secret: &'a JobSecret,
    comm_id: [u8; 32],
    my_rank: u32,
    expected: Expected<'a>,
    nonce: [u8; NONCE_BYTES],
    incoming: Incoming,
    state: AcceptState,
}

impl<'a> Acceptor<'a> {
    /// `nonce` must be fresh for every connection ([`fresh_nonce`]); it is an
    /// argument so tests are deterministic.
    pub fn new(
        secret: &'a JobSecret,
        comm_id: &str,
        my_rank: usize,
        expected: impl Into<Expected<'a>>,
        nonce: [u8; NONCE_BYTES],
    ) -> Acceptor<'a> {
        Acceptor {
            secret,
            comm_id: comm_id_bytes(comm_id),
            my_rank: my_rank as u32,
            expected: expected.into(),
            nonce,
            incoming: Incoming::new(),
            state: AcceptState::AwaitHello,
        }
    }

    /// Bytes still missing from the message being received (0 when none is
    /// expected).
    pub fn wants(&self) -> usize {
        match self.state {
            AcceptState::AwaitHello => HELLO_BYTES - self.incoming.len(),
            AcceptState::AwaitProof(_) => PROOF_BYTES - self.incoming.len(),
            _ => 0,
        }
    }

    /// Bytes received so far of the current message (for "timed out after N
    /// bytes").
    pub fn partial(&self) -> usize {
        self.incoming.len()
    }

    /// Feeds bytes from the client. A rejection is final: later calls return
    /// it again.
    pub fn feed(&mut self, data: &[u8]) -> Result<Step, Reject> {
        let r = self.step(data);
        if let Err(e) = &r {
            self.state = AcceptState::Failed(e.clone());
        }
        r
    }

    fn step(&mut self, data: &[u8]) -> Result<Step, Reject> {
        match &self.state {
            AcceptState::Failed(e) => Err(e.clone()),
            AcceptState::Done => Err(Reject::Finished),
            AcceptState::AwaitHello => {
                let Some(msg) = self.incoming.take(data, HELLO_BYTES, KIND_HELLO)? else {
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
                    client_nonce: h.nonce,
                    server_nonce: self.nonce,
                };
                let c = Challenge {
                    magic: MAGIC,
                    kind: KIND_CHALLENGE,
                    version: HANDSHAKE_VERSION,
                    server_rank: self.my_rank,
                    nonce: self.nonce,
                    tag: b.tag(self.secret, LABEL_SERVER),
                };
                self.state = AcceptState::AwaitProof(b);
                Ok(Step::Send(bytemuck::bytes_of(&c).to_vec()))
            }
            AcceptState::AwaitProof(b) => {
                let Some(msg) = self.incoming.take(data, PROOF_BYTES, KIND_PROOF)? else {
                    return Ok(Step::NeedMore);
                };
                let p: Proof = bytemuck::pod_read_unaligned(&msg);
                if !b.verify(self.secret, LABEL_CLIENT, &p.tag) {
                    return Err(Reject::BadProof);
                }
                let key = (b.client as usize, b.stream as usize);
                self.state = AcceptState::Done;
                let w = Welcome {
                    magic: MAGIC,
                    kind: KIND_WELCOME,
                };
                Ok(Step::Done {
                    key,
                    send: bytemuck::bytes_of(&w).to_vec(),
                })
            }
        }
    }
}

enum ConnectState {
    AwaitChallenge,
    AwaitWelcome,
    Done,
    Failed(Reject),
}

/// The client side of one connection.
pub struct Connector<'a> {
    secret: &'a JobSecret,
    comm_id: [u8; 32],
    my_rank: u32,
    stream: u32,
    server_rank: u32,
    nonce: [u8; NONCE_BYTES],
    incoming: Incoming,
    state: ConnectState,
}

impl<'a> Connector<'a> {
    /// Returns the machine and the HELLO to send first. `nonce` must be
    /// fresh for every connection ([`fresh_nonce`]).
    pub fn new(
        secret: &'a JobSecret,
        comm_id: &str,
        my_rank: usize,
        stream: usize,
        server_rank: usize,
        nonce: [u8; NONCE_BYTES],
    ) -> (Connector<'a>, Vec<u8>) {
        let c = Connector {
            secret,
            comm_id: comm_id_bytes(comm_id),
            my_rank: my_rank as u32,
            stream: stream as u32,
            server_rank: server_rank as u32,
            nonce,
            incoming: Incoming::new(),
            state: ConnectState::AwaitChallenge,
        };
        let h = Hello {
            magic: MAGIC,
            kind: KIND_HELLO,
            version: HANDSHAKE_VERSION,
            rank: c.my_rank,
            stream: c.stream,
            server_rank: c.server_rank,
            comm_id: c.comm_id,
            nonce,
        };
        (c, bytemuck::bytes_of(&h).to_vec())
    }

    /// Bytes still missing from the message being received. The socket
    /// driver reads exactly this many: after WELCOME come frames.
    pub fn wants(&self) -> usize {
        match self.state {
            ConnectState::AwaitChallenge => CHALLENGE_BYTES - self.incoming.len(),
            ConnectState::AwaitWelcome => WELCOME_BYTES - self.incoming.len(),
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
            ConnectState::AwaitChallenge => {
                let Some(msg) = self.incoming.take(data, CHALLENGE_BYTES, KIND_CHALLENGE)? else {
                    return Ok(Step::NeedMore);
                };
                let c: Challenge = bytemuck::pod_read_unaligned(&msg);
                if c.version != HANDSHAKE_VERSION {
                    return Err(Reject::Version {
                        theirs: c.version,
                        ours: HANDSHAKE_VERSION,
                    });
                }
                if c.server_rank != self.server_rank {
                    return Err(Reject::WrongRank {
                        meant: self.server_rank,
                        me: c.server_rank,
                    });
                }
                let b = Binding {
                    comm_id: self.comm_id,
                    client: self.my_rank,
                    stream: self.stream,
                    server: self.server_rank,
                    client_nonce: self.nonce,
                    server_nonce: c.nonce,
                };
                if !b.verify(self.secret, LABEL_SERVER, &c.tag) {
                    return Err(Reject::BadProof);
                }
                let p = Proof {
                    magic: MAGIC,
                    kind: KIND_PROOF,
                    tag: b.tag(self.secret, LABEL_CLIENT),
                };
                self.state = ConnectState::AwaitWelcome;
                Ok(Step::Send(bytemuck::bytes_of(&p).to_vec()))
            }
            ConnectState::AwaitWelcome => {
                if self
                    .incoming
                    .take(data, WELCOME_BYTES, KIND_WELCOME)?
                    .is_none()
                {
                    return Ok(Step::NeedMore);
                }
                self.state = ConnectState::Done;
                Ok(Step::Done {
                    key: (self.server_rank as usize, self.stream as usize),
                    send: Vec::new(),
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
    /// result, every client byte sent).
    fn run(
        server_secret: &JobSecret,
        client_secret: &JobSecret,
        server_id: &str,
        client_id: &str,
    ) -> (Result<Step, Reject>, Result<Step, Reject>, Vec<u8>) {
        let expected = [(1, 0)];
        let mut s = Acceptor::new(server_secret, server_id, 0, &expected, [7; 32]);
        let (mut c, hello) = Connector::new(client_secret, client_id, 1, 0, 0, [9; 32]);
        let mut transcript = hello.clone();
        let challenge = match s.feed(&hello) {
            Ok(Step::Send(b)) => b,
            other => return (other, Ok(Step::NeedMore), transcript),
        };
        let proof = match c.feed(&challenge) {
            Ok(Step::Send(b)) => b,
            other => return (Ok(Step::NeedMore), other, transcript),
        };
        transcript.extend_from_slice(&proof);
        let sv = s.feed(&proof);
        let welcome = match &sv {
            Ok(Step::Done { send, .. }) => send.clone(),
            _ => return (sv, Ok(Step::NeedMore), transcript),
        };
        (sv, c.feed(&welcome), transcript)
    }

    #[test]
    fn good_pair_completes_both_ways() {
        let k = secret(1);
        let (s, c, _) = run(&k, &k, ID, ID);
        assert!(matches!(s, Ok(Step::Done { key: (1, 0), .. })), "{s:?}");
        assert!(matches!(c, Ok(Step::Done { key: (0, 0), .. })), "{c:?}");
    }

    #[test]
    fn an_acceptor_by_rule_admits_what_the_rule_admits() {
        let k = secret(1);
        // Ranks 1..4, two streams each, as links made on first use admit.
        let rule = |(rank, stream): StreamKey| (1..4).contains(&rank) && stream < 2;
        for (rank, stream, admitted) in [(1, 0, true), (3, 1, true), (4, 0, false), (2, 2, false)] {
            let mut s = Acceptor::new(&k, ID, 0, Expected::Admitted(&rule), [7; 32]);
            let (_, hello) = Connector::new(&k, ID, rank, stream, 0, [9; 32]);
            let got = s.feed(&hello);
            if admitted {
                assert!(matches!(got, Ok(Step::Send(_))), "{rank}/{stream}: {got:?}");
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
        let mut s = Acceptor::new(&k, ID, 0, &expected, [7; 32]);
        let (mut c, hello) = Connector::new(&k, ID, 1, 0, 0, [9; 32]);
        let mut last = Step::NeedMore;
        for b in &hello {
            last = s.feed(std::slice::from_ref(b)).unwrap();
        }
        let Step::Send(ch) = std::mem::replace(&mut last, Step::NeedMore) else {
            panic!()
        };
        for b in &ch {
            last = c.feed(std::slice::from_ref(b)).unwrap();
        }
        let Step::Send(pr) = std::mem::replace(&mut last, Step::NeedMore) else {
            panic!()
        };
        for b in &pr {
            last = s.feed(std::slice::from_ref(b)).unwrap();
        }
        assert!(matches!(last, Step::Done { key: (1, 0), .. }));
    }

    #[test]
    fn wrong_secret_is_refused_by_both_sides() {
        // The client checks the server's tag first, so it refuses to answer.
        let (_, c, _) = run(&secret(1), &secret(2), ID, ID);
        assert_eq!(c, Err(Reject::BadProof));
        // A client that answers anyway (it never saw a valid server tag) is
        // refused by the server.
        let (k_server, k_client) = (secret(1), secret(2));
        let expected = [(1, 0)];
        let mut s = Acceptor::new(&k_server, ID, 0, &expected, [7; 32]);
        let (_, hello) = Connector::new(&k_client, ID, 1, 0, 0, [9; 32]);
        let Ok(Step::Send(ch)) = s.feed(&hello) else {
            panic!()
        };
        let ch: Challenge = bytemuck::pod_read_unaligned(&ch);
        let forged = Binding {
            comm_id: comm_id_bytes(ID),
            client: 1,
            stream: 0,
            server: 0,
            client_nonce: [9; 32],
            server_nonce: ch.nonce,
        }
        .tag(&k_client, LABEL_CLIENT);
        let p = Proof {
            magic: MAGIC,
            kind: KIND_PROOF,
            tag: forged,
        };
        assert_eq!(s.feed(bytemuck::bytes_of(&p)), Err(Reject::BadProof));
    }

    #[test]
    fn other_communicator_is_refused() {
        let k = secret(1);
        let (s, _, _) = run(&k, &k, ID, "job-b");
        assert_eq!(s, Err(Reject::OtherComm("job-b".into())));
    }

    #[test]
    fn replayed_client_transcript_fails_against_a_new_nonce() {
        let k = secret(1);
        let (_, c, transcript) = run(&k, &k, ID, ID);
        assert!(matches!(c, Ok(Step::Done { .. })));
        let expected = [(1, 0)];
        let mut s = Acceptor::new(&k, ID, 0, &expected, [8; 32]);
        assert!(matches!(
            s.feed(&transcript[..HELLO_BYTES]),
            Ok(Step::Send(_))
        ));
        assert_eq!(s.feed(&transcript[HELLO_BYTES..]), Err(Reject::BadProof));
    }

    #[test]
    fn reflected_server_tag_is_not_a_client_proof() {
        let k = secret(1);
        let expected = [(1, 0)];
        let mut s = Acceptor::new(&k, ID, 0, &expected, [7; 32]);
        let (_, hello) = Connector::new(&k, ID, 1, 0, 0, [9; 32]);
        let Ok(Step::Send(ch)) = s.feed(&hello) else {
            panic!()
        };
        let ch: Challenge = bytemuck::pod_read_unaligned(&ch);
        let p = Proof {
            magic: MAGIC,
            kind: KIND_PROOF,
            tag: ch.tag,
        };
        assert_eq!(s.feed(bytemuck::bytes_of(&p)), Err(Reject::BadProof));
    }

    #[test]
    fn replayed_server_answer_fails_against_a_new_client_nonce() {
        let k = secret(1);
        let expected = [(1, 0)];
        let mut s = Acceptor::new(&k, ID, 0, &expected, [7; 32]);
        let (_, hello) = Connector::new(&k, ID, 1, 0, 0, [9; 32]);
        let Ok(Step::Send(old)) = s.feed(&hello) else {
            panic!()
        };
        let (mut c, _) = Connector::new(&k, ID, 1, 0, 0, [10; 32]);
        assert_eq!(c.feed(&old), Err(Reject::BadProof));
    }

    #[test]
    fn unexpected_rank_stream_and_wrong_server_are_refused() {
        let k = secret(1);
        let expected = [(1, 0)];
        let mut s = Acceptor::new(&k, ID, 0, &expected, [7; 32]);
        let (_, hello) = Connector::new(&k, ID, 1, 3, 0, [9; 32]);
        assert_eq!(
            s.feed(&hello),
            Err(Reject::Unexpected { rank: 1, stream: 3 })
        );
        let mut s = Acceptor::new(&k, ID, 0, &expected, [7; 32]);
        let (_, hello) = Connector::new(&k, ID, 1, 0, 5, [9; 32]);
        assert_eq!(s.feed(&hello), Err(Reject::WrongRank { meant: 5, me: 0 }));
    }

    #[test]
    fn garbage_is_refused_as_soon_as_the_magic_is_wrong() {
        let k = secret(1);
        let expected = [(1, 0)];
        for junk in [&b"GET / HTTP/1.1\r\n"[..], &[0u8; 4], &[0xff; 5]] {
            let mut s = Acceptor::new(&k, ID, 0, &expected, [7; 32]);
            assert!(matches!(s.feed(junk), Err(Reject::Garbage(_))), "{junk:?}");
            // Final.
            assert!(matches!(s.feed(&[]), Err(Reject::Garbage(_))));
        }
        // Right magic, wrong message kind.
        let mut s = Acceptor::new(&k, ID, 0, &expected, [7; 32]);
        let mut b = MAGIC.to_le_bytes().to_vec();
        b.extend_from_slice(&KIND_PROOF.to_le_bytes());
        assert!(matches!(s.feed(&b), Err(Reject::Garbage(_))));
    }

    #[test]
    fn truncated_input_waits_and_old_versions_are_named() {
        let k = secret(1);
        let expected = [(1, 0)];
        let mut s = Acceptor::new(&k, ID, 0, &expected, [7; 32]);
        let (_, hello) = Connector::new(&k, ID, 1, 0, 0, [9; 32]);
        assert_eq!(s.feed(&hello[..HELLO_BYTES - 1]), Ok(Step::NeedMore));
        assert_eq!(s.wants(), 1);
        let mut old: Hello = bytemuck::pod_read_unaligned(&hello);
        old.version = 1;
        let mut s = Acceptor::new(&k, ID, 0, &expected, [7; 32]);
        assert_eq!(
            s.feed(bytemuck::bytes_of(&old)),
            Err(Reject::Version {
                theirs: 1,
                ours: HANDSHAKE_VERSION
            })
        );
    }

    #[test]
    fn oversize_input_is_refused() {
        let k = secret(1);
        let expected = [(1, 0)];
        let mut s = Acceptor::new(&k, ID, 0, &expected, [7; 32]);
        let (mut c, mut hello) = Connector::new(&k, ID, 1, 0, 0, [9; 32]);
        hello.extend_from_slice(&[0; 100]);
        assert_eq!(s.feed(&hello), Err(Reject::Oversize { extra: 100 }));
        let mut big = vec![0u8; CHALLENGE_BYTES + 1];
        big[..4].copy_from_slice(&MAGIC.to_le_bytes());
        big[4..8].copy_from_slice(&KIND_CHALLENGE.to_le_bytes());
        assert_eq!(c.feed(&big), Err(Reject::Oversize { extra: 1 }));
        // After the handshake nothing more is accepted.
        let mut s = Acceptor::new(&k, ID, 0, &expected, [7; 32]);
        let (mut c, hello) = Connector::new(&k, ID, 1, 0, 0, [9; 32]);
        let Ok(Step::Send(ch)) = s.feed(&hello) else {
            panic!()
        };
        let Ok(Step::Send(pr)) = c.feed(&ch) else {
            panic!()
        };
        assert!(matches!(s.feed(&pr), Ok(Step::Done { .. })));
        assert_eq!(s.feed(&[0]), Err(Reject::Finished));
    }

    #[test]
    fn empty_secret_is_refused_and_debug_hides_it() {
        assert!(JobSecret::new(&[]).is_err());
        let k = JobSecret::new(b"sekrit-sekrit").unwrap();
        assert!(!format!("{k:?}").contains("sekrit"));
    }
}
