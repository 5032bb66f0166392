//! Carrying the fencing token to what the workload writes, so stale leaders are refused.
//!
//! A lease cannot stop a frozen ex-leader from waking up and writing: only the resource it
//! writes to can. The rule is always the same: **remember the highest token you have accepted
//! and refuse writes with a lower one.** Equal tokens are accepted, so a leader can write many
//! times in one term.
//!
//! - Over HTTP, send the token in the [`HEADER`] header and have the server compare.
//! - In SQL, keep a `fencing_token` column and make the comparison part of the write:
//!
//!   ```sql
//!   UPDATE reports
//!      SET body = $1, fencing_token = $2
//!    WHERE id = $3 AND fencing_token <= $2;
//!   -- 0 rows updated: a newer leader has written; stop.
//!   ```
//!
//!   For an insert-or-update, use `INSERT … ON CONFLICT (id) DO UPDATE SET … WHERE
//!   reports.fencing_token <= excluded.fencing_token`.
//! - In Redis, use `fence::redis::fenced_set` (feature `redis`): one script compares and writes
//!   atomically.
//! - On Kubernetes, [`kube`] (feature `kube`): the API server itself refuses a stale leader's
//!   writes through a generated ValidatingAdmissionPolicy, and `FencedApi` carries the token.
//! - In process, [`Fence`] does the comparison for state you guard yourself.
//!
//! # Example: the SQL pattern, run against SQLite
//!
//! ```
//! # fn main() -> Result<(), rusqlite::Error> {
//! use rusqlite::{Connection, params};
//!
//! let db = Connection::open_in_memory()?;
//! db.execute_batch(
//!     "CREATE TABLE reports (id INTEGER PRIMARY KEY, body TEXT, fencing_token INTEGER NOT NULL);
//!      INSERT INTO reports VALUES (1, 'empty', 0);",
//! )?;
//! let fenced_write = |token: u64, body: &str| -> Result<bool, rusqlite::Error> {
//!     let rows = db.execute(
//!         "UPDATE reports SET body = ?1, fencing_token = ?2 WHERE id = 1 AND fencing_token <= ?2",
//!         params![body, token as i64],
//!     )?;
//!     Ok(rows == 1)
//! };
//! assert!(fenced_write(7, "written in term 7")?); // the leader of term 7 writes
//! assert!(fenced_write(8, "written in term 8")?); // a new leader, term 8
//! assert!(!fenced_write(7, "late write from the frozen ex-leader")?); // refused
//! let body: String = db.query_row("SELECT body FROM reports WHERE id = 1", [], |r| r.get(0))?;
//! assert_eq!(body, "written in term 8");
//! # Ok(()) }
//! ```

#[cfg(feature = "kube")]
pub mod kube;
#[cfg(feature = "redis")]
pub mod redis;

use std::sync::Mutex;

use crate::FencingToken;

/// The HTTP header that carries a fencing token, as a decimal number.
///
/// ```
/// assert_eq!(tenure::fence::HEADER, "tenure-fencing-token");
/// ```
pub const HEADER: &str = "tenure-fencing-token";

/// A write came with a token lower than one already accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {offered}: {highest} was already accepted")]
pub struct StaleToken {
    /// The token of the refused write.
    pub offered: FencingToken,
    /// The highest token accepted so far.
    pub highest: FencingToken,
}

/// An in-process fence: remembers the highest token accepted and refuses lower ones.
///
/// # Example
///
/// ```
/// use tenure::FencingToken;
/// use tenure::fence::Fence;
///
/// let fence = Fence::new();
/// assert!(fence.check(FencingToken::new(3)).is_ok());
/// assert!(fence.check(FencingToken::new(3)).is_ok()); // same term, again
/// assert!(fence.check(FencingToken::new(2)).is_err()); // a stale holder
/// assert_eq!(fence.highest(), Some(FencingToken::new(3)));
/// ```
#[derive(Debug, Default)]
pub struct Fence {
    highest: Mutex<Option<FencingToken>>,
}

impl Fence {
    /// A fence that has accepted nothing yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Accepts `token` if it is at least the highest accepted so far, and remembers it.
    ///
    /// # Errors
    ///
    /// [`StaleToken`] if a higher token was accepted before.
    pub fn check(&self, token: FencingToken) -> Result<(), StaleToken> {
        let mut highest = self
            .highest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match *highest {
            Some(h) if token < h => Err(StaleToken {
                offered: token,
                highest: h,
            }),
            _ => {
                *highest = Some(token);
                Ok(())
            }
        }
    }

    /// The highest token accepted so far.
    #[must_use]
    pub fn highest(&self) -> Option<FencingToken> {
        *self
            .highest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
