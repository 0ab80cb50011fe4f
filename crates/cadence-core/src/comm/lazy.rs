//! Links to other hosts made on first use (`CADENCE_CONNECT=lazy`, the
//! default): the engine asks for a link when a transfer first needs the
//! peer (`engine/lazy.rs`); a thread connects its streams while every other
//! link's traffic moves, and an acceptor thread takes the links peers make
//! to this rank, for the communicator's life.
//!
//! Both ends may start at once. Each side keeps one state per peer, under
//! one lock with its acceptor: none → connecting (it asked first) or
//! accepted (the peer's streams came first). After the handshake the
//! listener answers each stream with one byte: keep, or drop when it is
//! itself connecting and its rank is the higher. So exactly the higher
//! rank's link survives a race, on both sides, and a rank whose streams
//! were dropped waits for the peer's, which its acceptor keeps.

use super::links::{connect_streams_deciding, tcp_link, LinkCtx, DROP, KEEP};
use crate::engine::LinkMaker;
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
    let mut deliver = |(peer, s): (usize, usize), sock: TcpStream| {
        let keep = {
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
        let answered = sock
            .set_nonblocking(false)
            .and_then(|_| sock.set_write_timeout(Some(Duration::from_secs(5))))
            .and_then(|_| (&sock).write_all(&[if keep { KEEP } else { DROP }]))
            .and_then(|_| sock.set_write_timeout(None));
        if !keep {
            return;
        }
        if let Err(e) = answered {
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
        &mut deliver,
        Some(stop),
    ) {
        warn_line(ctx, format!("accepting links stopped: {}", e.detail));
    }
}

impl LinkMaker for LazyLinks {
    fn request(&mut self, peer: usize) {
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
        let (ctx, shared, timeout) = (self.ctx.clone(), self.shared.clone(), self.timeout);
        let spawned = std::thread::Builder::new()
            .name("cadence-connect".into())
            .stack_size(256 << 10)
            .spawn(move || {
                let mut warn = |m: String| warn_line(&ctx, m);
                let deadline = Instant::now() + timeout;
                match connect_streams_deciding(&ctx, peer, deadline, &mut warn, true) {
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
