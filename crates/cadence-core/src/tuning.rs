//! Tuning tables live in [`crate::choice::tuned`]; this path stays for
//! existing callers.

pub use crate::choice::tuned::*;
