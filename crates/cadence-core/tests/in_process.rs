//! Communicators of several ranks inside one process (one thread per rank):
//! the real transports and engine, with no Python and no launcher, so a
//! failure here points at the core.

mod common;

use cadence_core::comm::{Bootstrap, Comm, OpRequest, PeerInfo};
use cadence_core::config::ConnectMode;
use cadence_core::rendezvous::MemoryStore;
use cadence_core::JobSecret;
use cadence_core::{CollKind, Config, DType, ErrorKind, RedOp};
use std::sync::Arc;
use std::time::Duration;

/// Starts `n` ranks; `host(r)` decides who shares memory. Returns each
/// rank's result of `body`.
fn world<T: Send + 'static>(
    n: usize,
    host: fn(usize) -> String,
    timeout: Duration,
    body: impl Fn(&Comm) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let cfg = Config {
        timeout,
        ..Config::default()
    };
    world_with(n, host, cfg, body)
}

/// [`world`] with a whole configuration.
fn world_with<T: Send + 'static>(
    n: usize,
    host: fn(usize) -> String,
    cfg: Config,
    body: impl Fn(&Comm) -> T + Send + Sync + 'static,
) -> Vec<T> {
    common::world(n, host, cfg, move |comm, _| body(comm))
}

fn rand_tag() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
}

fn allreduce_f32(comm: &Comm, data: &mut [f32]) -> Result<(), cadence_core::CommError> {
    let n = data.len();
    comm.run(
        OpRequest::new(CollKind::AllReduce, DType::F32, RedOp::Sum, 0, vec![n])
            .inout(bytemuck::cast_slice_mut(data)),
    )
}

fn check_sum(n: usize, host: fn(usize) -> String) {
    for count in [0usize, 1, 7, 4097, 300_001] {
        let sums = world(n, host, Duration::from_secs(30), move |c| {
            let mut v: Vec<f32> = (0..count)
                .map(|i| (i % 13) as f32 + c.rank() as f32)
                .collect();
            allreduce_f32(c, &mut v).unwrap();
            v
        });
        let rank_sum: f32 = (0..n).map(|r| r as f32).sum();
        for v in sums {
            for (i, x) in v.iter().enumerate() {
                assert_eq!(
                    *x,
                    n as f32 * (i % 13) as f32 + rank_sum,
                    "count {count} index {i}"
                );
            }
        }
    }
}

#[test]
fn allreduce_over_shared_memory() {
    check_sum(3, |_| "one-host".into());
}

#[test]
fn allreduce_over_tcp() {
    check_sum(3, |r| format!("host{r}"));
}

#[test]
fn allreduce_over_both() {
    check_sum(4, |r| format!("host{}", r / 2));
}

#[test]
fn mismatched_counts_name_the_peer() {
    let errs = world(
        2,
        |r| format!("h{r}"),
        Duration::from_secs(5),
        |c| {
            let mut v = vec![1.0f32; 100 + c.rank()];
            allreduce_f32(c, &mut v).unwrap_err()
        },
    );
    for (r, e) in errs.iter().enumerate() {
        assert_eq!(e.culprit(), Some(1 - r), "{e}");
        assert!(e.to_string().contains("allreduce #"), "{e}");
    }
    assert!(matches!(
        errs[0].kind,
        ErrorKind::Mismatch { .. } | ErrorKind::Aborted { .. }
    ));
}

#[test]
fn an_absent_peer_times_out_with_its_name() {
    let errs = world(
        2,
        |_| "same".into(),
        Duration::from_millis(600),
        |c| {
            if c.rank() == 1 {
                std::thread::sleep(Duration::from_millis(2500));
                return None;
            }
            let mut v = vec![1.0f32; 10];
            Some(allreduce_f32(c, &mut v).unwrap_err())
        },
    );
    let e = errs[0].as_ref().unwrap();
    assert!(matches!(e.kind, ErrorKind::Timeout { peer: 1, .. }), "{e}");
}

/// A peer that published its address but never connects (it died, or its
/// link went down during set-up) fails the others' set-up with its name as
/// the culprit, over TCP (rank 2 never dials rank 0 and 1) and over shared
/// memory (rank 1 never creates its inbox).
#[test]
fn set_up_failures_name_the_peer_that_never_came() {
    let ip = "127.0.0.1".parse().unwrap();
    let secret = JobSecret::random().unwrap();
    // TCP: three hosts; rank 2 publishes its info and stops there. Eager,
    // rank 0 and 1 wait for its streams; lazy, the set-up's barrier needs a
    // link with it, which is never made.
    for connect in [ConnectMode::Eager, ConnectMode::Lazy] {
        let id = format!("s{}x{}", std::process::id(), rand_tag());
        let cfg = || Config {
            timeout: Duration::from_millis(800),
            connect,
            ..Config::default()
        };
        let bs: Vec<_> = (0..3)
            .map(|r| {
                Bootstrap::new(&id, r, 3, &format!("h{r}"), ip, cfg(), secret.clone()).unwrap()
            })
            .collect();
        let infos: Vec<PeerInfo> = bs.iter().map(|b| b.info.clone()).collect();
        let mut bs = bs.into_iter();
        let (b0, b1, _silent) = (bs.next().unwrap(), bs.next().unwrap(), bs.next().unwrap());
        let i1 = infos.clone();
        let t1 = std::thread::spawn(move || b1.connect(i1).err());
        let e0 = b0.connect(infos).err().expect("rank 0's set-up must fail");
        let e1 = t1.join().unwrap().expect("rank 1's set-up must fail");
        for e in [&e0, &e1] {
            assert_eq!(e.culprit(), Some(2), "{connect:?}: {e}");
            // Eager, set-up waits for rank 2's streams. Lazy, a rank that
            // sends to rank 2 dials it and gets no answer; a rank that waits
            // to receive from it (receivers do not dial) times out on it.
            let named = match (connect, &e.kind) {
                (ConnectMode::Eager, ErrorKind::Setup { .. }) => "rank 2 stream 0",
                (ConnectMode::Lazy, ErrorKind::Setup { .. }) => "connecting to rank 2",
                (ConnectMode::Lazy, ErrorKind::Timeout { .. }) => "waiting for rank 2",
                _ => panic!("{connect:?}: {e}"),
            };
            assert!(e.to_string().contains(named), "{e}");
        }
    }
    let cfg = || Config {
        timeout: Duration::from_millis(800),
        ..Config::default()
    };

    // Shared memory: rank 1 never opens its inbox.
    let id = format!("m{}x{}", std::process::id(), rand_tag());
    let b0 = Bootstrap::new(&id, 0, 2, "h", ip, cfg(), secret.clone()).unwrap();
    let b1 = Bootstrap::new(&id, 1, 2, "h", ip, cfg(), secret).unwrap();
    let infos = vec![b0.info.clone(), b1.info.clone()];
    let e = b0.connect(infos).err().expect("set-up must fail");
    assert!(matches!(e.kind, ErrorKind::Setup { .. }), "{e}");
    assert_eq!(e.culprit(), Some(1), "{e}");
}

#[test]
fn a_stranger_sending_garbage_at_setup_is_ignored() {
    // Rank 0 listens; before the real peer connects, a stranger connects and
    // sends bytes that are not a handshake. Setup must drop it and go on.
    use std::io::Write;
    let id = format!("g{}x{}", std::process::id(), rand_tag());
    let cfg = || Config {
        timeout: Duration::from_secs(10),
        ..Config::default()
    };
    let ip = "127.0.0.1".parse().unwrap();
    let secret = JobSecret::random().unwrap();
    let b0 = Bootstrap::new(&id, 0, 2, "h0", ip, cfg(), secret.clone()).unwrap();
    let b1 = Bootstrap::new(&id, 1, 2, "h1", ip, cfg(), secret).unwrap();
    let infos = vec![b0.info.clone(), b1.info.clone()];
    let mut stranger = std::net::TcpStream::connect(b0.info.addr.as_str()).unwrap();
    stranger.write_all(&[0x47u8; 200]).unwrap();
    let i1 = infos.clone();
    let t1 = std::thread::spawn(move || {
        let c = b1.connect(i1).unwrap();
        let mut v = vec![2.0f32; 1000];
        allreduce_f32(&c, &mut v).unwrap();
        v[0]
    });
    let c0 = b0.connect(infos).unwrap();
    let mut v = vec![1.0f32; 1000];
    allreduce_f32(&c0, &mut v).unwrap();
    assert_eq!(v[0], 3.0);
    assert_eq!(t1.join().unwrap(), 3.0);
}

#[test]
fn cadence_algo_ranges_choose_by_size() {
    let cfg = Config::from_lookup(|k| match k {
        "CADENCE_ALGO" => Some("allreduce:ring:0-64;direct:65-4K".into()),
        "CADENCE_TIMEOUT" => Some("30".into()),
        "CADENCE_DEBUG" => Some("INFO".into()),
        // Past the ranges, the size table (not a model measured at start-up).
        "CADENCE_CALIBRATE" => Some("0".into()),
        _ => None,
    })
    .unwrap();
    // Sizes in f32 elements: 16 (64 B, ring), 17 (68 B, direct), 1024 (4 KiB,
    // direct), 1025 (past the ranges: the default, recursive doubling on 3
    // ranks below 32 KiB), 300001 (the default ring).
    let sizes = [16usize, 17, 1024, 1025, 300_001];
    let algos = world_with(
        3,
        |r| format!("host{}", r / 2),
        cfg,
        move |c| {
            for count in sizes {
                let mut v = vec![1.0f32; count];
                allreduce_f32(c, &mut v).unwrap();
                assert!(v.iter().all(|x| *x == 3.0), "count {count}");
            }
            let rec: serde_json::Value = serde_json::from_str(&c.dump_records()).unwrap();
            rec["ops"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|o| o["collective"] == "allreduce")
                .map(|o| o["algo"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        },
    );
    for a in algos {
        assert_eq!(
            a,
            ["ring", "direct", "direct", "recursive_doubling", "ring"],
            "per size {sizes:?}"
        );
    }
}

#[test]
fn nobody_leaves_a_barrier_before_everybody_arrived() {
    // Ranks arrive at different times; each notes when it arrived and when it
    // left. Every departure must come after the last arrival.
    for (n, host) in [
        (4usize, (|_| "one-host".into()) as fn(usize) -> String),
        (5, |r| format!("host{r}")),
        (6, |r| format!("host{}", r / 2)),
    ] {
        for round in 0..3u64 {
            let times = world(n, host, Duration::from_secs(20), move |c| {
                let delay = (c.rank() as u64 * 7 + round * 13) % 5 * 15;
                std::thread::sleep(Duration::from_millis(delay));
                let arrived = std::time::Instant::now();
                c.run(cadence_core::OpRequest::barrier()).unwrap();
                (arrived, std::time::Instant::now())
            });
            let last_arrival = times.iter().map(|t| t.0).max().unwrap();
            for (r, (_, left)) in times.iter().enumerate() {
                assert!(
                    *left >= last_arrival,
                    "rank {r} of {n} left before the last arrived"
                );
            }
        }
    }
}

#[test]
fn start_up_calibration_gives_every_rank_the_same_model() {
    // Two hosts of two ranks: rank 0 measures shared memory with rank 1 and
    // TCP with rank 2; everyone gets its numbers, and `auto` then runs on
    // them (a different choice on some rank would hang or mismatch).
    // Calibration is on by default.
    let got = world(
        4,
        |r| format!("host{}", r / 2),
        Duration::from_secs(30),
        |c| {
            let mut v = vec![1.0f32; 70_001];
            allreduce_f32(c, &mut v).unwrap();
            assert!(v.iter().all(|&x| x == 4.0));
            c.cost_model()
        },
    );
    let (model, at_start) = got[0].expect("a model measured at start-up");
    assert!(at_start);
    for link in [model.shm, model.tcp] {
        assert!(link.alpha > 0.0 && link.alpha < 0.1, "{model:?}");
        assert!(link.beta > 0.0 && link.beta < 1e-6, "{model:?}");
    }
    assert!(model.gamma > 0.0 && model.gamma < 1e-6, "{model:?}");
    assert!(got.iter().all(|m| *m == got[0]), "{got:?}");
}

#[test]
fn no_calibration_on_one_host_or_when_turned_off() {
    assert!(Config::default().calibrate, "on by default");
    let one_host = world(
        3,
        |_| "one-host".into(),
        Duration::from_secs(30),
        |c| c.cost_model(),
    );
    assert!(one_host.iter().all(Option::is_none));
    let off = Config {
        timeout: Duration::from_secs(30),
        calibrate: false,
        ..Config::default()
    };
    let off = world_with(4, |r| format!("host{r}"), off, |c| c.cost_model());
    assert!(off.iter().all(Option::is_none));
}

#[test]
fn metrics_count_every_operation_and_read_links_while_one_runs() {
    // Three ranks, two hosts: rank 0-1 over shared memory, rank 2 over TCP.
    // 7 allreduces of 4000 bytes and one barrier; then rank 1 is late for an
    // allreduce while rank 0's metrics are read from another thread.
    use serde_json::Value;
    use std::sync::atomic::{AtomicBool, Ordering};
    let got = world(
        3,
        |r| format!("host{}", r / 2),
        Duration::from_secs(30),
        |c| {
            for _ in 0..7 {
                let mut v = vec![1.0f32; 1000];
                allreduce_f32(c, &mut v).unwrap();
            }
            c.run(OpRequest::barrier()).unwrap();
            let after: Value = serde_json::from_str(&c.metrics()).unwrap();
            // Rank 1 stays out until rank 0's reader saw the operation run.
            static SEEN: AtomicBool = AtomicBool::new(false);
            let during = std::thread::scope(|s| {
                let reader = s.spawn(|| {
                    let t0 = std::time::Instant::now();
                    while c.rank() == 0 {
                        let m: Value = serde_json::from_str(&c.metrics()).unwrap();
                        if !m["running"].is_null() || t0.elapsed() > Duration::from_secs(10) {
                            SEEN.store(true, Ordering::Release);
                            return m;
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Value::Null
                });
                if c.rank() == 1 {
                    let t0 = std::time::Instant::now();
                    while !SEEN.load(Ordering::Acquire) && t0.elapsed() < Duration::from_secs(10) {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                let mut v = vec![1.0f32; 1000];
                allreduce_f32(c, &mut v).unwrap();
                reader.join().unwrap()
            });
            (after, during)
        },
    );
    for (r, (m, _)) in got.iter().enumerate() {
        let kinds = m["collectives"].as_array().unwrap();
        assert_eq!(kinds.len(), 2, "rank {r}: {m}");
        let ar = &kinds[0];
        assert_eq!(ar["collective"], "allreduce");
        assert_eq!(
            (ar["ok"].as_u64(), ar["failed"].as_u64()),
            (Some(7), Some(0))
        );
        assert_eq!(ar["bytes"], 28_000);
        let buckets = ar["buckets"].as_array().unwrap();
        assert_eq!(
            buckets.len(),
            m["bucket_bounds_ns"].as_array().unwrap().len() + 1
        );
        assert_eq!(buckets.iter().map(|b| b.as_u64().unwrap()).sum::<u64>(), 7);
        assert!(ar["duration_ns"].as_u64().unwrap() > 0);
        assert_eq!(kinds[1]["collective"], "barrier");
        assert_eq!(kinds[1]["ok"], 1);
        assert!(m["running"].is_null());
        // Each link: what one end sent the other received, byte for byte.
        let links = m["links"].as_array().unwrap();
        assert_eq!(links.len(), 2);
        // Any allreduce brings a rank at least (n-1)/n of the data.
        let got_in: u64 = links
            .iter()
            .map(|l| l["bytes_recv"].as_u64().unwrap())
            .sum();
        assert!(got_in >= 7 * 4000 * 2 / 3, "rank {r}: {m}");
        for l in links {
            let q = l["peer"].as_u64().unwrap() as usize;
            let tr = if (r < 2) == (q < 2) { "shm" } else { "tcp" };
            assert_eq!(l["transport"], tr, "rank {r} -> {q}");
            assert_eq!(l["peer_host"], format!("host{}", q / 2));
            assert!(l["busy_ns"].as_u64().unwrap() > 0, "{l}");
            let back = got[q].0["links"]
                .as_array()
                .unwrap()
                .iter()
                .find(|b| b["peer"] == r)
                .unwrap();
            assert_eq!(l["bytes_sent"], back["bytes_recv"], "{r} -> {q}");
            assert_eq!(l["msgs_sent"], back["msgs_recv"], "{r} -> {q}");
        }
    }
    // Read while rank 0 waited for rank 1 inside the allreduce: the running
    // operation is named, the counters are there, nothing waited for it.
    let during = &got[0].1;
    assert_eq!(during["running"]["collective"], "allreduce", "{during}");
    // Set-up's own collectives (clock, calibration) are numbered too.
    assert!(during["running"]["seq"].as_u64().unwrap() >= 9, "{during}");
    let started = during["running"]["start_ns"].as_u64().unwrap();
    assert!(during["now_ns"].as_u64().unwrap() > started);
    assert_eq!(during["links"].as_array().unwrap().len(), 2);
    assert_eq!(during["collectives"][0]["ok"], 7);
}

#[test]
fn a_links_busy_time_is_counted_once_per_phase() {
    // Two ranks on one host: every phase sends to and receives from the one
    // peer, which is one stretch of busy time, so the link's busy time
    // cannot grow more than the operations' durations (set-up's own barrier
    // is busy time too: compared from after it).
    use serde_json::Value;
    fn busy_and_ops(c: &Comm) -> (u64, u64) {
        let m: Value = serde_json::from_str(&c.metrics()).unwrap();
        let ops = m["collectives"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["duration_ns"].as_u64().unwrap())
            .sum();
        (m["links"][0]["busy_ns"].as_u64().unwrap(), ops)
    }
    let got = world(
        2,
        |_| "one-host".into(),
        Duration::from_secs(30),
        |c| {
            let before = busy_and_ops(c);
            for _ in 0..20 {
                let mut v = vec![1.0f32; 65_536];
                allreduce_f32(c, &mut v).unwrap();
            }
            let after = busy_and_ops(c);
            (after.0 - before.0, after.1 - before.1)
        },
    );
    for (busy, ops) in got {
        assert!(
            busy > 0 && busy <= ops,
            "busy {busy} ns, operations {ops} ns"
        );
    }
}

/// Minor page faults of the calling thread so far.
fn thread_minor_faults() -> i64 {
    // SAFETY: getrusage writes the struct it is given and nothing else.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_THREAD is valid on Linux.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    assert_eq!(rc, 0);
    ru.ru_minflt
}

#[test]
fn a_non_root_reduce_reuses_its_temporary_output() {
    // A non-root rank passes no output to reduce; the engine lends the
    // schedule one. Allocated anew each call, 64 MiB came back as a fresh
    // mapping (glibc maps allocations above 32 MiB anew): 16 384 page
    // faults a call, 44 ms of a 2-rank reduce that takes 11.
    let faults = world(
        2,
        |_| "h".into(),
        Duration::from_secs(120),
        |comm| {
            let n = 16 << 20; // f32 elements: 64 MiB
            let input = vec![1.0f32; n];
            let mut out = vec![0f32; n];
            let mut reduce = || {
                let req = OpRequest::new(CollKind::Reduce, DType::F32, RedOp::Sum, 0, vec![n])
                    .input(bytemuck::cast_slice(&input));
                let req = if comm.rank() == 0 {
                    req.output(bytemuck::cast_slice_mut(&mut out))
                } else {
                    req
                };
                comm.run(req).unwrap();
            };
            reduce();
            let before = thread_minor_faults();
            reduce();
            reduce();
            let faults = thread_minor_faults() - before;
            if comm.rank() == 0 {
                assert!(out.iter().all(|&v| v == 2.0));
            }
            faults
        },
    );
    // The non-root's two later calls: no fresh 64 MiB (16 384 pages) each.
    assert!(
        faults[1] < 2000,
        "rank 1 took {} page faults in two reduces",
        faults[1]
    );
}

/// Links are made on first use, so a rank may have none to the rank that
/// fails: the abort travels on the links that exist, relayed. Rank 7 of 8
/// one-rank hosts aborts; ranks 2 and 4 (no link to it after set-up: the
/// barrier's dissemination links 7 with 0, 1, 3, 5 and 6, and emulated
/// hosts on one machine measure no clocks) still fail their next operation
/// naming rank 7, well within the deadline.
#[test]
fn a_failure_reaches_ranks_never_linked_to_it() {
    let cfg = common::measuring_nothing(Duration::from_secs(5));
    let out = world_with(
        8,
        |r| format!("h{r}"),
        cfg,
        |comm| {
            let links = comm.links_open();
            let t = std::time::Instant::now();
            if comm.rank() == 7 {
                comm.abort("rank 7 gives up");
                return (links, None, t.elapsed());
            }
            let mut v = vec![1.0f32; 1000];
            let e = allreduce_f32(comm, &mut v).unwrap_err();
            (links, Some(e), t.elapsed())
        },
    );
    for (r, (links, e, took)) in out.iter().enumerate() {
        let Some(e) = e else { continue };
        assert_eq!(e.culprit(), Some(7), "rank {r}: {e}");
        assert!(e.to_string().contains("rank 7 gives up"), "rank {r}: {e}");
        assert!(
            *took < Duration::from_secs(5),
            "rank {r} learnt it after {took:?}"
        );
        if r == 2 || r == 4 {
            // Its dissemination partners only (2: 0, 1, 3, 4, 6; 4: 0, 2,
            // 3, 5, 6).
            assert_eq!(*links, 5, "rank {r} holds {links} links");
        }
    }
}

/// Clock offsets at start-up: hosts on other machines are measured by the
/// ping-pong tree (every machine here reads one clock, so the estimate is
/// within its error bound of 0), emulated hosts on rank 0's machine and
/// rank 0's own host read rank 0's clock and measure nothing.
#[test]
fn clock_offsets_are_measured_only_across_machines() {
    let n = 9;
    // Hosts h0..h4: ranks 0,1 | 2,3 | 4,5 | 6,7 | 8. Machines: h0 and h1
    // on rank 0's ("m0"), h2, h3 and h4 each on one of their own.
    let host = |r: usize| r / 2;
    let machine = |h: usize| {
        if h <= 1 {
            "m0".to_string()
        } else {
            format!("m{h}")
        }
    };
    let id = format!("clk{}x{}", std::process::id(), rand_tag());
    let secret = JobSecret::random().unwrap();
    let store = Arc::new(MemoryStore::new());
    let cfg = common::measuring_nothing(Duration::from_secs(30));
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let (id, store, cfg, secret) = (id.clone(), store.clone(), cfg.clone(), secret.clone());
            std::thread::spawn(move || {
                let ip = "127.0.0.1".parse().unwrap();
                let h = host(r);
                let mut b = Bootstrap::new(&id, r, n, &format!("h{h}"), ip, cfg, secret).unwrap();
                b.info.machine = machine(h);
                let comm = b.join(&store.handle(), "clk").unwrap();
                let c = comm.clock_offset();
                comm.run(OpRequest::barrier()).unwrap();
                (c.method, c.offset_ns, c.error_ns)
            })
        })
        .collect();
    let got: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    for (r, (method, offset, error)) in got.iter().enumerate() {
        let want = match host(r) {
            0 => "same host",
            1 => "same machine",
            _ => "ping-pong",
        };
        assert_eq!(*method, want, "rank {r}: {:?}", got[r]);
        if want == "ping-pong" {
            assert!(*error > 0, "rank {r}: {:?}", got[r]);
            // One clock in truth: the estimate is within its bound of 0
            // (and a little more for the time between reads).
            assert!(
                offset.unsigned_abs() <= error + 5_000_000,
                "rank {r}: {:?}",
                got[r]
            );
        } else {
            assert_eq!((*offset, *error), (0, 0), "rank {r}");
        }
    }
}
