//! [`StoreServer`]: the rendezvous root's key-value store, served by one
//! rank's process (rank 0 at `MASTER_ADDR:MASTER_PORT`) on threads of its
//! own.
//!
//! One thread per client connection: a client holds one connection for
//! the job's life and mostly waits, so a thread blocked in `read` (small
//! stack) is the simplest server that never lets one slow client hold up
//! another. A request waiting for a key parks on that key's condition
//! variable, so a `set` wakes only those who wait for it.

use super::wire::{self, key_of, Op, ReadError, Status, GREETING};
use crate::transport::poll_fds;
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A connection thread's stack: it parses small messages and waits.
const CONN_STACK: usize = 128 << 10;
/// How long the acceptor pauses after an error accept(2) may repeat (out
/// of file descriptors).
const ACCEPT_PAUSE: Duration = Duration::from_millis(10);
/// How long a thread sleeps at most in [`State::sleep_on`]: it wakes for
/// its socket or the server's stop, so this is only a backstop.
const SLEEP_BACKSTOP: Duration = Duration::from_secs(3600);
/// How long the rest of a request may take once its first byte came.
const REQUEST_READ: Duration = Duration::from_secs(30);

#[derive(Default)]
struct Table {
    values: HashMap<String, Vec<u8>>,
    /// Keys someone waits for, each with the condition its waiters park on.
    waiting: HashMap<String, Arc<Condvar>>,
}

struct State {
    table: Mutex<Table>,
    stopping: AtomicBool,
    /// Readable once the server stops (the stop bell's other end, never
    /// read): the acceptor and every idle connection sleep in poll(2) on
    /// it beside their own socket, so nothing wakes a thousand clients'
    /// threads while they are idle.
    stopped: UnixStream,
}

impl State {
    /// Sleeps until `fd` is readable or the server stops; whether either
    /// happened (false: the backstop, or a signal).
    fn sleep_on(&self, fd: std::os::fd::RawFd) -> bool {
        let mut fds = [fd, self.stopped.as_raw_fd()].map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        poll_fds(&mut fds, SLEEP_BACKSTOP);
        fds.iter().any(|p| p.revents != 0)
    }
}

/// A running store server; dropping it stops it and closes its clients.
pub struct StoreServer {
    addr: SocketAddr,
    state: Arc<State>,
    /// Rung when the server stops: the acceptor sleeps until a connection
    /// or this (every rank's first request waits on the accept).
    stop_bell: UnixStream,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

impl StoreServer {
    /// Listens on `addr` (port 0: any) and serves until dropped.
    pub fn start(addr: SocketAddr) -> io::Result<StoreServer> {
        let sock = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::STREAM,
            None,
        )?;
        // A job restarted on the same port must not wait out TIME_WAIT.
        sock.set_reuse_address(true)?;
        sock.bind(&addr.into())?;
        // Every rank connects at once at start-up: the kernel's cap
        // (somaxconn) bounds what it keeps.
        sock.listen(65535)?;
        let listener: TcpListener = sock.into();
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (stop_bell, stopped) = UnixStream::pair()?;
        let state = Arc::new(State {
            table: Mutex::default(),
            stopping: AtomicBool::new(false),
            stopped,
        });
        let st = state.clone();
        let acceptor = std::thread::Builder::new()
            .name("cadence-store".into())
            .spawn(move || accept_loop(listener, st))?;
        Ok(StoreServer {
            addr,
            state,
            stop_bell,
            acceptor: Some(acceptor),
        })
    }

    /// Where it listens (the port it got, when asked for any).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        // Idle connection threads see the bell; waiters when woken.
        self.state.stopping.store(true, Ordering::SeqCst);
        let _ = (&self.stop_bell).write_all(&[1]);
        for cv in self.state.table.lock().unwrap().waiting.values() {
            cv.notify_all();
        }
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

fn accept_loop(listener: TcpListener, state: Arc<State>) {
    while !state.stopping.load(Ordering::SeqCst) {
        // Until a connection or the stop.
        state.sleep_on(listener.as_raw_fd());
        match listener.accept() {
            Ok((sock, _)) => {
                let _ = sock.set_nonblocking(false);
                let _ = sock.set_nodelay(true);
                let st = state.clone();
                let spawned = std::thread::Builder::new()
                    .name("cadence-store-conn".into())
                    .stack_size(CONN_STACK)
                    .spawn(move || serve(sock, &st));
                if spawned.is_err() {
                    // Out of threads: the client sees its connection close
                    // and says so; the server goes on.
                    continue;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => std::thread::sleep(ACCEPT_PAUSE),
        }
    }
}

/// Serves one client until it closes, or sends what is not the protocol.
fn serve(mut sock: TcpStream, state: &State) {
    let mut greet = [0u8; GREETING.len()];
    // A stranger that sends nothing must not hold a thread for long.
    let _ = sock.set_read_timeout(Some(Duration::from_secs(10)));
    if sock.read_exact(&mut greet).is_err() || &greet != GREETING {
        return;
    }
    if sock.write_all(GREETING).is_err() {
        return;
    }
    let _ = sock.set_read_timeout(Some(REQUEST_READ));
    loop {
        // Between requests, sleep until the client's next one (or its
        // close) or the server's stop.
        let mut head = [0u8; 5];
        while !state.sleep_on(sock.as_raw_fd()) {}
        if state.stopping.load(Ordering::SeqCst) {
            return;
        }
        // The request follows at once.
        match sock.read(&mut head[..1]) {
            Ok(1) => {}
            _ => return,
        }
        if sock.read_exact(&mut head[1..]).is_err() {
            return;
        }
        let timeout =
            Duration::from_millis(u32::from_le_bytes(head[1..5].try_into().unwrap()) as u64);
        let fields = match wire::read_fields(&mut sock) {
            Ok(f) => f,
            Err(ReadError::Io(_)) => return,
            Err(ReadError::Bad(m)) => {
                let _ = reply(&mut sock, Status::Refused, &[m.as_bytes()]);
                return;
            }
        };
        let Some(op) = Op::from_u8(head[0]) else {
            let _ = reply(&mut sock, Status::Refused, &[b"unknown operation"]);
            return;
        };
        let sent = match handle(state, op, &fields, timeout) {
            Ok((status, out)) => {
                let refs: Vec<&[u8]> = out.iter().map(Vec::as_slice).collect();
                reply(&mut sock, status, &refs)
            }
            Err(m) => {
                let _ = reply(&mut sock, Status::Refused, &[m.as_bytes()]);
                return;
            }
        };
        if sent.is_err() {
            return;
        }
    }
}

fn reply(sock: &mut TcpStream, status: Status, fields: &[&[u8]]) -> io::Result<()> {
    wire::write_message(sock, &[status as u8], fields)
}

type Answer = Result<(Status, Vec<Vec<u8>>), String>;

fn handle(state: &State, op: Op, f: &[Vec<u8>], timeout: Duration) -> Answer {
    let want = |n: usize| {
        if f.len() == n {
            Ok(())
        } else {
            Err(format!("{op:?} takes {n} fields, got {}", f.len()))
        }
    };
    let ok = |v: Vec<Vec<u8>>| Ok((Status::Ok, v));
    match op {
        Op::Set => {
            want(2)?;
            let key = key_of(&f[0])?;
            let mut t = state.table.lock().unwrap();
            t.values.insert(key.clone(), f[1].clone());
            if let Some(cv) = t.waiting.remove(&key) {
                cv.notify_all();
            }
            ok(vec![])
        }
        Op::Get | Op::Wait => {
            if f.is_empty() || (op == Op::Get && f.len() != 1) {
                return Err(format!("{op:?} with {} keys", f.len()));
            }
            let keys = f.iter().map(|k| key_of(k)).collect::<Result<Vec<_>, _>>()?;
            let deadline = Instant::now() + timeout;
            let mut t = state.table.lock().unwrap();
            for key in &keys {
                while !t.values.contains_key(key) {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() || state.stopping.load(Ordering::SeqCst) {
                        return Ok((Status::Timeout, vec![key.as_bytes().to_vec()]));
                    }
                    let cv = t.waiting.entry(key.clone()).or_default().clone();
                    t = cv.wait_timeout(t, left).unwrap().0;
                }
            }
            if op == Op::Get {
                ok(vec![t.values[&keys[0]].clone()])
            } else {
                ok(vec![])
            }
        }
        Op::Add => {
            want(2)?;
            let key = key_of(&f[0])?;
            let delta = i64::from_le_bytes(
                f[1].as_slice()
                    .try_into()
                    .map_err(|_| "Add takes an 8-byte delta".to_string())?,
            );
            let mut t = state.table.lock().unwrap();
            // As torch's store: the counter is kept as decimal text.
            let now = match t.values.get(&key) {
                Some(v) => std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.trim().parse::<i64>().ok())
                    .ok_or_else(|| format!("Add on key {key:?}, which is not a number"))?,
                None => 0,
            }
            .wrapping_add(delta);
            t.values.insert(key.clone(), now.to_string().into_bytes());
            if let Some(cv) = t.waiting.remove(&key) {
                cv.notify_all();
            }
            ok(vec![now.to_le_bytes().to_vec()])
        }
        Op::Check => {
            let keys = f.iter().map(|k| key_of(k)).collect::<Result<Vec<_>, _>>()?;
            let t = state.table.lock().unwrap();
            let all = keys.iter().all(|k| t.values.contains_key(k));
            ok(vec![vec![all as u8]])
        }
        Op::CompareSet => {
            want(3)?;
            let key = key_of(&f[0])?;
            let mut t = state.table.lock().unwrap();
            // As torch's: a missing key matches an empty `expected`.
            let current = t.values.get(&key).cloned();
            let matches = match &current {
                Some(v) => *v == f[1],
                None => f[1].is_empty(),
            };
            if matches {
                t.values.insert(key.clone(), f[2].clone());
                if let Some(cv) = t.waiting.remove(&key) {
                    cv.notify_all();
                }
                ok(vec![f[2].clone()])
            } else {
                ok(vec![current.unwrap_or_default()])
            }
        }
        Op::Delete => {
            want(1)?;
            let key = key_of(&f[0])?;
            let gone = state.table.lock().unwrap().values.remove(&key).is_some();
            ok(vec![vec![gone as u8]])
        }
        Op::NumKeys => {
            want(0)?;
            let n = state.table.lock().unwrap().values.len() as u64;
            ok(vec![n.to_le_bytes().to_vec()])
        }
    }
}
