//! Bootstrap: every rank listens, learns every rank's record (the peer
//! table, from two store operations of its own: `gather.rs`), then links:
//! shared-memory inboxes with same-host ranks at once, TCP with the others
//! on first use (`lazy.rs`) or, with `CADENCE_CONNECT=eager`, every one now.
//! Every TCP stream proves, in a handshake keyed by the job secret
//! (`transport/handshake.rs`), that it belongs to the communicator.

use super::gather::{self, GatherCtx};
use super::lazy::LazyLinks;
use super::links::{connect_streams, tcp_link, LinkCtx, PlannerLease, Unreachable};
use super::split::Inherited;
use super::{Comm, OpRequest, PeerInfo, PeerTable};
use crate::config::{Config, ConnectMode, DebugLevel};
use crate::engine::{Engine, LinkMaker, LinkUse, Links};
use crate::error::{CommError, ErrorKind, Result};
use crate::rendezvous::Store;
use crate::transport::handshake::JobSecret;
use crate::transport::shm::{open_peer_inbox, Inbox, ShmLink};
use crate::transport::tcp_setup::accept_all;
use crate::transport::Link;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// When ranks loaded different files of one kind (their `path#hash` from
/// `field`; different paths with the same text are fine), what to tell the
/// user.
fn differing_files(
    table: &PeerTable,
    field: impl Fn(&PeerTable, usize) -> &str,
    what: &str,
    var: &str,
    decides: &str,
) -> Option<String> {
    fn hash_of(t: &str) -> &str {
        t.rsplit_once('#').map_or("", |x| x.1)
    }
    let first = field(table, 0);
    // Ranks that share rank 0's files share its text: compared by index.
    let other = (1..table.len())
        .filter(|&r| !table.same_files(r, 0))
        .find(|&r| hash_of(field(table, r)) != hash_of(first))?;
    // "" is none; "#how" none, with how the ranks order otherwise.
    let name = |t: &str| match t.strip_prefix('#') {
        _ if t.is_empty() => format!("no {what}"),
        Some(how) => format!("no {what} ({how})"),
        None => format!("{what} {t}"),
    };
    Some(format!(
        "ranks loaded different {what}s, so they would choose different {decides}: rank 0 \
         has {}, rank {other} has {} (copy one file to every host or set {var} alike)",
        name(first),
        name(field(table, other))
    ))
}

/// The kernel's boot id: the same in every namespace of one machine.
fn machine_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn inbox_path(comm_id: &str, rank: usize) -> PathBuf {
    PathBuf::from(format!("/dev/shm/cadence-{comm_id}-r{rank}"))
}

/// A communicator being set up: it listens, and says where (`info`), before
/// it knows its peers.
pub struct Bootstrap {
    pub comm_id: String,
    /// The job the communicator belongs to, as its dumps say (default: the
    /// communicator id; see [`Bootstrap::set_job`]).
    pub job: String,
    pub rank: usize,
    pub nranks: usize,
    pub info: PeerInfo,
    /// One per NIC, in the order of `info.addrs`.
    listeners: Vec<TcpListener>,
    pub(super) cfg: Config,
    secret: JobSecret,
    warn: Option<Box<dyn FnMut(String) + Send + Sync>>,
    /// How long the peer-table exchange took (for the set-up's INFO line).
    exchanged_in: Option<Duration>,
}

impl Bootstrap {
    pub fn new(
        comm_id: &str,
        rank: usize,
        nranks: usize,
        host: &str,
        ip: IpAddr,
        cfg: Config,
        secret: JobSecret,
    ) -> Result<Bootstrap> {
        Self::with_nics(comm_id, rank, nranks, host, &[ip], cfg, secret)
    }

    /// [`Bootstrap::new`] listening on several NICs (one address each): a
    /// peer host reaches this rank over every NIC the two have in common,
    /// and a message between them is striped over all of them.
    pub fn with_nics(
        comm_id: &str,
        rank: usize,
        nranks: usize,
        host: &str,
        ips: &[IpAddr],
        cfg: Config,
        secret: JobSecret,
    ) -> Result<Bootstrap> {
        if ips.is_empty() {
            return Err(CommError::invalid("no address to listen on".to_string()));
        }
        super::limits::raise_open_files(cfg.debug);
        if nranks == 0 || rank >= nranks {
            return Err(CommError::invalid(format!(
                "rank {rank} is not in a world of {nranks}"
            )));
        }
        if comm_id.is_empty()
            || comm_id.len() > 32
            || !comm_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(CommError::invalid(format!(
                "bad communicator id {comm_id:?}"
            )));
        }
        let mut listeners = Vec::with_capacity(ips.len());
        let mut addrs = Vec::with_capacity(ips.len());
        for &ip in ips {
            let l = TcpListener::bind(SocketAddr::new(ip, 0))
                .map_err(|e| CommError::setup(format!("cannot listen on {ip}: {e}")))?;
            addrs.push(
                l.local_addr()
                    .map_err(|e| CommError::setup(e.to_string()))?
                    .to_string(),
            );
            listeners.push(l);
        }
        Ok(Bootstrap {
            comm_id: comm_id.to_string(),
            job: comm_id.to_string(),
            rank,
            nranks,
            info: PeerInfo {
                rank,
                host: host.to_string(),
                machine: machine_id(),
                tuning: cfg
                    .tuning
                    .as_ref()
                    .map(|t| format!("{}#{:016x}", t.path.display(), t.hash))
                    .unwrap_or_default(),
                topo: cfg.topo.fingerprint(),
                pid: std::process::id(),
                addr: addrs[0].clone(),
                addrs: if addrs.len() > 1 { addrs } else { Vec::new() },
            },
            listeners,
            cfg,
            secret,
            warn: None,
            exchanged_in: None,
        })
    }

    /// The configuration the communicator will run with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Names the job this communicator belongs to (a sub-communicator
    /// takes its parent's), so that `cadence doctor` can tell dumps of one
    /// job from another's. Every rank must give the same.
    pub fn set_job(&mut self, job: &str) -> Result<()> {
        if job.is_empty()
            || job.len() > 64
            || !job
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
        {
            return Err(CommError::invalid(format!("bad job id {job:?}")));
        }
        self.job = job.to_string();
        Ok(())
    }

    /// Where set-up warnings go (dropped connections, ...) instead of
    /// stderr (which prints them at `CADENCE_DEBUG=WARN` and above).
    pub fn on_warn(&mut self, f: impl FnMut(String) + Send + Sync + 'static) {
        self.warn = Some(Box::new(f));
    }

    /// Joins the communicator through `store` (keys under `prefix`): two
    /// store operations, the peer table completed among the ranks
    /// ([`Bootstrap::exchange`]), then the links ([`Bootstrap::connect`]).
    pub fn join(self, store: &dyn Store, prefix: &str) -> Result<Comm> {
        let wait = self.cfg.timeout;
        self.join_within(store, prefix, wait)
    }

    /// [`Bootstrap::join`], waiting up to `wait` for the other ranks to
    /// join (a store's own timeout may exceed the operations' deadline).
    pub fn join_within(mut self, store: &dyn Store, prefix: &str, wait: Duration) -> Result<Comm> {
        let started = Instant::now();
        let table = self.exchange_within(store, prefix, wait)?;
        self.exchanged_in = Some(started.elapsed());
        self.connect_table(table)
    }

    /// Every rank's [`PeerInfo`], from two store operations of this rank's
    /// own (`comm/gather.rs`).
    pub fn exchange(&self, store: &dyn Store, prefix: &str) -> Result<PeerTable> {
        self.exchange_within(store, prefix, self.cfg.timeout)
    }

    /// [`Bootstrap::exchange`], waiting up to `wait` for the other ranks.
    pub fn exchange_within(
        &self,
        store: &dyn Store,
        prefix: &str,
        wait: Duration,
    ) -> Result<PeerTable> {
        let ctx = GatherCtx {
            comm_id: &self.comm_id,
            rank: self.rank,
            nranks: self.nranks,
            secret: &self.secret,
            deadline: Instant::now() + wait,
            log: (self.cfg.debug >= DebugLevel::Info)
                .then(|| format!("cadence rank {}", self.rank)),
            warn_as: (self.cfg.debug >= DebugLevel::Warn)
                .then(|| format!("cadence rank {}", self.rank)),
        };
        let fail = |m: String| {
            let mut e = CommError::setup(m);
            e.rank = Some(self.rank);
            e
        };
        let ip = self.listeners[0]
            .local_addr()
            .map_err(|e| fail(format!("listener: {e}")))?
            .ip();
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))
            .map_err(|e| fail(format!("cannot listen on {ip}: {e}")))?;
        let addr = listener.local_addr().map_err(|e| fail(e.to_string()))?;
        store
            .set(
                &gather::gather_key(prefix, self.rank),
                addr.to_string().as_bytes(),
            )
            .map_err(|e| fail(format!("the Store failed: {e}")))?;
        gather::allgather(&ctx, &self.info, listener, store, prefix)
    }

    /// Connects to every peer, given every rank's published [`PeerInfo`]
    /// (ranks 0, 1, ... in order).
    pub fn connect(self, infos: Vec<PeerInfo>) -> Result<Comm> {
        if infos.iter().enumerate().any(|(i, p)| p.rank != i) {
            return Err(self.fail_setup(format!(
                "expected peer info for ranks 0..{} in order",
                self.nranks
            )));
        }
        let table = PeerTable::from_records(&infos).map_err(|m| self.fail_setup(m))?;
        self.connect_table(table)
    }

    fn fail_setup(&self, m: String) -> CommError {
        let mut e = CommError::setup(m);
        e.rank = Some(self.rank);
        e.comm_id = self.comm_id.as_str().into();
        e
    }

    /// Connects to every peer of `table` (from [`Bootstrap::exchange`]).
    pub fn connect_table(self, table: PeerTable) -> Result<Comm> {
        self.connect_inheriting(table, None)
    }

    /// [`Bootstrap::connect_table`]; with `inherited` (a split), the
    /// start-up measurements come from the parent instead of being taken.
    pub(super) fn connect_inheriting(
        mut self,
        table: PeerTable,
        mut inherited: Option<Inherited>,
    ) -> Result<Comm> {
        let (rank, n) = (self.rank, self.nranks);
        let mut phases = Phases::new(self.exchanged_in);
        let mut sink = self.warn.take();
        // Set-up errors, with the rank to blame when one is (`blaming`).
        let blaming = |m: String, culprit: Option<usize>| {
            let mut e = CommError::new(ErrorKind::Setup { detail: m, culprit });
            e.rank = Some(rank);
            e.comm_id = self.comm_id.as_str().into();
            e
        };
        let fail = |m: String| blaming(m, None);
        if table.len() != n {
            return Err(fail(format!(
                "expected peer info for ranks 0..{n}, got {}",
                table.len()
            )));
        }
        let tuning = differing_files(
            &table,
            PeerTable::tuning,
            "tuning table",
            "CADENCE_TUNING_FILE",
            "algorithms",
        );
        let topo = || {
            differing_files(
                &table,
                PeerTable::topo,
                "topology file",
                "CADENCE_TOPO_FILE",
                "ring orders",
            )
        };
        if let Some(m) = tuning.or_else(topo) {
            return Err(fail(m));
        }
        // One table for the links and the communicator.
        let infos = std::sync::Arc::new(table);
        let deadline = Instant::now() + self.cfg.timeout;
        let local: Vec<usize> = (0..n).filter(|&r| infos.same_host(r, rank)).collect();
        let my_local = local
            .iter()
            .position(|&r| r == rank)
            .expect("self is local");
        let mut links = Links::new(n);

        // Shared memory with same-host peers.
        let inbox = if local.len() > 1 {
            let path = inbox_path(&self.comm_id, rank);
            let _ = std::fs::remove_file(&path);
            let inbox = Inbox::create(&path, local.len(), self.cfg.shm).map_err(fail)?;
            for (li, &peer) in local.iter().enumerate() {
                if peer == rank {
                    continue;
                }
                let (region, pid) = open_peer_inbox(&inbox_path(&self.comm_id, peer), deadline)
                    .map_err(|e| blaming(format!("rank {peer}: {e}"), Some(peer)))?;
                let link = Link::shm(ShmLink::new(peer, &inbox, region, pid, my_local, li));
                links
                    .insert(peer, link)
                    .map_err(|_| fail(format!("two links to rank {peer}")))?;
            }
            Some(inbox)
        } else {
            None
        };

        // TCP with other hosts: every link now (eager: the higher rank
        // connects, the lower accepts), or each on first use.
        let ctx = LinkCtx {
            comm_id: self.comm_id.clone(),
            rank,
            secret: self.secret.clone(),
            infos: infos.clone(),
            my_ips: self
                .listeners
                .iter()
                .map(|l| l.local_addr().map(|a| a.ip()))
                .collect::<std::io::Result<_>>()
                .map_err(|e| fail(format!("listener: {e}")))?,
            nstreams: self.cfg.nstreams,
            path_timeout: self.cfg.path_timeout,
            debug: self.cfg.debug,
            planner: self
                .cfg
                .planner
                .clone()
                .map(|at| PlannerLease::new(at, &self.comm_id, self.cfg.timeout)),
        };
        let debug = self.cfg.debug;
        let mut warn = |m: String| match &mut sink {
            Some(f) => f(m),
            None if debug >= DebugLevel::Warn => stderr_line!("cadence rank {rank}: WARN {m}"),
            None => {}
        };
        let mut maker = None;
        // A split sharing its root's links makes none, and listens for none.
        let share = inherited.as_mut().and_then(|i| i.share.take());
        if share.is_some() {
            drop(self.listeners);
        } else if self.cfg.connect == ConnectMode::Eager {
            let mut streams: HashMap<usize, Vec<Option<std::net::TcpStream>>> = HashMap::new();
            let mut unreachable: HashMap<usize, Unreachable> = HashMap::new();
            for peer in (0..rank).filter(|p| !infos.same_host(*p, rank)) {
                let (v, failed) = connect_streams(&ctx, peer, deadline, &mut warn)?;
                unreachable.insert(peer, failed);
                streams.insert(peer, v.into_iter().map(Some).collect());
            }
            let expected: Vec<(usize, usize)> = ((rank + 1)..n)
                .filter(|p| !infos.same_host(*p, rank))
                .flat_map(|p| (0..ctx.streams_to(p)).map(move |s| (p, s)))
                .collect();
            for ((peer, s), sock) in accept_all(
                &self.listeners,
                &self.secret,
                &self.comm_id,
                rank,
                &expected,
                deadline,
                &mut warn,
            )
            .map_err(|e| blaming(e.detail, e.culprit))?
            {
                streams
                    .entry(peer)
                    .or_insert_with(|| (0..ctx.streams_to(peer)).map(|_| None).collect())[s] =
                    Some(sock);
            }
            drop(self.listeners);
            for (peer, v) in streams {
                let socks: Vec<_> = v
                    .into_iter()
                    .map(|s| s.expect("all streams connected"))
                    .collect();
                let why = unreachable.remove(&peer).unwrap_or_default();
                let link = tcp_link(&ctx, peer, socks, &why, &mut warn)?;
                links
                    .insert(peer, Link::tcp(link))
                    .map_err(|_| fail(format!("two links to rank {peer}")))?;
            }
        } else {
            // Links on first use (`lazy.rs`): the listeners stay open.
            let mut lazy = LazyLinks::start(ctx, self.listeners, self.cfg.timeout)
                .map_err(|e| fail(format!("cannot start accepting links: {e}")))?;
            // The set-up barrier's links, all at once rather than one per
            // round: r signals r + 2^k (the rank below makes the other).
            let mut dist = 1;
            while dist < n {
                let to = (rank + dist) % n;
                if !infos.same_host(to, rank) {
                    // In a ring in rank order the link to the next rank
                    // carries the bulk, one way (both, where the next rank
                    // is also the one before: two ranks); the barrier's
                    // others a few bytes (counted, they took the spines
                    // that ring links needed).
                    let used = if dist == 1 && n == 2 {
                        LinkUse::Both
                    } else if dist == 1 {
                        LinkUse::Forward
                    } else {
                        LinkUse::Light
                    };
                    lazy.request(to, used);
                }
                dist *= 2;
            }
            maker = Some(Box::new(lazy) as Box<dyn LinkMaker>);
        }

        phases.end("links");
        if let Some(m) = maker {
            links.set_maker(m);
        }
        let mut engine = Engine::new(rank, n, links, inbox);
        // Ranks that compete for this machine's cores, whatever host they
        // emulate.
        let on_machine = (0..n).filter(|&r| infos.same_machine(r, rank)).count();
        engine.override_wait(self.cfg.spin, self.cfg.yield_for);
        engine.set_local_ranks(on_machine.max(local.len()));
        engine.diagnosis_grace =
            (self.cfg.timeout / 4).clamp(Duration::from_millis(500), Duration::from_secs(3));
        let mut comm = Comm::from_parts(self.comm_id, self.job, rank, infos, engine, self.cfg);
        if let Some(share) = share {
            let _ = comm.shared.share.set(share);
        }
        // Everyone has mapped everyone's inbox once a barrier completes; then
        // the names can go, so a crash later leaves nothing in /dev/shm.
        comm.run(OpRequest::barrier())?;
        phases.end("barrier");
        let inner = comm.shared.inner.lock().unwrap();
        if let Some(inbox) = &inner.engine.inbox {
            inbox.region.unlink();
        }
        drop(inner);
        match inherited {
            Some(from) => comm.inherit(from)?,
            None => {
                comm.measure_clock()?;
                phases.end("clock");
                comm.order_from_profile()?;
                phases.end("profile");
                comm.calibrate()?;
                phases.end("calibration");
            }
        }
        if rank == 0 && debug >= DebugLevel::Info {
            stderr_line!("cadence rank 0 INFO: set-up took {}", phases.summary());
        }
        comm.reset_totals();
        comm.announce_selection();
        comm.start_path_keeper();
        Ok(comm)
    }
}

/// The set-up's stages and how long each took, for rank 0's INFO line (an
/// operator whose job starts slowly sees where the time went).
struct Phases {
    at: Instant,
    took: Vec<(&'static str, Duration)>,
}

impl Phases {
    fn new(exchanged_in: Option<Duration>) -> Phases {
        Phases {
            at: Instant::now(),
            took: exchanged_in
                .map(|d| ("peer table", d))
                .into_iter()
                .collect(),
        }
    }

    fn end(&mut self, stage: &'static str) {
        let now = Instant::now();
        self.took.push((stage, now - self.at));
        self.at = now;
    }

    fn summary(&self) -> String {
        let total: Duration = self.took.iter().map(|t| t.1).sum();
        let parts: Vec<String> = self
            .took
            .iter()
            .map(|(stage, d)| format!("{stage} {:.1}", d.as_secs_f64() * 1e3))
            .collect();
        format!(
            "{:.1} ms: {} (ms)",
            total.as_secs_f64() * 1e3,
            parts.join(", ")
        )
    }
}
