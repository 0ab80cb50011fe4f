//! Algorithm choice: which algorithm a collective call runs. The
//! communicator (`comm`) and the simulator (`sim`) both call
//! [`select_algo_on`], so a simulated job chooses as a real one would.
//!
//! Strongest first:
//! 1. the algorithm the call passes itself;
//! 2. `CADENCE_ALGO` ([`overrides`]): a range forcing an algorithm for the
//!    call's collective and size, then a bare algorithm that applies;
//! 3. [`Auto`], among the algorithms `CADENCE_ALGO` does not exclude: the
//!    tuning table `cadence tune` wrote for this setting ([`tuned`]), else
//!    the cost model (`schedule::cost`, with parameters from the tuning
//!    table or the start-up calibration, [`calibrate`]), else the
//!    size table ([`defaults`]);
//! 4. if everything there is excluded, the first algorithm of
//!    `schedule::algos_for` that is neither excluded nor inapplicable.
//!
//! [`report`] holds what `CADENCE_DEBUG=INFO` prints about it.

pub mod calibrate;
pub mod defaults;
pub mod overrides;
pub mod report;
pub mod select;
pub mod tuned;

pub use defaults::{default_algo, default_algo_on, default_table_on};
pub use overrides::{AlgoOverride, AlgoRange};
pub use report::{choice_line, table_lines, ChoiceLog};
pub use select::{coll_bytes, select_algo_on, Auto, Why};
