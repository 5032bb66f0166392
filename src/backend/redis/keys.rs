//! The key layout of one lock in Redis, and the naming rules that keep it intact.

use crate::backend::InvalidName;

/// The longest lock name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 256;

/// The longest key prefix accepted, in bytes.
pub(crate) const MAX_PREFIX_LEN: usize = 128;

/// Builds the keys of a lock under one prefix.
///
/// Every key of lock `name` starts with `<prefix>{<name>}`, so all of them share the hash tag
/// `{<name>}` and land in one Redis Cluster slot. The channel on which grants and releases are
/// published has the same name as the lock key (channels and keys are separate namespaces).
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    pub(crate) fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
        }
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `<prefix>{<name>}`: the lock's value (layout in acquire.lua), with the lease ttl as PX;
    /// after a release, its tombstone.
    pub(crate) fn lock(&self, name: &str) -> String {
        let mut k = String::with_capacity(self.prefix.len() + name.len() + 2);
        k.push_str(&self.prefix);
        k.push('{');
        k.push_str(name);
        k.push('}');
        k
    }

    /// `<prefix>{<name>}:fence`: the fencing counter.
    pub(crate) fn fence(&self, name: &str) -> String {
        self.lock(name) + ":fence"
    }

    /// `<prefix>{<name>}:next`: the preferred next holder after a hand-over, with the
    /// hand-over window as PX (handoff.lua).
    pub(crate) fn next(&self, name: &str) -> String {
        self.lock(name) + ":next"
    }

    /// `<prefix>{<name>}:done`: a run-once job's completion record (see `completion.rs`).
    pub(crate) fn completion(&self, name: &str) -> String {
        self.lock(name) + ":done"
    }

    /// The pub/sub channel of grants and releases: the lock key's name.
    pub(crate) fn channel(&self, name: &str) -> String {
        self.lock(name)
    }

    /// `<prefix>{<group>}:members`: a group's sorted set, each member's identity scored by
    /// the server time (ms) at which its announcement runs out. Also the name of the channel
    /// on which announcements and withdrawals are published. Group names follow the lock
    /// names' rules; a lock's own keys end in `}` or `}:fence`, so they never collide.
    pub(crate) fn members(&self, group: &str) -> String {
        self.lock(group) + ":members"
    }

    /// `<prefix>{<group>}:member-records`: a group's hash, identity → encoded member (see
    /// `members.rs`).
    pub(crate) fn member_records(&self, group: &str) -> String {
        self.lock(group) + ":member-records"
    }

    /// `<prefix>{<group>}:group-record`: a group's record (see `group.rs`).
    pub(crate) fn group_record(&self, group: &str) -> String {
        self.lock(group) + ":group-record"
    }
}

/// Checks a lock name: non-empty, at most [`MAX_NAME_LEN`] bytes, no braces (they would change
/// the hash tag), no control characters.
pub(crate) fn validate_name(name: &str) -> Result<(), InvalidName> {
    crate::backend::check_common_name_rules(name, MAX_NAME_LEN)?;
    if name.contains(['{', '}']) {
        return Err(InvalidName::new(
            name,
            "must not contain '{' or '}' (they delimit the Redis hash tag)",
        ));
    }
    Ok(())
}

/// Checks a key prefix: at most [`MAX_PREFIX_LEN`] bytes, no braces, no control characters.
/// Returns the rule broken.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), String> {
    if prefix.len() > MAX_PREFIX_LEN {
        return Err(format!("key prefix must be at most {MAX_PREFIX_LEN} bytes"));
    }
    if prefix.contains(['{', '}']) {
        return Err(
            "key prefix must not contain '{' or '}' (they would change the hash tag)".into(),
        );
    }
    if prefix.chars().any(char::is_control) {
        return Err("key prefix must not contain control characters".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_the_hash_tag() {
        let k = Keys::new("tenure:");
        assert_eq!(k.lock("jobs"), "tenure:{jobs}");
        assert_eq!(k.fence("jobs"), "tenure:{jobs}:fence");
        assert_eq!(k.completion("jobs"), "tenure:{jobs}:done");
        assert_eq!(k.channel("jobs"), "tenure:{jobs}");
        assert_eq!(k.members("jobs"), "tenure:{jobs}:members");
        assert_eq!(k.member_records("jobs"), "tenure:{jobs}:member-records");
        assert_eq!(k.group_record("jobs"), "tenure:{jobs}:group-record");
    }

    #[test]
    fn names_that_break_the_layout_are_rejected_with_the_rule() {
        let rule = |n: &str| validate_name(n).err().map(|e| e.rule);
        assert_eq!(rule("jobs"), None);
        assert_eq!(rule("a b:c/d.é"), None);
        assert!(rule("").is_some_and(|r| r.contains("empty")));
        assert!(rule("a{b").is_some_and(|r| r.contains("hash tag")));
        assert!(rule("a}b").is_some_and(|r| r.contains("hash tag")));
        assert!(rule("a\nb").is_some_and(|r| r.contains("control")));
        assert!(rule(&"x".repeat(MAX_NAME_LEN)).is_none());
        assert!(rule(&"x".repeat(MAX_NAME_LEN + 1)).is_some_and(|r| r.contains("at most")));
        assert!(validate_prefix("tenure:").is_ok());
        assert!(validate_prefix("").is_ok());
        assert!(validate_prefix("a{").is_err());
        assert!(validate_prefix("a\u{7}").is_err());
    }
}
