//! [`StoreServer`]: the rendezvous root's key-value store, served by one
//! rank's process (rank 0 at `MASTER_ADDR:MASTER_PORT`) on one thread of
//! its own.
//!
//! One thread for every client: it sleeps in poll(2) on the listener, the
//! stop bell and every connection, reads what arrived, answers what is
//! whole (`table.rs`), and parks a `get` whose key is missing until a write
//! of that key or its deadline. A client holds one connection for the
//! job's life and mostly waits, so a thread per connection (as before)
//! held thousands of threads on rank 0 of a job of thousands of ranks; a
//! loop holds a buffer each. No client can hold up another: nothing here
//! blocks, a stranger that says nothing is let go after
//! [`GREETING_READ`], and one that breaks the protocol is answered and
//! closed.

use super::table::{Outcome, Table};
use super::wire::{self, parse_request, Op, Status, GREETING};
use crate::transport::poll_fds;
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// How long the loop stops accepting after an error accept(2) may repeat
/// (out of file descriptors).
const ACCEPT_PAUSE: Duration = Duration::from_millis(10);
/// How long the loop sleeps at most: it wakes for its sockets, the stop
/// and the next deadline, so this is only a backstop.
const SLEEP_BACKSTOP: Duration = Duration::from_secs(3600);
/// How long a new connection may take to greet.
const GREETING_READ: Duration = Duration::from_secs(10);
/// How long the rest of a request may take once its first byte came.
const REQUEST_READ: Duration = Duration::from_secs(30);
/// What one read takes at most.
const READ_CHUNK: usize = 64 << 10;

/// A running store server; dropping it stops it and closes its clients.
pub struct StoreServer {
    addr: SocketAddr,
    /// Rung when the server stops: the loop sleeps on its other end.
    stop_bell: UnixStream,
    thread: Option<std::thread::JoinHandle<()>>,
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
        let thread = std::thread::Builder::new()
            .name("cadence-store".into())
            .spawn(move || Server::new(listener, stopped).run())?;
        Ok(StoreServer {
            addr,
            stop_bell,
            thread: Some(thread),
        })
    }

    /// Where it listens (the port it got, when asked for any).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        let _ = (&self.stop_bell).write_all(&[1]);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A `get` or `wait` parked on a missing key.
struct Parked {
    op: Op,
    fields: Vec<Vec<u8>>,
    key: String,
    deadline: Instant,
}

/// One client's connection.
struct Conn {
    sock: TcpStream,
    /// What arrived and is not yet a whole message.
    inbuf: Vec<u8>,
    /// What is to be sent, and how much of it is.
    out: Vec<u8>,
    sent: usize,
    greeted: bool,
    /// When what is being read must be whole (the greeting; a request
    /// once its first byte came); `None` between requests.
    read_by: Option<Instant>,
    parked: Option<Parked>,
    /// Refused: closed once the answer is out.
    closing: bool,
}

impl Conn {
    fn new(sock: TcpStream, now: Instant) -> Conn {
        Conn {
            sock,
            inbuf: Vec::new(),
            out: Vec::new(),
            sent: 0,
            greeted: false,
            read_by: Some(now + GREETING_READ),
            parked: None,
            closing: false,
        }
    }

    fn answer(&mut self, status: Status, fields: &[Vec<u8>]) {
        let refs: Vec<&[u8]> = fields.iter().map(Vec::as_slice).collect();
        wire::write_message(&mut self.out, &[status as u8], &refs).expect("into memory");
    }

    fn refuse(&mut self, why: &str) {
        self.answer(Status::Refused, &[why.as_bytes().to_vec()]);
        self.closing = true;
    }

    /// Writes what it can of `out`; false when the connection is gone.
    fn flush(&mut self) -> bool {
        while self.sent < self.out.len() {
            match (&self.sock).write(&self.out[self.sent..]) {
                Ok(0) => return false,
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        self.out.clear();
        self.sent = 0;
        true
    }

    /// Reads what arrived; false when the client closed or failed.
    fn fill(&mut self, now: Instant) -> bool {
        let was_empty = self.inbuf.is_empty();
        let mut buf = [0u8; READ_CHUNK];
        loop {
            match (&self.sock).read(&mut buf) {
                Ok(0) => return false,
                Ok(n) => self.inbuf.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        if was_empty && !self.inbuf.is_empty() && self.read_by.is_none() {
            self.read_by = Some(now + REQUEST_READ);
        }
        true
    }

    fn idle(&self) -> bool {
        self.parked.is_none() && !self.closing
    }
}

struct Server {
    listener: TcpListener,
    stopped: UnixStream,
    table: Table,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    /// By key: the connections parked on it (some may have moved on or
    /// gone: checked when woken).
    waiting: HashMap<String, Vec<usize>>,
    /// No accepting before this (after an accept error).
    accept_after: Instant,
}

impl Server {
    fn new(listener: TcpListener, stopped: UnixStream) -> Server {
        Server {
            listener,
            stopped,
            table: Table::default(),
            conns: Vec::new(),
            free: Vec::new(),
            waiting: HashMap::new(),
            accept_after: Instant::now(),
        }
    }

    fn run(mut self) {
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut at: Vec<usize> = Vec::new();
        loop {
            let now = Instant::now();
            fds.clear();
            at.clear();
            let pollfd = |fd, events| libc::pollfd {
                fd,
                events,
                revents: 0,
            };
            fds.push(pollfd(self.stopped.as_raw_fd(), libc::POLLIN));
            if now >= self.accept_after {
                fds.push(pollfd(self.listener.as_raw_fd(), libc::POLLIN));
            }
            let mut next = now + SLEEP_BACKSTOP;
            for (i, c) in self.conns.iter().enumerate() {
                let Some(c) = c else { continue };
                let events = if c.sent < c.out.len() {
                    libc::POLLOUT
                } else if c.idle() {
                    libc::POLLIN
                } else {
                    0
                };
                fds.push(pollfd(c.sock.as_raw_fd(), events));
                at.push(i);
                for t in [c.read_by, c.parked.as_ref().map(|p| p.deadline)]
                    .into_iter()
                    .flatten()
                {
                    next = next.min(t);
                }
            }
            if now < self.accept_after {
                next = next.min(self.accept_after);
            }
            poll_fds(
                &mut fds,
                next.saturating_duration_since(now)
                    .max(Duration::from_millis(1)),
            );
            if fds[0].revents != 0 {
                self.stop();
                return;
            }
            let now = Instant::now();
            if fds.len() > 1 && fds[1].fd == self.listener.as_raw_fd() && fds[1].revents != 0 {
                self.accept(now);
            }
            let first_conn = fds.len() - at.len();
            for (k, &i) in at.iter().enumerate() {
                let revents = fds[first_conn + k].revents;
                if revents != 0 {
                    self.serve(i, revents, now);
                }
            }
            self.expire(now);
        }
    }

    fn accept(&mut self, now: Instant) {
        loop {
            match self.listener.accept() {
                Ok((sock, _)) => {
                    if sock.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let _ = sock.set_nodelay(true);
                    let conn = Some(Conn::new(sock, now));
                    match self.free.pop() {
                        Some(i) => self.conns[i] = conn,
                        None => self.conns.push(conn),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.accept_after = now + ACCEPT_PAUSE;
                    return;
                }
            }
        }
    }

    fn close(&mut self, i: usize) {
        if self.conns[i].take().is_some() {
            self.free.push(i);
        }
    }

    /// Connection `i` is ready (`revents`): writes what waits, reads what
    /// came, and answers every whole request.
    fn serve(&mut self, i: usize, revents: libc::c_short, now: Instant) {
        let Some(c) = self.conns[i].as_mut() else {
            return;
        };
        let broken = revents & (libc::POLLERR | libc::POLLHUP) != 0;
        if (broken && !c.idle()) || (c.idle() && !c.fill(now)) {
            return self.close(i);
        }
        self.answer_whole(i, now);
    }

    /// Writes what connection `i` has to send; closes it when that fails,
    /// or when it was refused and the answer is out.
    fn settle(&mut self, i: usize) {
        let Some(c) = self.conns[i].as_mut() else {
            return;
        };
        if !c.flush() || (c.closing && c.out.is_empty()) {
            self.close(i);
        }
    }

    /// Answers the requests whole in connection `i`'s buffer, one after
    /// another, until one parks or the buffer runs out.
    fn answer_whole(&mut self, i: usize, now: Instant) {
        loop {
            let Some(c) = self.conns[i].as_mut() else {
                return;
            };
            if !c.idle() {
                break;
            }
            if !c.greeted {
                if c.inbuf.len() < GREETING.len() {
                    break;
                }
                if &c.inbuf[..GREETING.len()] != GREETING {
                    // Not a store client: closed without a word.
                    return self.close(i);
                }
                c.inbuf.drain(..GREETING.len());
                c.greeted = true;
                c.read_by = None;
                c.out.extend_from_slice(GREETING);
                continue;
            }
            let (req, used) = match parse_request(&c.inbuf) {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(why) => {
                    c.refuse(&why);
                    break;
                }
            };
            c.inbuf.drain(..used);
            c.read_by = (!c.inbuf.is_empty()).then(|| now + REQUEST_READ);
            let Some(op) = Op::from_u8(req.op) else {
                c.refuse("unknown operation");
                break;
            };
            let deadline = now + Duration::from_millis(req.timeout_ms as u64);
            self.request(i, op, req.fields, deadline, now);
        }
        self.settle(i);
    }

    /// Runs one request of connection `i`: answers it, or parks it on the
    /// key it waits for (and wakes those parked on a key it wrote).
    fn request(&mut self, i: usize, op: Op, fields: Vec<Vec<u8>>, deadline: Instant, now: Instant) {
        let outcome = self.table.run(op, &fields);
        let Some(c) = self.conns[i].as_mut() else {
            return;
        };
        match outcome {
            Err(why) => c.refuse(&why),
            Ok(Outcome::Reply {
                status,
                fields: out,
                wrote,
            }) => {
                c.answer(status, &out);
                if let Some(key) = wrote {
                    self.wake(&key, now);
                }
            }
            Ok(Outcome::WaitFor(key)) if now >= deadline => {
                c.answer(Status::Timeout, &[key.into_bytes()]);
            }
            Ok(Outcome::WaitFor(key)) => {
                self.waiting.entry(key.clone()).or_default().push(i);
                c.parked = Some(Parked {
                    op,
                    fields,
                    key,
                    deadline,
                });
            }
        }
    }

    /// `key` was written: every connection parked on it runs its request
    /// again (answered, or parked on the next key it lacks), then goes on
    /// with what else it sent.
    fn wake(&mut self, key: &str, now: Instant) {
        let Some(parked) = self.waiting.remove(key) else {
            return;
        };
        for i in parked {
            let Some(c) = self.conns[i].as_mut() else {
                continue;
            };
            if c.parked.as_ref().is_none_or(|p| p.key != key) {
                continue;
            }
            let p = c.parked.take().expect("parked");
            self.request(i, p.op, p.fields, p.deadline, now);
            self.answer_whole(i, now);
        }
    }

    /// Times out parked requests past their deadline (naming the key) and
    /// lets go of connections that did not finish a message in time.
    fn expire(&mut self, now: Instant) {
        for i in 0..self.conns.len() {
            let Some(c) = self.conns[i].as_mut() else {
                continue;
            };
            if c.read_by.is_some_and(|t| now >= t) && !c.closing {
                self.close(i);
                continue;
            }
            if c.parked.as_ref().is_some_and(|p| now >= p.deadline) {
                let p = c.parked.take().expect("parked");
                c.answer(Status::Timeout, &[p.key.into_bytes()]);
                self.answer_whole(i, now);
            }
        }
    }

    /// The server stops: parked requests are told they timed out (best
    /// effort), and every connection closes.
    fn stop(&mut self) {
        for c in self.conns.iter_mut().flatten() {
            if let Some(p) = c.parked.take() {
                c.answer(Status::Timeout, &[p.key.into_bytes()]);
                c.flush();
            }
        }
    }
}
