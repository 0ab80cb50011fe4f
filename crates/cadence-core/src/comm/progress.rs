//! The progress thread: asynchronous operations queue here and run one
//! after another, in the order they were issued, on one thread per
//! communicator (started by the first one); their callers hold a
//! [`Completion`] each.

use super::p2p::{is_p2p, ANY_SOURCE};
use super::shared_links::Ticket;
use super::{OpRequest, Shared};
use crate::error::{CommError, ErrorKind, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Completion of an asynchronous operation.
pub struct Completion {
    state: Mutex<Option<Result<()>>>,
    cv: Condvar,
    /// For a receive from any source: the sender, once matched.
    source: AtomicUsize,
    /// The communicator's count of threads blocked in `wait` (see
    /// `Engine::watchers`).
    watchers: Arc<AtomicUsize>,
}

/// Counts a thread as waiting on the progress thread while it lives.
struct Watching<'a>(&'a AtomicUsize);
impl<'a> Watching<'a> {
    fn new(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::Relaxed);
        Watching(n)
    }
}
impl Drop for Watching<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Completion {
    pub(super) fn new(watchers: Arc<AtomicUsize>) -> Completion {
        Completion {
            state: Mutex::new(None),
            cv: Condvar::new(),
            source: AtomicUsize::new(ANY_SOURCE),
            watchers,
        }
    }
    pub(super) fn set_source(&self, peer: usize) {
        self.source.store(peer, Ordering::Release);
    }
    /// For a receive from any source: the rank it received from, once known.
    pub fn source(&self) -> Option<usize> {
        Some(self.source.load(Ordering::Acquire)).filter(|&s| s != ANY_SOURCE)
    }
    pub(super) fn finish(&self, r: Result<()>) {
        *self.state.lock().unwrap() = Some(r);
        self.cv.notify_all();
    }
    pub fn is_done(&self) -> bool {
        self.state.lock().unwrap().is_some()
    }
    /// Waits up to `timeout` (forever if `None`); `None` if still running.
    pub fn wait(&self, timeout: Option<Duration>) -> Option<Result<()>> {
        let mut st = self.state.lock().unwrap();
        let deadline = timeout.map(|t| Instant::now() + t);
        let _watching = st.is_none().then(|| Watching::new(&self.watchers));
        while st.is_none() {
            match deadline {
                None => st = self.cv.wait(st).unwrap(),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    st = self.cv.wait_timeout(st, left).unwrap().0;
                }
            }
        }
        st.clone()
    }
}

/// One queued operation.
pub(super) struct Task {
    pub(super) req: OpRequest<'static>,
    pub(super) done: Arc<Completion>,
    /// When it was queued, on the recorder's clock.
    pub(super) enqueue_ns: u64,
    /// Its place in this rank's order of operations, when the
    /// communicator shares its links (`shared_links.rs`).
    pub(super) ticket: Option<Ticket>,
}

/// The progress thread (once started) and the sending end of its queue.
#[derive(Default)]
pub(super) struct ProgressThread {
    running: Mutex<Option<(mpsc::Sender<Task>, JoinHandle<()>)>>,
}

impl ProgressThread {
    /// Queues `req` behind every operation queued before it, starting the
    /// thread on first use.
    pub(super) fn submit(
        &self,
        shared: &Arc<Shared>,
        req: OpRequest<'static>,
    ) -> Result<Arc<Completion>> {
        let done = Arc::new(Completion::new(shared.watchers.clone()));
        let enqueue_ns = shared.recorder.lock().unwrap().now_ns();
        let mut running = self.running.lock().unwrap();
        if running.is_none() {
            let (tx, rx) = mpsc::channel::<Task>();
            let for_thread = shared.clone();
            let handle = std::thread::Builder::new()
                .name(format!("cadence-progress-{}", shared.rank))
                .spawn(move || serve(&for_thread, &rx))
                .map_err(|e| CommError::setup(format!("cannot start progress thread: {e}")))?;
            *running = Some((tx, handle));
        }
        shared.pending.fetch_add(1, Ordering::AcqRel);
        let task = Task {
            req,
            done: done.clone(),
            enqueue_ns,
            ticket: shared.ticket(),
        };
        if running.as_ref().unwrap().0.send(task).is_err() {
            shared.pending.fetch_sub(1, Ordering::AcqRel);
            return Err(CommError::new(ErrorKind::Failed {
                detail: "progress thread is gone".into(),
                culprit: None,
            }));
        }
        Ok(done)
    }

    /// Stops the thread once the operations queued so far have finished.
    pub(super) fn stop(&self) {
        if let Some((tx, handle)) = self.running.lock().unwrap().take() {
            drop(tx);
            let _ = handle.join();
        }
    }
}

/// The thread's loop, until the queue closes. A send or receive starts a
/// point-to-point batch, which takes in the sends and receives queued
/// behind it and hands back the first other operation it met.
fn serve(shared: &Shared, rx: &mpsc::Receiver<Task>) {
    let mut next: Option<Task> = None;
    while let Some(task) = next.take().or_else(|| rx.recv().ok()) {
        if is_p2p(&task.req) {
            next = shared.execute_p2p_batch(task, rx);
        } else {
            let r = shared.execute(task.req, Some(task.enqueue_ns), None, task.ticket);
            shared.pending.fetch_sub(1, Ordering::AcqRel);
            task.done.finish(r);
        }
    }
}
