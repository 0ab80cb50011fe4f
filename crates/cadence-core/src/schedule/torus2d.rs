//! 2D torus allreduce: the ranks as a grid, with rings along both dimensions.
//!
//! Terms:
//! - **grid**: X columns by Y rows, X·Y = n, X the largest divisor of n not
//!   above √n (so X ≤ Y; a prime n gives 1×n). Rank r sits in **row**
//!   r / X at **column** r mod X: a row is X consecutive ranks (typically
//!   the ranks of one host), a column the ranks at the same place in every
//!   row.
//! - **row ring**, **column ring**: a ring (see `ring.rs`) over the members of
//!   a row (in column order) or a column (in row order); a rank's **position**
//!   is its index in that ring.
//! - **chunk**: one of X balanced pieces of the buffer. The row
//!   reduce-scatter leaves the row's partial result of chunk c+1 on the rank
//!   at column c, its **owned chunk**.
//! - **piece**: one of Y balanced pieces of an owned chunk, for the column
//!   ring.
//!
//! Stages, every one a ring pass on Output:
//! 1. reduce-scatter along the row: steps; each rank ends with its row's
//!    sum of its owned chunk. It reads Input as ring.rs does, so in place
//!    `Input[i]` is read before `Output[i]` is written.
//! 2. allreduce of the owned chunk along the column: a reduce-scatter pass
//!    then an allgather pass over its Y pieces, (Y-1) steps each; every piece
//!    is finished on one rank of the column. With X = 1 the rank's
//!    contribution is still its Input, which the pass reads instead.
//! 3. allgather of the owned chunks along the row, in one of two ways
//!    ([`RowGather`]): **direct**, one phase in which every rank sends its
//!    owned chunk to the X-1 others of its row (`torus2d`), or a **ring** of
//!    steps (`torus2d_ring`, the seed study's "2d-torus(ring)", which it
//!    found best from 512 nodes). The same bytes either way; direct pays one
//!    latency instead of X-1, the ring sends one message per step, which
//!    oversubscribes no link when X is large. With X ≤ 2 they are the same
//!    schedule.
//!
//! Every element is finished on one rank and only copied from there, so all
//! ranks hold the same bits.
//!
//! (X-1) + 2(Y-1) + 1 latencies (direct) or 2(X-1) + 2(Y-1) (ring) instead
//! of the ring's 2(n-1), and the full-buffer stages stay inside rows; each
//! rank sends about 2(X-1)/X + 2(Y-1)/(XY) of the buffer, close to the ring's
//! 2(n-1)/n.

use super::ir::{Buf, Span};
use super::plan::{Blocks, Plan};

/// X: the largest divisor of n not above √n.
fn columns(n: usize) -> usize {
    (1..=n)
        .take_while(|x| x * x <= n)
        .filter(|x| n.is_multiple_of(*x))
        .last()
        .unwrap_or(1)
}

/// How the last stage gathers the owned chunks along a row (see the module
/// comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowGather {
    Direct,
    Ring,
}

/// A ring over some ranks: this rank's position and its neighbours.
struct Ring {
    pos: usize,
    len: usize,
    next: usize,
    prev: usize,
}

pub(crate) fn allreduce(plan: &mut Plan, count: usize, gather: RowGather) {
    let (r, n) = (plan.rank, plan.nranks);
    let x = columns(n);
    let (row, col) = (r / x, r % x);
    let y = n / x;
    let row_ring = Ring {
        pos: col,
        len: x,
        next: row * x + (col + 1) % x,
        prev: row * x + (col + x - 1) % x,
    };
    let col_ring = Ring {
        pos: row,
        len: y,
        next: ((row + 1) % y) * x + col,
        prev: ((row + y - 1) % y) * x + col,
    };
    let chunks = Blocks::balanced(count, x);
    reduce_scatter(plan, &row_ring, &chunks);
    // The owned chunk, as its own buffer of pieces.
    let owned = (col + 1) % x;
    let base = chunks.off(owned);
    let pieces = Blocks::balanced(chunks.len(owned), y);
    let piece = |buf: Buf, p: usize| Span::new(buf, base + pieces.off(p), pieces.len(p));
    // The row pass left the partial result in Output, except with one column
    // where there was no row pass.
    let start = if x == 1 { Buf::Input } else { Buf::Output };
    let ring = &col_ring;
    for s in 0..y - 1 {
        let send_p = (ring.pos + y - s) % y;
        let recv_p = (ring.pos + 2 * y - s - 1) % y;
        let src = if s == 0 { start } else { Buf::Output };
        plan.phase()
            .send(ring.next, piece(src, send_p))
            .recv_reduce(ring.prev, piece(Buf::Output, recv_p), piece(start, recv_p));
    }
    for s in 0..y - 1 {
        let send_p = (ring.pos + 1 + y - s) % y;
        let recv_p = (ring.pos + y - s) % y;
        plan.phase()
            .send(ring.next, piece(Buf::Output, send_p))
            .recv(ring.prev, piece(Buf::Output, recv_p));
    }
    match gather {
        RowGather::Ring => allgather(plan, &row_ring, &chunks),
        RowGather::Direct => {
            // Column c owns chunk c+1: send ours to every other column of the
            // row, receive each of theirs.
            let mut phase = plan.phase();
            for c in (0..x).filter(|&c| c != col) {
                phase
                    .send(row * x + c, chunks.span(Buf::Output, owned))
                    .recv(row * x + c, chunks.span(Buf::Output, (c + 1) % x));
            }
        }
    }
}

/// Ring reduce-scatter of Input over the ring's chunks into Output: position
/// i ends with chunk i+1 (see `ring.rs`).
fn reduce_scatter(plan: &mut Plan, ring: &Ring, chunks: &Blocks) {
    let m = ring.len;
    for s in 0..m.saturating_sub(1) {
        let send_c = (ring.pos + m - s) % m;
        let recv_c = (ring.pos + 2 * m - s - 1) % m;
        let src = if s == 0 { Buf::Input } else { Buf::Output };
        plan.phase()
            .send(ring.next, chunks.span(src, send_c))
            .recv_reduce(
                ring.prev,
                chunks.span(Buf::Output, recv_c),
                chunks.span(Buf::Input, recv_c),
            );
    }
}

/// Ring allgather of finished chunk i+1 from every position i, in Output.
fn allgather(plan: &mut Plan, ring: &Ring, chunks: &Blocks) {
    let m = ring.len;
    for s in 0..m.saturating_sub(1) {
        let send_c = (ring.pos + 1 + m - s) % m;
        let recv_c = (ring.pos + m - s) % m;
        plan.phase()
            .send(ring.next, chunks.span(Buf::Output, send_c))
            .recv(ring.prev, chunks.span(Buf::Output, recv_c));
    }
}

#[cfg(test)]
mod tests {
    use super::columns;
    use crate::schedule::{build, Algo, CollArgs};
    use crate::types::CollKind;

    #[test]
    fn the_row_gather_is_one_phase_or_a_ring() {
        let a = CollArgs {
            kind: CollKind::AllReduce,
            root: 0,
            counts: vec![900],
        };
        let phases = |n: usize, algo| build(&a, 0, n, algo).unwrap().phases;
        // 16 ranks: a 4×4 grid; direct gathers the row in 1 phase, not 3.
        let (direct, ring) = (phases(16, Algo::Torus2d), phases(16, Algo::Torus2dRing));
        assert_eq!((direct.len(), ring.len()), (3 + 6 + 1, 3 + 6 + 3));
        assert_eq!(direct.last().unwrap().steps.len(), 2 * 3);
        // 8 ranks: 2 columns, so both are the same schedule.
        assert_eq!(phases(8, Algo::Torus2d), phases(8, Algo::Torus2dRing));
    }

    #[test]
    fn grid_shapes() {
        let shapes: Vec<(usize, usize)> = [1, 2, 4, 6, 7, 8, 12, 16, 32, 36]
            .iter()
            .map(|&n| (n, columns(n)))
            .collect();
        assert_eq!(
            shapes,
            [
                (1, 1),
                (2, 1),
                (4, 2),
                (6, 2),
                (7, 1),
                (8, 2),
                (12, 3),
                (16, 4),
                (32, 4),
                (36, 6)
            ]
        );
    }
}
