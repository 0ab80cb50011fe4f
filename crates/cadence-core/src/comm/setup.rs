//! Setting up a communicator once its links exist (`bootstrap.rs` makes
//! them): its state, then the collective start-up steps every rank takes
//! together before the communicator is handed out (clock offset,
//! calibration), and what `CADENCE_DEBUG=INFO` announces about them.

use super::p2p::P2pSeqs;
use super::progress::ProgressThread;
use super::{calibrate, clock, order, ClockOffset, Comm, Inner, PeerTable, Shared};
use crate::choice;
use crate::config::{Config, DebugLevel};
use crate::engine::{Cancel, Engine};
use crate::error::{ErrorKind, Result};
use crate::monitor::Recorder;
use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

impl Comm {
    pub(super) fn from_parts(
        id: String,
        job: String,
        rank: usize,
        peers: Arc<PeerTable>,
        mut engine: Engine,
        cfg: Config,
    ) -> Comm {
        let nranks = peers.len();
        let cancel: Arc<Cancel> = Arc::default();
        engine.cancel = cancel.clone();
        engine.comm_tag = crate::transport::comm_tag(&id);
        engine.stamp_messages = cfg.record_messages > 0;
        let recorder = Recorder::new(cfg.flight_recorder, cfg.record_messages);
        let links = engine.link_counters();
        let auto = {
            let (topo, order, fabric) =
                order::choose(peers.topology(), &|r| peers.host(r), &cfg.topo);
            let tuned = cfg.tuning.as_ref().and_then(|t| t.file.for_topology(&topo));
            let model = tuned.as_ref().and_then(|t| t.model);
            choice::Auto {
                topo,
                order,
                fabric: fabric.map(Arc::new),
                tuned,
                model,
                measured_at_start: false,
            }
        };
        Comm {
            shared: Arc::new(Shared {
                id,
                job,
                rank,
                nranks,
                peers,
                profile: None,
                clock: ClockOffset::SAME_HOST,
                inner: Mutex::new(Inner {
                    engine,
                    coll_seq: 0,
                    op_seq: 0,
                    p2p: P2pSeqs::default(),
                    failed: None,
                    schedules: HashMap::new(),
                    last_schedule: None,
                }),
                recorder: Mutex::new(recorder),
                links,
                pending: AtomicUsize::new(0),
                watchers: Arc::new(AtomicUsize::new(0)),
                cancel,
                auto,
                chosen: Mutex::new(HashMap::new()),
                choices: choice::ChoiceLog::default(),
                share: std::sync::OnceLock::new(),
                cfg,
            }),
            worker: ProgressThread::default(),
        }
    }

    /// Start-up calibration (see `calibrate.rs`), collective: on a job across
    /// hosts whose tuning table gives no cost model, rank 0 measures one and
    /// every rank chooses by it. Before the communicator is shared with
    /// any thread.
    pub(super) fn calibrate(&mut self) -> Result<()> {
        if self.shared.auto.topo.nhosts() < 2 {
            return Ok(());
        }
        let wanted = self.shared.cfg.calibrate && self.shared.auto.model.is_none();
        let Some(model) = calibrate::run(self, wanted)? else {
            return Ok(());
        };
        // Every rank must install the model, or ranks would choose
        // differently: a failure here is an error, never a silent skip.
        let shared = self.exclusive("calibration")?;
        shared.auto.model = Some(model);
        shared.auto.measured_at_start = true;
        Ok(())
    }

    /// Start-up, collective: how far this rank's clock is from rank 0's
    /// (see `clock.rs`). Before the communicator is shared with any thread.
    pub(super) fn measure_clock(&mut self) -> Result<()> {
        let clock = clock::measure(self)?;
        self.exclusive("measuring clocks")?.clock = clock;
        Ok(())
    }

    /// The shared state, to change during set-up (`during` names the step
    /// for the error): only while no thread holds it.
    pub(super) fn exclusive(&mut self, during: &str) -> Result<&mut Shared> {
        let refused = self.shared.err(
            ErrorKind::Setup {
                detail: format!("communicator shared before {during}"),
                culprit: None,
            },
            None,
        );
        Arc::get_mut(&mut self.shared).ok_or(refused)
    }

    /// The end of set-up: the totals metrics report count the application's
    /// operations, not set-up's own (clock ping-pongs, calibration; their
    /// records stay in the flight recorder, their bytes in the links'
    /// counters).
    pub(super) fn reset_totals(&self) {
        self.shared.recorder.lock().unwrap().reset_totals();
    }

    /// `CADENCE_DEBUG=INFO`: rank 0 prints how algorithms are chosen.
    pub(super) fn announce_selection(&self) {
        let s = &self.shared;
        if s.cfg.debug >= DebugLevel::Info && s.rank == 0 {
            let path = s.cfg.tuning.as_ref().map(|t| t.path.display().to_string());
            for line in choice::table_lines(&s.cfg.algo, &s.auto, path.as_deref()) {
                stderr_line!("cadence rank {} INFO: {line}", s.rank);
            }
            let hosts = super::order::ring_hosts(&s.auto.topo, &|r| s.peers.host(r));
            stderr_line!(
                "cadence rank {} INFO: ring order {}: {}",
                s.rank,
                hosts.join(" -> "),
                s.auto.order.why
            );
        }
    }
}
