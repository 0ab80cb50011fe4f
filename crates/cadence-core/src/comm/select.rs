//! The algorithm choice lives in [`crate::choice`]; this path stays for
//! the communicator's callers.

pub use crate::choice::defaults::default_table_on;
pub use crate::choice::report::{choice_line, table_lines, ChoiceLog};
pub use crate::choice::select::{coll_bytes, select_algo_on, Auto, Why};
