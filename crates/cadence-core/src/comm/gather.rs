//! The peer-table exchange: every rank learns every rank's [`PeerInfo`]
//! with two store operations of its own, whatever the job's size.
//!
//! Each rank publishes where it listens for the exchange and reads where
//! its ring successor does; the rest travels between the ranks, in
//! ⌈log₂ n⌉ steps of a Bruck allgather. At step k (distance d = 2^k) rank r
//! sends what it knows, the records of ranks r−d+1..r, to rank r+d, and
//! receives those of ranks r−2d+1..r−d from rank r−d. The address of the
//! next step's partner travels with the exchange ("pointer jumping"): rank
//! r+d, the one r sends to at step k, answers with the address of its own
//! step-k partner r+2d, which is r's at step k+1. So no rank needs more
//! than its successor's address from the store, and none holds more than
//! ⌈log₂ n⌉ short-lived connections.
//!
//! Streams are authenticated as links are (`transport/handshake.rs`), under
//! stream numbers of their own (`GATHER_STREAM + k`), on a listener that
//! closes when the exchange ends.

use super::exchange_buf::{ExchangeBuf, Received};
use super::peer_info::Fields;
use super::peer_table::Builder;
use super::{PeerInfo, PeerTable};
use crate::error::{CommError, ErrorKind, Result};
use crate::rendezvous::{Store, StoreError};
use crate::transport::handshake::{Expected, JobSecret};
use crate::transport::tcp_setup::{accept_each, connect, Dialer};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Stream numbers of the exchange: far above any link's.
pub const GATHER_STREAM: usize = 1 << 20;
/// While a rank waits for a peer, how often it says so (at INFO).
const WAIT_NOTICE: Duration = Duration::from_secs(5);

/// Who this rank is in the exchange.
pub struct GatherCtx<'a> {
    pub comm_id: &'a str,
    pub rank: usize,
    pub nranks: usize,
    pub secret: &'a JobSecret,
    pub deadline: Instant,
    /// Prefix of INFO lines about waits (None: quiet).
    pub log: Option<String>,
    /// Prefix of WARN lines (dropped strangers; None: quiet).
    pub warn_as: Option<String>,
}

impl GatherCtx<'_> {
    fn fail(&self, detail: String, culprit: Option<usize>) -> CommError {
        let mut e = CommError::new(ErrorKind::Setup { detail, culprit });
        e.rank = Some(self.rank);
        e.comm_id = self.comm_id.into();
        e
    }
    fn notice(&self, what: std::fmt::Arguments) {
        if let Some(p) = &self.log {
            stderr_line!("{p}: INFO {what}");
        }
    }
}

/// The store key under which `rank` publishes its exchange address.
pub fn gather_key(prefix: &str, rank: usize) -> String {
    format!("{prefix}/gather/{rank}")
}

/// Reads `key`, saying every [`WAIT_NOTICE`] that it still waits for
/// `rank`; a timeout names that rank.
fn store_wait(ctx: &GatherCtx, store: &dyn Store, key: &str, rank: usize) -> Result<Vec<u8>> {
    let started = Instant::now();
    loop {
        let left = ctx.deadline.saturating_duration_since(Instant::now());
        let chunk = if ctx.log.is_some() {
            left.min(WAIT_NOTICE)
        } else {
            left
        };
        match store.get(key, chunk) {
            Ok(v) => return Ok(v),
            Err(StoreError::Timeout { .. }) if Instant::now() < ctx.deadline => {
                ctx.notice(format_args!(
                    "waiting {:.0}s for rank {rank} to join (store key {key})",
                    started.elapsed().as_secs_f64()
                ))
            }
            Err(StoreError::Timeout { .. }) => {
                return Err(ctx.fail(
                    format!(
                        "rank {rank} never joined within {:.0}s (it did not start, or cannot \
                         reach the Store)",
                        started.elapsed().as_secs_f64()
                    ),
                    Some(rank),
                ))
            }
            Err(e) => return Err(ctx.fail(format!("the Store failed: {e}"), None)),
        }
    }
}

/// Every rank's record, in rank order, given this rank's own. `listener`
/// is the exchange's (its address already published under
/// [`gather_key`]); the successor's is read from `store`.
pub fn allgather(
    ctx: &GatherCtx,
    own: &PeerInfo,
    listener: TcpListener,
    store: &dyn Store,
    prefix: &str,
) -> Result<PeerTable> {
    let (r, n) = (ctx.rank, ctx.nranks);
    if n == 1 {
        return PeerTable::from_records(std::slice::from_ref(own)).map_err(|m| ctx.fail(m, None));
    }
    let steps = usize::BITS as usize - (n - 1).leading_zeros() as usize;
    let from = |k: usize| (r + n - (1 << k) % n) % n;
    let expected: Vec<(usize, usize)> = (0..steps).map(|k| (from(k), GATHER_STREAM + k)).collect();

    // Connections from the peers this rank receives from arrive in their
    // own time, on a thread of their own (from now: strangers who read the
    // address in the store are judged, and named, while this rank waits).
    let (tx, rx) = mpsc::channel::<(usize, TcpStream)>();
    let (cid, secret, deadline) = (ctx.comm_id.to_string(), ctx.secret.clone(), ctx.deadline);
    let warn_as = ctx.warn_as.clone();
    let exp = expected.clone();
    let acceptor = std::thread::Builder::new()
        .name("cadence-gather".into())
        .stack_size(256 << 10)
        .spawn(move || {
            let mut warn = |m: String| {
                if let Some(p) = &warn_as {
                    stderr_line!("{p}: WARN {m}");
                }
            };
            accept_each(
                &[listener],
                &secret,
                &cid,
                r,
                Expected::These(&exp),
                deadline,
                &mut warn,
                &mut |_| true,
                &mut |(_, s), sock| {
                    let _ = tx.send((s - GATHER_STREAM, sock));
                },
                None,
            )
        })
        .map_err(|e| ctx.fail(format!("cannot start the exchange: {e}"), None))?;
    let raw = store_wait(ctx, store, &gather_key(prefix, (r + 1) % n), (r + 1) % n)?;
    let mut target: SocketAddr = std::str::from_utf8(&raw)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            ctx.fail(
                format!("rank {} published a bad address", (r + 1) % n),
                Some((r + 1) % n),
            )
        })?;

    // Records of ranks r-count+1..=r, oldest first, encoded.
    let mut mine = Vec::new();
    own.encode(&mut mine);
    let no_room =
        |e: std::io::Error| ctx.fail(format!("no memory for the peer records: {e}"), None);
    // Room for every record at once (a rank's is about as long as any).
    let mut known =
        ExchangeBuf::with_capacity(mine.len() * n + mine.len() * n / 4).map_err(no_room)?;
    known
        .front(mine.len())
        .map_err(no_room)?
        .copy_from_slice(&mine);
    known.claim(mine.len());
    let mut count = 1;
    let mut early: Vec<(usize, TcpStream)> = Vec::new();
    let mut result = Ok(());
    for k in 0..steps {
        let d = 1usize << k;
        let to = (r + d) % n;
        // What the receiver lacks: at the last step fewer than d records,
        // the newest of the `count` this rank has.
        let send_n = d.min(n - d);
        let mut tail = known.bytes();
        for _ in send_n..count {
            PeerInfo::skip(&mut tail).map_err(|m| ctx.fail(m, None))?;
        }
        let step = std::thread::scope(|s| {
            let out = s.spawn(|| send_step(ctx, target, to, k, tail));
            let got = recv_step(
                ctx,
                &rx,
                &mut early,
                k,
                from(k),
                to_addr_reply(target),
                send_n,
            );
            let reply = out.join().expect("the exchange's sender panicked");
            Ok::<_, CommError>((got?, reply?))
        });
        match step {
            Ok((records, next)) => {
                let front = known.front(records.len()).map_err(no_room)?;
                front.copy_from_slice(&records);
                known.claim(records.len());
                count += send_n;
                target = next;
            }
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    drop(rx);
    // On failure the acceptor may still wait for a peer that never comes;
    // it ends at the deadline on its own.
    result?;
    if let Err(e) = acceptor.join().expect("the exchange's acceptor panicked") {
        return Err(ctx.fail(e.detail, e.culprit));
    }
    // `known` now holds ranks r-n+1..=r, each read (and checked) here.
    let mut b = known.bytes();
    let mut table = Builder::new(n);
    for i in 0..n {
        let expect = (r + 1 + i) % n;
        let p = Fields::read(&mut b)
            .map_err(|m| ctx.fail(format!("the record of rank {expect}: {m}"), Some(expect)))?;
        if p.rank != expect {
            return Err(ctx.fail(
                format!(
                    "the peer table has rank {} where rank {expect} belongs",
                    p.rank
                ),
                None,
            ));
        }
        table.add_fields(p).map_err(|m| ctx.fail(m, Some(expect)))?;
    }
    table.finish().map_err(|m| ctx.fail(m, None))
}

/// What a failed read or write of the exchange says: a timeout is the
/// peer (or a rank it waits for) not answering within the set-up wait.
fn io_detail(e: &std::io::Error, peer: usize) -> String {
    if matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    ) {
        format!(
            "rank {peer} did not answer the peer-table exchange before the set-up deadline (it \
             waits for ranks that have not joined, or is stopped)"
        )
    } else {
        format!("exchanging peer records with rank {peer}: {e}")
    }
}

fn to_addr_reply(a: SocketAddr) -> Vec<u8> {
    a.to_string().into_bytes()
}

fn write_block(s: &mut TcpStream, b: &[u8]) -> std::io::Result<()> {
    s.write_all(&(b.len() as u32).to_le_bytes())?;
    s.write_all(b)
}

/// A block's length, from its prefix; at most `limit`.
fn read_len(s: &mut TcpStream, limit: usize) -> std::io::Result<usize> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a block of {len} bytes (at most {limit})"),
        ));
    }
    Ok(len)
}

fn read_block(s: &mut TcpStream, limit: usize) -> std::io::Result<Vec<u8>> {
    let mut b = vec![0u8; read_len(s, limit)?];
    s.read_exact(&mut b)?;
    Ok(b)
}

/// Step k, sending side: the records to rank `to`; returns the address of
/// the next step's partner, which `to` answers with.
fn send_step(
    ctx: &GatherCtx,
    addr: SocketAddr,
    to: usize,
    k: usize,
    block: &[u8],
) -> Result<SocketAddr> {
    // The exchange's listener keeps every member's stream.
    let who = Dialer {
        secret: ctx.secret,
        comm_id: ctx.comm_id,
        rank: ctx.rank,
        say_ports: false,
    };
    let (mut s, _) =
        connect(who, addr, None, &[], GATHER_STREAM + k, to, ctx.deadline).map_err(|e| {
            ctx.fail(
                format!("exchanging peer records with rank {to} at {addr}: {e}"),
                Some(to),
            )
        })?;
    let left = ctx
        .deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    let io = |e: std::io::Error| ctx.fail(io_detail(&e, to), Some(to));
    s.set_read_timeout(Some(left)).map_err(io)?;
    s.set_write_timeout(Some(left)).map_err(io)?;
    write_block(&mut s, block).map_err(io)?;
    let reply = read_block(&mut s, 256).map_err(io)?;
    std::str::from_utf8(&reply)
        .ok()
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| ctx.fail(format!("rank {to} answered with a bad address"), Some(to)))
}

/// Step k, receiving side: waits for rank `from`'s connection, answers
/// with `reply` (the address it sends to next), reads its `records`
/// records (each checked to be one).
#[allow(clippy::too_many_arguments)]
fn recv_step(
    ctx: &GatherCtx,
    rx: &mpsc::Receiver<(usize, TcpStream)>,
    early: &mut Vec<(usize, TcpStream)>,
    k: usize,
    from: usize,
    reply: Vec<u8>,
    records: usize,
) -> Result<Received> {
    let started = Instant::now();
    let mut s = loop {
        if let Some(i) = early.iter().position(|(j, _)| *j == k) {
            break early.swap_remove(i).1;
        }
        let left = ctx.deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.min(WAIT_NOTICE)) {
            Ok((j, sock)) if j == k => break sock,
            Ok(other) => early.push(other),
            Err(mpsc::RecvTimeoutError::Timeout) if !left.is_zero() => ctx.notice(format_args!(
                "waiting {:.0}s for rank {from}'s peer records (exchange step {k})",
                started.elapsed().as_secs_f64()
            )),
            Err(_) => {
                return Err(ctx.fail(
                    format!(
                        "rank {from} never sent its peer records (exchange step {k}) within \
                         {:.0}s",
                        started.elapsed().as_secs_f64()
                    ),
                    Some(from),
                ))
            }
        }
    };
    let left = ctx
        .deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    let io = |e: std::io::Error| ctx.fail(io_detail(&e, from), Some(from));
    // Accepted non-blocking (by the handshake's poll loop).
    s.set_nonblocking(false).map_err(io)?;
    s.set_read_timeout(Some(left)).map_err(io)?;
    s.set_write_timeout(Some(left)).map_err(io)?;
    write_block(&mut s, &reply).map_err(io)?;
    // A record is a few hundred bytes at most.
    let len = read_len(&mut s, records * 4096 + 4096).map_err(io)?;
    let block = Received::read(&mut s, len).map_err(io)?;
    let mut b = &block[..];
    for _ in 0..records {
        PeerInfo::skip(&mut b).map_err(|m| ctx.fail(format!("rank {from}: {m}"), Some(from)))?;
    }
    if !b.is_empty() {
        return Err(ctx.fail(
            format!("rank {from} sent more records than step {k} carries"),
            Some(from),
        ));
    }
    Ok(block)
}
