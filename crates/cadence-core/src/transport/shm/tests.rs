//! The link's tests: two inboxes in a private directory, linked in one
//! process (which can read its own memory, so single copy works too).

use super::help::{help_chunk, HELP_MIN};
use super::layout::{CTL_HELP_DST, OFF_NFRAMES};
use super::single_copy::CMA_CHUNK;
use super::*;
use crate::transport::{OpMeta, Sink, SinkMode, Source};
use crate::types::{CollKind, DType, ElemOp};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[test]
fn a_peer_reads_the_progress_its_owner_publishes() {
    let dir = std::env::temp_dir().join(format!("cadence-progress-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // `a` is rank 0's link to rank 1, whose inbox is `ib`.
    let (a, _b, _ia, ib) = pair(&dir, 2, 0, 1);
    assert_eq!(
        a.peer_progress(),
        Progress {
            seq: 0,
            running: false,
            phase: 0
        }
    );
    let p = Progress {
        seq: 9,
        running: true,
        phase: 4,
    };
    ib.publish_progress(p);
    assert_eq!(a.peer_progress(), p);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Two inboxes of `nrings` rings in a private directory, linked as local
/// ranks `a` and `b`: (a's link to b, b's link to a).
fn pair(dir: &Path, nrings: usize, a: usize, b: usize) -> (ShmLink, ShmLink, Inbox, Inbox) {
    pair_with(dir, nrings, a, b, 0)
}

fn pair_with(
    dir: &Path,
    nrings: usize,
    a: usize,
    b: usize,
    cma_min: usize,
) -> (ShmLink, ShmLink, Inbox, Inbox) {
    let cfg = ShmConfig {
        frame_bytes: 4096,
        nframes: 4,
        ring_bytes: 16 * 1024,
        cma_min,
        stream: Streamed::NONE,
    };
    pair_of(dir, nrings, a, b, cfg)
}

fn pair_of(
    dir: &Path,
    nrings: usize,
    a: usize,
    b: usize,
    cfg: ShmConfig,
) -> (ShmLink, ShmLink, Inbox, Inbox) {
    let ia = Inbox::create(&dir.join("a"), nrings, cfg).unwrap();
    let ib = Inbox::create(&dir.join("b"), nrings, cfg).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let (rb, pid_b) = open_peer_inbox(&dir.join("b"), deadline).unwrap();
    let (ra, pid_a) = open_peer_inbox(&dir.join("a"), deadline).unwrap();
    let la = ShmLink::new(b, &ia, rb, pid_b, a, b);
    let lb = ShmLink::new(a, &ib, ra, pid_a, b, a);
    (la, lb, ia, ib)
}

fn meta(count: u64) -> OpMeta {
    OpMeta {
        coll: CollKind::AllGather,
        dtype: DType::U8,
        redop: 0,
        root: 0,
        seq: 7,
        sig: 42,
        count,
        comm: 1,
    }
}

/// Local ranks past the old one-page stall table (37 slots) post and read
/// stall notices, and their rings start past the grown header: a message
/// from local rank 63 to local rank 1 arrives intact.
#[test]
fn many_local_ranks_post_stalls_and_move_data() {
    let dir = std::env::temp_dir().join(format!("cadence-shm-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (mut la, mut lb, _ia, _ib) = pair(&dir, 64, 63, 1);
    let notice = StallNotice {
        seq: 99,
        comm: 0,
        chain: vec![63, 1, 5],
    };
    la.post_stall(&notice);
    let got = lb
        .read_stall()
        .expect("the notice of local rank 63 arrives");
    assert_eq!((got.seq, got.chain), (99, vec![63, 1, 5]));
    assert!(la.read_stall().is_none());

    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut out = vec![0u8; data.len()];
    transfer(&mut la, &mut lb, &data, &mut out, SinkMode::Copy);
    assert_eq!(out, data);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Moves `data` from `la` to `lb` into a sink of `mode` over `out`.
fn transfer(la: &mut ShmLink, lb: &mut ShmLink, data: &[u8], out: &mut [u8], mode: SinkMode) {
    // SAFETY: `data` and `out` outlive the jobs and nothing else touches them.
    let src = unsafe { Source::new(data.as_ptr(), data.len()) };
    // SAFETY: as for `src`: `out` outlives the job, nobody else touches it.
    let sink = unsafe { Sink::new(out.as_mut_ptr(), out.len(), mode, DType::U8, ElemOp::Sum) };
    let mut send = SendJob::new(meta(data.len() as u64), src);
    let mut recv = RecvJob::new(meta(data.len() as u64), sink);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !(send.done && recv.done) {
        la.send_progress(&mut send).unwrap();
        lb.recv_progress(&mut recv).unwrap();
        assert!(Instant::now() < deadline, "transfer did not finish");
    }
}

/// One wake-up per sleep: the first publish that finds the receiver
/// asleep rings (and lowers its flag), the ones after it until the
/// receiver runs again do not (each used to be a futex system call), and
/// the receiver's sleep then returns at once, not by its timeout.
#[test]
fn a_sleeping_receiver_is_woken_once_per_sleep() {
    let (dir, mut la, mut lb, _ia, ib) = pair_in("bell", 4096, 8, 16 * 1024);
    let rung = |l: &ShmLink| l.stats.doorbells_rung.get();
    let mut out = [0u8; 8];
    transfer(&mut la, &mut lb, b"awake", &mut out[..5], SinkMode::Copy);
    assert_eq!(rung(&la), 0, "the receiver was awake");
    for round in 1..=2 {
        let seen = ib.prepare_sleep();
        for _ in 0..3 {
            // Sends only: the receiver has not run since it went to sleep.
            // SAFETY: the static bytes outlive the job.
            let src = unsafe { Source::new(b"ping".as_ptr(), 4) };
            let mut send = SendJob::new(meta(4), src);
            while !send.done {
                la.send_progress(&mut send).unwrap();
            }
        }
        assert_eq!(rung(&la), round, "one wake-up for three publishes");
        let t = Instant::now();
        assert!(
            !ib.sleep(seen, Duration::from_secs(5)),
            "the doorbell moved"
        );
        assert!(t.elapsed() < Duration::from_secs(1));
        for _ in 0..3 {
            // SAFETY: `out` outlives the job and nothing else touches it.
            let sink =
                unsafe { Sink::new(out.as_mut_ptr(), 4, SinkMode::Copy, DType::U8, ElemOp::Sum) };
            let mut recv = RecvJob::new(meta(4), sink);
            while !recv.done {
                lb.recv_progress(&mut recv).unwrap();
            }
            assert_eq!(&out[..4], b"ping");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Messages `0..n` of the lengths `sizes` (in turn), each a pattern of
/// its own, and a send job for each.
fn messages(n: usize, sizes: &[usize]) -> (Vec<Vec<u8>>, Vec<SendJob>) {
    let msgs: Vec<Vec<u8>> = (0..n)
        .map(|k| {
            let len = sizes[k % sizes.len()];
            (0..len).map(|i| ((i * 31 + k * 7) % 251) as u8).collect()
        })
        .collect();
    let sends = msgs
        .iter()
        // SAFETY: the vectors' buffers outlive the jobs (the callers keep
        // `msgs` to the end) and nothing writes them.
        .map(|m| {
            SendJob::new(meta(m.len() as u64), unsafe {
                Source::new(m.as_ptr(), m.len())
            })
        })
        .collect();
    (msgs, sends)
}

/// A pair linked through rings of this geometry (no single copy), in a
/// private directory named after `tag`.
fn pair_in(
    tag: &str,
    frame_bytes: usize,
    nframes: usize,
    ring_bytes: usize,
) -> (PathBuf, ShmLink, ShmLink, Inbox, Inbox) {
    let dir = std::env::temp_dir().join(format!("cadence-shm-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = ShmConfig {
        frame_bytes,
        nframes,
        ring_bytes,
        cma_min: 0,
        stream: Streamed::NONE,
    };
    let (la, lb, ia, ib) = pair_of(&dir, 2, 0, 1, cfg);
    (dir, la, lb, ia, ib)
}

/// [`pair_with`] in a directory of its own (`tag`): a pair whose
/// messages from `cma_min` bytes go by single copy.
fn cma_pair_in(tag: &str, cma_min: usize) -> (PathBuf, ShmLink, ShmLink, Inbox, Inbox) {
    let dir = std::env::temp_dir().join(format!("cadence-cma-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (la, lb, ia, ib) = pair_with(&dir, 2, 0, 1, cma_min);
    (dir, la, lb, ia, ib)
}

/// A receive job that copies into `out`.
fn copy_into(out: &mut [u8]) -> RecvJob {
    // SAFETY: the callers keep `out` to the job's end and touch it only
    // after the job is done.
    let sink = unsafe {
        Sink::new(
            out.as_mut_ptr(),
            out.len(),
            SinkMode::Copy,
            DType::U8,
            ElemOp::Sum,
        )
    };
    RecvJob::new(meta(out.len() as u64), sink)
}

/// Small messages take a header slot and a line or two, not a whole
/// frame's room: a sender runs as many of them ahead of its receiver as
/// there are header slots (a broadcast's root is not held up by a late
/// receiver), then waits; the receiver gets every one intact, in order.
/// A ring's pages are allocated and mapped on its first use, on each
/// side: after the first message, the rest of the first pass over the
/// ring (here 600 KiB of 2 KiB messages through its 512 KiB) takes no page
/// fault on either side (it took one per page on each: about 260 in this
/// test without).
#[test]
fn a_new_ring_takes_no_page_faults() {
    fn minor_faults() -> i64 {
        let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: getrusage fills the struct it is given; RUSAGE_THREAD
        // counts this thread's faults only (other tests run beside it).
        let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, u.as_mut_ptr()) };
        assert_eq!(rc, 0);
        // SAFETY: initialised by the successful call above.
        unsafe { u.assume_init() }.ru_minflt
    }
    // In /dev/shm, as the communicator's inboxes are: on a disk file
    // system a populated shared mapping still faults on its first write.
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_owned()
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("cadence-faults-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (mut la, mut lb, _ia, _ib) = pair_of(&dir, 2, 0, 1, ShmConfig::default());
    let data: Vec<u8> = (0..2048u32).map(|i| (i % 251) as u8).collect();
    let mut out = vec![0u8; data.len()];
    transfer(&mut la, &mut lb, &data, &mut out, SinkMode::Copy);
    let before = minor_faults();
    for _ in 1..300 {
        transfer(&mut la, &mut lb, &data, &mut out, SinkMode::Copy);
    }
    let faults = minor_faults() - before;
    assert_eq!(out, data);
    assert!(
        faults < 16,
        "{faults} page faults on a new ring's first pass"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Shared memory grows with the pairs that talk: a new inbox holds its
/// header only, whatever its number of rings, and a ring gets its pages
/// when a message first crosses it (in the receiver's inbox only): its
/// header slots for a small message, the whole ring for a larger one.
#[test]
fn a_ring_takes_shared_memory_only_once_used() {
    use std::os::unix::fs::MetadataExt;
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() || !super::sys::populate_supported() {
        eprintln!("skipped: needs /dev/shm and MADV_POPULATE_WRITE (Linux 5.14)");
        return;
    }
    let dir = shm.join(format!("cadence-first-use-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = ShmConfig {
        cma_min: 0,
        ..ShmConfig::default()
    };
    let (mut la, mut lb, _ia, _ib) = pair_of(&dir, 64, 0, 1, cfg);
    let held = |name: &str| std::fs::metadata(dir.join(name)).unwrap().blocks() * 512;
    let header = super::layout::header_size(64) as u64;
    let ring = super::layout::ring_size(&cfg) as u64;
    assert!(
        held("a") <= header && held("b") <= header,
        "a new inbox holds its header only"
    );
    // A message that fits a header slot maps the ring's slots only.
    let mut small = [0u8; 8];
    transfer(&mut la, &mut lb, b"barrier!", &mut small, SinkMode::Copy);
    let slots = (super::layout::RING_CTL + cfg.nframes * super::layout::SLOT_HDR) as u64;
    assert!(
        held("b") <= header + slots.next_multiple_of(4096),
        "b holds its header and one ring's slots: {} bytes",
        held("b")
    );
    let data = vec![7u8; 3000];
    let mut out = vec![0u8; data.len()];
    transfer(&mut la, &mut lb, &data, &mut out, SinkMode::Copy);
    assert_eq!(out, data);
    assert!(held("a") <= header, "nothing was sent to a");
    assert!(
        held("b") >= header + ring - 4096 && held("b") <= header + ring + 4096,
        "b holds its header and one ring: {} bytes",
        held("b")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A ring that does not fit the file system fails the message that
/// needs it, with what to do about it (it used to fail later, as a
/// SIGBUS on the first write past the room); where rings cannot get their
/// pages on first use, the inbox is refused when it is made. Needs root
/// to mount a small tmpfs; skipped (with a line saying so) elsewhere.
#[test]
fn shared_memory_that_does_not_fit_its_file_system_is_an_error() {
    let dir = std::env::temp_dir().join(format!("cadence-small-shm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&dir)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: mounting a 1 MiB tmpfs needs root");
        let _ = std::fs::remove_dir(&dir);
        return;
    }
    let err = if super::sys::populate_supported() {
        // Two rings of 584 KiB in 1 MiB: the first fits, the second not.
        let cfg = ShmConfig {
            cma_min: 0,
            ..ShmConfig::default()
        };
        let (mut la, mut lb, _ia, _ib) = pair_of(&dir, 4, 0, 1, cfg);
        let mut out = [0u8; 3000];
        transfer(&mut la, &mut lb, &[2; 3000], &mut out, SinkMode::Copy);
        static BACK: [u8; 3000] = [1; 3000];
        // SAFETY: a static outlives the job; nothing writes it.
        let src = unsafe { Source::new(BACK.as_ptr(), BACK.len()) };
        let mut send = SendJob::new(meta(3000), src);
        let err = lb
            .send_progress(&mut send)
            .expect_err("no room for a second ring");
        err.to_string()
    } else {
        Inbox::create(&dir.join("inbox"), 4, ShmConfig::default())
            .err()
            .expect("a 2 MiB inbox in a 1 MiB file system is refused")
    };
    let _ = std::process::Command::new("umount").arg(&dir).status();
    let _ = std::fs::remove_dir(&dir);
    assert!(err.contains("CADENCE_SHM_RING_BYTES"), "{err}");
}

#[test]
fn a_sender_runs_small_messages_ahead_of_its_receiver() {
    let (dir, mut la, mut lb, _ia, _ib) = pair_in("ahead", 64 * 1024, 64, 512 * 1024);
    let (msgs, mut sends) = messages(65, &[0, 8, 9, 64, 100, 1000, 4096]);
    for (k, job) in sends.iter_mut().enumerate().take(64) {
        la.send_progress(job).unwrap();
        assert!(job.done, "message {k} waited for the receiver");
    }
    assert!(!la.send_progress(&mut sends[64]).unwrap() && !la.tx_ready());
    for (k, m) in msgs.iter().enumerate().take(64) {
        let mut out = vec![0u8; m.len()];
        let mut recv = copy_into(&mut out);
        lb.recv_progress(&mut recv).unwrap();
        assert!(recv.done && out == *m, "message {k}");
    }
    assert!(la.tx_ready());
    assert!(la.send_progress(&mut sends[64]).unwrap() && sends[64].done);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Through a ring smaller than a few frames, messages of every awkward
/// length: frames shortened to the room there is, frames that run past
/// the end of the payload space into the spill room, inline ones in
/// between; the sender fills what it can before the receiver drains.
#[test]
fn frames_fit_the_room_and_run_past_the_end_whole() {
    let (dir, mut la, mut lb, _ia, _ib) = pair_in("wrap", 16 * 1024, 8, 32 * 1024);
    let cfg = la.tx.cfg;
    let sizes = [16384, 10_000, 3, 40_000, 4160, 0, 17, 20_480, 65, 6000];
    let (msgs, mut sends) = messages(40, &sizes);
    let mut outs: Vec<Vec<u8>> = msgs.iter().map(|m| vec![0u8; m.len()]).collect();
    let mut recvs: Vec<RecvJob> = outs.iter_mut().map(|o| copy_into(o)).collect();
    let (mut s, mut r) = (0, 0);
    let mut partial = false;
    let deadline = Instant::now() + Duration::from_secs(5);
    while r < msgs.len() {
        while s < msgs.len() {
            let before = sends[s].sent;
            la.send_progress(&mut sends[s]).unwrap();
            let last = (sends[s].sent - before) % cfg.frame_bytes;
            partial |= !sends[s].done && last != 0;
            if !sends[s].done {
                break;
            }
            s += 1;
        }
        while r < s || (r == s && r < msgs.len() && recvs[r].got < sends[r].sent) {
            lb.recv_progress(&mut recvs[r]).unwrap();
            if !recvs[r].done {
                break;
            }
            r += 1;
        }
        assert!(Instant::now() < deadline, "stuck at send {s}, receive {r}");
    }
    assert!(partial, "no frame was shortened to the room left");
    assert!(la.tx.pos > 4 * cfg.ring_bytes as u64, "the ring went round");
    assert_eq!(la.tx.pos, lb.rx.pos);
    for (k, (o, m)) in outs.iter().zip(&msgs).enumerate() {
        assert!(o == m, "message {k} ({} bytes) arrived changed", m.len());
    }
    drop(recvs);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An inbox whose header names a geometry the ring arithmetic cannot
/// use (here: frames in flight not a power of two) is refused with the
/// file's name, by its owner and by a peer that opens it.
#[test]
fn a_bad_ring_geometry_is_refused() {
    let dir = std::env::temp_dir().join(format!("cadence-shm-geom-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = ShmConfig {
        nframes: 3,
        ..Default::default()
    };
    assert!(Inbox::create(&dir.join("x"), 2, cfg).is_err());
    let ok = Inbox::create(&dir.join("a"), 2, ShmConfig::default()).unwrap();
    ok.region
        .atomic_u32(OFF_NFRAMES)
        .store(3, Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(5);
    let e = open_peer_inbox(&dir.join("a"), deadline).err().unwrap();
    assert!(
        e.contains("ring geometry") && e.contains("nframes: 3"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A frame the receiver's ring could not hold (longer than its largest
/// frame) is refused as garbage before anything is read; one longer
/// than the rest of the message is a mismatch.
#[test]
fn frame_lengths_are_checked() {
    let dir = std::env::temp_dir().join(format!("cadence-shm-len-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (mut la, mut lb, _ia, _ib) = pair(&dir, 2, 0, 1);
    let mut out = vec![0u8; 100_000];
    // SAFETY: `out` outlives the jobs and nothing else touches it.
    let sink = |out: &mut Vec<u8>, len: usize| unsafe {
        Sink::new(
            out.as_mut_ptr(),
            len,
            SinkMode::Copy,
            DType::U8,
            ElemOp::Sum,
        )
    };
    la.publish(&meta(100_000).header(50_000), &[0u8; 8]);
    let mut recv = RecvJob::new(meta(100_000), sink(&mut out, 100_000));
    let e = lb.recv_progress(&mut recv).unwrap_err();
    assert!(
        matches!(&e, ErrorKind::Garbage { detail, .. } if detail.contains("50000-byte")),
        "{e}"
    );
    let (mut la, mut lb, _ia, _ib) = {
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        pair(&dir, 2, 0, 1)
    };
    let (data, _) = messages(1, &[3000]);
    let data = &data[0];
    // SAFETY: `data` outlives the job.
    let mut send = SendJob::new(meta(3000), unsafe { Source::new(data.as_ptr(), 3000) });
    la.send_progress(&mut send).unwrap();
    let mut recv = RecvJob::new(meta(3000), sink(&mut out, 2000));
    let e = lb.recv_progress(&mut recv).unwrap_err();
    assert!(
        matches!(&e, ErrorKind::Mismatch { theirs, .. } if theirs.contains("3000-byte frame where 1 to 2000")),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// From the threshold on, a message crosses as one rendezvous slot and a
/// read of the sender's memory, whole (copy) or reduced on the way;
/// below it, through the ring. The sender's job ends only once the
/// receiver has read everything.
#[test]
fn large_messages_go_by_single_copy() {
    let (dir, mut la, mut lb, _ia, _ib) = cma_pair_in("test", 64 * 1024);
    assert!(
        la.single_copy() && lb.single_copy(),
        "this process can read itself"
    );
    let data: Vec<u8> = (0..600_000u32).map(|i| (i * 13 % 101) as u8).collect();
    // A destination at the source's offset within a line, or 48 bytes
    // past it, is read into straight; one 16 bytes past it through a
    // lined-up scratch chunk (the kernel's copy is slow there; `crate::copy`).
    let mut room = vec![0u8; data.len() + 128];
    let lined_up = (data.as_ptr() as usize).wrapping_sub(room.as_ptr() as usize) % 64;
    for (shift, via_scratch) in [(0, false), (48, false), (16, true)] {
        room.fill(0);
        let at = lined_up + shift;
        transfer(
            &mut la,
            &mut lb,
            &data,
            &mut room[at..at + data.len()],
            SinkMode::Copy,
        );
        assert!(room[at..at + data.len()] == data[..], "shift {shift}");
        assert_eq!(!lb.cma_scratch.is_empty(), via_scratch, "shift {shift}");
    }
    assert_eq!(
        la.tx.mine, 3,
        "one rendezvous slot a message, not {} data slots",
        la.tx.mine
    );
    // A reducing receive: out = out + data, chunk by chunk.
    let mut acc: Vec<u8> = (0..data.len()).map(|i| (i % 7) as u8).collect();
    let want: Vec<u8> = acc
        .iter()
        .zip(&data)
        .map(|(a, d)| a.wrapping_add(*d))
        .collect();
    transfer(&mut la, &mut lb, &data, &mut acc, SinkMode::ReduceInPlace);
    assert_eq!(acc, want);
    assert_eq!(la.tx.mine, 4);
    // Below the threshold: the ring (4 KiB frames).
    let small = &data[..10_000];
    let mut out = vec![0u8; small.len()];
    transfer(&mut la, &mut lb, small, &mut out, SinkMode::Copy);
    assert_eq!(out, small);
    assert_eq!(la.tx.mine, 4 + 3);
    // Any-source matching sees the message the rendezvous stands for.
    // SAFETY: as above.
    let src = unsafe { Source::new(data.as_ptr(), data.len()) };
    let mut send = SendJob::new(meta(data.len() as u64), src);
    assert!(la.send_progress(&mut send).unwrap());
    let h = lb.peek_header().unwrap();
    assert_eq!((h.frame, h.len), (FRAME_DATA, data.len() as u64));
    assert!(
        !la.send_progress(&mut send).unwrap() && !send.done,
        "done before the read"
    );
    let mut out = vec![0u8; data.len()];
    let mut recv = copy_into(&mut out);
    while !recv.done {
        lb.recv_progress(&mut recv).unwrap();
    }
    assert!(la.tx_ready());
    assert!(la.send_progress(&mut send).unwrap() && send.done);
    assert_eq!(out, data);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A message its call would rather stream (broadcast, reduce: see
/// `engine::prefers_stream`) stays in the ring above the single-copy
/// threshold when its collective is in `ShmConfig::stream`, reduced on
/// arrival; otherwise, and for a message that does not prefer it, single
/// copy.
#[test]
fn messages_that_prefer_streaming_stay_in_the_ring_when_asked() {
    let dir = std::env::temp_dir().join(format!("cadence-stream-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let cases = [
        (Streamed::DEFAULT, CollKind::Reduce, true, true),
        (Streamed::DEFAULT, CollKind::Reduce, false, false),
        (Streamed::DEFAULT, CollKind::Broadcast, true, false),
        (Streamed::NONE, CollKind::Reduce, true, false),
        (
            Streamed {
                reduce: false,
                broadcast: true,
            },
            CollKind::Broadcast,
            true,
            true,
        ),
    ];
    for (k, (stream, coll, prefer, ring)) in cases.into_iter().enumerate() {
        let cfg = ShmConfig {
            frame_bytes: 4096,
            nframes: 4,
            ring_bytes: 16 * 1024,
            cma_min: 64 * 1024,
            stream,
        };
        let sub = dir.join(format!("case{k}"));
        std::fs::create_dir_all(&sub).unwrap();
        let (mut la, mut lb, _ia, _ib) = pair_of(&sub, 2, 0, 1, cfg);
        let mut acc: Vec<u8> = (0..data.len()).map(|i| (i % 5) as u8).collect();
        let want: Vec<u8> = acc
            .iter()
            .zip(&data)
            .map(|(a, d)| a.wrapping_add(*d))
            .collect();
        let mut m = meta(data.len() as u64);
        m.coll = coll;
        // SAFETY: `data` and `acc` outlive the jobs; nothing else touches them.
        let src = unsafe { Source::new(data.as_ptr(), data.len()) };
        // SAFETY: as for `src`.
        let sink = unsafe {
            Sink::new(
                acc.as_mut_ptr(),
                acc.len(),
                SinkMode::ReduceInPlace,
                DType::U8,
                ElemOp::Sum,
            )
        };
        let mut send = SendJob::new(m, src);
        send.prefer_stream = prefer;
        let mut recv = RecvJob::new(m, sink);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !(send.done && recv.done) {
            la.send_progress(&mut send).unwrap();
            lb.recv_progress(&mut recv).unwrap();
            assert!(Instant::now() < deadline, "transfer did not finish");
        }
        assert_eq!(acc, want, "case {k}");
        let (frames, single) = (la.tx.mine, la.stats.single_copy_sent.get());
        let want_frames = if ring { (74, 0) } else { (1, 1) };
        assert_eq!(
            (frames, single),
            want_frames,
            "case {k}: 4 KiB frames or one rendezvous"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A read straight into the destination takes the message in one call
/// below `HELP_MIN`; from there in `help_chunk`s that the receiver reads
/// or the sender writes, whichever claims each first (when the sender
/// does not help, the receiver reads them all). A read through the
/// scratch (a reducing receive) takes `CMA_CHUNK` a call. Every byte
/// arrives, the last chunk partial.
#[test]
fn single_copy_reads_in_chunks_that_the_sender_may_share() {
    let (dir, mut la, mut lb, _ia, _ib) = cma_pair_in("chunks", 64 * 1024);
    let big = 9 * (1 << 20) + 100_003;
    let data: Vec<u8> = (0..big as u32).map(|i| (i * 29 % 251) as u8).collect();
    // One message of `len` bytes; the sender polls (and helps) after
    // every `sender_every`-th receiver poll (0: never). Returns the
    // receiver's polls that moved it on.
    let run = |la: &mut ShmLink, lb: &mut ShmLink, out: &mut [u8], mode, sender_every: usize| {
        let len = out.len();
        // SAFETY: `data` and `out` outlive the jobs; nothing else touches them.
        let src = unsafe { Source::new(data.as_ptr(), len) };
        // SAFETY: as for `src`.
        let sink = unsafe { Sink::new(out.as_mut_ptr(), len, mode, DType::U8, ElemOp::Sum) };
        let mut send = SendJob::new(meta(len as u64), src);
        let mut recv = RecvJob::new(meta(len as u64), sink);
        assert!(la.send_progress(&mut send).unwrap());
        let (mut reads, mut polls) = (0, 0);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !recv.done {
            reads += usize::from(lb.recv_progress(&mut recv).unwrap());
            polls += 1;
            if sender_every > 0 && polls % sender_every == 0 {
                la.send_progress(&mut send).unwrap();
            }
            assert!(Instant::now() < deadline, "the message did not arrive");
        }
        while !send.done {
            la.send_progress(&mut send).unwrap();
        }
        reads
    };
    let mut room = vec![0u8; big + 64];
    let at = (data.as_ptr() as usize).wrapping_sub(room.as_ptr() as usize) % 64;
    // Below HELP_MIN: one read (it took 8 of 256 KiB).
    let len = HELP_MIN - 1;
    assert_eq!(
        run(&mut la, &mut lb, &mut room[at..at + len], SinkMode::Copy, 0),
        1
    );
    assert!(room[at..at + len] == data[..len]);
    assert!(lb.cma_scratch.is_empty(), "no scratch for straight reads");
    // From HELP_MIN, a sender that does not poll: the receiver reads
    // every chunk itself (and a last poll finds them all in).
    let chunks = big.div_ceil(help_chunk(big));
    assert!(chunks >= 8 && help_chunk(big) >= 1 << 20, "{chunks}");
    room.fill(0);
    assert_eq!(
        run(&mut la, &mut lb, &mut room[at..at + big], SinkMode::Copy, 0),
        chunks + 1
    );
    assert!(room[at..at + big] == data[..]);
    assert_eq!(la.stats.single_copy_helped.get(), 0);
    assert!(la.help_tx_ok && lb.help_rx.is_none());
    // A sender that polls as often as the receiver takes chunks too.
    room.fill(0);
    let reads = run(&mut la, &mut lb, &mut room[at..at + big], SinkMode::Copy, 1);
    assert!(room[at..at + big] == data[..]);
    let helped = la.stats.single_copy_helped.get() as usize;
    assert!(
        helped > 0 && helped < big,
        "the sender wrote {helped} of {big} bytes"
    );
    assert!(
        reads <= chunks,
        "the receiver read {} of {chunks} chunks",
        reads - 1
    );
    assert_eq!(lb.stats.bytes_recv.get() as usize, HELP_MIN - 1 + 2 * big);
    // Reducing: through the scratch, CMA_CHUNK a call, never helped.
    let mut acc = vec![1u8; big];
    let reads = run(&mut la, &mut lb, &mut acc, SinkMode::ReduceInPlace, 1);
    assert_eq!(reads, big.div_ceil(CMA_CHUNK));
    assert!(acc.iter().zip(&data).all(|(a, d)| *a == d.wrapping_add(1)));
    assert_eq!(la.stats.single_copy_helped.get() as usize, helped);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A chunk the sender fails to write (here: the offered address made
/// invalid after the offer) is read by the receiver, and the sender
/// stops helping; a revoked offer lets the sender claim nothing more.
#[test]
fn a_failed_or_revoked_help_leaves_the_receiver_to_read() {
    let (dir, mut la, mut lb, _ia, _ib) = cma_pair_in("help", 64 * 1024);
    let len = 6 << 20;
    let data: Vec<u8> = (0..len as u32).map(|i| (i * 7 % 253) as u8).collect();
    // Lined up with `data` within a line: a destination shifted from the
    // source is never offered.
    let mut room = vec![0u8; len + 64];
    let at = (data.as_ptr() as usize).wrapping_sub(room.as_ptr() as usize) % 64;
    let out = &mut room[at..at + len];
    let start = |la: &mut ShmLink, lb: &mut ShmLink, out: &mut [u8]| {
        // SAFETY: `data` and `out` outlive the jobs; nothing else touches them.
        let src = unsafe { Source::new(data.as_ptr(), len) };
        let mut send = SendJob::new(meta(len as u64), src);
        let mut recv = copy_into(out);
        assert!(la.send_progress(&mut send).unwrap());
        // The offer, and the receiver's first chunk.
        assert!(lb.recv_progress(&mut recv).unwrap() && lb.help_rx.is_some());
        (send, recv)
    };
    let (mut send, mut recv) = start(&mut la, &mut lb, out);
    lb.rx.ctl_u64(CTL_HELP_DST).store(64, Ordering::Relaxed);
    assert!(la.send_progress(&mut send).unwrap(), "claimed a chunk");
    assert!(!la.help_tx_ok && la.stats.single_copy_helped.get() == 0);
    while !recv.done {
        lb.recv_progress(&mut recv).unwrap();
    }
    assert!(la.send_progress(&mut send).unwrap() && send.done);
    assert!(
        *out == data[..],
        "the failed chunk was read by the receiver"
    );
    // Revoked: the sender (helping again) finds nothing to claim.
    la.help_tx_ok = true;
    out.fill(0);
    let (mut send, recv) = start(&mut la, &mut lb, out);
    lb.revoke_help();
    assert!(lb.help_rx.is_none());
    assert!(!la.send_progress(&mut send).unwrap());
    assert_eq!(la.stats.single_copy_helped.get(), 0);
    drop(recv);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A receiver that expects another length gets a mismatch error naming
/// both calls, as for a data frame.
#[test]
fn single_copy_checks_the_length() {
    let (dir, mut la, mut lb, _ia, _ib) = cma_pair_in("len", 4096);
    let data = vec![1u8; 100_000];
    let mut out = vec![0u8; 50_000];
    // SAFETY: both outlive the jobs.
    let src = unsafe { Source::new(data.as_ptr(), data.len()) };
    // SAFETY: `out` outlives the job and nothing else touches it.
    let sink = unsafe {
        Sink::new(
            out.as_mut_ptr(),
            out.len(),
            SinkMode::Copy,
            DType::U8,
            ElemOp::Sum,
        )
    };
    let mut send = SendJob::new(meta(data.len() as u64), src);
    let mut recv = RecvJob::new(meta(data.len() as u64), sink);
    la.send_progress(&mut send).unwrap();
    let e = lb.recv_progress(&mut recv).unwrap_err();
    assert!(matches!(e, ErrorKind::Mismatch { .. }), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
