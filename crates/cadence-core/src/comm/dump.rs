//! Dumps and metrics: what this rank's flight recorder, links and engine
//! hold, as the JSON documents `cadence doctor`, the live watchdog and the
//! Prometheus exporter read (formats: docs/diagnosis.md). Each document is a
//! typed struct; its keys and values are the format.

use super::order::OrderChoice;
use super::{ClockOffset, Shared};
use crate::engine::WaitStats;
use crate::monitor::totals::{bucket_bound_ns, DURATION_BUCKETS};
use crate::monitor::{Dir, Messages, MsgRecord, MsgState, OpRecord};
use crate::transport::LinkStats;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Version of the dump format (`format: "cadence-dump"`); readers refuse
/// versions they do not know.
pub const DUMP_VERSION: u32 = 1;

/// Version of the metrics document ([`Comm::metrics`](super::Comm::metrics)).
pub const METRICS_VERSION: u32 = 1;

/// Names the dump format (`format`), next to [`DUMP_VERSION`].
const DUMP_FORMAT: &str = "cadence-dump";

/// One rank's dump of one communicator.
#[derive(Serialize)]
struct Dump<'a> {
    format: &'static str,
    version: u32,
    job: &'a str,
    comm_id: &'a str,
    rank: usize,
    nranks: usize,
    /// This rank's host identity (emulated hosts differ) and the machine's
    /// own name.
    host: &'a str,
    hostname: String,
    pid: u32,
    peers: Vec<Peer<'a>>,
    timeout_s: f64,
    /// The recorder's clock: the Unix time of its zero, and the dump's time
    /// on it.
    base_unix_ns: u64,
    dump_ns: u64,
    clock: ClockOffset,
    reason: &'a str,
    /// `None` (as `waits`) also when an operation held the engine.
    failure: Option<String>,
    total_ops: u64,
    record_capacity: usize,
    message_capacity: usize,
    ops: Vec<DumpedOp<'a>>,
    links: Vec<LinkStats>,
    waits: Option<WaitStats>,
    ring_order: RingOrder<'a>,
}

/// How the ring order was chosen, with the hosts in that order.
#[derive(Serialize)]
struct RingOrder<'a> {
    hosts: Vec<String>,
    #[serde(flatten)]
    choice: &'a OrderChoice,
}

/// Who another rank is, as bootstrap learned it.
#[derive(Serialize)]
struct Peer<'a> {
    rank: usize,
    host: &'a str,
    pid: u32,
    /// Where it listened at set-up (`ip:port`): the live diagnosis probes
    /// whether a silent host can be reached at all.
    addr: std::net::SocketAddr,
}

/// One operation's record with its messages.
#[derive(Serialize)]
struct DumpedOp<'a> {
    #[serde(flatten)]
    record: OpRecord,
    comm_id: &'a str,
    /// "final", "live" (a running operation's snapshot, taken at
    /// `messages_at_ns`), "dropped" (overwritten since) or "none".
    messages_state: &'static str,
    messages: Option<Vec<MsgRecord>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    messages_at_ns: Option<u64>,
}

/// The totals metrics are made of.
#[derive(Serialize)]
struct Metrics<'a> {
    version: u32,
    comm_id: &'a str,
    job: &'a str,
    rank: usize,
    nranks: usize,
    host: &'a str,
    now_ns: u64,
    /// Upper bounds of the duration buckets (the last bucket has none).
    bucket_bounds_ns: Vec<u64>,
    collectives: Vec<KindMetrics>,
    links: Vec<LinkMetrics<'a>>,
    /// The oldest operation still running.
    running: Option<RunningOp>,
}

/// One collective kind's totals.
#[derive(Serialize)]
struct KindMetrics {
    collective: &'static str,
    ok: u64,
    failed: u64,
    bytes: u64,
    duration_ns: u64,
    /// Per duration bucket, not cumulative.
    buckets: [u64; DURATION_BUCKETS + 1],
}

/// One link's counters and the peer's host.
#[derive(Serialize)]
struct LinkMetrics<'a> {
    #[serde(flatten)]
    stats: LinkStats,
    peer_host: Option<&'a str>,
}

#[derive(Serialize)]
struct RunningOp {
    collective: &'static str,
    seq: u64,
    start_ns: u64,
}

/// The document as text. Through `serde_json::Value`, whose objects keep
/// their keys sorted: the text has sorted keys at every level, as it always
/// had, whatever order the structs declare their fields in.
fn to_json_text(doc: &impl Serialize) -> String {
    serde_json::to_value(doc)
        .expect("dumps and metrics have string keys only")
        .to_string()
}

/// Wall-clock bounds of a slowness window (Unix ns, end excluded).
#[derive(Clone, Copy)]
pub(super) struct Window {
    pub(super) from_unix_ns: u64,
    pub(super) to_unix_ns: u64,
    /// Messages kept: timed receives of at least this many bytes.
    pub(super) min_recv_bytes: u64,
}

impl Window {
    fn keeps(&self, m: &MsgRecord) -> bool {
        m.dir == Dir::Recv
            && m.state == MsgState::Done
            && m.bytes >= self.min_recv_bytes
            && matches!((m.first_ns, m.last_ns), (Some(a), Some(b)) if b > a)
    }
}

impl Shared {
    /// The dump: who this rank is, its clock, its records with their
    /// messages (the newest `last` only, when given), and its link counters
    /// (format: docs/diagnosis.md).
    pub(super) fn dump_json(&self, reason: &str, last: Option<usize>) -> String {
        self.dump_json_filtered(reason, last, None, true)
            .expect("an unfiltered dump always has a body")
    }

    /// The dump, of the newest `last` operations (of those that completed in
    /// `window`, when given); `None` when a window holds no operation.
    /// `everyone`: it lists every rank of the job and the ring's host order;
    /// else only this rank and the peers it has links to, so that its size
    /// is the peers this rank uses, not the job's.
    pub(super) fn dump_json_filtered(
        &self,
        reason: &str,
        last: Option<usize>,
        window: Option<Window>,
        everyone: bool,
    ) -> Option<String> {
        // While an operation runs, the engine is busy: its failure and wait
        // statistics are left out rather than waited for. The links'
        // counters can be read at any time.
        let (failure, waits) = match self.inner.try_lock() {
            Ok(i) => (
                i.failed.as_ref().map(|e| e.to_string()),
                Some(i.engine.wait_stats),
            ),
            Err(_) => (None, None),
        };
        let links: Vec<LinkStats> = self
            .links
            .lock()
            .unwrap()
            .iter()
            .map(|l| l.snapshot())
            .collect();
        // Copy what the dump needs under the recorder's lock (the operations
        // take it at start and end), and serialize after letting go:
        // serializing a full ring is slow next to an operation.
        let (ops, dump_ns, base_unix_ns, total_ops) = {
            let rec = self.recorder.lock().unwrap();
            let base = rec.base_unix_ns;
            let wanted = |r: &&OpRecord| match window {
                None => true,
                Some(w) => {
                    r.status == "ok" && (w.from_unix_ns..w.to_unix_ns).contains(&(base + r.end_ns))
                }
            };
            let n = rec.records().filter(wanted).count();
            if n == 0 && window.is_some() {
                return None;
            }
            let ops: Vec<DumpedOp> = rec
                .records()
                .filter(wanted)
                .skip(n.saturating_sub(last.unwrap_or(usize::MAX)))
                .map(|r| {
                    let (state, msgs, at) = match rec.messages(r) {
                        Messages::Final(it, _) => match window {
                            Some(w) => (
                                "final",
                                Some(it.filter(|m| w.keeps(m)).copied().collect()),
                                None,
                            ),
                            None => ("final", Some(it.copied().collect()), None),
                        },
                        Messages::Live(m, at) => ("live", Some(m.to_vec()), Some(at)),
                        Messages::Dropped => ("dropped", None, None),
                        Messages::None => ("none", None, None),
                    };
                    DumpedOp {
                        record: r.clone(),
                        comm_id: &self.id,
                        messages_state: state,
                        messages: msgs,
                        messages_at_ns: at,
                    }
                })
                .collect();
            (ops, rec.now_ns(), rec.base_unix_ns, rec.total_ops)
        };
        let listed: Vec<usize> = if everyone {
            (0..self.nranks).collect()
        } else {
            let mut v: Vec<usize> = links.iter().map(|l| l.peer).collect();
            v.push(self.rank);
            v.sort_unstable();
            v.dedup();
            v
        };
        let peers = listed
            .into_iter()
            .map(|r| Peer {
                rank: r,
                host: self.peers.host(r),
                pid: self.peers.pid(r),
                addr: self.peers.nic_addr(r, 0),
            })
            .collect();
        Some(to_json_text(&Dump {
            format: DUMP_FORMAT,
            version: DUMP_VERSION,
            job: &self.job,
            comm_id: &self.id,
            rank: self.rank,
            nranks: self.nranks,
            host: self.peers.host(self.rank),
            hostname: hostname(),
            pid: std::process::id(),
            peers,
            timeout_s: self.cfg.timeout.as_secs_f64(),
            base_unix_ns,
            dump_ns,
            clock: self.clock,
            reason,
            failure,
            total_ops,
            record_capacity: self.cfg.flight_recorder,
            message_capacity: self.cfg.record_messages,
            ops,
            links,
            waits,
            ring_order: RingOrder {
                hosts: match everyone {
                    true => super::order::ring_hosts(&self.auto.topo, &|r| self.peers.host(r)),
                    false => Vec::new(),
                },
                choice: &self.auto.order,
            },
        }))
    }

    /// The totals Prometheus metrics are made of, as JSON (format:
    /// docs/diagnosis.md): per collective kind, operations ok and failed,
    /// bytes and a duration histogram; per link, its counters; the oldest
    /// operation still running. Never waits for a running operation: one
    /// short lock of the recorder (which operations take for a few adds).
    pub(super) fn metrics_json(&self) -> String {
        let (now, totals, running) = {
            let rec = self.recorder.lock().unwrap();
            (rec.now_ns(), rec.totals().clone(), rec.oldest_running())
        };
        let collectives = totals
            .used()
            .map(|(k, t)| KindMetrics {
                collective: k.name(),
                ok: t.ok,
                failed: t.failed,
                bytes: t.bytes,
                duration_ns: t.duration_ns,
                buckets: t.buckets,
            })
            .collect();
        let links = self
            .links
            .lock()
            .unwrap()
            .iter()
            .map(|l| LinkMetrics {
                peer_host: (l.peer < self.peers.len()).then(|| self.peers.host(l.peer)),
                stats: l.snapshot(),
            })
            .collect();
        to_json_text(&Metrics {
            version: METRICS_VERSION,
            comm_id: &self.id,
            job: &self.job,
            rank: self.rank,
            nranks: self.nranks,
            host: self.peers.host(self.rank),
            now_ns: now,
            bucket_bounds_ns: (0..DURATION_BUCKETS).map(bucket_bound_ns).collect(),
            collectives,
            links,
            running: running.map(|(k, seq, start_ns)| RunningOp {
                collective: k.name(),
                seq,
                start_ns,
            }),
        })
    }

    /// Writes the dump into `dir` (created if needed) as
    /// `cadence-<comm id>-rank<r>.json`: whole or not at all (written aside,
    /// then renamed).
    pub(super) fn dump_to(&self, dir: &Path, reason: &str) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(dir)?;
        let name = format!("cadence-{}-rank{}.json", self.id, self.rank);
        let path = dir.join(&name);
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, self.dump_json(reason, None))?;
        std::fs::rename(&tmp, &path).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })?;
        Ok(path)
    }
}

/// The machine's host name (the emulated host is `host` in the dump).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::PathStats;
    use crate::types::CollKind;
    use serde_json::Value;
    use std::borrow::Cow;

    fn keys(v: &Value) -> Vec<&str> {
        v.as_object().unwrap().keys().map(String::as_str).collect()
    }

    fn has_all(v: &Value, wanted: &[&str]) {
        let got = keys(v);
        for k in wanted {
            assert!(got.contains(k), "no {k:?} in {v}");
        }
    }

    fn record() -> OpRecord {
        OpRecord {
            seq: 3,
            id: 4,
            sig: 0xabc,
            collective: "allreduce",
            kind: CollKind::AllReduce,
            algo: "ring",
            dtype: "float32",
            redop: "sum",
            root: 0,
            count: 1024,
            bytes: 4096,
            enqueue_ns: 10,
            start_ns: 11,
            end_ns: 0,
            status: Cow::Borrowed("running"),
            msgs_from: 0,
            nmsgs: 0,
        }
    }

    fn link() -> LinkStats {
        LinkStats {
            peer: 1,
            transport: "tcp",
            paths: vec![PathStats::default()],
            ..LinkStats::default()
        }
    }

    /// The keys `python/cadence/diagnosis/dumps.py` reads (`parse`, `_op`,
    /// `_msg`, `_links`), and its format name and version.
    #[test]
    fn a_dump_has_what_cadence_doctor_reads() {
        let msg = MsgRecord {
            op: 4,
            peer: 1,
            dir: Dir::Recv,
            state: MsgState::Pending,
            bytes: 4096,
            moved: 1024,
            first_ns: Some(12),
            last_ns: None,
        };
        let order = OrderChoice::default();
        let dump = Dump {
            format: DUMP_FORMAT,
            version: DUMP_VERSION,
            job: "job1",
            comm_id: "c1",
            rank: 0,
            nranks: 2,
            host: "h0",
            hostname: "machine".into(),
            pid: 7,
            peers: vec![Peer {
                rank: 1,
                host: "h1",
                pid: 8,
                addr: "10.0.0.2:4000".parse().unwrap(),
            }],
            timeout_s: 300.0,
            base_unix_ns: 1,
            dump_ns: 20,
            clock: ClockOffset::SAME_HOST,
            reason: "on demand",
            failure: None,
            total_ops: 4,
            record_capacity: 1024,
            message_capacity: 4096,
            ops: vec![DumpedOp {
                record: record(),
                comm_id: "c1",
                messages_state: "live",
                messages: Some(vec![msg]),
                messages_at_ns: Some(15),
            }],
            links: vec![link()],
            waits: Some(WaitStats::default()),
            ring_order: RingOrder {
                hosts: vec!["h0".into()],
                choice: &order,
            },
        };
        let d: Value = serde_json::from_str(&to_json_text(&dump)).unwrap();
        // Every key, so that a rename or a lost field shows here first.
        assert_eq!(
            keys(&d),
            [
                "base_unix_ns",
                "clock",
                "comm_id",
                "dump_ns",
                "failure",
                "format",
                "host",
                "hostname",
                "job",
                "links",
                "message_capacity",
                "nranks",
                "ops",
                "peers",
                "pid",
                "rank",
                "reason",
                "record_capacity",
                "ring_order",
                "timeout_s",
                "total_ops",
                "version",
                "waits",
            ]
        );
        let python = include_str!("../../../../python/cadence/diagnosis/dumps.py");
        assert_eq!(d["format"], DUMP_FORMAT);
        assert!(python.contains(&format!("FORMAT = \"{DUMP_FORMAT}\"")));
        assert_eq!(d["version"], DUMP_VERSION);
        assert!(python.contains(&format!("\nVERSION = {DUMP_VERSION}\n")));
        assert!(d["failure"].is_null());
        has_all(&d["clock"], &["offset_ns", "error_ns", "method"]);
        has_all(&d["peers"][0], &["rank", "host", "pid", "addr"]);
        let op = &d["ops"][0];
        has_all(
            op,
            &[
                "id",
                "seq",
                "sig",
                "collective",
                "algo",
                "dtype",
                "redop",
                "root",
                "count",
                "bytes",
                "enqueue_ns",
                "start_ns",
                "end_ns",
                "status",
                "messages",
                "messages_state",
                "messages_at_ns",
                "comm_id",
            ],
        );
        assert_eq!(op["sig"], "0000000000000abc");
        assert_eq!(op["messages_at_ns"], 15);
        let m = &op["messages"][0];
        assert_eq!(
            keys(m),
            ["bytes", "dir", "first_ns", "last_ns", "moved", "peer", "state"]
        );
        assert_eq!(
            (&m["dir"], &m["state"]),
            (&"recv".into(), &"pending".into())
        );
        assert!(m["last_ns"].is_null());
        has_all(
            &d["links"][0],
            &[
                "peer",
                "transport",
                "bytes_sent",
                "bytes_recv",
                "msgs_sent",
                "msgs_recv",
                "busy_ns",
            ],
        );
    }

    /// An operation without messages has no `messages_at_ns` and `null`
    /// messages; an engine busy at dump time leaves `failure` and `waits`
    /// null.
    #[test]
    fn what_a_dump_leaves_out() {
        let op = DumpedOp {
            record: record(),
            comm_id: "c1",
            messages_state: "dropped",
            messages: None,
            messages_at_ns: None,
        };
        let v: Value = serde_json::from_str(&to_json_text(&op)).unwrap();
        assert!(v["messages"].is_null());
        assert!(v.get("messages_at_ns").is_none());
        assert_eq!(v["messages_state"], "dropped");
    }

    /// The keys `python/cadence/diagnosis/metrics.py` (the Prometheus
    /// collector) reads.
    #[test]
    fn metrics_have_what_the_exporter_reads() {
        let metrics = Metrics {
            version: METRICS_VERSION,
            comm_id: "c1",
            job: "job1",
            rank: 0,
            nranks: 2,
            host: "h0",
            now_ns: 99,
            bucket_bounds_ns: (0..DURATION_BUCKETS).map(bucket_bound_ns).collect(),
            collectives: vec![KindMetrics {
                collective: "allreduce",
                ok: 2,
                failed: 1,
                bytes: 8192,
                duration_ns: 50,
                buckets: [0; DURATION_BUCKETS + 1],
            }],
            links: vec![LinkMetrics {
                stats: link(),
                peer_host: Some("h1"),
            }],
            running: Some(RunningOp {
                collective: "barrier",
                seq: 5,
                start_ns: 90,
            }),
        };
        let m: Value = serde_json::from_str(&to_json_text(&metrics)).unwrap();
        assert_eq!(
            keys(&m),
            [
                "bucket_bounds_ns",
                "collectives",
                "comm_id",
                "host",
                "job",
                "links",
                "now_ns",
                "nranks",
                "rank",
                "running",
                "version",
            ]
        );
        assert_eq!(m["version"], METRICS_VERSION);
        assert_eq!(
            keys(&m["collectives"][0]),
            [
                "buckets",
                "bytes",
                "collective",
                "duration_ns",
                "failed",
                "ok"
            ]
        );
        assert_eq!(
            m["collectives"][0]["buckets"].as_array().unwrap().len(),
            m["bucket_bounds_ns"].as_array().unwrap().len() + 1
        );
        let link = &m["links"][0];
        has_all(
            link,
            &[
                "peer",
                "peer_host",
                "transport",
                "bytes_sent",
                "bytes_recv",
                "msgs_sent",
                "msgs_recv",
                "busy_ns",
                "paths",
            ],
        );
        assert_eq!(link["peer_host"], "h1");
        has_all(
            &link["paths"][0],
            &[
                "bytes_sent",
                "bytes_recv",
                "rate_bps",
                "up",
                "downs",
                "resent_bytes",
            ],
        );
        assert_eq!(keys(&m["running"]), ["collective", "seq", "start_ns"]);
    }

    /// The text has its keys sorted at every level, whatever order a struct
    /// declares its fields in (what the dumps always had).
    #[test]
    fn the_text_has_sorted_keys() {
        #[derive(Serialize)]
        struct Inner {
            z: u8,
            a: u8,
        }
        #[derive(Serialize)]
        struct Outer {
            b: Inner,
            a: Option<u8>,
        }
        let doc = Outer {
            b: Inner { z: 1, a: 2 },
            a: None,
        };
        assert_eq!(to_json_text(&doc), r#"{"a":null,"b":{"a":2,"z":1}}"#);
    }
}
