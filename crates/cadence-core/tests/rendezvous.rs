//! The rendezvous: the core's own store (server and client, over TCP) and
//! the peer-table exchange every communicator starts with.

use cadence_core::comm::{Bootstrap, PeerInfo};
use cadence_core::rendezvous::{MemoryStore, Store, StoreClient, StoreError, StoreServer};
use cadence_core::{Config, ErrorKind, JobSecret};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn server() -> StoreServer {
    StoreServer::start("127.0.0.1:0".parse().unwrap()).unwrap()
}

fn client(s: &StoreServer) -> StoreClient {
    StoreClient::connect("127.0.0.1", s.addr().port(), Duration::from_secs(5), None).unwrap()
}

#[test]
fn the_store_sets_gets_counts_and_compares() {
    let s = server();
    let (a, b) = (client(&s), client(&s));
    a.set("k", b"v1").unwrap();
    assert_eq!(b.get("k", Duration::from_secs(1)).unwrap(), b"v1");
    assert_eq!(a.add("n", 5).unwrap(), 5);
    assert_eq!(b.add("n", -2).unwrap(), 3);
    // A counter reads as decimal text, as torch's store keeps it.
    assert_eq!(a.get("n", Duration::ZERO).unwrap(), b"3");
    assert!(a.check(&["k", "n"]).unwrap());
    assert!(!a.check(&["k", "missing"]).unwrap());
    // compare_set: a missing key matches an empty expected value.
    assert_eq!(a.compare_set("c", b"", b"7").unwrap(), b"7");
    assert_eq!(b.compare_set("c", b"", b"8").unwrap(), b"7");
    assert_eq!(b.compare_set("c", b"7", b"9").unwrap(), b"9");
    assert!(a.delete("c").unwrap());
    assert!(!a.delete("c").unwrap());
    assert_eq!(a.num_keys().unwrap(), 2);
    // Empty values and binary values survive.
    a.set("e", b"").unwrap();
    assert_eq!(b.get("e", Duration::ZERO).unwrap(), b"");
    let bin: Vec<u8> = (0..=255).collect();
    a.set("bin", &bin).unwrap();
    assert_eq!(b.get("bin", Duration::ZERO).unwrap(), bin);
}

#[test]
fn a_get_waits_for_the_key_and_times_out_naming_it() {
    let s = server();
    let a = Arc::new(client(&s));
    let b = client(&s);
    let waiter = {
        let a = a.clone();
        std::thread::spawn(move || a.get("late", Duration::from_secs(5)))
    };
    std::thread::sleep(Duration::from_millis(200));
    b.set("late", b"here").unwrap();
    assert_eq!(waiter.join().unwrap().unwrap(), b"here");
    let t = Instant::now();
    match b.get("never", Duration::from_millis(300)) {
        Err(StoreError::Timeout { key, .. }) => assert_eq!(key, "never"),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(t.elapsed() >= Duration::from_millis(290));
    assert!(t.elapsed() < Duration::from_secs(3));
    // The connection is still good after a timeout.
    assert_eq!(b.get("late", Duration::ZERO).unwrap(), b"here");
    assert!(b.wait(&["late"], Duration::from_millis(10)).is_ok());
    assert!(matches!(
        b.wait(&["late", "never"], Duration::from_millis(10)),
        Err(StoreError::Timeout { .. })
    ));
}

#[test]
fn strangers_and_garbage_do_not_hurt_the_store() {
    let s = server();
    let a = client(&s);
    a.set("k", b"v").unwrap();
    // Garbage instead of the greeting: dropped.
    let mut g = TcpStream::connect(s.addr()).unwrap();
    g.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut buf = [0u8; 64];
    g.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(
        g.read(&mut buf).unwrap_or(0),
        0,
        "the server answered garbage"
    );
    // The greeting, then a request with an absurd field count and length.
    let mut h = TcpStream::connect(s.addr()).unwrap();
    h.write_all(b"cadence-store/1\n").unwrap();
    h.read_exact(&mut [0u8; 16]).unwrap();
    h.write_all(&[1, 0, 0, 0, 0, 0xff, 0xff]).unwrap();
    let mut status = [0u8; 1];
    h.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    h.read_exact(&mut status).unwrap();
    assert_eq!(status[0], 2, "refused");
    // A stranger that connects and says nothing does not block members.
    let _silent = TcpStream::connect(s.addr()).unwrap();
    assert_eq!(client(&s).get("k", Duration::ZERO).unwrap(), b"v");
    // Something that is not a store: the client says so.
    let not_store = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = not_store.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let (mut c, _) = not_store.accept().unwrap();
        let _ = c.write_all(b"SSH-2.0-OpenSSH_9\r\n");
        std::thread::sleep(Duration::from_secs(1));
    });
    match StoreClient::connect("127.0.0.1", port, Duration::from_secs(2), None) {
        Err(StoreError::Protocol(m)) => assert!(m.contains("protocol"), "{m}"),
        Err(e) => panic!("expected a protocol error, got {e}"),
        Ok(_) => panic!("expected a protocol error, got a client"),
    }
}

#[test]
fn an_idle_client_is_let_go_as_soon_as_the_server_stops() {
    // Its connection's thread sleeps on its socket and the stop bell (it
    // used to wake every second to look, a thousand wake-ups a second on
    // rank 0 of a job of a thousand ranks).
    let s = server();
    let mut idle = TcpStream::connect(s.addr()).unwrap();
    idle.write_all(b"cadence-store/1\n").unwrap();
    idle.read_exact(&mut [0u8; 16]).unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    let t = Instant::now();
    drop(s);
    idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(idle.read(&mut [0u8; 1]).unwrap(), 0, "closed");
    assert!(
        t.elapsed() < Duration::from_millis(300),
        "let go after {:?}",
        t.elapsed()
    );
}

#[test]
fn a_client_waits_for_a_server_that_comes_late_and_names_one_that_never_comes() {
    // Find a free port, then serve on it only after the client started.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let late = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let s = StoreServer::start(format!("127.0.0.1:{port}").parse().unwrap()).unwrap();
        std::thread::sleep(Duration::from_secs(2));
        drop(s);
    });
    let c = StoreClient::connect("127.0.0.1", port, Duration::from_secs(5), None).unwrap();
    c.set("x", b"1").unwrap();
    late.join().unwrap();
    // The server is gone: a request fails, naming the store.
    match c.get("x", Duration::from_millis(100)) {
        Err(StoreError::Unreachable { addr, .. }) => assert!(addr.ends_with(&port.to_string())),
        other => panic!("expected unreachable, got {other:?}"),
    }
    let t = Instant::now();
    assert!(matches!(
        StoreClient::connect("127.0.0.1", port, Duration::from_millis(300), None),
        Err(StoreError::Unreachable { .. })
    ));
    assert!(t.elapsed() < Duration::from_secs(3));
}

/// Runs the peer-table exchange alone on `n` threads through `store`.
fn exchange(
    n: usize,
    store: &MemoryStore,
    skip: Option<usize>,
    timeout: Duration,
) -> Vec<Option<Result<Vec<PeerInfo>, cadence_core::CommError>>> {
    // The tables as records (what each rank published), to compare.
    let id = format!("g{}x{n}", std::process::id());
    let secret = JobSecret::random().unwrap();
    let cfg = Config {
        timeout,
        ..Config::default()
    };
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let (id, cfg, secret, h) = (id.clone(), cfg.clone(), secret.clone(), store.handle());
            std::thread::spawn(move || {
                if Some(r) == skip {
                    return None;
                }
                let host = format!("h{}", r % 3);
                let b = Bootstrap::new(&id, r, n, &host, "127.0.0.1".parse().unwrap(), cfg, secret)
                    .unwrap();
                let out = b.exchange(&h, "x");
                assert!(h.ops() <= 2, "rank {r}: {} store operations", h.ops());
                Some(out.map(|t| {
                    assert_eq!(t.nic_addr(r, 0).to_string(), b.info.addr);
                    (0..t.len()).map(|q| t.record(q)).collect()
                }))
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn every_rank_learns_every_record_from_two_store_operations() {
    for n in [1, 2, 3, 5, 7, 8, 9, 16, 17, 33] {
        let store = MemoryStore::new();
        let out = exchange(n, &store, None, Duration::from_secs(30));
        let tables: Vec<Vec<PeerInfo>> = out.into_iter().map(|o| o.unwrap().unwrap()).collect();
        for (r, t) in tables.iter().enumerate() {
            assert_eq!(t.len(), n);
            for (q, p) in t.iter().enumerate() {
                assert_eq!(p.rank, q, "n={n}, rank {r}");
                assert_eq!(p.host, format!("h{}", q % 3));
                // Everyone agrees with the rank's own record.
                assert_eq!(p.addr, tables[q][q].addr, "n={n}: rank {r}'s entry for {q}");
            }
        }
    }
}

#[test]
fn a_rank_that_never_joins_is_named_by_its_predecessor() {
    let n = 6;
    let store = MemoryStore::new();
    let t = Instant::now();
    let out = exchange(n, &store, Some(4), Duration::from_secs(2));
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    let e = out[3].as_ref().unwrap().as_ref().unwrap_err();
    match &e.kind {
        ErrorKind::Setup { detail, culprit } => {
            assert_eq!(*culprit, Some(4), "{detail}");
            assert!(detail.contains("rank 4 never joined"), "{detail}");
        }
        k => panic!("{k:?}"),
    }
    // Every other rank fails too, in time, naming somebody.
    for (r, o) in out.iter().enumerate() {
        if r != 4 {
            assert!(
                o.as_ref().unwrap().is_err(),
                "rank {r} finished without rank 4"
            );
        }
    }
}

fn threads_of_this_process() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Threads:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn one_thread_serves_every_client_and_a_write_wakes_every_waiter() {
    // A thread per connection held thousands of threads on rank 0 of a job
    // of thousands of ranks. (Other tests of this binary run meanwhile and
    // start threads of their own: the bound leaves them room.)
    let s = server();
    let before = threads_of_this_process();
    let clients: Vec<StoreClient> = (0..200).map(|_| client(&s)).collect();
    for (i, c) in clients.iter().enumerate() {
        c.set(&format!("k{i}"), &[i as u8]).unwrap();
    }
    for (i, c) in clients.iter().enumerate() {
        let j = (i + 1) % clients.len();
        assert_eq!(c.get(&format!("k{j}"), Duration::ZERO).unwrap(), [j as u8]);
    }
    let grew = threads_of_this_process().saturating_sub(before);
    assert!(grew < 50, "200 clients took {grew} threads");
    // Fifty clients park on one key; one write answers them all, and a
    // client parked on two keys is answered once both are there.
    let clients = Arc::new(clients);
    let waiters: Vec<_> = (0..50)
        .map(|i| {
            let cs = clients.clone();
            std::thread::spawn(move || cs[i].get("go", Duration::from_secs(10)))
        })
        .collect();
    let both = {
        let cs = clients.clone();
        std::thread::spawn(move || cs[60].wait(&["go", "later"], Duration::from_secs(10)))
    };
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    clients[100].set("go", b"now").unwrap();
    for w in waiters {
        assert_eq!(w.join().unwrap().unwrap(), b"now");
    }
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(!both.is_finished(), "answered before its second key");
    clients[101].set("later", b"").unwrap();
    both.join().unwrap().unwrap();
}
