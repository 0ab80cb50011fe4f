//! Errors. Every failure a user can see names the operation (collective and
//! sequence number) and, whenever it is known, the rank that caused it.

use crate::types::CollKind;
use std::fmt;
use thiserror::Error;

/// What went wrong, with the facts that point at the culprit.
#[derive(Debug, Clone, Error, PartialEq)]
pub enum ErrorKind {
    #[error("timed out after {secs:.1}s waiting for rank {peer} ({what})")]
    Timeout {
        peer: usize,
        secs: f64,
        what: String,
    },
    /// A receive from any source saw no matching send from any rank.
    #[error(
        "timed out after {secs:.1}s: no rank sent a message to this receive from any source \
         ({bytes} bytes)"
    )]
    NoSender { secs: f64, bytes: usize },
    #[error("rank {peer} (pid {pid}) died")]
    PeerDied { peer: usize, pid: u32 },
    #[error("rank {peer} closed its connection ({detail})")]
    PeerClosed { peer: usize, detail: String },
    #[error("mismatch with rank {peer}: this rank called {ours}, rank {peer} called {theirs}")]
    Mismatch {
        peer: usize,
        ours: String,
        theirs: String,
        /// Argument signatures of both calls, so that ranks told about the
        /// mismatch later can tell which side differs from their own call.
        our_sig: u64,
        their_sig: u64,
    },
    #[error("garbage from rank {peer}: {detail}")]
    Garbage { peer: usize, detail: String },
    #[error("aborted because of rank {origin}: {detail}")]
    Aborted { origin: usize, detail: String },
    #[error("interrupted (a signal arrived while waiting)")]
    Interrupted,
    /// The application aborted the communicator on this rank (`abort`).
    #[error("aborted by the application: {0}")]
    UserAbort(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A broken invariant inside cadence (a schedule or engine bug). The
    /// communicator fails and tells its peers, as for any other failure.
    #[error("internal error (a bug in cadence; please report it): {0}")]
    Internal(String),
    /// An earlier operation failed the communicator; `culprit` is the rank
    /// that failure blamed, so every later error still names it.
    #[error("communicator unusable after an earlier failure: {detail}")]
    Failed {
        detail: String,
        culprit: Option<usize>,
    },
    /// Creating the communicator failed; `culprit` is the rank it could
    /// not reach or that never connected, when one is to blame.
    #[error("setup failed: {detail}")]
    Setup {
        detail: String,
        culprit: Option<usize>,
    },
    #[error("i/o error with rank {peer}: {detail}")]
    Io { peer: usize, detail: String },
}

impl ErrorKind {
    /// The rank this error blames, if any.
    pub fn culprit(&self) -> Option<usize> {
        match self {
            ErrorKind::Timeout { peer, .. }
            | ErrorKind::PeerDied { peer, .. }
            | ErrorKind::PeerClosed { peer, .. }
            | ErrorKind::Mismatch { peer, .. }
            | ErrorKind::Garbage { peer, .. }
            | ErrorKind::Io { peer, .. } => Some(*peer),
            ErrorKind::Aborted { origin, .. } => Some(*origin),
            ErrorKind::Failed { culprit, .. } | ErrorKind::Setup { culprit, .. } => *culprit,
            _ => None,
        }
    }
}

impl ErrorKind {
    /// The error of an operation refused because `earlier` failed the
    /// communicator: it carries that failure's text and culprit.
    pub fn failed_after(earlier: &CommError) -> ErrorKind {
        ErrorKind::Failed {
            detail: earlier.to_string(),
            culprit: earlier.culprit(),
        }
    }
}

/// An error with the operation it happened in.
#[derive(Debug, Clone, PartialEq)]
pub struct CommError {
    pub kind: ErrorKind,
    /// Rank that observed the error (unknown before bootstrap assigns one).
    pub rank: Option<usize>,
    /// Operation: (collective, sequence number on this communicator).
    pub op: Option<(CollKind, u64)>,
    /// Shared, not copied: errors are cloned to every operation they fail.
    pub comm_id: std::sync::Arc<str>,
}

impl CommError {
    pub fn new(kind: ErrorKind) -> CommError {
        CommError {
            kind,
            rank: None,
            op: None,
            comm_id: std::sync::Arc::from(""),
        }
    }
    pub fn invalid(msg: impl Into<String>) -> CommError {
        CommError::new(ErrorKind::InvalidArgument(msg.into()))
    }
    pub fn setup(msg: impl Into<String>) -> CommError {
        CommError::new(ErrorKind::Setup {
            detail: msg.into(),
            culprit: None,
        })
    }
    pub fn culprit(&self) -> Option<usize> {
        self.kind.culprit()
    }
}

impl fmt::Display for CommError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cadence")?;
        if !self.comm_id.is_empty() {
            write!(f, " comm {}", self.comm_id)?;
        }
        if let Some(rank) = self.rank {
            write!(f, " rank {rank}")?;
        }
        if let Some((kind, seq)) = self.op {
            write!(f, ", {kind} #{seq}")?;
        }
        write!(f, ": {}", self.kind)?;
        if let Some(c) = self.culprit() {
            write!(f, " [culprit: rank {c}]")?;
        }
        Ok(())
    }
}

impl std::error::Error for CommError {}

impl From<ErrorKind> for CommError {
    fn from(kind: ErrorKind) -> Self {
        CommError::new(kind)
    }
}

pub type Result<T, E = CommError> = std::result::Result<T, E>;
