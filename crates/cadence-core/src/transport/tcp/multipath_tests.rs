//! The multipath decisions on simulated time: every `Instant` is `t0` plus
//! a duration, every kernel reading is made up by the test.

use super::*;
use crate::transport::WireHeader;

const MS: Duration = Duration::from_millis(1);
const CHUNK: usize = 64 * 1024;
const FRAME: u64 = (CHUNK + TCP_HEADER_BYTES) as u64;

/// A sender's view with nothing being written.
fn idle(tx: &[Option<TxChunk>]) -> Sending<'_> {
    Sending {
        tx,
        next_msg: 1,
        ctl_started: false,
    }
}

fn chunk_header(msg: u32, index: usize) -> TcpHeader {
    TcpHeader {
        base: WireHeader {
            len: CHUNK as u64,
            ..Default::default()
        },
        msg,
        flags: 0,
        off: (index * CHUNK) as u64,
    }
}

/// Kernel send queues that drain at a fixed rate each (bytes per second;
/// 0: the path carries nothing).
struct Kernel {
    queued: Vec<u64>,
    bps: Vec<f64>,
}

impl Kernel {
    fn new(bps: &[f64]) -> Kernel {
        Kernel {
            queued: vec![0; bps.len()],
            bps: bps.to_vec(),
        }
    }

    /// `dt` passes: every queue drains at its rate.
    fn run(&mut self, dt: Duration) {
        for (q, bps) in self.queued.iter_mut().zip(&self.bps) {
            let sent = (bps * dt.as_secs_f64()) as u64;
            *q = q.saturating_sub(sent);
        }
    }

    /// Every queue read into `mp` at `now`.
    fn report(&self, mp: &mut Multipath, now: Instant) {
        for (s, &q) in self.queued.iter().enumerate() {
            mp.on_queue(s, q, now);
        }
    }

    /// A chunk written whole on stream `s` (its copy kept when failover is
    /// on, as the link does).
    fn write(&mut self, mp: &mut Multipath, s: usize, hdr: TcpHeader) {
        self.queued[s] += FRAME;
        mp.on_written(s, FRAME);
        if mp.on() {
            mp.on_frame_written(s, hdr, vec![0; CHUNK]);
        }
    }
}

/// Drives a sender for `ticks` milliseconds from `t`: every millisecond
/// the queues drain and are read, then each stream with room takes chunks
/// while it is the one expected to finish them first (as `pump` does).
/// Returns the chunks each stream took, and the time reached.
fn drive(
    mp: &mut Multipath,
    kernel: &mut Kernel,
    mut t: Instant,
    ticks: usize,
    msg: &mut u32,
) -> (Vec<usize>, Instant) {
    let room = 4 * FRAME;
    let tx: Vec<Option<TxChunk>> = (0..kernel.queued.len()).map(|_| None).collect();
    let mut taken = vec![0; kernel.queued.len()];
    for _ in 0..ticks {
        t += MS;
        kernel.run(MS);
        kernel.report(mp, t);
        for (s, took) in taken.iter_mut().enumerate() {
            while mp.stream_up(s)
                && kernel.queued[s] < room
                && mp.first_to_finish(CHUNK, &tx, t) == s
            {
                kernel.write(mp, s, chunk_header(*msg, 0));
                *msg = msg.wrapping_add(1);
                *took += 1;
            }
        }
    }
    (taken, t)
}

/// One `maintain` check at `now`: the stalled streams' acknowledgement
/// state comes from `acks`, as `TCP_INFO` would say it.
fn check(
    mp: &mut Multipath,
    now: Instant,
    acks: impl Fn(usize) -> PeerAcks,
) -> Result<Vec<PathEvent>, ErrorKind> {
    let tx: Vec<Option<TxChunk>> = (0..mp.path_of.len()).map(|_| None).collect();
    let stalled: Vec<_> = mp
        .stalled_streams(now)
        .into_iter()
        .map(|s| (s, acks(s)))
        .collect();
    let r = mp.check_paths(now, &stalled, &idle(&tx));
    let events = std::iter::from_fn(|| mp.poll_event()).collect();
    r.map(|()| events)
}

/// A link of two streams on two paths to rank 4 on "node9", down after 2 s
/// without delivery.
fn two_paths(t0: Instant) -> Multipath {
    let mut mp = Multipath::new(4, 2, 2, t0);
    mp.configure(
        Duration::from_secs(2),
        "node9",
        vec!["a".into(), "b".into()],
    );
    mp
}

/// A peer that has answered nothing since `since`, with bytes out to it.
fn silent_since(since: Instant, now: Instant) -> PeerAcks {
    PeerAcks {
        unacked: 10,
        probes: 0,
        last_ack_recv_ms: now.duration_since(since).as_millis() as u32,
    }
}

#[test]
fn rates_converge_and_chunks_split_by_rate() {
    let t0 = Instant::now();
    // Two streams on one path: no failover, only the scheduler.
    let mut mp = Multipath::new(0, 2, 1, t0);
    let mut kernel = Kernel::new(&[40e6, 10e6]);
    let mut msg = 0;
    let (_, t) = drive(&mut mp, &mut kernel, t0, 500, &mut msg);
    for (s, want) in [(0, 40e6), (1, 10e6)] {
        let got = mp.rate[s].planning_bps(t).unwrap();
        assert!(
            (got / want - 1.0).abs() < 0.1,
            "stream {s}: {got} B/s, not {want}"
        );
        let published = mp.published_bps(0);
        assert!((published / 50e6 - 1.0).abs() < 0.1, "{published}");
    }
    // Measured, the split follows the rates: 4 to 1.
    let (taken, _) = drive(&mut mp, &mut kernel, t, 1000, &mut msg);
    let ratio = taken[0] as f64 / taken[1] as f64;
    assert!((3.5..4.5).contains(&ratio), "{taken:?}");
}

#[test]
fn an_unmeasured_stream_counts_as_the_fastest_and_ties_go_to_stream_0() {
    let t0 = Instant::now();
    let mp = Multipath::new(0, 3, 3, t0);
    let tx: Vec<Option<TxChunk>> = (0..3).map(|_| None).collect();
    assert_eq!(mp.first_to_finish(48, &tx, t0), 0);
}

#[test]
fn a_silent_path_fails_at_its_deadline_and_its_chunks_go_to_the_other() {
    let t0 = Instant::now();
    let mut mp = two_paths(t0);
    let mut kernel = Kernel::new(&[100e6, 100e6]);
    let mut msg = 0;
    let (taken, t_cut) = drive(&mut mp, &mut kernel, t0, 200, &mut msg);
    assert!(taken[1] > 0, "{taken:?}");
    // Path 1 is cut: its queue stops draining, its peer stops answering.
    kernel.bps[1] = 0.0;
    let held = kernel.queued[1];
    assert!(held > 0);
    let unacked: Vec<(u32, u64)> = mp.unacked[1]
        .iter()
        .map(|c| (c.hdr.msg, c.hdr.off))
        .collect();
    assert!(!unacked.is_empty());
    // Stream 1 last delivered in the tick before the cut; the path goes
    // down exactly one timeout after that, not a millisecond earlier.
    let last_progress = mp.rate[1].progress_at;
    let deadline = last_progress + Duration::from_secs(2);
    let mut t = t_cut;
    while t + MS < deadline {
        t += MS;
        kernel.run(MS);
        kernel.report(&mut mp, t);
        let events = check(&mut mp, t, |_| silent_since(last_progress, t)).unwrap();
        assert!(events.is_empty(), "down before the deadline: {events:?}");
    }
    t += MS;
    assert_eq!(t, deadline);
    kernel.report(&mut mp, t);
    let events = check(&mut mp, t, |_| silent_since(last_progress, t)).unwrap();
    let [PathEvent::Down {
        path: 1,
        chunks,
        others,
        ..
    }] = &events[..]
    else {
        panic!("{events:?}");
    };
    assert_eq!(*chunks, unacked.len());
    assert_eq!(others, &[0]);
    assert!(!mp.stream_up(1));
    assert_eq!(mp.ctl_stream(), 0);
    // Its chunks go again, flagged, oldest message first; new chunks go
    // to the working path only.
    let tx: Vec<Option<TxChunk>> = (0..2).map(|_| None).collect();
    assert_eq!(mp.first_to_finish(CHUNK, &tx, t), 0);
    let mut again = Vec::new();
    while let Some(c) = mp.take_resend() {
        assert_eq!(c.hdr.flags & FLAG_RESENT, FLAG_RESENT);
        again.push((c.hdr.msg, c.hdr.off));
    }
    assert_eq!(again, unacked);
}

#[test]
fn a_slow_path_whose_peer_answers_stays_up() {
    let t0 = Instant::now();
    let mut mp = Multipath::new(4, 2, 2, t0);
    let mut kernel = Kernel::new(&[100e6, 100e6]);
    let mut msg = 0;
    let (_, mut t) = drive(&mut mp, &mut kernel, t0, 50, &mut msg);
    kernel.bps[1] = 0.0;
    for _ in 0..5000 {
        t += MS;
        kernel.report(&mut mp, t);
        // Its window closed, but it answers every probe.
        let acks = |_| PeerAcks {
            unacked: 0,
            probes: 1,
            last_ack_recv_ms: 200,
        };
        assert_eq!(check(&mut mp, t, acks).unwrap(), vec![]);
    }
    assert!(mp.stream_up(1));
}

#[test]
fn a_failed_path_comes_back_once_it_delivers_what_it_held() {
    let t0 = Instant::now();
    let mut mp = Multipath::new(4, 2, 2, t0);
    let mut kernel = Kernel::new(&[100e6, 100e6]);
    let mut msg = 0;
    let (_, t) = drive(&mut mp, &mut kernel, t0, 100, &mut msg);
    kernel.bps[1] = 0.0;
    let cut = mp.rate[1].progress_at;
    let mut t = t;
    let mut down_at = None;
    while down_at.is_none() {
        t += MS;
        kernel.run(MS);
        kernel.report(&mut mp, t);
        let events = check(&mut mp, t, |_| silent_since(cut, t)).unwrap();
        if !events.is_empty() {
            down_at = Some(t);
        }
    }
    // Some of what it held arrives: not yet back.
    kernel.queued[1] /= 2;
    t += MS;
    kernel.report(&mut mp, t);
    assert_eq!(check(&mut mp, t, |_| PeerAcks::default()).unwrap(), vec![]);
    assert!(!mp.stream_up(1));
    // All of it: back, measured afresh, and tried at once.
    kernel.queued[1] = 0;
    t += 3 * MS;
    kernel.report(&mut mp, t);
    let events = check(&mut mp, t, |_| PeerAcks::default()).unwrap();
    assert_eq!(
        events,
        vec![PathEvent::Up {
            path: 1,
            down_for: t - down_at.unwrap(),
            quiet: false
        }]
    );
    assert!(mp.stream_up(1));
    assert_eq!(mp.rate[1].planning_bps(t), None);
    kernel.bps[1] = 100e6;
    let (taken, _) = drive(&mut mp, &mut kernel, t, 50, &mut msg);
    assert!(taken[1] > 0, "{taken:?}");
}

#[test]
fn a_path_that_errs_never_comes_back() {
    let t0 = Instant::now();
    let mut mp = Multipath::new(4, 2, 2, t0);
    let tx: Vec<Option<TxChunk>> = (0..2).map(|_| None).collect();
    let reset = ErrorKind::PeerClosed {
        peer: 4,
        detail: "connection reset".into(),
    };
    mp.stream_failed(1, reset, t0, &idle(&tx)).unwrap();
    assert!(matches!(
        mp.poll_event(),
        Some(PathEvent::Down { path: 1, .. })
    ));
    mp.on_queue(1, 0, t0 + MS);
    assert_eq!(
        check(&mut mp, t0 + 2 * MS, |_| PeerAcks::default()).unwrap(),
        vec![]
    );
    assert!(!mp.stream_up(1));
}

#[test]
fn the_last_path_failing_is_the_links_error_naming_every_path() {
    let t0 = Instant::now();
    let mut mp = Multipath::new(5, 2, 2, t0);
    mp.configure(
        Duration::from_secs(1),
        "node7",
        vec!["10.0.0.1 -> 10.0.0.2".into(), "10.0.1.1 -> 10.0.1.2".into()],
    );
    let tx: Vec<Option<TxChunk>> = (0..2).map(|_| None).collect();
    mp.path_down(0, "cut".into(), false, t0, &idle(&tx))
        .unwrap();
    let reset = ErrorKind::PeerClosed {
        peer: 5,
        detail: "connection reset".into(),
    };
    let err = mp
        .stream_failed(1, reset.clone(), t0 + MS, &idle(&tx))
        .unwrap_err();
    let ErrorKind::PeerClosed { peer: 5, detail } = err else {
        panic!("{err:?}");
    };
    assert_eq!(
        detail,
        format!(
            "no path to it works (host node7): 10.0.0.1 -> 10.0.0.2 (cut); \
             10.0.1.1 -> 10.0.1.2 ({reset})"
        )
    );
    // With one path there is no failover: a stream's error is the link's.
    let mut single = Multipath::new(5, 2, 1, t0);
    let err = single
        .stream_failed(1, reset.clone(), t0, &idle(&tx))
        .unwrap_err();
    assert_eq!(err.to_string(), reset.to_string());
}

#[test]
fn the_chunk_being_written_on_a_failed_path_goes_again_too() {
    let t0 = Instant::now();
    let mut mp = Multipath::new(4, 2, 2, t0);
    let half = TxChunk {
        hdr: chunk_header(3, 2),
        hdr_done: TCP_HEADER_BYTES,
        done: 100,
        copy: Some(vec![7; CHUNK]),
    };
    let tx = vec![None, Some(half)];
    let sending = Sending {
        tx: &tx,
        next_msg: 4,
        ctl_started: false,
    };
    mp.path_down(1, "cut".into(), false, t0, &sending).unwrap();
    let c = mp.take_resend().expect("the half-written chunk");
    assert_eq!((c.hdr.msg, c.hdr.off), (3, 2 * CHUNK as u64));
    assert_eq!(c.data, vec![7; CHUNK]);
}

#[test]
fn a_link_at_rest_is_not_read_and_a_write_after_a_long_rest_is_no_stall() {
    let t0 = Instant::now();
    let mut mp = two_paths(t0);
    assert!(mp.at_rest(t0), "nothing written yet");
    let mut kernel = Kernel::new(&[100e6, 100e6]);
    let mut msg = 0;
    let (_, t) = drive(&mut mp, &mut kernel, t0, 20, &mut msg);
    assert!(!mp.at_rest(t), "bytes queued: the link must be read");
    // The queues drain and a reading says so: at rest.
    let t = t + 100 * MS;
    kernel.run(100 * MS);
    kernel.report(&mut mp, t);
    assert!(mp.at_rest(t));
    // Ten seconds at rest, no reading meanwhile (the check skips them), and
    // nothing from the peer either (nothing to acknowledge): a chunk
    // written then is not taken for a stream silent for 10 s.
    let quiet_since = t;
    let t = t + Duration::from_secs(10);
    assert!(mp.at_rest(t));
    kernel.write(&mut mp, 1, chunk_header(msg, 0));
    assert!(!mp.at_rest(t), "written since the last reading");
    let events = check(&mut mp, t + MS, |_| silent_since(quiet_since, t + MS)).unwrap();
    assert!(events.is_empty(), "{events:?}");
    assert!(mp.stream_up(1));
    // A path down (waiting to come back) keeps the link checked.
    let t = t + Duration::from_secs(3);
    let events = check(&mut mp, t, |_| silent_since(t - Duration::from_secs(3), t)).unwrap();
    assert!(
        matches!(events[..], [PathEvent::Down { path: 1, .. }]),
        "{events:?}"
    );
    kernel.queued[1] = 0;
    mp.on_queue(0, 0, t);
    assert!(!mp.at_rest(t), "path 1 may come back: still checked");
}

#[test]
fn a_held_path_moves_its_chunks_at_once_and_stays_down_until_released() {
    let t0 = Instant::now();
    let mut mp = Multipath::new(4, 3, 3, t0);
    let mut kernel = Kernel::new(&[100e6, 100e6, 100e6]);
    let mut msg = 0;
    let (_, mut t) = drive(&mut mp, &mut kernel, t0, 50, &mut msg);
    assert!(kernel.queued[1] > 0);
    let tx: Vec<Option<TxChunk>> = (0..3).map(|_| None).collect();
    assert!(mp.hold(1, "uplink cut", false, t, &idle(&tx)));
    match mp.poll_event() {
        Some(PathEvent::Down {
            path: 1,
            why,
            chunks,
            others,
            ..
        }) => {
            assert_eq!(why, "uplink cut");
            assert!(chunks > 0);
            assert_eq!(others, vec![0, 2]);
        }
        e => panic!("{e:?}"),
    }
    assert!(mp.has_resend() && !mp.stream_up(1) && mp.held(1));
    // It delivers everything (the kernel rehashed it elsewhere): still held,
    // and nothing more goes on it.
    let (taken, t1) = drive(&mut mp, &mut kernel, t, 100, &mut msg);
    t = t1;
    assert_eq!(kernel.queued[1], 0);
    assert_eq!(check(&mut mp, t, |_| PeerAcks::default()).unwrap(), vec![]);
    assert_eq!(taken[1], 0, "{taken:?}");
    assert!(mp.held(1) && !mp.stream_up(1));
    // Released: it owes nothing, so it is back at once, and used again.
    mp.release(1, t);
    t += MS;
    let events = check(&mut mp, t, |_| PeerAcks::default()).unwrap();
    assert!(
        matches!(events[..], [PathEvent::Up { path: 1, .. }]),
        "{events:?}"
    );
    let (taken, _) = drive(&mut mp, &mut kernel, t, 50, &mut msg);
    assert!(taken[1] > 0, "{taken:?}");
}

/// A link of two paths with nothing in flight, and the time.
fn two_idle_paths() -> (Multipath, Vec<Option<TxChunk>>, Instant) {
    let t0 = Instant::now();
    (
        Multipath::new(4, 2, 2, t0),
        (0..2).map(|_| None).collect(),
        t0,
    )
}

/// The path changes reported since the last call: (up, path, quiet).
fn changes(mp: &mut Multipath) -> Vec<(bool, usize, bool)> {
    std::iter::from_fn(|| mp.poll_event())
        .map(|e| match e {
            PathEvent::Up { path, quiet, .. } => (true, path, quiet),
            PathEvent::Down { path, quiet, .. } => (false, path, quiet),
        })
        .collect()
}

#[test]
fn the_last_working_path_is_not_held() {
    let (mut mp, tx, t0) = two_idle_paths();
    assert!(mp.hold(0, "uplink cut", false, t0, &idle(&tx)));
    assert!(!mp.hold(1, "uplink cut", false, t0, &idle(&tx)));
    assert!(mp.stream_up(1) && !mp.held(1));
    // A held path is at rest: no check is due for it.
    assert!(mp.quiet());
}

#[test]
fn a_standby_path_released_is_up_at_once_so_its_sibling_can_be_held_quietly() {
    // The planner's layout: a link runs on path 0, path 1 stands by; then
    // they swap in one change (release 1, hold 0). Path 1 owes nothing, so
    // it works at once and path 0 can be held; neither move is a failure.
    let (mut mp, tx, t0) = two_idle_paths();
    assert!(mp.hold(1, "standby", true, t0, &idle(&tx)));
    assert_eq!(changes(&mut mp), [(false, 1, true)]);
    mp.release(1, t0);
    assert!(mp.stream_up(1) && !mp.held(1));
    assert!(mp.hold(0, "standby", true, t0, &idle(&tx)));
    assert!(!mp.stream_up(0) && mp.held(0) && mp.held_quietly(0));
    assert_eq!(changes(&mut mp), [(true, 1, true), (false, 0, true)]);
    // A hold for a cut is no layout move: it is said.
    mp.release(0, t0);
    assert!(mp.hold(1, "uplink cut", false, t0, &idle(&tx)));
    assert_eq!(changes(&mut mp), [(true, 0, true), (false, 1, false)]);
}

#[test]
fn a_held_path_stands_in_when_the_last_working_one_goes_down() {
    // A link runs on path 0 with path 1 standing by (held for the
    // planner's layout); path 0 stops answering before the planner's
    // event moves it: path 1 takes over, and the link lives.
    let (mut mp, tx, t0) = two_idle_paths();
    assert!(mp.hold(1, "standby", true, t0, &idle(&tx)));
    changes(&mut mp);
    mp.path_down(0, "no answer".into(), false, t0, &idle(&tx))
        .expect("the standby path stands in");
    assert!(mp.stream_up(1) && !mp.held(1) && !mp.stream_up(0));
    assert_eq!(changes(&mut mp), [(true, 1, false), (false, 0, false)]);
    // With nothing held to stand in, the last path going down is the
    // link's error, as before.
    assert!(mp
        .path_down(1, "no answer".into(), false, t0, &idle(&tx))
        .is_err());
}
