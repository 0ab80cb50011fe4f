//! The client of the cluster's path planner (`cadence planner`, C4P:
//! docs/traffic.md): before a rank dials a peer over TCP it asks which
//! source ports put each stream of the link on the spine the planner chose
//! for it, and binds them. The planner's protocol is JSON lines
//! (`python/cadence/planner/protocol.py`); one connection per communicator
//! and rank is its lease, closed with the communicator.
//!
//! The planner is advice: when it cannot be reached, answers late or
//! refuses, the rank says so once and dials as before (the fabric's ECMP
//! picks the paths). A job never fails because of it.

use crate::transport::tcp::{Hold, PathHolds};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a rank waits for the planner at most, per request: a dial
/// waits for it (it is on the way to the link's first message). Generous,
/// because one planner answers every rank of every job, and they ask in a
/// burst when jobs start: a planner slowed by that burst must not send
/// whole jobs back to plain ECMP (docs/traffic.md, "A planner too slow to
/// wait for"). A planner that does not answer at all costs each rank this
/// once: the rank then gives its lease up.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// How long a request may wait in all while the planner says it is queued
/// behind others (`queued` events, one a second: it answers one request at
/// a time, and a job of thousands of ranks asks at once). Silence for
/// [`ANSWER_WITHIN`] still gives the planner up.
pub const QUEUED_AT_MOST: Duration = Duration::from_secs(30);

/// Where the planner listens and the cluster's token
/// (`CADENCE_PLANNER`, `CADENCE_PLANNER_TOKEN_FILE`).
#[derive(Clone, Debug, PartialEq)]
pub struct PlannerAddr {
    pub address: String,
    pub token_file: String,
}

/// One lease with the planner, and the ports it planned per link. A
/// thread reads what the planner sends: answers go to the request that
/// waits for them, link events to the rank's [`PathHolds`] at once.
pub struct Planner {
    writer: Box<dyn Write + Send>,
    answers: Receiver<Value>,
    token: String,
    queued_at_most: Duration,
    /// Per (peer, path): per stream, its source ports (best first; empty:
    /// the stream stays inside a rack, any port does).
    planned: HashMap<(usize, usize), Vec<Vec<u16>>>,
    /// Set before this end closes the lease, so the reader does not take
    /// the close for the planner's.
    closing: Arc<AtomicBool>,
    shutdown: Box<dyn Fn() + Send>,
}

/// Who the lease is for, and where its events go.
pub struct Lessee {
    /// The job's name with the planner (the communicator and rank).
    pub job: String,
    /// The rank's streams held down by link events.
    pub holds: Arc<PathHolds>,
    /// Prefix of warning lines ("cadence rank 3"); `None`: none.
    pub log_as: Option<String>,
    /// Whether informational lines are said too (`CADENCE_DEBUG=INFO`).
    pub log_info: bool,
    /// How long a request may wait in all while the planner says it is
    /// queued ([`QUEUED_AT_MOST`] at most).
    pub queued_at_most: Duration,
}

impl Planner {
    /// Opens the lease of `who`.
    pub fn connect(at: &PlannerAddr, who: Lessee) -> Result<Planner, String> {
        let token = std::fs::read_to_string(&at.token_file)
            .map_err(|e| format!("cannot read its token {}: {e}", at.token_file))?
            .trim()
            .to_string();
        let io = |e: std::io::Error| format!("{}: {e}", at.address);
        let (reader, writer, shutdown) = if let Some(path) = at.address.strip_prefix("unix:") {
            let s = UnixStream::connect(path).map_err(io)?;
            s.set_write_timeout(Some(ANSWER_WITHIN)).ok();
            halves(s, UnixStream::try_clone, |s| s.shutdown(Shutdown::Both)).map_err(io)?
        } else if let Some(hp) = at.address.strip_prefix("tcp:") {
            let addr: SocketAddr = hp
                .parse()
                .map_err(|_| format!("{}: not tcp:IP:PORT", at.address))?;
            let s = TcpStream::connect_timeout(&addr, ANSWER_WITHIN).map_err(io)?;
            s.set_write_timeout(Some(ANSWER_WITHIN)).ok();
            halves(s, TcpStream::try_clone, |s| s.shutdown(Shutdown::Both)).map_err(io)?
        } else {
            return Err(format!(
                "CADENCE_PLANNER={:?}: expected unix:PATH or tcp:IP:PORT",
                at.address
            ));
        };
        let (tx, answers) = mpsc::channel();
        let closing = Arc::new(AtomicBool::new(false));
        let job = who.job.clone();
        let queued_at_most = who.queued_at_most.min(QUEUED_AT_MOST);
        let reading = Reading {
            at: at.address.clone(),
            who,
            answers: tx,
            closing: closing.clone(),
        };
        std::thread::Builder::new()
            .name("cadence-planner".into())
            .spawn(move || reading.run(BufReader::new(reader)))
            .map_err(|e| format!("cannot start its reader: {e}"))?;
        let mut p = Planner {
            writer,
            answers,
            token,
            queued_at_most,
            planned: HashMap::new(),
            closing,
            shutdown,
        };
        p.request(json!({"op": "hello", "job": job}))?;
        Ok(p)
    }

    /// The source ports of each of `streams` streams from `src` to `dst`
    /// (the link to `peer` on path `path`), asked once per link; `weights`:
    /// what each stream counts in the planner's balance from `src` to `dst`
    /// and back (0: placed, not counted). `notify`: whom the planner tells when one
    /// of these streams is held or released (protocol.py).
    #[allow(clippy::too_many_arguments)]
    pub fn ports(
        &mut self,
        peer: usize,
        path: usize,
        src: SocketAddr,
        dst: SocketAddr,
        streams: usize,
        weights: (u8, u8),
        notify: Value,
    ) -> Result<&[Vec<u16>], String> {
        if !self.planned.contains_key(&(peer, path)) {
            let answer = self.request(json!({"op": "plan", "connections": [{
                "id": format!("{peer}/{path}"), "src": src.ip().to_string(),
                "dst": dst.ip().to_string(), "dport": dst.port(), "streams": streams,
                "weight": weights.0, "back_weight": weights.1, "notify": notify,
            }]}))?;
            let ports = parse_ports(&answer, streams)?;
            self.planned.insert((peer, path), ports);
        }
        Ok(&self.planned[&(peer, path)])
    }

    /// Forgets the plan of the link to `peer` (its dial was dropped: the
    /// peer keeps the link it dialed itself), so that it counts nothing.
    pub fn unplan(&mut self, peer: usize) -> Result<(), String> {
        let ids: Vec<String> = self
            .planned
            .keys()
            .filter(|(p, _)| *p == peer)
            .map(|(p, path)| format!("{p}/{path}"))
            .collect();
        if ids.is_empty() {
            return Ok(());
        }
        self.planned.retain(|(p, _), _| *p != peer);
        self.request(json!({"op": "unplan", "ids": ids})).map(drop)
    }

    fn request(&mut self, mut req: Value) -> Result<Value, String> {
        req["v"] = json!(1);
        req["token"] = json!(self.token);
        let mut line = req.to_string();
        line.push('\n');
        self.writer
            .write_all(line.as_bytes())
            .map_err(|e| format!("no answer: {e}"))?;
        let asked = Instant::now();
        let msg = loop {
            match self.answers.recv_timeout(ANSWER_WITHIN) {
                Ok(msg) if msg["event"] == json!("queued") => {
                    if asked.elapsed() > self.queued_at_most {
                        return Err(format!(
                            "still queued after {:?}, {} requests ahead",
                            self.queued_at_most, msg["ahead"]
                        ));
                    }
                }
                Ok(msg) => break msg,
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!("no answer within {ANSWER_WITHIN:?}"))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err("it closed the connection".into())
                }
            }
        };
        if msg["ok"] != json!(true) {
            return Err(format!(
                "refused: {}",
                msg["error"].as_str().unwrap_or("no reason given")
            ));
        }
        Ok(msg)
    }
}

impl Drop for Planner {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::Release);
        (self.shutdown)();
    }
}

/// A connection's two ends for two threads, and how to close both.
type Halves = (
    Box<dyn Read + Send>,
    Box<dyn Write + Send>,
    Box<dyn Fn() + Send>,
);

fn halves<S: Read + Write + Send + 'static>(
    s: S,
    clone: fn(&S) -> std::io::Result<S>,
    shutdown: fn(&S) -> std::io::Result<()>,
) -> std::io::Result<Halves> {
    let closer = clone(&s)?;
    Ok((
        Box::new(clone(&s)?),
        Box::new(s),
        Box::new(move || {
            shutdown(&closer).ok();
        }),
    ))
}

/// The lease's reader (its own thread, blocked in a read until the
/// planner sends or the lease closes).
struct Reading {
    at: String,
    who: Lessee,
    answers: Sender<Value>,
    closing: Arc<AtomicBool>,
}

impl Reading {
    fn run(self, mut conn: BufReader<Box<dyn Read + Send>>) {
        let why = loop {
            let mut got = String::new();
            match conn.read_line(&mut got) {
                Ok(0) => break "it closed the lease".to_string(),
                Err(e) => break format!("the lease broke: {e}"),
                Ok(_) => {}
            }
            let msg: Value = match serde_json::from_str(&got) {
                Ok(m) => m,
                Err(e) => break format!("garbage from it: {e}"),
            };
            if msg.get("event").is_some() && msg["event"] != json!("queued") {
                self.apply(&msg);
            } else if self.answers.send(msg).is_err() {
                return;
            }
        };
        // No more events: nothing stays held on the planner's word.
        self.who.holds.release_all();
        if !self.closing.load(Ordering::Acquire) {
            if let Some(who) = &self.who.log_as {
                stderr_line!(
                    "{who}: WARN the path planner at {} is gone ({why}): paths stay as \
                     planned, and the links' own failover decides when one is down",
                    self.at
                );
            }
        }
    }

    /// A link event: holds and releases the streams it names. One that
    /// names no uplink changed is the planner's layout moving (a rack end
    /// filled or emptied, or a new link's standby streams): its holds are
    /// quiet, and it is said only at `CADENCE_DEBUG=INFO`.
    fn apply(&self, event: &Value) {
        let what = link_event_what(event);
        let quiet = what.is_empty();
        let why = event["why"].as_str().unwrap_or_default();
        let (hold, release) = (
            named_streams(&event["hold"]),
            named_streams(&event["release"]),
        );
        if let Some(who) = &self.who.log_as {
            let (level, what) = if quiet {
                ("INFO", why)
            } else {
                ("WARN", &*what)
            };
            if !quiet || self.who.log_info {
                stderr_line!(
                    "{who}: {level} the path planner says {what}: {} streams of this rank \
                     held, {} released",
                    hold.len(),
                    release.len()
                );
            }
        }
        let why = format!(
            "{}, says the path planner",
            if quiet { why } else { &*what }
        );
        for (peer, stream) in hold {
            let h = Hold {
                why: why.clone(),
                quiet,
            };
            self.who.holds.set(peer, stream, Some(h));
        }
        for (peer, stream) in release {
            self.who.holds.set(peer, stream, None);
        }
    }
}

/// "uplink rack 1 - spine 0 is down", from a link event's `changed`.
fn link_event_what(event: &Value) -> String {
    let parts: Vec<String> = event["changed"]
        .as_array()
        .map(|c| {
            c.iter()
                .map(|l| {
                    format!(
                        "uplink rack {} - spine {} is {}",
                        l["rack"],
                        l["spine"],
                        l["state"].as_str().unwrap_or("?")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    parts.join(", ")
}

/// (peer, stream) of every stream in an event's `hold` or `release` list
/// (entries that are not that are skipped: the planner is advice).
fn named_streams(list: &Value) -> Vec<(usize, usize)> {
    let Some(list) = list.as_array() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in list {
        let Some(peer) = e["peer"].as_u64() else {
            continue;
        };
        for s in e["streams"].as_array().into_iter().flatten() {
            if let Some(s) = s.as_u64() {
                out.push((peer as usize, s as usize));
            }
        }
    }
    out
}

/// Per stream, its ports, from a plan's answer of one connection.
fn parse_ports(answer: &Value, streams: usize) -> Result<Vec<Vec<u16>>, String> {
    let bad = || format!("a plan that is not {streams} streams: {answer}");
    let got = answer["paths"][0]["streams"].as_array().ok_or_else(bad)?;
    if got.len() != streams {
        return Err(bad());
    }
    got.iter()
        .map(|s| match &s["sports"] {
            Value::Array(ps) => ps
                .iter()
                .map(|p| {
                    p.as_u64()
                        .and_then(|p| u16::try_from(p).ok())
                        .ok_or_else(bad)
                })
                .collect(),
            _ => Err(bad()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plans_ports_are_read_per_stream_and_a_short_plan_is_refused() {
        let answer = json!({"ok": true, "paths": [{"id": "1/0", "streams": [
            {"spine": 0, "sports": [20001, 20002]}, {"spine": null, "sports": []}]}]});
        assert_eq!(
            parse_ports(&answer, 2).unwrap(),
            vec![vec![20001, 20002], vec![]]
        );
        assert!(parse_ports(&answer, 3).is_err());
        let bad = json!({"ok": true, "paths": [{"streams": [{"sports": [70000]}]}]});
        assert!(parse_ports(&bad, 1).is_err());
    }

    #[test]
    fn a_link_event_names_its_uplinks_and_its_streams_and_skips_the_malformed() {
        let event = json!({"event": "links",
            "changed": [{"rack": 1, "spine": 0, "state": "down"}],
            "hold": [{"peer": 3, "streams": [0, 2]}, {"peer": "x", "streams": [1]},
                     {"peer": 5, "streams": [-1, 4]}],
            "release": "nothing"});
        assert_eq!(link_event_what(&event), "uplink rack 1 - spine 0 is down");
        assert_eq!(named_streams(&event["hold"]), vec![(3, 0), (3, 2), (5, 4)]);
        assert!(named_streams(&event["release"]).is_empty());
    }

    /// A fresh directory with a token file, and the planner address of
    /// socket `sock` in it.
    fn token_dir(tag: &str, sock: &str) -> (std::path::PathBuf, PlannerAddr) {
        let dir = std::env::temp_dir().join(format!("cadence-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let token = dir.join("token");
        std::fs::write(&token, "t\n").unwrap();
        let at = PlannerAddr {
            address: format!("unix:{}", dir.join(sock).display()),
            token_file: token.display().to_string(),
        };
        (dir, at)
    }

    fn who() -> Lessee {
        Lessee {
            job: "job".into(),
            holds: Arc::new(PathHolds::default()),
            log_as: None,
            log_info: false,
            queued_at_most: QUEUED_AT_MOST,
        }
    }

    #[test]
    fn an_unreachable_planner_is_an_error_not_a_wait() {
        let (dir, at) = token_dir("planner", "none.sock");
        let t = std::time::Instant::now();
        assert!(Planner::connect(&at, who()).is_err());
        assert!(t.elapsed() < Duration::from_secs(2));
        let odd = PlannerAddr {
            address: "http://x".into(),
            ..at
        };
        assert!(Planner::connect(&odd, who())
            .err()
            .unwrap()
            .contains("unix:PATH"));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_queued_request_waits_past_answer_within_while_the_planner_says_so() {
        use std::os::unix::net::UnixListener;
        let (dir, at) = token_dir("queued", "planner.sock");
        let listener = UnixListener::bind(dir.join("planner.sock")).unwrap();
        let busy = ANSWER_WITHIN + Duration::from_secs(1);
        let server = std::thread::spawn(move || {
            let (conn, _) = listener.accept().unwrap();
            let mut lines = BufReader::new(conn.try_clone().unwrap()).lines();
            let hello: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
            assert_eq!(hello["op"], "hello");
            let mut w = conn;
            let t = Instant::now();
            let mut ahead = 40;
            while t.elapsed() < busy {
                writeln!(w, "{}", json!({"event": "queued", "ahead": ahead})).unwrap();
                ahead -= 1;
                std::thread::sleep(Duration::from_millis(500));
            }
            writeln!(w, "{}", json!({"ok": true, "racks": 2, "spines": 2})).unwrap();
            lines.next(); // until the client closes
        });
        let t = Instant::now();
        let planner = Planner::connect(&at, who());
        assert!(planner.is_ok(), "{:?}", planner.err());
        assert!(t.elapsed() >= busy);
        drop(planner);
        server.join().unwrap();
        std::fs::remove_dir_all(&dir).ok();
    }
}
