//! Lowering: what an operation needs besides its schedule. A schedule moves
//! and reduces elements; a call as the user made it may also need its input
//! scaled first (`premul_sum`), its output divided after (`avg`), a
//! temporary output (none was passed) or a temporary input (the input
//! overlaps the output in a way no schedule can take). `lower` decides this
//! from the call and the buffers' layout, as data; the engine carries it out
//! (`Engine::run_lowered`), so the communicator does no arithmetic on
//! buffers itself.

use crate::types::{CollKind, RedOp};

/// How the caller's buffers sit relative to each other (measured by the
/// engine from their addresses; see `engine::Buffers::layout`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// Input and output are the same bytes, for a collective whose schedules
    /// take that (allreduce, reduce): in place.
    pub exact_inplace: bool,
    /// Allgather's input is this rank's block of its output: in place.
    pub allgather_inplace: bool,
    /// Input and output share any byte.
    pub overlap: bool,
    /// The caller passed an output buffer.
    pub has_output: bool,
}

/// How the input reaches the schedule.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum InputPrep {
    /// The caller's input as it is.
    AsIs,
    /// Multiplied by the factor where it is (`premul_sum` in place: the
    /// input is the output, which the operation overwrites anyway).
    ScaleInPlace(f64),
    /// Copied into a temporary first (input and output overlap).
    Copy,
    /// Multiplied by the factor into a temporary (`premul_sum`, out of place:
    /// the caller's input must stay as it was).
    ScaleCopy(f64),
}

/// What to do around the schedule.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lowering {
    /// The output is a temporary of this many elements (the caller passed
    /// none and the schedule writes one, e.g. `reduce` off the root).
    pub temp_output: Option<usize>,
    pub input: InputPrep,
    /// Divide the output by this many ranks afterwards (`avg`).
    pub divide_by: Option<usize>,
}

/// The lowering of `kind` with reduction `op` on `rank` of `nranks` (root
/// `root`), whose schedule writes `out_len` output elements.
pub fn lower(
    kind: CollKind,
    op: RedOp,
    root: usize,
    rank: usize,
    nranks: usize,
    out_len: usize,
    layout: Layout,
) -> Lowering {
    let premul = match op {
        RedOp::PremulSum(f) if kind.reduces() => Some(f),
        _ => None,
    };
    let input = match premul {
        Some(f) if layout.exact_inplace => InputPrep::ScaleInPlace(f),
        Some(f) => InputPrep::ScaleCopy(f),
        None if layout.overlap && !layout.exact_inplace && !layout.allgather_inplace => {
            InputPrep::Copy
        }
        None => InputPrep::AsIs,
    };
    // The average is only where the result is: every rank, or reduce's root.
    let divide_by =
        (op == RedOp::Avg && kind.reduces() && (kind != CollKind::Reduce || rank == root))
            .then_some(nranks);
    Lowering {
        temp_output: (!layout.has_output && out_len > 0).then_some(out_len),
        input,
        divide_by,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT: Layout = Layout {
        exact_inplace: false,
        allgather_inplace: false,
        overlap: false,
        has_output: true,
    };

    #[test]
    fn plain_calls_need_nothing() {
        let l = lower(CollKind::AllReduce, RedOp::Sum, 0, 1, 4, 10, OUT);
        assert_eq!(
            l,
            Lowering {
                temp_output: None,
                input: InputPrep::AsIs,
                divide_by: None
            }
        );
    }

    #[test]
    fn premul_scales_in_place_only_when_input_is_output() {
        let inplace = Layout {
            exact_inplace: true,
            overlap: true,
            ..OUT
        };
        let f = RedOp::PremulSum(0.5);
        assert_eq!(
            lower(CollKind::AllReduce, f, 0, 0, 2, 8, inplace).input,
            InputPrep::ScaleInPlace(0.5)
        );
        assert_eq!(
            lower(CollKind::ReduceScatter, f, 0, 0, 2, 8, OUT).input,
            InputPrep::ScaleCopy(0.5)
        );
        // Not a reduction: the factor means nothing.
        assert_eq!(
            lower(CollKind::AllGather, f, 0, 0, 2, 8, OUT).input,
            InputPrep::AsIs
        );
    }

    #[test]
    fn overlapping_buffers_are_separated_unless_a_schedule_takes_them() {
        let partial = Layout {
            overlap: true,
            ..OUT
        };
        assert_eq!(
            lower(CollKind::AllToAll, RedOp::Sum, 0, 0, 3, 9, partial).input,
            InputPrep::Copy
        );
        let gathered_in_place = Layout {
            overlap: true,
            allgather_inplace: true,
            ..OUT
        };
        assert_eq!(
            lower(
                CollKind::AllGather,
                RedOp::Sum,
                0,
                1,
                3,
                9,
                gathered_in_place
            )
            .input,
            InputPrep::AsIs
        );
    }

    #[test]
    fn average_divides_where_the_result_is() {
        let avg = RedOp::Avg;
        assert_eq!(
            lower(CollKind::AllReduce, avg, 0, 2, 5, 4, OUT).divide_by,
            Some(5)
        );
        assert_eq!(
            lower(CollKind::Reduce, avg, 1, 1, 5, 4, OUT).divide_by,
            Some(5)
        );
        assert_eq!(
            lower(CollKind::Reduce, avg, 1, 0, 5, 4, OUT).divide_by,
            None
        );
    }

    #[test]
    fn a_missing_output_becomes_a_temporary() {
        let none = Layout {
            has_output: false,
            ..OUT
        };
        assert_eq!(
            lower(CollKind::Reduce, RedOp::Sum, 0, 1, 2, 4, none).temp_output,
            Some(4)
        );
        assert_eq!(
            lower(CollKind::Barrier, RedOp::Sum, 0, 1, 2, 0, none).temp_output,
            None
        );
    }
}
