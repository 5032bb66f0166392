//! The processes of a term: the command in its own process group, the watchdog that kills the
//! group when the lease runs out, and the reaper that deals with what escapes the group.
//!
//! Nothing here knows about elections or flags; `crate::run`'s supervisor drives it. The
//! files import downwards only: `watchdog` → `deadline`, `child` → `reaper` → `term_env`.

pub mod child;
pub mod deadline;
pub mod reaper;
pub mod term_env;
pub mod watchdog;
