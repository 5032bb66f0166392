//! A member's record in a group of sharded leadership: the one text every backend stores for
//! a [`Member`], `m1:<shards>:<joined_ms>:<holds>`, and its one parser.
//!
//! The identity is not in the record: each store files the record under it (a Redis hash
//! field, a member Lease's `holderIdentity`, a member file's `identity` line), so it is
//! passed to [`Member::decode`] beside the text. A record is another replica's word: the
//! parser bounds it, checks every field and reports what is wrong rather than guessing, so a
//! backend skips that one member with a warning and the group's view stands.

use super::{BackendError, BackendErrorKind, Member};

/// The longest member record a backend writes or reads: 64 KiB holds a replica holding
/// several thousand shards. A larger one is refused on write and skipped on read.
pub const MAX_MEMBER_RECORD: usize = 64 * 1024;

/// The format and version every record starts with.
const VERSION: &str = "m1";

impl Member {
    /// The record of this member as every backend stores it, without its identity:
    /// `m1:<shards>:<joined_ms>:<holds>`, `<holds>` the held shards in decimal,
    /// comma-separated (empty when none).
    ///
    /// ```
    /// use tenure::backend::Member;
    ///
    /// let member = Member { identity: "pod-a".into(), shards: 8, joined_ms: 1_700_000_000_000, holds: vec![1, 5] };
    /// assert_eq!(member.encode(), "m1:8:1700000000000:1,5");
    /// assert_eq!(Member::decode("pod-a", member.encode().as_bytes()), Ok(member));
    /// ```
    #[must_use]
    pub fn encode(&self) -> String {
        let mut s = format!("{VERSION}:{}:{}:", self.shards, self.joined_ms);
        for (i, shard) in self.holds.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str(&shard.to_string());
        }
        s
    }

    /// [`encode`](Self::encode)'s record, checked against the bound every reader keeps: what
    /// a backend writes when this member announces itself.
    ///
    /// # Errors
    ///
    /// [`BackendErrorKind::Config`] if the record would be over [`MAX_MEMBER_RECORD`] bytes
    /// (a replica holding tens of thousands of shards): written, no reader would count it.
    pub fn record(&self) -> Result<String, BackendError> {
        let record = self.encode();
        if record.len() > MAX_MEMBER_RECORD {
            return Err(BackendError::new(
                BackendErrorKind::Config,
                format!(
                    "member {:?} holds {} shards: its record would be {} bytes, over the \
                     {MAX_MEMBER_RECORD} a member record may have",
                    self.identity,
                    self.holds.len(),
                    record.len()
                ),
            ));
        }
        Ok(record)
    }

    /// The member `identity` whose stored record is `text`.
    ///
    /// # Errors
    ///
    /// What is wrong with the record, for a warning: over [`MAX_MEMBER_RECORD`] bytes, not
    /// UTF-8, another format or version, a missing or extra field, or a field that is not a
    /// decimal number in range (digits only: no sign, no spaces).
    pub fn decode(identity: impl Into<String>, text: &[u8]) -> Result<Self, &'static str> {
        if text.len() > MAX_MEMBER_RECORD {
            return Err("a member record over 64 KiB");
        }
        let text = std::str::from_utf8(text).map_err(|_| "not UTF-8")?;
        let mut fields = text.split(':');
        if fields.next() != Some(VERSION) {
            return Err("not a member record of version m1");
        }
        let (Some(shards), Some(joined), Some(holds), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err("not four fields");
        };
        let shards = number(shards).ok_or("the shard count is not a number")?;
        let joined_ms = number(joined).ok_or("the join time is not a number")?;
        let holds = if holds.is_empty() {
            Vec::new()
        } else {
            holds
                .split(',')
                .map(number)
                .collect::<Option<Vec<u32>>>()
                .ok_or("a held shard is not a number")?
        };
        Ok(Self {
            identity: identity.into(),
            shards,
            joined_ms,
            holds,
        })
    }
}

/// A decimal number of digits only (no sign, no spaces), as `encode` writes them.
fn number<T: std::str::FromStr>(s: &str) -> Option<T> {
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(holds: Vec<u32>) -> Member {
        Member {
            identity: "pod-a".into(),
            shards: 8,
            joined_ms: 1_700_000_000_000,
            holds,
        }
    }

    #[test]
    fn a_record_round_trips() {
        for holds in [vec![], vec![0], vec![1, 5, 4_294_967_295]] {
            let m = member(holds);
            assert_eq!(Member::decode("pod-a", m.encode().as_bytes()), Ok(m));
        }
        assert_eq!(member(vec![1, 5]).encode(), "m1:8:1700000000000:1,5");
        assert_eq!(member(vec![]).encode(), "m1:8:1700000000000:");
    }

    #[test]
    fn a_malformed_record_is_refused_with_its_reason() {
        for (text, why) in [
            ("m2:8:1:", "not a member record of version m1"),
            ("m1:8:1", "not four fields"),
            ("m1:8:1::", "not four fields"),
            ("m1:-8:1:", "the shard count is not a number"),
            ("m1:+8:1:", "the shard count is not a number"),
            ("m1:4294967296:1:", "the shard count is not a number"),
            ("m1:8:x:", "the join time is not a number"),
            ("m1:8::", "the join time is not a number"),
            ("m1:8:1:1,,2", "a held shard is not a number"),
            ("m1:8:1:1,", "a held shard is not a number"),
            ("m1:8:1: 1", "a held shard is not a number"),
            ("m1:8:1:99999999999", "a held shard is not a number"),
            (
                "m1:8:123456789012345678901:",
                "the join time is not a number",
            ),
        ] {
            assert_eq!(Member::decode("x", text.as_bytes()), Err(why), "{text:?}");
        }
        assert_eq!(Member::decode("x", b"m1:8:1:\xff"), Err("not UTF-8"));
    }

    #[test]
    fn a_record_over_the_bound_is_never_written() {
        assert_eq!(
            member(vec![1]).record().ok(),
            Some(member(vec![1]).encode())
        );
        let many = Member {
            holds: (0..20_000).collect(),
            ..member(vec![])
        };
        let e = many.record().expect_err("over the bound");
        assert_eq!(e.kind(), BackendErrorKind::Config);
        assert!(e.to_string().contains("20000 shards"), "{e}");
    }

    #[test]
    fn a_record_over_the_bound_is_refused_unread() {
        let at_bound = format!("m1:8:1:{}", "1,".repeat((MAX_MEMBER_RECORD - 8) / 2) + "1");
        assert!(at_bound.len() <= MAX_MEMBER_RECORD);
        assert!(Member::decode("x", at_bound.as_bytes()).is_ok());
        let over = format!("{at_bound},1,1");
        assert!(over.len() > MAX_MEMBER_RECORD);
        assert_eq!(
            Member::decode("x", over.as_bytes()),
            Err("a member record over 64 KiB")
        );
    }
}
