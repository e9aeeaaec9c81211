//! Moved to [`crate::control::hint`]; this re-export keeps the old path
//! working until the callers use the new one.

pub use crate::control::hint::*;
