//! Making one TCP link to one peer: its streams (connected, each on its
//! path, with failover across paths at start-up) and the link built from
//! them. Used at set-up for every peer (`CADENCE_CONNECT=eager`,
//! `bootstrap.rs`) and on first use (`lazy.rs`).

use super::PeerTable;
use crate::config::DebugLevel;
use crate::error::{CommError, ErrorKind, Result};
use crate::transport::handshake::JobSecret;
use crate::transport::tcp::TcpLink;
use crate::transport::tcp_setup::connect;
use std::net::{IpAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long one stream may try to connect on one path, when a peer has
/// several, before the path counts as unreachable and the stream goes on
/// another (at start-up; the listener may still be coming up, so a refused
/// connection is tried again until then).
const PATH_CONNECT: Duration = Duration::from_secs(10);

/// What making a link to any peer needs to know; shared by the threads
/// that make links on first use.
pub struct LinkCtx {
    pub comm_id: String,
    pub rank: usize,
    pub secret: JobSecret,
    pub infos: Arc<PeerTable>,
    /// This rank's listening address per NIC.
    pub my_ips: Vec<IpAddr>,
    pub nstreams: usize,
    pub path_timeout: Duration,
    pub debug: DebugLevel,
}

/// A set-up error naming the peer to blame.
pub fn blame(ctx: &LinkCtx, m: String, culprit: Option<usize>) -> CommError {
    let mut e = CommError::new(ErrorKind::Setup { detail: m, culprit });
    e.rank = Some(ctx.rank);
    e.comm_id = ctx.comm_id.as_str().into();
    e
}

impl LinkCtx {
    /// The paths between this rank and `peer` (NIC k to NIC k).
    pub fn paths_to(&self, peer: usize) -> usize {
        self.infos.paths_between(self.rank, peer)
    }
    /// How many streams a link to `peer` has.
    pub fn streams_to(&self, peer: usize) -> usize {
        self.nstreams * self.paths_to(peer)
    }
}

/// Paths that did not connect at set-up, with why: their streams run on a
/// path that did, and the link starts with them down.
pub type Unreachable = Vec<(usize, String)>;

/// Connects every stream of the link to `peer` (streams interleaved over
/// the paths: stream s on path s % paths, so that a large message's
/// stripes spread evenly over the NICs). With several paths, a path that
/// does not connect within [`PATH_CONNECT`] is skipped for the peer's later
/// streams and reported in the second value.
pub fn connect_streams(
    ctx: &LinkCtx,
    peer: usize,
    deadline: Instant,
    warn: &mut dyn FnMut(String),
) -> Result<(Vec<TcpStream>, Unreachable)> {
    connect_streams_deciding(ctx, peer, deadline, warn, false)
        .map(|made| made.expect("no decision asked"))
}

/// After its handshake, a stream made on first use reads one byte from the
/// listener: [`KEEP`], or [`DROP`] when the peer had begun its own link to
/// this rank and its rank is the higher (`lazy.rs`).
pub const KEEP: u8 = 1;
pub const DROP: u8 = 0;

/// [`connect_streams`]; with `decided`, each stream then reads the peer's
/// decision, and None means the peer keeps its own link instead.
pub fn connect_streams_deciding(
    ctx: &LinkCtx,
    peer: usize,
    deadline: Instant,
    warn: &mut dyn FnMut(String),
    decided: bool,
) -> Result<Option<(Vec<TcpStream>, Unreachable)>> {
    let npaths = ctx.paths_to(peer);
    let mut failed: Unreachable = Vec::new();
    let mut v = Vec::new();
    for s in 0..ctx.streams_to(peer) {
        // Its own path first, then (with several) the others, each tried
        // once per peer.
        let mut sock = None;
        for path in (0..npaths).map(|k| (s + k) % npaths) {
            if failed.iter().any(|(p, _)| *p == path) {
                continue;
            }
            let addr = ctx.infos.nic_addr(peer, path);
            // From this rank's NIC of the same rail (with one NIC, the
            // kernel's choice).
            let from = (npaths > 1).then(|| ctx.my_ips[path]);
            let until = if npaths > 1 {
                deadline.min(Instant::now() + PATH_CONNECT)
            } else {
                deadline
            };
            let via = from.map(|ip| format!(" from {ip}")).unwrap_or_default();
            match connect(
                addr,
                from,
                &ctx.secret,
                &ctx.comm_id,
                ctx.rank,
                s,
                peer,
                until,
            ) {
                Ok(c) if decided => match read_decision(&c, deadline) {
                    Ok(KEEP) => {
                        sock = Some(c);
                        break;
                    }
                    Ok(_) => return Ok(None),
                    Err(e) => {
                        return Err(blame(
                            ctx,
                            format!("connecting to rank {peer} at {addr}: {e}"),
                            Some(peer),
                        ))
                    }
                },
                Ok(c) => {
                    sock = Some(c);
                    break;
                }
                Err(e) if npaths > 1 => {
                    warn(format!(
                        "the path{via} to rank {peer} at {addr} does not connect ({e}); \
                         its streams use the other paths, and it stays down"
                    ));
                    failed.push((path, format!("did not connect at start-up: {e}")));
                }
                Err(e) => {
                    return Err(blame(
                        ctx,
                        format!("connecting to rank {peer} at {addr}{via}: {e}"),
                        Some(peer),
                    ))
                }
            }
        }
        let Some(sock) = sock else {
            let tried: Vec<String> = failed
                .iter()
                .map(|(p, why)| format!("{} ({why})", ctx.infos.nic_addr(peer, *p)))
                .collect();
            return Err(blame(
                ctx,
                format!("no path to rank {peer} connects: {}", tried.join("; ")),
                Some(peer),
            ));
        };
        v.push(sock);
    }
    Ok(Some((v, failed)))
}

fn read_decision(mut s: &TcpStream, deadline: Instant) -> std::io::Result<u8> {
    use std::io::Read;
    let left = deadline.saturating_duration_since(Instant::now());
    s.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b)?;
    s.set_read_timeout(None)?;
    Ok(b[0])
}

/// The link to `peer` over its connected streams (in stream order), with
/// failover set up; `unreachable`: the paths this side could not connect.
pub fn tcp_link(
    ctx: &LinkCtx,
    peer: usize,
    socks: Vec<TcpStream>,
    unreachable: &[(usize, String)],
    warn: &mut dyn FnMut(String),
) -> Result<TcpLink> {
    let npaths = ctx.paths_to(peer);
    let mut link = TcpLink::new(peer, socks, npaths)
        .map_err(|e| blame(ctx, format!("rank {peer}: {e}"), Some(peer)))?;
    let names = (0..npaths)
        .map(|p| {
            let mine = ctx
                .my_ips
                .get(p)
                .map_or_else(|| "?".into(), |a| a.to_string());
            format!("{mine} -> {}", ctx.infos.nic_addr(peer, p).ip())
        })
        .collect();
    let log_as = (ctx.debug >= DebugLevel::Warn).then(|| format!("cadence rank {}", ctx.rank));
    link.set_failover(ctx.path_timeout, ctx.infos.host(peer), names, log_as);
    if npaths > 1 {
        // Each stream's path is its local NIC: a stream whose own path did
        // not connect runs on another (see above), on either side.
        let path_of: Vec<usize> = link
            .local_ips()
            .iter()
            .enumerate()
            .map(|(s, ip)| {
                ip.and_then(|ip| ctx.my_ips.iter().position(|m| *m == ip))
                    .filter(|&p| p < npaths)
                    .unwrap_or(s % npaths)
            })
            .collect();
        for p in link.place_streams(path_of, unreachable) {
            if !unreachable.iter().any(|(q, _)| *q == p) {
                warn(format!(
                    "path {p} to rank {peer} carries no stream (the peer could not \
                     connect on it); it stays down"
                ));
            }
        }
    }
    Ok(link)
}
