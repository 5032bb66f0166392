//! The values that cross the backend boundary: tokens, the identity bound, requests and
//! outcomes.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A number that rises with every grant of a lock; pass it to what you write so stale writers
/// can be refused.
///
/// # Guarantees
///
/// A grant's token is strictly greater than every token issued before it for the same lock
/// name: across holders, across the same identity acquiring again, across expiry, and (where
/// the backend can) across loss of the backend's state. Renewal keeps the token; a new term
/// always gets a new one. Tokens of *different* lock names are not comparable in general.
///
/// # Example
///
/// ```
/// use tenure::backend::FencingToken;
/// let older = FencingToken::new(41);
/// let newer = FencingToken::new(42);
/// assert!(newer > older);
/// assert_eq!(newer.get(), 42);
/// assert_eq!(newer.to_string(), "42");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token value.
    #[must_use]
    pub const fn new(value: u64) -> Self {
        Self(value)
    }

    /// The raw value, for storing beside what the lease protects.
    #[must_use]
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<FencingToken> for u64 {
    fn from(t: FencingToken) -> u64 {
        t.0
    }
}

/// The longest identity a lease may carry, in bytes (UTF-8): what every backend must be able
/// to store, and what [`Locker`](crate::Locker) accepts.
///
/// 253 is the longest Kubernetes object name (a DNS subdomain), so every pod name — the usual
/// identity, from `$POD_NAME` — fits, as does any host name (at most 64 bytes on Linux) with a
/// process id. Every backend stores it: the Kubernetes API server sets no limit of its own on
/// `spec.holderIdentity` (the object, annotations included, is bounded by its size limits), a
/// Redis value can be far larger, and a local lease record may have 64 KiB. A bound well
/// below those keeps every record small and every `tenure status` line readable.
///
/// # Example
///
/// ```
/// use tenure::backend::memory::MemoryBackend;
/// use tenure::lock::MAX_IDENTITY_LEN;
/// use tenure::Locker;
///
/// assert!(Locker::with_identity(MemoryBackend::new(), &"a".repeat(MAX_IDENTITY_LEN)).is_ok());
/// assert!(Locker::with_identity(MemoryBackend::new(), &"a".repeat(MAX_IDENTITY_LEN + 1)).is_err());
/// ```
pub const MAX_IDENTITY_LEN: usize = 253;

/// A per-acquisition secret of 128 random bits from the OS CSPRNG: proof of ownership.
///
/// Renew and release are guarded by it, so nobody can extend or delete a lease they do not
/// hold, even under the same identity. It is a capability: its `Debug` shows only a short
/// prefix, enough to correlate log lines but not to forge a release.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct HolderToken([u8; 16]);

impl HolderToken {
    /// Draws a fresh token from the operating system's random source.
    ///
    /// # Panics
    ///
    /// Only if the OS random source itself fails, which on the supported platforms means the
    /// system is unusable; a predictable token would silently break ownership.
    #[must_use]
    pub fn random() -> Self {
        let mut bytes = [0u8; 16];
        #[allow(clippy::expect_used)]
        getrandom::fill(&mut bytes).expect("the OS random source failed");
        Self(bytes)
    }

    /// The token from its raw bytes (for backends that store it in binary form).
    #[must_use]
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// The raw bytes.
    #[must_use]
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The token as 32 lowercase hex digits, the form backends store.
    #[must_use]
    pub fn to_hex(&self) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(32);
        for b in self.0 {
            s.push(char::from(DIGITS[usize::from(b >> 4)]));
            s.push(char::from(DIGITS[usize::from(b & 0xf)]));
        }
        s
    }

    /// Parses the 32-hex-digit form written by [`to_hex`](Self::to_hex).
    #[must_use]
    pub fn from_hex(s: &str) -> Option<Self> {
        if s.len() != 32 || !s.is_ascii() {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, chunk) in s.as_bytes().chunks(2).enumerate() {
            let hex = std::str::from_utf8(chunk).ok()?;
            out[i] = u8::from_str_radix(hex, 16).ok()?;
        }
        Some(Self(out))
    }
}

impl fmt::Debug for HolderToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HolderToken({:02x}{:02x}…)", self.0[0], self.0[1])
    }
}

/// One attempt to take a lock.
#[derive(Clone, Debug)]
pub struct AcquireRequest {
    /// The lock's name, already validated by [`Backend::validate_name`](super::Backend::validate_name).
    pub name: Arc<str>,
    /// The holder token of this acquisition; the same token across retries of one acquisition.
    pub holder: HolderToken,
    /// Who is asking, for observers (pod name, hostname + pid).
    pub identity: Arc<str>,
    /// How long the grant lasts without renewal, measured by the store.
    pub ttl: Duration,
}

/// The answer to [`Backend::try_acquire`](super::Backend::try_acquire).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// The lock is ours, with this fencing token.
    Granted {
        /// The token of this term.
        fencing: FencingToken,
    },
    /// Someone else holds it.
    Busy {
        /// The holder's identity, when the store keeps it.
        holder: Option<String>,
        /// How long until the holder's lease runs out if it does not renew, when known.
        remaining: Option<Duration>,
    },
}

/// The answer to a renewal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewed {
    /// Still ours; the ttl restarted.
    Held,
    /// Not ours any more (expired, released, taken over, or the store lost it).
    NotHeld,
}

/// The answer to [`Backend::release`](super::Backend::release).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// Given up now, or by an earlier call with the same holder token (a replay).
    Released,
    /// It was not ours to give up: it expired, or someone else holds it.
    NotHeld,
}

/// One entry of a [`Backend::renew_many`](super::Backend::renew_many) batch.
#[derive(Clone, Debug)]
pub struct RenewRequest {
    /// The lock's name.
    pub name: Arc<str>,
    /// The holder token that must still hold it.
    pub holder: HolderToken,
    /// The new ttl from now.
    pub ttl: Duration,
}

/// How a lock's latest term ended, as far as the store remembers it
/// ([`Backend::last_term`](super::Backend::last_term)): for people asking "who had it, and
/// when did it end?" (`tenure status`), never for a decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndedTerm {
    /// The identity of the term's holder, when the store kept it (a Kubernetes Lease released
    /// by client-go keeps none).
    pub identity: Option<String>,
    /// The term's fencing token, when the store kept it.
    pub fencing: Option<FencingToken>,
    /// Released by its holder, or run out without renewal (the holder stopped or crashed).
    pub end: TermEnd,
    /// When it ended, in milliseconds since the Unix epoch, when the store can tell: on
    /// Kubernetes the `renewTime` the releasing client wrote (its clock), on the local backend
    /// this host's clock; Redis keeps no time.
    pub ended_ms: Option<u64>,
}

/// How a term ended ([`EndedTerm::end`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TermEnd {
    /// Its holder released the lease.
    Released,
    /// Its lease ran out without a renewal.
    Expired,
}

/// Who holds a lock, as the store sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRecord {
    /// The holder's human-readable identity.
    pub identity: String,
    /// The fencing token of the holder's term.
    pub fencing: FencingToken,
    /// Time left before the lease runs out without renewal, when the store can tell.
    pub remaining: Option<Duration>,
    /// How many times the lock changed hands, when the store counts it.
    pub transitions: Option<u64>,
    /// A hand-over asked of the holder and not yet done (an operator's `tenure handoff`,
    /// [`Backend::request_handoff`](super::Backend::request_handoff)), while its window runs.
    pub handoff: Option<Handoff>,
    /// Whether `handoff` is not tenure's request but the Kubernetes Lease's
    /// `spec.preferredHolder` (coordinated leader election) naming another candidate.
    pub preferred_holder: bool,
}

/// Who a lease should go to next: the target of a hand-over.
///
/// A preference, never a grant: it only keeps *other* candidates out for a bounded window
/// after the holder's release, so that the target, woken by the release, takes the lease
/// first. A target that does not take it within the window leaves an ordinary release
/// behind (anyone may win). Every hand-over is a new term with a higher fencing token.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Handoff {
    /// Step down; whoever campaigns next may win.
    Anyone,
    /// Step down in favour of this identity.
    To(String),
}

impl Handoff {
    /// The target, `None` for [`Handoff::Anyone`].
    #[must_use]
    pub fn target(&self) -> Option<&str> {
        match self {
            Self::Anyone => None,
            Self::To(who) => Some(who),
        }
    }

    /// Whether the preference keeps `identity` out while its window runs.
    #[must_use]
    pub fn excludes(&self, identity: &str) -> bool {
        self.target().is_some_and(|who| who != identity)
    }
}

/// A change of holder reported by [`Backend::observe`](super::Backend::observe).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderChange {
    /// The new holder's identity; `None` when the lock became free.
    pub holder: Option<String>,
    /// The new holder's fencing token; `None` when the lock became free.
    pub fencing: Option<FencingToken>,
}

impl HolderChange {
    /// The lock is free.
    #[must_use]
    pub const fn free() -> Self {
        Self {
            holder: None,
            fencing: None,
        }
    }

    /// Whether this change says the lock is free, i.e. a waiter should try now.
    #[must_use]
    pub const fn is_free(&self) -> bool {
        self.holder.is_none()
    }
}

/// One replica's announcement in a group of sharded leadership ([`crate::shard`]): who it is,
/// the shard count it runs with, and when it joined.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Member {
    /// The replica's identity (its locker's).
    pub identity: String,
    /// The shard count this replica runs with. Only members whose count is the group
    /// record's are assigned shards; the others wait.
    pub shards: u32,
    /// When the replica joined, in milliseconds since the Unix epoch on its own clock. Shard
    /// assignment never orders by it (the group's shard count is in the group record,
    /// [`GroupRecord`](super::GroupRecord)); an election's ready group does, for
    /// [`Preference::Newest`](crate::election::Preference::Newest), where it is when the
    /// replica's run began.
    pub joined_ms: u64,
    /// The shards whose term runs on the replica now, ascending: the assignment keeps them
    /// where they are when it can.
    pub holds: Vec<u32>,
}

/// A change of leadership worth recording for people, passed to
/// [`Backend::record_event`](super::Backend::record_event) by the elector.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeadershipEvent {
    /// `identity` won a term.
    BecameLeader {
        /// The new leader.
        identity: String,
        /// The token of its term.
        fencing: FencingToken,
    },
    /// `identity`'s term ended.
    StoppedLeading {
        /// The former leader.
        identity: String,
        /// The token of the term that ended.
        fencing: FencingToken,
        /// Why, in words ("released", "lease lost: no successful renewal before the renew
        /// deadline", ...).
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_token_hex_round_trips_and_debug_hides_it() {
        let t = HolderToken::random();
        let hex = t.to_hex();
        assert_eq!(hex.len(), 32);
        assert_eq!(HolderToken::from_hex(&hex), Some(t));
        let dbg = format!("{t:?}");
        assert!(!dbg.contains(&hex[4..]), "Debug leaks the token: {dbg}");
        assert_ne!(HolderToken::random(), t, "two draws collided");
    }

    #[test]
    fn holder_token_rejects_malformed_hex() {
        assert_eq!(HolderToken::from_hex(""), None);
        assert_eq!(HolderToken::from_hex(&"g".repeat(32)), None);
        assert_eq!(HolderToken::from_hex(&"a".repeat(31)), None);
        assert_eq!(HolderToken::from_hex(&"é".repeat(16)), None);
    }
}
