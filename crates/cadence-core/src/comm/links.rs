//! Making one TCP link to one peer: its streams (connected, each on its
//! path, with failover across paths at start-up) and the link built from
//! them. Used at set-up for every peer (`CADENCE_CONNECT=eager`,
//! `bootstrap.rs`) and on first use (`lazy.rs`).

use super::PeerTable;
use crate::config::DebugLevel;
use crate::engine::LinkUse;
use crate::error::{CommError, ErrorKind, Result};
use crate::fabric::planner::{Lessee, Planner, PlannerAddr, QUEUED_AT_MOST};
use crate::transport::handshake::JobSecret;
use crate::transport::tcp::poll_fds;
use crate::transport::tcp::{PathHolds, TcpLink};
use crate::transport::tcp_setup::{connect, Dial, Dialer};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long one stream may try to connect on one path, when a peer has
/// several, before the path counts as unreachable and the stream goes on
/// another (at start-up; the listener may still be coming up, so a refused
/// connection is tried again until then).
const PATH_CONNECT: Duration = Duration::from_secs(10);
/// How long a stream's TCP connect may take in a link's [`Flight`] before
/// the stream goes the patient way ([`patiently`]): a listener that is up
/// accepts in a round trip.
const FIRST_TRY: Duration = Duration::from_secs(1);

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
    /// The cluster's path planner, when the job has one
    /// (`CADENCE_PLANNER`): source ports for each stream.
    pub planner: Option<PlannerLease>,
}

/// This rank's lease with the path planner, opened with the first link
/// the rank dials or accepts (so that both ends of a link hear the link
/// events that concern it); after a failure it is given up for good (one
/// warning): the links dial as before and ECMP picks their paths.
pub struct PlannerLease {
    at: PlannerAddr,
    comm_id: String,
    state: Mutex<LeaseState>,
    /// The streams the planner's link events hold down, which every link
    /// of the rank follows.
    holds: Arc<PathHolds>,
    /// How long a request may wait while the planner says it is queued: a
    /// link's dial waits for it, so well inside the communicator's timeout.
    queued_at_most: Duration,
}

enum LeaseState {
    Unopened,
    Open(Planner),
    GivenUp,
}

impl PlannerLease {
    /// `timeout`: the communicator's (`CADENCE_TIMEOUT`).
    pub fn new(at: PlannerAddr, comm_id: &str, timeout: Duration) -> PlannerLease {
        PlannerLease {
            at,
            comm_id: comm_id.to_string(),
            state: Mutex::new(LeaseState::Unopened),
            holds: Arc::new(PathHolds::default()),
            queued_at_most: QUEUED_AT_MOST.min(timeout / 4),
        }
    }

    /// The lease's name for `rank` of this communicator (the planner tells
    /// each end of a connection by it).
    fn job_of(&self, rank: usize) -> String {
        format!("{}/rank{rank}", self.comm_id)
    }
}

/// A set-up error naming the peer to blame.
pub fn blame(ctx: &LinkCtx, m: String, culprit: Option<usize>) -> CommError {
    let mut e = CommError::new(ErrorKind::Setup { detail: m, culprit });
    e.rank = Some(ctx.rank);
    e.comm_id = ctx.comm_id.as_str().into();
    e
}

impl LinkCtx {
    /// This rank, as it dials its peers.
    pub fn dialer(&self) -> Dialer<'_> {
        Dialer {
            secret: &self.secret,
            comm_id: &self.comm_id,
            rank: self.rank,
            say_ports: self.debug >= DebugLevel::Info,
        }
    }
    /// The paths between this rank and `peer` (NIC k to NIC k).
    pub fn paths_to(&self, peer: usize) -> usize {
        self.infos.paths_between(self.rank, peer)
    }
    /// How many streams a link to `peer` has.
    pub fn streams_to(&self, peer: usize) -> usize {
        self.nstreams * self.paths_to(peer)
    }

    /// The source ports the path planner chose for stream `s` of the link
    /// to `peer` (empty: no planner, it failed, or the stream stays inside
    /// a rack). Its path is `s mod paths`, as `Flight::start` deals them.
    /// `used`: what the link carries (what the planner's balance counts).
    pub fn planned_ports(&self, peer: usize, s: usize, used: LinkUse) -> Vec<u16> {
        let Some(lease) = &self.planner else {
            return Vec::new();
        };
        let npaths = self.paths_to(peer);
        let path = s % npaths;
        // The link's streams on this path: the connection the planner plans.
        let on_path: Vec<usize> = (path..self.streams_to(peer)).step_by(npaths).collect();
        let src = SocketAddr::new(self.my_ips[path], 0);
        let dst = self.infos.nic_addr(peer, path);
        let notify = serde_json::json!([
            {"job": lease.job_of(self.rank), "peer": peer, "streams": on_path},
            {"job": lease.job_of(peer), "peer": self.rank, "streams": on_path},
        ]);
        let mut state = self.open_lease(lease);
        let LeaseState::Open(planner) = &mut *state else {
            return Vec::new();
        };
        match planner.ports(peer, path, src, dst, on_path.len(), used.weights(), notify) {
            Ok(ports) => ports[s / npaths].clone(),
            Err(e) => {
                self.give_up(&lease.at, &e);
                *state = LeaseState::GivenUp;
                Vec::new()
            }
        }
    }

    /// The link to `peer` this rank dialed was dropped (the peer keeps its
    /// own): its plan is forgotten.
    pub fn unplan(&self, peer: usize) {
        let Some(lease) = &self.planner else { return };
        let mut state = lease.state.lock().unwrap();
        if let LeaseState::Open(planner) = &mut *state {
            if let Err(e) = planner.unplan(peer) {
                self.give_up(&lease.at, &e);
                *state = LeaseState::GivenUp;
            }
        }
    }

    /// The rank's lease, opened if it was not yet (given up if it cannot
    /// be).
    fn open_lease<'a>(&self, lease: &'a PlannerLease) -> std::sync::MutexGuard<'a, LeaseState> {
        let mut state = lease.state.lock().unwrap();
        if let LeaseState::Unopened = *state {
            let who = Lessee {
                job: lease.job_of(self.rank),
                holds: lease.holds.clone(),
                log_as: (self.debug >= DebugLevel::Warn)
                    .then(|| format!("cadence rank {}", self.rank)),
                log_info: self.debug >= DebugLevel::Info,
                queued_at_most: lease.queued_at_most,
            };
            *state = match Planner::connect(&lease.at, who) {
                Ok(p) => LeaseState::Open(p),
                Err(e) => {
                    self.give_up(&lease.at, &e);
                    LeaseState::GivenUp
                }
            };
        }
        state
    }

    fn give_up(&self, at: &PlannerAddr, why: &str) {
        if self.debug >= DebugLevel::Warn {
            stderr_line!(
                "cadence rank {}: WARN the path planner at {} is not used ({why}): the \
                 fabric's ECMP picks this rank's paths",
                self.rank,
                at.address
            );
        }
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
    connect_streams_deciding(ctx, peer, deadline, warn)?.ok_or_else(|| {
        blame(
            ctx,
            format!("rank {peer} dropped this rank's streams at set-up"),
            Some(peer),
        )
    })
}

/// [`connect_streams`], where the listener may answer that it keeps its
/// own link to this rank instead (links made on first use, `lazy.rs`):
/// then `None`. One [`Flight`], waited for, then [`patiently`].
pub fn connect_streams_deciding(
    ctx: &LinkCtx,
    peer: usize,
    deadline: Instant,
    warn: &mut dyn FnMut(String),
) -> Result<Option<(Vec<TcpStream>, Unreachable)>> {
    // Made whatever the traffic (at set-up, every link): counted as bulk.
    match Flight::start(ctx, peer, deadline, LinkUse::Both).wait(deadline) {
        Landed::Dropped => {
            ctx.unplan(peer);
            Ok(None)
        }
        Landed::Streams(socks) => patiently(ctx, peer, socks, deadline, warn),
    }
}

/// A link's streams on their way at once: each on its own path, its HELLO
/// out as soon as its connect is up, so the whole link waits for one
/// handshake round trip. Nothing here blocks: the engine moves the flights
/// of links made on first use from its own loop (`lazy.rs`).
pub struct Flight {
    peer: usize,
    /// By stream: under way, or done (kept), or failed (`None` in both
    /// `dials` and `socks`: left for [`patiently`]).
    dials: Vec<Option<Dial>>,
    socks: Vec<Option<TcpStream>>,
    dropped: bool,
    deadline: Instant,
}

/// How a flight ended.
pub enum Landed {
    /// The listener keeps its own link to this rank.
    Dropped,
    /// By stream: made, or `None` where it failed (a listener not up yet, a
    /// path down): for [`patiently`].
    Streams(Vec<Option<TcpStream>>),
}

impl Flight {
    /// `used`: what the link will carry, which the path planner balances.
    pub fn start(ctx: &LinkCtx, peer: usize, deadline: Instant, used: LinkUse) -> Flight {
        let npaths = ctx.paths_to(peer);
        let nstreams = ctx.streams_to(peer);
        // A path that fails a stream at once takes no more of them.
        let mut path_failed = vec![false; npaths];
        let mut dials = Vec::with_capacity(nstreams);
        for s in 0..nstreams {
            let path = s % npaths;
            let dial = (!path_failed[path])
                .then(|| {
                    let sports = ctx.planned_ports(peer, s, used);
                    // A planned port is planned from this NIC's address.
                    let from = (npaths > 1 || !sports.is_empty()).then(|| ctx.my_ips[path]);
                    let addr = ctx.infos.nic_addr(peer, path);
                    Dial::start(ctx.dialer(), addr, from, &sports, s, peer, FIRST_TRY).ok()
                })
                .flatten();
            path_failed[path] |= dial.is_none();
            dials.push(dial);
        }
        Flight {
            peer,
            socks: (0..nstreams).map(|_| None).collect(),
            dials,
            dropped: false,
            deadline,
        }
    }

    pub fn peer(&self) -> usize {
        self.peer
    }

    /// What to poll while the flight is under way.
    pub fn fds(&self) -> impl Iterator<Item = libc::pollfd> + '_ {
        self.dials.iter().flatten().map(|d| libc::pollfd {
            fd: d.fd(),
            events: d.events(),
            revents: 0,
        })
    }

    /// Moves every stream on without blocking; `Some` once the flight has
    /// landed. A HELLO that is out waits for its answer until the deadline:
    /// given up sooner, the listener could hold the stream while this rank
    /// makes another.
    pub fn advance(&mut self) -> Option<Landed> {
        let late = Instant::now() > self.deadline;
        for (slot, sock) in self.dials.iter_mut().zip(self.socks.iter_mut()) {
            let Some(dial) = slot else { continue };
            match dial.advance() {
                Ok(None) if !late => {}
                Ok(Some(keep)) => {
                    self.dropped |= !keep;
                    *sock = slot.take().and_then(|d| d.into_stream().ok());
                }
                Ok(None) | Err(_) => *slot = None,
            }
        }
        if self.dials.iter().any(Option::is_some) {
            return None;
        }
        Some(if self.dropped {
            Landed::Dropped
        } else {
            Landed::Streams(std::mem::take(&mut self.socks))
        })
    }

    /// Blocks until the flight has landed.
    pub fn wait(mut self, deadline: Instant) -> Landed {
        loop {
            if let Some(landed) = self.advance() {
                return landed;
            }
            let mut fds: Vec<libc::pollfd> = self.fds().collect();
            let left = deadline.saturating_duration_since(Instant::now());
            poll_fds(&mut fds, left.clamp(Duration::from_micros(100), FIRST_TRY));
        }
    }
}

/// The patient way, for the streams a [`Flight`] did not make (`None` in
/// `socks`): each retried until its path's time is up (the listener may
/// not be up yet), then on the other paths; a path that does not connect
/// is reported in the second value. `None`: the listener keeps its own
/// link to this rank instead.
pub fn patiently(
    ctx: &LinkCtx,
    peer: usize,
    mut socks: Vec<Option<TcpStream>>,
    deadline: Instant,
    warn: &mut dyn FnMut(String),
) -> Result<Option<(Vec<TcpStream>, Unreachable)>> {
    let npaths = ctx.paths_to(peer);
    let from = |path: usize| (npaths > 1).then(|| ctx.my_ips[path]);
    // The time one stream may take on one path.
    let until = || {
        if npaths > 1 {
            deadline.min(Instant::now() + PATH_CONNECT)
        } else {
            deadline
        }
    };
    let mut failed: Unreachable = Vec::new();
    for (s, slot) in socks.iter_mut().enumerate() {
        if slot.is_some() {
            continue;
        }
        // Its own path first, then (with several) the others, each tried
        // once per peer.
        for path in (0..npaths).map(|k| (s + k) % npaths) {
            if failed.iter().any(|(p, _)| *p == path) {
                continue;
            }
            let addr = ctx.infos.nic_addr(peer, path);
            let via = from(path)
                .map(|ip| format!(" from {ip}"))
                .unwrap_or_default();
            // Planned ports only on the stream's own path.
            let sports = if path == s % npaths {
                ctx.planned_ports(peer, s, LinkUse::Both)
            } else {
                Vec::new()
            };
            let src = from(path).or_else(|| (!sports.is_empty()).then(|| ctx.my_ips[path]));
            match connect(ctx.dialer(), addr, src, &sports, s, peer, until()) {
                Ok((_, false)) => return Ok(None),
                Ok((sock, true)) => {
                    *slot = Some(sock);
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
        if slot.is_none() {
            let tried: Vec<String> = failed
                .iter()
                .map(|(p, why)| format!("{} ({why})", ctx.infos.nic_addr(peer, *p)))
                .collect();
            return Err(blame(
                ctx,
                format!("no path to rank {peer} connects: {}", tried.join("; ")),
                Some(peer),
            ));
        }
    }
    let v = socks
        .into_iter()
        .map(|s| s.expect("every stream in"))
        .collect();
    Ok(Some((v, failed)))
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
    // With a path planner, each stream is a path of its own (it crosses
    // the spine planned for it), which link events hold and release.
    let per_stream = ctx.planner.is_some() && socks.len() > 1;
    let nstreams = socks.len();
    let mut link = TcpLink::new(peer, socks, if per_stream { nstreams } else { npaths })
        .map_err(|e| blame(ctx, format!("rank {peer}: {e}"), Some(peer)))?;
    let nic_pair = |p: usize| {
        let mine = ctx
            .my_ips
            .get(p)
            .map_or_else(|| "?".into(), |a| a.to_string());
        format!("{mine} -> {}", ctx.infos.nic_addr(peer, p).ip())
    };
    let names = if per_stream {
        (0..nstreams)
            .map(|s| format!("{} stream {s}", nic_pair(s % npaths)))
            .collect()
    } else {
        (0..npaths).map(nic_pair).collect()
    };
    let log_as = (ctx.debug >= DebugLevel::Warn).then(|| format!("cadence rank {}", ctx.rank));
    link.set_failover(ctx.path_timeout, ctx.infos.host(peer), names, log_as);
    if let Some(lease) = &ctx.planner {
        drop(ctx.open_lease(lease));
        link.follow_holds(lease.holds.clone());
    }
    if npaths > 1 && !per_stream {
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
