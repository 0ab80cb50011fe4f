//! The dumps a simulated job leaves: the library's calls run on the model
//! with a fault injected ([`exec::simulate_recorded`]), and each rank's
//! record written in the dump format the ranks of a real job write
//! (docs/diagnosis.md, "Dumps"), so `cadence doctor` can be run on
//! thousands of simulated ranks.

use super::exec::{self, Fault, RankRecord, Recorded, Transfer, XferState};
use super::run::{args_for, Cluster};
use crate::choice::{select_algo_on, AlgoOverride};
use crate::comm::{fnv1a, DUMP_VERSION};
use crate::schedule::{self, Algo, Topology};
use crate::types::{CollKind, DType};
use serde::Serialize;

/// The wall clock the simulated job's records count from (2027-01-15).
pub(super) const BASE_UNIX_NS: u64 = 1_800_000_000_000_000_000;
/// The recorder's rings, as the core's defaults size them.
pub(super) const RECORD_CAPACITY: usize = 64;
pub(super) const MESSAGE_CAPACITY: usize = 4096;
/// The operations' deadline the simulated job ran with (s): far past any
/// stall the dumps show, as a job whose ranks were dumped live.
pub(super) const TIMEOUT_S: f64 = 600.0;
/// After a clean run, when the ranks are dumped (s past the last end).
const CLEAN_DUMP_AFTER_S: f64 = 0.001;

/// What [`Cluster::records`] ran and the dumps it left.
pub struct SimDumps {
    pub algo: Algo,
    /// When the run stalled (None: every rank finished).
    pub stalled_at: Option<f64>,
    /// The ranks that did not finish their calls.
    pub unfinished: Vec<usize>,
    /// Per rank, its dump's JSON text.
    pub texts: Vec<String>,
}

impl Cluster {
    /// Every rank makes `calls` calls of `kind` on a full buffer of `count`
    /// elements of `elem_size` bytes, the algorithm the library's choice,
    /// with `fault` injected; returns each rank's dump as the live
    /// diagnosis would take it: `hang_after_s` + 1 s after a stall (so the
    /// stalled call counts as stuck with `cadence doctor --hang-after
    /// hang_after_s`), just after the end of a clean run. Err: the fault
    /// names what does not exist, or the size holds no element.
    pub fn records(
        &self,
        kind: CollKind,
        count: usize,
        elem_size: usize,
        calls: usize,
        fault: Fault,
        hang_after_s: f64,
    ) -> Result<SimDumps, String> {
        if !(hang_after_s.is_finite() && hang_after_s >= 0.0) {
            return Err(format!("hang_after must be ≥ 0 s, not {hang_after_s}"));
        }
        let (run, call) = self.run_recorded(kind, count, elem_size, calls, fault)?;
        let dump_s = match run.stalled_at {
            Some(t) => t + hang_after_s + 1.0,
            None => run.seconds + CLEAN_DUMP_AFTER_S,
        };
        let texts = self.dump_texts(&run, &call, ns(dump_s));
        Ok(SimDumps {
            algo: call.algo,
            stalled_at: run.stalled_at,
            unfinished: run.unfinished,
            texts,
        })
    }

    /// Every rank makes `calls` calls of `kind` on `count` elements of
    /// `elem_size` bytes (the library's choice of algorithm) with `fault`
    /// injected, recorded; and what every rank's record of a call says.
    pub(super) fn run_recorded(
        &self,
        kind: CollKind,
        count: usize,
        elem_size: usize,
        calls: usize,
        fault: Fault,
    ) -> Result<(Recorded, CallInfo), String> {
        let n = self.nranks();
        let args = args_for(kind, n, count)?;
        let (algo, _) =
            select_algo_on(&AlgoOverride::default(), &args, &self.auto, elem_size, None)?;
        let topo: &Topology = &self.auto.topo;
        let build = |r| schedule::build_on(&args, r, topo, algo).map_err(|e| e.to_string());
        let run = exec::simulate_recorded(build, &self.model, elem_size, calls, fault)?;
        let call = CallInfo {
            kind,
            algo,
            dtype: dtype_named(elem_size),
            count: args.elements(n) as u64,
            elem_size,
            sig: format!(
                "{:016x}",
                fnv1a([
                    kind.code() as u64,
                    elem_size as u64,
                    0, // the reduction: sum
                    args.root as u64,
                    algo as u64,
                    count as u64,
                ])
            ),
        };
        Ok((run, call))
    }

    /// The ranks rank `rank` sends to in one call of `kind` on `count`
    /// elements of `elem_size` bytes with the library's choice, ascending:
    /// the links a hung-link fault can strike in [`Cluster::records`].
    pub fn sends_to(
        &self,
        kind: CollKind,
        count: usize,
        elem_size: usize,
        rank: usize,
    ) -> Result<Vec<usize>, String> {
        let n = self.nranks();
        if rank >= n {
            return Err(format!("rank {rank} is not a rank of {n}"));
        }
        let args = args_for(kind, n, count)?;
        let (algo, _) =
            select_algo_on(&AlgoOverride::default(), &args, &self.auto, elem_size, None)?;
        let s =
            schedule::build_on(&args, rank, &self.auto.topo, algo).map_err(|e| e.to_string())?;
        let mut peers: Vec<usize> = s
            .phases
            .iter()
            .flat_map(|p| &p.steps)
            .filter_map(|st| match *st {
                schedule::Step::Send { peer, .. } => Some(peer),
                _ => None,
            })
            .collect();
        peers.sort_unstable();
        peers.dedup();
        Ok(peers)
    }

    /// Every rank's dump, made in parallel over the machine's cores.
    fn dump_texts(&self, run: &Recorded, call: &CallInfo, dump_ns: u64) -> Vec<String> {
        super::per_rank(run.ranks.len(), |r| {
            self.dump_of(r, &run.ranks[r], call, dump_ns)
        })
    }

    /// Rank r's dump.
    fn dump_of(&self, r: usize, rec: &RankRecord, call: &CallInfo, dump_ns: u64) -> String {
        let topo = &self.model.topo;
        let host = |q: usize| format!("h{}", topo.host_of(q));
        // Rank 0 names everyone (a rank that left no dump can still be
        // named); the others' dumps stay the size of the peers they use.
        let peers = match r {
            0 => (0..topo.nranks())
                .map(|q| Peer {
                    rank: q,
                    host: host(q),
                    pid: pid(q),
                    addr: "",
                })
                .collect(),
            _ => Vec::new(),
        };
        let mut ops: Vec<Op<MsgRun>> = rec
            .calls
            .iter()
            .enumerate()
            .filter_map(|(c, span)| {
                let entered = ns(span.entered?);
                let running = span.finished.is_none();
                let (messages, messages_state, messages_at_ns) = match running {
                    true => (Some(compact(rec.transfers(c))), "live", Some(dump_ns)),
                    // The core keeps no messages of an operation that
                    // finished quickly.
                    false => (None, "none", None),
                };
                Some(Op {
                    id: c,
                    seq: c + 1,
                    sig: &call.sig,
                    collective: call.kind.name(),
                    comm_id: COMM_ID,
                    algo: call.algo.name(),
                    dtype: call.dtype,
                    redop: if call.kind.reduces() { "sum" } else { "" },
                    root: 0,
                    count: call.count,
                    bytes: call.count * call.elem_size as u64,
                    enqueue_ns: entered,
                    start_ns: entered,
                    end_ns: span.finished.map_or(dump_ns, ns),
                    status: if running { "running" } else { "ok" },
                    messages,
                    messages_state,
                    messages_at_ns,
                })
            })
            .collect();
        let total_ops = ops.len();
        ops.drain(..total_ops.saturating_sub(RECORD_CAPACITY));
        let dump = Dump {
            format: "cadence-dump",
            version: DUMP_VERSION,
            job: "sim",
            comm_id: COMM_ID,
            rank: r,
            nranks: topo.nranks(),
            host: host(r),
            hostname: host(r),
            pid: pid(r),
            peers,
            timeout_s: TIMEOUT_S,
            base_unix_ns: BASE_UNIX_NS,
            dump_ns,
            clock: Clock {
                offset_ns: 0,
                error_ns: 0,
                method: "same host",
            },
            reason: "live diagnosis",
            failure: None,
            links: None,
            total_ops,
            record_capacity: RECORD_CAPACITY,
            message_capacity: MESSAGE_CAPACITY,
            ops,
        };
        serde_json::to_string(&dump).expect("a dump has string keys only")
    }
}

/// The simulated job's one communicator.
pub(super) const COMM_ID: &str = "sim0";

/// What every rank's record of a call says alike.
pub(super) struct CallInfo {
    pub(super) kind: CollKind,
    pub(super) algo: Algo,
    pub(super) dtype: &'static str,
    pub(super) count: u64,
    pub(super) elem_size: usize,
    pub(super) sig: String,
}

/// Simulated seconds as the dumps' nanoseconds since `base_unix_ns`.
pub(super) fn ns(s: f64) -> u64 {
    (s * 1e9).round() as u64
}

pub(super) fn pid(rank: usize) -> u64 {
    10_000 + rank as u64
}

/// The element type a size names: the float of that size, else the first.
fn dtype_named(elem_size: usize) -> &'static str {
    let sized = DType::ALL.into_iter().filter(|d| d.size() == elem_size);
    let mut floats = sized.clone().filter(|d| d.is_float());
    floats
        .next()
        .or(sized.clone().next())
        .map_or("bytes", |d| d.name())
}

/// A rank's messages of one operation, run-compacted: per (peer,
/// direction), in the rank's order of them, consecutive messages in one
/// state become one record of `count` messages, so a dump grows with the
/// peers a rank uses, not with its messages (a ring of 4096 ranks has
/// thousands a call). Records of one (peer, direction) keep their order.
fn compact(transfers: impl Iterator<Item = Transfer>) -> Vec<MsgRun> {
    let mut groups: Vec<Vec<MsgRun>> = Vec::new();
    let mut group_of: std::collections::HashMap<(usize, bool), usize> = Default::default();
    for t in transfers {
        let g = *group_of.entry((t.peer, t.send)).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        let state = match t.state {
            XferState::Done => "done",
            XferState::Pending => "pending",
            XferState::Held => "held",
        };
        let at = t.done_at.map(ns);
        let moved = if t.state == XferState::Done {
            t.bytes
        } else {
            0
        };
        let runs = &mut groups[g];
        match runs.last_mut() {
            Some(run) if run.state == state => {
                run.count += 1;
                run.bytes += t.bytes;
                run.moved += moved;
                run.last_ns = at;
            }
            _ => runs.push(MsgRun {
                peer: t.peer,
                dir: if t.send { "send" } else { "recv" },
                state,
                bytes: t.bytes,
                moved,
                first_ns: at,
                last_ns: at,
                count: 1,
            }),
        }
    }
    groups.into_iter().flatten().collect()
}

/// One rank's dump, in the format of the core's (`comm::dump`); its
/// operations' messages of type M.
#[derive(Serialize)]
pub(super) struct Dump<'a, M> {
    pub(super) format: &'static str,
    pub(super) version: u32,
    pub(super) job: &'static str,
    pub(super) comm_id: &'static str,
    pub(super) rank: usize,
    pub(super) nranks: usize,
    pub(super) host: String,
    pub(super) hostname: String,
    pub(super) pid: u64,
    pub(super) peers: Vec<Peer>,
    pub(super) timeout_s: f64,
    pub(super) base_unix_ns: u64,
    pub(super) dump_ns: u64,
    pub(super) clock: Clock,
    pub(super) reason: &'static str,
    pub(super) failure: Option<String>,
    pub(super) links: Option<Vec<Link>>,
    pub(super) total_ops: usize,
    pub(super) record_capacity: usize,
    pub(super) message_capacity: usize,
    pub(super) ops: Vec<Op<'a, M>>,
}

#[derive(Serialize)]
pub(super) struct Peer {
    pub(super) rank: usize,
    pub(super) host: String,
    pub(super) pid: u64,
    pub(super) addr: &'static str,
}

#[derive(Serialize)]
pub(super) struct Clock {
    pub(super) offset_ns: i64,
    pub(super) error_ns: u64,
    pub(super) method: &'static str,
}

/// A rank's counters for its link to `peer` (the core's `LinkStats`, the
/// fields a simulated run knows).
#[derive(Serialize)]
pub(super) struct Link {
    pub(super) peer: usize,
    pub(super) transport: &'static str,
    pub(super) bytes_sent: u64,
    pub(super) bytes_recv: u64,
    pub(super) msgs_sent: u64,
    pub(super) msgs_recv: u64,
}

#[derive(Serialize)]
pub(super) struct Op<'a, M> {
    pub(super) id: usize,
    pub(super) seq: usize,
    pub(super) sig: &'a str,
    pub(super) collective: &'static str,
    pub(super) comm_id: &'static str,
    pub(super) algo: &'static str,
    pub(super) dtype: &'static str,
    pub(super) redop: &'static str,
    pub(super) root: usize,
    pub(super) count: u64,
    pub(super) bytes: u64,
    pub(super) enqueue_ns: u64,
    pub(super) start_ns: u64,
    pub(super) end_ns: u64,
    pub(super) status: &'static str,
    pub(super) messages: Option<Vec<M>>,
    pub(super) messages_state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) messages_at_ns: Option<u64>,
}

/// Consecutive messages of one rank with one peer, in one direction and
/// state: `bytes` and `moved` summed, `first_ns` of the first, `last_ns`
/// of the last (completion times; null while not done).
#[derive(Serialize)]
struct MsgRun {
    peer: usize,
    dir: &'static str,
    state: &'static str,
    bytes: u64,
    moved: u64,
    first_ns: Option<u64>,
    last_ns: Option<u64>,
    count: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::spec::parse;
    use serde_json::Value;
    use std::path::Path;

    fn cluster(hosts: usize) -> Cluster {
        let text = format!(
            r#"{{"version": 1, "kind": "cadence-cluster", "hosts": {hosts},
            "ranks_per_host": {}, "nic": {{"rate": "10gbit", "latency_us": 20}}}}"#,
            12 / hosts
        );
        Cluster::new(parse(&text, Path::new("s.json"), None).unwrap())
    }

    fn dumps(c: &Cluster, fault: Fault) -> (SimDumps, Vec<Value>) {
        let d = c
            .records(CollKind::AllReduce, 1 << 16, 4, 3, fault, 30.0)
            .unwrap();
        let parsed = d.texts.iter().map(|t| serde_json::from_str(t).unwrap());
        let parsed = parsed.collect();
        (d, parsed)
    }

    fn statuses(dump: &Value) -> Vec<&str> {
        let ops = dump["ops"].as_array().unwrap();
        ops.iter().map(|o| o["status"].as_str().unwrap()).collect()
    }

    #[test]
    fn consecutive_messages_in_one_state_merge_per_peer_and_direction() {
        let t = |peer, send, state, done_at: Option<f64>| Transfer {
            peer,
            send,
            bytes: 100,
            first_at: done_at,
            done_at,
            state,
        };
        let (d, p, h) = (XferState::Done, XferState::Pending, XferState::Held);
        let runs = compact(
            [
                t(1, true, d, Some(1.0)),
                t(2, false, d, Some(1.5)),
                t(1, true, d, Some(2.0)),
                t(1, true, p, None),
                t(1, true, h, None),
                t(1, true, h, None),
                t(1, true, d, Some(3.0)),
            ]
            .into_iter(),
        );
        let got: Vec<_> = runs
            .iter()
            .map(|m| (m.peer, m.dir, m.state, m.count, m.bytes, m.moved))
            .collect();
        assert_eq!(
            got,
            [
                (1, "send", "done", 2, 200, 200),
                (1, "send", "pending", 1, 100, 0),
                (1, "send", "held", 2, 200, 0),
                (1, "send", "done", 1, 100, 100),
                (2, "recv", "done", 1, 100, 100),
            ]
        );
        assert_eq!(
            (runs[0].first_ns, runs[0].last_ns),
            (Some(1e9 as u64), Some(2e9 as u64))
        );
        assert_eq!((runs[2].first_ns, runs[2].last_ns), (None, None));
    }

    #[test]
    fn a_clean_run_leaves_every_call_ok_on_every_rank() {
        for hosts in [3, 1] {
            let c = cluster(hosts);
            let (d, parsed) = dumps(&c, Fault::None);
            assert!(d.stalled_at.is_none() && d.unfinished.is_empty());
            assert_eq!(parsed.len(), 12);
            let sig = parsed[0]["ops"][0]["sig"].as_str().unwrap().to_string();
            for (r, dump) in parsed.iter().enumerate() {
                assert_eq!(dump["format"], "cadence-dump");
                assert_eq!(dump["rank"], r);
                assert_eq!(dump["host"], format!("h{}", c.model.topo.host_of(r)));
                assert_eq!(statuses(dump), ["ok"; 3]);
                let op = &dump["ops"][1];
                assert_eq!(
                    (op["seq"].as_u64(), op["sig"].as_str()),
                    (Some(2), Some(&*sig))
                );
                assert_eq!(op["messages_state"], "none");
                assert_eq!(op["algo"], d.algo.name());
                assert_eq!(
                    (&op["dtype"], &op["redop"]),
                    (&"float32".into(), &"sum".into())
                );
                assert!(op["end_ns"].as_u64() < dump["dump_ns"].as_u64());
            }
            assert_eq!(parsed[0]["peers"].as_array().unwrap().len(), 12);
            assert!(parsed[1]["peers"].as_array().unwrap().is_empty());
        }
    }

    #[test]
    fn a_stopped_rank_has_fewer_ops_and_the_others_a_running_one() {
        let c = cluster(3);
        let (d, parsed) = dumps(&c, Fault::Stop { rank: 5, call: 1 });
        let stalled = d.stalled_at.unwrap();
        assert_eq!(statuses(&parsed[5]), ["ok"]);
        for (r, dump) in parsed.iter().enumerate().filter(|&(r, _)| r != 5) {
            assert_eq!(statuses(dump), ["ok", "running"], "rank {r}");
            let op = &dump["ops"][1];
            assert_eq!(op["messages_state"], "live");
            assert_eq!(op["messages_at_ns"], dump["dump_ns"]);
            assert_eq!(op["end_ns"], dump["dump_ns"]);
            let msgs = op["messages"].as_array().unwrap();
            assert!(msgs.iter().any(|m| m["state"] != "done"), "rank {r}");
            assert!(msgs.iter().all(|m| m["count"].as_u64() >= Some(1)));
        }
        let dump_ns = parsed[0]["dump_ns"].as_u64().unwrap();
        assert_eq!(dump_ns, ns(stalled + 31.0));
    }

    #[test]
    fn a_hung_link_shows_pending_at_both_ends() {
        let c = cluster(3);
        let clean = c
            .records(CollKind::AllReduce, 1 << 16, 4, 3, Fault::None, 30.0)
            .unwrap();
        // A link the chosen algorithm uses: rank 3's first peer it sends to.
        let run = {
            let args = args_for(CollKind::AllReduce, 12, 1 << 16).unwrap();
            let s = schedule::build_on(&args, 3, &c.auto.topo, clean.algo).unwrap();
            s.phases
                .iter()
                .flat_map(|p| &p.steps)
                .find_map(|st| match *st {
                    schedule::Step::Send { peer, .. } => Some(peer),
                    _ => None,
                })
        };
        let dst = run.unwrap();
        let fault = Fault::HungLink {
            src: 3,
            dst,
            call: 1,
        };
        let (d, parsed) = dumps(&c, fault);
        assert!(d.stalled_at.is_some());
        let first = |r: usize, peer: usize, dir: &str| {
            let msgs = parsed[r]["ops"][1]["messages"].as_array().unwrap();
            let m = msgs.iter().find(|m| m["peer"] == peer && m["dir"] == dir);
            m.unwrap()["state"].as_str().unwrap().to_string()
        };
        assert_eq!(first(3, dst, "send"), "pending");
        assert_eq!(first(dst, 3, "recv"), "pending");
    }
}
