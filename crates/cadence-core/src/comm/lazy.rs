//! Links to other hosts made on first use (`CADENCE_CONNECT=lazy`, the
//! default): the engine asks for a link when a send first needs the peer
//! (`engine/lazy.rs`) and moves the link's [`Flight`] from its own loop,
//! without blocking, while every other link's traffic moves: the streams
//! dial at once and the link is up after one handshake round trip. A
//! stream the flight could not make (a listener not up yet, a path down)
//! is made the patient way on a thread of its own. An acceptor thread
//! takes the links peers make to this rank, for the communicator's life.
//!
//! Both ends may start at once. Each side keeps one state per peer, under
//! one lock with its acceptor: none → connecting (it asked first) or
//! accepted (the peer's streams came first). The listener's WELCOME says
//! for each stream: keep, or drop when it is itself connecting and its
//! rank is the higher. So exactly the higher rank's link survives a race,
//! on both sides, and a rank whose streams were dropped waits for the
//! peer's, which its acceptor keeps. A link's streams send their HELLOs in
//! one flight and read their answers after (`links.rs`): one handshake
//! round trip for the whole link.

use super::links::{patiently, tcp_link, Flight, Landed, LinkCtx};
use crate::engine::{LinkMaker, LinkUse};
use crate::error::ErrorKind;
use crate::transport::handshake::Expected;
use crate::transport::tcp_setup::{accept_each, Stop};
use crate::transport::Link;
use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, PartialEq, Eq)]
enum PeerState {
    /// This rank asked first: its connecting thread runs.
    Connecting,
    /// The peer's streams are being (or were) kept.
    Accepted,
}

/// What the engine's thread and the background threads share.
struct Shared {
    /// By peer, for the peers a link was asked for or came from (a rank
    /// uses few of the job's); absent: neither yet.
    states: Mutex<HashMap<usize, PeerState>>,
    /// Links (or failures) for the engine to take.
    ready: Mutex<Vec<(usize, Result<Link, ErrorKind>)>>,
    any_ready: AtomicBool,
    /// Set, then rung, when the communicator ends: the acceptor's cue.
    stop: AtomicBool,
    stop_bell: UnixStream,
    stop_rx: UnixStream,
    /// Rung (one byte) when something is delivered; the engine polls the
    /// other end while it waits for a link (a socket pair: no unsafe).
    bell: UnixStream,
    bell_rx: UnixStream,
}

impl Shared {
    fn deliver(&self, peer: usize, made: Result<Link, ErrorKind>) {
        self.ready.lock().unwrap().push((peer, made));
        self.any_ready.store(true, Ordering::Release);
        // Full (the engine has not drained it yet) is as good as rung.
        let _ = (&self.bell).write(&[1]);
    }
}

pub struct LazyLinks {
    ctx: Arc<LinkCtx>,
    shared: Arc<Shared>,
    /// Peers asked for (by the engine's thread only).
    asked: HashSet<usize>,
    /// Links on their way, moved by the engine's thread.
    flights: Vec<Flight>,
    timeout: Duration,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

impl LazyLinks {
    /// Starts accepting on `listeners` the links of the peers on other
    /// hosts.
    pub fn start(
        ctx: LinkCtx,
        listeners: Vec<TcpListener>,
        timeout: Duration,
    ) -> std::io::Result<LazyLinks> {
        let ctx = Arc::new(ctx);
        let (bell, bell_rx) = UnixStream::pair()?;
        bell.set_nonblocking(true)?;
        bell_rx.set_nonblocking(true)?;
        let (stop_bell, stop_rx) = UnixStream::pair()?;
        stop_bell.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            states: Mutex::new(HashMap::new()),
            ready: Mutex::new(Vec::new()),
            any_ready: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            stop_bell,
            stop_rx,
            bell,
            bell_rx,
        });
        let (c, s) = (ctx.clone(), shared.clone());
        let acceptor = std::thread::Builder::new()
            .name("cadence-accept".into())
            .stack_size(512 << 10)
            .spawn(move || accept_loop(&c, &s, listeners))?;
        Ok(LazyLinks {
            ctx,
            shared,
            asked: HashSet::new(),
            flights: Vec::new(),
            timeout,
            acceptor: Some(acceptor),
        })
    }
}

impl Drop for LazyLinks {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = (&self.shared.stop_bell).write(&[1]);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

fn warn_line(ctx: &LinkCtx, m: String) {
    if ctx.debug >= crate::config::DebugLevel::Warn {
        stderr_line!("cadence rank {}: WARN {m}", ctx.rank);
    }
}

fn accept_loop(ctx: &LinkCtx, shared: &Shared, listeners: Vec<TcpListener>) {
    // Any stream of a peer on another host.
    let n = ctx.infos.len();
    let admits = |(p, s): (usize, usize)| {
        p < n && !ctx.infos.same_host(p, ctx.rank) && s < ctx.streams_to(p)
    };
    let mut partial: std::collections::HashMap<usize, Vec<Option<TcpStream>>> =
        std::collections::HashMap::new();
    let mut warn = |m: String| warn_line(ctx, m);
    // Accepts for the communicator's life; each stream is judged as it
    // completes its handshake.
    let far = Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600);
    // Whether the peer's streams are kept: yes unless this rank is making
    // its own link to the peer and its rank is the higher.
    let mut keep = |(peer, _): (usize, usize)| {
        let mut st = shared.states.lock().unwrap();
        let keep = match st.get(&peer) {
            None | Some(PeerState::Accepted) => true,
            Some(PeerState::Connecting) => peer > ctx.rank,
        };
        if keep {
            st.insert(peer, PeerState::Accepted);
        }
        keep
    };
    let mut deliver = |(peer, s): (usize, usize), sock: TcpStream| {
        if let Err(e) = sock.set_nonblocking(false) {
            shared.deliver(
                peer,
                Err(ErrorKind::PeerClosed {
                    peer,
                    detail: format!("its link closed while being made: {e}"),
                }),
            );
            return;
        }
        let want = ctx.streams_to(peer);
        let slots = partial
            .entry(peer)
            .or_insert_with(|| (0..want).map(|_| None).collect());
        slots[s] = Some(sock);
        if slots.iter().all(Option::is_some) {
            let socks = partial
                .remove(&peer)
                .expect("present")
                .into_iter()
                .map(|s| s.expect("all in"))
                .collect();
            let mut w = |m: String| warn_line(ctx, m);
            let made = tcp_link(ctx, peer, socks, &[], &mut w)
                .map(Link::tcp)
                .map_err(|e| e.kind);
            shared.deliver(peer, made);
        }
    };
    let stop = Stop {
        flag: &shared.stop,
        fd: shared.stop_rx.as_raw_fd(),
    };
    if let Err(e) = accept_each(
        &listeners,
        &ctx.secret,
        &ctx.comm_id,
        ctx.rank,
        Expected::Admitted(&admits),
        far,
        &mut warn,
        &mut keep,
        &mut deliver,
        Some(stop),
    ) {
        warn_line(ctx, format!("accepting links stopped: {}", e.detail));
    }
}

impl LazyLinks {
    /// Makes the streams a flight could not on a thread of its own: it
    /// retries until the listener is up, or tries the other paths.
    fn finish_patiently(&mut self, peer: usize, socks: Vec<Option<std::net::TcpStream>>) {
        let (ctx, shared, timeout) = (self.ctx.clone(), self.shared.clone(), self.timeout);
        let spawned = std::thread::Builder::new()
            .name("cadence-connect".into())
            .stack_size(256 << 10)
            .spawn(move || {
                let mut warn = |m: String| warn_line(&ctx, m);
                let deadline = Instant::now() + timeout;
                match patiently(&ctx, peer, socks, deadline, &mut warn) {
                    Ok(Some((socks, unreachable))) => {
                        let made = tcp_link(&ctx, peer, socks, &unreachable, &mut warn)
                            .map(Link::tcp)
                            .map_err(|e| e.kind);
                        shared.deliver(peer, made);
                    }
                    // The peer keeps its own link: its acceptor delivers it.
                    Ok(None) => {}
                    Err(e) => shared.deliver(peer, Err(e.kind)),
                }
            });
        if let Err(e) = spawned {
            self.shared.deliver(
                peer,
                Err(ErrorKind::Setup {
                    detail: format!("cannot start connecting to rank {peer}: {e}"),
                    culprit: None,
                }),
            );
        }
    }
}

impl LinkMaker for LazyLinks {
    fn request(&mut self, peer: usize, used: LinkUse) {
        if !self.asked.insert(peer) {
            return;
        }
        {
            let mut st = self.shared.states.lock().unwrap();
            if st.contains_key(&peer) {
                return;
            }
            st.insert(peer, PeerState::Connecting);
        }
        let deadline = Instant::now() + self.timeout;
        self.flights
            .push(Flight::start(&self.ctx, peer, deadline, used));
    }

    fn in_flight(&self) -> bool {
        !self.flights.is_empty()
    }

    fn flight_fds(&self, out: &mut Vec<libc::pollfd>) {
        for f in &self.flights {
            out.extend(f.fds());
        }
    }

    fn advance(&mut self) {
        let mut i = 0;
        while i < self.flights.len() {
            let Some(landed) = self.flights[i].advance() else {
                i += 1;
                continue;
            };
            let peer = self.flights.swap_remove(i).peer();
            match landed {
                // The peer keeps its own link: the acceptor delivers it.
                Landed::Dropped => self.ctx.unplan(peer),
                Landed::Streams(socks) if socks.iter().all(Option::is_some) => {
                    let mut warn = |m: String| warn_line(&self.ctx, m);
                    let socks = socks.into_iter().flatten().collect();
                    let made = tcp_link(&self.ctx, peer, socks, &[], &mut warn)
                        .map(Link::tcp)
                        .map_err(|e| e.kind);
                    self.shared.deliver(peer, made);
                }
                Landed::Streams(socks) => self.finish_patiently(peer, socks),
            }
        }
    }

    fn has_ready(&self) -> bool {
        self.shared.any_ready.load(Ordering::Acquire)
    }

    fn wake_fd(&self) -> RawFd {
        self.shared.bell_rx.as_raw_fd()
    }

    fn take_ready(&mut self) -> Vec<(usize, Result<Link, ErrorKind>)> {
        self.shared.any_ready.store(false, Ordering::Release);
        let mut drain = [0u8; 64];
        while matches!((&self.shared.bell_rx).read(&mut drain), Ok(n) if n > 0) {}
        let out = std::mem::take(&mut *self.shared.ready.lock().unwrap());
        for (p, _) in &out {
            self.asked.insert(*p);
        }
        out
    }
}
