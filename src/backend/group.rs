//! The group record of sharded leadership: the parameters every member of a group must share
//! (its shard count), kept by the store in one small record that changes only by
//! compare-and-swap, so no member's clock or start order decides them.
//!
//! Every backend stores the same text, `g1:<shards>:<generation>:<draining from or ->`, so
//! one parser here judges what another process wrote: bounded, each field checked, anything
//! else reported as [`GroupRead::Damaged`] rather than guessed at.

use std::fmt;

/// The lease of shard `shard` of the sharded group `group`: `GROUP-SHARD`; public as
/// [`crate::shard::lease_name`].
///
/// The one naming scheme of shard leases, here beside the group record so the election layer
/// can tell a plain election's name from a group's shard without knowing the sharding layer.
#[must_use]
pub(crate) fn shard_lease_name(group: &str, shard: u32) -> String {
    format!("{group}-{shard}")
}

/// The group and shard a lease name would be under [`crate::shard::lease_name`]'s scheme, if
/// it has that shape (`GROUP-DIGITS`, the digits a `u32` without a leading zero).
#[must_use]
pub fn parse_shard_lease_name(name: &str) -> Option<(&str, u32)> {
    let (group, shard) = name.rsplit_once('-')?;
    if group.is_empty()
        || shard.is_empty()
        || !shard.bytes().all(|b| b.is_ascii_digit())
        || (shard.len() > 1 && shard.starts_with('0'))
    {
        return None;
    }
    Some((group, shard.parse().ok()?))
}

/// The longest record text tenure writes is far below this; anything longer is damaged.
pub const MAX_GROUP_RECORD: usize = 64;

const VERSION: &str = "g1";

/// The parameters a sharded group runs with, as the store keeps them.
///
/// The record moves through `Active(N, g)` → `Draining(M, g+1, from N)` → `Active(M, g+1)`
/// when the group changes its shard count ([`crate::shard`] documents the protocol): a
/// shard term runs only while the record is active with the member's own count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupRecord {
    /// The shard count every running member uses.
    pub shards: u32,
    /// Raised by one on every change of `shards`; never lowered.
    pub generation: u64,
    /// While set, the group is changing to `shards` from this older count: the leases of
    /// the older count (`0..from`) may still be held, so no term of the new count starts.
    pub draining_from: Option<u32>,
}

impl GroupRecord {
    /// The record of a group that runs `shards` from its first generation.
    #[must_use]
    pub const fn first(shards: u32) -> Self {
        Self {
            shards,
            generation: 1,
            draining_from: None,
        }
    }

    /// Whether terms of this record's count may run.
    #[must_use]
    pub const fn is_active(&self) -> bool {
        self.draining_from.is_none()
    }

    /// The text every backend stores.
    #[must_use]
    pub fn encode(&self) -> String {
        let from = self
            .draining_from
            .map_or_else(|| "-".to_owned(), |f| f.to_string());
        format!("{VERSION}:{}:{}:{from}", self.shards, self.generation)
    }

    /// Parses what a store holds, whoever wrote it.
    ///
    /// # Errors
    ///
    /// What is wrong with `text`, in words, without echoing it (it may be huge).
    pub fn decode(text: &[u8]) -> Result<Self, &'static str> {
        if text.len() > MAX_GROUP_RECORD {
            return Err("longer than any group record");
        }
        let text = std::str::from_utf8(text).map_err(|_| "not UTF-8")?;
        let mut fields = text.split(':');
        if fields.next() != Some(VERSION) {
            return Err("not a g1 group record");
        }
        let shards = fields
            .next()
            .and_then(|s| digits(s)?.parse::<u32>().ok())
            .filter(|s| *s > 0)
            .ok_or("bad shard count")?;
        let generation = fields
            .next()
            .and_then(|s| digits(s)?.parse::<u64>().ok())
            .filter(|g| *g > 0)
            .ok_or("bad generation")?;
        let draining_from = match fields.next() {
            Some("-") => None,
            Some(s) => Some(
                digits(s)
                    .and_then(|s| s.parse::<u32>().ok())
                    .filter(|f| *f > 0)
                    .ok_or("bad draining count")?,
            ),
            None => return Err("missing draining field"),
        };
        if fields.next().is_some() {
            return Err("trailing fields");
        }
        Ok(Self {
            shards,
            generation,
            draining_from,
        })
    }
}

/// `s` if it is a plain decimal number (no sign, no space), so `+4` or ` 4` are refused.
fn digits(s: &str) -> Option<&str> {
    (!s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit())).then_some(s)
}

impl fmt::Display for GroupRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.draining_from {
            None => write!(f, "{} shards (generation {})", self.shards, self.generation),
            Some(from) => write!(
                f,
                "changing from {from} to {} shards (generation {})",
                self.shards, self.generation
            ),
        }
    }
}

/// What a compare-and-swap of the group record must find: the version of the record read
/// before, as the store identifies it (a resourceVersion, or the stored text itself).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupVersion(pub String);

/// One read of a group's record.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GroupRead {
    /// No record yet: the first member writes one.
    Absent,
    /// The record and its version.
    Present {
        /// The record.
        record: GroupRecord,
        /// Its version, for the next compare-and-swap.
        version: GroupVersion,
    },
    /// Something is stored where the record belongs that tenure cannot parse. Nothing is
    /// decided from it: members wait until it is repaired or deleted.
    Damaged {
        /// What is wrong, in words (never the stored bytes).
        reason: String,
    },
}

impl GroupRead {
    /// Parses `text` stored under `version`.
    #[must_use]
    pub fn parse(text: &[u8], version: GroupVersion) -> Self {
        match GroupRecord::decode(text) {
            Ok(record) => Self::Present { record, version },
            Err(reason) => Self::Damaged {
                reason: reason.to_owned(),
            },
        }
    }
}

/// Kept by a sharded group's member while it follows the group's shard leases together
/// ([`Backend::follow_shard_leases`](super::Backend::follow_shard_leases)); dropping it ends
/// that, and the backend goes back to following each lease on its own.
#[must_use = "the shard leases are followed together only while this lives"]
pub struct ShardLeaseWatch(Option<Box<dyn Send + Sync>>);

impl ShardLeaseWatch {
    /// Nothing to keep: the backend follows each lease on its own.
    pub fn none() -> Self {
        Self(None)
    }

    /// Keeps `guard` (whose drop ends the joint watch) for as long as this lives.
    pub fn keeping(guard: impl Send + Sync + 'static) -> Self {
        Self(Some(Box::new(guard)))
    }

    /// Whether the backend follows the leases together (rather than each on its own).
    pub fn is_joint(&self) -> bool {
        self.0.is_some()
    }
}

impl fmt::Debug for ShardLeaseWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardLeaseWatch")
            .field("joint", &self.is_joint())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn shard_lease_names_parse_back_and_others_do_not() {
        assert_eq!(shard_lease_name("web", 7), "web-7");
        assert_eq!(parse_shard_lease_name("web-7"), Some(("web", 7)));
        assert_eq!(parse_shard_lease_name("a-b-0"), Some(("a-b", 0)));
        assert_eq!(
            parse_shard_lease_name("g-4294967295"),
            Some(("g", u32::MAX))
        );
        for other in [
            "web",
            "web-",
            "-7",
            "web-07",
            "web-x",
            "web-4294967296",
            "web-+7",
        ] {
            assert_eq!(parse_shard_lease_name(other), None, "{other}");
        }
    }

    use super::*;

    #[test]
    fn records_round_trip() {
        for r in [
            GroupRecord::first(4),
            GroupRecord {
                shards: 4096,
                generation: u64::MAX,
                draining_from: Some(4095),
            },
        ] {
            assert_eq!(GroupRecord::decode(r.encode().as_bytes()), Ok(r));
            assert!(r.encode().len() <= MAX_GROUP_RECORD);
        }
        assert_eq!(GroupRecord::first(4).encode(), "g1:4:1:-");
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in [
            "",
            "g1",
            "g2:4:1:-",
            "g1:0:1:-",
            "g1:4:0:-",
            "g1:4:1:0",
            "g1:+4:1:-",
            "g1: 4:1:-",
            "g1:4:1",
            "g1:4:1:-:x",
            "g1:4294967296:1:-",
            "g1:4:18446744073709551616:-",
            "g1:4:1:x",
        ] {
            assert!(GroupRecord::decode(bad.as_bytes()).is_err(), "{bad:?}");
        }
        assert!(GroupRecord::decode(&[0xff, b':']).is_err());
        let huge = format!("g1:4:1:-{}", " ".repeat(MAX_GROUP_RECORD));
        assert_eq!(
            GroupRecord::decode(huge.as_bytes()),
            Err("longer than any group record")
        );
    }
}
