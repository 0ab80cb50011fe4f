//! What a verification failure says: where ([`At`], [`Elem`]), what is
//! wrong ([`Fault`]), and for which call ([`VerifyError`]).

use super::{Layout, MAX_RANKS};
use crate::schedule::ir::{Algo, Buf, Span};
use crate::schedule::ScheduleError;
use crate::types::CollKind;
use std::fmt;
use thiserror::Error;

/// Where a step is: rank, phase and step index within the phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct At {
    pub rank: usize,
    pub phase: usize,
    pub step: usize,
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {} phase {} step {}",
            self.rank, self.phase, self.step
        )
    }
}

/// One element of one buffer, for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Elem {
    pub buf: Buf,
    pub index: usize,
}

impl fmt::Display for Elem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}[{}]", self.buf, self.index)
    }
}

/// A transfer that cannot complete, in a deadlock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wait {
    pub at: At,
    pub peer: usize,
    /// The peer's phase holding the matching step.
    pub peer_phase: usize,
    /// The phase the peer is stuck in; `None` if it has finished.
    pub peer_now: Option<usize>,
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} waits for rank {} to reach phase {}, ",
            self.at, self.peer, self.peer_phase
        )?;
        match self.peer_now {
            Some(q) => write!(f, "which is stuck in phase {q}"),
            None => write!(f, "which has finished"),
        }
    }
}

/// What is wrong with a set of schedules.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum Fault {
    #[error("{nranks} ranks: the verifier covers at most {MAX_RANKS}")]
    TooManyRanks { nranks: usize },
    #[error("{0}")]
    BadArgs(ScheduleError),
    #[error("send and recv are verified in pairs, with verify_p2p")]
    PointToPoint,
    #[error("rank {rank}: {error}")]
    Build { rank: usize, error: ScheduleError },
    #[error("schedule {index} claims to be rank {rank} of {nranks}")]
    WrongRank {
        index: usize,
        rank: usize,
        nranks: usize,
    },
    #[error("schedules use different algorithms")]
    MixedAlgos,
    #[error("{at}: peer {peer} is out of range or the rank itself")]
    BadPeer { at: At, peer: usize },
    #[error("{at}: {span:?} is out of bounds ({buf_len} elements)")]
    OutOfBounds { at: At, span: Span, buf_len: usize },
    #[error("{at}: writes Input, which is read-only")]
    WritesInput { at: At },
    #[error("{at}: a non-root rank writes Output in a reduce (the user's buffer)")]
    WritesNonRootOutput { at: At },
    #[error("{at}: operands of {a} and {b} elements")]
    LenMismatch { at: At, a: usize, b: usize },
    #[error("{at}: {what}")]
    Overlap { at: At, what: String },
    #[error("{send} sends {send_len} elements but the matching {recv} receives {recv_len}")]
    TransferLenMismatch {
        send: At,
        recv: At,
        send_len: usize,
        recv_len: usize,
    },
    #[error(
        "{at}: no matching {} (rank {from} sends {sends} messages to rank {to}, \
         which receives {recvs} from it)",
        counterpart(.is_send)
    )]
    Unmatched {
        at: At,
        from: usize,
        to: usize,
        sends: usize,
        recvs: usize,
        is_send: bool,
    },
    #[error("deadlock: {}", waits_text(.waits))]
    Deadlock { waits: Vec<Wait> },
    #[error("{at}: {elem} reduces two values that both contain rank(s) {}", ranks_text(.both))]
    DoubleCount { at: At, elem: Elem, both: u64 },
    #[error("{at}: {elem} reduces element {a} with element {b}")]
    Misaligned {
        at: At,
        elem: Elem,
        a: usize,
        b: usize,
    },
    #[error("{at}: {elem} reduces {value}, which is not a reduction operand")]
    NotReducible { at: At, elem: Elem, value: String },
    #[error("rank {rank} Output[{index}] holds {got}, expected {expected}")]
    WrongResult {
        rank: usize,
        index: usize,
        expected: String,
        got: String,
    },
    #[error("Output[{index}] is computed in different operand orders on ranks {a} and {b}, so its bits may differ")]
    NotBitwiseIdentical { index: usize, a: usize, b: usize },
    #[error("rank {rank} can leave the barrier before hearing from rank(s) {}", ranks_text(.missing))]
    BarrierIncomplete { rank: usize, missing: u64 },
}

fn counterpart(is_send: &bool) -> &'static str {
    if *is_send {
        "Recv"
    } else {
        "Send"
    }
}

fn waits_text(waits: &[Wait]) -> String {
    let parts: Vec<String> = waits.iter().map(Wait::to_string).collect();
    parts.join("; ")
}

pub(super) fn ranks_text(mask: &u64) -> String {
    let ranks: Vec<String> = (0..MAX_RANKS)
        .filter(|r| mask >> r & 1 == 1)
        .map(|r| r.to_string())
        .collect();
    format!("{{{}}}", ranks.join(", "))
}

/// A verification failure: the call, the layout it showed up in (`None` for
/// faults found before running) and the fault.
#[derive(Clone, Debug, PartialEq, Error)]
#[error(
    "{kind} (root {root}, counts {counts:?}) with {} on {nranks} ranks{}: {fault}",
    algo_text(.algo),
    layout_text(.layout)
)]
pub struct VerifyError {
    pub kind: CollKind,
    pub root: usize,
    pub counts: Vec<usize>,
    pub algo: Option<Algo>,
    pub nranks: usize,
    pub layout: Option<Layout>,
    pub fault: Fault,
}

fn algo_text(algo: &Option<Algo>) -> &'static str {
    algo.map_or("no algorithm", Algo::name)
}

fn layout_text(layout: &Option<Layout>) -> String {
    layout.map_or(String::new(), |l| format!(", {l}"))
}
