//! [`Preference`]: which ready follower a leader hands its lease to when it lets go without
//! a named target (a graceful shutdown, a step-down for its health, a step-down without
//! `--to`), and the one function that chooses it.
//!
//! The followers to choose from are the members of the election's ready group
//! ([`health_group`](super::health_group)): every running replica announces itself there
//! (with a health policy, only while healthy), with the time its run began. "Newest first"
//! orders by that time: in a rolling update the replicas that started last run the new
//! version, so the leader hands to one of them, and one rollout moves leadership once.

use crate::backend::Member;

/// Which follower a leader hands the lease to when it lets go without a named target. Set
/// with [`ElectionConfig::prefer`](super::ElectionConfig::prefer); without one a graceful
/// shutdown is an ordinary release (anyone may win) and a health step-down goes to the first
/// healthy follower by identity.
///
/// A preferred follower that does not take the lease within the hand-off window
/// ([`ElectionConfig::handoff_window`](super::ElectionConfig::handoff_window)) costs that
/// window and no more: the release becomes an ordinary one.
///
/// # Example
///
/// ```
/// use tenure::election::{ElectionConfig, Preference};
///
/// let newest = ElectionConfig::new().prefer(Preference::Newest);
/// let listed = ElectionConfig::new().prefer(Preference::Identities(vec!["pod-b".into(), "pod-c".into()]));
/// # let _ = (newest, listed);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Preference {
    /// The follower whose run began last (ties: the greatest identity). In a rolling update,
    /// a replica of the new version.
    ///
    /// The start time is the follower's own wall clock (milliseconds), published in its
    /// member record: replicas of a rollout start seconds apart while synchronised clocks
    /// differ by milliseconds, and an ordering that clock skew gets wrong costs one more
    /// hand-off, never safety (every hand-off is a new term with a higher fencing token).
    Newest,
    /// The first of these identities that is a ready follower; when none is, the first
    /// ready follower by identity.
    Identities(Vec<String>),
}

impl Preference {
    /// The follower among `members` that a leader named `leader` hands to: `None` when no
    /// member but the leader itself is ready.
    ///
    /// ```
    /// use tenure::backend::Member;
    /// use tenure::election::Preference;
    ///
    /// let member = |identity: &str, joined_ms| Member { identity: identity.into(), shards: 0, joined_ms, holds: vec![] };
    /// let ready = [member("pod-a", 1_000), member("pod-b", 3_000), member("pod-c", 2_000)];
    /// assert_eq!(Preference::Newest.choose(&ready, "pod-a"), Some("pod-b"));
    /// assert_eq!(Preference::Newest.choose(&ready, "pod-b"), Some("pod-c"));
    /// ```
    #[must_use]
    pub fn choose<'m>(&self, members: &'m [Member], leader: &str) -> Option<&'m str> {
        let followers = members.iter().filter(|m| m.identity != leader);
        let chosen = match self {
            Self::Newest => {
                followers.max_by(|a, b| (a.joined_ms, &a.identity).cmp(&(b.joined_ms, &b.identity)))
            }
            Self::Identities(order) => {
                let followers: Vec<&Member> = followers.collect();
                order
                    .iter()
                    .find_map(|want| followers.iter().find(|m| m.identity == *want).copied())
                    .or_else(|| {
                        followers
                            .iter()
                            .min_by(|a, b| a.identity.cmp(&b.identity))
                            .copied()
                    })
            }
        };
        chosen.map(|m| m.identity.as_str())
    }
}

/// Without a preference: the first ready follower by identity.
pub(super) fn first_by_identity<'m>(members: &'m [Member], leader: &str) -> Option<&'m str> {
    members
        .iter()
        .filter(|m| m.identity != leader)
        .map(|m| m.identity.as_str())
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(identity: &str, joined_ms: u64) -> Member {
        Member {
            identity: identity.into(),
            shards: 0,
            joined_ms,
            holds: Vec::new(),
        }
    }

    #[test]
    fn newest_is_the_latest_start_but_never_the_leader() {
        let ready = [member("a", 10), member("b", 30), member("c", 20)];
        assert_eq!(Preference::Newest.choose(&ready, "x"), Some("b"));
        assert_eq!(Preference::Newest.choose(&ready, "b"), Some("c"));
        assert_eq!(Preference::Newest.choose(&ready, "c"), Some("b"));
        // Ties go to the greatest identity, whatever order the store listed them in.
        let tied = [member("b", 5), member("c", 5), member("a", 5)];
        assert_eq!(Preference::Newest.choose(&tied, "x"), Some("c"));
        assert_eq!(Preference::Newest.choose(&tied, "c"), Some("b"));
        assert_eq!(Preference::Newest.choose(&[member("a", 1)], "a"), None);
        assert_eq!(Preference::Newest.choose(&[], "a"), None);
    }

    #[test]
    fn identities_go_in_the_listed_order_then_by_identity() {
        let ready = [member("a", 10), member("b", 30), member("c", 20)];
        let prefer =
            |ids: &[&str]| Preference::Identities(ids.iter().map(|s| (*s).to_owned()).collect());
        assert_eq!(prefer(&["c", "b"]).choose(&ready, "x"), Some("c"));
        assert_eq!(prefer(&["c", "b"]).choose(&ready, "c"), Some("b"));
        // A listed identity that is not ready is passed over.
        assert_eq!(prefer(&["gone", "b"]).choose(&ready, "x"), Some("b"));
        // None listed is ready: the first ready follower by identity, not the leader.
        assert_eq!(prefer(&["gone"]).choose(&ready, "a"), Some("b"));
        assert_eq!(
            prefer(&[]).choose(&[member("c", 1), member("b", 2)], "x"),
            Some("b")
        );
        assert_eq!(prefer(&["a"]).choose(&[member("a", 1)], "a"), None);
    }

    #[test]
    fn without_a_preference_the_first_follower_by_identity() {
        let ready = [member("c", 10), member("a", 30), member("b", 20)];
        assert_eq!(first_by_identity(&ready, "x"), Some("a"));
        assert_eq!(first_by_identity(&ready, "a"), Some("b"));
        assert_eq!(first_by_identity(&[member("a", 1)], "a"), None);
    }
}
