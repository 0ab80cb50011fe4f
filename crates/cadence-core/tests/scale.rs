//! Set-up at scale, in one process: one thread per rank, one loopback
//! address per emulated host (127.0.h.1: shared memory within a host, TCP
//! between), a counting store. Each rank joins (two store operations), then
//! runs a ring allreduce, a recursive-doubling allreduce, an alltoall, a
//! barrier and a split into 8 groups (with an allreduce in each), every
//! result checked; what a rank holds is counted after init and after the
//! collectives.
//!
//! `cargo test --release --test scale` runs 64 ranks (16 hosts × 4). The
//! sweep of docs/benchmarks.md ("Set-up at scale") runs the ignored test:
//! `CADENCE_SCALE=64,256,1024,2048 cargo test --release --test scale -- --ignored --nocapture`
//! (8 ranks per host; root raises the open-file hard limit, which the
//! ranks of one process share).

use cadence_core::comm::{Bootstrap, Comm, OpRequest};
use cadence_core::rendezvous::MemoryStore;
use cadence_core::schedule::Algo;
use cadence_core::{CollKind, Config, DType, JobSecret, RedOp};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

/// The split's groups (rank mod GROUPS).
const GROUPS: usize = 8;
/// The most ranks the alltoall runs at (see `run`).
const ALLTOALL_MAX: usize = 512;

#[derive(Debug, Default, Clone)]
struct RankFigures {
    store_ops: usize,
    links_after_init: usize,
    links_after: usize,
}

#[derive(Debug)]
struct Run {
    n: usize,
    per_host: usize,
    wall_s: f64,
    cpu_s: f64,
    ranks: Vec<RankFigures>,
    fds_after_init: usize,
    rss_after_init_kib: u64,
}

fn cpu_seconds() -> f64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct we own.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// The open-file limit up to `want` (the hard one too, as root).
fn raise_nofile(want: u64) {
    let lim = libc::rlimit {
        rlim_cur: want,
        rlim_max: want,
    };
    // SAFETY: setrlimit reads the struct; failing (not root) is fine.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
}

fn host_ip(h: usize) -> std::net::IpAddr {
    std::net::Ipv4Addr::new(127, (h / 250) as u8 + 1, (h % 250) as u8, 1).into()
}

fn f64_allreduce(comm: &Comm, algo: Algo, x: &mut [f64]) {
    let n = x.len();
    let mut req = OpRequest::new(CollKind::AllReduce, DType::F64, RedOp::Sum, 0, vec![n])
        .inout(bytemuck::cast_slice_mut(x));
    req.algo = Some(algo);
    comm.run(req).unwrap();
}

fn run(n: usize, per_host: usize) -> Run {
    let cfg = Config {
        timeout: Duration::from_secs(120),
        // Start-up measurements are their own concern (the profile's and
        // calibration's cost is stated apart); the small ring keeps 2,048
        // ranks' shared memory within this machine.
        calibrate: false,
        topo: cadence_core::config::TopoSource::Off,
        shm: cadence_core::transport::shm::ShmConfig {
            ring_bytes: 64 << 10,
            ..Default::default()
        },
        debug: cadence_core::config::DebugLevel::Off,
        ..Config::default()
    };
    let id = format!("sc{}n{n}", std::process::id());
    let secret = JobSecret::random().unwrap();
    let store = Arc::new(MemoryStore::new());
    let all_ready = Arc::new(Barrier::new(n + 1));
    let inited = Arc::new(Barrier::new(n + 1));
    let measured = Arc::new(Barrier::new(n + 1));
    let figures = Arc::new(Mutex::new(vec![RankFigures::default(); n]));
    let split_table = Arc::new(Mutex::new(vec![(Vec::new(), (0i64, 0u64)); n]));
    let split_ready = Arc::new(Barrier::new(n));
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let (id, secret, store, cfg, figures) = (
                id.clone(),
                secret.clone(),
                store.clone(),
                cfg.clone(),
                figures.clone(),
            );
            let (all_ready, inited, measured) =
                (all_ready.clone(), inited.clone(), measured.clone());
            let (split_table, split_ready) = (split_table.clone(), split_ready.clone());
            std::thread::Builder::new()
                .stack_size(1 << 20)
                .spawn(move || {
                    let h = r / per_host;
                    let b = Bootstrap::new(
                        &id,
                        r,
                        n,
                        &format!("h{h}"),
                        host_ip(h),
                        cfg,
                        secret.clone(),
                    )
                    .unwrap();
                    let mine = store.handle();
                    all_ready.wait();
                    let comm = b.join(&mine, "scale").unwrap();
                    let after_init = comm.links_open();
                    inited.wait();
                    measured.wait();
                    // Ring and recursive doubling, each checked.
                    for algo in [Algo::Ring, Algo::RecursiveDoubling] {
                        let mut x: Vec<f64> = (0..33).map(|i| (r * 33 + i) as f64).collect();
                        f64_allreduce(&comm, algo, &mut x);
                        for (i, v) in x.iter().enumerate() {
                            let want = (0..n).map(|q| (q * 33 + i) as f64).sum::<f64>();
                            assert_eq!(*v, want, "rank {r} {algo:?} element {i}");
                        }
                    }
                    // Alltoall: rank r sends q's block the value r*n+q. Its
                    // call takes the whole n × n count matrix on every rank
                    // (O(n²) per rank: issue 45), so it runs up to
                    // ALLTOALL_MAX ranks.
                    if n <= ALLTOALL_MAX {
                        let send: Vec<i64> = (0..n).map(|q| (r * n + q) as i64).collect();
                        let mut recv = vec![0i64; n];
                        comm.run(
                            OpRequest::new(
                                CollKind::AllToAll,
                                DType::I64,
                                RedOp::Sum,
                                0,
                                vec![1; n * n],
                            )
                            .input(bytemuck::cast_slice(&send))
                            .output(bytemuck::cast_slice_mut(&mut recv)),
                        )
                        .unwrap();
                        for (q, v) in recv.iter().enumerate() {
                            assert_eq!(*v, (q * n + r) as i64, "rank {r} alltoall from {q}");
                        }
                    }
                    comm.run(OpRequest::barrier()).unwrap();
                    // A split into GROUPS by rank mod GROUPS, as Python's
                    // `split` makes it: ports and clocks shared (here through
                    // memory; there by an allgather over the parent).
                    let color = r % GROUPS;
                    let members: Vec<usize> = (0..n).filter(|q| q % GROUPS == color).collect();
                    let me = members.iter().position(|&q| q == r).unwrap();
                    let sub_id = format!("{id}s{color}");
                    let b = Bootstrap::new(
                        &sub_id,
                        me,
                        members.len(),
                        &format!("h{h}"),
                        host_ip(h),
                        comm.config().clone(),
                        secret.clone(),
                    )
                    .unwrap();
                    let c = comm.clock_offset();
                    split_table.lock().unwrap()[r] = (b.ports(), (c.offset_ns, c.error_ns));
                    split_ready.wait();
                    let (ports, clocks): (Vec<Vec<u16>>, Vec<(i64, u64)>) = {
                        let t = split_table.lock().unwrap();
                        members.iter().map(|&q| t[q].clone()).unzip()
                    };
                    let sub = b.connect_split(&comm, &members, &ports, &clocks).unwrap();
                    let mut x = vec![r as f64; 5];
                    f64_allreduce(&sub, Algo::Ring, &mut x);
                    let want: f64 = members.iter().map(|&q| q as f64).sum();
                    assert_eq!(x[0], want, "rank {r} in group {color}");
                    sub.close();
                    figures.lock().unwrap()[r] = RankFigures {
                        store_ops: mine.ops(),
                        links_after_init: after_init,
                        links_after: comm.links_open(),
                    };
                    comm.close();
                })
                .unwrap()
        })
        .collect();
    all_ready.wait();
    let (t0, c0) = (Instant::now(), cpu_seconds());
    inited.wait();
    let (wall_s, cpu_s) = (t0.elapsed().as_secs_f64(), cpu_seconds() - c0);
    let (fds_after_init, rss_after_init_kib) = (open_fds(), rss_kib());
    measured.wait();
    for h in hs {
        h.join().unwrap();
    }
    let ranks = figures.lock().unwrap().clone();
    Run {
        n,
        per_host,
        wall_s,
        cpu_s,
        ranks,
        fds_after_init,
        rss_after_init_kib,
    }
}

fn ceil_log2(n: usize) -> usize {
    (usize::BITS - (n - 1).leading_zeros()) as usize
}

fn report(r: &Run) {
    let max = |f: fn(&RankFigures) -> usize| r.ranks.iter().map(f).max().unwrap_or(0);
    let mut after: Vec<usize> = r.ranks.iter().map(|f| f.links_after_init).collect();
    after.sort_unstable();
    println!(
        "n={:5} ({} hosts x {}): set-up wall {:.2}s cpu {:.2}s | store ops/rank max {} | links \
         after init median {} max {} (bound {}) | after the collectives max {} | fds/rank {:.1} \
         | RSS/rank {:.0} KiB",
        r.n,
        r.n / r.per_host,
        r.per_host,
        r.wall_s,
        r.cpu_s,
        max(|f| f.store_ops),
        after[after.len() / 2],
        after[after.len() - 1],
        2 * ceil_log2(r.n) + 8,
        max(|f| f.links_after),
        r.fds_after_init as f64 / r.n as f64,
        r.rss_after_init_kib as f64 / r.n as f64,
    );
}

#[test]
fn sixty_four_ranks_start_with_few_links_and_two_store_operations_each() {
    raise_nofile(1 << 16);
    let r = run(64, 4);
    report(&r);
    for (rank, f) in r.ranks.iter().enumerate() {
        assert!(f.store_ops <= 2, "rank {rank}: {f:?}");
        // Shared memory with its 3 host mates, dissemination partners, and
        // the clock's link to rank 0's host (rank 0: every host's leader).
        let bound = if rank == 0 { 64 } else { 2 * ceil_log2(64) + 8 };
        assert!(f.links_after_init <= bound, "rank {rank}: {f:?}");
        assert!(
            f.links_after_init < 63,
            "rank {rank} holds a full mesh: {f:?}"
        );
    }
}

#[test]
#[ignore = "a sweep for docs/benchmarks.md: CADENCE_SCALE=64,256,1024,2048"]
fn sweep() {
    raise_nofile(1 << 20);
    let sizes = std::env::var("CADENCE_SCALE").unwrap_or_else(|_| "64,256".into());
    for n in sizes.split(',').map(|s| s.trim().parse::<usize>().unwrap()) {
        report(&run(n, 8));
    }
}

/// The first message to a peer this rank never talked to pays for making
/// the link: measured here against the next messages on it, ping-pong
/// between ranks 0 and 3 of 8 one-rank hosts (the set-up barrier's
/// dissemination links 0 with 1, 2, 4, 6 and 7, not 3).
#[test]
fn the_first_message_to_a_new_peer_costs_about_one_connection() {
    let n = 8;
    let id = format!("fm{}", std::process::id());
    let secret = JobSecret::random().unwrap();
    let store = Arc::new(MemoryStore::new());
    let cfg = Config {
        timeout: Duration::from_secs(30),
        calibrate: false,
        topo: cadence_core::config::TopoSource::Off,
        ..Config::default()
    };
    // The other ranks wait off the cores meanwhile (not in a collective,
    // which would spin on this 2-core machine).
    let pingpong_done = Arc::new(Barrier::new(n));
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let (id, secret, store, cfg) = (id.clone(), secret.clone(), store.clone(), cfg.clone());
            let pingpong_done = pingpong_done.clone();
            std::thread::spawn(move || {
                let b =
                    Bootstrap::new(&id, r, n, &format!("h{r}"), host_ip(r), cfg, secret).unwrap();
                let comm = b.join(&store.handle(), "fm").unwrap();
                let linked = comm.links_open();
                let mut times = Vec::new();
                if r == 2 || r == 7 {
                    let peer = 9 - r;
                    let mut buf = [0u8; 8];
                    for _ in 0..20 {
                        let t = Instant::now();
                        let kinds = if r == 2 {
                            [CollKind::Send, CollKind::Recv]
                        } else {
                            [CollKind::Recv, CollKind::Send]
                        };
                        for k in kinds {
                            let req = OpRequest::new(k, DType::U8, RedOp::Sum, peer, vec![8]);
                            if k == CollKind::Send {
                                let copy = buf;
                                comm.run(req.input(&copy)).unwrap();
                            } else {
                                comm.run(req.output(&mut buf)).unwrap();
                            }
                        }
                        times.push(t.elapsed());
                    }
                }
                pingpong_done.wait();
                comm.run(OpRequest::barrier()).unwrap();
                (linked, times)
            })
        })
        .collect();
    let out: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    let t = &out[2].1;
    let later = {
        let mut v: Vec<Duration> = t[1..].to_vec();
        v.sort();
        v[v.len() / 2]
    };
    println!(
        "first round trip to a new peer {:?}, later ones (median) {later:?}; rank 2 held {} \
         links after init",
        t[0], out[2].0
    );
    assert!(
        out[2].0 < n - 1,
        "rank 2 is linked to every rank after init"
    );
    // A connection of two streams and its handshake on loopback: well under
    // 50 ms on a loaded 2-core machine.
    assert!(t[0] < later + Duration::from_millis(50), "{:?}", t[0]);
}
