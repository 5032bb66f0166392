//! The status write as pure functions: what one write should do ([`Intent`]), how it changes
//! the status ([`apply`]: tokens only rise, transitions counted once, candidates refreshed
//! and pruned, the `LeaderElected` condition), and how it merges into a status that may hold
//! fields of a newer version.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::Value;

use crate::FencingToken;
use std::collections::BTreeMap;

use crate::crd::{Candidate, ElectionStatus, LEADER_ELECTED, LastHandoff, ShardHolder};

/// The fields of `.status` this publisher owns; others (from a newer version) are kept.
const OWNED_FIELDS: [&str; 10] = [
    "leader",
    "fencingToken",
    "transitions",
    "lastTransitionTime",
    "candidates",
    "conditions",
    "shardCount",
    "heldShards",
    "shards",
    "lastHandoff",
];

/// Now, truncated to whole seconds as `metav1.Time` serializes it, so that comparing a
/// computed status with a read one is exact.
pub(super) fn now_seconds() -> Timestamp {
    let now = Timestamp::now();
    Timestamp::from_second(now.as_second()).unwrap_or(now)
}

/// What one write should do.
#[derive(Debug)]
pub(super) struct Intent<'a> {
    pub(super) identity: &'a str,
    /// Publish this candidate as the leader of the term with this token.
    pub(super) lead: Option<FencingToken>,
    /// Clear the leader if the status shows this candidate leading the term with this token.
    pub(super) clear: Option<FencingToken>,
    /// Refresh this candidate's entry (and write even if nothing else changed).
    pub(super) heartbeat: bool,
    /// Remove this candidate's entry.
    pub(super) leave: bool,
    /// Remove other candidates not seen for this long.
    pub(super) prune_older_than: Duration,
    /// A member of a sharded group: its count and the shards it holds now.
    pub(super) shards: Option<ShardIntent<'a>>,
    /// A term this candidate ended on purpose: published unless a newer term's is.
    pub(super) handoff: Option<&'a LastHandoff>,
}

/// What a member of a sharded group publishes: its shard count, and the shards it holds
/// with their terms' tokens (replacing the entries it published before).
#[derive(Debug)]
pub(super) struct ShardIntent<'a> {
    pub(super) count: u32,
    pub(super) held: &'a BTreeMap<u32, FencingToken>,
}

impl Intent<'_> {
    pub(super) fn is_empty(&self) -> bool {
        self.lead.is_none()
            && self.clear.is_none()
            && self.handoff.is_none()
            && !self.heartbeat
            && !self.leave
    }
}

/// Applies `intent` to `status`; returns whether anything changed.
///
/// The leader fields only ever move to a higher fencing token: a replayed or late write of
/// an older term changes nothing, and `transitions` grows only when the token changes.
pub(super) fn apply(
    status: &mut ElectionStatus,
    intent: &Intent<'_>,
    generation: Option<i64>,
    now: Timestamp,
) -> bool {
    let before = status.clone();
    let me = intent.identity;
    if let Some(token) = intent.lead {
        let current = status.fencing_token;
        if current.is_none_or(|c| c < token.get()) {
            status.transitions = Some(match current {
                None => status.transitions.unwrap_or(0),
                Some(_) => status.transitions.unwrap_or(0).saturating_add(1),
            });
            status.fencing_token = Some(token.get());
            status.leader = Some(me.to_owned());
            status.last_transition_time = Some(Time(now));
        } else if current == Some(token.get()) && status.leader.as_deref() != Some(me) {
            // Our own term, cleared or overwritten by a confused writer: put it back.
            status.leader = Some(me.to_owned());
            status.last_transition_time = Some(Time(now));
        }
        if status.fencing_token == Some(token.get()) && status.leader.as_deref() == Some(me) {
            set_condition(
                &mut status.conditions,
                "True",
                "Elected",
                format!("{me} leads the term with fencing token {token}"),
                generation,
                now,
            );
        }
    }
    if let Some(token) = intent.clear
        && status.leader.as_deref() == Some(me)
        && status.fencing_token == Some(token.get())
    {
        status.leader = None;
        status.last_transition_time = Some(Time(now));
        set_condition(
            &mut status.conditions,
            "False",
            "SteppedDown",
            format!(
                "{me} stepped down from the term with fencing token {token}; no leader published since"
            ),
            generation,
            now,
        );
    }
    if let Some(handoff) = intent.handoff
        && status
            .last_handoff
            .as_ref()
            .is_none_or(|h| h.fencing_token < handoff.fencing_token)
    {
        status.last_handoff = Some(handoff.clone());
    }
    // Candidates: prune others not seen for a while; refresh ours on a heartbeat or with
    // any other change, keep it as it is otherwise.
    let cutoff = SignedDuration::try_from(intent.prune_older_than)
        .ok()
        .and_then(|age| now.checked_sub(age).ok())
        .unwrap_or(Timestamp::MIN);
    let mine = status.candidates.iter().find(|c| c.identity == me).cloned();
    status
        .candidates
        .retain(|c| c.identity != me && c.last_seen.0 >= cutoff);
    let count = intent.shards.as_ref().map(|s| s.count);
    if !intent.leave {
        let refresh = intent.heartbeat || mine.as_ref().is_none_or(|m| m.shards != count) || {
            let mut unchanged = status.clone();
            unchanged.candidates.extend(mine.clone());
            sort_candidates(&mut unchanged.candidates);
            let mut original = before.clone();
            sort_candidates(&mut original.candidates);
            unchanged != original
        };
        status.candidates.push(match mine {
            Some(m) if !refresh => m,
            _ => Candidate {
                identity: me.to_owned(),
                last_seen: Time(now),
                shards: count,
            },
        });
    }
    sort_candidates(&mut status.candidates);
    if let Some(shards) = &intent.shards {
        apply_shards(status, me, shards, intent.leave);
    }
    *status != before
}

/// Replaces `me`'s shard entries with what it holds now. An entry with a higher token than
/// ours is a newer term of another member, published before our view caught up: kept. The
/// entries of members no longer among the candidates (pruned: gone without leaving) go.
fn apply_shards(status: &mut ElectionStatus, me: &str, intent: &ShardIntent<'_>, leave: bool) {
    let live: std::collections::HashSet<&str> = status
        .candidates
        .iter()
        .map(|c| c.identity.as_str())
        .collect();
    let mut by_shard: BTreeMap<u32, ShardHolder> = std::mem::take(&mut status.shards)
        .into_iter()
        .filter(|e| e.holder != me && live.contains(e.holder.as_str()))
        .map(|e| (e.shard, e))
        .collect();
    if !leave {
        for (&shard, token) in intent.held {
            let newer_elsewhere = by_shard
                .get(&shard)
                .is_some_and(|e| e.fencing_token > token.get());
            if !newer_elsewhere {
                by_shard.insert(
                    shard,
                    ShardHolder {
                        shard,
                        holder: me.to_owned(),
                        fencing_token: token.get(),
                    },
                );
            }
        }
        // Only a member running the group's count holds shards: its count is the group's.
        if !intent.held.is_empty() {
            status.shard_count = Some(intent.count);
        }
    }
    status.shards = by_shard.into_values().collect();
    status.held_shards = Some(u32::try_from(status.shards.len()).unwrap_or(u32::MAX));
}

fn sort_candidates(candidates: &mut [Candidate]) {
    candidates.sort_by(|a, b| a.identity.cmp(&b.identity));
}

/// Sets the `LeaderElected` condition; its `lastTransitionTime` moves only when its status
/// changes (the Kubernetes convention).
fn set_condition(
    conditions: &mut Vec<Condition>,
    status: &str,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) {
    let existing = conditions.iter_mut().find(|c| c.type_ == LEADER_ELECTED);
    match existing {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = Time(now);
                c.status = status.to_owned();
            }
            c.reason = reason.to_owned();
            c.message = message;
            c.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: LEADER_ELECTED.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message,
            observed_generation: generation,
            last_transition_time: Time(now),
        }),
    }
}

/// What can be kept of a status that does not parse: the fencing token and the transition
/// count when they are readable, so that the published token never goes down.
pub(super) fn salvage(existing: &Value) -> ElectionStatus {
    ElectionStatus {
        fencing_token: existing.get("fencingToken").and_then(Value::as_u64),
        transitions: existing.get("transitions").and_then(Value::as_u64),
        ..ElectionStatus::default()
    }
}

/// The status to write: `existing` with the fields this publisher owns replaced by
/// `status`'s, so fields written by a newer version survive.
pub(super) fn merge_status(existing: Value, status: &ElectionStatus) -> Value {
    let mut out = match existing {
        Value::Object(map) => map,
        _ => serde_json::Map::new(),
    };
    for field in OWNED_FIELDS {
        out.remove(field);
    }
    if let Ok(Value::Object(ours)) = serde_json::to_value(status) {
        out.extend(ours);
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn intent(identity: &str) -> Intent<'_> {
        Intent {
            identity,
            lead: None,
            clear: None,
            heartbeat: false,
            leave: false,
            prune_older_than: Duration::from_secs(180),
            shards: None,
            handoff: None,
        }
    }

    fn holds(pairs: &[(u32, u64)]) -> BTreeMap<u32, FencingToken> {
        pairs
            .iter()
            .map(|&(s, t)| (s, FencingToken::new(t)))
            .collect()
    }

    fn sharded<'a>(
        identity: &'a str,
        count: u32,
        held: &'a BTreeMap<u32, FencingToken>,
    ) -> Intent<'a> {
        Intent {
            shards: Some(ShardIntent { count, held }),
            ..intent(identity)
        }
    }

    fn table(s: &ElectionStatus) -> Vec<(u32, &str, u64)> {
        s.shards
            .iter()
            .map(|e| (e.shard, e.holder.as_str(), e.fencing_token))
            .collect()
    }

    #[test]
    fn sharded_members_publish_their_own_shards_side_by_side() {
        let mut s = ElectionStatus::default();
        let a = holds(&[(0, 10), (2, 12)]);
        let b = holds(&[(1, 11), (3, 13)]);
        assert!(apply(&mut s, &sharded("a", 4, &a), None, at(0)));
        assert!(apply(&mut s, &sharded("b", 4, &b), None, at(1)));
        assert_eq!(
            table(&s),
            vec![(0, "a", 10), (1, "b", 11), (2, "a", 12), (3, "b", 13)]
        );
        assert_eq!((s.shard_count, s.held_shards), (Some(4), Some(4)));
        assert_eq!(
            s.candidates
                .iter()
                .map(|c| (c.identity.as_str(), c.shards))
                .collect::<Vec<_>>(),
            vec![("a", Some(4)), ("b", Some(4))]
        );
        assert!(s.leader.is_none(), "a sharded group has no single leader");
        // The same view again writes nothing.
        assert!(!apply(&mut s, &sharded("a", 4, &a), None, at(2)));

        // b hands shard 3 to a: a publishes it with a's newer token, b drops it.
        let a2 = holds(&[(0, 10), (2, 12), (3, 20)]);
        assert!(apply(&mut s, &sharded("a", 4, &a2), None, at(3)));
        assert_eq!(s.shards[3].holder, "a");
        // (a's newer term already replaced b's entry: b's own view changes nothing more.)
        let b2 = holds(&[(1, 11)]);
        assert!(!apply(&mut s, &sharded("b", 4, &b2), None, at(4)));
        assert_eq!(
            table(&s),
            vec![(0, "a", 10), (1, "b", 11), (2, "a", 12), (3, "a", 20)]
        );
        // A late write of b's old view cannot take shard 3 back over a's newer term.
        assert!(!apply(&mut s, &sharded("b", 4, &b), None, at(5)));
        assert_eq!(s.shards[3].holder, "a", "{:?}", table(&s));
        assert_eq!(s.held_shards, Some(4));

        // b leaves: its entries and its candidate go.
        let none = BTreeMap::new();
        let leave = Intent {
            leave: true,
            ..sharded("b", 4, &none)
        };
        assert!(apply(&mut s, &leave, None, at(6)));
        assert_eq!(table(&s), vec![(0, "a", 10), (2, "a", 12), (3, "a", 20)]);
        assert_eq!(s.held_shards, Some(3));
        assert!(s.candidates.iter().all(|c| c.identity != "b"));
    }

    #[test]
    fn a_member_gone_without_leaving_loses_its_shards_with_its_candidate_entry() {
        let mut s = ElectionStatus::default();
        let dead = holds(&[(0, 5), (1, 6)]);
        assert!(apply(&mut s, &sharded("dead", 2, &dead), None, at(0)));
        let live = holds(&[]);
        // Before the prune age the dead member's entries stay; after it, they go.
        apply(&mut s, &sharded("live", 2, &live), None, at(100));
        assert_eq!(s.held_shards, Some(2));
        let heartbeat = Intent {
            heartbeat: true,
            ..sharded("live", 2, &live)
        };
        assert!(apply(&mut s, &heartbeat, None, at(200)));
        assert!(s.shards.is_empty(), "{:?}", table(&s));
        assert_eq!(s.held_shards, Some(0));
        // A member waiting with another count holds nothing and does not change the count.
        let waiting = sharded("new", 3, &live);
        apply(&mut s, &waiting, None, at(201));
        assert_eq!(s.shard_count, Some(2));
        assert!(
            s.candidates
                .iter()
                .any(|c| c.identity == "new" && c.shards == Some(3))
        );
    }

    fn token(t: u64) -> Option<FencingToken> {
        Some(FencingToken::new(t))
    }

    #[test]
    fn apply_should_publish_a_term_once_and_count_transitions_by_token() {
        let mut s = ElectionStatus::default();
        let lead = |t| Intent {
            lead: token(t),
            ..intent("a")
        };
        assert!(apply(&mut s, &lead(10), Some(1), at(0)));
        assert_eq!(
            (s.leader.as_deref(), s.fencing_token, s.transitions),
            (Some("a"), Some(10), Some(0))
        );
        assert_eq!(s.leader_elected().map(|c| c.status.as_str()), Some("True"));
        // A replay of the same term changes nothing, even later.
        assert!(!apply(&mut s, &lead(10), Some(1), at(5)));
        // A late write of an older term changes nothing either.
        assert!(!apply(&mut s, &lead(7), Some(1), at(6)));
        assert_eq!(s.fencing_token, Some(10));
        // A new term counts one transition; the condition keeps its transition time.
        let b = Intent {
            lead: token(12),
            ..intent("b")
        };
        assert!(apply(&mut s, &b, Some(1), at(9)));
        assert_eq!(
            (s.leader.as_deref(), s.fencing_token, s.transitions),
            (Some("b"), Some(12), Some(1))
        );
        let cond = s
            .leader_elected()
            .cloned()
            .unwrap_or_else(|| panic!("{s:?}"));
        assert_eq!(cond.last_transition_time, Time(at(0)));
        assert!(cond.message.contains('b'));
        assert_eq!(s.last_transition_time, Some(Time(at(9))));
    }

    #[test]
    fn apply_should_clear_only_its_own_term() {
        let mut s = ElectionStatus::default();
        let a = |t| Intent {
            lead: token(t),
            ..intent("a")
        };
        apply(&mut s, &a(10), None, at(0));
        let clear = |t| Intent {
            clear: token(t),
            ..intent("a")
        };
        // Another candidate published a newer term: a's clear of term 10 does nothing.
        let mut newer = s.clone();
        apply(
            &mut newer,
            &Intent {
                lead: token(11),
                ..intent("b")
            },
            None,
            at(1),
        );
        let before = newer.clone();
        assert!(!apply(&mut newer, &clear(10), None, at(2)));
        assert_eq!(newer, before);
        // Its own term is cleared, the token and transitions kept.
        assert!(apply(&mut s, &clear(10), None, at(3)));
        assert_eq!((s.leader.as_deref(), s.fencing_token), (None, Some(10)));
        assert_eq!(s.leader_elected().map(|c| c.status.as_str()), Some("False"));
        assert_eq!(
            s.leader_elected().map(|c| c.reason.as_str()),
            Some("SteppedDown")
        );
    }

    #[test]
    fn apply_should_refresh_on_heartbeats_prune_the_silent_and_leave() {
        let mut s = ElectionStatus::default();
        assert!(apply(&mut s, &intent("a"), None, at(0)), "first entry");
        assert!(apply(&mut s, &intent("b"), None, at(0)));
        assert!(
            !apply(&mut s, &intent("a"), None, at(60)),
            "no heartbeat, no change"
        );
        let beat = |id| Intent {
            heartbeat: true,
            ..intent(id)
        };
        assert!(apply(&mut s, &beat("a"), None, at(60)));
        assert_eq!(s.candidates[0].last_seen, Time(at(60)));
        // b is silent for longer than the prune age: a's next write removes it.
        assert!(apply(&mut s, &beat("a"), None, at(200)));
        assert_eq!(
            s.candidates
                .iter()
                .map(|c| c.identity.as_str())
                .collect::<Vec<_>>(),
            ["a"]
        );
        let leave = Intent {
            leave: true,
            ..intent("a")
        };
        assert!(apply(&mut s, &leave, None, at(201)));
        assert!(s.candidates.is_empty());
        assert!(!apply(&mut s, &leave, None, at(202)));
    }

    fn handed_off(from: &str, token: u64, reason: crate::crd::HandoffReason) -> LastHandoff {
        LastHandoff {
            reason,
            from: from.to_owned(),
            to: None,
            fencing_token: token,
            time: Time(at(0)),
            message: None,
        }
    }

    #[test]
    fn apply_should_keep_the_newest_terms_handoff() {
        use crate::crd::HandoffReason::{GracefulShutdown, HealthStepDown};
        let mut s = ElectionStatus::default();
        let b_hands_off = handed_off("b", 12, HealthStepDown);
        let newer = Intent {
            handoff: Some(&b_hands_off),
            ..intent("b")
        };
        assert!(apply(&mut s, &newer, None, at(1)));
        assert_eq!(s.last_handoff.as_ref(), Some(&b_hands_off));
        // An older term's hand-off, published late, does not replace it; the same one
        // again changes nothing.
        let a_hands_off = handed_off("a", 10, GracefulShutdown);
        let older = Intent {
            handoff: Some(&a_hands_off),
            ..intent("a")
        };
        apply(&mut s, &older, None, at(2));
        assert_eq!(s.last_handoff.as_ref(), Some(&b_hands_off));
        assert!(!apply(&mut s, &newer, None, at(3)));
        // A newer term's does.
        let c_hands_off = handed_off("c", 13, GracefulShutdown);
        apply(
            &mut s,
            &Intent {
                handoff: Some(&c_hands_off),
                ..intent("c")
            },
            None,
            at(4),
        );
        assert_eq!(s.last_handoff.as_ref(), Some(&c_hands_off));
    }

    #[test]
    fn salvage_should_keep_the_token_of_a_status_that_does_not_parse() {
        let existing = serde_json::json!({
            "leader": 42,
            "fencingToken": 1_000,
            "transitions": 7,
            "candidates": "garbage",
        });
        assert!(serde_json::from_value::<ElectionStatus>(existing.clone()).is_err());
        let mut s = salvage(&existing);
        assert_eq!((s.fencing_token, s.transitions), (Some(1_000), Some(7)));
        // An older term is still refused after the rewrite.
        let old = Intent {
            lead: token(999),
            ..intent("a")
        };
        apply(&mut s, &old, None, at(0));
        assert_eq!((s.leader, s.fencing_token), (None, Some(1_000)));
    }

    #[test]
    fn merge_status_should_keep_fields_it_does_not_own() {
        let existing = serde_json::json!({"leader": "old", "futureField": 3});
        let status = ElectionStatus {
            leader: Some("new".into()),
            ..ElectionStatus::default()
        };
        assert_eq!(
            merge_status(existing, &status),
            serde_json::json!({"leader": "new", "futureField": 3})
        );
    }
}
