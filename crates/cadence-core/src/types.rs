//! Vocabulary shared by every layer: element types, reduction operators and
//! collective kinds. Each has a stable one-byte wire code (it travels in message
//! headers so that a receiver can name what a mismatched peer called).

use serde::Serialize;
use std::fmt;

/// Element type of a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F16,
    BF16,
    F32,
    F64,
    I8,
    U8,
    I32,
    I64,
}

impl DType {
    pub const ALL: [DType; 8] = [
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::I64,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
        }
    }

    pub const fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// The user-facing name (numpy's spelling, plus "bfloat16").
    pub const fn name(self) -> &'static str {
        match self {
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::I8 => "int8",
            DType::U8 => "uint8",
            DType::I32 => "int32",
            DType::I64 => "int64",
        }
    }

    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    pub const fn code(self) -> u8 {
        self as u8
    }

    pub fn from_code(c: u8) -> Option<DType> {
        DType::ALL.get(c as usize).copied()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Reduction operator. `Avg` is a sum divided by the number of ranks at the end;
/// `PremulSum` multiplies each rank's contribution by a scalar before summing
/// (FSDP2 uses both). On the wire and in schedules only the element-wise part
/// matters: see [`RedOp::elementwise`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RedOp {
    Sum,
    Prod,
    Min,
    Max,
    Avg,
    PremulSum(f64),
}

impl RedOp {
    pub fn name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Prod => "prod",
            RedOp::Min => "min",
            RedOp::Max => "max",
            RedOp::Avg => "avg",
            RedOp::PremulSum(_) => "premul_sum",
        }
    }

    pub fn from_name(s: &str, factor: Option<f64>) -> Option<RedOp> {
        Some(match s {
            "sum" => RedOp::Sum,
            "prod" | "product" => RedOp::Prod,
            "min" => RedOp::Min,
            "max" => RedOp::Max,
            "avg" | "mean" => RedOp::Avg,
            "premul_sum" => RedOp::PremulSum(factor?),
            _ => return None,
        })
    }

    /// The operator applied element by element while data moves.
    pub fn elementwise(self) -> ElemOp {
        match self {
            RedOp::Sum | RedOp::Avg | RedOp::PremulSum(_) => ElemOp::Sum,
            RedOp::Prod => ElemOp::Prod,
            RedOp::Min => ElemOp::Min,
            RedOp::Max => ElemOp::Max,
        }
    }

    pub fn code(self) -> u8 {
        match self {
            RedOp::Sum => 0,
            RedOp::Prod => 1,
            RedOp::Min => 2,
            RedOp::Max => 3,
            RedOp::Avg => 4,
            RedOp::PremulSum(_) => 5,
        }
    }

    pub fn name_of_code(c: u8) -> &'static str {
        ["sum", "prod", "min", "max", "avg", "premul_sum"]
            .get(c as usize)
            .copied()
            .unwrap_or("?")
    }
}

/// The element-wise part of a reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElemOp {
    Sum,
    Prod,
    Min,
    Max,
}

/// What a collective does. Buffer layouts per kind are documented on
/// [`crate::schedule::CollArgs`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CollKind {
    AllReduce,
    Reduce,
    Broadcast,
    AllGather,
    ReduceScatter,
    AllToAll,
    Gather,
    Scatter,
    Barrier,
    Send,
    Recv,
}

impl CollKind {
    pub const ALL: [CollKind; 11] = [
        CollKind::AllReduce,
        CollKind::Reduce,
        CollKind::Broadcast,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::AllToAll,
        CollKind::Gather,
        CollKind::Scatter,
        CollKind::Barrier,
        CollKind::Send,
        CollKind::Recv,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            CollKind::AllReduce => "allreduce",
            CollKind::Reduce => "reduce",
            CollKind::Broadcast => "broadcast",
            CollKind::AllGather => "allgather",
            CollKind::ReduceScatter => "reduce_scatter",
            CollKind::AllToAll => "alltoall",
            CollKind::Gather => "gather",
            CollKind::Scatter => "scatter",
            CollKind::Barrier => "barrier",
            CollKind::Send => "send",
            CollKind::Recv => "recv",
        }
    }

    pub fn from_name(s: &str) -> Option<CollKind> {
        CollKind::ALL.into_iter().find(|k| k.name() == s)
    }

    pub const fn code(self) -> u8 {
        self as u8
    }

    pub fn from_code(c: u8) -> Option<CollKind> {
        CollKind::ALL.get(c as usize).copied()
    }

    /// Whether the collective has a root (for Send/Recv: a peer).
    pub const fn is_rooted(self) -> bool {
        matches!(
            self,
            CollKind::Reduce
                | CollKind::Broadcast
                | CollKind::Gather
                | CollKind::Scatter
                | CollKind::Send
                | CollKind::Recv
        )
    }

    /// Whether the collective reduces (and so takes a [`RedOp`]).
    pub const fn reduces(self) -> bool {
        matches!(
            self,
            CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter
        )
    }
}

impl fmt::Display for CollKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
